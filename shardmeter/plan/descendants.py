"""Lower bounds on everything below a node of the search tree (`shardmeter.plan.bnb`): the
layouts that extend it with options of later pools. Each bound holds for all of them, so
pruning never loses a plan; the tables over later pools come from `shardmeter.plan.bounds`.

* **inner step** — equal batches: per cell, the chosen islands' slowest step and the least
  step at which later pools field the islands still needed (exact per cell); weighted: the
  most cells the chosen islands and later pools can process within θ (on the grid, plus an
  exact test at the step that matters), and every chosen island's fastest step;
* **outer level** — the largest chosen outer optimizer step over the largest ``syncEvery``
  the rule can pick for such an inner step on the worst outer link;
* **cost** — rate × T per cell (equal batches) or rate × the inner-step bound, the rate at
  least the chosen one plus the cheapest way to supply what is missing; and
  rate × T ≥ Σ islands × cells × best dollars per cell (efficiency).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardmeter.plan.bounds import SuffixTables
from shardmeter.plan.evaluate import Evaluator
from shardmeter.plan.frontier import RELATIVE_TIE

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


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


class DescendantBounds:
    """Bounds for one search order (``groups``: the options of each pool in order)."""

    def __init__(
        self,
        evaluator: Evaluator,
        tables: SuffixTables,
        groups: Sequence[IntArray],
        max_islands: int,
    ) -> None:
        self.evaluator = evaluator
        self.tables = tables
        t = evaluator.table
        self.n_pools = len(groups)
        self.order = list(range(self.n_pools))
        self.kmax = max_islands
        self.position = np.zeros(len(t.options), dtype=np.int64)
        for j, g in enumerate(groups):
            self.position[g] = j
        self.min_rate_after = np.full(self.n_pools + 1, math.inf)
        """The cheapest option of the pools from each position on."""
        for j in range(self.n_pools - 1, -1, -1):
            rates = t.usd_per_hour[groups[j]]
            here = float(rates.min()) if len(rates) else math.inf
            self.min_rate_after[j] = min(self.min_rate_after[j + 1], here)
        gpn = evaluator.outer.gpus_per_node
        self.min_rails = float((t.ranks / gpn[t.pool]).min(initial=1.0))
        """The fewest node networks any island fills (the worst outer all_reduce)."""
        self._cells_cache: dict[int, IntArray] = {}

    def bounds(self, node: Node, opts: IntArray, theta: float) -> tuple[FloatArray, FloatArray]:
        """(time, cost) lower bounds on the descendants of each child ``node`` + option;
        ``theta``: the inner step a descendant must undercut to matter (weighted runtime's
        exact capacity test), inf for none."""
        ev = self.evaluator
        t = ev.table
        n = len(opts)
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
            t_lb, rate_lb = self._weighted_bounds(node, opts, pos, islands, rate, theta)
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
        self,
        node: Node,
        opts: IntArray,
        pos: IntArray,
        islands: IntArray,
        rate: FloatArray,
        theta: float,
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
