"""The ``GPUPool`` custom resource (cluster-scoped): a node pool — its hardware (the model's
`PoolHardware`), where its nodes are (node selector, tolerations), how to benchmark it — and
its status (coefficients, the benchmark, the observed correction)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import ConfigDict, Field

from shardmeter.spec.base import SpecModel
from shardmeter.spec.pool import PoolHardware
from shardmeter_operator.api.common import Condition, EventOutbox, Status
from shardmeter_operator.api.observation import PoolObservedStatus


class Toleration(SpecModel):
    """A core/v1 Toleration."""

    key: str | None = Field(default=None, max_length=253)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=253)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class BenchmarkSettings(SpecModel):
    """How the operator benchmarks a pool."""

    enabled: bool = False
    """Run the benchmark Job; without it the pool uses datasheet priors."""
    image: str = Field(default="", max_length=512)
    """The bench image; empty uses the operator's configured default."""
    configs: int = Field(default=60, ge=4, le=200)
    """Transformer shapes to profile (the paper uses up to 200)."""
    nodes: int = Field(default=2, ge=1, le=64)
    """Nodes the benchmark Job uses (2 measures inter-node collectives; 1 only intra-node)."""
    max_retries: int = Field(default=3, ge=0, le=10)
    """Failed benchmark Jobs are retried this many times, with exponential backoff."""


class PoolKueue(SpecModel):
    """How Kueue sees a pool's nodes: its ResourceFlavor (TrainingPlans with ``queueName``),
    and — for a pool in another cluster — its site's queue in the manager cluster, whose
    MultiKueue admission check sends the pool's islands to the site's worker cluster."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.flavor) || has(self.queueName)",
                    "message": "set flavor, queueName or both",
                }
            ]
        }
    )
    flavor: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
    )
    """The Kueue ResourceFlavor (cluster-scoped) of the pool's nodes. Its ``nodeLabels`` are
    merged into the node selector of the pool's islands, so Kueue assigns this flavor to
    them; they must agree with ``nodeSelector``, and its ``nodeTaints`` must be tolerated
    by ``tolerations`` (checked at launch: ``Valid=False`` otherwise)."""
    queue_name: str | None = Field(
        default=None, min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    )
    """The LocalQueue of the pool's site in the manager cluster (the same name in every
    namespace that launches on the pool). Its ClusterQueue must have a MultiKueue admission
    check (controllerName ``kueue.x-k8s.io/multikueue``) whose MultiKueueConfig lists this
    site's worker cluster only — Kueue's documented way to pin a workload to a cluster. Set
    it and plans launch this pool's islands as a JobSet of their own in that queue (one
    JobSet per site), ``managedBy`` MultiKueue; see the multi-cluster guide."""
    cluster: str | None = Field(default=None, min_length=1, max_length=256)
    """The MultiKueueCluster (worker cluster) ``queueName`` dispatches to: checked against the
    queue's MultiKueueConfig at launch, and the cluster whose pods are observed. Unset: the
    MultiKueueConfig must list exactly one cluster, which is taken."""


class GPUPoolSpec(PoolHardware):
    """A GPU node pool (see PoolHardware for the hardware fields)."""

    node_selector: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Labels selecting the pool's nodes; merged into every Job scheduled on the pool."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    benchmark: BenchmarkSettings = Field(default_factory=BenchmarkSettings)
    kueue: PoolKueue | None = None
    """The pool's Kueue ResourceFlavor, for plans admitted through a Kueue LocalQueue."""


class BenchmarkPhase(StrEnum):
    DISABLED = "Disabled"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    BACKOFF = "BackOff"


class GPUPoolStatus(Status):
    observed_generation: int = 0
    coefficients_config_map: str = Field(default="", max_length=253)
    """``namespace/name`` of the ConfigMap holding the coefficients document."""
    source: Literal["measured", "prior", ""] = ""
    measured_at: str = ""
    fit_mape: float | None = None
    """Worst cross-validated MAPE of the fitted coefficients (fraction)."""
    benchmark_job: str = Field(default="", max_length=253)
    benchmark_phase: BenchmarkPhase = BenchmarkPhase.DISABLED
    benchmark_attempts: int = 0
    benchmark_generation: int = 0
    """The spec generation the current benchmark measures."""
    next_retry_at: str = ""
    coefficients_revision: str = Field(default="", max_length=64)
    """Changes whenever the pool's coefficients change; TrainingPlans re-plan on it."""
    observed: PoolObservedStatus | None = None
    """The correction learned from the pool's running islands, on top of ``source``."""
    events: EventOutbox | None = None
    conditions: list[Condition] = Field(default_factory=list, max_length=16)
