"""What reconciling a TrainingPlan works with — the pools it sees, the context, the result, the
validated spec — and the steps shared by planning and launched plans: reading coefficients,
searching (in a worker thread), recording the outcome, the OuterStepBlocking condition."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from shardmeter.cost.coefficients import CoefficientsDocument, Source
from shardmeter.cost.observed import ObservedStepSample
from shardmeter.errors import InfeasibleError, SpecError, spec_error_from_validation
from shardmeter.plan.schema import PlanSpec
from shardmeter_operator import memory, metrics
from shardmeter_operator.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.kube import Kube
from shardmeter_operator.manifests import (
    coefficients_configmap_name,
    validate_template,
)
from shardmeter_operator.planning import (
    PlanOutcome,
    is_blocking,
    plan_outcome,
    plan_request,
)
from shardmeter_operator.resources import (
    DiLoCoSettings,
    GPUPoolSpec,
    PoolCoefficients,
    TrainingPlanPhase,
    TrainingPlanSpec,
    TrainingPlanStatus,
)

T = TypeVar("T")
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
    write: Callable[[TrainingPlanStatus], Awaitable[None]] | None = None
    """Writes a status mid-reconcile (the launch decision, before any child exists)."""


@dataclass
class PlanResult:
    status: TrainingPlanStatus
    events: list[Event] = field(default_factory=list)
    requeue_s: float | None = None
    samples: dict[str, list[ObservedStepSample]] = field(default_factory=dict)
    """Pool → observed step samples for its correction (the pool's reconcile merges them)."""

    def requeue_within(self, seconds: float) -> None:
        """Come back in at most ``seconds``."""
        self.requeue_s = seconds if self.requeue_s is None else min(self.requeue_s, seconds)


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


async def _documents(
    names: list[str], cfg: OperatorConfig, kube: Kube
) -> tuple[dict[str, CoefficientsDocument | None], list[str]]:
    """The documents planning uses: measured ones, and priors that carry an observed
    correction (None: the pool's datasheet priors)."""
    docs, notes = await read_documents(names, cfg, kube)
    return {
        name: doc
        if doc is not None and (doc.source is Source.MEASURED or doc.compute_scale != 1.0)
        else None
        for name, doc in docs.items()
    }, notes


async def coefficients(
    ok: Validated, ctx: PlanContext, out: PlanResult, generation: int
) -> dict[str, CoefficientsDocument | None]:
    names = [r.name for r in ok.spec.pools]
    docs, notes = await _documents(names, ctx.cfg, ctx.kube)
    revisions = pool_revisions(names, ctx.pools)
    priors = sorted(p for p, d in docs.items() if d is None or d.source is Source.PRIOR)
    st = out.status
    st.conditions = set_condition(
        st.conditions,
        Type.USING_PRIOR_COEFFICIENTS,
        bool(priors),
        Reason.PRIORS if priors else Reason.MEASURED,
        (
            f"datasheet priors for {', '.join(priors)}: predictions are estimates until those pools are benchmarked"
            if priors
            else "every pool has measured coefficients"
        )
        + "".join(f"; {n}" for n in notes),
        generation,
    )
    st.coefficients = [
        PoolCoefficients(
            pool=p,
            source="measured"
            if (d := docs[p]) is not None and d.source is Source.MEASURED
            else "prior",
            revision=revisions[p],
            observed_compute_scale=d.compute_scale
            if d is not None and d.compute_scale != 1.0
            else None,
        )
        for p in names
    ]
    return docs


async def search(
    name: str,
    namespace: str,
    ok: Validated,
    docs: Mapping[str, CoefficientsDocument | None],
    out: PlanResult,
    generation: int,
) -> PlanOutcome | None:
    st = out.status
    started = time.perf_counter()
    try:
        outcome = await search_in_worker(plan_outcome, name, ok.request, docs)
    except (InfeasibleError, SpecError) as exc:
        metrics.plan_search_seconds.observe(time.perf_counter() - started)
        metrics.set_infeasible(namespace, name)
        if st.phase is not TrainingPlanPhase.INFEASIBLE:
            out.events.append(("Warning", Reason.INFEASIBLE, str(exc)))
        st.conditions = set_condition(
            st.conditions, Type.PLANNED, False, Reason.INFEASIBLE, str(exc), generation
        )
        st.phase = TrainingPlanPhase.INFEASIBLE
        st.predictions, st.islands, st.island_count, st.gpus = None, [], 0, 0
        st.plan, st.frontier, st.streaming_di_lo_co, st.jobs = "", [], None, []
        return None
    metrics.plan_search_seconds.observe(time.perf_counter() - started)
    p = outcome.predictions
    metrics.set_predictions(namespace, name, p)
    message = (
        f"{outcome.plan}: {p.tokens_per_second:,.0f} tokens/s, {p.hours:,.1f} h, ${p.cost_usd:,.0f}"
    )
    if get_condition(st.conditions, Type.PLANNED) is None or st.plan != outcome.plan:
        out.events.append(("Normal", "Planned", message))
    st.conditions = set_condition(
        st.conditions, Type.PLANNED, True, Reason.PLANNED, message, generation
    )
    return outcome


def apply_outcome(st: TrainingPlanStatus, outcome: PlanOutcome) -> None:
    st.plan, st.island_count, st.gpus = outcome.plan, outcome.island_count, outcome.gpus
    st.islands, st.streaming_di_lo_co = outcome.islands, outcome.settings
    st.predictions, st.frontier = outcome.predictions, outcome.frontier


def blocking(
    st: TrainingPlanStatus,
    ok: Validated,
    blocking_s: float,
    recommendation: str,
    namespace: str,
    name: str,
    generation: int,
    recommended: DiLoCoSettings | None = None,
) -> None:
    """OuterStepBlocking, and the recommended-settings metric: the settings in use while they
    hide the outer step, the new recommendation once they do not."""
    if not ok.request.strategy.is_diloco:
        st.conditions = set_condition(
            st.conditions,
            Type.OUTER_STEP_BLOCKING,
            False,
            Reason.NOT_DILOCO,
            "no outer step: FSDP strategy",
            generation,
        )
        return
    s = st.streaming_di_lo_co
    if is_blocking(blocking_s):
        text = f"compute blocks {blocking_s:.3g} s per outer step on the outer all_reduce"
        if recommendation:
            text += f"; recommended: {recommendation}"
        if recommended is not None:
            metrics.set_recommendation(
                namespace,
                name,
                recommended.sync_every,
                recommended.fragments,
                recommended.fragment_sync_delay,
            )
        st.conditions = set_condition(
            st.conditions,
            Type.OUTER_STEP_BLOCKING,
            True,
            Reason.OUTER_STEP_BLOCKS,
            text,
            generation,
        )
        return
    if s is not None:
        metrics.set_recommendation(
            namespace, name, s.sync_every, s.fragments, s.fragment_sync_delay
        )
    st.conditions = set_condition(
        st.conditions,
        Type.OUTER_STEP_BLOCKING,
        False,
        Reason.OUTER_STEP_HIDDEN,
        f"the outer all_reduce hides behind {s.fragment_sync_delay if s else 0} inner step(s)",
        generation,
    )
