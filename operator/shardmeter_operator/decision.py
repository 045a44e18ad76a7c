"""What deciding works with and produces — the types the read → decide → apply steps of a
TrainingPlan share across :mod:`~.trainingplan`, :mod:`~.launch.rules` and :mod:`~.observe.read`:

* :class:`PoolView` — what the operator knows of a GPUPool (from its watch);
* :class:`PlanInputs` — everything a plan's decision reads; :class:`ClusterFacts` — what it
  reads of the cluster (JobSet, Kueue, the LocalQueue, ResourceFlavors);
* :class:`Validated` — the spec as validated against the pools;
* :class:`PlanResult` — the decision: the whole new status, Events, requeue, what to create;
* :class:`Ensured` — what creating the children came to.

Plain data, no behaviour beyond small helpers, no API calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.observed import ObservedStepSample
from shardmeter.plan.schema import PlanSpec
from shardmeter_operator.api import (
    Condition,
    GPUPoolSpec,
    RestartScope,
    SiteLaunch,
    TrainingPlanSpec,
    TrainingPlanStatus,
)
from shardmeter_operator.config import OperatorConfig

Manifest = dict[str, Any]
Event = tuple[str, str, str]
"""(type "Normal" | "Warning", reason, message)."""


@dataclass(frozen=True)
class PoolView:
    """What the operator knows about a GPUPool (from its watch)."""

    spec: dict[str, Any]
    status: dict[str, Any]
    generation: int = 0
    problem: str = ""
    """Why the spec is invalid; empty when valid."""

    @property
    def revision(self) -> str:
        return str(self.status.get("coefficientsRevision") or "")


@dataclass(frozen=True)
class SiteQueue:
    """What the manager cluster says about a site's LocalQueue (read before a launch)."""

    name: str
    local_queue: Manifest | None = None
    cluster_queue: Manifest | None = None
    checks: tuple[Manifest, ...] = ()
    """The ClusterQueue's AdmissionChecks that exist."""
    config: Manifest | None = None
    """The MultiKueueConfig of its MultiKueue check."""
    worker: WorkerFacts | None = None
    """What the config's one worker cluster has (None: not read — no worker credentials)."""


@dataclass(frozen=True)
class WorkerFacts:
    """What a site's worker cluster has of what MultiKueue needs there (read with the
    worker's MultiKueue kubeconfig, ``--read-worker-kubeconfigs``)."""

    cluster: str
    namespace: bool | None = None
    """The plan's namespace exists there (MultiKueue creates the copies in the same one).
    None here and below: the worker's credentials may not read it (403)."""
    local_queue: bool | None = None
    """A LocalQueue of the site queue's name in that namespace."""
    jobset: bool | None = None
    """The JobSet CRD is served there."""
    unreadable: str = ""
    """Why it could not be read ("" when it was)."""


@dataclass(frozen=True)
class ClusterFacts:
    """What deciding (or rendering) a launch's workload reads from the cluster."""

    jobset_served: bool = False
    """The JobSet CRD is installed and serves ``jobset.x-k8s.io/v1alpha2``."""
    kueue_served: bool = False
    """Kueue's LocalQueue and Workload CRDs are installed and served."""
    queue_exists: bool = False
    """``spec.queueName`` names a LocalQueue of the plan's namespace."""
    flavors: Mapping[str, Manifest | None] = field(default_factory=dict)
    """ResourceFlavor name → the object (None: it does not exist), for the pools' flavors."""
    jobset_restart_job: bool = False
    """The JobSet CRD has the failure-policy action ``RestartJob`` (JobSet v0.12+) and its
    webhook accepts it (the alpha feature gate ``RestartJob`` is on: a server-side dry run)."""
    jobset_restart_job_refused: str = ""
    """Why a JobSet with ``RestartJob`` cannot be created ("" when it can, or when JobSet is
    not served): the CRD lacks the action, or the webhook's answer to the dry run."""
    site_queues: Mapping[str, SiteQueue] = field(default_factory=dict)
    """A site queue's name (pools' ``spec.kueue.queueName``) → its MultiKueue setup."""
    lighthouse_ingress: str = ""
    """The load-balancer ingress (IP or hostname) of the plan's lighthouse Service, once it
    has one."""


@dataclass(frozen=True)
class PlanInputs:
    """Everything deciding a TrainingPlan reads (:func:`plan_reads` says what to read)."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    """``spec`` as written (validated here)."""
    status: TrainingPlanStatus
    """The status as found."""
    pools: Mapping[str, PoolView]
    cfg: OperatorConfig
    children: Sequence[Manifest] = ()
    """Every object with the plan's UID label (:func:`~.k8s.children.list_children`)."""
    documents: Mapping[str, CoefficientsDocument | None] = field(default_factory=dict)
    """Each pool's coefficients document as its ConfigMap holds it (None: missing)."""
    document_notes: Sequence[str] = ()
    """Why a ConfigMap's document could not be read (its pool plans with priors)."""
    cluster: ClusterFacts = field(default_factory=ClusterFacts)
    workloads: Sequence[Manifest] = ()
    """Kueue's Workloads of what the launch submitted (:func:`~.launch.workload.workload_owners`)."""
    rejected: Mapping[str, str] = field(default_factory=dict)
    """Job UID → the latest FailedCreate message of the Job controller."""


@dataclass(frozen=True)
class Validated:
    spec: TrainingPlanSpec
    request: PlanSpec
    pools: dict[str, GPUPoolSpec]


@dataclass
class PlanResult:
    """A TrainingPlan's decision: the whole new status, the Events, when to come back, and what
    to create (after the status, which records the launch decision, is written). The plan's
    gauges follow from the status alone (:func:`~.metrics.publish_plan`)."""

    status: TrainingPlanStatus
    events: list[Event] = field(default_factory=list)
    requeue_s: float | None = None
    create: list[Manifest] = field(default_factory=list)
    """The children of the recorded launch decision, in order (:mod:`~.k8s.children`)."""
    search_s: float | None = None
    """How long the model's search took (the search-time histogram), if it ran."""
    validated: Validated | None = None
    """The spec as validated (None: invalid now)."""
    followed: bool = False
    """The islands of a complete launch were followed (their logs may be observed)."""
    previous: list[Condition] = field(default_factory=list)
    """The conditions as the reconcile found them (a problem seen again keeps its time and
    posts no second Event)."""
    samples: dict[str, list[ObservedStepSample]] = field(default_factory=dict)
    """Pool → observed step samples for its correction (the pool's reconcile merges them)."""
    decided_sites: list[SiteLaunch] = field(default_factory=list)
    """A launch decided through MultiKueue: its sites (recorded in ``status.launch``)."""
    decided_restart: RestartScope = RestartScope.ALL_ISLANDS
    """What the launch decided a failed island's JobSet recreates."""
    withheld: str = ""
    """Why some of the recorded launch's children are not created yet (``create`` holds the
    others): the launch stays incomplete and is looked at again."""

    def requeue_within(self, seconds: float) -> None:
        """Come back in at most ``seconds``."""
        self.requeue_s = seconds if self.requeue_s is None else min(self.requeue_s, seconds)


@dataclass
class Ensured:
    created: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    """Children of a previous revision still being deleted."""
    conflict: str = ""
    """Why a name is taken by something this plan does not own (nothing more is created)."""
