"""The ``TrainingPlan`` custom resource (namespaced): a planning request (the model's
`PlanRequest`, the same fields as a plan file) over named GPUPools, with ``launch`` and a Job
``template`` — and its status: the chosen plan, islands, predictions, the launch record."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from shardmeter.plan.schema import PlanRequest
from shardmeter.spec.base import SpecEnum, SpecModel
from shardmeter.spec.training import StreamingSettings
from shardmeter_operator.api.common import Condition, EventOutbox, Status
from shardmeter_operator.api.observation import (
    IslandObservation,
    ObserveSpec,
    PlanObservation,
)


class PoolRef(SpecModel):
    """A GPUPool the plan may use."""

    name: str = Field(min_length=1, max_length=63)
    max_nodes: int | None = Field(default=None, ge=0, le=4096)
    """Use at most this many of the pool's nodes."""


class FaultToleranceSpec(SpecModel):
    """How a launched (Streaming) DiLoCo plan runs on torchft: its lighthouse (the
    ``torchft_lighthouse`` of the ``torchft`` wheel, one Deployment per plan) and the islands'
    torchft managers. Defaults are torchft 0.2.0's own."""

    min_replicas: int | None = Field(default=None, ge=1, le=64)
    """Islands a quorum needs (lighthouse ``--min_replicas``, torchtitan
    ``--fault_tolerance.min_replica_size``); default: every island of the plan — but one
    fewer when a failed island is restarted alone (``spec.restart: Island``), so the others
    keep training while it recovers. Never more than the plan's islands."""
    lighthouse_service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] | None = None
    """The lighthouse Service's type; unset: ClusterIP, or LoadBalancer when the plan's
    islands run in other clusters (pools with ``spec.kueue.queueName``), whose pods must
    reach the lighthouse from their own cluster."""
    lighthouse_address: str = Field(
        default="",
        max_length=253,
        pattern=r"^([a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?(:[0-9]{1,5})?)?$",
    )
    """An externally routable ``host[:port]`` of the lighthouse (a DNS name behind a gateway,
    a fixed load-balancer IP) that every site's islands use; empty: the Service's own
    address — its cluster DNS name, or for a LoadBalancer the ingress it gets."""
    join_timeout_ms: int = Field(default=60_000, ge=100, le=3_600_000)
    """How long the lighthouse waits for heartbeating stragglers before it issues a quorum."""
    quorum_tick_ms: int = Field(default=100, ge=10, le=60_000)
    """How often the lighthouse checks for a quorum while it waits."""
    heartbeat_timeout_ms: int = Field(default=5_000, ge=100, le=600_000)
    """An island that has not heartbeaten for this long is considered dead."""
    quorum_timeout_s: int = Field(default=900, ge=10, le=86_400)
    """How long an island waits for a quorum (``TORCHFT_QUORUM_TIMEOUT_SEC``). DiLoCo forms
    one at every fragment sync, so this must cover the islands' drift between two syncs."""
    collective_timeout_s: int | None = Field(default=None, ge=5, le=3_600)
    """How long an island's torchft collectives and RPCs wait (``TORCHFT_TIMEOUT_SEC``,
    torchtitan ``--fault_tolerance.process_group_timeout_ms``) before a peer counts as gone
    and the step is retried without it: how long the other islands stall when one dies.
    Default: torchft's 60 s; never below 4 × the outer all_reduce's predicted window."""
    process_group: Literal["nccl", "gloo"] = "nccl"
    """Backend of the cross-island pseudo-gradient all_reduce (torchtitan
    ``--fault_tolerance.process_group``): ``nccl`` on GPU pools, ``gloo`` on CPUs."""
    lighthouse_image: str = Field(default="", max_length=512)
    """Image with the ``torchft`` wheel for the lighthouse; empty: the operator's bench image."""
    cluster_domain: str = Field(
        default="cluster.local",
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
    )
    """The cluster's DNS domain: island pods search their peers' headless Services under it, so
    that the hostnames torchft advertises (``socket.gethostname()``) resolve across islands."""


class RestartScope(SpecEnum):
    """What a JobSet recreates when an island fails."""

    ISLAND = "Island"
    """Only the failed island (JobSet ``RestartJob``, JobSet v0.12 or later): the others keep
    training — torchft's quorum goes on without it until it rejoins."""
    ALL_ISLANDS = "AllIslands"
    """Every island (JobSet ``RestartJobSet``; any JobSet version)."""


class WorkloadKind(SpecEnum):
    """What a launch creates for the islands (``shardmeter_operator.launch.workload``)."""

    JOB = "Job"
    """One Indexed Job and one headless Service per island."""
    JOBSET = "JobSet"
    """One JobSet (jobset.x-k8s.io/v1alpha2) with a replicated Job per run of same-shaped
    islands: one object to admit, restart and delete."""


