"""Launched TrainingPlans, the pure half (the rules are in :mod:`shardmeter_operator.launch`):
a relaunch, the children of the recorded decision, what their creation came to, spec drift,
re-evaluation with new coefficients, and following the islands."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from shardmeter_operator.children import Ensured
from shardmeter_operator.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.errors import FlavorError, RuntimeCannotExpressError, reason_for
from shardmeter_operator.launch import ISLAND_SHAPE, plan_phase, transitions
from shardmeter_operator.manifests import PLAN_REVISION_LABEL
from shardmeter_operator.observe import observe_only_change
from shardmeter_operator.plancontext import PlanResult, Validated
from shardmeter_operator.planning import reevaluate
from shardmeter_operator.plansteps import (
    PlanInputs,
    blocking,
    coefficients,
    needs_reevaluation,
    plan,
    record_launch,
)
from shardmeter_operator.resources import (
    DiLoCoSettings,
    IslandState,
    TrainingPlanPhase,
    TrainingPlanSpec,
    TrainingPlanStatus,
)
from shardmeter_operator.runtime_manifests import launch_manifests
from shardmeter_operator.workload import (
    follow_workload,
    island_states,
    launched_message,
    rendered_pools,
    used_pools,
)

Manifest = dict[str, Any]


def decide_launched(inputs: PlanInputs, ok: Validated | None, out: PlanResult) -> None:
    """A plan with a launch record or children: frozen islands (rule 2), a relaunch on
    request (rule 4), the rest of the recorded decision's children (rule 1), or following."""
    st, generation = out.status, inputs.generation
    if st.launch is None:  # children exist, but the status lost the decision (restored?)
        revisions = sorted(
            {
                str((c["metadata"].get("labels") or {}).get(PLAN_REVISION_LABEL))
                for c in inputs.children
            }
        )
        st.phase = TrainingPlanPhase.LAUNCHED
        st.conditions = set_condition(
            st.conditions,
            Type.LAUNCHED,
            True,
            Reason.CHILDREN_MISSING,
            f"{len(inputs.children)} children of revision(s) {', '.join(revisions)} exist but "
            "the status has no launch record: nothing is re-planned or re-created; bump "
            "spec.relaunch to replace them",
            generation,
        )
        return
    if ok is not None and ok.spec.relaunch != st.launch.relaunch:
        # the running islands stay unless the relaunched plan is found and launchable
        if not plan(inputs, ok, out) or not record_launch(inputs, ok, out):
            return
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
        children_to_create(inputs, ok, out)
        return
    follow_launched(inputs, ok, out)


def children_to_create(inputs: PlanInputs, ok: Validated, out: PlanResult) -> None:
    """The children of the recorded launch decision, in order, into ``out.create`` (the
    lighthouse first, then the islands with torchtitan's flags); none, with ``Launched=False``
    and a recheck, when they cannot be rendered."""
    st = out.status
    assert st.launch is not None
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
    try:
        pools = rendered_pools(
            used_pools(ok.pools, st.islands), st.launch.queue_name, inputs.cluster.flavors
        )
        out.create = launch_manifests(
            inputs.name,
            inputs.namespace,
            inputs.uid,
            ok.spec,
            st,
            pools,
            plan_json=plan_json,
            revision=st.launch.revision,
            bench_image=inputs.cfg.bench_image,
            workload=st.launch.workload,
            queue=st.launch.queue_name,
        )
    except (RuntimeCannotExpressError, FlavorError) as exc:  # checked by the decision
        st.conditions = set_condition(
            st.conditions, Type.LAUNCHED, False, reason_for(exc), str(exc), inputs.generation
        )
        out.requeue_within(inputs.cfg.recheck_interval_s)


def ensured(inputs: PlanInputs, result: Ensured, out: PlanResult) -> None:
    """What creating ``out.create`` came to (:func:`~.children.ensure_children`): a name
    conflict, the previous revision's children still going away, or a complete launch."""
    st, generation = out.status, inputs.generation
    assert st.launch is not None
    st.jobs = [i.name for i in st.islands]  # each island's Job (a JobSet's child Jobs too)
    if result.conflict:
        message = result.conflict
        launched = get_condition(st.conditions, Type.LAUNCHED)
        if launched is None or launched.reason != Reason.NAME_CONFLICT:
            out.events.append(("Warning", Reason.NAME_CONFLICT, message))
        out.requeue_s = inputs.cfg.recheck_interval_s  # resumes once the name is free
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
    created, reason = launched_message(st)
    st.conditions = set_condition(st.conditions, Type.LAUNCHED, True, reason, created, generation)
    out.events.append(("Normal", "Launched", f"{created} for {st.plan}"))


def follow_launched(inputs: PlanInputs, ok: Validated | None, out: PlanResult) -> None:
    """A complete launch: spec drift, re-evaluation with new coefficients, Kueue's admission
    and the islands' states (``inputs.children`` and ``inputs.workloads`` as they are now)."""
    st, generation = out.status, inputs.generation
    drift(st, generation, out, ok.spec if ok is not None else None)
    if ok is not None and needs_reevaluation(st, ok, inputs.pools):
        _reevaluate(inputs, ok, out)
    queued = follow_workload(generation, inputs.children, inputs.workloads, inputs.pools, out)
    follow(generation, inputs.children, inputs.rejected, out, queued=queued)
    out.followed = True


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


def _reevaluate(inputs: PlanInputs, ok: Validated, out: PlanResult) -> None:
    """Predict the frozen islands again with the pools' new coefficients (CPU-heavy: run in
    the planning worker thread); ``OuterStepBlocking`` recommends settings when they block."""
    st = out.status
    docs = coefficients(inputs, ok, out)
    ev = reevaluate(ok.request, docs, st.islands, st.streaming_di_lo_co, st.predictions)
    st.predictions = ev.predictions
    rec = ev.recommendation
    settings = DiLoCoSettings.of(rec.choice.settings) if rec is not None else None
    was = get_condition(st.conditions, Type.OUTER_STEP_BLOCKING)
    blocking(out, ok, ev.blocking_s, rec.text if rec else "", inputs.generation, settings)
    now = get_condition(st.conditions, Type.OUTER_STEP_BLOCKING)
    if now is not None and now.status == "True" and (was is None or was.message != now.message):
        out.events.append(("Warning", "OuterStepBlocking", now.message))


def follow(
    generation: int,
    children: Sequence[Manifest],
    rejected: Mapping[str, str],
    out: PlanResult,
    *,
    queued: str = "",
) -> None:
    """The islands' states, the phase, ``Running`` and ``Failed``; ``queued``: why Kueue
    has not admitted the workload yet (:func:`workload.follow_workload`)."""
    st = out.status
    assert st.launch is not None
    before = list(st.islands)
    st.islands = island_states(st, children, rejected, queued=queued)
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
