"""Vectorised evaluation of candidate plans (one option or none per pool).

For every candidate, all in numpy at once:

1. **Balance.** The plan's inner step time T* is the smallest step time at which the islands
   together reach the global batch B: each pool contributes k × (the most sequences one
   island can do within T*), from its shape's Pareto list. T* is found by binary search
   over the sorted step times of all configurations. This is the exact min-max apportioning
   the paper approximates by proportional allocation plus refinement.
2. **Trim.** Pools are then lowered, in pool order, to the smallest configuration that still
   covers B, so the global batch lands as close above B as the islands' granularity allows;
   the result must be ≤ B·(1 + tolerance). The slowest island still takes exactly T*.
3. **Outer step.** For DiLoCo strategies the outer all_reduce path (WAN across sites, the
   fabric inside one) gives each fragment's all_reduce time; the settings follow
   `shardmeter.sim.settings` in closed form (smallest zero-blocking H, fewest fragments,
   shortest delay; user-fixed values honoured). Per inner step this adds
   (blocking + outer optimizer step) / H.
4. **Score.** tokens/s = the requested global batch B per effective step (the overshoot the
   islands' granularity forces is reported, not rewarded), wall-clock for the total tokens,
   cost = GPUs × price × hours, MFU of the useful tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardmeter.cost.coefficients import LinkRole
from shardmeter.cost.priors import LINK_EFFICIENCY
from shardmeter.plan.options import OptionTable, PoolContext
from shardmeter.plan.schema import PlanSpec
from shardmeter.sim.diloco import fragment_params
from shardmeter.sim.settings import (
    BLOCKING_DILOCO_OVERHEAD,
    SYNC_EVERY_CANDIDATES,
    ZERO_BLOCKING_EPS_S,
)
from shardmeter.spec.training import StrategyKind

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# infeasibility codes
OK, BATCH_UNREACHABLE, BATCH_OVERSHOOT, NO_WAN_UPLINK, EMPTY = 0, 1, 2, 3, 4
REASONS = {
    BATCH_UNREACHABLE: "the islands cannot reach the global batch",
    BATCH_OVERSHOOT: "the islands' batch granularity overshoots the global batch tolerance",
    NO_WAN_UPLINK: "the plan spans sites but a pool has no wanUplink",
    EMPTY: "no islands",
}


@dataclass
class Evaluation:
    """Per-candidate results (arrays of equal length)."""

    choice: IntArray
    """(candidates × pools) option index into the OptionTable, −1 for none."""
    status: IntArray
    step_s: FloatArray
    """Inner step time T* (the slowest island)."""
    effective_step_s: FloatArray
    """T* plus outer-step overhead per inner step."""
    sequences: IntArray
    """Global batch actually used, in sequences."""
    config_pos: IntArray
    """(candidates × pools) index of each pool's configuration in the flat Pareto arrays."""
    islands: IntArray
    gpus: IntArray
    nodes: IntArray
    usd_per_hour: FloatArray
    tokens_per_s: FloatArray
    time_s: FloatArray
    cost_usd: FloatArray
    mfu: FloatArray
    sync_every: IntArray
    fragments: IntArray
    delay: IntArray
    blocking_s: FloatArray
    """Outer-step blocking per outer step (closed form)."""
    zero_blocking: BoolArray

    @property
    def feasible(self) -> BoolArray:
        return np.asarray(self.status == OK)

    def subset(self, mask: BoolArray | IntArray) -> Evaluation:
        return Evaluation(**{k: v[mask] for k, v in self.__dict__.items()})

    @staticmethod
    def concat(parts: Sequence[Evaluation]) -> Evaluation:
        keys = parts[0].__dict__.keys()
        return Evaluation(**{k: np.concatenate([getattr(p, k) for p in parts]) for k in keys})

    def __len__(self) -> int:
        return len(self.status)


