"""Deciding a TrainingPlan, purely: from the plan as written, the pools, their coefficients
and what exists in the cluster (:class:`~.trainingplan.planned.PlanInputs`), the whole new status, the
Events, the gauges and the children to create (:class:`~.trainingplan.context.PlanResult`). No API
calls here: :mod:`shardmeter_operator.trainingplan.reconcile` reads what :func:`plan_reads` names, runs
:func:`decide` (in the planning worker thread when it searches) and applies the result.

The state machine and its rules are in :mod:`shardmeter_operator.launch.rules`; the launched half
of the decision is :func:`~.trainingplan.launched.decide_launched`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardmeter.errors import SpecError
from shardmeter_operator.api import Condition, TrainingPlanPhase, TrainingPlanStatus
from shardmeter_operator.api.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.api.errors import reason_for
from shardmeter_operator.decision import PlanInputs, PlanResult, PoolView, Validated
from shardmeter_operator.launch.children import children_to_create
from shardmeter_operator.trainingplan.launched import decide_launched
from shardmeter_operator.trainingplan.planned import needs_reevaluation, plan, record_launch
from shardmeter_operator.trainingplan.validate import validate

Manifest = dict[str, Any]


# ---- what to read -----------------------------------------------------------------------------
def lists_children(spec: Mapping[str, Any], status: TrainingPlanStatus) -> bool:
    """Children exist only after a launch decision was recorded (or when a status was lost):
    a plan that never launched and is not asked to needs no listing."""
    return status.launch is not None or bool(spec.get("launch"))


@dataclass(frozen=True)
class PlanReads:
    """What :func:`decide` needs read beyond the plan, the pools' views and its children."""

    documents: list[str] = field(default_factory=list)
    """Pools whose coefficients ConfigMaps to read."""
    searches: bool = False
    """The decision searches or re-evaluates (it runs in the planning worker thread)."""
    decides_launch: bool = False
    """A launch decision may be taken: whether JobSet (and, with a queue, Kueue and the
    LocalQueue) are there."""
    queue: str = ""
    """The LocalQueue a launch is decided for or rendered into ("" none)."""
    flavors: list[str] = field(default_factory=list)
    """ResourceFlavors of the pools, read when ``queue`` is set."""
    site_queues: list[str] = field(default_factory=list)
    """The pools' site queues (``spec.kueue.queueName``) whose MultiKueue setup a launch
    decision reads."""
    lighthouse: bool = False
    """The recorded launch is incomplete: read the lighthouse Service's address."""


def plan_reads(
    spec: Mapping[str, Any],
    status: TrainingPlanStatus,
    pools: Mapping[str, PoolView],
    children: Sequence[Manifest],
) -> PlanReads:
    """What deciding this plan reads (cheap: validates the spec, calls nothing)."""
    try:
        ok = validate(spec, pools)
    except SpecError:
        return PlanReads()
    names = [r.name for r in ok.spec.pools]
    flavors = sorted(
        {p.kueue.flavor for p in ok.pools.values() if p.kueue is not None and p.kueue.flavor}
    )
    sites = sorted(
        {
            p.kueue.queue_name
            for p in ok.pools.values()
            if p.kueue is not None and p.kueue.queue_name
        }
    )
    launch = status.launch
    if launch is None:
        if children:
            return PlanReads()  # ChildrenMissing: nothing is planned or created
        decides = ok.spec.launch
        return PlanReads(
            names,
            True,
            decides,
            ok.spec.queue_name if decides else "",
            flavors if decides else [],
            sites if decides else [],
            decides,
        )
    if ok.spec.relaunch != launch.relaunch:
        return PlanReads(names, True, True, ok.spec.queue_name, flavors, sites, True)
    searches = needs_reevaluation(status, ok, pools)
    queue = launch.queue_name if not launch.complete else ""
    return PlanReads(
        names if searches else [],
        searches,
        False,
        queue,
        flavors if queue else [],
        lighthouse=not launch.complete,
    )


# ---- the decision -----------------------------------------------------------------------------
def decide(inputs: PlanInputs) -> PlanResult:
    """The new status of a TrainingPlan, its Events, gauges and the children to create."""
    before = inputs.status
    st = before.model_copy(deep=True, update={"observed_generation": inputs.generation})
    out = PlanResult(st, previous=list(before.conditions))
    ok = out.validated = _validate(inputs, out)
    if st.launch is not None or inputs.children:
        decide_launched(inputs, ok, out)
    elif ok is None:
        _invalid(inputs.generation, out)
    else:
        _plan_and_maybe_launch(inputs, ok, out)
    return out


def _validate(inputs: PlanInputs, out: PlanResult) -> Validated | None:
    st, generation = out.status, inputs.generation
    try:
        ok = validate(inputs.spec, inputs.pools)
    except SpecError as exc:
        reason = reason_for(exc)
        if _same(inputs.status, Type.VALID, reason, exc) is None:  # an Event once per problem
            out.events.append(("Warning", reason, str(exc)))
        st.conditions = set_condition(
            st.conditions, Type.VALID, False, reason, str(exc), generation
        )
        return None
    st.conditions = set_condition(
        st.conditions, Type.VALID, True, Reason.SPEC_VALID, "spec is valid", generation
    )
    return ok


def _same(before: TrainingPlanStatus, type_: str, reason: str, exc: SpecError) -> Condition | None:
    """The previous condition if it already said this (then no new Event is posted)."""
    c = get_condition(before.conditions, type_)
    if c is not None and c.reason == reason and c.message == str(exc) and c.status == "False":
        return c
    return None


def _invalid(generation: int, out: PlanResult) -> None:
    st = out.status
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


def _plan_and_maybe_launch(inputs: PlanInputs, ok: Validated, out: PlanResult) -> None:
    st = out.status
    if not plan(inputs, ok, out):
        return
    st.phase = TrainingPlanPhase.PLANNED
    if not ok.spec.launch:
        st.conditions = set_condition(
            st.conditions,
            Type.LAUNCHED,
            False,
            Reason.PLAN_ONLY,
            "plan only: set spec.launch to create the Jobs",
            inputs.generation,
        )
        return
    if record_launch(inputs, ok, out):
        children_to_create(inputs, ok, out)
