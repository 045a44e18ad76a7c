"""Exact apportioning of the global batch over a layout's islands.

A *layout* takes k_p islands of one shape from each used pool p. Each shape's table
``F_p[c]`` (`shardmeter.plan.configs`) is the least step seconds for one island to process c
cells (c·u sequences) per inner step. The islands together must process between ``lo`` and
``hi`` cells (the global batch B and its tolerance), and the plan's inner step T is the
slowest island's. Apportioning picks every pool's c_p to minimise T — exactly:

* ``runtime: torchtitan-ft`` — every island processes the same c (torchft averages
  pseudo-gradients unweighted): K = Σ k_p islands, c ∈ [⌈lo/K⌉, ⌊hi/K⌋], and
  T = min over those c of max_p F_p[c]. The prefix state of a partial layout is the per-cell
  maximum ``M[c] = max_p F_p[c]``.
* ``runtime: weighted`` — any c_p with Σ k_p·c_p ∈ [lo, hi]: a bottleneck subset-sum, solved
  by (min, max) convolution over the cell count. The prefix state is ``D[s]``, the least
  slowest-island step with which the chosen pools process exactly s cells; the last pool is
  folded in with a sliding-window minimum, T = min_c max(F[c], min D[lo − k·c … hi − k·c]).

Ties in T are broken by the fewest cells (the smallest overshoot of B), then by the earliest
pools taking the fewest cells. Everything here is exact; nothing is trimmed greedily.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
INF = np.inf


def empty_weighted(hi: int) -> FloatArray:
    """D of the empty layout: zero cells at no time."""
    d = np.full(hi + 1, INF)
    d[0] = 0.0
    return d


def group_row(row: FloatArray, k: int, hi: int) -> FloatArray:
    """G[v]: the step of k identical islands processing v cells together (k·c = v)."""
    g = np.full(hi + 1, INF)
    c = np.arange(0, hi // k + 1)
    g[c * k] = row[: hi // k + 1]
    g[0] = INF  # a used pool processes something
    return g


def minmax_convolve(d: FloatArray, g: FloatArray) -> FloatArray:
    """out[s] = min over v of max(d[s − v], g[v]) for s within the arrays' length."""
    n = len(d)
    out = np.full(n, INF)
    sd, sg = np.flatnonzero(np.isfinite(d)), np.flatnonzero(np.isfinite(g))
    if len(sd) <= len(sg):  # loop over the sparser support
        for v in sd:
            np.minimum(out[v:], np.maximum(g[: n - v], d[v]), out=out[v:])
    else:
        for v in sg:
            np.minimum(out[v:], np.maximum(d[: n - v], g[v]), out=out[v:])
    return out


def window_min(d: FloatArray, lo: int, hi: int) -> FloatArray:
    """w[v] = min d[max(lo − v, 0) … hi − v] for v = 0…hi (inf where the window is empty)."""
    n = hi + 1
    prefix = np.minimum.accumulate(np.concatenate([d[:n], [INF]]))  # prefix[i] = min d[0..i]
    out = np.full(n, INF)
    # windows [lo − v, hi − v]: for v ≥ lo the window starts at 0, so it is a prefix minimum
    v = np.arange(n)
    start = lo - v
    end = hi - v
    full = start <= 0
    out[full] = prefix[end[full]]
    part = np.flatnonzero(~full)
    if len(part):
        # windows of constant width hi − lo + 1 sliding over d: a sparse-table minimum
        width = hi - lo + 1
        table = [d[:n].copy()]
        span = 1
        while span * 2 <= width:
            prev = table[-1]
            table.append(np.minimum(prev[:-span], prev[span:]))
            span *= 2
        level = len(table) - 1
        span = 1 << level
        s = start[part]
        e = end[part]
        out[part] = np.minimum(table[level][s], table[level][e - span + 1])
    return out


