"""Lower bounds for branch and bound: what any extension of a partial layout can achieve.

A node of the search is a layout X whose last used pool is at position j of the search order;
its *descendants* add at least one option from the pools after j. Every bound below holds for
all of them (so pruning never loses a plan), and tables over the pools after each position
(*suffix* tables) make them cheap:

* **inner step** — ``runtime: torchtitan-ft``: at cell c the descendants need
  m(c) = max(1, ⌈lo/c⌉ − K_X) more islands, and ``N[j][c][m]``, the least step time at which
  the pools after j can field m islands at cell c (each pool offers one shape with any k up to
  its maximum), is exact; so T ≥ min_c max(M_X[c], N[j][c][m(c)]).
  ``runtime: weighted``: at any step θ the descendants process at most X's most cells at θ
  plus the new option's plus ``MS[j][islands left][θ]`` (a knapsack of the suffix pools'
  largest configurations at θ, on a geometric grid of θ); T is at least the grid point below
  the first θ where that reaches lo, and at least every chosen island's fastest step;
* **outer level** — at least the largest outer optimizer step chosen so far over the largest
  ``syncEvery`` allowed;
* **cost** — rate × time, the rate at least X's plus the cheapest way the suffix can supply
  the missing islands (torchtitan-ft, per cell, exact knapsack) or cells (weighted, knapsack
  of the largest configurations within the time cap).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shardmeter.plan.configs import BatchGrid
from shardmeter.plan.options import OptionTable

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
INF = np.inf
GRID_POINTS = 512


class SuffixTables:
    """Suffix tables for one search order (see the module docstring)."""

    def __init__(
        self,
        table: OptionTable,
        order: Sequence[int],
        groups: Sequence[IntArray],
        grid: BatchGrid,
        max_islands: int,
        equal: bool,
    ) -> None:
        self.table = table
        self.order = list(order)
        self.groups = list(groups)
        """Option indices of each pool, by position in ``order``."""
        self.grid = grid
        self.kmax = max_islands
        self.equal = equal
        n = len(order)
        width = grid.hi + 1
        steps = table.steps
        finite = steps[np.isfinite(steps)]
        self.min_step = float(finite.min()) if len(finite) else 1.0
        self.max_step = float(finite.max()) if len(finite) else 1.0
        self.theta = np.zeros(0)
        self.row_min_step = np.array(
            [float(r[np.isfinite(r)].min()) if np.isfinite(r).any() else INF for r in steps]
        )
        cells = np.arange(steps.shape[1], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_cell = np.where(cells[None, :] > 0, steps / cells[None, :], INF)
        per_island_rate = table.usd_per_hour / np.maximum(table.islands, 1)
        self.efficiency = per_island_rate * per_cell.min(axis=1)[table.row]
        """Per option: the least $/h·s one of its islands spends per cell (rate × step / cells
        at its best configuration): cost ≥ steps/3600 · Σ islands·cells·efficiency."""
        self.efficiency_after = np.full(len(order) + 1, INF)
        for j in range(len(order) - 1, -1, -1):
            here = self.efficiency[groups[j]]
            best = float(here.min()) if len(here) else INF
            self.efficiency_after[j] = min(self.efficiency_after[j + 1], best)
        if equal:
            self.n_table = self._islands_table(n, width)
        else:
            self.set_grid(self.max_step)
        self.rate_table: FloatArray | None = None
        self.cap_s: float = INF
        self.cap_maxcell = np.zeros(len(steps), dtype=np.int64)
        self.all_steps = np.unique(finite)
        """Every step time in the tables: a plan's inner step is one of them."""
        self.exact_theta = INF
        self._capacities: dict[float, tuple[IntArray, IntArray]] = {}
        self.maxcell_exact = np.zeros(len(steps), dtype=np.int64)
        self.ms_exact = np.zeros((n + 1, self.kmax + 1), dtype=np.int64)
        self.theta_next = INF

    # ---- torchtitan-ft: islands per cell ------------------------------------------------------
    def _islands_table(self, n: int, width: int) -> FloatArray:
        """N[j][c][m]: least step at which pools at positions ≥ j field m islands at cell c."""
        t = self.table
        kmax = self.kmax
        out = np.full((n + 1, width, kmax + 1), INF)
        out[:, :, 0] = 0.0
        for j in range(n - 1, -1, -1):
            nxt = out[j + 1]
            cur = nxt.copy()
            for o in self.groups[j]:
                k = int(t.islands[o])
                if k > kmax:
                    continue
                f = t.steps[t.row[o]][:, None]  # (cells, 1)
                cand = np.maximum(f, nxt[:, : kmax + 1 - k])
                np.minimum(cur[:, k:], cand, out=cur[:, k:])
            out[j] = cur
        # "at least m islands" (a relaxation of exactly m; equal when N grows with m)
        return np.minimum.accumulate(out[:, :, ::-1], axis=2)[:, :, ::-1]

    def rates_per_cell(self, cap_s: float) -> None:
        """R[j][c][m]: least $/h with which pools at positions ≥ j field at least m islands at
        cell c, every island within ``cap_s`` (torchtitan-ft)."""
        t = self.table
        n, kmax = len(self.order), self.kmax
        width = self.grid.hi + 1
        out = np.full((n + 1, width, kmax + 1), INF)
        out[:, :, 0] = 0.0
        for j in range(n - 1, -1, -1):
            nxt = out[j + 1]
            cur = nxt.copy()
            for o in self.groups[j]:
                k = int(t.islands[o])
                if k > kmax:
                    continue
                ok = (t.steps[t.row[o]] <= cap_s)[:, None]
                rate = float(t.usd_per_hour[o])
                # at least m islands: k islands cover m ≤ k, the rest from later pools
                prev = np.concatenate(
                    [np.zeros((width, 1)).repeat(k, axis=1), nxt[:, : kmax + 1 - k]], axis=1
                )
                cand = np.where(ok, prev + rate, INF)
                np.minimum(cur, cand, out=cur)
            out[j] = cur
        self.rate_table = out
        self.cap_s = cap_s

    # ---- weighted: cells per step time --------------------------------------------------------
    def set_grid(self, top_s: float) -> None:
        """The bound grid: `GRID_POINTS` step times, geometric from the fastest step to
        ``top_s`` (both included). Inner steps above ``top_s`` cannot matter to the pass, so a
        subtree that cannot reach the batch at ``top_s`` is pruned; a tight top is a fine
        grid where it counts."""
        top = min(max(top_s, self.min_step), self.max_step)
        self.theta = np.unique(
            np.concatenate([np.geomspace(self.min_step, top, GRID_POINTS), [self.min_step, top]])
        )
        self.maxcell = self._maxcell()  # (rows × θ grid)
        self.ms_table = self._max_sum_table(len(self.order))

    def _maxcell(self) -> IntArray:
        """(rows × θ grid): the most cells one island of each shape processes within θ."""
        steps = self.table.steps
        out = np.zeros((len(steps), len(self.theta)), dtype=np.int64)
        for r, row in enumerate(steps):
            cells = np.flatnonzero(np.isfinite(row))
            if not len(cells):
                continue
            order = np.argsort(row[cells], kind="stable")
            best = np.maximum.accumulate(cells[order])
            pos = np.searchsorted(row[cells][order], self.theta, side="right") - 1
            out[r] = np.where(pos >= 0, best[np.maximum(pos, 0)], 0)
        return out

    def _max_sum_table(self, n: int) -> IntArray:
        """MS[j][m][θ]: the most cells pools at positions ≥ j process with ≤ m islands."""
        t = self.table
        kmax, g = self.kmax, len(self.theta)
        out = np.zeros((n + 1, kmax + 1, g), dtype=np.int64)
        for j in range(n - 1, -1, -1):
            nxt = out[j + 1]
            cur = nxt.copy()
            for o in self.groups[j]:
                k = int(t.islands[o])
                if k > kmax:
                    continue
                gain = k * self.maxcell[t.row[o]]
                cand = np.where(gain[None, :] > 0, nxt[: kmax + 1 - k] + gain[None, :], 0)
                np.maximum(cur[k:], cand, out=cur[k:])
            out[j] = np.maximum.accumulate(cur, axis=0)
        return out

    def exact_at(self, theta: float) -> None:
        """Capacities at one step time exactly (weighted): the most cells each shape's island
        processes within ``theta`` and ``MS`` at ``theta``; and the next step time above it.
        A subtree that cannot reach lo at ``theta`` has an inner step of at least
        ``theta_next`` — exact where the grid would only give the point below."""
        if theta == self.exact_theta or not np.isfinite(theta):
            return
        self.exact_theta = theta
        self.maxcell_exact, self.ms_exact = self.capacities(theta)
        i = int(np.searchsorted(self.all_steps, theta, side="right"))
        self.theta_next = float(self.all_steps[i]) if i < len(self.all_steps) else INF

    def capacities(self, theta: float) -> tuple[IntArray, IntArray]:
        """(per shape row: the most cells one island processes within ``theta``; MS at
        ``theta``: per position and island budget m, the most cells the pools from there on
        process with ≤ m islands), cached per step time."""
        if theta in self._capacities:
            return self._capacities[theta]
        t = self.table
        cells = np.arange(t.steps.shape[1])
        maxcell = np.where(t.steps <= theta, cells[None, :], 0).max(axis=1)
        n, kmax = len(self.order), self.kmax
        out = np.zeros((n + 1, kmax + 1), dtype=np.int64)
        for j in range(n - 1, -1, -1):
            nxt = out[j + 1]
            cur = nxt.copy()
            for o in self.groups[j]:
                k = int(t.islands[o])
                gain = k * int(maxcell[t.row[o]])
                if k > kmax or gain <= 0:
                    continue
                np.maximum(cur[k:], nxt[: kmax + 1 - k] + gain, out=cur[k:])
            out[j] = np.maximum.accumulate(cur)
        if len(self._capacities) >= 64:
            self._capacities.pop(next(iter(self._capacities)))
        self._capacities[theta] = (maxcell, out)
        return maxcell, out

    def rates_per_sum(self, cap_s: float) -> None:
        """MR[j][m][s]: least $/h with which pools at positions ≥ j add at least s cells with
        ≤ m islands, each at its largest configuration within ``cap_s`` (weighted)."""
        t = self.table
        n, kmax, hi = len(self.order), self.kmax, self.grid.hi
        # per shape row: the most cells one island processes within the cap
        cells = np.arange(self.table.steps.shape[1])
        self.cap_maxcell = np.where(self.table.steps <= cap_s, cells[None, :], 0).max(axis=1)
        out = np.full((n + 1, kmax + 1, hi + 1), INF)
        out[:, :, 0] = 0.0
        s = np.arange(hi + 1)
        for j in range(n - 1, -1, -1):
            nxt = out[j + 1]
            cur = nxt.copy()
            for o in self.groups[j]:
                k = int(t.islands[o])
                if k > kmax:
                    continue
                c = int(self.cap_maxcell[t.row[o]])
                if c <= 0:
                    continue
                rate = float(t.usd_per_hour[o])
                cand = nxt[: kmax + 1 - k][:, np.maximum(s - k * c, 0)] + rate
                np.minimum(cur[k:], cand, out=cur[k:])
            out[j] = np.minimum.accumulate(cur[:, ::-1], axis=1)[:, ::-1]
        self.rate_table = out
        self.cap_s = cap_s
