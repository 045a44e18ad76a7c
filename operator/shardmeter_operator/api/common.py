"""What every custom resource of ``shardmeter.io/v1alpha1`` shares: the group and version, the
base of the status models, standard conditions, and the Event outbox in each status."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "shardmeter.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(BaseModel):
    """A standard Kubernetes condition (as in metav1.Condition)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
    )
    type: str = Field(max_length=316)
    """CamelCase condition type (documented in ``shardmeter_operator.api.conditions.Type``)."""
    status: ConditionStatus
    reason: str = Field(max_length=1024)
    """CamelCase reason, for machines (``shardmeter_operator.api.conditions.Reason``)."""
    message: str = Field(default="", max_length=32768)
    """For humans: what happened and what to change."""
    last_transition_time: str
    """When ``status`` last flipped (RFC 3339)."""
    observed_generation: int = 0
    """The spec generation the condition describes."""


class Status(BaseModel):
    """Status models: written once by the operator, read back by the same model. Unknown keys
    (an older operator's) are ignored when read; the CRD schema closes them on write."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
    )


class PendingEvent(Status):
    """An Event a status transition called for, written with the status before it is posted
    (:mod:`~shardmeter_operator.events`)."""

    name: str = Field(max_length=253)
    """The Event's name: derived from the object, the transition and the Event, so posting
    it again (after a lost answer, a failed status write) is answered 409 and changes nothing."""
    type: Literal["Normal", "Warning"]
    reason: str = Field(max_length=128)
    message: str = Field(default="", max_length=1024)


class EventOutbox(Status):
    """The object's Events as its status records them: every transition's Events are written
    with the status that makes them (``pending``) and removed once posted."""

    sequence: int = 0
    """Counts the status transitions that called for Events (each Event's name derives from
    the number of its transition)."""
    pending: list[PendingEvent] = Field(default_factory=list, max_length=32)
