"""The cost/runtime Pareto frontier and the objectives that pick a plan from it."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from shardmeter.errors import InfeasibleError
from shardmeter.plan.evaluate import Evaluation
from shardmeter.plan.schema import ObjectiveKind, PlanSpec

RELATIVE_TIE = 1e-12
"""Throughput and budget comparisons allow this relative slack (floating-point noise)."""


def canonical_order(ev: Evaluation) -> npt.NDArray[np.int64]:
    """Indices sorted by time, cost, nodes, islands, then `Evaluation.tie` (so ties are
    broken the same way everywhere)."""
    keys = [ev.tie[:, j] for j in range(ev.tie.shape[1] - 1, -1, -1)]
    return np.lexsort((*keys, ev.islands, ev.nodes, ev.cost_usd, ev.time_s)).astype(np.int64)


def pareto_frontier(ev: Evaluation) -> Evaluation:
    """Feasible layouts not dominated in (time, cost), fastest first; of layouts with equal
    time and cost the one with the fewest nodes, then islands, is kept."""
    ok = ev.subset(ev.feasible)
    if len(ok) == 0:
        return ok
    keep, best = [], math.inf
    for i in canonical_order(ok):
        if ok.cost_usd[i] < best:
            keep.append(int(i))
            best = float(ok.cost_usd[i])
    return ok.subset(np.asarray(keep, dtype=np.int64))


def merge_frontier(a: Evaluation | None, b: Evaluation, pools: int) -> Evaluation:
    if a is None or len(a) == 0:
        return pareto_frontier(b)
    return pareto_frontier(Evaluation.concat([a, b], pools))


def select(frontier: Evaluation, spec: PlanSpec) -> tuple[int, int]:
    """(chosen, fastest) indices into the frontier for the objective."""
    obj = spec.objective
    n = len(frontier)
    fastest = 0
    if obj.kind is ObjectiveKind.MIN_TIME:
        return 0, fastest
    if obj.kind is ObjectiveKind.MIN_COST:
        return n - 1, fastest
    if obj.kind is ObjectiveKind.THROUGHPUT_FRACTION:
        floor = obj.throughput_fraction * frontier.tokens_per_s[0] * (1 - RELATIVE_TIE)
        ok = np.flatnonzero(frontier.tokens_per_s >= floor)
        return int(ok[-1]), fastest
    if obj.kind is ObjectiveKind.COST_BUDGET:
        assert obj.cost_budget_usd is not None
        ok = np.flatnonzero(frontier.cost_usd <= obj.cost_budget_usd * (1 + RELATIVE_TIE))
        if not len(ok):
            raise InfeasibleError(
                f"no plan costs ≤ ${obj.cost_budget_usd:,.0f}; the cheapest costs "
                f"${frontier.cost_usd[-1]:,.0f} — raise objective.costBudgetUsd",
                "objective.costBudgetUsd",
            )
        return int(ok[0]), fastest
    assert obj.time_budget_hours is not None
    ok = np.flatnonzero(frontier.time_s <= obj.time_budget_hours * 3600 * (1 + RELATIVE_TIE))
    if not len(ok):
        raise InfeasibleError(
            f"no plan finishes within {obj.time_budget_hours:g} h; the fastest takes "
            f"{frontier.time_s[0] / 3600:,.1f} h — raise objective.timeBudgetHours",
            "objective.timeBudgetHours",
        )
    return int(ok[-1]), fastest
