"""Build the search space, search it, keep the cost/runtime Pareto frontier and pick the
objective's plan.

Small searches (the paper's case study) score every layout: the exact frontier and the full
cloud of plans. Large ones run branch and bound (`shardmeter.plan.bnb`) for the objective's
exact optimum — for ``throughput-fraction`` first the fastest plan, then the cheapest plan
within the allowed slowdown. ``time_limit_s`` stops the search early with the best plan found
and the proven gap to the optimum.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.errors import InfeasibleError
from shardmeter.plan.bnb import (
    Enumeration,
    Goal,
    PassStats,
    ProgressCallback,
    TreeSearch,
    space_digest,
)
from shardmeter.plan.configs import (
    MAX_CELLS,
    MICRO_BATCH_BUDGET,
    SAMPLED_MICRO_BATCHES,
    BatchGrid,
)
from shardmeter.plan.evaluate import Evaluation, Evaluator, IntArray
from shardmeter.plan.frontier import pareto_frontier, select
from shardmeter.plan.groups import IslandGroup, plan_label
from shardmeter.plan.infeasible import no_option_reason, no_plan_reason
from shardmeter.plan.options import (
    OptionTable,
    PoolBuilder,
    PoolContext,
    ShapeCache,
    SpaceStore,
    max_islands,
    option_table,
    pool_options,
)
from shardmeter.plan.schema import ObjectiveKind, PlanSpec
from shardmeter.sim.settings import settings_problem

EXHAUSTIVE_LIMIT = 200_000
"""Searches with at most this many layouts (an upper estimate) score every one."""


@dataclass
class SearchStats:
    mode: str
    """``exhaustive``, ``frontier`` or ``objective``."""
    candidates_evaluated: int
    seconds: float
    frontier_size: int
    proven: bool
    """The returned plan is the objective's proven optimum (over the search space)."""
    gap: float | None
    """When not proven: (value − proven lower bound) / value of the objective's figure."""
    passes: list[PassStats] = field(default_factory=list)
    layouts_estimate: int = 0
    shapes_left: int = 0
    """Candidate island shapes the time limit left unsimulated (their layouts unsearched:
    then ``proven`` is False and ``gap`` None)."""


@dataclass
class SearchOutput:
    spec: PlanSpec
    contexts: list[PoolContext]
    table: OptionTable
    evaluator: Evaluator
    evaluated: Evaluation
    """Every feasible layout scored (all of them when exhaustive)."""
    frontier: Evaluation
    """Pareto frontier, sorted by time ascending (cost descending)."""
    chosen: int
    """Index into ``evaluated`` (on the frontier for the time/cost objectives; min-energy and
    min-co2 may choose a plan off it)."""
    fastest: int
    """Index into ``evaluated``."""
    stats: SearchStats
    notes: list[str] = field(default_factory=list)

    @property
    def grid(self) -> BatchGrid:
        return self.evaluator.grid


def layouts_estimate(spec: PlanSpec, table: OptionTable, n_pools: int) -> int:
    """An upper estimate of the layouts: the product over pools of (options + 1)."""
    total = 1
    for p in range(n_pools):
        total *= int((table.pool == p).sum()) + 1
        if total > 10**15:
            break
    return total


@dataclass
class SpaceBuild:
    """The search space: what the search runs over."""

    grid: BatchGrid
    contexts: list[PoolContext]
    table: OptionTable
    shapes_left: int = 0
    """Candidate island shapes a deadline left untried (0: the whole space was built)."""
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return self.shapes_left == 0