class TrainingPlanSpec(PlanRequest):
    """A planning request over GPUPools (see PlanRequest), plus launch control."""

    pools: list[PoolRef] = Field(min_length=1, max_length=64)
    launch: bool = False
    """Create one Job per island from ``template`` (false: plan only). Once anything is
    launched the islands and settings are frozen: later spec edits are reported
    (``SpecChangedAfterLaunch``) and not acted on until ``relaunch`` changes."""
    relaunch: int = Field(default=0, ge=0)
    """Bump (0 → 1 → 2 …) to discard a launched plan: the operator deletes the previous
    launch's children, waits until they are gone, plans the current spec and launches it.
    Changing it before anything is launched does nothing."""
    template: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """A batch/v1 JobTemplateSpec for one island's workers (metadata and spec)."""
    fault_tolerance: FaultToleranceSpec = Field(default_factory=FaultToleranceSpec)
    """The torchft lighthouse and managers of a launched DiLoCo plan."""
    workload: WorkloadKind | None = None
    """``Job`` or ``JobSet``; unset: JobSet when the cluster serves jobset.x-k8s.io/v1alpha2
    (the JobSet CRD is installed), else Job. ``status.launch.workload`` says which was used."""
    max_restarts: int = Field(default=0, ge=0, le=100)
    """JobSet only: when an island's Job fails it is recreated (JobSet ``failurePolicy``: the
    island alone or every island, see ``restart``) up to this many times in all before the
    plan fails. Training resumes from the trainer's last checkpoint. Must be 0 for workload
    Job."""
    restart: RestartScope | None = None
    """What a failure recreates: ``Island`` (only the failed island) or ``AllIslands``;
    unset: ``Island`` when the JobSet CRD supports it (JobSet v0.12+), else ``AllIslands``."""
    admission_timeout_seconds: int = Field(default=900, ge=10, le=604_800)
    """A site whose JobSet Kueue has not admitted this long after it was created is reported
    (``Admitted=False``, ``AdmissionTimeout``, a Warning Event); the plan is not running."""
    queue_name: str = Field(
        default="", max_length=63, pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$"
    )
    """A Kueue LocalQueue in the plan's namespace: the workload is created suspended with
    the ``kueue.x-k8s.io/queue-name`` label and starts once Kueue admits it (a JobSet: all
    islands together). Empty: no queue, the islands start at once."""
    observe: ObserveSpec = Field(default_factory=ObserveSpec)
    """Observation of the running islands (drift, recalibration); may change after launch
    without counting as a spec change of the running islands."""


class TrainingPlanPhase(StrEnum):
    """Pending → Invalid | Infeasible | Planned → Launched → Running → Succeeded | Failed
    (see ``shardmeter_operator.launch.rules`` for the rules)."""

    PENDING = "Pending"
    PLANNED = "Planned"
    LAUNCHED = "Launched"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INFEASIBLE = "Infeasible"
    INVALID = "Invalid"


class IslandState(StrEnum):
    """What an island's Job is doing."""

    NOT_LAUNCHED = ""
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class IslandStatus(Status):
    name: str = Field(max_length=63)
    """The island's Job (workload Job: also its rendezvous Service; JobSet: the child Job
    the JobSet creates for it, ``<jobset>-g<group>-<index>``)."""
    pool: str = Field(max_length=253)
    nodes: int
    gpus_per_node: int
    micro_batch: int
    accumulation: int
    local_batch_tokens: int
    step_seconds: float
    state: IslandState = IslandState.NOT_LAUNCHED
    """pending | running | succeeded | failed once launched."""
    reason: str = Field(default="", max_length=128)
    """CamelCase cause of the state, e.g. PodsRejected, BackoffLimitExceeded."""
    message: str = Field(default="", max_length=1024)
    """For humans, e.g. the quota or PodSecurity message that rejected the pods."""
    restarts: int = Field(default=0, ge=0, exclude_if=lambda v: v == 0)
    """How often the island's Job was recreated alone after a failure (JobSet ``RestartJob``)."""
    observed: IslandObservation | None = Field(default=None, exclude_if=lambda v: v is None)
    """Rank 0's step times and syncs as last read from its log (see ``spec.observe``);
    absent until read (list items are replaced whole, so no null is needed to clear it)."""


ISLAND_SHAPE = {
    "name",
    "pool",
    "nodes",
    "gpus_per_node",
    "micro_batch",
    "accumulation",
    "local_batch_tokens",
}
"""The IslandStatus fields that make up the launch decision (not the followed state)."""


