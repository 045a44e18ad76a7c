"""What a layout costs beyond GPU-hours, many layouts at once: DiLoCo's quality price
(`shardmeter.cost.quality_law`, tabulated over islands × syncEvery once per request, other
fragmentSyncDelays on demand) and the WAN
egress of its outer all_reduce (`shardmeter.cost.egress`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shardmeter.cost.egress import BYTES_PER_GB, egress_bytes_per_site, site_egress_usd_per_gb
from shardmeter.cost.quality_law import equivalent_token_factor, loss_penalty
from shardmeter.plan.overhead import DelayFloors
from shardmeter.plan.schema import PlanSpec
from shardmeter.sim.scenario import outer_payload_bytes
from shardmeter.spec.pool import PoolSpec

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class QualityTable:
    """Penalty and equivalent-token factor for every island count 1…``max_islands`` and every
    syncEvery the settings rule may pick (``sync_everies``) at fragmentSyncDelay 0, with the
    strategy's outer precision; other delays on demand (memoised). FSDP: none.

    Bounds for the search: the least factor of any layout with at least m islands, over the
    (H, τ) the settings rule can give it (``floors``, `shardmeter.plan.overhead.DelayFloors`;
    without them τ = 0 at every H) — for any layout (`least_factor`) and for one whose inner
    step exceeds ``hidden_above_s``, so that its outer all_reduce is hidden and, for Streaming
    DiLoCo with two islands or more, overlapped by at least one inner step (τ ≥ 1), which
    costs that share of its tokens. The penalty never falls as the delay grows
    (`shardmeter.cost.quality_outer`), so each H's least τ bounds the factor at that H."""

    def __init__(
        self,
        spec: PlanSpec,
        sync_everies: Sequence[int],
        max_islands: int,
        floors: DelayFloors | None = None,
    ) -> None:
        self.diloco = spec.strategy.is_diloco
        self.hs = np.array(sorted(set(sync_everies)), dtype=np.int64)
        self.params = float(spec.model.total_params)
        self.tokens = float(spec.training.total_tokens)
        self.outer_precision = spec.strategy.outer_precision
        self._at: dict[tuple[int, int, int], tuple[float, float]] = {}
        shape = (max_islands + 1, len(self.hs))
        self.penalty = np.zeros(shape)
        self.factor = np.ones(shape)
        if self.diloco:
            for m in range(1, max_islands + 1):
                for j, h in enumerate(self.hs):
                    self.penalty[m, j], self.factor[m, j] = self.at(m, int(h), 0)
        hs = [int(h) for h in self.hs]
        if floors is None:
            floors = DelayFloors(dict.fromkeys(hs, 0), dict.fromkeys(hs, 0), math.inf)
        self.floors = floors
        self.hidden_above_s = floors.hidden_above_s
        least = self.factor.min(axis=1)  # one island: τ = 0 (nothing to hide)
        hidden = np.full(max_islands + 1, math.inf)
        if self.diloco:
            for m in range(2, max_islands + 1):
                least[m] = self._least(m, floors.any_plan)
                hidden[m] = self._least(m, floors.hidden)
        hidden[:2] = least[:2]
        # the least factor of any plan with at least m islands (a bound for the search)
        self.least_from = np.minimum.accumulate(least[::-1])[::-1]
        self.least_hidden_from = np.maximum(
            np.minimum.accumulate(hidden[::-1])[::-1], self.least_from
        )

    def _least(self, islands: int, delays: dict[int, int]) -> float:
        """The least factor of ``islands`` islands over the syncEvery H with their least τ."""
        return min((self.at(islands, h, tau)[1] for h, tau in delays.items()), default=math.inf)

    def at(self, islands: int, sync_every: int, fragment_sync_delay: int) -> tuple[float, float]:
        """(penalty, factor) of one setting."""
        key = (islands, sync_every, fragment_sync_delay)
        if key not in self._at:
            n, d, tau, prec = self.params, self.tokens, fragment_sync_delay, self.outer_precision
            self._at[key] = (
                loss_penalty(
                    n, d, islands, sync_every, fragment_sync_delay=tau, outer_precision=prec
                ),
                equivalent_token_factor(
                    n, d, islands, sync_every, fragment_sync_delay=tau, outer_precision=prec
                ),
            )
        return self._at[key]

    def lookup(
        self, islands: IntArray, sync_every: IntArray, fragment_sync_delay: IntArray
    ) -> tuple[FloatArray, FloatArray]:
        """(penalty, factor) per layout; FSDP and empty layouts get (0, 1)."""
        if not self.diloco:
            return np.zeros(len(islands)), np.ones(len(islands))
        m = np.clip(islands, 0, self.penalty.shape[0] - 1)
        j = np.clip(np.searchsorted(self.hs, sync_every), 0, len(self.hs) - 1)
        known = (islands > 0) & (self.hs[j] == sync_every)
        penalty = np.where(known, self.penalty[m, j], 0.0)
        factor = np.where(known, self.factor[m, j], 1.0)
        delayed = np.flatnonzero(known & (fragment_sync_delay > 0))
        if len(delayed):
            keys = np.stack(
                [islands[delayed], sync_every[delayed], fragment_sync_delay[delayed]], axis=1
            )
            unique, where = np.unique(keys, axis=0, return_inverse=True)
            values = np.array([self.at(int(a), int(b), int(c)) for a, b, c in unique])
            penalty[delayed] = values[where.ravel(), 0]
            factor[delayed] = values[where.ravel(), 1]
        return penalty, factor

    def least_factor(
        self, islands_at_least: IntArray, step_at_least_s: FloatArray | float | None = None
    ) -> FloatArray:
        """A lower bound on the factor of any layout with at least this many islands (and,
        given, an inner step of at least ``step_at_least_s``; the arrays broadcast)."""
        m = np.clip(islands_at_least, 0, len(self.least_from) - 1)
        if step_at_least_s is None:
            return np.asarray(self.least_from[m])
        hidden = np.asarray(step_at_least_s) > self.hidden_above_s
        return np.asarray(np.where(hidden, self.least_hidden_from[m], self.least_from[m]))

    def step_that_matters(self, ranked_per_step_s: float, islands_at_least: int) -> float:
        """The longest inner step T a layout of at least ``islands_at_least`` islands can have
        and still rank at most ``ranked_per_step_s`` per inner step: T × its factor (at
        least `least_factor` at T) ≤ that. Above ``hidden_above_s`` the hidden factor
        applies."""
        m = min(max(islands_at_least, 0), len(self.least_from) - 1)
        hidden = ranked_per_step_s / float(self.least_hidden_from[m])
        if hidden > self.hidden_above_s:
            return hidden
        return min(self.hidden_above_s, ranked_per_step_s / float(self.least_from[m]))


