"""An independent, slow reference for the optimizer. It shares no search, apportioning or
settings-vectorisation code with ``shardmeter.plan``: it enumerates, with plain loops,

* every island shape N × G of every pool (G dividing the GPUs per node, no dominance rule;
  with ``sharding: hsdp`` only N that are whole shard groups, N % shardGroupNodes == 0 —
  torchtitan cannot run the others),
* every micro-batch b from 1 to the memory maximum and every accumulation A while one island
  stays within the batch limit (in both gradient-sync modes with ``gradientSync: auto``),
  each step time from a full FSDP simulation (no linearity shortcut),
* every layout (k islands of one shape per pool, or none) within the island and GPU limits,
* every combination of the pools' configurations, keeping those whose sequences add up to
  [B, L] (with ``runtime: torchtitan-ft`` only those where every island processes the same),

and scores each plan with the model's own single-plan pieces: the outer all_reduce path
(`shardmeter.sim.outer`), each fragment's all_reduce (`fragment_all_reduce_seconds`), the
scalar Streaming DiLoCo settings rule (`shardmeter.sim.settings`), the outer optimizer steps
as one `CostModel.outer_step_seconds` call per fragment (summed over the fragments), and the
cost layer's
rules for a plan's footprint — GPU power (`shardmeter.cost.energy`), DiLoCo's quality
(`shardmeter.cost.quality`) and WAN egress (`shardmeter.cost.egress`) — with its own billing
(whole nodes with ``exclusiveNodes``) and its own pool utilisation (the first island shape,
fewest GPUs then nodes, at its first fitting gradient-sync mode, largest micro-batch within the
batch limit, no accumulation). A layout's figures are those of its fastest plan (ties: the
fewest sequences); ranked figures are × the equivalent-token factor when the objective is
quality-adjusted; a CO₂ budget drops the layouts above it; the frontier uses the same tie rule
as the optimizer (ranked time, ranked cost, nodes, islands)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from shardmeter.cost.egress import run_egress, site_egress_usd_per_gb
from shardmeter.cost.energy import co2_kg, facility_kwh, islands_facility_watts
from shardmeter.cost.model import CostModel
from shardmeter.cost.quality_law import equivalent_token_factor
from shardmeter.plan.schema import PlanPool, PlanSpec
from shardmeter.sim.diloco import fragment_params
from shardmeter.sim.fsdp import FSDPDurations, simulate_fsdp_step
from shardmeter.sim.outer import IslandPlacement, outer_link
from shardmeter.sim.scenario import IslandShape, fragment_all_reduce_seconds, outer_payload_bytes
from shardmeter.sim.settings import choose_blocking_sync_every, choose_sync_every, search_settings
from shardmeter.spec.training import GradientSync, Sharding, StrategyKind


@dataclass(frozen=True)
class Ref:
    layout: tuple[tuple[str, int, int, int], ...]
    """(pool, islands, nodes, GPUs per node) per used pool, in pool order."""
    time_s: float
    cost_usd: float
    """GPU cost plus egress."""
    step_s: float
    sequences: int
    nodes: int
    islands: int
    tie: tuple[tuple[int, int, int, int], ...]
    """Per pool in order: (0, islands, nodes, GPUs per node) if used, else (1, 0, 0, 0)."""
    energy_kwh: float = 0.0
    co2_kg: float = 0.0
    egress_usd: float = 0.0
    factor: float = 1.0
    """The equivalent-token factor; ranked figures are × ``rank``."""
    rank: float = 1.0

    @property
    def rank_time_s(self) -> float:
        return self.time_s * self.rank

    @property
    def rank_cost_usd(self) -> float:
        return self.cost_usd * self.rank

    @property
    def rank_energy_kwh(self) -> float:
        return self.energy_kwh * self.rank

    @property
    def rank_co2_kg(self) -> float:
        return self.co2_kg * self.rank


@dataclass(frozen=True)
class Config:
    micro_batch: int
    accumulation: int
    sequences: int
    """Per island and inner step."""
    step_s: float


@dataclass(frozen=True)
class Option:
    pool: PlanPool
    cm: CostModel
    shape: IslandShape
    islands: int
    configs: tuple[Config, ...]


def _configs(
    cm: CostModel, shape: IslandShape, limit: int, on_gpu: bool, spec: PlanSpec
) -> tuple[Config, ...]:
    r, g = shape.ranks, shape.gpus_per_node
    mode = spec.training.gradient_sync
    modes = (
        [GradientSync.EVERY_MICRO_BATCH, GradientSync.LAST_MICRO_BATCH]
        if mode is GradientSync.AUTO
        else [mode]
    )
    out = []
    for sync in modes:
        b1 = cm.max_micro_batch(r, 1, on_gpu, gradient_sync=sync, gpus_per_node=g)
        b_acc = cm.max_micro_batch(r, 2, on_gpu, gradient_sync=sync, gpus_per_node=g)
        for b in range(1, b1 + 1):
            if b * r > limit:
                break
            d = FSDPDurations.from_cost_model(cm, shape.nodes, shape.gpus_per_node, b)
            a = 1
            while a * b * r <= limit and (a == 1 or b <= b_acc):
                out.append(
                    Config(b, a, a * b * r, simulate_fsdp_step(d, a, gradient_sync=sync).step_s)
                )
                a += 1
    return tuple(out)


def _options(spec: PlanSpec, limit: int, kmax: int) -> list[list[Option | None]]:
    c = spec.constraints
    on_gpu = spec.strategy.outer_state_on_gpu and spec.strategy.is_diloco
    t = spec.training
    group = t.shard_group_nodes if t.sharding is Sharding.HSDP else 1
    per_pool: list[list[Option | None]] = []
    for pool in spec.usable_pools():
        cm = CostModel(spec.model, spec.training, pool)
        nodes = pool.nodes if pool.max_nodes is None else min(pool.nodes, pool.max_nodes)
        options: list[Option | None] = [None]
        for g in range(1, pool.gpus_per_node + 1):
            if pool.gpus_per_node % g:
                continue
            for n in range(1, nodes + 1):
                if n % group:
                    continue  # not whole hsdp shard groups
                r = n * g
                if r < c.min_gpus_per_island:
                    continue
                if c.max_gpus_per_island is not None and r > c.max_gpus_per_island:
                    continue
                shape = IslandShape(n, g)
                configs = _configs(cm, shape, limit, on_gpu, spec)
                if not configs:
                    continue
                for k in range(1, kmax + 1):
                    if k * n > nodes or (c.max_gpus is not None and k * r > c.max_gpus):
                        break
                    options.append(Option(pool, cm, shape, k, configs))
        per_pool.append(options)
    return per_pool


def _utilisation(spec: PlanSpec, pool: PlanPool, cm: CostModel, limit: int) -> float:
    """The pool's utilisation for power: its first island shape (fewest GPUs, then nodes)
    that can run, at its first fitting gradient-sync mode's largest micro-batch within the
    batch limit, without accumulation — compute busy ÷ step."""
    c = spec.constraints
    on_gpu = spec.strategy.outer_state_on_gpu and spec.strategy.is_diloco
    t = spec.training
    group = t.shard_group_nodes if t.sharding is Sharding.HSDP else 1
    nodes = pool.nodes if pool.max_nodes is None else min(pool.nodes, pool.max_nodes)
    shapes = []
    for g in range(1, pool.gpus_per_node + 1):
        for n in range(1, nodes + 1):
            r = n * g
            if pool.gpus_per_node % g or n % group or r < c.min_gpus_per_island:
                continue
            if c.max_gpus_per_island is not None and r > c.max_gpus_per_island:
                continue
            if c.max_gpus is not None and r > c.max_gpus:
                continue
            shapes.append((r, n, g))
    modes = (
        [GradientSync.EVERY_MICRO_BATCH, GradientSync.LAST_MICRO_BATCH]
        if t.gradient_sync is GradientSync.AUTO
        else [t.gradient_sync]
    )
    for r, n, g in sorted(shapes):
        for sync in modes:
            b1 = cm.max_micro_batch(r, 1, on_gpu, gradient_sync=sync, gpus_per_node=g)
            b = min(b1, limit // r)
            if b >= 1:
                d = FSDPDurations.from_cost_model(cm, n, g, b)
                step = simulate_fsdp_step(d, 1, gradient_sync=sync)
                return step.compute_busy_s / step.step_s
    return 1.0


def _rails(spec: PlanSpec) -> dict[str, float | int]:
    strat = spec.strategy
    return {
        "max_fragment_sync_delay": strat.max_fragment_sync_delay,
        "max_fragment_sync_delay_fraction": strat.max_fragment_sync_delay_fraction,
        "target_fragments": spec.model.num_layers / strat.layers_per_fragment,
    }


def _outer_overhead(spec: PlanSpec, used: list[Option], step_s: float) -> tuple[float, int, int]:
    """Seconds the outer level adds per inner step (inf where no settings are legal), and the
    syncEvery and fragmentSyncDelay the rule picks (1 and 0 for FSDP)."""
    strat = spec.strategy
    if not strat.is_diloco:
        return 0.0, 1, 0
    placements = [IslandPlacement(o.cm, o.shape.ranks) for o in used for _ in range(o.islands)]
    link = outer_link(placements)
    k = len(placements)

    def outer_s(f: int) -> float:
        """The slowest island's outer optimizer steps with F fragments: one call per fragment
        (its own sum, not the optimizer's table)."""
        return max(
            sum(
                o.cm.outer_step_seconds(
                    p, o.shape.ranks, strat.outer_state_on_gpu, strat.outer_precision
                )
                for p in fragment_params(spec.model, f, strat.fragment_layout)
            )
            for o in used
        )

    def all_reduce(f: int) -> list[float]:
        return fragment_all_reduce_seconds(spec.model, strat, link, k, f)

    fixed_h = strat.sync_every if isinstance(strat.sync_every, int) else None
    if strat.kind is StrategyKind.DILOCO:
        ar = all_reduce(1)[0]
        h = fixed_h or choose_blocking_sync_every(step_s, ar, max_sync_every=strat.max_sync_every)
        return (ar + outer_s(1)) / h, h, 0
    fixed_f = strat.fragments if isinstance(strat.fragments, int) else None
    fixed_fragment_sync_delay = (
        strat.fragment_sync_delay if isinstance(strat.fragment_sync_delay, int) else None
    )
    rails = _rails(spec)
    try:
        if fixed_h is not None:
            choice = search_settings(
                fixed_h,
                step_s,
                all_reduce,
                spec.model.num_layers,
                fixed_f,
                fixed_fragment_sync_delay,
                max_fragment_sync_delay=strat.max_fragment_sync_delay,
                max_fragment_sync_delay_fraction=strat.max_fragment_sync_delay_fraction,
                target_fragments=float(rails["target_fragments"]),
                outer_step_s=outer_s,
            )
        else:
            choice = choose_sync_every(
                step_s,
                all_reduce,
                spec.model.num_layers,
                fixed_f,
                fixed_fragment_sync_delay,
                max_sync_every=strat.max_sync_every,
                max_fragment_sync_delay=strat.max_fragment_sync_delay,
                outer_step_s=outer_s,
                max_fragment_sync_delay_fraction=strat.max_fragment_sync_delay_fraction,
                target_fragments=float(rails["target_fragments"]),
            )
    except ValueError:
        return math.inf, 1, 0
    return (
        (choice.blocking_s_per_outer_step + outer_s(choice.fragments)) / choice.sync_every,
        choice.sync_every,
        choice.fragment_sync_delay,
    )


def _combos(used: list[Option], lo: int, hi: int, equal: bool) -> list[tuple[float, int]]:
    """(T, sequences) of every configuration combination that meets [lo, hi]."""
    out = []
    if equal:
        for q in range(1, hi + 1):
            per = []
            for o in used:
                ts = [c.step_s for c in o.configs if c.sequences == q]
                per.append(ts)
            total = q * sum(o.islands for o in used)
            if lo <= total <= hi and all(per):
                for ts in itertools.product(*per):
                    out.append((max(ts), total))
        return out

    def walk(i: int, total: int, worst: float) -> None:
        if i == len(used):
            if lo <= total <= hi:
                out.append((worst, total))
            return
        o = used[i]
        for c in o.configs:
            s = total + o.islands * c.sequences
            if s <= hi:
                walk(i + 1, s, max(worst, c.step_s))

    walk(0, 0, 0.0)
    return out


def _islands_cap(spec: PlanSpec) -> int:
    if spec.strategy.kind is StrategyKind.FSDP:
        return 1
    c = spec.constraints.max_islands
    strat = spec.strategy
    return min(c, strat.max_measured_islands) if strat.beyond_measured_islands.value == "cap" else c


def brute_force(spec: PlanSpec) -> list[Ref]:
    """Every feasible layout with the figures of its best plan."""
    t = spec.training
    strat = spec.strategy
    obj = spec.objective
    lo = t.global_batch_sequences
    hi = math.floor(lo * (1 + spec.constraints.global_batch_tolerance) + 1e-9)
    equal = spec.runtime.value == "torchtitan-ft"
    kmax = _islands_cap(spec)
    steps = t.total_tokens / t.seq_len_tokens / lo
    utilisation = {
        p.name: _utilisation(spec, p, CostModel(spec.model, spec.training, p), hi)
        for p in spec.usable_pools()
    }
    prices = site_egress_usd_per_gb(spec.pools)
    payload = outer_payload_bytes(spec.model, strat, float(spec.model.total_params))
    budget = obj.co2_budget_kg if obj.co2_budget_kg is not None else math.inf
    out = []
    for combo in itertools.product(*_options(spec, hi, kmax)):
        used = [o for o in combo if o is not None]
        islands = sum(o.islands for o in used)
        gpus = sum(o.islands * o.shape.ranks for o in used)
        if not used or islands > kmax:
            continue
        if spec.constraints.max_gpus is not None and gpus > spec.constraints.max_gpus:
            continue
        sites = {o.pool.site for o in used}
        if len(sites) > 1 and any(o.pool.wan_uplink is None for o in used):
            continue
        candidates = sorted(set(_combos(used, lo, hi, equal)))
        overhead: Callable[[float], tuple[float, int, int]] = cache(
            lambda s, u=used: _outer_overhead(spec, u, s)
        )
        best: tuple[float, float, int] | None = None  # effective step, T, sequences
        for step_s, sequences in candidates:
            if best is not None and step_s > best[0]:
                break  # effective step ≥ T: nothing later can win
            eff = step_s + overhead(step_s)[0]
            if best is None or (eff, step_s, sequences) < best:
                best = (eff, step_s, sequences)
        if best is None or not math.isfinite(best[0]):
            continue
        eff, step_s, sequences = best
        _, h, delay = overhead(step_s)
        time_s = steps * eff
        hours = time_s / 3600
        rate = watts = co2_rate = 0.0
        for o in used:
            billed = o.islands * (
                o.shape.nodes * o.pool.gpus_per_node if o.pool.exclusive_nodes else o.shape.ranks
            )
            rate += billed * o.pool.price_per_gpu_hour_usd
            w = islands_facility_watts(
                o.pool, o.islands, o.shape.nodes, o.shape.ranks, utilisation[o.pool.name]
            )
            watts += w
            co2_rate += co2_kg(facility_kwh(w, 1.0, 1.0), o.pool.grid_carbon_intensity_g_per_kwh)
        _, egress_usd = (
            run_egress(payload, islands, steps / h, sites, prices) if strat.is_diloco else (0, 0)
        )
        factor = (
            equivalent_token_factor(
                float(spec.model.total_params),
                float(t.total_tokens),
                islands,
                h,
                fragment_sync_delay=delay,
                outer_precision=strat.outer_precision,
            )
            if strat.is_diloco
            else 1.0
        )
        rank = factor if obj.quality_adjusted else 1.0
        co2 = co2_rate * hours
        if co2 * rank > budget * (1 + 1e-12):
            continue
        out.append(
            Ref(
                tuple((o.pool.name, o.islands, o.shape.nodes, o.shape.gpus_per_node) for o in used),
                time_s,
                rate * hours + egress_usd,
                step_s,
                sequences,
                sum(o.islands * o.shape.nodes for o in used),
                islands,
                tuple(
                    (1, 0, 0, 0)
                    if o is None
                    else (0, o.islands, o.shape.nodes, o.shape.gpus_per_node)
                    for o in combo
                ),
                watts * hours / 1000,
                co2,
                egress_usd,
                factor,
                rank,
            )
        )
    return out


def frontier(refs: list[Ref]) -> list[Ref]:
    """Not dominated in (ranked time, ranked cost), fastest first; ties: fewer nodes, then
    islands, then pools in order using (fewer islands, nodes, GPUs per node) before unused
    pools."""
    keep, best = [], math.inf
    for r in sorted(
        refs, key=lambda r: (r.rank_time_s, r.rank_cost_usd, r.nodes, r.islands, r.tie)
    ):
        if r.rank_cost_usd < best:
            keep.append(r)
            best = r.rank_cost_usd
    return keep


def canonical(refs: list[Ref]) -> list[Ref]:
    """All of them in the optimizer's tie order."""
    return sorted(refs, key=lambda r: (r.rank_time_s, r.rank_cost_usd, r.nodes, r.islands, r.tie))