class SpaceBuilder:
    """Builds the search space, resumably: `grow` builds shapes until a deadline (the pools
    take turns, one shape each, in their order of promise: `PoolBuilder`), `space` is what
    was built so far, and a later `grow` goes on from there. Each pool builds at least up to
    its first shape that runs, past the deadline if need be (a few shapes)."""

    def __init__(
        self,
        spec: PlanSpec,
        coefficients: dict[str, CoefficientsDocument | None],
        store: SpaceStore | None = None,
    ) -> None:
        self.spec = spec
        self.grid = BatchGrid.of(spec)
        pools = spec.usable_pools()
        if not pools:
            raise InfeasibleError(
                "no pool is allowed: constraints.allowedPools is empty — name at least one of "
                + ", ".join(p.name for p in spec.pools),
                "constraints.allowedPools",
            )
        problem = settings_problem(spec.strategy, spec.model.num_layers)
        if problem is not None:  # no island or link makes these settings legal
            raise InfeasibleError(f"no feasible plan: {problem}", problem.field)
        cache = ShapeCache(spec, self.grid, store)
        self.builders = [
            PoolBuilder(spec, pool, i, coefficients.get(pool.name), cache)
            for i, pool in enumerate(pools)
        ]
        self.seconds = 0.0

    @property
    def shapes_left(self) -> int:
        return sum(b.shapes_left for b in self.builders)

    def grow(self, deadline: float = math.inf) -> None:
        started = time.perf_counter()
        active = [b for b in self.builders if not b.done]
        while active:
            for b in active:
                if b.first_built and time.monotonic() > deadline:
                    continue
                b.step()
            active = [b for b in active if not b.done]
            if time.monotonic() > deadline:
                active = [b for b in active if not b.first_built]
        self.seconds += time.perf_counter() - started

    def space(self) -> SpaceBuild:
        spec, grid = self.spec, self.grid
        contexts = [b.context() for b in self.builders]
        shapes_left = self.shapes_left
        options = [o for ctx in contexts for o in pool_options(spec, ctx, grid)]
        table = option_table(contexts, options)
        if not options:
            if shapes_left:
                raise InfeasibleError(
                    f"no island shape built within the time limit ({shapes_left:,} not "
                    "tried); raise --time-limit",
                    "time limit",
                )
            raise InfeasibleError(no_option_reason(spec, contexts, grid), "pools")
        return SpaceBuild(grid, contexts, table, shapes_left, self.seconds)


def build_space(
    spec: PlanSpec,
    coefficients: dict[str, CoefficientsDocument | None],
    store: SpaceStore | None = None,
    deadline: float = math.inf,
) -> SpaceBuild:
    """Every pool's island shapes and options (`SpaceBuilder`, built until ``deadline``,
    time.monotonic(); ``shapes_left`` says how much was not). ``store`` keeps shape tables
    across requests."""
    builder = SpaceBuilder(spec, coefficients, store)
    builder.grow(deadline)
    return builder.space()


BUILD_SHARE = 0.5
"""Of a time limit, the share building the search space may take at most (the search over
what was built, and the report, take the rest)."""


def _passes(tree: TreeSearch, spec: PlanSpec) -> tuple[bool, float | None]:
    """Run the objective's passes; (proven, gap). (A CO₂ budget makes the layouts above it
    infeasible as they are scored: `Evaluator.score`.)"""
    obj = spec.objective
    kind = obj.kind
    if kind is ObjectiveKind.THROUGHPUT_FRACTION:
        first = tree.run(Goal("time"), "fastest plan")
        if not first.completed:
            return False, _gap(first)
        cap = first.best / obj.throughput_fraction
        second = tree.run(Goal("cost", time_cap_s=cap), "cheapest within the throughput fraction")
        return second.completed, None if second.completed else _gap(second)
    if kind is ObjectiveKind.MIN_TIME:
        p = tree.run(Goal("time"), "fastest plan")
        return p.completed, None if p.completed else _gap(p)
    if kind is ObjectiveKind.MIN_COST:
        p = tree.run(Goal("cost"), "cheapest plan")
    elif kind is ObjectiveKind.MIN_ENERGY:
        p = tree.run(Goal("energy"), "least energy")
    elif kind is ObjectiveKind.MIN_CO2:
        p = tree.run(Goal("co2"), "least CO₂e")
    elif kind is ObjectiveKind.COST_BUDGET:
        p = tree.run(
            Goal("time", cost_cap_usd=float(obj.cost_budget_usd or math.inf)),
            "fastest within budget",
        )
    else:
        p = tree.run(
            Goal("cost", time_cap_s=float(obj.time_budget_hours or math.inf) * 3600),
            "cheapest within the time budget",
        )
    # The report compares the chosen plan with the fastest, and a budget nothing meets is
    # refused naming the fastest (time) or the cheapest (cost) plan: the objective's pass
    # prunes by its own figure and caps, so it need not have scored either; these passes
    # prove them (cheap: the incumbents from the passes before prune most of the tree).
    if kind is ObjectiveKind.COST_BUDGET and p.completed and not math.isfinite(p.best):
        tree.run(Goal("cost"), "cheapest plan (none within the cost budget)")
    tree.run(Goal("time"), "fastest plan (for the comparison)")
    return p.completed, None if p.completed else _gap(p)