class EgressModel:
    """Bytes and dollars a layout's outer all_reduce sends out of its sites over the run."""

    def __init__(self, spec: PlanSpec, pools: Sequence[PoolSpec]) -> None:
        self.diloco = spec.strategy.is_diloco
        sites = sorted({p.site for p in pools})
        self.site = np.array([sites.index(p.site) for p in pools], dtype=np.int64)
        prices = site_egress_usd_per_gb(spec.pools)
        self.site_price = np.array([prices[s] for s in sites])
        self.n_sites = len(sites)
        self.payload_bytes = outer_payload_bytes(
            spec.model, spec.strategy, float(spec.model.total_params)
        )

    def evaluate(
        self, used: BoolArray, islands: IntArray, sync_every: IntArray, inner_steps: float
    ) -> tuple[FloatArray, FloatArray]:
        """(GB, USD) per layout for ``inner_steps`` inner steps."""
        n = len(islands)
        if not self.diloco or self.n_sites < 2 or n == 0:
            return np.zeros(n), np.zeros(n)
        at = np.zeros((n, self.n_sites), dtype=bool)
        for p, s in enumerate(self.site):
            at[:, s] |= used[:, p]
        count = at.sum(axis=1)
        price = (at * self.site_price[None, :]).sum(axis=1)
        ks, where = np.unique(islands, return_inverse=True)
        per_step = np.array([egress_bytes_per_site(self.payload_bytes, int(k)) for k in ks])[where]
        rounds = inner_steps / np.maximum(sync_every, 1)
        per_site_gb = np.where(count >= 2, per_step * rounds / BYTES_PER_GB, 0.0)
        return per_site_gb * count, per_site_gb * price
