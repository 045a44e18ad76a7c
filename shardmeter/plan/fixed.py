"""Re-evaluate a plan that is already decided (e.g. launched) with other coefficients: the
islands, micro-batches and Streaming DiLoCo settings stay as they are; step times, blocking
and cost are predicted again, with the settings the search would now recommend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.egress import run_egress, site_egress_usd_per_gb
from shardmeter.cost.model import CostModel
from shardmeter.cost.quality import QualityEstimate, data_parallel_quality, strategy_quality
from shardmeter.errors import SpecError
from shardmeter.plan.groups import IslandGroup
from shardmeter.plan.options import option_rates, pool_utilisation
from shardmeter.plan.schema import PlanSpec
from shardmeter.sim.diloco import DiLoCoResult
from shardmeter.sim.outer import IslandPlacement, outer_link
from shardmeter.sim.scenario import (
    DiLoCoIsland,
    IslandShape,
    IslandStepModel,
    fragment_all_reduce_seconds,
    islands_outer_step_seconds,
    outer_payload_bytes,
    simulate_islands,
)
from shardmeter.sim.settings import GuardRails, SettingsChoice, search_settings


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
    """GPU cost (billed GPUs) plus WAN egress."""
    mfu: float
    blocking_s_per_outer_step: float
    recommended: SettingsChoice | None
    """For DiLoCo: what the settings search recommends at the current sync_every."""
    diloco: DiLoCoResult | None
    egress_gb: float = 0.0
    egress_usd: float = 0.0
    energy_kwh: float = 0.0
    co2_kg: float = 0.0
    quality: QualityEstimate = field(default_factory=data_parallel_quality)
    """Against data-parallel at the plan's islands and settings (the same as the plan's)."""


def evaluate_fixed(
    spec: PlanSpec,
    coefficients: Mapping[str, CoefficientsDocument | None],
    groups: Sequence[IslandGroup],
    sync_every: int = 1,
    fragments: int = 1,
    fragment_sync_delay: int = 0,
) -> FixedEvaluation:
    pools = {p.name: p for p in spec.pools}
    t = spec.training
    models: dict[str, CostModel] = {}
    steps, islands, placements = [], [], []
    rate = peak = watts = co2_rate = 0.0
    utilisation: dict[str, float] = {}
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
        if g.pool not in utilisation:
            utilisation[g.pool] = pool_utilisation(spec, pool, coefficients.get(g.pool))
        rates = option_rates(pool, g.count, g.nodes, shape.ranks, utilisation[g.pool])
        rate += rates.usd_per_hour
        watts += rates.facility_watts
        co2_rate += rates.co2_kg_per_hour
        peak += g.count * shape.ranks * cm.peak_flop_per_s
    slowest = max(steps)
    eff, blocking, recommended, diloco = slowest, 0.0, None, None
    if spec.strategy.is_diloco:
        link = outer_link(placements)
        choice = SettingsChoice(
            sync_every, fragments, fragment_sync_delay, 0.0, True, None, "fixed"
        )
        outcome = simulate_islands(spec.model, spec.strategy, islands, link, choice)
        diloco = outcome.result
        blocking = diloco.blocking_s_per_outer_step
        eff = diloco.period_s / sync_every

        def all_reduce(f: int) -> list[float]:
            return fragment_all_reduce_seconds(spec.model, spec.strategy, link, len(islands), f)

        rails = GuardRails.of(spec.strategy, spec.model.num_layers)
        recommended = search_settings(
            sync_every,
            slowest,
            all_reduce,
            spec.model.num_layers,
            max_fragment_sync_delay=rails.max_fragment_sync_delay,
            max_fragment_sync_delay_fraction=rails.max_fragment_sync_delay_fraction,
            target_fragments=rails.target_fragments,
            outer_step_s=islands_outer_step_seconds(spec.model, spec.strategy, islands),
        )
    tokens_per_s = t.global_batch_tokens / eff
    hours = t.total_tokens / tokens_per_s / 3600
    mfu = (
        tokens_per_s * spec.model.training_flops_per_token(t.seq_len_tokens) / peak if peak else 0.0
    )
    sites = [pools[g.pool].site for g in groups]
    egress_gb, egress_usd = (
        run_egress(
            outer_payload_bytes(spec.model, spec.strategy, float(spec.model.total_params)),
            len(islands),
            t.total_tokens / t.global_batch_tokens / sync_every,
            sites,
            site_egress_usd_per_gb(spec.pools),
        )
        if spec.strategy.is_diloco
        else (0.0, 0.0)
    )
    quality = strategy_quality(
        float(spec.model.total_params),
        float(t.total_tokens),
        spec.model.num_layers,
        spec.strategy,
        len(islands),
        sync_every,
        fragments,
        fragment_sync_delay,
    )
    return FixedEvaluation(
        tuple(steps),
        slowest,
        eff,
        tokens_per_s,
        hours,
        rate * hours + egress_usd,
        mfu,
        blocking,
        recommended,
        diloco,
        egress_gb,
        egress_usd,
        watts * hours / 1000,
        co2_rate * hours,
        quality,
    )