def _every_layout(tree: TreeSearch, store: SpaceStore | None) -> PassStats:
    """The ``all`` pass; with a store, a space enumerated before (the same options, step
    tables and caps: `space_digest`) is scored from its `Enumeration` instead of walked."""
    if store is None:
        return tree.run(Goal("all"), "every layout")
    key = ("layouts", space_digest(tree))
    found, e = store.get(key)
    if found and isinstance(e, Enumeration):
        return tree.replay(e, "every layout")
    tree.recording = []
    p = tree.run(Goal("all"), "every layout")
    e = tree.enumeration()
    tree.recording = None
    store.put(key, e, e.weight)
    return p


def _gap(p: PassStats) -> float | None:
    if not math.isfinite(p.best) or p.best <= 0:
        return None
    return max(0.0, (p.best - p.bound) / p.best)


def search(
    spec: PlanSpec,
    coefficients: dict[str, CoefficientsDocument | None] | None = None,
    progress: ProgressCallback | None = None,
    force_mode: str | None = None,
    time_limit_s: float | None = None,
    store: SpaceStore | None = None,
) -> SearchOutput:
    """Build the search space, search it (see the module docstring), pick the plan.
    ``store`` keeps shape tables across calls (`SpaceStore`; the results are the same).

    With ``time_limit_s`` the build gets `BUILD_SHARE` of it, then the search runs over what
    was built. A search that finishes early over a partial space lets the build go on (again
    for that share of the time left) and searches the larger space, while the time left is
    ample for it (`ROUND_MARGIN`); a round whose search the deadline cuts is kept only when
    no earlier round finished its search."""
    started = time.perf_counter()
    now = time.monotonic()
    builder = SpaceBuilder(spec, coefficients or {}, store)
    if time_limit_s is None:
        builder.grow()
        space = builder.space()
        return _search_space(spec, space, progress, force_mode, None, math.inf, store, started)
    deadline = now + time_limit_s
    build_until = now + BUILD_SHARE * time_limit_s
    finished: SearchOutput | None = None
    while True:
        builder.grow(build_until)
        space = builder.space()
        began = time.monotonic()
        try:
            out = _search_space(
                spec, space, progress, force_mode, time_limit_s, deadline, store, started
            )
        except NothingFoundYetError:
            left = deadline - time.monotonic()
            if finished is not None:
                finished.stats.seconds = time.perf_counter() - started
                return finished
            if left <= 0:
                raise
            build_until = time.monotonic() + BUILD_SHARE * left
            continue
        searched_s = time.monotonic() - began
        if not all(p.completed for p in out.stats.passes):
            if finished is None:
                return out
            finished.stats.seconds = time.perf_counter() - started
            return finished
        left = deadline - time.monotonic()
        if space.complete or left < ROUND_MARGIN * searched_s:
            return out
        finished = out
        build_until = time.monotonic() + BUILD_SHARE * left


