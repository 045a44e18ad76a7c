"""Standard conditions (type, status, reason, message, lastTransitionTime,
observedGeneration): pure helpers, and the documented condition types and reasons."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


class Type:
    """Condition types."""

    VALID = "Valid"
    PLANNED = "Planned"
    LAUNCHED = "Launched"
    OUTER_STEP_BLOCKING = "OuterStepBlocking"
    USING_PRIOR_COEFFICIENTS = "UsingPriorCoefficients"
    COEFFICIENTS_READY = "CoefficientsReady"
    BENCHMARK_SUCCEEDED = "BenchmarkSucceeded"


class Reason:
    """CamelCase reasons, for machines; every condition also carries a human message."""

    SPEC_VALID = "SpecValid"
    INVALID_SPEC = "InvalidSpec"
    POOL_NOT_FOUND = "PoolNotFound"
    INVALID_TEMPLATE = "InvalidTemplate"
    PLANNED = "PlanFound"
    INFEASIBLE = "Infeasible"
    PLAN_ONLY = "PlanOnly"
    JOBS_CREATED = "JobsCreated"
    JOBS_FAILED = "JobCreationFailed"
    NOT_LAUNCHABLE = "RuntimeCannotExpress"
    """The chosen plan cannot run as planned on torchtitan's fault-tolerant trainer."""
    OUTER_STEP_HIDDEN = "OuterStepHidden"
    OUTER_STEP_BLOCKS = "OuterStepBlocks"
    NOT_DILOCO = "NotDiLoCo"
    PRIORS = "DatasheetPriors"
    MEASURED = "Measured"
    BENCHMARK_DISABLED = "BenchmarkDisabled"
    BENCHMARK_RUNNING = "BenchmarkRunning"
    BENCHMARK_FAILED = "BenchmarkFailed"
    BENCHMARK_RETRYING = "BenchmarkBackOff"
    INVALID_COEFFICIENTS = "InvalidCoefficients"


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(
    conditions: list[dict[str, Any]] | None,
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """A new list with ``type_`` set; lastTransitionTime changes only when status flips.
    The whole list is returned because merge patches replace lists."""
    value = "Unknown" if status is None else ("True" if status else "False")
    out = [dict(c) for c in conditions or []]
    for c in out:
        if c.get("type") == type_:
            if c.get("status") != value:
                c["lastTransitionTime"] = now or now_iso()
            c.update(
                status=value, reason=reason, message=message[:32768], observedGeneration=generation
            )
            return out
    out.append(
        {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message[:32768],
            "lastTransitionTime": now or now_iso(),
            "observedGeneration": generation,
        }
    )
    return out


def get_condition(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def remove_condition(conditions: list[dict[str, Any]] | None, type_: str) -> list[dict[str, Any]]:
    return [dict(c) for c in conditions or [] if c.get("type") != type_]
