"""The search over layouts: a depth-first tree in which every node is a layout and its
children add one option from a pool later in the search order, so every layout is visited
exactly once. Expanding a node scores all its children at once (exact apportioning,
`shardmeter.plan.apportion`, from the node's prefix state) and bounds their descendants
(`shardmeter.plan.bounds`).

Goals (all exact for what they return):

* ``all`` — no pruning: every layout is scored (small instances; the full cloud of Fig. 7);
* ``frontier`` — prunes descendants whose bound a frontier point strictly dominates: the
  exact Pareto frontier;
* ``time`` / ``cost`` — minimise time or cost under optional caps, pruning against the
  incumbent: the objective's exact optimum.

A deadline stops the search early; the lower bound over every subtree not yet explored then
gives the proven gap of the best plan found.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from shardmeter.plan.apportion import (
    empty_weighted,
    equal_extend,
    group_row,
    minmax_convolve,
    weighted_last,
)
from shardmeter.plan.bounds import SuffixTables
from shardmeter.plan.evaluate import Evaluation, Evaluator
from shardmeter.plan.frontier import RELATIVE_TIE, merge_frontier, pareto_frontier
from shardmeter.plan.options import max_islands

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
CHILD_CHUNK = 512


@dataclass
class Goal:
    minimise: str
    """``all``, ``frontier``, ``time`` or ``cost``."""
    time_cap_s: float = math.inf
    cost_cap_usd: float = math.inf


@dataclass
class Progress:
    """Where a search stands (passed to the progress callback)."""

    phase: str
    fraction: float
    """Share of the search tree finished (pruned subtrees count as finished)."""
    scored: int
    elapsed_s: float
    best: float
    """The incumbent (seconds or dollars; inf before the first)."""
    bound: float
    """A proven lower bound on the goal (0 before any)."""


ProgressCallback = Callable[[Progress], None]


@dataclass
class Node:
    pos: int
    """Position (in the search order) of the last used pool; −1 for the empty root."""
    choice: IntArray
    islands: int
    gpus: int
    rate: float
    outer_s: float
    state: FloatArray
    """torchtitan-ft: the per-cell slowest island M; weighted: the prefix table D."""
    floor: float = 0.0
    """weighted: the slowest chosen island's fastest step."""
    min_cells: int = 0
    """The fewest cells the chosen islands process together."""
    spend: float = 0.0
    """Σ islands × fewest cells × efficiency of the chosen options (see `SuffixTables`)."""
    efficiency: float = math.inf
    """The best efficiency among the chosen options."""
    maxsum: IntArray | None = None
    """weighted: the most cells with D ≤ θ on the bound grid."""


@dataclass
class Frame:
    node: Node
    options: IntArray
    time_lb: FloatArray
    cost_lb: FloatArray
    weight: float
    """Share of the whole tree under each child."""
    index: int = 0


@dataclass
class PassStats:
    goal: Goal
    completed: bool
    best: float
    bound: float
    expanded: int = 0


