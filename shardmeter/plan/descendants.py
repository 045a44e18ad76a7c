"""Lower bounds on everything below a node of the search tree (`shardmeter.plan.bnb`): the
layouts that extend it with options of later pools. Each bound holds for all of them, so
pruning never loses a plan; the tables over later pools come from `shardmeter.plan.bounds`.

* **inner step** — equal batches: per cell, the chosen islands' slowest step and the least
  step at which later pools field the islands still needed (exact per cell); weighted: the
  most cells the chosen islands and later pools can process within θ (on the grid, plus an
  exact test at the step that matters), and every chosen island's fastest step;
* **outer level** — the largest chosen outer optimizer steps (each option's least over
  fragment counts) over the largest ``syncEvery`` the rule can pick for such an inner step
  on the worst outer link;
* **cost** — rate × T per cell (equal batches) or rate × the inner-step bound, the rate at
  least the chosen one plus the cheapest way to supply what is missing; and
  rate × T ≥ Σ islands × cells × best dollars per cell (efficiency); WAN egress ≥ 0;
* **energy, CO₂e** — (the chosen options' power or CO₂ rate + the least of any later pool's
  option) × the time bound;
* **ranked figures** — each × the least equivalent-token factor of any layout with more
  islands than the child (`shardmeter.plan.footprint.QualityTable.least_factor`) when the
  objective is quality-adjusted.
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
    """The largest of the chosen options' least outer optimizer steps over fragment counts
    (`OptionTable.outer_step_least_s`): at most any descendant's, whatever its settings."""
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
    watts: float = 0.0
    """Facility power of the chosen options."""
    co2_rate: float = 0.0
    """kg CO₂e per hour of the chosen options."""


