"""TrainingPlan reconciliation: validate → plan (in a worker thread) → record the launch
decision → create the children → follow them. The state machine and its rules are
documented in :mod:`shardmeter_operator.launch`; this module applies them.

`reconcile_plan` reads the object as it is now, acts (creates or deletes children), and
returns the whole new status as a :class:`TrainingPlanStatus` plus the Events to post.
It is level-triggered: running it twice changes nothing the second time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from shardmeter.cost.coefficients import CoefficientsDocument, Source
from shardmeter.errors import InfeasibleError, SpecError, spec_error_from_validation
from shardmeter.plan.schema import PlanSpec
from shardmeter_operator import memory, metrics
from shardmeter_operator.children import CHILD_KINDS, ensure_children, list_children
from shardmeter_operator.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.errors import reason_for
from shardmeter_operator.kube import Kube
from shardmeter_operator.launch import (
    ISLAND_SHAPE,
    decision_revision,
    follow_islands,
    plan_phase,
    transitions,
)
from shardmeter_operator.manifests import (
    PLAN_REVISION_LABEL,
    child_labels,
    coefficients_configmap_name,
    island_manifests,
    owner_reference,
    validate_template,
)
from shardmeter_operator.planning import (
    PlanOutcome,
    is_blocking,
    plan_outcome,
    plan_request,
    reevaluate,
)
from shardmeter_operator.resources import (
    Condition,
    DiLoCoSettings,
    GPUPoolSpec,
    IslandState,
    LaunchRecord,
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


async def _documents(
    names: list[str], cfg: OperatorConfig, kube: Kube
) -> tuple[dict[str, CoefficientsDocument | None], list[str]]:
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
        docs[name] = doc if doc is not None and doc.source is Source.MEASURED else None
    return docs, notes


# ---- the reconciler ---------------------------------------------------------------------------
async def reconcile_plan(body: Mapping[str, Any], ctx: PlanContext) -> PlanResult:
    meta = body.get("metadata") or {}
    name, namespace, uid = str(meta["name"]), str(meta.get("namespace") or ""), str(meta["uid"])
    generation = int(meta.get("generation") or 1)
    spec_raw = dict(body.get("spec") or {})
    before = TrainingPlanStatus.model_validate(body.get("status") or {})
    st = before.model_copy(deep=True, update={"observed_generation": generation})
    out = PlanResult(st)
    # Children exist only after a launch decision was recorded (or when a status was lost):
    # a plan that never launched and is not asked to needs no listing.
    listed = before.launch is not None or bool(spec_raw.get("launch"))
    children = await list_children(ctx.kube, namespace, uid) if listed else []
    try:
        ok: Validated | None = validate(spec_raw, ctx.pools)
        st.conditions = set_condition(
            st.conditions, Type.VALID, True, Reason.SPEC_VALID, "spec is valid", generation
        )
    except SpecError as exc:
        ok = None
        reason = reason_for(exc)
        if _same(before, Type.VALID, reason, exc) is None:  # an Event once per new problem
            out.events.append(("Warning", reason, str(exc)))
        st.conditions = set_condition(
            st.conditions, Type.VALID, False, reason, str(exc), generation
        )
    if st.launch is not None or children:
        await _launched(name, namespace, uid, generation, spec_raw, ok, children, ctx, out)
    elif ok is None:
        _invalid(name, namespace, generation, out)
    else:
        await _plan_and_maybe_launch(name, namespace, uid, generation, ok, ctx, out)
    return out


def _same(before: TrainingPlanStatus, type_: str, reason: str, exc: SpecError) -> Condition | None:
    """The previous condition if it already said this (then no new Event is posted)."""
    c = get_condition(before.conditions, type_)
    if c is not None and c.reason == reason and c.message == str(exc) and c.status == "False":
        return c
    return None


def _invalid(name: str, namespace: str, generation: int, out: PlanResult) -> None:
    st = out.status
    metrics.forget_plan(namespace, name)
    valid = get_condition(st.conditions, Type.VALID)
    st.conditions = set_condition(
        st.conditions,
        Type.PLANNED,
        False,
        valid.reason if valid else Reason.INVALID_SPEC,
        "not planned: the spec is invalid",
        generation,
    )
    st.phase = TrainingPlanPhase.INVALID


async def _coefficients(
    ok: Validated, ctx: PlanContext, out: PlanResult, generation: int
) -> dict[str, CoefficientsDocument | None]:
    names = [r.name for r in ok.spec.pools]
    docs, notes = await _documents(names, ctx.cfg, ctx.kube)
    revisions = pool_revisions(names, ctx.pools)
    priors = sorted(p for p, d in docs.items() if d is None)
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
            pool=p, source="prior" if docs[p] is None else "measured", revision=revisions[p]
        )
        for p in names
    ]
    return docs


async def _plan_and_maybe_launch(
    name: str,
    namespace: str,
    uid: str,
    generation: int,
    ok: Validated,
    ctx: PlanContext,
    out: PlanResult,
) -> None:
    st = out.status
    docs = await _coefficients(ok, ctx, out, generation)
    outcome = await _search(name, namespace, ok, docs, out, generation)
    if outcome is None:
        return
    _apply_outcome(st, outcome)
    _blocking(
        st, ok, outcome.predictions.outer_step_blocking_seconds, "", namespace, name, generation
    )
    st.phase = TrainingPlanPhase.PLANNED
    if not ok.spec.launch:
        st.conditions = set_condition(
            st.conditions,
            Type.LAUNCHED,
            False,
            Reason.PLAN_ONLY,
            "plan only: set spec.launch to create the Jobs",
            generation,
        )
        return
    revision = decision_revision(
        uid, ok.spec.relaunch, st.islands, st.streaming_di_lo_co, ok.spec.template
    )
    st.launch = LaunchRecord(
        revision=revision, relaunch=ok.spec.relaunch, generation=generation, complete=False
    )
    await _create(name, namespace, uid, generation, ok, [], ctx, out)
    if st.launch.complete:
        children = await list_children(ctx.kube, namespace, uid)
        _drift(st, generation, out)
        _follow(name, namespace, generation, children, ctx, out)


async def _search(
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


def _apply_outcome(st: TrainingPlanStatus, outcome: PlanOutcome) -> None:
    st.plan, st.island_count, st.gpus = outcome.plan, outcome.island_count, outcome.gpus
    st.islands, st.streaming_di_lo_co = outcome.islands, outcome.settings
    st.predictions, st.frontier = outcome.predictions, outcome.frontier


def _blocking(
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


# ---- launched plans ---------------------------------------------------------------------------
async def _launched(
    name: str,
    namespace: str,
    uid: str,
    generation: int,
    spec_raw: Mapping[str, Any],
    ok: Validated | None,
    children: list[dict[str, Any]],
    ctx: PlanContext,
    out: PlanResult,
) -> None:
    st = out.status
    if st.launch is None:  # children exist, but the status lost the decision (restored?)
        revisions = sorted(
            {str((c["metadata"].get("labels") or {}).get(PLAN_REVISION_LABEL)) for c in children}
        )
        st.phase = TrainingPlanPhase.LAUNCHED
        st.conditions = set_condition(
            st.conditions,
            Type.LAUNCHED,
            True,
            Reason.CHILDREN_MISSING,
            f"{len(children)} children of revision(s) {', '.join(revisions)} exist but the status "
            "has no launch record: nothing is re-planned or re-created; bump spec.relaunch to "
            "replace them",
            generation,
        )
        return
    if ok is not None and ok.spec.relaunch != st.launch.relaunch:
        docs = await _coefficients(ok, ctx, out, generation)
        outcome = await _search(name, namespace, ok, docs, out, generation)
        if outcome is None:
            return  # the running islands stay; Planned=False says why the relaunch waits
        _apply_outcome(st, outcome)
        _blocking(
            st, ok, outcome.predictions.outer_step_blocking_seconds, "", namespace, name, generation
        )
        revision = decision_revision(
            uid, ok.spec.relaunch, st.islands, st.streaming_di_lo_co, ok.spec.template
        )
        st.launch = LaunchRecord(
            revision=revision, relaunch=ok.spec.relaunch, generation=generation, complete=False
        )
        st.phase = TrainingPlanPhase.PLANNED
        out.events.append(("Normal", Reason.RELAUNCHING, f"relaunch {ok.spec.relaunch}: {st.plan}"))
    if not st.launch.complete:
        if ok is None:
            st.conditions = set_condition(
                st.conditions,
                Type.LAUNCHED,
                False,
                Reason.LAUNCHING,
                "the launch is recorded but the spec is invalid now: fix it to create the rest",
                generation,
            )
            return
        await _create(name, namespace, uid, generation, ok, children, ctx, out)
        if not st.launch.complete:
            return
        children = await list_children(ctx.kube, namespace, uid)
    _drift(st, generation, out)
    if ok is not None and _needs_reevaluation(st, ok, ctx):
        await _reevaluate(name, namespace, generation, ok, ctx, out)
    _follow(name, namespace, generation, children, ctx, out)


def _needs_reevaluation(st: TrainingPlanStatus, ok: Validated, ctx: PlanContext) -> bool:
    names = [r.name for r in ok.spec.pools]
    used = {c.pool: c.revision for c in st.coefficients}
    return st.predictions is None or any(
        used.get(n) != r for n, r in pool_revisions(names, ctx.pools).items()
    )


def _drift(st: TrainingPlanStatus, generation: int, out: PlanResult) -> None:
    assert st.launch is not None
    launched = st.launch.generation
    before = get_condition(st.conditions, Type.SPEC_CHANGED_AFTER_LAUNCH)
    if generation != launched:
        message = (
            f"the spec changed (generation {generation}) after the launch of generation "
            f"{launched}: not applied to the running islands; bump spec.relaunch to relaunch "
            "with it"
        )
        if before is None or before.status != "True" or before.observed_generation != generation:
            out.events.append(("Warning", "SpecChangedAfterLaunch", message))
        st.conditions = set_condition(
            st.conditions,
            Type.SPEC_CHANGED_AFTER_LAUNCH,
            True,
            Reason.SPEC_FROZEN,
            message,
            generation,
        )
    else:
        st.conditions = set_condition(
            st.conditions,
            Type.SPEC_CHANGED_AFTER_LAUNCH,
            False,
            Reason.SPEC_UNCHANGED,
            "the running islands follow the current spec",
            generation,
        )


async def _reevaluate(
    name: str, namespace: str, generation: int, ok: Validated, ctx: PlanContext, out: PlanResult
) -> None:
    st = out.status
    docs = await _coefficients(ok, ctx, out, generation)
    ev = await search_in_worker(
        reevaluate, ok.request, docs, st.islands, st.streaming_di_lo_co, st.predictions
    )
    st.predictions = ev.predictions
    metrics.set_predictions(namespace, name, ev.predictions)
    rec = ev.recommendation
    settings = (
        DiLoCoSettings(
            sync_every=rec.sync_every,
            fragments=rec.fragments,
            fragment_sync_delay=rec.fragment_sync_delay,
        )
        if rec is not None
        else None
    )
    was = get_condition(st.conditions, Type.OUTER_STEP_BLOCKING)
    _blocking(st, ok, ev.blocking_s, rec.text if rec else "", namespace, name, generation, settings)
    now = get_condition(st.conditions, Type.OUTER_STEP_BLOCKING)
    if now is not None and now.status == "True" and (was is None or was.message != now.message):
        out.events.append(("Warning", "OuterStepBlocking", now.message))


async def _create(
    name: str,
    namespace: str,
    uid: str,
    generation: int,
    ok: Validated,
    children: list[dict[str, Any]],
    ctx: PlanContext,
    out: PlanResult,
) -> None:
    st = out.status
    assert st.launch is not None
    if ctx.write is not None:
        await ctx.write(st)  # the decision is durable before any child exists
    plan_json = json.dumps(
        {
            "plan": st.plan,
            "islands": [i.model_dump(by_alias=True, include=ISLAND_SHAPE) for i in st.islands],
            "streamingDiLoCo": st.streaming_di_lo_co.model_dump(by_alias=True)
            if st.streaming_di_lo_co
            else None,
            "revision": st.launch.revision,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    manifests = island_manifests(
        name,
        namespace,
        owner_reference("TrainingPlan", name, uid),
        ok.spec.template,
        st.islands,
        ok.pools,
        st.streaming_di_lo_co,
        plan_json,
        child_labels(name, uid, st.launch.revision),
    )
    result = await ensure_children(ctx.kube, manifests, children, uid, st.launch.revision)
    st.jobs = [m["metadata"]["name"] for m in manifests if m["kind"] == "Job"]
    if result.conflict:
        message = result.conflict
        launched = get_condition(st.conditions, Type.LAUNCHED)
        if launched is None or launched.reason != Reason.NAME_CONFLICT:
            out.events.append(("Warning", Reason.NAME_CONFLICT, message))
        out.requeue_s = ctx.cfg.recheck_interval_s  # resumes once the name is free
        st.conditions = set_condition(
            st.conditions, Type.LAUNCHED, False, Reason.NAME_CONFLICT, message, generation
        )
        return
    if result.waiting:
        st.conditions = set_condition(
            st.conditions,
            Type.LAUNCHED,
            False,
            Reason.RELAUNCHING,
            f"waiting for {len(result.waiting)} child(ren) of the previous launch to be deleted: "
            + ", ".join(result.waiting[:5]),
            generation,
        )
        out.requeue_s = 2.0
        return
    st.launch = st.launch.model_copy(update={"complete": True})
    st.phase = TrainingPlanPhase.LAUNCHED
    message = f"{len(st.jobs)} Job(s) of revision {st.launch.revision}: {', '.join(st.jobs)}"
    st.conditions = set_condition(
        st.conditions, Type.LAUNCHED, True, Reason.JOBS_CREATED, message, generation
    )
    out.events.append(("Normal", "Launched", f"created {len(st.jobs)} island Job(s) for {st.plan}"))


def _follow(
    name: str,
    namespace: str,
    generation: int,
    children: list[dict[str, Any]],
    ctx: PlanContext,
    out: PlanResult,
) -> None:
    st = out.status
    assert st.launch is not None
    revision = st.launch.revision
    jobs = {
        c["metadata"]["name"]: c
        for c in children
        if c.get("kind") == "Job"
        and (c["metadata"].get("labels") or {}).get(PLAN_REVISION_LABEL) == revision
    }
    before = list(st.islands)
    st.islands = follow_islands(before, jobs, ctx.rejected, complete=st.launch.complete)
    for isl in transitions(before, st.islands):
        kind = (
            "Warning"
            if isl.state in (IslandState.FAILED,) or isl.reason == "PodsRejected"
            else "Normal"
        )
        text = f"island {isl.name}: {isl.state.value} ({isl.reason})" + (
            f": {isl.message}" if isl.message else ""
        )
        out.events.append((kind, f"Island{isl.state.value.capitalize()}", text))
    phase = plan_phase(st.islands)
    if phase is not st.phase:
        kind = "Warning" if phase is TrainingPlanPhase.FAILED else "Normal"
        out.events.append((kind, phase.value, f"TrainingPlan is {phase.value}"))
    st.phase = phase
    failed = [i for i in st.islands if i.state is IslandState.FAILED]
    pending = [i for i in st.islands if i.state is IslandState.PENDING]
    st.conditions = set_condition(
        st.conditions,
        Type.FAILED,
        bool(failed),
        Reason.ISLAND_FAILED if failed else Reason.NO_FAILURE,
        "; ".join(f"{i.name}: {i.reason} {i.message}".strip() for i in failed[:8])
        or "no island failed",
        generation,
    )
    st.conditions = set_condition(
        st.conditions,
        Type.RUNNING,
        phase is TrainingPlanPhase.RUNNING,
        Reason.ALL_RUNNING
        if phase is TrainingPlanPhase.RUNNING
        else (
            Reason.ALL_SUCCEEDED if phase is TrainingPlanPhase.SUCCEEDED else Reason.ISLANDS_PENDING
        ),
        f"{len(st.islands) - len(pending) - len(failed)}/{len(st.islands)} islands running or done"
        + "".join(f"; {i.name}: {i.reason} {i.message}".rstrip() for i in pending[:4]),
        generation,
    )
    metrics.set_islands(namespace, name, [i.state.value for i in st.islands])


__all__ = ["CHILD_KINDS", "PlanContext", "PlanResult", "PoolView", "needs_work", "reconcile_plan"]
