"""The cost/runtime Pareto frontier and the objectives that pick a plan.

Both work on the *ranked* figures (`Evaluation.rank_time_s` and friends): with
``objective.qualityAdjusted`` the time, cost, energy and CO₂e to reach data-parallel's loss,
else the figures for ``totalTokens`` as they are."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from shardmeter.errors import InfeasibleError
from shardmeter.plan.evaluate import RELATIVE_TIE, Evaluation
from shardmeter.plan.schema import ObjectiveKind, PlanSpec

__all__ = [
    "RELATIVE_TIE",
    "canonical_order",
    "merge_frontier",
    "pareto_frontier",
    "pick",
    "select",
]


def canonical_order(ev: Evaluation) -> npt.NDArray[np.int64]:
    """Indices sorted by ranked time, ranked cost, nodes, islands, then `Evaluation.tie` (so
    ties are broken the same way everywhere)."""
    keys = [ev.tie[:, j] for j in range(ev.tie.shape[1] - 1, -1, -1)]
    return np.lexsort((*keys, ev.islands, ev.nodes, ev.rank_cost_usd, ev.rank_time_s)).astype(
        np.int64
    )


def pareto_frontier(ev: Evaluation) -> Evaluation:
    """Feasible layouts not dominated in (ranked time, ranked cost), fastest first; of layouts
    with equal time and cost the one with the fewest nodes, then islands, is kept."""
    ok = ev.subset(ev.feasible)
    if len(ok) == 0:
        return ok
    keep, best = [], math.inf
    cost = ok.rank_cost_usd
    for i in canonical_order(ok):
        if cost[i] < best:
            keep.append(int(i))
            best = float(cost[i])
    return ok.subset(np.asarray(keep, dtype=np.int64))


def merge_frontier(a: Evaluation | None, b: Evaluation, pools: int) -> Evaluation:
    if a is None or len(a) == 0:
        return pareto_frontier(b)
    return pareto_frontier(Evaluation.concat([a, b], pools))


def first_least(order: npt.NDArray[np.int64], values: npt.NDArray[np.float64]) -> int:
    """The first index in ``order`` whose value is the least (exact ties: canonical order)."""
    least = values[order].min()
    return int(order[np.flatnonzero(values[order] == least)[0]])


def pick(
    evaluated: Evaluation,
    spec: PlanSpec,
    order: npt.NDArray[np.int64],
    fastest_time_s: float,
) -> int | None:
    """The objective's choice among ``evaluated`` (``order``: `canonical_order`), the
    throughput fraction taken of ``fastest_time_s``; None when no layout is within the budget
    or the throughput fraction. Ties on the objective's figure go by the canonical order."""
    obj = spec.objective
    time_s, cost = evaluated.rank_time_s, evaluated.rank_cost_usd
    if obj.kind is ObjectiveKind.MIN_TIME:
        return int(order[0])
    if obj.kind is ObjectiveKind.MIN_COST:
        return first_least(order, cost)
    if obj.kind is ObjectiveKind.MIN_ENERGY:
        return first_least(order, evaluated.rank_energy_kwh)
    if obj.kind is ObjectiveKind.MIN_CO2:
        return first_least(order, evaluated.rank_co2_kg)
    if obj.kind is ObjectiveKind.THROUGHPUT_FRACTION:
        # throughput ≥ fraction × the best ⇔ time ≤ the fastest's time ÷ fraction
        cap = fastest_time_s / (obj.throughput_fraction * (1 - RELATIVE_TIE))
        within = order[time_s[order] <= cap]
        return first_least(within, cost) if len(within) else None
    if obj.kind is ObjectiveKind.COST_BUDGET:
        assert obj.cost_budget_usd is not None
        within = order[cost[order] <= obj.cost_budget_usd * (1 + RELATIVE_TIE)]
        return int(within[0]) if len(within) else None
    assert obj.time_budget_hours is not None
    within = order[time_s[order] <= obj.time_budget_hours * 3600 * (1 + RELATIVE_TIE)]
    return first_least(within, cost) if len(within) else None


def select(
    evaluated: Evaluation, spec: PlanSpec, describe: Callable[[int], str] = str
) -> tuple[int, int]:
    """(chosen, fastest): indices into ``evaluated`` (feasible layouts) for the objective
    (`pick`). A budget no plan meets is refused naming the fastest (or cheapest) plan,
    ``describe(index)``."""
    obj = spec.objective
    order = canonical_order(evaluated)
    fastest = int(order[0])
    time_s, cost = evaluated.rank_time_s, evaluated.rank_cost_usd
    chosen = pick(evaluated, spec, order, float(time_s[fastest]))
    if chosen is not None:
        return chosen, fastest
    if obj.kind is ObjectiveKind.COST_BUDGET:
        assert obj.cost_budget_usd is not None
        cheapest = first_least(order, cost)
        raise InfeasibleError(
            f"no plan costs ≤ ${obj.cost_budget_usd:,.0f}; the cheapest, "
            f"{describe(cheapest)}, costs ${cost[cheapest]:,.0f}"
            + (" to reach data-parallel's loss" if obj.quality_adjusted else "")
            + " — raise "
            "objective.costBudgetUsd",
            "objective.costBudgetUsd",
        )
    assert obj.kind is ObjectiveKind.TIME_BUDGET and obj.time_budget_hours is not None
    raise InfeasibleError(
        f"no plan finishes within {obj.time_budget_hours:g} h; the fastest, "
        f"{describe(fastest)}, takes {time_s[fastest] / 3600:,.4g} h"
        + (" to reach data-parallel's loss" if obj.quality_adjusted else "")
        + " — raise "
        "objective.timeBudgetHours",
        "objective.timeBudgetHours",
    )
