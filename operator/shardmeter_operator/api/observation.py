"""The models of observation: what a TrainingPlan asks (``spec.observe``), what the operator
reports for its running islands, and what it learns for pools — fields of
``TrainingPlanSpec``, ``TrainingPlanStatus``, ``IslandStatus`` and ``GPUPoolStatus`` in
:mod:`shardmeter_operator.api` (see :mod:`shardmeter_operator.observe.read`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shardmeter.spec.base import SpecModel
from shardmeter_operator.api.common import Status


class ObserveReason:
    """Why an island has (no) observation (``IslandObservation.reason``)."""

    OBSERVED = "Observed"
    POD_NOT_FOUND = "PodNotFound"
    POD_NOT_RUNNING = "PodNotRunning"
    LOG_UNAVAILABLE = "LogUnavailable"
    NO_METRIC_LINES = "NoMetricLines"
    UNPARSABLE = "UnparsableMetricLines"
    NOT_ENOUGH_STEPS = "NotEnoughSteps"
    POD_RESTARTED = "PodRestarted"
    PROMETHEUS_FAILED = "PrometheusFailed"


class IslandObservation(Status):
    """Rank 0 of one island, as read from its pod log (see :mod:`~.observe.summary`). Every
    number is None when ``reason`` is not ``Observed``: no stale or guessed figure is shown."""

    read_at: str
    """When the log was read (RFC 3339)."""
    reason: str = Field(max_length=64)
    """``Observed``, or why not: PodNotFound, PodNotRunning, LogUnavailable, NoMetricLines,
    UnparsableMetricLines, NotEnoughSteps, PodRestarted, PrometheusFailed."""
    message: str = Field(default="", max_length=1024)
    pod: str = Field(default="", max_length=253)
    restarts: int = 0
    """Restarts of the pod's trainer container (only the current container's log is read)."""
    source: Literal["log", "prometheus"] = "log"
    """Where the step seconds came from (``prometheus`` when the plan names a query)."""
    first_step: int | None = None
    last_step: int | None = None
    steps: int = 0
    """Inner steps the window covers."""
    windows: int = 0
    """torchtitan metric lines (each averages ``log_freq`` steps) in the window."""
    step_seconds_p50: float | None = None
    """Inner step, median over the window's metric lines, outer-step stalls removed."""
    step_seconds_p90: float | None = None
    effective_step_seconds: float | None = None
    """Wall time per inner step including the stalls (what the throughput sees)."""
    tokens_per_second: float | None = None
    """The island's tokens per second (rank 0's tokens/s × its GPUs)."""
    tokens_per_second_per_gpu: float | None = None
    fragment_syncs: int = 0
    fragment_sync_seconds: float | None = None
    """Median time from a fragment's all_reduce start to its commit."""
    sync_stall_seconds: float | None = None
    """Mean time the training thread waited at a fragment sync (all_reduce, commit)."""
    quorum_wait_seconds: float | None = None
    """Mean time a fragment sync's quorum took (waiting for the other islands)."""
    outer_step_blocking_seconds: float | None = None
    """Observed stall per outer step: the mean sync stall × fragments."""
    predicted_step_seconds: float | None = None
    """The launch decision's inner step for this island."""
    error_ratio: float | None = None
    """step_seconds_p50 ÷ predicted_step_seconds − 1 (positive: slower than predicted)."""
    compute_scale: float | None = None
    """The compute factor at which the model reproduces the observed step (the island's
    sample for its pool; see ``shardmeter.sim.calibrate``)."""


class ObservedRecommendation(Status):
    """Streaming DiLoCo settings that hide the outer all_reduce at the observed times (advice:
    running islands are never changed; relaunch to apply)."""

    sync_every: int
    fragments: int
    fragment_sync_delay: int
    zero_blocking: bool
    text: str = Field(default="", max_length=1024)


class PlanObservation(Status):
    """The plan-level summary of the islands' observations."""

    read_at: str
    islands_observed: int = 0
    islands_running: int = 0
    drift_threshold: float = 0.15
    worst_error_ratio: float | None = None
    """The island error ratio farthest from 0."""
    step_seconds: float | None = None
    """The slowest observed island's median inner step."""
    outer_step_blocking_seconds: float | None = None
    """The largest observed stall per outer step."""
    outer_all_reduce_seconds: float | None = None
    """The fragment all_reduce time the re-check used (observed, or the model's when the
    all_reduce hid behind the delay and only a bound was observable)."""
    outer_all_reduce_bounded: bool = False
    """True when the all_reduce hid: the observation only bounds it from above."""
    blocking_seconds: float | None = None
    """Blocking per outer step at the observed step and all_reduce, current settings."""
    recommended: ObservedRecommendation | None = None


class ObserveSpec(SpecModel):
    """Observation of the running islands (``spec.observe`` of a TrainingPlan)."""

    enabled: bool = True
    """Read rank 0's log of every running island (``pods/log``, bounded) every
    ``--observe-interval`` seconds; training is never touched."""
    recalibrate: bool = True
    """Let this plan's observed step times become samples of its pools' observed correction
    (turn off for runs that are not representative, e.g. debugging)."""
    drift_threshold: float = Field(default=0.15, gt=0, le=10)
    """``PredictionDrift`` is True when an island's median inner step is off its prediction
    by more than this fraction."""
    step_seconds_query: str = Field(default="", max_length=2048)
    """Optional PromQL giving an island's inner step seconds (one sample), from the
    operator's ``--prometheus-url``; ``$namespace``, ``$job``, ``$pod`` and ``$island`` are
    substituted. Empty: the step seconds come from the log."""


class PoolObservedStatus(Status):
    """A GPUPool's observed correction (``status.observed``), separate from its fitted or
    prior coefficients (``status.source``), which it never replaces."""

    source: Literal["observed"] = "observed"
    compute_scale: float | None = None
    """Multiplies the base coefficients' compute times in every plan on the pool; None while
    fewer than ``minSamples`` samples exist (nothing applied)."""
    samples: int = 0
    min_samples: int = 0
    plans: int = 0
    """TrainingPlans the samples came from."""
    updated_at: str = ""
    reset_at: str = ""
    reset_token: str = Field(default="", max_length=253)
    """The ``shardmeter.io/reset-observed`` annotation value last acted on."""