@dataclass
class TreeSearch:
    evaluator: Evaluator
    progress: ProgressCallback | None = None
    deadline: float = math.inf
    """time.monotonic() after which the search stops."""
    keep_all: bool = True
    """Keep every feasible layout scored (for the plots); else only the frontier."""
    parts: list[Evaluation] = field(default_factory=list)
    frontier: Evaluation | None = None
    scored: int = 0
    passes: list[PassStats] = field(default_factory=list)

    def __post_init__(self) -> None:
        ev = self.evaluator
        t = ev.table
        spec = ev.spec
        self.n_pools = ev.n_pools
        self.kmax = max_islands(spec)
        self.gmax = spec.constraints.max_gpus or (1 << 62)
        self.order = list(range(self.n_pools))
        self.groups = [np.flatnonzero(t.pool == p) for p in self.order]
        self.position = np.zeros(len(t.options), dtype=np.int64)
        for j, g in enumerate(self.groups):
            self.position[g] = j
        self.tables = SuffixTables(t, self.order, self.groups, ev.grid, self.kmax, ev.equal)
        self.tables_cap = -1.0
        self.min_rate_after = np.full(self.n_pools + 1, math.inf)
        for j in range(self.n_pools - 1, -1, -1):
            rates = t.usd_per_hour[self.groups[j]]
            here = float(rates.min()) if len(rates) else math.inf
            self.min_rate_after[j] = min(self.min_rate_after[j + 1], here)
        self.goal = Goal("all")
        self.best = self.best_second = math.inf
        self.started = time.monotonic()
        self.done_weight = 0.0
        self.expanded = 0
        self._last_report = 0.0
        self._cells_cache: dict[int, IntArray] = {}
        gpn = ev.outer.gpus_per_node
        self.min_rails = float((t.ranks / gpn[t.pool]).min(initial=1.0))
        """The fewest node networks any island fills (the worst outer all_reduce)."""
        self.grid_top = self.tables.max_step

    # ---- public ---------------------------------------------------------------------------
    def run(self, goal: Goal, phase: str = "") -> PassStats:
        """One pass; returns whether it finished and the proven bound."""
        self.goal = goal
        self.best = self.best_second = math.inf
        for part in self.parts:
            self._update_best(part)
        if self.frontier is not None:
            self._update_best(self.frontier)
        cap = goal.time_cap_s / self.evaluator.steps if math.isfinite(goal.time_cap_s) else math.inf
        if cap != self.tables_cap:
            if self.evaluator.equal:
                self.tables.rates_per_cell(cap)
            else:
                self.tables.rates_per_sum(cap)
            self.tables_cap = cap
        self.done_weight = 0.0
        self.phase = phase or goal.minimise
        if not self.evaluator.equal:
            self._weighted_grid()
        root = self._root()
        stack = [self._expand(root, 1.0)]
        completed = True
        while stack:
            if time.monotonic() > self.deadline:
                completed = False
                break
            frame = stack[-1]
            if frame.index >= len(frame.options):
                stack.pop()
                continue
            i = frame.index
            frame.index += 1
            if self._pruned(frame.time_lb[i : i + 1], frame.cost_lb[i : i + 1])[0]:
                self.done_weight += frame.weight
                continue
            child = self._child(frame.node, int(frame.options[i]))
            stack.append(self._expand(child, frame.weight))
            self._report(stack)
        bound = self.best if completed else min(self.best, self._open_bound(stack))
        stats = PassStats(goal, completed, self.best, bound, self.expanded)
        self.passes.append(stats)
        self._report(stack, force=True, bound=bound)
        return stats

    def _weighted_grid(self) -> None:
        """Fit the bound grid to the pass: up to the inner step a plan may have to matter
        (the time cap, or the incumbent's when minimising time — single-pool layouts are
        scored first for one)."""
        top = self.tables.max_step
        if self.goal.minimise == "time":
            if not math.isfinite(self.best):
                root = self._root()
                for j in range(self.n_pools):
                    opts = self.groups[j]
                    for a in range(0, len(opts), CHILD_CHUNK):
                        self._score_only(root, opts[a : a + CHILD_CHUNK])
            if math.isfinite(self.best):
                top = self.best / self.evaluator.steps
        if math.isfinite(self.tables.cap_s):
            top = min(top, self.tables.cap_s)
        if self.goal.minimise in ("time", "cost") and top != self.grid_top:
            self.tables.set_grid(top)
            self.grid_top = top
        elif self.goal.minimise not in ("time", "cost") and self.grid_top != self.tables.max_step:
            self.tables.set_grid(self.tables.max_step)
            self.grid_top = self.tables.max_step

    def evaluated(self) -> Evaluation:
        return Evaluation.concat(self.parts, self.n_pools)

    # ---- nodes ------------------------------------------------------------------------------
    def _root(self) -> Node:
        hi = self.evaluator.grid.hi
        state = np.zeros(hi + 1) if self.evaluator.equal else empty_weighted(hi)
        node = Node(-1, np.full(self.n_pools, -1, dtype=np.int64), 0, 0, 0.0, 0.0, state)
        if not self.evaluator.equal:
            node.maxsum = np.zeros(len(self.tables.theta), dtype=np.int64)
        return node

    def _child(self, node: Node, o: int) -> Node:
        t = self.evaluator.table
        row = t.steps[t.row[o]]
        k = int(t.islands[o])
        choice = node.choice.copy()
        choice[t.pool[o]] = o
        least = k * int(t.min_cell[t.row[o]])
        spend = node.spend + least * float(self.tables.efficiency[o])
        best = min(node.efficiency, float(self.tables.efficiency[o]))
        if self.evaluator.equal:
            state = np.maximum(node.state, row)
            return Node(
                int(self.position[o]),
                choice,
                node.islands + k,
                node.gpus + int(t.gpus[o]),
                node.rate + float(t.usd_per_hour[o]),
                max(node.outer_s, float(t.outer_step_s[o])),
                state,
                min_cells=node.min_cells + least,
                spend=spend,
                efficiency=best,
            )
        hi = self.evaluator.grid.hi
        d = minmax_convolve(node.state, group_row(row, k, hi))
        child = Node(
            int(self.position[o]),
            choice,
            node.islands + k,
            node.gpus + int(t.gpus[o]),
            node.rate + float(t.usd_per_hour[o]),
            max(node.outer_s, float(t.outer_step_s[o])),
            d,
            max(node.floor, float(self.tables.row_min_step[t.row[o]])),
            node.min_cells + least,
            spend,
            best,
        )
        child.maxsum = self._maxsum(d)
        return child

    def _maxsum(self, d: FloatArray) -> IntArray:
        cells = np.flatnonzero(np.isfinite(d))
        if not len(cells):
            return np.zeros(len(self.tables.theta), dtype=np.int64)
        order = np.argsort(d[cells], kind="stable")
        best = np.maximum.accumulate(cells[order])
        pos = np.searchsorted(d[cells][order], self.tables.theta, side="right") - 1
        return np.asarray(np.where(pos >= 0, best[np.maximum(pos, 0)], 0), dtype=np.int64)

    # ---- expansion --------------------------------------------------------------------------
    def _expand(self, node: Node, weight: float) -> Frame:
        """Score every child of ``node`` and bound their descendants."""
        self.expanded += 1
        t = self.evaluator.table
        if node.pos + 1 < self.n_pools:
            opts = np.concatenate(self.groups[node.pos + 1 :])
        else:
            opts = np.zeros(0, dtype=np.int64)
        opts = opts[
            (t.islands[opts] <= self.kmax - node.islands) & (t.gpus[opts] <= self.gmax - node.gpus)
        ]
        time_lb = np.zeros(len(opts))
        cost_lb = np.zeros(len(opts))
        for a in range(0, len(opts), CHILD_CHUNK):
            sl = slice(a, a + CHILD_CHUNK)
            time_lb[sl], cost_lb[sl] = self._score_children(node, opts[sl])
        # only children that can still grow (a later pool, an island to spare) are expanded
        grows = (self.position[opts] + 1 < self.n_pools) & (
            node.islands + t.islands[opts] < self.kmax
        )
        alive = grows & np.isfinite(time_lb) & ~self._pruned(time_lb, cost_lb)
        share = weight / max(len(opts), 1)
        self.done_weight += share * float((~alive).sum()) + (weight if not len(opts) else 0.0)
        opts, time_lb, cost_lb = opts[alive], time_lb[alive], cost_lb[alive]
        key = cost_lb if self.goal.minimise == "cost" else time_lb
        order = np.argsort(key, kind="stable")
        return Frame(node, opts[order], time_lb[order], cost_lb[order], share)

    def _score_children(self, node: Node, opts: IntArray) -> tuple[FloatArray, FloatArray]:
        self._score_only(node, opts)
        return self._bounds(node, opts)

    def _score_only(self, node: Node, opts: IntArray) -> None:
        """Score the layouts ``node`` + each option (exact apportioning) and record them."""
        ev = self.evaluator
        t = ev.table
        g = ev.grid
        n = len(opts)
        rows = t.row[opts]
        ks = t.islands[opts]
        islands = node.islands + ks
        if ev.equal:
            step_s = equal_extend(node.state, t.steps, rows, islands, g.lo, g.hi)
        elif node.pos < 0:
            step_s = equal_extend(np.zeros(g.hi + 1), t.steps, rows, ks, g.lo, g.hi)
        else:
            step_s = weighted_last(node.state, t.steps, rows, ks, g.lo, g.hi)
        self.scored += n
        meets = np.flatnonzero(np.isfinite(step_s))  # the others cannot meet the batch
        if len(meets):
            choice = np.repeat(node.choice[None, :], len(meets), axis=0)
            choice[np.arange(len(meets)), t.pool[opts[meets]]] = opts[meets]
            self._record(ev.score(choice, step_s[meets]))

    def _record(self, ev: Evaluation) -> None:
        ok = ev.subset(ev.feasible) if not ev.feasible.all() else ev
        if not len(ok):
            return
        if self.keep_all:
            self.parts.append(ok)
        if self.goal.minimise == "frontier" or not self.keep_all:
            # the running frontier prunes (frontier goal) or is all that is kept
            self.frontier = merge_frontier(self.frontier, pareto_frontier(ok), self.n_pools)
        self._update_best(ok)

    def _update_best(self, ev: Evaluation) -> None:
        g = self.goal
        if g.minimise not in ("time", "cost") or not len(ev):
            return
        ok = (ev.time_s <= g.time_cap_s * (1 + RELATIVE_TIE)) & (
            ev.cost_usd <= g.cost_cap_usd * (1 + RELATIVE_TIE)
        )
        first, second = (
            (ev.time_s, ev.cost_usd) if g.minimise == "time" else (ev.cost_usd, ev.time_s)
        )
        if ok.any():
            i = np.flatnonzero(ok)
            j = i[np.lexsort((second[i], first[i]))[0]]
            self.best, self.best_second = min(
                (self.best, self.best_second), (float(first[j]), float(second[j]))
            )

    # ---- bounds -----------------------------------------------------------------------------
    def _bounds(self, node: Node, opts: IntArray) -> tuple[FloatArray, FloatArray]:
        """(time, cost) lower bounds on the descendants of each child ``node`` + option."""
        ev = self.evaluator
        t = ev.table
        n = len(opts)
        if self.goal.minimise == "all":
            return np.zeros(n), np.zeros(n)  # nothing is pruned: no bound needed
        pos = self.position[opts]
        islands = node.islands + t.islands[opts]
        rate = node.rate + t.usd_per_hour[opts]
        outer_s = np.maximum(node.outer_s, t.outer_step_s[opts])
        has_more = (pos + 1 < self.n_pools) & (islands < self.kmax)
        if not has_more.any():
            return np.full(n, math.inf), np.full(n, math.inf)
        if ev.equal:
            t_lb, rate_lb, product_lb = self._equal_bounds(node, opts, pos, islands, rate)
        else:
            t_lb, rate_lb = self._weighted_bounds(node, opts, pos, islands, rate)
            product_lb = rate_lb * t_lb
        t_lb = np.where(has_more, t_lb, math.inf)
        product_lb = np.maximum(product_lb, self._spend_bound(node, opts, pos))
        finite = np.isfinite(t_lb)
        h_ub = ev.outer.sync_every_upper(np.where(finite, t_lb, 1.0), self.kmax, self.min_rails)
        overhead_lb = outer_s / h_ub
        time_lb = np.where(finite, ev.steps * (t_lb + overhead_lb), math.inf)
        # cost = rate × (T + overhead) × steps: rate·T ≥ product_lb, rate ≥ rate_lb
        with np.errstate(invalid="ignore"):
            cost_lb = ev.steps * (product_lb + rate_lb * overhead_lb) / 3600.0
        return time_lb, np.where(finite & np.isfinite(cost_lb), cost_lb, math.inf)

    def _spend_bound(self, node: Node, opts: IntArray, pos: IntArray) -> FloatArray:
        """rate × T ≥ Σ islands × cells × efficiency, with at least lo cells in all: the chosen
        islands at their fewest cells, the rest at the best efficiency still available."""
        t = self.evaluator.table
        tb = self.tables
        least = t.islands[opts] * t.min_cell[t.row[opts]]
        spend = node.spend + least * tb.efficiency[opts]
        cells = node.min_cells + least
        best = np.minimum(
            np.minimum(node.efficiency, tb.efficiency[opts]),
            tb.efficiency_after[np.minimum(pos + 1, len(self.order))],
        )
        rest = np.maximum(self.evaluator.grid.lo - cells, 0)
        return np.asarray(spend + rest * best)

    def _equal_bounds(
        self, node: Node, opts: IntArray, pos: IntArray, islands: IntArray, rate: FloatArray
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Per child: (T, rate, rate·T) lower bounds of its descendants (torchtitan-ft). Only
        the cells some descendant can use are looked at: those whose window
        [⌈lo/K⌉, ⌊hi/K⌋] holds for an island count K above the child's."""
        t = self.evaluator.table
        g = self.evaluator.grid
        tb = self.tables
        n = len(opts)
        t_lb = np.full(n, math.inf)
        rate_lb = np.full(n, math.inf)
        product_lb = np.full(n, math.inf)
        suffix = np.minimum(pos + 1, len(self.order))
        assert tb.rate_table is not None
        for k in np.unique(islands):
            sel = np.flatnonzero(islands == k)
            c = self._cells_after(int(k))
            if not len(c):
                continue
            m = np.clip(-(-g.lo // c) - int(k), 1, self.kmax)
            ok = int(k) + m <= np.minimum(g.hi // c, self.kmax)
            c, m = c[ok], m[ok]
            if not len(c):
                continue
            rows = t.row[opts[sel]]
            merged = np.maximum(node.state[c][None, :], t.steps[rows[:, None], c[None, :]])
            suf = suffix[sel][:, None]
            theta = np.maximum(merged, tb.n_table[suf, c[None, :], m[None, :]])
            theta = np.where(theta <= tb.cap_s * (1 + RELATIVE_TIE), theta, math.inf)
            t_lb[sel] = theta.min(axis=1)
            finite = np.isfinite(theta)
            rate_c = np.where(
                finite, rate[sel][:, None] + tb.rate_table[suf, c[None, :], m[None, :]], math.inf
            )
            rate_lb[sel] = rate_c.min(axis=1)
            product_lb[sel] = np.where(finite, rate_c * theta, math.inf).min(axis=1)
        rate_lb = np.maximum(rate_lb, rate + self.min_rate_after[suffix])
        return t_lb, rate_lb, product_lb

    def _cells_after(self, islands: int) -> IntArray:
        """Cells some layout with more than ``islands`` islands (up to the limit) can use."""
        if islands not in self._cells_cache:
            g = self.evaluator.grid
            cells: set[int] = set()
            for k in range(islands + 1, self.kmax + 1):
                cells.update(range(max(1, -(-g.lo // k)), g.hi // k + 1))
            self._cells_cache[islands] = np.array(sorted(cells), dtype=np.int64)
        return self._cells_cache[islands]

    def _weighted_bounds(
        self, node: Node, opts: IntArray, pos: IntArray, islands: IntArray, rate: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        t = self.evaluator.table
        g = self.evaluator.grid
        tb = self.tables
        assert node.maxsum is not None
        suffix = np.minimum(pos + 1, len(self.order))
        left = np.maximum(self.kmax - islands, 0)
        own = node.maxsum[None, :] + t.islands[opts][:, None] * tb.maxcell[t.row[opts]]
        reach = own + tb.ms_table[suffix[:, None], left[:, None], np.arange(len(tb.theta))[None, :]]
        enough = reach >= g.lo
        first = np.argmax(enough, axis=1)
        least = node.min_cells + t.islands[opts] * t.min_cell[t.row[opts]]
        possible = enough.any(axis=1) & (least < g.hi)
        below = np.where(first > 0, tb.theta[np.maximum(first - 1, 0)], 0.0)
        floor = np.maximum(node.floor, tb.row_min_step[t.row[opts]])
        t_lb = np.where(possible, np.maximum(below, floor), math.inf)
        theta = self._exact_theta()
        if math.isfinite(theta):  # the exact capacity test at the step that matters
            tb.exact_at(theta)
            within = np.flatnonzero(node.state <= theta)
            have = int(within.max()) if len(within) else 0
            fits = (
                have + t.islands[opts] * tb.maxcell_exact[t.row[opts]] + tb.ms_exact[suffix, left]
                >= g.lo
            )
            t_lb = np.where(fits, t_lb, np.maximum(t_lb, tb.theta_next))
        t_lb = np.where(t_lb <= tb.cap_s * (1 + RELATIVE_TIE), t_lb, math.inf)
        # the rate: the cheapest way to add the cells still missing within the cap (the most
        # cells the child itself can process within the cap, exactly)
        within_cap = np.flatnonzero(node.state <= tb.cap_s)
        have_cap = int(within_cap.max()) if len(within_cap) else 0
        reach_cap = have_cap + t.islands[opts] * tb.cap_maxcell[t.row[opts]]
        missing = np.clip(g.lo - reach_cap, 0, g.hi)
        assert tb.rate_table is not None
        extra = tb.rate_table[suffix, left, missing]
        extra = np.maximum(extra, self.min_rate_after[suffix])
        return t_lb, rate + extra

    def _exact_theta(self) -> float:
        """The inner step a subtree must undercut to matter: the time cap's, and when
        minimising time the incumbent's (inner step ≤ time / steps)."""
        theta = self.tables.cap_s
        if self.goal.minimise == "time" and math.isfinite(self.best):
            theta = min(theta, self.best / self.evaluator.steps)
        return theta

    def _pruned(self, time_lb: FloatArray, cost_lb: FloatArray) -> BoolArray:
        g = self.goal
        if g.minimise == "all":
            return np.zeros(len(time_lb), dtype=bool)
        if g.minimise == "frontier":
            f = self.frontier
            if f is None or len(f) == 0:
                return np.zeros(len(time_lb), dtype=bool)
            ft, fc = f.time_s[None, :], f.cost_usd[None, :]
            tl, cl = time_lb[:, None], cost_lb[:, None]
            dom = (ft <= tl) & (fc <= cl) & ((ft < tl) | (fc < cl))
            return np.asarray(dom.any(axis=1) | ~np.isfinite(time_lb))
        slack = 1 + RELATIVE_TIE
        out = (time_lb > g.time_cap_s * slack) | (cost_lb > g.cost_cap_usd * slack)
        # lexicographic incumbent: strictly worse on the goal (beyond float noise), or no
        # better on it and worse on the tie-break (time ties are bit-exact: same formula)
        first, second = (time_lb, cost_lb) if g.minimise == "time" else (cost_lb, time_lb)
        shrink = 1 - RELATIVE_TIE
        worse = (first * shrink > self.best) | (
            (first >= self.best) & (second * shrink > self.best_second)
        )
        return np.asarray(out | worse | ~np.isfinite(time_lb))

    def _open_bound(self, stack: list[Frame]) -> float:
        g = self.goal
        lows = []
        for f in stack:
            rest = f.time_lb[f.index :] if g.minimise != "cost" else f.cost_lb[f.index :]
            if len(rest):
                lows.append(float(rest.min()))
        return min(lows, default=math.inf)

    def _report(self, stack: list[Frame], force: bool = False, bound: float | None = None) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if not force and now - self._last_report < 0.25:
            return
        self._last_report = now
        if bound is None:
            bound = min(self.best, self._open_bound(stack)) if stack else self.best
        self.progress(
            Progress(
                self.phase,
                min(self.done_weight, 1.0),
                self.scored,
                now - self.started,
                self.best,
                bound if math.isfinite(bound) else 0.0,
            )
        )
