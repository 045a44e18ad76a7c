"""The DiLoCo outer level of many candidate plans at once, in closed form.

For each plan: the outer all_reduce path (`shardmeter.sim.outer`: the sites' WAN uplinks when
the islands span sites, the fabric inside one), each fragment's all_reduce seconds for every
fragment count, and the settings of `shardmeter.sim.settings` — the same rule, vectorised
(zero blocking within the guard-rails: smallest H, preferred fragments, shortest delay; else
the least ``(blocking + outer optimizer steps(F)) / H``). Per inner step the outer level adds
``(blocking + outer optimizer steps(F)) / H``, the outer optimizer steps those of the F
fragments the settings cut the model into — one optimizer call per fragment, each with the
step regression's per-call intercept, as the simulator charges them (`OuterModel.evaluate`
takes them per fragment count). A test holds this against the scalar rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardmeter.cost.priors import LINK_EFFICIENCY_BY_KIND
from shardmeter.plan.options import PoolContext
from shardmeter.plan.schema import PlanSpec
from shardmeter.sim.bottleneck import BLOCKING_EPSILON_S
from shardmeter.sim.diloco import fragment_params
from shardmeter.sim.outer import fabric_fit
from shardmeter.sim.scenario import outer_payload_bytes
from shardmeter.sim.settings import (
    BLOCKING_DILOCO_OVERHEAD,
    fragment_preference,
    sync_every_candidates,
)
from shardmeter.spec.training import StrategyKind

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
CHUNK = 4096


@dataclass(frozen=True)
class DelayFloors:
    """What the settings rule allows a plan of two islands or more (`OuterModel.delay_floors`):
    per syncEvery H it can pick, the least fragmentSyncDelay τ it then takes — for any such plan
    (``any_plan``) and for one whose outer all_reduce is hidden (``hidden``: zero blocking,
    the rule's first choice). Every plan whose inner step exceeds ``hidden_above_s`` is
    hidden (inf: none is known to be)."""

    any_plan: dict[int, int]
    hidden: dict[int, int]
    hidden_above_s: float


@dataclass
class OuterResult:
    sync_every: IntArray
    fragments: IntArray
    fragment_sync_delay: IntArray
    blocking_s: FloatArray
    """Compute stall per outer step (closed form)."""
    zero_blocking: BoolArray
    overhead_s: FloatArray
    """Seconds the outer level adds per inner step."""
    link_ok: BoolArray
    """False where the plan spans sites but a used pool has no WAN uplink."""


class OuterModel:
    def __init__(self, spec: PlanSpec, contexts: Sequence[PoolContext]) -> None:
        self.spec = spec
        strat = spec.strategy
        pools = [c.pool for c in contexts]
        sites = sorted({p.site for p in pools})
        self.site = np.array([sites.index(p.site) for p in pools], dtype=np.int64)
        self.uplink_latency = np.array(
            [p.wan_uplink.latency_s if p.wan_uplink else np.nan for p in pools]
        )
        self.uplink_bw = np.array(
            [p.wan_uplink.bandwidth_bytes_per_s if p.wan_uplink else np.nan for p in pools]
        )
        self.uplink_efficiency = np.array(
            [LINK_EFFICIENCY_BY_KIND[p.wan_uplink.kind] if p.wan_uplink else np.nan for p in pools]
        )
        self.gpus_per_node = np.array([p.gpus_per_node for p in pools], dtype=np.float64)
        """An island fills its GPUs ÷ GPUs per node of node networks (`sim.outer`)."""
        fits = [fabric_fit(c.cost_model) for c in contexts]
        self.fabric_latency = np.array([f[0] for f in fits])
        self.fabric_spb = np.array([f[1] for f in fits])
        self.layers = layers = spec.model.num_layers
        self.payload = np.zeros((layers, layers))
        for f in range(1, layers + 1):
            self.payload[f - 1, :f] = np.array(
                [
                    outer_payload_bytes(spec.model, strat, p)
                    for p in fragment_params(spec.model, f, strat.fragment_layout)
                ]
            )
        self.payload_max = self.payload.max(axis=1)
        fixed_h = strat.sync_every if isinstance(strat.sync_every, int) else None
        self.fixed_f = strat.fragments if isinstance(strat.fragments, int) else None
        self.hs = (
            [fixed_h]
            if fixed_h is not None
            else sync_every_candidates(strat.max_sync_every, fragments=self.fixed_f)
        )
        self.fixed_fragment_sync_delay = (
            strat.fragment_sync_delay if isinstance(strat.fragment_sync_delay, int) else None
        )
        self.max_fragment_sync_delay = strat.max_fragment_sync_delay
        target = layers / strat.layers_per_fragment
        self.preference = np.array(
            sorted(range(layers), key=lambda i: fragment_preference(i + 1, target)),
            dtype=np.int64,
        )
        """Fragment counts (as indices F − 1) in the order auto prefers them
        (`shardmeter.sim.settings.fragment_preference`)."""

    def delay_limit(self, sync_every: int) -> int:
        """The largest τ auto may take at H (`StrategySpec.fragment_sync_delay_limit`)."""
        return self.spec.strategy.fragment_sync_delay_limit(sync_every)

    # ---- the link ---------------------------------------------------------------------------
    def link(
        self, used: BoolArray, rails: FloatArray
    ) -> tuple[FloatArray, FloatArray, FloatArray, BoolArray]:
        """(latency, seconds per byte, parallel rails, ok) of each plan's outer all_reduce
        (``rails``: the smallest island's share of node networks)."""
        site = np.where(used, self.site[None, :], -1)
        lo = np.where(used, site, np.iinfo(np.int64).max).min(axis=1)
        multi = site.max(axis=1) != lo
        missing = (used & np.isnan(self.uplink_bw)[None, :]).any(axis=1)
        ok = ~(multi & missing)
        with np.errstate(invalid="ignore", divide="ignore"):
            wan_l = np.max(np.where(used, self.uplink_latency[None, :], -np.inf), axis=1)
            bw = np.where(used, self.uplink_bw[None, :], np.inf)
            bw = np.where(np.isnan(bw), np.inf, bw)
            slowest = np.argmin(bw, axis=1)  # the first slowest uplink, as `wan_link` takes
            rows = np.arange(len(bw))
            wan_spb = 1.0 / (bw[rows, slowest] * self.uplink_efficiency[slowest])
        fab_l = np.where(used, self.fabric_latency[None, :], 0.0).max(axis=1)
        fab_spb = np.where(used, self.fabric_spb[None, :], 0.0).max(axis=1)
        lat = np.where(multi, wan_l, fab_l)
        spb = np.where(multi, wan_spb, fab_spb)
        r = np.where(multi, 1.0, rails).astype(np.float64)
        return (
            np.where(ok, lat, 0.0),
            np.where(ok, spb, 0.0),
            np.where(r > 0, r, 1.0),
            np.asarray(ok),
        )

    # ---- settings ---------------------------------------------------------------------------
    def evaluate(
        self,
        used: BoolArray,
        islands: IntArray,
        rails: FloatArray,
        outer_step_s: FloatArray,
        step_s: FloatArray,
        active: BoolArray | None = None,
    ) -> OuterResult:
        """The outer level of each plan (rows where ``active`` is False are skipped: their
        settings read 1/1/0 with no overhead). ``outer_step_s`` is (plans × fragment counts):
        column F − 1 the plan's outer optimizer steps per outer step with F fragments (the
        slowest island's; `shardmeter.sim.scenario.outer_step_seconds_by_fragments`) — every
        count up to the model's blocks for Streaming DiLoCo, at least F = 1 otherwise."""
        n = len(islands)
        if active is not None and not active.all():
            idx = np.flatnonzero(active)
            part = self.evaluate(
                used[idx], islands[idx], rails[idx], outer_step_s[idx], step_s[idx]
            )
            ones = np.ones(n, dtype=np.int64)
            full = OuterResult(
                ones,
                ones,
                0 * ones,
                np.zeros(n),
                np.ones(n, dtype=bool),
                np.zeros(n),
                np.ones(n, dtype=bool),
            )
            for f in OuterResult.__annotations__:
                getattr(full, f)[idx] = getattr(part, f)
            return full
        if not self.spec.strategy.is_diloco:
            ones = np.ones(n, dtype=np.int64)
            return OuterResult(
                ones,
                ones,
                0 * ones,
                np.zeros(n),
                np.ones(n, dtype=bool),
                np.zeros(n),
                np.ones(n, dtype=bool),
            )
        parts = []
        for a in range(0, max(n, 1), CHUNK):
            b = min(n, a + CHUNK)
            parts.append(
                self._chunk(used[a:b], islands[a:b], rails[a:b], outer_step_s[a:b], step_s[a:b])
            )
        return OuterResult(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in OuterResult.__annotations__)
        )

    def _all_reduce(
        self,
        lat: FloatArray,
        spb: FloatArray,
        rails: FloatArray,
        k: FloatArray,
        payload: FloatArray,
    ) -> FloatArray:
        """Ring all_reduce seconds of ``payload`` bytes (broadcast over trailing axes)."""
        shape = (-1,) + (1,) * payload.ndim
        kk = k.reshape(shape)
        out = (
            2.0
            * (kk - 1)
            * (
                lat.reshape(shape)
                + spb.reshape(shape) * (payload[None] / rails.reshape(shape)) / kk
            )
        )
        return np.asarray(np.where((kk > 1) & (payload[None] > 0), out, 0.0))

    def _chunk(
        self,
        used: BoolArray,
        islands: IntArray,
        rails_in: FloatArray,
        outer_s: FloatArray,
        step: FloatArray,
    ) -> OuterResult:
        n = len(islands)
        lat, spb, rails, ok = self.link(used, rails_in)
        k = islands.astype(np.float64)
        ar_max = self._all_reduce(lat, spb, rails, k, self.payload_max)  # (n, F)
        safe = np.maximum(step, 1e-30)
        if self.spec.strategy.kind is StrategyKind.DILOCO:
            a1 = ar_max[:, 0]
            if len(self.hs) == 1:
                h = np.full(n, self.hs[0], dtype=np.int64)
            else:
                cands = np.array(self.hs)
                fits = a1[:, None] <= BLOCKING_DILOCO_OVERHEAD * cands[None, :] * step[:, None]
                h = np.where(fits.any(axis=1), cands[np.argmax(fits, axis=1)], cands[-1])
            ones = np.ones(n, dtype=np.int64)
            zero = a1 <= BLOCKING_EPSILON_S
            return OuterResult(h, ones, 0 * ones, a1, zero, (a1 + outer_s[:, 0]) / h, ok)
        if outer_s.shape[1] != self.layers:
            raise ValueError(
                f"outer_step_s needs one column per fragment count 1…{self.layers} "
                f"(got {outer_s.shape[1]})"
            )
        # the shortest delay hiding the slowest fragment (T_ar − τ·T ≤ eps), rounding-safe
        ratio = np.minimum((ar_max - BLOCKING_EPSILON_S) / safe[:, None], 1e15)
        fragment_sync_delay_need = np.maximum(np.ceil(ratio), 0).astype(np.int64)
        fragment_sync_delay_need += (
            ar_max - fragment_sync_delay_need * step[:, None] > BLOCKING_EPSILON_S
        ).astype(np.int64)
        h_out = np.zeros(n, dtype=np.int64)
        f_out = np.zeros(n, dtype=np.int64)
        tau_out = np.zeros(n, dtype=np.int64)
        found = np.zeros(n, dtype=bool)
        for hv in self.hs:
            legal, allowed = self._legal(hv)
            # a pinned τ is taken as it is; auto takes the least that hides the all_reduce
            tau_f = (
                np.broadcast_to(allowed, (n, self.layers))
                if self.fixed_fragment_sync_delay is not None
                else fragment_sync_delay_need
            )
            hit_f = legal[None, :] & (fragment_sync_delay_need <= allowed[None, :])
            hit = hit_f.any(axis=1) & ~found
            first = self.preference[np.argmax(hit_f[:, self.preference], axis=1)]
            h_out = np.where(hit, hv, h_out)
            f_out = np.where(hit, first + 1, f_out)
            tau_out = np.where(hit, tau_f[np.arange(n), first], tau_out)
            found |= hit
        blocking = np.zeros(n)
        rows = np.arange(n)
        outer_at = outer_s[rows, np.clip(f_out - 1, 0, self.layers - 1)]
        overhead = np.where(found, outer_at / np.maximum(h_out, 1), 0.0)
        idx = np.flatnonzero(~found)
        if len(idx):
            # blocking cannot be hidden: the settings with the least (blocking + outer) / H,
            # the outer optimizer steps those of each fragment count
            sub = self._all_reduce(lat[idx], spb[idx], rails[idx], k[idx], self.payload)
            m = len(idx)
            outer_idx = outer_s[idx]
            best = np.full(m, np.inf)
            bh = np.zeros(m, dtype=np.int64)
            bf = np.zeros(m, dtype=np.int64)
            bt = np.zeros(m, dtype=np.int64)
            bb = np.zeros(m)
            for hv in self.hs:
                legal, fragment_sync_delays = self._legal(hv)
                if not legal.any():
                    continue
                blk = np.maximum(
                    sub - fragment_sync_delays[None, :, None] * step[idx][:, None, None], 0.0
                )
                blk = np.where(self.payload[None, :, :] > 0, blk, 0.0).sum(axis=2)
                blk = np.where(legal[None, :], blk, np.inf)
                total = blk + outer_idx
                # first minimum in preference order → the preferred fragments
                fi = self.preference[np.argmin(total[:, self.preference], axis=1)]
                b = blk[np.arange(m), fi]
                cost = total[np.arange(m), fi] / hv
                better = cost < best
                best = np.where(better, cost, best)
                bh = np.where(better, hv, bh)
                bf = np.where(better, fi + 1, bf)
                bt = np.where(better, fragment_sync_delays[fi], bt)
                bb = np.where(better, b, bb)
            h_out[idx], f_out[idx], tau_out[idx], blocking[idx] = bh, bf, bt, bb
            overhead[idx] = best
        return OuterResult(h_out, f_out, tau_out, blocking, found, overhead, ok)

    # ---- bounds -----------------------------------------------------------------------------
    def _link_extremes(self) -> tuple[float, float, float, float]:
        """(least, largest) latency and (least, largest) seconds per byte over every outer
        path a plan can take (the WAN uplinks, each pool's fabric)."""
        lats = np.concatenate([self.uplink_latency, self.fabric_latency])
        lats = lats[np.isfinite(lats)]
        ok = np.isfinite(self.uplink_bw)
        wan_spb = 1.0 / (self.uplink_bw[ok] * self.uplink_efficiency[ok])
        spbs = np.concatenate([wan_spb, self.fabric_spb])
        return float(lats.min()), float(lats.max()), float(spbs.min()), float(spbs.max())

    def _worst_all_reduce(self, max_islands: int, min_rails: float) -> FloatArray:
        """Per fragment count (F − 1): the largest fragment's all_reduce on the worst outer
        link (largest latency and seconds per byte, ``max_islands`` islands, the fewest rails
        ``min_rails``): at least any plan's of at most ``max_islands`` islands."""
        _, lat, _, spb = self._link_extremes()
        k = np.full(1, float(max_islands))
        rails = np.full(1, min(1.0, min_rails))
        ar = self._all_reduce(np.full(1, lat), np.full(1, spb), rails, k, self.payload_max)
        return np.asarray(ar[0])

    def _legal(self, hv: int) -> tuple[BoolArray, IntArray]:
        """Per fragment count at H = ``hv``: whether the rule may take it (torchft's H % F, a
        pinned F, a pinned τ below H/F) and the longest delay it may take there (the pinned
        τ, else min(H/F − 1, the guard-rail)): the one rule `_chunk`'s passes and the bounds use."""
        fcount = np.arange(1, self.layers + 1)
        legal = hv % fcount == 0
        if self.fixed_f is not None:
            legal &= fcount == self.fixed_f
        window = hv // fcount
        if self.fixed_fragment_sync_delay is not None:
            legal &= self.fixed_fragment_sync_delay < window
            allowed = np.full(self.layers, self.fixed_fragment_sync_delay, dtype=np.int64)
        else:
            allowed = np.minimum(window - 1, self.delay_limit(hv)).astype(np.int64)
        return legal & (allowed >= 0), allowed

    def delay_floors(self, max_islands: int, min_rails: float, max_rails: float) -> DelayFloors:
        """The least fragmentSyncDelay τ the rule gives a plan of two islands or more at each
        syncEvery H (`DelayFloors`), for plans of at most ``max_islands`` islands whose
        smallest island fills between ``min_rails`` and ``max_rails`` node networks.

        Streaming DiLoCo, τ auto: where the outer all_reduce is hidden (`_chunk`'s first
        pass) the rule takes a fragment count's shortest hiding delay, which is at least 1
        when two islands' all_reduce on the best link (least latency and seconds per byte,
        most rails) exceeds `BLOCKING_EPSILON_S` — so only an H with a legal F that allows
        that delay; where it is not hidden (the second pass) min(H/F − 1, the guard-rail) for
        a legal F. A pinned τ is every plan's τ. Every plan whose inner step T exceeds
        ``hidden_above_s`` is hidden: the worst link's need (over-estimated by one, as in
        `sync_every_upper`), T_ar/T + 1, fits the delay some legal H and F allow when
        T > T_ar / that delay. Blocking DiLoCo: τ = 0 at every H, nothing taken as hidden."""
        hs = [int(h) for h in self.hs]
        if self.spec.strategy.kind is not StrategyKind.STREAMING_DILOCO:
            zeros = dict.fromkeys(hs, 0)
            return DelayFloors(zeros, zeros, math.inf)
        lat, _, spb, _ = self._link_extremes()
        rails = np.full(1, max(1.0, max_rails))
        two = np.full(1, 2.0)
        best = self._all_reduce(np.full(1, lat), np.full(1, spb), rails, two, self.payload_max)[0]
        need = np.where(best > BLOCKING_EPSILON_S, 1, 0)
        if self.fixed_fragment_sync_delay is not None:
            need = np.full(self.layers, self.fixed_fragment_sync_delay)
        worst = self._worst_all_reduce(max_islands, min_rails)
        any_plan: dict[int, int] = {}
        hidden: dict[int, int] = {}
        above = math.inf
        for hv in hs:
            legal, allowed = self._legal(hv)
            if not legal.any():
                continue
            least = int(allowed[legal].min())
            fits = legal & (need <= allowed)
            if fits.any():
                hidden[hv] = int(need[fits].min())
                least = min(least, hidden[hv])
            any_plan[hv] = least
            reach = legal & (allowed >= 1)
            if reach.any():
                above = min(above, float((worst[reach] / allowed[reach]).min()))
        return DelayFloors(any_plan, hidden, above * (1 + 1e-9) if hidden else math.inf)

    def sync_every_upper(
        self, step_lb: FloatArray, max_islands: int, min_rails: float = 1.0
    ) -> FloatArray:
        """An upper bound on the ``sync_every`` the rule picks for any plan of at most
        ``max_islands`` islands whose inner step is at least ``step_lb``: the zero-blocking H
        of the worst outer link (largest latency and seconds per byte, fewest rails
        ``min_rails``) (a plan with a faster all_reduce or a longer step is zero-blocking at
        that H too, and the rule takes the smallest such H); the largest candidate where even
        that blocks."""
        n = len(step_lb)
        h_max = float(max(self.hs))
        if not self.spec.strategy.is_diloco:
            return np.ones(n)
        ar = self._worst_all_reduce(max_islands, min_rails)  # (F,)
        step = np.maximum(step_lb, 1e-30)
        if self.spec.strategy.kind is StrategyKind.DILOCO:
            out = np.full(n, h_max)
            for hv in sorted(self.hs, reverse=True):
                out = np.where(ar[0] <= BLOCKING_DILOCO_OVERHEAD * hv * step, hv, out)
            return out
        # at least the delay the worst link needs (over-estimated by one: rounding-safe)
        fragment_sync_delay_need = (
            np.floor(np.minimum(ar[None, :] / step[:, None], 1e15)).astype(np.int64) + 1
        )
        out = np.full(n, h_max)
        for hv in sorted(self.hs, reverse=True):
            legal, allowed = self._legal(hv)
            ok = legal[None, :] & (fragment_sync_delay_need <= allowed[None, :])
            out = np.where(ok.any(axis=1), hv, out)
        return out
