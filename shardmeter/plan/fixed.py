"""Re-evaluate a plan that is already decided (e.g. launched) with other coefficients: the
islands, micro-batches and Streaming DiLoCo settings stay as they are; step times, blocking
and cost are predicted again, with the settings the search would now recommend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.model import CostModel
from shardmeter.errors import SpecError
from shardmeter.plan.groups import IslandGroup
from shardmeter.plan.schema import PlanSpec
from shardmeter.sim.diloco import DiLoCoResult
from shardmeter.sim.outer import IslandPlacement, outer_link
from shardmeter.sim.scenario import (
    DiLoCoIsland,
    IslandShape,
    IslandStepModel,
    fragment_all_reduce_seconds,
    simulate_islands,
)
from shardmeter.sim.settings import SettingsChoice, search_settings


@dataclass(frozen=True)
class FixedEvaluation:
    group_step_s: tuple[float, ...]
    step_s: float
    """The slowest island's inner step."""
    effective_step_s: float
    """Inner step plus outer-step blocking and overhead, per inner step (simulated)."""
    tokens_per_s: float
    hours: float
    cost_usd: float
    mfu: float
    blocking_s_per_outer_step: float
    recommended: SettingsChoice | None
    """For DiLoCo: what the settings search recommends at the current sync_every."""
    diloco: DiLoCoResult | None


def evaluate_fixed(
    spec: PlanSpec,
    coefficients: Mapping[str, CoefficientsDocument | None],
    groups: Sequence[IslandGroup],
    sync_every: int = 1,
    fragments: int = 1,
    delay: int = 0,
) -> FixedEvaluation:
    pools = {p.name: p for p in spec.pools}
    t = spec.training
    models: dict[str, CostModel] = {}
    steps, islands, placements = [], [], []
    rate = peak = 0.0
    for g in groups:
        if g.pool not in pools:
            raise SpecError("pools", f"the plan uses pool {g.pool!r}, which is not in the request")
        pool = pools[g.pool]
        cm = models.setdefault(g.pool, CostModel(spec.model, t, pool, coefficients.get(g.pool)))
        shape = IslandShape(g.nodes, g.gpus_per_node)
        step = IslandStepModel(cm, shape, g.micro_batch, gradient_sync=g.gradient_sync).step_s(
            g.accumulation
        )
        steps.append(step)
        for k in range(g.count):
            islands.append(DiLoCoIsland(f"{g.pool}-{k}", cm, shape, step))
            placements.append(IslandPlacement(cm, shape.ranks))
        rate += g.count * shape.ranks * pool.price_per_gpu_hour_usd
        peak += g.count * shape.ranks * cm.peak_flop_per_s
    slowest = max(steps)
    eff, blocking, recommended, diloco = slowest, 0.0, None, None
    if spec.strategy.is_diloco:
        link = outer_link(placements)
        choice = SettingsChoice(sync_every, fragments, delay, 0.0, True, None, "fixed")
        outcome = simulate_islands(spec.model, spec.strategy, islands, link, choice)
        diloco = outcome.result
        blocking = diloco.blocking_s_per_outer_step
        eff = diloco.period_s / sync_every

        def all_reduce(f: int) -> list[float]:
            return fragment_all_reduce_seconds(spec.model, spec.strategy, link, len(islands), f)

        recommended = search_settings(
            sync_every,
            slowest,
            all_reduce,
            spec.model.num_layers,
            max_delay=spec.strategy.max_fragment_sync_delay,
        )
    tokens_per_s = t.global_batch_tokens / eff
    hours = t.total_tokens / tokens_per_s / 3600
    mfu = (
        tokens_per_s * spec.model.training_flops_per_token(t.seq_len_tokens) / peak if peak else 0.0
    )
    return FixedEvaluation(
        tuple(steps),
        slowest,
        eff,
        tokens_per_s,
        hours,
        rate * hours,
        mfu,
        blocking,
        recommended,
        diloco,
    )
