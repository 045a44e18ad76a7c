"""TrainingPlan reconciliation: validate → plan (in a worker thread) → record the launch
decision → create the children → follow them. The state machine and its rules are
documented in :mod:`shardmeter_operator.launch`; this module applies them.

`reconcile_plan` reads the object as it is now, acts (creates or deletes children), and
returns the whole new status as a :class:`TrainingPlanStatus` plus the Events to post.
It is level-triggered: running it twice changes nothing the second time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardmeter.errors import SpecError
from shardmeter_operator import metrics
from shardmeter_operator.children import list_children
from shardmeter_operator.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.errors import RuntimeCannotExpressError, reason_for
from shardmeter_operator.launch import (
    decision_revision,
)
from shardmeter_operator.launched import create_children, drift, follow, reconcile_launched
from shardmeter_operator.observe import launch_digest, observe_plan
from shardmeter_operator.plancontext import (
    PlanContext,
    PlanResult,
    PoolView,
    Validated,
    apply_outcome,
    blocking,
    coefficients,
    needs_work,
    referenced_pools,
    search,
    validate,
)
from shardmeter_operator.resources import (
    Condition,
    LaunchRecord,
    TrainingPlanPhase,
    TrainingPlanStatus,
)
from shardmeter_operator.runtime_manifests import launchable_run, refuse_launch


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
        await reconcile_launched(name, namespace, uid, generation, spec_raw, ok, children, ctx, out)
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
    docs = await coefficients(ok, ctx, out, generation)
    outcome = await search(name, namespace, ok, docs, out, generation)
    if outcome is None:
        return
    apply_outcome(st, outcome)
    blocking(
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
    try:  # torchtitan-FT must run the plan as planned, or nothing is recorded or created
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
    await create_children(name, namespace, uid, generation, ok, [], ctx, out)
    if st.launch.complete:
        children = await list_children(ctx.kube, namespace, uid)
        drift(st, generation, out, ok.spec)
        follow(name, namespace, generation, children, ctx, out)
        await observe_plan(name, namespace, uid, ok, ctx, out)


__all__ = [
    "PlanContext",
    "PlanResult",
    "PoolView",
    "needs_work",
    "reconcile_plan",
    "referenced_pools",
]
