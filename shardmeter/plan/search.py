"""Enumerate candidate plans, keep the cost/runtime Pareto frontier, pick the objective's plan.

Small searches (the paper's case study) are exhaustive: every combination of per-pool options
is scored in vectorised batches, giving the exact frontier. Large ones (many pools) use
branch and bound (`shardmeter.plan.bnb`) for the objective's exact optimum. Tests compare
both with brute force.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.errors import InfeasibleError
from shardmeter.plan.bnb import BranchAndBound, admissible
from shardmeter.plan.evaluate import OK, REASONS, Evaluation, Evaluator
from shardmeter.plan.options import OptionTable, PoolContext, build_pool_context, option_table
from shardmeter.plan.schema import ObjectiveKind, PlanSpec

IntArray = npt.NDArray[np.int64]
EXHAUSTIVE_LIMIT = 100_000
"""Largest candidate count searched exhaustively; above it, branch and bound."""
BATCH = 50_000
Progress = Callable[[int], None]


@dataclass
class SearchStats:
    mode: str
    candidates_evaluated: int
    seconds: float
    frontier_size: int


@dataclass
class SearchOutput:
    spec: PlanSpec
    contexts: list[PoolContext]
    table: OptionTable
    evaluator: Evaluator
    evaluated: Evaluation
    """Every feasible candidate scored (exhaustive) or the ones branch and bound scored."""
    frontier: Evaluation
    """Pareto frontier, sorted by time ascending (cost descending)."""
    chosen: int
    """Index into ``frontier``."""
    fastest: int
    stats: SearchStats
    notes: list[str] = field(default_factory=list)


def pareto_frontier(ev: Evaluation) -> Evaluation:
    """Feasible candidates not dominated in (time, cost); ties broken by fewer nodes, fewer
    islands, then the candidate's option indices, so the result is deterministic."""
    ok = ev.subset(ev.feasible)
    if len(ok) == 0:
        return ok
    keys = [ok.choice[:, j] for j in range(ok.choice.shape[1] - 1, -1, -1)]
    order = np.lexsort((*keys, ok.islands, ok.nodes, ok.cost_usd, ok.time_s))
    keep, best = [], math.inf
    for i in order:
        if ok.cost_usd[i] < best:
            keep.append(i)
            best = ok.cost_usd[i]
    return ok.subset(np.asarray(keep, dtype=np.int64))


def merge_frontier(a: Evaluation | None, b: Evaluation) -> Evaluation:
    return pareto_frontier(b if a is None or len(a) == 0 else Evaluation.concat([a, b]))


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
        floor = obj.throughput_fraction * frontier.tokens_per_s[0] * (1 - 1e-12)
        ok = np.flatnonzero(frontier.tokens_per_s >= floor)
        return int(ok[-1]), fastest
    if obj.kind is ObjectiveKind.COST_BUDGET:
        assert obj.cost_budget_usd is not None
        ok = np.flatnonzero(frontier.cost_usd <= obj.cost_budget_usd)
        if not len(ok):
            raise InfeasibleError(
                f"no plan costs ≤ ${obj.cost_budget_usd:,.0f}; the cheapest costs "
                f"${frontier.cost_usd[-1]:,.0f} — raise objective.costBudgetUsd",
                "objective.costBudgetUsd",
            )
        return int(ok[0]), fastest
    assert obj.time_budget_hours is not None
    ok = np.flatnonzero(frontier.time_s <= obj.time_budget_hours * 3600)
    if not len(ok):
        raise InfeasibleError(
            f"no plan finishes within {obj.time_budget_hours:g} h; the fastest takes "
            f"{frontier.time_s[0] / 3600:,.1f} h — raise objective.timeBudgetHours",
            "objective.timeBudgetHours",
        )
    return int(ok[-1]), fastest


def _per_pool_choices(contexts: Sequence[PoolContext], table: OptionTable) -> list[IntArray]:
    out = []
    for ctx in contexts:
        idx = np.flatnonzero(table.pool == ctx.index)
        out.append(np.concatenate([[-1], idx]).astype(np.int64))
    return out


def _exhaustive(
    spec: PlanSpec,
    table: OptionTable,
    evaluator: Evaluator,
    choices: list[IntArray],
    progress: Progress | None,
) -> tuple[Evaluation, int]:
    sizes = [len(c) for c in choices]
    total = math.prod(sizes)
    parts, count = [], 0
    for start in range(0, total, BATCH):
        flat = np.arange(start, min(total, start + BATCH), dtype=np.int64)
        idx = np.stack(np.unravel_index(flat, sizes), axis=1)
        choice = np.stack([choices[p][idx[:, p]] for p in range(len(choices))], axis=1)
        choice = choice[admissible(spec, table, choice)]
        if len(choice):
            ev = evaluator.evaluate(choice)
            parts.append(ev.subset(ev.feasible))
            count += len(choice)
        if progress:
            progress(len(flat))
    return (
        Evaluation.concat(parts)
        if parts
        else evaluator.evaluate(np.zeros((0, len(choices)), np.int64))
    ), count


