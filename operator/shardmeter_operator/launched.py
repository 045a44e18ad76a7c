"""Launched TrainingPlans (the rules are in :mod:`shardmeter_operator.launch`): a relaunch,
creating the children of the recorded decision, spec drift, re-evaluation with new
coefficients, and following the islands."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shardmeter_operator import metrics
from shardmeter_operator.children import ensure_children, list_children
from shardmeter_operator.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.errors import RuntimeCannotExpressError
from shardmeter_operator.launch import (
    ISLAND_SHAPE,
    decision_revision,
    follow_islands,
    plan_phase,
    transitions,
)
from shardmeter_operator.manifests import (
    PLAN_REVISION_LABEL,
)
from shardmeter_operator.observe import launch_digest, observe_only_change, observe_plan
from shardmeter_operator.plancontext import (
    PlanContext,
    PlanResult,
    Validated,
    apply_outcome,
    blocking,
    coefficients,
    pool_revisions,
    search,
    search_in_worker,
)
from shardmeter_operator.planning import (
    reevaluate,
)
from shardmeter_operator.resources import (
    DiLoCoSettings,
    IslandState,
    LaunchRecord,
    TrainingPlanPhase,
    TrainingPlanSpec,
    TrainingPlanStatus,
)
from shardmeter_operator.runtime_manifests import launch_manifests, launchable_run, refuse_launch


# ---- launched plans ---------------------------------------------------------------------------
async def reconcile_launched(
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
        docs = await coefficients(ok, ctx, out, generation)
        outcome = await search(name, namespace, ok, docs, out, generation)
        if outcome is None:
            return  # the running islands stay; Planned=False says why the relaunch waits
        apply_outcome(st, outcome)
        blocking(
            st, ok, outcome.predictions.outer_step_blocking_seconds, "", namespace, name, generation
        )
        try:  # the relaunched plan must run as planned on torchtitan-FT, or nothing changes
            launchable_run(ok.spec, st, namespace)
        except RuntimeCannotExpressError as exc:
            event = refuse_launch(st, exc, generation)
            out.events += [event] if event else []
            return
        revision = decision_revision(
            uid, ok.spec.relaunch, st.islands, st.streaming_di_lo_co, ok.spec.template
        )
        st.launch = LaunchRecord(
            revision=revision,
            relaunch=ok.spec.relaunch,
            generation=generation,
            complete=False,
            spec_digest=launch_digest(ok.spec),
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
        await create_children(name, namespace, uid, generation, ok, children, ctx, out)
        if not st.launch.complete:
            return
        children = await list_children(ctx.kube, namespace, uid)
    drift(st, generation, out, ok.spec if ok is not None else None)
    if ok is not None and _needs_reevaluation(st, ok, ctx):
        await _reevaluate(name, namespace, generation, ok, ctx, out)
    follow(name, namespace, generation, children, ctx, out)
    await observe_plan(name, namespace, uid, ok, ctx, out)


def _needs_reevaluation(st: TrainingPlanStatus, ok: Validated, ctx: PlanContext) -> bool:
    names = [r.name for r in ok.spec.pools]
    used = {c.pool: c.revision for c in st.coefficients}
    return st.predictions is None or any(
        used.get(n) != r for n, r in pool_revisions(names, ctx.pools).items()
    )


def drift(
    st: TrainingPlanStatus,
    generation: int,
    out: PlanResult,
    spec: TrainingPlanSpec | None = None,
) -> None:
    assert st.launch is not None
    launched = st.launch.generation
    before = get_condition(st.conditions, Type.SPEC_CHANGED_AFTER_LAUNCH)
    if generation != launched and not observe_only_change(st, spec):
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
    docs = await coefficients(ok, ctx, out, generation)
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
    blocking(st, ok, ev.blocking_s, rec.text if rec else "", namespace, name, generation, settings)
    now = get_condition(st.conditions, Type.OUTER_STEP_BLOCKING)
    if now is not None and now.status == "True" and (was is None or was.message != now.message):
        out.events.append(("Warning", "OuterStepBlocking", now.message))


async def create_children(
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
    try:  # the torchft lighthouse first, then the islands with torchtitan's flags
        manifests = launch_manifests(
            name,
            namespace,
            uid,
            ok.spec,
            st,
            ok.pools,
            plan_json=plan_json,
            revision=st.launch.revision,
            bench_image=ctx.cfg.bench_image,
        )
    except RuntimeCannotExpressError as exc:  # checked when the decision was made
        st.conditions = set_condition(
            st.conditions, Type.LAUNCHED, False, Reason.NOT_LAUNCHABLE, str(exc), generation
        )
        return
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


def follow(
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
