"""An independent, slow reference for the optimizer: enumerates every plan of the documented
search space with scalar code — full FSDP simulations at every accumulation (no linearity
shortcut), a linear scan for the balanced step time, the scalar Streaming DiLoCo settings
search — and keeps the Pareto frontier with the same tie-breaking rule."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cache

from shardmeter.cost.model import CostModel
from shardmeter.plan.options import micro_batch_candidates
from shardmeter.plan.schema import PlanSpec
from shardmeter.sim.fsdp import FSDPDurations, simulate_fsdp_step
from shardmeter.sim.outer import IslandPlacement, outer_link
from shardmeter.sim.scenario import IslandShape, resolve_settings
from shardmeter.spec.training import StrategyKind


@dataclass(frozen=True)
class Ref:
    label: str
    time_s: float
    cost_usd: float
    nodes: int
    islands: int
    key: tuple[int, ...]


def shapes(cm: CostModel, spec: PlanSpec) -> list[IslandShape]:
    c, pool = spec.constraints, cm.pool
    best: dict[int, IslandShape] = {}
    for g in sorted(
        (g for g in range(1, pool.gpus_per_node + 1) if pool.gpus_per_node % g == 0), reverse=True
    ):
        for n in range(1, pool.nodes + 1):
            p = n * g
            if p in best or p < c.min_gpus_per_island:
                continue
            if (c.max_gpus_per_island and p > c.max_gpus_per_island) or (
                c.max_gpus and p > c.max_gpus
            ):
                continue
            best[p] = IslandShape(n, g)
    return [best[p] for p in sorted(best)]


def brute_force(spec: PlanSpec) -> list[Ref]:
    """Every feasible plan, as Ref records."""
    t = spec.training
    seqs = t.global_batch_sequences
    limit = math.floor(seqs * (1 + spec.constraints.global_batch_tolerance) + 1e-9)
    on_gpu = spec.strategy.outer_state_on_gpu and spec.strategy.is_diloco
    pools = spec.usable_pools()
    per_pool = []
    for pool in pools:
        cm = CostModel(spec.model, t, pool)
        options = []
        for shape in shapes(cm, spec):
            p = shape.ranks
            b1, ba = cm.max_micro_batch(p, 1, on_gpu), cm.max_micro_batch(p, 2, on_gpu)
            if b1 < 1 or p > limit:
                continue
            durations = {
                b: FSDPDurations.from_cost_model(cm, shape.nodes, shape.gpus_per_node, b)
                for b in micro_batch_candidates(min(b1, limit // p), (b1, ba))
            }

            @cache
            def step(
                b: int, a: int, d: tuple[FSDPDurations, ...] = (), _dur: dict = durations
            ) -> float:
                return simulate_fsdp_step(_dur[b], a).step_s

            configs = []  # (step_s, sequences per island)
            for b in durations:
                configs.append((step(b, 1), b * p))
                if b <= ba:
                    configs += [(step(b, a), a * b * p) for a in range(2, limit // (b * p) + 1)]
            for k in range(1, spec.constraints.max_islands + 1):
                if k * shape.nodes > pool.nodes or k * min(s for _, s in configs) > limit:
                    break
                if spec.constraints.max_gpus and k * p > spec.constraints.max_gpus:
                    break
                options.append((pool, cm, shape, k, configs))
        per_pool.append([None, *options])
    max_islands = 1 if spec.strategy.kind is StrategyKind.FSDP else spec.constraints.max_islands
    out = []
    for combo in itertools.product(*per_pool):
        used = [o for o in combo if o is not None]
        islands = sum(o[3] for o in used)
        gpus = sum(o[3] * o[2].ranks for o in used)
        if (
            not used
            or islands > max_islands
            or (spec.constraints.max_gpus and gpus > spec.constraints.max_gpus)
        ):
            continue
        times = sorted({s for o in used for s, _ in o[4]})

        def cap(o: tuple, tau: float) -> int:
            return max((o[3] * q for s, q in o[4] if s <= tau), default=0)

        star = next(
            (
                tau
                for tau in times
                if all(cap(o, tau) > 0 for o in used) and sum(cap(o, tau) for o in used) >= seqs
            ),
            None,
        )
        if star is None:
            continue
        caps = [cap(o, star) for o in used]
        for i, o in enumerate(used):  # trim in pool order
            need = max(seqs - (sum(caps) - caps[i]), 1)
            caps[i] = min(o[3] * q for s, q in o[4] if s <= star and o[3] * q >= need)
        if sum(caps) > limit:
            continue
        overhead = 0.0
        if spec.strategy.is_diloco:
            placements = [IslandPlacement(o[1], o[2].ranks) for o in used for _ in range(o[3])]
            link = outer_link(placements)
            choice = resolve_settings(spec.model, spec.strategy, link, islands, star)
            outer = max(
                o[1].outer_step_seconds(spec.model.total_params, o[2].ranks, on_gpu) for o in used
            )
            overhead = (choice.blocking_s_per_outer_step + outer) / choice.sync_every
        time_s = t.total_tokens / (seqs * t.seq_len_tokens / (star + overhead))
        rate = sum(o[3] * o[2].ranks * o[0].price_per_gpu_hour_usd for o in used)
        label = " + ".join(
            f"{o[3]}×{o[2].nodes}×{o[2].gpus_per_node} {o[0].gpu.name.split('-')[0]}" for o in used
        )
        key = tuple(x for o in combo for x in ((-1,) if o is None else (o[2].ranks, o[3])))
        out.append(
            Ref(
                label,
                time_s,
                rate * time_s / 3600,
                sum(o[3] * o[2].nodes for o in used),
                islands,
                key,
            )
        )
    return out


def frontier(refs: list[Ref]) -> list[Ref]:
    keep, best = [], math.inf
    for r in sorted(refs, key=lambda r: (r.time_s, r.cost_usd, r.nodes, r.islands, r.key)):
        if r.cost_usd < best:
            keep.append(r)
            best = r.cost_usd
    return keep