class SiteLaunch(Status):
    """One site of a launch through MultiKueue: its JobSet in its queue."""

    site: str = Field(max_length=253)
    """The pools' ``site``."""
    queue_name: str = Field(max_length=63)
    """The site's LocalQueue (``spec.kueue.queueName`` of its pools)."""
    cluster: str = Field(default="", max_length=256)
    """The MultiKueueCluster the queue dispatches to."""
    job_set: str = Field(max_length=63)
    """The site's JobSet (in the manager cluster; MultiKueue copies it to the worker)."""
    islands: list[int] = Field(default_factory=list, max_length=64)
    """Indexes of the site's islands in ``status.islands``."""


class SiteAdmission(StrEnum):
    PENDING = "Pending"
    """Waiting for quota, or for a worker cluster to admit it."""
    ADMITTED = "Admitted"
    REJECTED = "Rejected"
    TIMED_OUT = "TimedOut"
    """Not admitted within ``spec.admissionTimeoutSeconds``."""


class SiteStatus(Status):
    """How a site of a MultiKueue launch fares: Kueue's admission of its JobSet's Workload
    in the manager cluster, and the worker that runs it."""

    site: str = Field(max_length=253)
    job_set: str = Field(max_length=63)
    queue_name: str = Field(max_length=63)
    admission: SiteAdmission = SiteAdmission.PENDING
    cluster: str = Field(default="", max_length=256)
    """The worker cluster that admitted the JobSet (the Workload's ``status.clusterName``)."""
    reason: str = Field(default="", max_length=128)
    message: str = Field(default="", max_length=1024)
    """Kueue's word: the MultiKueue admission check's message, why quota is not reserved."""
    since: str = ""
    """When the JobSet was created (admission pending) or admitted."""


class LighthouseStatus(Status):
    """Where the islands reach the torchft lighthouse."""

    address: str = Field(default="", max_length=300)
    """``TORCHFT_LIGHTHOUSE`` of the islands (empty: not known yet)."""
    service_type: str = Field(default="ClusterIP", max_length=32)


class LaunchRecord(Status):
    """The launch decision, recorded before any child is created (crash-safe): children are
    labelled with ``revision`` and only children with this revision are adopted."""

    revision: str = Field(max_length=64)
    """Hash of the plan's UID, ``spec.relaunch``, the islands, settings and template."""
    relaunch: int = 0
    """The ``spec.relaunch`` this launch answers."""
    generation: int = 0
    """The spec generation that was launched."""
    complete: bool = False
    """Every child has been created (missing ones are then reported, never re-created)."""
    workload: WorkloadKind = WorkloadKind.JOB
    """What the launch created for the islands: Jobs, or one JobSet."""
    workload_defaulted: bool = Field(default=False, exclude_if=lambda v: not v)
    """``spec.workload`` was unset: JobSet because the cluster serves it, else Job."""
    job_set: str = Field(default="", max_length=63)
    """The JobSet's name (workload JobSet)."""
    queue_name: str = Field(default="", max_length=63)
    """The Kueue LocalQueue the workload was submitted to (empty: none)."""
    spec_digest: str = Field(default="", max_length=64)
    """Hash of the launched spec without ``observe`` (editing observation is no spec
    change of the running islands); empty in records written before it existed."""
    sites: list[SiteLaunch] = Field(default_factory=list, max_length=16)
    """A launch through MultiKueue: one JobSet per site (pools with ``spec.kueue.queueName``);
    empty for a launch in this cluster."""
    restart: RestartScope = RestartScope.ALL_ISLANDS
    """What the JobSet(s) recreate when an island fails."""


class DiLoCoSettings(Status):
    """Streaming DiLoCo settings as the status shows them (`StreamingSettings` in the model)."""

    sync_every: int
    fragments: int
    fragment_sync_delay: int

    @classmethod
    def of(cls, settings: StreamingSettings) -> DiLoCoSettings:
        return cls(
            sync_every=settings.sync_every,
            fragments=settings.fragments,
            fragment_sync_delay=settings.fragment_sync_delay,
        )


def _absent(v: object) -> bool:
    return v is None


class PredictedQuality(Status):
    """What the plan's outer level costs in quality against data-parallel training on the
    same tokens (`shardmeter.cost.quality`, fitted on *Scaling Laws for DiLoCo*)."""

    loss_penalty_vs_dp: float
    """Relative eval-loss penalty (0.007 = +0.7 %; negative: ahead of data-parallel)."""
    loss_penalty_uncertainty: float
    """1σ of the penalty (the same unit)."""
    equivalent_token_factor: float
    """Tokens to reach data-parallel's loss ÷ the plan's tokens."""
    dp_equivalent_hours: float
    """Hours to reach data-parallel's loss (``hours`` × the factor)."""
    dp_equivalent_cost_usd: float
    basis: str = Field(default="", max_length=1024)
    """Where the numbers come from, for this plan."""
    warnings: list[str] = Field(default_factory=list, max_length=16)
    """Guard-rails the plan is beyond, extrapolations (empty: within what was measured)."""
    runs: str = Field(default="", max_length=512)
    """What the plan's outer level runs, the thing the penalty prices (one island: torchft's
    DiLoCo outer step on its own pseudo-gradient, DiLoCo with M = 1)."""


