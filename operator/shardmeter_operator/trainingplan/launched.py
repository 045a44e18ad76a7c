"""A TrainingPlan with a launch record, purely (the rules are in
:mod:`shardmeter_operator.launch.rules`): frozen islands, a relaunch on request (planned and
recorded again), the rest of the recorded decision's children (:mod:`~.launch.rules.children`), or
following a complete launch — re-evaluated with new coefficients (:func:`follow_launched`),
its spec drift and islands followed (:mod:`~.launch.rules.follow`)."""

from __future__ import annotations

from typing import Any

from shardmeter_operator.api import (
    DiLoCoSettings,
    TrainingPlanPhase,
)
from shardmeter_operator.api.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.decision import PlanInputs, PlanResult, Validated
from shardmeter_operator.launch.children import children_to_create
from shardmeter_operator.launch.follow import drift, follow
from shardmeter_operator.launch.sites import follow_sites
from shardmeter_operator.launch.workload import (
    follow_workload,
)
from shardmeter_operator.render.kueue import JOB_UID_LABEL
from shardmeter_operator.render.labels import PLAN_REVISION_LABEL
from shardmeter_operator.trainingplan.model import reevaluate
from shardmeter_operator.trainingplan.planned import (
    blocking,
    coefficients,
    needs_reevaluation,
    plan,
    record_launch,
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


def follow_launched(inputs: PlanInputs, ok: Validated | None, out: PlanResult) -> None:
    """A complete launch: spec drift, re-evaluation with new coefficients, Kueue's admission
    and the islands' states (``inputs.children`` and ``inputs.workloads`` as they are now)."""
    st, generation = out.status, inputs.generation
    drift(st, generation, out, ok.spec if ok is not None else None)
    if ok is not None and needs_reevaluation(st, ok, inputs.pools):
        _reevaluate(inputs, ok, out)
    queued = follow_workload(generation, inputs.children, inputs.workloads, inputs.pools, out)
    waiting: dict[str, str] = {}
    if st.launch is not None and st.launch.sites:
        current = {
            c["metadata"]["name"]: c
            for c in inputs.children
            if c.get("kind") == "JobSet"
            and (c["metadata"].get("labels") or {}).get(PLAN_REVISION_LABEL) == st.launch.revision
        }
        by_owner = {
            str((wl["metadata"].get("labels") or {}).get(JOB_UID_LABEL)): wl
            for wl in inputs.workloads
        }
        waiting = follow_sites(
            st, ok.spec if ok is not None else None, current, by_owner, generation, out
        )
    follow(generation, inputs.children, inputs.rejected, out, queued=queued, sites_waiting=waiting)
    out.followed = True


def _reevaluate(inputs: PlanInputs, ok: Validated, out: PlanResult) -> None:
    """Predict the frozen islands again with the pools' new coefficients (CPU-heavy: run in
    the planning worker thread); ``OuterStepBlocking`` recommends settings when they block."""
    st = out.status
    docs = coefficients(inputs, ok, out)
    ev = reevaluate(ok.request, docs, st.islands, st.streaming_di_lo_co, st.predictions)
    st.predictions = ev.predictions
    rec = ev.recommendation
    settings = DiLoCoSettings.of(rec.choice.settings) if rec is not None and rec.changes else None
    was = get_condition(st.conditions, Type.OUTER_STEP_BLOCKING)
    blocking(out, ok, ev.blocking_s, rec.text if rec else "", inputs.generation, settings)
    now = get_condition(st.conditions, Type.OUTER_STEP_BLOCKING)
    if now is not None and now.status == "True" and (was is None or was.message != now.message):
        out.events.append(("Warning", "OuterStepBlocking", now.message))
