"""Following a complete launch, purely: spec drift after the launch (:func:`drift`), and the
islands' states, the plan's phase and the ``Running``/``Failed`` conditions from the
children as they are now (:func:`follow`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardmeter_operator.api import (
    IslandState,
    TrainingPlanPhase,
    TrainingPlanSpec,
    TrainingPlanStatus,
)
from shardmeter_operator.api.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.decision import PlanResult
from shardmeter_operator.launch.rules import observe_only_change, plan_phase, transitions
from shardmeter_operator.launch.workload import island_states

Manifest = dict[str, Any]


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


def follow(
    generation: int,
    children: Sequence[Manifest],
    rejected: Mapping[str, str],
    out: PlanResult,
    *,
    queued: str = "",
    sites_waiting: Mapping[str, str] | None = None,
) -> None:
    """The islands' states, the phase, ``Running`` and ``Failed``; ``queued``: why Kueue
    has not admitted the workload yet (:func:`workload.follow_workload`); ``sites_waiting``:
    a launch through MultiKueue, why each waiting site waits (:func:`~.sites.follow_sites`)."""
    st = out.status
    assert st.launch is not None
    before = list(st.islands)
    st.islands = island_states(st, children, rejected, queued=queued, sites_waiting=sites_waiting)
    for was, now in zip(before, st.islands, strict=False):
        if now.restarts > was.restarts:
            out.events.append(
                (
                    "Warning",
                    "IslandRestarted",
                    f"island {now.name} failed and was recreated alone (restart "
                    f"{now.restarts}); the other islands keep training",
                )
            )
    if st.launch.sites:
        st.restarts = sum(i.restarts for i in st.islands)
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
