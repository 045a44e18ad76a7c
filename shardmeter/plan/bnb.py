"""Branch and bound over pools, for searches too large to enumerate.

Depth-first, one pool per level (its options, or none). Bounds for a partial plan:

* **time** — its inner step T* is at least the slowest chosen island's smallest step, and at
  least the first step time at which the chosen islands plus the most capacity the
  remaining pools could add with the islands left (a knapsack over pools, each pool's best
  option per island count taken at every step time independently — a relaxation) reach the
  global batch. Capacities are tabulated on a geometric grid of step
  times and the bound takes the grid point *below* the crossing, so it stays valid.
  Throughput is B / T_eff ≤ B / T*, hence time ≥ steps × T*;
* **cost** — at step time T the plan must still buy the capacity it lacks, at no better
  than the best capacity per $/h a remaining option offers; minimised over T this gives
  cost ≥ min_T (rate + shortfall(T)/density(T)) × steps × T.

Two modes, both exact for what they return:

* ``frontier`` prunes a partial plan whose bound a frontier point strictly dominates, and
  returns the exact Pareto frontier;
* ``objective`` prunes against the objective only (e.g. for throughput-fraction: first the
  fastest plan, then the cheapest plan within the time that fraction allows) and returns the
  objective's exact optimum; the frontier it reports covers the plans it scored.

The last pool's options are scored in one vectorised batch; the search is seeded with every
single-pool plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardmeter.plan.evaluate import Evaluation, Evaluator
from shardmeter.plan.options import OptionTable
from shardmeter.plan.schema import ObjectiveKind, PlanSpec
from shardmeter.spec.training import StrategyKind

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Progress = Callable[[int], None]
MergeFrontier = Callable[[Evaluation | None, Evaluation], Evaluation]


@dataclass
class Goal:
    """What the objective mode minimises, under which caps."""

    minimise: str  # "time" or "cost"
    time_cap_s: float = math.inf
    cost_cap_usd: float = math.inf


def admissible(spec: PlanSpec, table: OptionTable, choice: IntArray) -> npt.NDArray[np.bool_]:
    """Candidates within the island and GPU limits that use at least one pool."""
    used = choice >= 0
    opt = np.where(used, choice, 0)
    islands = np.where(used, table.islands[opt], 0).sum(axis=1)
    cap = 1 if spec.strategy.kind is StrategyKind.FSDP else spec.constraints.max_islands
    ok = (islands >= 1) & (islands <= cap)
    if spec.constraints.max_gpus is not None:
        ok &= np.where(used, table.gpus[opt], 0).sum(axis=1) <= spec.constraints.max_gpus
    return np.asarray(ok)


class BranchAndBound:
    GRID_POINTS = 2048

    def __init__(
        self,
        spec: PlanSpec,
        table: OptionTable,
        evaluator: Evaluator,
        choices: list[IntArray],
        merge: MergeFrontier,
        progress: Progress | None = None,
    ) -> None:
        self.spec, self.table, self.evaluator, self.progress = spec, table, evaluator, progress
        self.merge = merge
        self.choices = choices
        self.n = len(choices)
        self.max_islands = (
            1 if spec.strategy.kind is StrategyKind.FSDP else spec.constraints.max_islands
        )
        self.max_gpus = spec.constraints.max_gpus or 1 << 62
        self.batch = evaluator.batch
        self.steps = evaluator.total_sequences / evaluator.batch  # time = steps × T_eff
        self.frontier: Evaluation | None = None
        self.parts: list[Evaluation] = []
        self.evaluated = 0
        self.goal: Goal | None = None
        self._pending: list[IntArray] = []
        self._pending_n = 0
        self.best = math.inf
        t = table
        lo, hi = float(t.flat_step_s.min()), float(t.flat_step_s.max())
        self.grid = np.unique(
            np.concatenate([np.geomspace(lo, hi * (1 + 1e-12), self.GRID_POINTS), [lo, hi]])
        )
        g = len(self.grid)
        self.lower_t = np.concatenate([[0.0], self.grid[:-1]])
        seg_cap = np.zeros((len(t.seg_start), g))
        for s in range(len(t.seg_start)):
            a, b = t.seg_start[s], t.seg_start[s] + t.seg_len[s]
            idx = np.searchsorted(t.flat_step_s[a:b], self.grid, side="right") - 1
            seg_cap[s] = np.where(idx >= 0, t.flat_sequences[a:b][np.maximum(idx, 0)], 0)
        self.opt_cap = np.minimum(t.islands[:, None] * seg_cap[t.segment], float(evaluator.limit))
        self._exact_grid = evaluator.grid
        self._exact_g = len(evaluator.grid)
        seg_of_flat = np.repeat(np.arange(len(t.seg_start)), t.seg_len)
        self._exact_keys = seg_of_flat * self._exact_g + np.searchsorted(
            evaluator.grid, t.flat_step_s
        )
        self.min_rate: FloatArray | None = None
        self.max_cap_rest: IntArray | None = None
        self.cap_at_best = np.zeros(len(t.islands), dtype=np.int64)
        self.cap_at_cap = np.zeros(len(t.islands), dtype=np.int64)
        self.opt_min_step = t.flat_step_s[t.seg_start[t.segment]]
        with np.errstate(divide="ignore", invalid="ignore"):
            density = np.where(
                t.usd_per_hour[:, None] > 0, self.opt_cap / t.usd_per_hour[:, None], np.inf
            )
        density = np.where(self.opt_cap > 0, density, 0.0)
        # rest_cap[d, l]: the most capacity pools d… can add with l islands in all — a
        # knapsack over pools (max-plus convolution over island counts) at every grid point;
        # within a pool, the best option of each island count (relaxed across step times)
        kmax = self.max_islands
        self.rest_cap = np.zeros((self.n + 1, kmax + 1, g))
        self.rest_density = np.zeros((self.n + 1, kmax + 1, g))
        for p in range(self.n - 1, -1, -1):
            opts = choices[p][1:]
            best_j = np.zeros((kmax + 1, g))  # best capacity with exactly j islands (≤ j)
            for j in range(1, kmax + 1):
                fit = opts[t.islands[opts] <= j]
                best_j[j] = self.opt_cap[fit].max(axis=0) if len(fit) else 0.0
            for left in range(kmax + 1):
                self.rest_cap[p, left] = np.max(
                    np.stack([best_j[j] + self.rest_cap[p + 1, left - j] for j in range(left + 1)]),
                    axis=0,
                )
                fit = opts[t.islands[opts] <= left]
                dens = density[fit].max(axis=0) if len(fit) else 0.0
                self.rest_density[p, left] = np.maximum(self.rest_density[p + 1, left], dens)

    # ---- driver ---------------------------------------------------------------------------
    def frontier_search(self) -> None:
        self.goal = None
        self._seed()
        self._visit(0, [], 0, 0, 0.0, np.zeros(len(self.grid)), 0.0, 0)
        self._flush()

    def objective_search(self, spec: PlanSpec) -> None:
        """Exact optimum of ``spec.objective`` (two passes for throughput-fraction)."""
        obj = spec.objective
        self._seed()
        if obj.kind is ObjectiveKind.THROUGHPUT_FRACTION:
            self._run(Goal("time"))
            fastest = self.best
            self._run(Goal("cost", time_cap_s=fastest / obj.throughput_fraction * (1 + 1e-12)))
        elif obj.kind is ObjectiveKind.MIN_TIME:
            self._run(Goal("time"))
        elif obj.kind is ObjectiveKind.MIN_COST:
            self._run(Goal("cost"))
        elif obj.kind is ObjectiveKind.COST_BUDGET:
            self._run(Goal("time", cost_cap_usd=float(obj.cost_budget_usd or math.inf)))
        else:
            self._run(Goal("cost", time_cap_s=float(obj.time_budget_hours or math.inf) * 3600))

    def _run(self, goal: Goal) -> None:
        self.goal = goal
        self.best = math.inf
        for part in self.parts:
            self._update_best(part)
        self._prepare_max_cap()
        self._prepare_min_rate(goal.time_cap_s)
        self._visit(0, [], 0, 0, 0.0, np.zeros(len(self.grid)), 0.0, 0)
        self._flush()

    def _capacity_at(self, step_cap_s: float) -> IntArray:
        """Exact sequences each option can do with inner steps ≤ ``step_cap_s``."""
        t = self.table
        rank = np.searchsorted(self._exact_grid, step_cap_s, side="right") - 1
        pos = np.searchsorted(self._exact_keys, t.segment * self._exact_g + rank, side="right") - 1
        ok = (pos >= t.seg_start[t.segment]) & (rank >= 0)
        return np.asarray(
            np.where(ok, t.islands * t.flat_sequences[np.maximum(pos, 0)], 0), dtype=np.int64
        )

    def _prepare_max_cap(self) -> None:
        """When minimising time with incumbent time τ, a completion can only tie or improve
        if its inner step is ≤ τ / steps, so at that step time the chosen islands plus the most
        the remaining pools can add with the islands left (an exact knapsack over pools at
        that one step time) must reach the batch."""
        self.max_cap_rest = None
        if self.goal is None or self.goal.minimise != "time" or math.isinf(self.best):
            return
        self.cap_at_best = self._capacity_at(self.best / self.steps)
        kmax = self.max_islands
        rest = np.zeros((self.n + 1, kmax + 1), dtype=np.int64)
        t = self.table
        for p in range(self.n - 1, -1, -1):
            opts = self.choices[p][1:]
            best_j = np.zeros(kmax + 1, dtype=np.int64)
            for o in opts:
                k = int(t.islands[o])
                if k <= kmax:
                    best_j[k:] = np.maximum(best_j[k:], self.cap_at_best[o])
            for left in range(kmax + 1):
                rest[p, left] = max(best_j[j] + rest[p + 1, left - j] for j in range(left + 1))
        self.max_cap_rest = rest

    def _prepare_min_rate(self, time_cap_s: float) -> None:
        """Under a time cap every plan's inner step is at most T_cap = cap / steps, so the
        sequences each option can contribute are at most its capacity at T_cap. Then
        ``min_rate[d, l, s]`` — the least $/h pools d… need to add s sequences with at most
        l islands — is an exact multiple-choice knapsack at T_cap (by dynamic programming)
        and bounds the cost of completing any partial plan."""
        self.min_rate = None
        if math.isinf(time_cap_s):
            return
        t = self.table
        step_cap = time_cap_s / self.steps
        pos = (
            np.searchsorted(
                self._exact_keys,
                t.segment * self._exact_g
                + np.searchsorted(self._exact_grid, step_cap, side="right")
                - 1,
                side="right",
            )
            - 1
        )
        ok = pos >= t.seg_start[t.segment]
        self.cap_at_cap = np.where(ok, t.islands * t.flat_sequences[np.maximum(pos, 0)], 0).astype(
            np.int64
        )
        b, kmax = self.batch, self.max_islands
        table = np.full((self.n + 1, kmax + 1, b + 1), np.inf)
        table[self.n, :, 0] = 0.0
        s = np.arange(b + 1)
        for p in range(self.n - 1, -1, -1):
            nxt = table[p + 1]
            cur = nxt.copy()
            for o in self.choices[p][1:]:
                k, c, r = int(t.islands[o]), int(self.cap_at_cap[o]), float(t.usd_per_hour[o])
                if c <= 0 or k > kmax:
                    continue
                rest = nxt[: kmax + 1 - k][:, np.maximum(s - c, 0)] + r
                cur[k:] = np.minimum(cur[k:], rest)
            table[p] = cur
        self.min_rate = table

    def _seed(self) -> None:
        for p in range(self.n):
            opts = self.choices[p][1:]
            choice = np.full((len(opts), self.n), -1, dtype=np.int64)
            choice[:, p] = opts
            self._score(choice[admissible(self.spec, self.table, choice)])

    def _update_best(self, ev: Evaluation) -> None:
        g = self.goal
        if g is None or not len(ev):
            return
        ok = (ev.time_s <= g.time_cap_s) & (ev.cost_usd <= g.cost_cap_usd)
        values = ev.time_s if g.minimise == "time" else ev.cost_usd
        if ok.any() and float(values[ok].min()) < self.best:
            self.best = float(values[ok].min())
            self._prepare_max_cap()

    FLUSH = 512
    """Leaves are scored in batches of about this many (vectorised evaluation is cheap per
    plan but has a fixed cost per call); the incumbent updates at every flush."""

    def _queue(self, choice: IntArray) -> None:
        self._pending.append(choice)
        self._pending_n += len(choice)
        if self._pending_n >= self.FLUSH:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            batch = np.concatenate(self._pending)
            self._pending, self._pending_n = [], 0
            self._score(batch)

    def _score(self, choice: IntArray) -> None:
        if not len(choice):
            return
        ev = self.evaluator.evaluate(choice)
        self.evaluated += len(choice)
        if self.progress:
            self.progress(len(choice))
        ok = ev.subset(ev.feasible)
        self.parts.append(ok)
        self.frontier = self.merge(self.frontier, ok)
        self._update_best(ok)

    # ---- bounds and pruning ---------------------------------------------------------------
    def _pruned(self, time_lb: FloatArray, cost_lb: FloatArray) -> npt.NDArray[np.bool_]:
        g = self.goal
        if g is not None:
            out = (time_lb > g.time_cap_s) | (cost_lb > g.cost_cap_usd)
            bound = time_lb if g.minimise == "time" else cost_lb
            return np.asarray(out | (bound > self.best * (1 + 1e-12)))
        f = self.frontier
        if f is None or len(f) == 0:
            return np.zeros(len(time_lb), dtype=bool)
        ft, fc = f.time_s[None, :], f.cost_usd[None, :]
        tl, cl = time_lb[:, None], cost_lb[:, None]
        return np.asarray(((ft <= tl) & (fc <= cl) & ((ft < tl) | (fc < cl))).any(axis=1))

    def _child_bounds(
        self,
        depth: int,
        opts: IntArray,
        islands: int,
        rate: float,
        cap: FloatArray,
        floor: float,
        covered: int = 0,
        prefix: list[int] | None = None,
    ) -> tuple[FloatArray, FloatArray]:
        """(time, cost) lower bounds of the partial plan extended by each of ``opts`` (−1 = none)."""
        t = self.table
        prefix_cap = 0
        if self.max_cap_rest is not None:
            prefix_cap = int(sum(int(self.cap_at_best[o]) for o in prefix or [] if o >= 0))
        real = np.maximum(opts, 0)
        used = opts >= 0
        k = np.where(used, t.islands[real], 0)
        left = np.maximum(self.max_islands - islands - k, 0)
        rest = self.rest_cap[depth + 1]

        def reach(col: IntArray) -> FloatArray:
            own = np.where(used, self.opt_cap[real, col], 0.0)
            return np.asarray(cap[col] + own + rest[left, col])

        g = len(self.grid)
        lo, hi = np.zeros(len(opts), dtype=np.int64), np.full(len(opts), g - 1)
        reachable = (reach(hi) >= self.batch) & (islands + k <= self.max_islands)
        while (active := lo < hi).any():  # capacities grow along the grid: first crossing
            mid = (lo + hi) // 2
            enough = reach(mid) >= self.batch
            hi = np.where(active & enough, mid, hi)
            lo = np.where(active & ~enough, mid + 1, lo)
        first = lo
        below = np.where(first > 0, self.grid[np.maximum(first - 1, 0)], 0.0)
        t_lb = np.maximum(np.maximum(below, floor), np.where(used, self.opt_min_step[real], 0.0))
        if self.max_cap_rest is not None:
            have = prefix_cap + np.where(used, self.cap_at_best[real], 0)
            reachable &= have + self.max_cap_rest[depth + 1][left] >= self.batch
        time_lb = np.where(reachable, self.steps * t_lb, np.inf)
        cost_lb = np.zeros(len(opts))
        if self.min_rate is not None:  # knapsack bound under a time cap (see _prepare_min_rate)
            new_rate = rate + np.where(used, t.usd_per_hour[real], 0.0)
            cov = np.minimum(covered + np.where(used, self.cap_at_cap[real], 0), self.batch)
            extra = self.min_rate[depth + 1][left, self.batch - cov]
            with np.errstate(invalid="ignore"):
                cost_lb = np.where(
                    np.isfinite(extra), (new_rate + extra) * time_lb / 3600.0, np.inf
                )
        g_ = self.goal
        if g_ is not None and g_.minimise == "time" and math.isinf(g_.cost_cap_usd):
            return time_lb, cost_lb  # the cost bound cannot prune: skip its cost
        # only where the time bound alone does not already prune
        live = np.flatnonzero(np.isfinite(time_lb) & ~self._pruned(time_lb, cost_lb))
        knapsack = cost_lb.copy()
        cost_lb[:] = np.inf
        if not len(live):
            return time_lb, cost_lb
        o, u, lf, fi = real[live], used[live], left[live], first[live]
        new_rate = rate + np.where(u, t.usd_per_hour[o], 0.0)
        own = cap[None, :] + np.where(u[:, None], self.opt_cap[o], 0.0)
        shortfall = np.maximum(self.batch - own, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            extra = np.where(shortfall > 0, shortfall / self.rest_density[depth + 1][lf], 0.0)
        lower_t = np.maximum(self.lower_t[None, :], t_lb[live][:, None])
        curve = (new_rate[:, None] + extra) * self.steps * lower_t / 3600.0
        curve = np.where(np.arange(g)[None, :] >= fi[:, None], curve, np.inf)
        cost_lb[live] = np.maximum(curve.min(axis=1), knapsack[live])
        return time_lb, cost_lb

    def _fast_time_mode(self) -> bool:
        """Minimising time with an incumbent and no cost cap: the exact capacity test at the
        incumbent's step time decides pruning, so the grid bound is not needed."""
        g = self.goal
        return (
            g is not None
            and g.minimise == "time"
            and math.isinf(g.cost_cap_usd)
            and self.max_cap_rest is not None
        )

    def _time_floor(
        self, depth: int, opts: IntArray, islands: int, floor: float, prefix: list[int]
    ) -> FloatArray:
        """Time lower bound from the slowest chosen island's smallest step; ∞ where the
        exact capacity test at the incumbent's step time (see `_prepare_max_cap`) fails."""
        assert self.max_cap_rest is not None
        t = self.table
        real = np.maximum(opts, 0)
        used = opts >= 0
        k = np.where(used, t.islands[real], 0)
        left = self.max_islands - islands - k
        ok = left >= 0
        have = sum(int(self.cap_at_best[o]) for o in prefix if o >= 0) + np.where(
            used, self.cap_at_best[real], 0
        )
        ok &= have + self.max_cap_rest[depth + 1][np.maximum(left, 0)] >= self.batch
        t_lb = np.maximum(floor, np.where(used, self.opt_min_step[real], 0.0))
        return np.where(ok, self.steps * t_lb, np.inf)

    def _visit(
        self,
        depth: int,
        prefix: list[int],
        islands: int,
        gpus: int,
        rate: float,
        cap: FloatArray,
        floor: float,
        covered: int,
    ) -> None:
        t = self.table
        opts = self.choices[depth]
        real = np.maximum(opts, 0)
        fits = np.where(
            opts >= 0,
            (t.islands[real] <= self.max_islands - islands)
            & (t.gpus[real] <= self.max_gpus - gpus),
            True,
        )
        opts = opts[fits]
        if self._fast_time_mode():
            time_lb = self._time_floor(depth, opts, islands, floor, prefix)
            cost_lb = np.zeros(len(opts))
        else:
            time_lb, cost_lb = self._child_bounds(
                depth, opts, islands, rate, cap, floor, covered, prefix
            )
        alive = np.isfinite(time_lb) & ~self._pruned(time_lb, cost_lb)
        opts, time_lb, cost_lb = opts[alive], time_lb[alive], cost_lb[alive]
        if depth == self.n - 1:
            used_before = sum(1 for o in prefix if o >= 0)
            # single-pool plans were scored while seeding
            keep = ((opts >= 0) & (used_before >= 1)) | ((opts < 0) & (used_before >= 2))
            last = opts[keep]
            choice = np.empty((len(last), self.n), dtype=np.int64)
            choice[:, :-1] = np.asarray(prefix, dtype=np.int64)
            choice[:, -1] = last
            self._queue(choice)
            return
        # most promising child first, by the bound the goal minimises
        key = cost_lb if self.goal is not None and self.goal.minimise == "cost" else time_lb
        for i in np.argsort(key, kind="stable"):
            o = int(opts[i])
            if self._fast_time_mode():  # the incumbent may have improved meanwhile
                again = self._time_floor(depth, np.array([o]), islands, floor, prefix)
                if not np.isfinite(again[0]) or self._pruned(again, np.zeros(1))[0]:
                    continue
            elif self._pruned(np.array([time_lb[i]]), np.array([cost_lb[i]]))[0]:
                continue  # the incumbent or the frontier improved meanwhile
            if o < 0:
                self._visit(depth + 1, [*prefix, -1], islands, gpus, rate, cap, floor, covered)
            else:
                gained = int(self.cap_at_cap[o]) if self.min_rate is not None else 0
                self._visit(
                    depth + 1,
                    [*prefix, o],
                    islands + int(t.islands[o]),
                    gpus + int(t.gpus[o]),
                    rate + float(t.usd_per_hour[o]),
                    cap + self.opt_cap[o],
                    max(floor, float(self.opt_min_step[o])),
                    covered + gained,
                )
