"""Standard conditions (type, status, reason, message, lastTransitionTime,
observedGeneration): the documented condition types and reasons, and a pure helper over the
typed :class:`~shardmeter_operator.api.Condition` model."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from shardmeter_operator.api.common import Condition, ConditionStatus


class Type:
    """Condition types."""

    VALID = "Valid"
    PLANNED = "Planned"
    LAUNCHED = "Launched"
    RUNNING = "Running"
    FAILED = "Failed"
    SPEC_CHANGED_AFTER_LAUNCH = "SpecChangedAfterLaunch"
    OUTER_STEP_BLOCKING = "OuterStepBlocking"
    USING_PRIOR_COEFFICIENTS = "UsingPriorCoefficients"
    PREDICTION_DRIFT = "PredictionDrift"
    """An observed island's inner step is off its prediction by more than the threshold."""
    COEFFICIENTS_READY = "CoefficientsReady"
    BENCHMARK_SUCCEEDED = "BenchmarkSucceeded"
    QUOTA_RESERVED = "QuotaReserved"
    """Kueue reserved quota for the plan's workload (plans with ``spec.queueName``)."""
    ADMITTED = "Admitted"
    """Kueue admitted the plan's workload: its islands may start."""


class Reason:
    """CamelCase reasons, for machines; every condition also carries a human message."""

    SPEC_VALID = "SpecValid"
    INVALID_SPEC = "InvalidSpec"
    POOL_NOT_FOUND = "PoolNotFound"
    POOL_INVALID = "PoolInvalid"
    INVALID_TEMPLATE = "InvalidTemplate"
    PLANNED = "PlanFound"
    INFEASIBLE = "Infeasible"
    PLAN_ONLY = "PlanOnly"
    LAUNCHING = "Launching"
    RELAUNCHING = "Relaunching"
    JOBS_CREATED = "JobsCreated"
    JOBS_FAILED = "JobCreationFailed"
    NAME_CONFLICT = "NameConflict"
    NOT_LAUNCHABLE = "RuntimeCannotExpress"
    """The chosen plan cannot run as planned on torchtitan's fault-tolerant trainer."""
    CHILDREN_MISSING = "ChildrenMissing"
    ALL_RUNNING = "AllIslandsRunning"
    ISLANDS_PENDING = "IslandsPending"
    ALL_SUCCEEDED = "AllIslandsSucceeded"
    ISLAND_FAILED = "IslandFailed"
    NO_FAILURE = "NoIslandFailed"
    SPEC_FROZEN = "SpecFrozen"
    SPEC_UNCHANGED = "SpecUnchanged"
    OUTER_STEP_HIDDEN = "OuterStepHidden"
    OUTER_STEP_BLOCKS = "OuterStepBlocks"
    NOT_DILOCO = "NotDiLoCo"
    PRIORS = "DatasheetPriors"
    PRIORS_KEPT = "PriorsKept"
    """The benchmark's document did not predict unseen models better than the priors."""
    MEASURED = "Measured"
    BENCHMARK_DISABLED = "BenchmarkDisabled"
    BENCHMARK_RUNNING = "BenchmarkRunning"
    BENCHMARK_FAILED = "BenchmarkFailed"
    BENCHMARK_RETRYING = "BenchmarkBackOff"
    INVALID_COEFFICIENTS = "InvalidCoefficients"
    JOBSET_CREATED = "JobSetCreated"
    WORKLOAD_UNAVAILABLE = "WorkloadUnavailable"
    """``spec.workload`` (or ``spec.maxRestarts``) asks for a kind the cluster does not serve."""
    QUEUE_NOT_FOUND = "QueueNotFound"
    """``spec.queueName`` names no LocalQueue in the namespace (or Kueue is not installed)."""
    FLAVOR_MISMATCH = "FlavorMismatch"
    """A pool's ``spec.kueue.flavor`` is missing or contradicts the pool's placement."""
    WORKLOAD_NOT_CREATED = "WorkloadNotCreated"
    """Kueue has not created a Workload for the plan's JobSet or Jobs yet."""
    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    NOT_OBSERVED = "NotObserved"
    STEP_TIME_DRIFT = "StepTimeDrift"
    WITHIN_THRESHOLD = "WithinThreshold"
    OBSERVED_BLOCKING = "ObservedBlocking"
    """OuterStepBlocking from the observed inner step and all_reduce (not the prediction)."""
    OBSERVED_HIDDEN = "ObservedHidden"
    MULTIKUEUE_MISCONFIGURED = "MultiKueueMisconfigured"
    """A pool's site queue does not lead, through a MultiKueue admission check, to one worker
    cluster (or the plan's pools mix sites through MultiKueue with this cluster)."""
    SITE_NOT_ADMITTED = "SiteNotAdmitted"
    """A site's JobSet waits for Kueue (quota in the manager, a worker to admit it)."""
    ADMISSION_TIMEOUT = "AdmissionTimeout"
    """A site was not admitted within ``spec.admissionTimeoutSeconds``."""
    WAITING_FOR_LIGHTHOUSE = "WaitingForLighthouse"
    """The lighthouse Service has no address other sites can reach yet (no load-balancer
    ingress): the sites' JobSets are created once it has."""


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    generation: int,
    now: str | None = None,
) -> list[Condition]:
    """A new list with ``type_`` set; lastTransitionTime changes only when status flips.
    The whole list is returned because merge patches replace lists."""
    value = (
        ConditionStatus.UNKNOWN
        if status is None
        else (ConditionStatus.TRUE if status else ConditionStatus.FALSE)
    )
    out = [c.model_copy() for c in conditions]
    for i, c in enumerate(out):
        if c.type == type_:
            out[i] = c.model_copy(
                update={
                    "status": value,
                    "reason": reason,
                    "message": message[:32768],
                    "observed_generation": generation,
                    "last_transition_time": (
                        c.last_transition_time if c.status == value else now or now_iso()
                    ),
                }
            )
            return out
    out.append(
        Condition(
            type=type_,
            status=value,
            reason=reason,
            message=message[:32768],
            last_transition_time=now or now_iso(),
            observed_generation=generation,
        )
    )
    return out


def get_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def remove_condition(conditions: Sequence[Condition], type_: str) -> list[Condition]:
    return [c for c in conditions if c.type != type_]