def equal_best(
    steps: FloatArray,
    rows: IntArray,
    used: npt.NDArray[np.bool_],
    islands: IntArray,
    lo: int,
    hi: int,
) -> tuple[FloatArray, IntArray]:
    """Equal runtime, many layouts at once: (T, cells per island) for each layout.

    ``rows`` (layouts × pools) indexes ``steps``; ``used`` marks the pools in each layout;
    ``islands`` is K per layout. Infeasible layouts get T = inf and cell 0."""
    n = len(islands)
    k = np.maximum(islands, 1)
    first = -(-lo // k)
    last = hi // k
    width = int(np.max(last - first + 1, initial=0))
    t_out = np.full(n, INF)
    c_out = np.zeros(n, dtype=np.int64)
    if width <= 0:
        return t_out, c_out
    cells = first[:, None] + np.arange(width)[None, :]
    valid = cells <= last[:, None]
    cells = np.minimum(cells, steps.shape[1] - 1)
    worst = np.zeros((n, width))
    for p in range(rows.shape[1]):
        vals = steps[rows[:, p][:, None], cells]
        worst = np.where(used[:, p][:, None], np.maximum(worst, vals), worst)
    worst = np.where(valid & (islands[:, None] > 0), worst, INF)
    j = np.argmin(worst, axis=1)  # first minimum: fewest cells
    t_out = worst[np.arange(n), j]
    c_out = np.where(np.isfinite(t_out), cells[np.arange(n), j], 0)
    return t_out, c_out


def weighted_last(
    prefix: FloatArray, steps: FloatArray, rows: IntArray, ks: IntArray, lo: int, hi: int
) -> FloatArray:
    """Weighted runtime: T of the prefix (its D) completed by each of the options
    (``rows``, ``ks``) of one more pool."""
    w = window_min(prefix, lo, hi)
    n = len(rows)
    width = hi + 1
    c = np.arange(width)
    out = np.full(n, INF)
    for k in np.unique(ks):
        sel = np.flatnonzero(ks == k)
        cmax = hi // int(k)
        cc = c[1 : cmax + 1]
        vals = np.maximum(steps[rows[sel]][:, cc], w[cc * int(k)][None, :])
        out[sel] = vals.min(axis=1) if len(cc) else INF
    return out


@dataclass(frozen=True)
class Apportioned:
    step_s: float
    """T: the slowest island's inner step."""
    cells: tuple[int, ...]
    """Cells one island of each used pool processes per inner step, in the layout's order."""

    def total(self, islands: Sequence[int]) -> int:
        return sum(k * c for k, c in zip(islands, self.cells, strict=True))


def apportion(
    rows: Sequence[FloatArray], islands: Sequence[int], lo: int, hi: int, equal: bool
) -> Apportioned | None:
    """The exact apportioning of one layout: least T, then fewest cells, then the earliest
    pools taking the fewest cells. None when the layout cannot reach [lo, hi]."""
    if not rows:
        return None
    if equal:
        k = sum(islands)
        first, last = -(-lo // k), hi // k
        best: tuple[float, int] | None = None
        for c in range(first, last + 1):
            t = max(float(r[c]) if c < len(r) else INF for r in rows)
            if np.isfinite(t) and (best is None or t < best[0]):
                best = (t, c)
        if best is None:
            return None
        return Apportioned(best[0], tuple(best[1] for _ in rows))
    # weighted: forward D tables, then backtrack
    ds = [empty_weighted(hi)]
    groups = [group_row(r, k, hi) for r, k in zip(rows, islands, strict=True)]
    for g in groups:
        ds.append(minmax_convolve(ds[-1], g))
    final = ds[-1]
    window = final[lo : hi + 1]
    if not np.isfinite(window).any():
        return None
    t = float(window.min())
    s = lo + int(np.flatnonzero(window == t)[0])  # fewest cells
    cells: list[int] = []
    for j in range(len(rows) - 1, -1, -1):  # backtrack: later pools take as much as they may
        g, d = groups[j], ds[j]
        v_best = None
        for v in range(s, 0, -1):
            if g[v] <= t and d[s - v] <= t:
                v_best = v
                break
        assert v_best is not None
        cells.append(v_best // islands[j])
        s -= v_best
    return Apportioned(t, tuple(reversed(cells)))


def equal_extend(
    prefix: FloatArray, steps: FloatArray, rows: IntArray, islands: IntArray, lo: int, hi: int
) -> FloatArray:
    """Equal runtime: T of a prefix (per-cell slowest island ``prefix``) extended by each of
    the options (``rows``) giving ``islands`` islands in all."""
    k = np.maximum(islands, 1)
    first = -(-lo // k)
    last = hi // k
    width = int(np.max(last - first + 1, initial=0))
    if width <= 0:
        return np.full(len(rows), INF)
    cells = first[:, None] + np.arange(width)[None, :]
    valid = cells <= last[:, None]
    cells = np.minimum(cells, len(prefix) - 1)
    vals = np.maximum(prefix[cells], steps[rows[:, None], cells])
    vals = np.where(valid, vals, INF)
    return np.asarray(vals.min(axis=1))