BOUNDS = ("time", "cost", "energy", "co2")
"""The columns of `DescendantBounds.bounds`: ranked lower bounds on these figures."""
TIME, COST, ENERGY, CO2 = range(4)


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
        self.min_rate_after = self._least_after(t.usd_per_hour, groups)
        """The cheapest option of the pools from each position on."""
        self.min_watts_after = self._least_after(t.facility_watts, groups)
        self.min_co2_rate_after = self._least_after(t.co2_kg_per_hour, groups)
        self.min_rails = evaluator.min_rails
        self._cells_cache: dict[int, IntArray] = {}

    def _least_after(self, values: FloatArray, groups: Sequence[IntArray]) -> FloatArray:
        """Per position: the least of ``values`` over the options of the pools from it on."""
        out = np.full(self.n_pools + 1, math.inf)
        for j in range(self.n_pools - 1, -1, -1):
            here = values[groups[j]]
            out[j] = min(out[j + 1], float(here.min()) if len(here) else math.inf)
        return out

    def bounds(self, node: Node, opts: IntArray, ranked_s: float) -> FloatArray:
        """(children × 4) ranked lower bounds on (time, cost, energy, CO₂e) of the
        descendants of each child ``node`` + option (`BOUNDS`); ``ranked_s``: the ranked time
        a descendant must not exceed to matter (its inner step then undercuts
        `Evaluator.step_that_matters`: weighted runtime's exact capacity test), inf for
        none."""
        ev = self.evaluator
        t = ev.table
        n = len(opts)
        theta = min(self.tables.cap_s, ev.step_that_matters(ranked_s))
        pos = self.position[opts]
        islands = node.islands + t.islands[opts]
        rate = node.rate + t.usd_per_hour[opts]
        outer_s = np.maximum(node.outer_s, t.outer_step_least_s[opts])
        has_more = (pos + 1 < self.n_pools) & (islands < self.kmax)
        if not has_more.any():
            return np.full((n, len(BOUNDS)), math.inf)
        dead = np.zeros(n, dtype=bool)
        if ev.equal:
            t_lb, rate_lb, product_lb, t_f, product_f = self._equal_bounds(
                node, opts, pos, islands, rate
            )
        else:
            t_lb, rate_lb, t_f, f_theta, rate_f = self._weighted_bounds(
                node, opts, pos, islands, rate, theta, ranked_s
            )
        # the least factor of any descendant: it has more islands than the child and an inner
        # step of at least t_lb
        f_min = ev.quality.least_factor(islands + 1, t_lb) if ev.quality_adjusted else np.ones(n)
        if not ev.equal:
            # for the descendants that can matter; none can where f_theta is inf
            dead = ~np.isfinite(f_theta)
            f_min = np.where(dead, f_min, np.maximum(f_min, f_theta))
            t_f = np.maximum(t_f, t_lb * f_min)
            product_lb = rate_lb * t_lb
            product_f = rate_lb * t_f
            if ev.quality_adjusted:
                with np.errstate(invalid="ignore"):  # inf × 0 where nothing is reachable
                    coupled = np.where(np.isfinite(t_lb), rate_f * t_lb, math.inf)
                product_f = np.maximum(product_f, np.where(np.isnan(coupled), math.inf, coupled))
        t_lb = np.where(has_more, t_lb, math.inf)
        t_f = np.where(has_more, t_f, math.inf)
        spend = self._spend_bound(node, opts, pos)
        product_lb = np.maximum(product_lb, spend)
        product_f = np.maximum(product_f, spend * f_min)
        finite = np.isfinite(t_lb)
        h_ub = ev.outer.sync_every_upper(np.where(finite, t_lb, 1.0), self.kmax, self.min_rails)
        overhead_lb = outer_s / h_ub
        time_lb = np.where(finite, ev.steps * (t_lb + overhead_lb), math.inf)
        # ranked: steps × (T + overhead) × f ≥ steps × (min over cells of T·f + overhead·f_min)
        time_rank = np.where(finite, ev.steps * (t_f + overhead_lb * f_min), math.inf)
        # cost = rate × (T + overhead) × steps × f: rate·T·f ≥ product_f, rate ≥ rate_lb
        with np.errstate(invalid="ignore"):
            cost_lb = ev.steps * (product_f + rate_lb * overhead_lb * f_min) / 3600.0
        cost_lb = np.where(finite & np.isfinite(cost_lb), cost_lb, math.inf)
        suffix = np.minimum(pos + 1, self.n_pools)
        watts = node.watts + t.facility_watts[opts] + self.min_watts_after[suffix]
        co2_rate = node.co2_rate + t.co2_kg_per_hour[opts] + self.min_co2_rate_after[suffix]
        hours = np.where(finite, time_lb, 0.0) / 3600.0 * f_min
        with np.errstate(invalid="ignore"):  # no later option (inf) × no time (0)
            energy_lb = np.where(finite, watts * hours / 1000.0, math.inf)
            co2_lb = np.where(finite, co2_rate * hours, math.inf)
        energy_lb = np.where(np.isnan(energy_lb), math.inf, energy_lb)
        co2_lb = np.where(np.isnan(co2_lb), math.inf, co2_lb)
        out = np.column_stack([time_rank, cost_lb, energy_lb, co2_lb])
        return np.where(dead[:, None], math.inf, out)

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
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
        """Per child: (T, rate, rate·T, T·f, rate·T·f) lower bounds of its descendants
        (torchtitan-ft). Only the cells some descendant can use are looked at: those whose
        window [⌈lo/K⌉, ⌊hi/K⌋] holds for an island count K above the child's. At cell c a
        descendant has at least K = max(k + 1, ⌈lo/c⌉) islands, so its equivalent-token factor
        f is at least the least factor of K islands (1 when the objective is not
        quality-adjusted): few cells per island need many islands, which DiLoCo pays for."""
        ev = self.evaluator
        t = ev.table
        g = ev.grid
        tb = self.tables
        n = len(opts)
        t_lb = np.full(n, math.inf)
        rate_lb = np.full(n, math.inf)
        product_lb = np.full(n, math.inf)
        t_f = np.full(n, math.inf)
        product_f = np.full(n, math.inf)
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
            product = np.where(finite, rate_c * theta, math.inf)
            product_lb[sel] = product.min(axis=1)
            if ev.quality_adjusted:
                factor = ev.quality.least_factor(int(k) + m[None, :], theta)
                t_f[sel] = np.where(finite, theta * factor, math.inf).min(axis=1)
                product_f[sel] = np.where(finite, product * factor, math.inf).min(axis=1)
            else:
                t_f[sel], product_f[sel] = t_lb[sel], product_lb[sel]
        rate_lb = np.maximum(rate_lb, rate + self.min_rate_after[suffix])
        return t_lb, rate_lb, product_lb, t_f, product_f

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
        ranked_s: float,
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
        """Per child: (T, rate, T·f, f, rate·f) lower bounds of its descendants (weighted; see
        the module docstring). T·f: a descendant whose inner step lies in (θ_{i−1}, θ_i] of
        the bound grid processes at most what its islands can within θ_i, so it has at least
        the child's islands plus the fewest later islands that reach the batch there — and
        the least factor of that many at a step above θ_{i−1}. f: the same at ``theta``, the
        step a descendant must undercut to matter (to rank at most ``ranked_s``); rate·f: the
        least over m more islands of the cheapest rate m can add × the factor of that many
        (0s when the objective is not quality-adjusted or there is no such step: no bound
        beyond the least factor of one more island)."""
        ev = self.evaluator
        t = ev.table
        g = ev.grid
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
        f_theta = np.zeros(len(opts))
        if math.isfinite(theta):  # the exact capacity test at the step that matters
            tb.exact_at(theta)
            within = np.flatnonzero(node.state <= theta)
            have = int(within.max()) if len(within) else 0
            mine = have + t.islands[opts] * tb.maxcell_exact[t.row[opts]]
            fits = mine + tb.ms_exact[suffix, left] >= g.lo
            t_lb = np.where(fits, t_lb, np.maximum(t_lb, tb.theta_next))
            if ev.quality_adjusted:
                f_theta = self._islands_that_matter(
                    node, opts, islands, suffix, left, ranked_s, t_lb
                )
        t_lb = np.where(t_lb <= tb.cap_s * (1 + RELATIVE_TIE), t_lb, math.inf)
        t_f = np.zeros(len(opts))
        if ev.quality_adjusted:
            t_f = self._weighted_factor_bound(own, suffix, left, islands, floor, g.lo)
            t_f = np.maximum(t_f, np.where(f_theta > 0, t_lb * np.maximum(f_theta, 1e-300), 0.0))
        # the rate: the cheapest way to add the cells still missing within the cap (the most
        # cells the child itself can process within the cap, exactly)
        within_cap = np.flatnonzero(node.state <= tb.cap_s)
        have_cap = int(within_cap.max()) if len(within_cap) else 0
        reach_cap = have_cap + t.islands[opts] * tb.cap_maxcell[t.row[opts]]
        missing = np.clip(g.lo - reach_cap, 0, g.hi)
        assert tb.rate_table is not None
        extra = tb.rate_table[suffix, left, missing]
        extra = np.maximum(extra, self.min_rate_after[suffix])
        rate_f = np.zeros(len(opts))
        if ev.quality_adjusted:
            # rate × f together: m more islands cost at least the cheapest m can and pay at
            # least the factor of k + m (the cheapest completion is not the fewest islands)
            m = np.arange(tb.rate_table.shape[1])
            per_m = tb.rate_table[suffix[:, None], m[None, :], missing[:, None]]
            per_m = np.maximum(per_m, self.min_rate_after[suffix][:, None])
            factor = ev.quality.least_factor(islands[:, None] + m[None, :], t_lb[:, None])
            usable = (m[None, :] >= 1) & (m[None, :] <= left[:, None])
            rate_f = np.where(usable, (rate[:, None] + per_m) * factor, math.inf).min(axis=1)
        t_f = np.where(np.isfinite(t_lb), t_f, math.inf)
        return t_lb, rate + extra, t_f, f_theta, rate_f

    def _islands_that_matter(
        self,
        node: Node,
        opts: IntArray,
        islands: IntArray,
        suffix: IntArray,
        left: IntArray,
        ranked_s: float,
        t_lb: FloatArray,
    ) -> FloatArray:
        """The least factor of a descendant that matters: one with K islands matters only if
        its ranked time is at most ``ranked_s``, so only if its inner step is at most θ_K
        (`Evaluator.step_that_matters` for K islands), so it reaches the batch within θ_K;
        the fewest more islands m for which some completion does gives the bound, K's least
        factor at an inner step of at least ``t_lb`` (inf: no descendant matters)."""
        ev = self.evaluator
        t = ev.table
        tb = self.tables
        lo = ev.grid.lo
        n = len(opts)
        out = np.full(n, math.inf)
        found = np.zeros(n, dtype=bool)
        rows = t.row[opts]
        # K islands in all, fewest first: each child's first K is its fewest more islands
        for k_total in range(int(islands.min(initial=self.kmax)) + 1, self.kmax + 1):
            sel = np.flatnonzero(~found & (islands < k_total))
            if not len(sel):
                continue
            theta_k = ev.step_that_matters(ranked_s, k_total)
            maxcell, ms = tb.capacities(theta_k)
            within = np.flatnonzero(node.state <= theta_k)
            have = int(within.max()) if len(within) else 0
            reach = have + t.islands[opts[sel]] * maxcell[rows[sel]]
            ok = sel[reach + ms[suffix[sel], k_total - islands[sel]] >= lo]
            out[ok] = ev.quality.least_factor(np.full(len(ok), k_total), t_lb[ok])
            found[ok] = True
            if found.all():
                break
        return out

    def _weighted_factor_bound(
        self,
        own: IntArray,
        suffix: IntArray,
        left: IntArray,
        islands: IntArray,
        floor: FloatArray,
        lo: int,
    ) -> FloatArray:
        """min over the grid of max(θ_{i−1}, floor) × the least factor of the islands it takes
        to reach ``lo`` cells within θ_i (see `_weighted_bounds`), at that step. The factor
        grows with the islands and the step, and the fewest islands shrink as θ grows, so
        this is the least over m more islands of the step below the first grid point where m
        reach ``lo`` × the factor of m more: that first point found by bisection (what the
        child's islands and m more can process grows with θ)."""
        tb = self.tables
        g = len(tb.theta)
        n = len(own)
        m = np.arange(1, self.kmax + 1)  # at least one more island
        rows = np.arange(n)[:, None]
        first = np.zeros((n, len(m)), dtype=np.int64)
        end = np.full((n, len(m)), g, dtype=np.int64)
        open_ = first < end
        while open_.any():
            mid = (first + end) // 2
            at = np.minimum(mid, g - 1)
            reach = own[rows, at] + tb.ms_table[suffix[:, None], m[None, :], at] >= lo
            end = np.where(open_ & reach, mid, end)
            first = np.where(open_ & ~reach, mid + 1, first)
            open_ = first < end
        below = np.concatenate([[0.0], tb.theta])  # θ_{i−1} at i, 0 at 0
        step = np.maximum(below[first], floor[:, None])
        factor = self.evaluator.quality.least_factor(islands[:, None] + m[None, :], step)
        usable = (first < g) & (m[None, :] <= left[:, None])
        return np.asarray(np.where(usable, step * factor, math.inf).min(axis=1))