def search(
    spec: PlanSpec,
    coefficients: dict[str, CoefficientsDocument | None] | None = None,
    progress: Progress | None = None,
    force_mode: str | None = None,
) -> SearchOutput:
    """Build options for every usable pool, search, and pick the objective's plan."""
    started = time.perf_counter()
    coefficients = coefficients or {}
    pools = spec.usable_pools()
    contexts = [
        build_pool_context(spec, pool, i, coefficients.get(pool.name))
        for i, pool in enumerate(pools)
    ]
    table = option_table(contexts)
    if not table.options:
        raise InfeasibleError(_no_option_reason(spec, contexts), "pools")
    evaluator = Evaluator(spec, contexts, table)
    choices = _per_pool_choices(contexts, table)
    total = math.prod(len(c) for c in choices)
    mode = force_mode or ("exhaustive" if total <= EXHAUSTIVE_LIMIT else "objective")
    notes: list[str] = []
    if mode == "exhaustive":
        evaluated, count = _exhaustive(spec, table, evaluator, choices, progress)
        frontier = pareto_frontier(evaluated)
    else:
        bb = BranchAndBound(spec, table, evaluator, choices, merge_frontier, progress)
        if mode == "frontier":
            bb.frontier_search()
        elif mode == "objective":
            bb.objective_search(spec)
            notes.append(
                f"{total:,} candidate plans: branch and bound found the objective's exact optimum; "
                "the frontier shown covers only the plans it scored"
            )
        else:
            raise ValueError(f"unknown search mode {mode!r}")
        count = bb.evaluated
        empty = evaluator.evaluate(np.zeros((0, len(choices)), np.int64))
        evaluated = Evaluation.concat(bb.parts) if bb.parts else empty
        frontier = pareto_frontier(evaluated)
    if len(frontier) == 0:
        raise InfeasibleError(_no_plan_reason(spec, contexts, evaluator, choices), "constraints")
    chosen, fastest = select(frontier, spec)
    stats = SearchStats(mode, count, time.perf_counter() - started, len(frontier))
    return SearchOutput(
        spec, contexts, table, evaluator, evaluated, frontier, chosen, fastest, stats, notes
    )


def _no_option_reason(spec: PlanSpec, contexts: Sequence[PoolContext]) -> str:
    """Name the binding constraint when no pool offers a single island."""
    from shardmeter.cost.memory import min_ranks_for_memory

    c = spec.constraints
    parts = []
    for ctx in contexts:
        cm = ctx.cost_model
        need = min_ranks_for_memory(
            spec.model,
            spec.training,
            float(cm.pool.gpu.memory_bytes),
            cm.coefficients.memory,
            1,
            spec.strategy.outer_state_on_gpu and spec.strategy.is_diloco,
        )
        gpu = cm.pool.gpu.name
        if need is None:
            parts.append(f"{spec.model.name} does not fit on any number of {gpu}")
        elif c.max_gpus_per_island is not None and need > c.max_gpus_per_island:
            parts.append(
                f"{spec.model.name} needs ≥ {need} {gpu} per island for memory; "
                f"maxGpusPerIsland is {c.max_gpus_per_island}"
            )
        elif c.max_gpus is not None and need > c.max_gpus:
            parts.append(
                f"{spec.model.name} needs ≥ {need} {gpu} per island for memory; maxGpus is {c.max_gpus}"
            )
        elif need > ctx.pool.total_gpus:
            parts.append(
                f"{spec.model.name} needs ≥ {need} {gpu} per island for memory; pool "
                f"{ctx.pool.name!r} has {ctx.pool.total_gpus}"
            )
        elif ctx.notes:
            parts.append(f"pool {ctx.pool.name!r}: " + "; ".join(ctx.notes[:3]))
        else:
            parts.append(
                f"pool {ctx.pool.name!r}: one micro-step of its smallest island exceeds "
                f"globalBatchTokens {spec.training.global_batch_tokens}"
            )
    return "no island fits: " + "; ".join(parts)


def _no_plan_reason(
    spec: PlanSpec, contexts: Sequence[PoolContext], evaluator: Evaluator, choices: list[IntArray]
) -> str:
    # score single-pool plans to find the most common reason
    reasons: dict[int, int] = {}
    for col, ch in enumerate(choices):
        opts = ch[ch >= 0]
        if not len(opts):
            continue
        choice = np.full((len(opts), len(choices)), -1, dtype=np.int64)
        choice[:, col] = opts
        ev = evaluator.evaluate(choice)
        for code in ev.status[ev.status != OK]:
            reasons[int(code)] = reasons.get(int(code), 0) + 1
    if reasons:
        code = max(reasons, key=lambda k: reasons[k])
        return f"no feasible plan: {REASONS[code]} (constraints.globalBatchTolerance, training.globalBatchTokens, constraints.maxIslands)"
    return "no feasible plan under the constraints"