class NothingFoundYetError(InfeasibleError):
    """No plan over the part of the space built so far (the rest may hold some)."""


ROUND_MARGIN = 4.0
"""Another round of building and searching starts only while the time left is at least this
many times what the last round's search took (the next space is larger)."""


def _search_space(
    spec: PlanSpec,
    space: SpaceBuild,
    progress: ProgressCallback | None,
    force_mode: str | None,
    time_limit_s: float | None,
    deadline: float,
    store: SpaceStore | None,
    started: float,
) -> SearchOutput:
    """Search ``space`` until ``deadline`` (time.monotonic(); the request's ``time_limit_s``
    ends then) and pick the plan."""
    grid, contexts, table = space.grid, space.contexts, space.table
    evaluator = Evaluator(spec, contexts, table, grid)
    estimate = layouts_estimate(spec, table, len(contexts))
    mode = force_mode or ("exhaustive" if estimate <= EXHAUSTIVE_LIMIT else "objective")
    tree = TreeSearch(evaluator, progress, deadline, keep_all=True)
    notes: list[str] = []
    proven, gap = True, None
    if mode == "exhaustive" and time_limit_s is not None:
        # a time limit promises the best plan and its proven gap: the objective's branch and
        # bound first (it proves a bound), then, in the time left, every layout for the plots
        proven, gap = _passes(tree, spec)
        full = TreeSearch(evaluator, progress, deadline, keep_all=True)
        if full.run(Goal("all"), "every layout").completed:
            tree, proven, gap = full, True, None
        else:
            mode = "objective"
            notes.append(
                f"about {estimate:,} layouts: the time limit stopped scoring them all; the "
                "frontier shown covers only the plans branch and bound scored"
            )
    elif mode == "exhaustive":
        p = _every_layout(tree, store)
        proven, gap = p.completed, None
    elif mode == "frontier":
        p = tree.run(Goal("frontier"), "Pareto frontier")
        proven = p.completed
    elif mode == "objective":
        proven, gap = _passes(tree, spec)
        notes.append(
            f"about {estimate:,} layouts: branch and bound "
            + ("proved the objective's optimum" if proven else "stopped at the time limit")
            + "; the frontier shown covers only the plans it scored"
        )
    else:
        raise ValueError(f"unknown search mode {force_mode!r}")
    evaluated = tree.evaluated()
    frontier = pareto_frontier(evaluated) if len(evaluated) else Evaluation.empty(len(contexts))
    if len(frontier) == 0 and not space.complete:
        # the shapes not built may hold plans (within any budget): none found yet
        raise NothingFoundYetError(
            f"no feasible plan found within the time limit of {time_limit_s:g} s "
            f"({space.shapes_left:,} candidate island shapes not simulated); raise --time-limit",
            "time limit",
        )
    if len(frontier) == 0:
        budget = spec.objective.co2_budget_kg
        least = evaluator.least_co2_over_budget_kg
        if budget is not None and least < math.inf:
            raise InfeasibleError(
                f"no plan emits ≤ {budget:,.0f} kg CO₂e; the least-emitting plan scored emits "
                f"{least:,.0f} kg — raise objective.co2BudgetKg or use pools on a cleaner grid "
                "(gridCarbonIntensityGPerKwh)",
                "objective.co2BudgetKg",
            )
        if not proven:
            raise InfeasibleError(
                f"no feasible plan found within the time limit of {time_limit_s:g} s; "
                "raise --time-limit",
                "time limit",
            )
        raise InfeasibleError(no_plan_reason(spec, contexts, table, evaluator), "constraints")
    chosen, fastest = select(
        evaluated, spec, lambda i: layout_label(contexts, table, evaluated.choice[i])
    )
    if not space.complete:
        # the layouts of untried shapes were never bounded: no gap is proven over them
        built_gap = gap
        proven, gap = False, None
        notes.append(
            f"time limit reached while building the search space: {space.shapes_left:,} "
            "candidate island shapes were not simulated and their layouts not searched; the "
            "plan shown is the best over the shapes built"
            + (
                " (the optimum over those)"
                if built_gap is None and tree.passes and tree.passes[-1].completed
                else f", within {built_gap:.2%} of the bound proven over those"
                if built_gap is not None
                else ""
            )
            + ", with no gap proven over the rest"
        )
    elif not proven:
        notes.append(
            "time limit reached: the plan shown is the best found"
            + (f", within {gap:.2%} of the proven bound" if gap is not None else "")
        )
    notes += _exactness_notes(grid, contexts)
    notes += _guard_rail_notes(spec)
    notes += _default_budget_notes(spec)
    stats = SearchStats(
        mode,
        tree.scored,
        time.perf_counter() - started,
        len(frontier),
        proven,
        gap,
        list(tree.passes),
        estimate,
        space.shapes_left,
    )
    return SearchOutput(
        spec, contexts, table, evaluator, evaluated, frontier, chosen, fastest, stats, notes
    )


