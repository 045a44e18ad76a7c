"""Every enum a spec reads is a `SpecEnum`: specs are strict, and pydantic's strict mode
refuses a plain `StrEnum` field's string value from YAML or JSON ("JobSet" for
``spec.workload`` made every such TrainingPlan Invalid before WorkloadKind became one)."""

from __future__ import annotations

import enum
import typing
from typing import Any

import pytest
from pydantic import BaseModel

import shardmeter.plan.schema  # (plan files' specs)
import shardmeter.sim.whatif  # noqa: F401  (durations files' specs)
import shardmeter_operator.api  # noqa: F401  (the custom resources' specs)
from shardmeter.spec.base import SpecEnum, SpecModel


def _spec_classes() -> list[type[BaseModel]]:
    found, pending = [], [SpecModel]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def _enums(annotation: Any) -> list[type[enum.Enum]]:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [annotation]
    return [e for arg in typing.get_args(annotation) for e in _enums(arg)]


FIELDS = [
    (cls, name, e)
    for cls in _spec_classes()
    for name, info in cls.model_fields.items()
    for e in _enums(info.annotation)
]


def test_the_specs_have_enum_fields() -> None:
    modules = {cls.__module__.split(".")[0] for cls, _, _ in FIELDS}
    assert {"shardmeter", "shardmeter_operator"} <= modules, modules


@pytest.mark.parametrize(
    ("cls", "name", "enum_"), FIELDS, ids=[f"{c.__name__}.{n}" for c, n, _ in FIELDS]
)
def test_every_enum_field_reads_its_string_value(
    cls: type[BaseModel], name: str, enum_: type[enum.Enum]
) -> None:
    assert issubclass(enum_, SpecEnum), f"{cls.__name__}.{name}: {enum_.__name__}"