class Evaluator:
    """Scores candidate plans for one planning request (see the module docstring)."""

    def __init__(self, spec: PlanSpec, contexts: Sequence[PoolContext], table: OptionTable) -> None:
        self.spec = spec
        self.contexts = list(contexts)
        self.table = t = table
        self.n_pools = len(contexts)
        tr = spec.training
        self.batch = tr.global_batch_sequences
        self.limit = int(
            np.floor(self.batch * (1 + spec.constraints.global_batch_tolerance) + 1e-9)
        )
        self.seq_len = tr.seq_len_tokens
        self.total_sequences = tr.total_tokens / tr.seq_len_tokens
        self.flops_per_sequence = (
            spec.model.training_flops_per_token(tr.seq_len_tokens) * tr.seq_len_tokens
        )
        # grid of all step times, and the Pareto lists as globally sorted keys
        self.grid = np.unique(t.flat_step_s)
        seg_of_flat = np.repeat(np.arange(len(t.seg_start)), t.seg_len)
        self._rank = np.searchsorted(self.grid, t.flat_step_s)
        self._g = len(self.grid)
        self._time_keys = seg_of_flat * self._g + self._rank
        self._m = int(t.flat_sequences.max(initial=0)) + 2
        self._seq_keys = seg_of_flat * self._m + t.flat_sequences
        # pool-level arrays for the outer link
        pools = [c.pool for c in contexts]
        sites = sorted({p.site for p in pools})
        self.site = np.array([sites.index(p.site) for p in pools], dtype=np.int64)
        self.uplink_latency = np.array(
            [p.wan_uplink.latency_s if p.wan_uplink else np.nan for p in pools]
        )
        self.uplink_bw = np.array(
            [p.wan_uplink.bandwidth_bytes_per_s if p.wan_uplink else np.nan for p in pools]
        )
        fabric = [
            c.cost_model.coefficients.communication[LinkRole.INTER_NODE]["all_reduce"]
            for c in contexts
        ]
        self.fabric_latency = np.array([f.latency_s for f in fabric])
        # node networks an island fills = its GPUs ÷ GPUs per node (see sim/outer.py)
        self.gpus_per_node = np.array([p.gpus_per_node for p in pools], dtype=np.float64)
        self.fabric_spb = np.array([f.seconds_per_byte for f in fabric])
        # fragment payloads for every fragment count (max and all)
        strat = spec.strategy
        self.layers = spec.model.num_layers
        self.payload = np.zeros((self.layers, self.layers))
        for f in range(1, self.layers + 1):
            self.payload[f - 1, :f] = (
                np.array(fragment_params(spec.model, f, strat.fragment_layout))
                * strat.outer_precision.bytes
            )

    # ---- step 1 and 2: balance and trim -----------------------------------------------------
    def _cap_at(
        self, seg: IntArray, islands: IntArray, rank: IntArray
    ) -> tuple[IntArray, IntArray]:
        """Sequences k islands of segment ``seg`` do within grid rank ``rank`` (0 if none) and
        the flat position of that configuration (−1 if none)."""
        t = self.table
        pos = np.searchsorted(self._time_keys, seg * self._g + rank, side="right") - 1
        ok = pos >= t.seg_start[seg]
        pos = np.where(ok, pos, -1)
        return np.where(ok, islands * t.flat_sequences[np.maximum(pos, 0)], 0), pos

    def evaluate(self, choice: IntArray) -> Evaluation:
        t = self.table
        n = choice.shape[0]
        used = choice >= 0
        opt = np.where(used, choice, 0)
        seg = t.segment[opt]
        k = np.where(used, t.islands[opt], 0)
        islands = k.sum(axis=1)
        gpus = np.where(used, t.gpus[opt], 0).sum(axis=1)
        nodes = np.where(used, t.nodes[opt], 0).sum(axis=1)
        rate = np.where(used, t.usd_per_hour[opt], 0.0).sum(axis=1)
        status = np.where(islands > 0, OK, EMPTY)
        # lower end of the search: every used pool must run at least its smallest config
        first_rank = np.where(used, self._rank[t.seg_start[seg]], 0).max(axis=1)
        lo = first_rank.copy()
        hi = np.full(n, self._g - 1)

        def total(rank: IntArray) -> IntArray:
            s = np.zeros(n, dtype=np.int64)
            for p in range(self.n_pools):
                cap, _ = self._cap_at(seg[:, p], k[:, p], rank)
                s += np.where(used[:, p], cap, 0)
            return s

        reachable = total(hi) >= self.batch
        status = np.where((status == OK) & ~reachable, BATCH_UNREACHABLE, status)
        while True:
            active = lo < hi
            if not active.any():
                break
            mid = (lo + hi) // 2
            enough = total(mid) >= self.batch
            hi = np.where(active & enough, mid, hi)
            lo = np.where(active & ~enough, mid + 1, lo)
        rank = lo
        # trim, pool by pool
        caps = np.zeros((n, self.n_pools), dtype=np.int64)
        pos = np.full((n, self.n_pools), -1, dtype=np.int64)
        for p in range(self.n_pools):
            caps[:, p], pos[:, p] = self._cap_at(seg[:, p], k[:, p], rank)
        caps = np.where(used, caps, 0)
        s = caps.sum(axis=1)
        for p in range(self.n_pools):
            others = s - caps[:, p]
            need = np.maximum(self.batch - others, 1)
            kk = np.maximum(k[:, p], 1)
            per_island = -(-need // kk)
            q = np.searchsorted(self._seq_keys, seg[:, p] * self._m + per_island, side="left")
            q = np.minimum(q, np.maximum(pos[:, p], t.seg_start[seg[:, p]]))
            q = np.maximum(q, t.seg_start[seg[:, p]])
            new = k[:, p] * t.flat_sequences[q]
            take = used[:, p] & (pos[:, p] >= 0)
            caps[:, p] = np.where(take, new, caps[:, p])
            pos[:, p] = np.where(take, q, pos[:, p])
            s = caps.sum(axis=1)
        status = np.where((status == OK) & (s > self.limit), BATCH_OVERSHOOT, status)
        step = np.where(used & (pos >= 0), t.flat_step_s[np.maximum(pos, 0)], 0.0).max(axis=1)
        # step 3: DiLoCo outer level
        h, f, tau, blocking, zero, overhead, link_ok = self._outer(choice, used, opt, islands, step)
        status = np.where((status == OK) & ~link_ok, NO_WAN_UPLINK, status)
        eff = step + overhead
        with np.errstate(divide="ignore", invalid="ignore"):
            # throughput counts the requested global batch: tokens above it (up to the
            # tolerance, forced by the islands' granularity) are not rewarded
            seq_per_s = np.where(eff > 0, self.batch / eff, 0.0)
            time_s = np.where(seq_per_s > 0, self.total_sequences / seq_per_s, np.inf)
            peak = np.where(used, t.peak_flops[opt], 0.0).sum(axis=1)
            mfu = np.where(peak > 0, seq_per_s * self.flops_per_sequence / peak, 0.0)
        return Evaluation(
            choice=choice,
            status=status.astype(np.int64),
            step_s=step,
            effective_step_s=eff,
            sequences=s,
            config_pos=pos,
            islands=islands,
            gpus=gpus,
            nodes=nodes,
            usd_per_hour=rate,
            tokens_per_s=seq_per_s * self.seq_len,
            time_s=time_s,
            cost_usd=rate * time_s / 3600.0,
            mfu=mfu,
            sync_every=h,
            fragments=f,
            delay=tau,
            blocking_s=blocking,
            zero_blocking=zero,
        )

    # ---- step 3: the outer level ------------------------------------------------------------
    def _outer(
        self, choice: IntArray, used: BoolArray, opt: IntArray, islands: IntArray, step: FloatArray
    ) -> tuple[IntArray, IntArray, IntArray, FloatArray, BoolArray, FloatArray, BoolArray]:
        n = choice.shape[0]
        strat = self.spec.strategy
        ones = np.ones(n, dtype=np.int64)
        if not strat.is_diloco:
            return (
                ones,
                ones,
                0 * ones,
                np.zeros(n),
                np.ones(n, dtype=bool),
                np.zeros(n),
                np.ones(n, dtype=bool),
            )
        t = self.table
        pool_cols = np.arange(self.n_pools)
        site = np.where(used, self.site[pool_cols][None, :], -1)
        smin = np.where(used, site, np.iinfo(np.int64).max).min(axis=1)
        multi_site = np.where(used, site, -1).max(axis=1) != smin
        up_lat = np.where(used, self.uplink_latency[None, :], np.nan)
        up_bw = np.where(used, self.uplink_bw[None, :], np.nan)
        missing = (used & np.isnan(self.uplink_bw)[None, :]).any(axis=1)
        link_ok = ~(multi_site & missing)
        with np.errstate(invalid="ignore", divide="ignore"):
            wan_l = np.nanmax(np.where(used, up_lat, -np.inf), axis=1)
            wan_spb = 1.0 / (np.nanmin(np.where(used, up_bw, np.inf), axis=1) * LINK_EFFICIENCY)
        fab_l = np.where(used, self.fabric_latency[None, :], 0.0).max(axis=1)
        fab_spb = np.where(used, self.fabric_spb[None, :], 0.0).max(axis=1)
        rails = np.where(used, t.ranks[opt] / self.gpus_per_node[None, :], np.inf).min(axis=1)
        lat = np.where(multi_site, wan_l, fab_l)
        spb = np.where(multi_site, wan_spb, fab_spb)
        rails = np.where(multi_site, 1, rails).astype(np.float64)
        lat = np.where(link_ok, lat, 0.0)
        spb = np.where(link_ok, spb, 0.0)
        p = islands.astype(np.float64)

        def all_reduce(rows: IntArray | slice, payload: FloatArray) -> FloatArray:
            """All_reduce seconds of ``payload`` bytes for the candidates ``rows``
            (payload broadcast against trailing axes)."""
            pr = p[rows]
            shape = (-1,) + (1,) * (payload.ndim)
            out = (
                2.0
                * (pr - 1).reshape(shape)
                * (
                    lat[rows].reshape(shape)
                    + spb[rows].reshape(shape)
                    * payload[None]
                    / (rails[rows] * np.maximum(pr, 1)).reshape(shape)
                )
            )
            return np.asarray(np.where((pr > 1).reshape(shape) & (payload[None] > 0), out, 0.0))

        # the slowest fragment's all_reduce for every fragment count: (n, F); the all_reduce
        # is monotone in the payload, so the largest fragment is the slowest
        ar_max = all_reduce(slice(None), self.payload.max(axis=1))
        outer = np.where(used, t.outer_step_s[opt], 0.0).max(axis=1)
        fcount = np.arange(1, self.layers + 1)
        safe_step = np.maximum(step, 1e-30)
        # the shortest delay that hides the slowest fragment: the same test as the scalar
        # search (T_ar − τ·T ≤ 1e-12), corrected for rounding in the division
        tau_needed = np.maximum(
            np.ceil((ar_max - ZERO_BLOCKING_EPS_S) / safe_step[:, None]), 0
        ).astype(np.int64)
        tau_needed += (ar_max - tau_needed * step[:, None] > ZERO_BLOCKING_EPS_S).astype(np.int64)

        fixed_h = strat.sync_every if isinstance(strat.sync_every, int) else None
        if strat.kind is StrategyKind.DILOCO:
            a1 = ar_max[:, 0]
            if fixed_h is not None:
                h = np.full(n, fixed_h, dtype=np.int64)
            else:
                cands = np.array(sorted(SYNC_EVERY_CANDIDATES))
                ok = a1[:, None] <= BLOCKING_DILOCO_OVERHEAD * cands[None, :] * step[:, None]
                h = np.where(ok.any(axis=1), cands[np.argmax(ok, axis=1)], cands[-1])
            blocking = a1
            zero = a1 <= ZERO_BLOCKING_EPS_S
            return (h, ones, 0 * ones, blocking, zero, (blocking + outer) / h, link_ok)

        fixed_f = strat.fragments if isinstance(strat.fragments, int) else None
        fixed_tau = (
            strat.fragment_sync_delay if isinstance(strat.fragment_sync_delay, int) else None
        )
        hs = [fixed_h] if fixed_h is not None else sorted(SYNC_EVERY_CANDIDATES)
        h_out = np.zeros(n, dtype=np.int64)
        f_out = np.zeros(n, dtype=np.int64)
        tau_out = np.zeros(n, dtype=np.int64)
        found = np.zeros(n, dtype=bool)
        for hv in hs:
            legal = (hv % fcount == 0) & (fcount <= self.layers)
            if fixed_f is not None:
                legal &= fcount == fixed_f
            window = hv // fcount
            if fixed_tau is not None:
                legal &= fixed_tau < window
                tau_f = np.broadcast_to(np.full(self.layers, fixed_tau), (n, self.layers))
                ok = legal[None, :] & (tau_needed <= fixed_tau)
            else:
                tau_f = tau_needed
                ok = legal[None, :] & (tau_needed <= window[None, :] - 1)
            hit = ok.any(axis=1) & ~found
            first = np.argmax(ok, axis=1)
            h_out = np.where(hit, hv, h_out)
            f_out = np.where(hit, first + 1, f_out)
            tau_out = np.where(hit, tau_f[np.arange(n), first], tau_out)
            found |= hit
        blocking = np.zeros(n)
        if not found.all():
            # least blocking at the largest allowed H: for each legal F the longest delay
            # (or the fixed one); ties → fewer fragments, shorter delay
            hv = hs[-1]
            legal = hv % fcount == 0
            if fixed_f is not None:
                legal &= fcount == fixed_f
            window = hv // fcount
            taus = np.full(self.layers, fixed_tau) if fixed_tau is not None else window - 1
            legal &= taus < window
            idx = np.flatnonzero(~found)
            sub = all_reduce(idx, self.payload)  # (m, F, j): every fragment, for the few that block
            blk = np.maximum(sub - (taus[None, :, None] * step[idx][:, None, None]), 0.0)
            blk = np.where(self.payload[None, :, :] > 0, blk, 0.0).sum(axis=2)
            blk = np.where(legal[None, :], blk, np.inf)
            best = np.argmin(blk, axis=1)  # first minimum → fewest fragments
            h_out[idx] = hv
            f_out[idx] = best + 1
            tau_out[idx] = taus[best]
            blocking[idx] = blk[np.arange(len(idx)), best]
        overhead = (blocking + outer) / np.maximum(h_out, 1)
        return h_out, f_out, tau_out, blocking, found, overhead, link_ok