def layout_label(contexts: list[PoolContext], table: OptionTable, choice: IntArray) -> str:
    """A layout (one row of an `Evaluation`'s ``choice``) in the paper's notation."""
    groups = []
    for o in choice[choice >= 0]:
        opt = table.options[int(o)]
        ctx = contexts[opt.pool]
        shape = ctx.shapes[opt.shape].shape
        groups.append(
            IslandGroup(
                ctx.pool.name,
                opt.islands,
                shape.nodes,
                shape.gpus_per_node,
                0,
                0,
                gpu=ctx.pool.gpu.name,
            )
        )
    return plan_label(groups)


def _guard_rail_notes(spec: PlanSpec) -> list[str]:
    """Guard-rails that narrowed the search itself (the settings' and the quality's own are
    in the plan's reason and its quality warnings)."""
    strat, c = spec.strategy, spec.constraints
    if strat.is_diloco and max_islands(spec) < c.max_islands:
        return [
            f"at most {max_islands(spec)} islands, not constraints.maxIslands {c.max_islands}: "
            "strategy.beyondMeasuredIslands is cap and no published DiLoCo run trained more "
            f"than strategy.maxMeasuredIslands ({strat.max_measured_islands}) replicas"
        ]
    return []


def _default_budget_notes(spec: PlanSpec) -> list[str]:
    """The token budget sets every plan's hours, cost, energy and DiLoCo's quality price; a
    plan file that leaves it out is planned for the default, and says so."""
    if "total_tokens" in spec.training.model_fields_set:
        return []
    return [
        f"training.totalTokens not given: hours, cost, energy and the quality price are for "
        f"the default {spec.training.total_tokens:,} tokens — set it to the run's budget"
    ]


def _exactness_notes(grid: BatchGrid, contexts: list[PoolContext]) -> list[str]:
    notes = []
    if not grid.exact:
        notes.append(
            f"the global batch limit of {grid.limit:,} sequences exceeds {MAX_CELLS:,}: islands "
            f"process multiples of {grid.quantum} sequences (the search is exact over that grid)"
        )
    sampled = sorted({str(t.shape) for c in contexts for t in c.shapes if t.sampled})
    if sampled:
        notes.append(
            f"more than {MICRO_BATCH_BUDGET} micro-batch candidates for shapes "
            + ", ".join(sampled[:4])
            + ("…" if len(sampled) > 4 else "")
            + f": {SAMPLED_MICRO_BATCHES} micro-batches were tried (all small ones, then "
            "geometrically spaced)"
        )
    return notes


__all__ = [
    "EXHAUSTIVE_LIMIT",
    "SearchOutput",
    "SearchStats",
    "SpaceBuild",
    "SpaceStore",
    "build_space",
    "max_islands",
    "search",
]