class Predictions(Status):
    step_seconds: float
    """Inner step of the slowest island."""
    tokens_per_second: float
    hours: float
    cost_usd: float
    """GPU cost (whole nodes where the pool is exclusive) plus WAN egress."""
    mfu: float
    bottleneck: str = Field(max_length=64)
    outer_step_blocking_seconds: float
    """Compute stalled on the outer all_reduce per outer step (0 = fully hidden)."""
    energy_kwh: float | None = Field(default=None, exclude_if=_absent)
    """Facility energy of the run (GPU power × utilisation × the site's PUE)."""
    co2_kg: float | None = Field(default=None, exclude_if=_absent)
    """At the pools' grid carbon intensity."""
    egress_gb: float | None = Field(default=None, exclude_if=_absent)
    """Outer traffic that leaves a site (DiLoCo across sites)."""
    egress_usd: float | None = Field(default=None, exclude_if=_absent)
    quality: PredictedQuality | None = Field(default=None, exclude_if=_absent)
    """DiLoCo plans only."""


class FrontierPoint(Status):
    label: str = Field(max_length=512)
    tokens_per_second: float
    hours: float
    cost_usd: float


class UnusedPool(Status):
    """A pool of ``spec.pools`` the chosen plan does not use, and why: the best plan found
    that uses it and what it lost on (`shardmeter.plan.unused`)."""

    pool: str = Field(max_length=253)
    best_plan: str = Field(default="", max_length=512)
    """The best plan found that uses the pool, by the objective's rule (empty: none can)."""
    hours: float | None = Field(default=None, exclude_if=lambda v: v is None)
    cost_usd: float | None = Field(default=None, exclude_if=lambda v: v is None)
    lost_on: str = Field(default="", max_length=32)
    """time, cost, energy, co2, throughput, budget, tie, infeasible or excluded."""
    reason: str = Field(default="", max_length=2048)


class PoolCoefficients(Status):
    pool: str = Field(max_length=253)
    source: Literal["measured", "prior"]
    revision: str = Field(default="", max_length=64)
    observed_compute_scale: float | None = Field(default=None, exclude_if=lambda v: v is None)
    """The pool's observed correction applied on top of ``source`` (absent: none)."""


class TrainingPlanStatus(Status):
    observed_generation: int = 0
    phase: TrainingPlanPhase = TrainingPlanPhase.PENDING
    plan: str = Field(default="", max_length=1024)
    """The chosen plan in the paper's notation, e.g. "8×1×8 H200 + 2×4×8 A100"."""
    island_count: int = 0
    gpus: int = 0
    islands: list[IslandStatus] = Field(default_factory=list, max_length=64)
    streaming_di_lo_co: DiLoCoSettings | None = Field(default=None, alias="streamingDiLoCo")
    predictions: Predictions | None = None
    frontier: list[FrontierPoint] = Field(default_factory=list, max_length=10)
    unused_pools: list[UnusedPool] = Field(default_factory=list, max_length=64)
    """The pools the chosen plan leaves out, each with the best plan that uses it and why it
    lost."""
    coefficients: list[PoolCoefficients] = Field(default_factory=list, max_length=64)
    jobs: list[str] = Field(default_factory=list, max_length=64)
    launch: LaunchRecord | None = None
    """Set once the plan is launched; islands and settings are frozen from then on."""
    restarts: int = 0
    """Workload JobSet: how many times the JobSet recreated every island after a failure."""
    observed: PlanObservation | None = None
    """The running islands' observations held against the predictions."""
    sites: list[SiteStatus] = Field(default_factory=list, max_length=16)
    """A launch through MultiKueue: each site's admission and worker cluster."""
    lighthouse: LighthouseStatus | None = None
    """Where the islands reach the lighthouse (a launched DiLoCo plan)."""
    recommended_streaming_di_lo_co: DiLoCoSettings | None = Field(
        default=None, alias="recommendedStreamingDiLoCo"
    )
    """Launched plans: Streaming DiLoCo settings that would block less at the pools' current
    coefficients, while the settings in use block (advice: relaunch to apply)."""
    events: EventOutbox | None = None
    conditions: list[Condition] = Field(default_factory=list, max_length=16)
