"""The operator's API: the custom resources of group ``shardmeter.io``, version ``v1alpha1``,
as pydantic models — the single source of the CRDs' OpenAPI schemas (:mod:`.crdgen`), of spec
validation in the handlers and of status shapes — with their conditions and error types.

* ``GPUPool`` (cluster-scoped, :mod:`.gpupool`) — a node pool: its hardware (the model's
  `PoolHardware`), where its nodes are and how to benchmark it;
* ``TrainingPlan`` (namespaced, :mod:`.trainingplan`) — a planning request (the model's
  `PlanRequest`, the same fields as a plan file) over named GPUPools, with ``launch`` and a
  Job ``template``;
* what both share (:mod:`.common`), observation's fields of both (:mod:`.observation`),
  condition types and reasons (:mod:`.conditions`), error types (:mod:`.errors`).

Every model is importable from here: ``from shardmeter_operator.api import TrainingPlanSpec``.
"""

from shardmeter_operator.api.common import (
    API_VERSION,
    GROUP,
    VERSION,
    Condition,
    ConditionStatus,
    EventOutbox,
    PendingEvent,
    Status,
)
from shardmeter_operator.api.gpupool import (
    BenchmarkPhase,
    BenchmarkSettings,
    GPUPoolSpec,
    GPUPoolStatus,
    PoolKueue,
    Toleration,
)
from shardmeter_operator.api.observation import (
    IslandObservation,
    ObservedRecommendation,
    ObserveReason,
    ObserveSpec,
    PlanObservation,
    PoolObservedStatus,
)
from shardmeter_operator.api.trainingplan import (
    ISLAND_SHAPE,
    DiLoCoSettings,
    FaultToleranceSpec,
    FrontierPoint,
    IslandState,
    IslandStatus,
    LaunchRecord,
    LighthouseStatus,
    PoolCoefficients,
    PoolRef,
    PredictedQuality,
    Predictions,
    RestartScope,
    SiteAdmission,
    SiteLaunch,
    SiteStatus,
    TrainingPlanPhase,
    TrainingPlanSpec,
    TrainingPlanStatus,
    UnusedPool,
    WorkloadKind,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "ISLAND_SHAPE",
    "VERSION",
    "BenchmarkPhase",
    "BenchmarkSettings",
    "Condition",
    "ConditionStatus",
    "DiLoCoSettings",
    "EventOutbox",
    "FaultToleranceSpec",
    "FrontierPoint",
    "GPUPoolSpec",
    "GPUPoolStatus",
    "IslandObservation",
    "IslandState",
    "IslandStatus",
    "LaunchRecord",
    "LighthouseStatus",
    "ObserveReason",
    "ObserveSpec",
    "ObservedRecommendation",
    "PendingEvent",
    "PlanObservation",
    "PoolCoefficients",
    "PoolKueue",
    "PoolObservedStatus",
    "PoolRef",
    "PredictedQuality",
    "Predictions",
    "RestartScope",
    "SiteAdmission",
    "SiteLaunch",
    "SiteStatus",
    "Status",
    "Toleration",
    "TrainingPlanPhase",
    "TrainingPlanSpec",
    "TrainingPlanStatus",
    "UnusedPool",
    "WorkloadKind",
]
