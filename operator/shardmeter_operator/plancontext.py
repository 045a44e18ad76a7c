"""What reconciling a TrainingPlan works with: the pools it sees, the context the acting layer
holds, the decision (:class:`PlanResult`), the validated spec, and the planning worker thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.observed import ObservedStepSample
from shardmeter.errors import SpecError, spec_error_from_validation
from shardmeter.plan.schema import PlanSpec
from shardmeter_operator import memory
from shardmeter_operator.conditions import Reason, Type, get_condition
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.kube import Kube
from shardmeter_operator.manifests import (
    coefficients_configmap_name,
    validate_template,
)
from shardmeter_operator.planning import (
    PlanOutcome,
    plan_request,
)
from shardmeter_operator.resources import (
    Condition,
    GPUPoolSpec,
    TrainingPlanPhase,
    TrainingPlanSpec,
    TrainingPlanStatus,
)

T = TypeVar("T")
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


@dataclass
class PlanContext:
    cfg: OperatorConfig
    kube: Kube
    pools: Mapping[str, PoolView]
    rejected: Mapping[str, str] = field(default_factory=dict)
    """Job UID → the latest FailedCreate message of the Job controller."""
    write: Callable[[TrainingPlanStatus, Sequence[Event]], Awaitable[None]] | None = None
    """Writes a status mid-reconcile (the launch decision, before any child exists) with the
    Events decided so far pending in it (:mod:`~.events`); raises GoneError when the plan
    was deleted or replaced since it was read."""
    alive: Callable[[], bool] = lambda: True
    """False once the plan's deletion was seen (no child is created after that)."""


@dataclass
class PlanResult:
    """A TrainingPlan's decision: the whole new status, the Events, when to come back, and what
    to create (after the status, which records the launch decision, is written). The plan's
    gauges follow from the status alone (:func:`~.metrics.publish_plan`)."""

    status: TrainingPlanStatus
    events: list[Event] = field(default_factory=list)
    requeue_s: float | None = None
    create: list[Manifest] = field(default_factory=list)
    """The children of the recorded launch decision, in order (:mod:`~.children`)."""
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

    def requeue_within(self, seconds: float) -> None:
        """Come back in at most ``seconds``."""
        self.requeue_s = seconds if self.requeue_s is None else min(self.requeue_s, seconds)


ELSEWHERE = (Reason.WORKLOAD_UNAVAILABLE, Reason.QUEUE_NOT_FOUND, Reason.FLAVOR_MISMATCH)
"""Refusals whose fix lies outside the plan and its pools: such a plan is rechecked on
every event (and every ``--recheck-interval``), also after the operator restarts."""


def referenced_pools(spec_raw: Mapping[str, Any]) -> set[str]:
    return {str(p.get("name")) for p in spec_raw.get("pools") or [] if isinstance(p, Mapping)}


def pool_revisions(names: set[str] | list[str], pools: Mapping[str, PoolView]) -> dict[str, str]:
    return {n: pools[n].revision if n in pools and not pools[n].problem else "" for n in names}


def needs_work(body: Mapping[str, Any], pools: Mapping[str, PoolView]) -> bool:
    """Whether a watch event (of the plan or of a pool it uses) calls for a reconcile: a new
    spec, a relaunch, pools whose coefficients changed, or pools that appeared, became
    valid or invalid since the plan's status was written. Cheap: no API calls."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = TrainingPlanStatus.model_validate(body.get("status") or {})
    if status.observed_generation != int(meta.get("generation") or 0):
        return True
    if status.phase is TrainingPlanPhase.PENDING:
        return True
    names = referenced_pools(spec)
    valid = get_condition(status.conditions, Type.VALID)
    if valid is not None and valid.reason in (Reason.POOL_NOT_FOUND, Reason.POOL_INVALID):
        return all(n in pools and not pools[n].problem for n in names)
    if valid is not None and valid.status == "False" and valid.reason in ELSEWHERE:
        return True  # fixed by installing JobSet or Kueue, a LocalQueue, a ResourceFlavor
    if status.phase is TrainingPlanPhase.INVALID:
        return False
    if any(n not in pools or pools[n].problem for n in names):
        return True  # a pool went away or became invalid
    used = {c.pool: c.revision for c in status.coefficients}
    return any(used.get(n) != rev for n, rev in pool_revisions(names, pools).items())


# ---- planning runs in its own worker threads ----------------------------------------------------
PLANNING_WORKERS = 1
"""Searches are CPU-bound (the GIL serialises most of them): two workers keep the cores busy
without queueing the API calls (which use asyncio's default pool) behind a burst of plans."""
_planning = concurrent.futures.ThreadPoolExecutor(PLANNING_WORKERS, thread_name_prefix="plan")


async def search_in_worker(fn: Callable[..., T], *args: Any) -> T:
    def run() -> T:
        try:
            return fn(*args)
        finally:
            memory.trim()

    return await asyncio.get_running_loop().run_in_executor(_planning, run)


# ---- validation -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Validated:
    spec: TrainingPlanSpec
    request: PlanSpec
    pools: dict[str, GPUPoolSpec]


def validate(spec_raw: Mapping[str, Any], pools: Mapping[str, PoolView]) -> Validated:
    """Raises SpecError (of the type that names the reason) when the plan cannot be planned."""
    try:
        spec = TrainingPlanSpec.model_validate(dict(spec_raw))
    except ValidationError as exc:
        raise spec_error_from_validation(exc, "spec") from exc
    valid = {n: GPUPoolSpec.model_validate(v.spec) for n, v in pools.items() if not v.problem}
    invalid = {n: v.problem for n, v in pools.items() if v.problem}
    request = plan_request(spec, valid, invalid)
    if spec.launch:
        validate_template(spec.template)
    return Validated(spec, request, {r.name: valid[r.name] for r in spec.pools})


async def read_documents(
    names: list[str], cfg: OperatorConfig, kube: Kube
) -> tuple[dict[str, CoefficientsDocument | None], list[str]]:
    """Each pool's coefficients document as its ConfigMap holds it (None: missing or
    unreadable, with a note)."""
    docs: dict[str, CoefficientsDocument | None] = {}
    notes: list[str] = []
    for name in names:
        cm = await kube.get("v1", "ConfigMap", cfg.namespace, coefficients_configmap_name(name))
        doc = None
        if cm is not None:
            try:
                doc = CoefficientsDocument.from_configmap_data(cm.get("data"), name)
            except SpecError as exc:
                notes.append(
                    f"pool {name}: unreadable coefficients ({exc}); using datasheet priors"
                )
        docs[name] = doc
    return docs, notes


def apply_outcome(st: TrainingPlanStatus, outcome: PlanOutcome) -> None:
    st.plan, st.island_count, st.gpus = outcome.plan, outcome.island_count, outcome.gpus
    st.islands, st.streaming_di_lo_co = outcome.islands, outcome.settings
    st.predictions, st.frontier = outcome.predictions, outcome.frontier
