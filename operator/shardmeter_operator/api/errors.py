"""The operator's error types. Conditions take their ``reason`` from the exception's type
(:func:`reason_for`), never from its message text."""

from __future__ import annotations

from shardmeter.errors import SpecError
from shardmeter_operator.api.conditions import Reason


class PoolNotFoundError(SpecError):
    """A TrainingPlan names a GPUPool that does not exist (yet)."""


class PoolInvalidError(SpecError):
    """A TrainingPlan names a GPUPool whose own spec is invalid."""


class TemplateError(SpecError):
    """``spec.template`` cannot be rewritten into island Jobs."""


class ChildConflictError(SpecError):
    """A child's name is taken by an object this plan did not create."""


class RuntimeCannotExpressError(SpecError):
    """The chosen plan cannot run as planned on torchtitan's fault-tolerant trainer."""


class WorkloadUnavailableError(SpecError):
    """The workload kind the spec asks for is not served by the cluster (its CRD is absent)."""


class QueueNotFoundError(SpecError):
    """``spec.queueName`` names no Kueue LocalQueue in the plan's namespace."""


class MultiKueueError(SpecError):
    """A site queue does not lead to one worker cluster through MultiKueue."""


class FlavorError(SpecError):
    """A pool's Kueue ResourceFlavor is missing or contradicts the pool's placement."""


class GoneError(Exception):
    """The object being reconciled was deleted (or deleted and created again under its name)
    while its reconcile ran: nothing more is written or created for it."""


_REASONS: tuple[tuple[type[SpecError], str], ...] = (
    (PoolNotFoundError, Reason.POOL_NOT_FOUND),
    (PoolInvalidError, Reason.POOL_INVALID),
    (TemplateError, Reason.INVALID_TEMPLATE),
    (ChildConflictError, Reason.NAME_CONFLICT),
    (RuntimeCannotExpressError, Reason.NOT_LAUNCHABLE),
    (WorkloadUnavailableError, Reason.WORKLOAD_UNAVAILABLE),
    (QueueNotFoundError, Reason.QUEUE_NOT_FOUND),
    (FlavorError, Reason.FLAVOR_MISMATCH),
    (MultiKueueError, Reason.MULTIKUEUE_MISCONFIGURED),
)


def reason_for(exc: SpecError) -> str:
    """The condition reason of a spec error, by its type."""
    return next((reason for kind, reason in _REASONS if isinstance(exc, kind)), Reason.INVALID_SPEC)
