"""Turn search output into plans people and the operator can read: island groups with their
micro-batch, accumulation, local batch and step time; Streaming DiLoCo settings; the paper's
reading (saving against the fastest plan, the cost spread of plans within the throughput
tolerance); and, for the chosen plan, a full re-simulation (FSDP step per island group and the
DiLoCo level)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shardmeter.cost.quality import QualityEstimate, data_parallel_quality, strategy_quality
from shardmeter.plan.evaluate import Evaluation
from shardmeter.plan.frontier import RELATIVE_TIE, canonical_order
from shardmeter.plan.groups import IslandGroup, plan_label
from shardmeter.plan.schema import ObjectiveKind, PlanSpec, Runtime
from shardmeter.plan.search import SearchOutput
from shardmeter.sim.bottleneck import Bottleneck, blocks
from shardmeter.sim.diloco import DiLoCoResult
from shardmeter.sim.fsdp import StepResult
from shardmeter.sim.outer import IslandPlacement, outer_link
from shardmeter.sim.scenario import (
    DiLoCoIsland,
    fragment_all_reduce_seconds,
    islands_outer_step_seconds,
    resolved_gradient_sync,
    simulate_islands,
)
from shardmeter.sim.settings import (
    GuardRails,
    SettingsChoice,
    choose_sync_every,
    search_settings,
)
from shardmeter.spec.base import format_seconds
from shardmeter.spec.training import StrategyKind, StreamingSettings


@dataclass(frozen=True)
class PlanSummary:
    """One plan and everything it is predicted to cost: time, money (GPUs and WAN egress),
    energy, CO₂e and, for DiLoCo, quality — the figures for ``totalTokens`` and, beside them,
    what reaching data-parallel's loss takes (× the equivalent-token factor). The operator
    reads a plan's status from here."""

    groups: tuple[IslandGroup, ...]
    islands: int
    gpus: int
    step_s: float
    effective_step_s: float
    global_batch_tokens: int
    """Tokens all islands process per inner step (≥ the requested batch)."""
    tokens_per_s: float
    hours: float
    cost_usd: float
    """GPU cost plus WAN egress for ``totalTokens``."""
    usd_per_hour: float
    """What the billed GPUs cost per hour."""
    mfu: float
    sync_every: int
    fragments: int
    fragment_sync_delay: int
    blocking_s_per_outer_step: float
    zero_blocking: bool
    runtime: str
    billed_gpus: int = 0
    """GPUs paid for (``gpus``, or whole nodes with ``exclusiveNodes``)."""
    gpu_cost_usd: float = 0.0
    egress_gb: float = 0.0
    """GB the outer all_reduce sends out of the sites for ``totalTokens`` (0 at one site)."""
    egress_usd: float = 0.0
    energy_kwh: float = 0.0
    """Facility energy (GPUs × power × PUE) for ``totalTokens``."""
    co2_kg: float = 0.0
    """kg CO₂e of that energy at the sites' grid carbon intensity."""
    quality: QualityEstimate = field(default_factory=data_parallel_quality)
    dp_equivalent_hours: float = 0.0
    """Hours to reach data-parallel's loss: ``hours`` × the equivalent-token factor."""
    dp_equivalent_cost_usd: float = 0.0
    dp_equivalent_energy_kwh: float = 0.0
    dp_equivalent_co2_kg: float = 0.0
    ranked_by_quality: bool = False
    """The objective compared the data-parallel-equivalent figures (``qualityAdjusted``)."""

    @property
    def rank_hours(self) -> float:
        """The hours the objective compared."""
        return self.dp_equivalent_hours if self.ranked_by_quality else self.hours

    @property
    def rank_cost_usd(self) -> float:
        """The cost the objective compared."""
        return self.dp_equivalent_cost_usd if self.ranked_by_quality else self.cost_usd

    @property
    def rank_tokens_per_s(self) -> float:
        """Throughput as the objective compared it (data-parallel-equivalent tokens per
        second when quality-adjusted)."""
        f = self.quality.equivalent_token_factor if self.ranked_by_quality else 1.0
        return self.tokens_per_s / f

    @property
    def settings(self) -> StreamingSettings:
        """The plan's Streaming DiLoCo settings (H, P, τ)."""
        return StreamingSettings(self.sync_every, self.fragments, self.fragment_sync_delay)

    @property
    def label(self) -> str:
        """Groups joined by "+"; a group names its pool when another group has the same GPU."""
        return plan_label(self.groups)

    @property
    def layout(self) -> tuple[tuple[str, int, int, int], ...]:
        """(pool, islands, nodes, GPUs per node) per group: what identifies a layout."""
        return tuple((g.pool, g.count, g.nodes, g.gpus_per_node) for g in self.groups)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["label"] = self.label
        return d


def summarise(out: SearchOutput, ev: Evaluation, i: int) -> PlanSummary:
    """The plan of layout ``i`` of ``ev``, with its exact apportioning."""
    t = out.table
    grid = out.grid
    seq_len = out.spec.training.seq_len_tokens
    appor = out.evaluator.apportion(ev.choice[i])
    assert appor is not None, "a feasible layout has an apportioning"
    _, cells = appor
    variants = _variants(out)
    default_sync = resolved_gradient_sync(out.contexts[0].cost_model, None)
    quality = plan_quality(
        out.spec,
        int(ev.islands[i]),
        int(ev.sync_every[i]),
        int(ev.fragments[i]),
        int(ev.fragment_sync_delay[i]),
    )
    factor = quality.equivalent_token_factor
    groups = []
    total = 0
    for p, o in enumerate(ev.choice[i]):
        if o < 0:
            continue
        opt = t.options[o]
        ctx = out.contexts[opt.pool]
        table = ctx.shapes[opt.shape]
        c = cells[p]
        total += opt.islands * c * grid.quantum
        groups.append(
            IslandGroup(
                pool=ctx.pool.name,
                gpu=ctx.pool.gpu.name,
                count=opt.islands,
                nodes=table.shape.nodes,
                gpus_per_node=table.shape.gpus_per_node,
                micro_batch=int(table.micro_batch[c]),
                accumulation=int(table.accumulation[c]),
                local_batch_tokens=c * grid.quantum * seq_len,
                step_s=float(table.step_s[c]),
                variant=variants[int(table.variant[c])].name,
                gradient_sync=variants[int(table.variant[c])].gradient_sync or default_sync,
            )
        )
    return PlanSummary(
        groups=tuple(groups),
        islands=int(ev.islands[i]),
        gpus=int(ev.gpus[i]),
        step_s=float(ev.step_s[i]),
        effective_step_s=float(ev.effective_step_s[i]),
        global_batch_tokens=total * seq_len,
        tokens_per_s=float(ev.tokens_per_s[i]),
        hours=float(ev.time_s[i]) / 3600,
        cost_usd=float(ev.cost_usd[i]),
        usd_per_hour=float(ev.usd_per_hour[i]),
        mfu=float(ev.mfu[i]),
        sync_every=int(ev.sync_every[i]),
        fragments=int(ev.fragments[i]),
        fragment_sync_delay=int(ev.fragment_sync_delay[i]),
        blocking_s_per_outer_step=float(ev.blocking_s[i]),
        zero_blocking=bool(ev.zero_blocking[i]),
        runtime=out.spec.runtime.value,
        billed_gpus=int(ev.billed_gpus[i]),
        gpu_cost_usd=float(ev.cost_usd[i] - ev.egress_usd[i]),
        egress_gb=float(ev.egress_gb[i]),
        egress_usd=float(ev.egress_usd[i]),
        energy_kwh=float(ev.energy_kwh[i]),
        co2_kg=float(ev.co2_kg[i]),
        quality=quality,
        dp_equivalent_hours=float(ev.time_s[i]) / 3600 * factor,
        dp_equivalent_cost_usd=float(ev.cost_usd[i]) * factor,
        dp_equivalent_energy_kwh=float(ev.energy_kwh[i]) * factor,
        dp_equivalent_co2_kg=float(ev.co2_kg[i]) * factor,
        ranked_by_quality=out.spec.objective.quality_adjusted,
    )


def plan_quality(
    spec: PlanSpec, islands: int, sync_every: int, fragments: int, fragment_sync_delay: int
) -> QualityEstimate:
    """The quality estimate of a plan of ``spec`` with these islands and settings."""
    return strategy_quality(
        float(spec.model.total_params),
        float(spec.training.total_tokens),
        spec.model.num_layers,
        spec.strategy,
        islands,
        sync_every,
        fragments,
        fragment_sync_delay,
    )


def _variants(out: SearchOutput) -> list[Any]:
    from shardmeter.plan.configs import config_variants

    return config_variants(out.spec)


@dataclass(frozen=True)
class ToleranceSpread:
    """The paper's reading (§V, Fig. 8): how much plans within the throughput tolerance cost."""

    throughput_fraction: float
    plans: int
    """Plans scored with at least that share of the best throughput."""
    min_cost_usd: float
    max_cost_usd: float
    cheapest: str
    dearest: str
    complete: bool
    """Every plan was scored (exhaustive search); else the spread covers the plans scored."""

    @property
    def spread(self) -> float:
        """(dearest − cheapest) / dearest."""
        return 1 - self.min_cost_usd / self.max_cost_usd if self.max_cost_usd > 0 else 0.0


@dataclass
class ChosenDetail:
    """The chosen plan simulated in full."""

    steps: list[StepResult]
    """One FSDP step per island group (at its micro-batch and accumulation)."""
    bottleneck: Bottleneck
    evidence: str
    """What shows the bottleneck: the binding island's busy and idle times, or the blocking."""
    evidence_summary: str = ""
    """``evidence`` in one clause: busy times only (the CLI's default; empty: ``evidence``)."""
    diloco: DiLoCoResult | None = None
    outer_link: str | None = None
    settings_reason: str = ""
    """Why these Streaming DiLoCo settings (and, when blocking, what would hide it)."""


@dataclass
class PlanResult:
    output: SearchOutput
    chosen: PlanSummary
    fastest: PlanSummary
    frontier: list[PlanSummary]
    detail: ChosenDetail
    spread: ToleranceSpread
    coefficient_sources: dict[str, str] = field(default_factory=dict)

    @property
    def saving_vs_fastest(self) -> float:
        """Cost saved by the chosen plan relative to the fastest plan (paper §V: 21.69 %), on
        the figures the objective ranks by."""
        c, f = self.chosen.rank_cost_usd, self.fastest.rank_cost_usd
        return 1.0 - c / f if f > 0 else 0.0

    @property
    def runtime(self) -> Runtime:
        return self.output.spec.runtime


TIE_BREAK = (
    "plans that tie go by the canonical order: less time, then less cost, fewer nodes, fewer "
    "islands, then pools in file order using fewer islands, nodes and GPUs per node"
)
"""The one rule for equal plans (`shardmeter.plan.frontier.canonical_order`): the chosen plan,
the fastest, the frontier, the cheapest within the tolerance and the top-20 all follow it."""


def tolerance_spread(out: SearchOutput, fraction: float) -> ToleranceSpread:
    """Plans within ``fraction`` of the best (ranked) throughput and their (ranked) costs;
    of plans that cost the same the cheapest and the dearest are the first in the canonical
    order (`TIE_BREAK`), as the objective picks them."""
    ev = out.evaluated
    cap = float(ev.rank_time_s[out.fastest]) / (fraction * (1 - RELATIVE_TIE))
    order = canonical_order(ev)
    within = order[ev.rank_time_s[order] <= cap]
    costs = ev.rank_cost_usd[within]
    lo = within[int(np.flatnonzero(costs == costs.min())[0])]
    hi = within[int(np.flatnonzero(costs == costs.max())[0])]
    return ToleranceSpread(
        fraction,
        len(within),
        float(costs.min()),
        float(costs.max()),
        summarise(out, ev, int(lo)).label,
        summarise(out, ev, int(hi)).label,
        out.stats.mode == "exhaustive",
    )


def simulate_chosen(out: SearchOutput, plan: PlanSummary, rounds: int = 3) -> ChosenDetail:
    by_pool = {c.pool.name: c for c in out.contexts}
    steps, islands, placements = [], [], []
    for g in plan.groups:
        ctx = by_pool[g.pool]
        table = next(
            s
            for s in ctx.shapes
            if s.shape.nodes == g.nodes and s.shape.gpus_per_node == g.gpus_per_node
        )
        variant = next(i for i, v in enumerate(_variants(out)) if v.name == g.variant)
        model = table.models[(variant, g.micro_batch)]
        step = model.simulate(g.accumulation)
        steps.append(step)
        for k in range(g.count):
            islands.append(DiLoCoIsland(f"{g.pool}-{k}", ctx.cost_model, table.shape, step.step_s))
            placements.append(IslandPlacement(ctx.cost_model, table.ranks))
    binding = max(range(len(steps)), key=lambda i: steps[i].step_s)
    label = plan.groups[binding].label
    detail = ChosenDetail(
        steps,
        steps[binding].verdict,
        f"{label}: {steps[binding].evidence()}",
        f"{label}: {steps[binding].busy()}",
    )
    spec = out.spec
    if spec.strategy.kind is not StrategyKind.FSDP:
        link = outer_link(placements)
        choice = SettingsChoice(
            plan.sync_every,
            plan.fragments,
            plan.fragment_sync_delay,
            plan.blocking_s_per_outer_step,
            plan.zero_blocking,
            None,
            "chosen by the optimizer",
        )
        outcome = simulate_islands(spec.model, spec.strategy, islands, link, choice, rounds)
        detail.diloco, detail.outer_link = outcome.result, link.description
        detail.settings_reason = _settings_reason(
            out,
            plan,
            link,
            len(islands),
            islands_outer_step_seconds(spec.model, spec.strategy, islands),
        )
        if blocks(outcome.result.blocking_s_per_outer_step):
            detail.bottleneck = Bottleneck.OUTER_STEP
            detail.evidence = detail.evidence_summary = (
                f"compute blocks {format_seconds(outcome.result.blocking_s_per_outer_step)} per "
                f"outer step waiting on the outer all_reduce ({link.description})"
            )
    return detail


def _settings_reason(
    out: SearchOutput,
    plan: PlanSummary,
    link: Any,
    islands: int,
    outer_step_s: Callable[[int], float],
) -> str:
    """The scalar settings search's explanation for the chosen plan (guard-rails named;
    ``outer_step_s``: the islands' outer optimizer steps by fragment count, which the rule
    weighs where blocking cannot be hidden)."""
    spec = out.spec
    strat = spec.strategy

    def all_reduce(f: int) -> list[float]:
        return fragment_all_reduce_seconds(spec.model, strat, link, islands, f)

    if strat.kind is StrategyKind.DILOCO:
        return (
            f"blocking DiLoCo: every {plan.sync_every} inner steps all islands wait for the "
            f"whole model's all_reduce ({all_reduce(1)[0]:.3g} s)"
        )
    fixed_f = strat.fragments if isinstance(strat.fragments, int) else None
    fixed_fragment_sync_delay = (
        strat.fragment_sync_delay if isinstance(strat.fragment_sync_delay, int) else None
    )
    rails = GuardRails.of(strat, spec.model.num_layers)
    if isinstance(strat.sync_every, int):
        c = search_settings(
            strat.sync_every,
            plan.step_s,
            all_reduce,
            spec.model.num_layers,
            fixed_f,
            fixed_fragment_sync_delay,
            max_fragment_sync_delay=rails.max_fragment_sync_delay,
            max_fragment_sync_delay_fraction=rails.max_fragment_sync_delay_fraction,
            target_fragments=rails.target_fragments,
            outer_step_s=outer_step_s,
        )
    else:
        c = choose_sync_every(
            plan.step_s,
            all_reduce,
            spec.model.num_layers,
            fixed_f,
            fixed_fragment_sync_delay,
            max_sync_every=rails.max_sync_every,
            max_fragment_sync_delay=rails.max_fragment_sync_delay,
            max_fragment_sync_delay_fraction=rails.max_fragment_sync_delay_fraction,
            target_fragments=rails.target_fragments,
            outer_step_s=outer_step_s,
        )
    if c.zero_blocking:
        return c.reason
    return (
        f"blocking cannot be hidden within the convergence guard-rails ({rails.described()}): "
        + c.reason
    )


def build_result(out: SearchOutput) -> PlanResult:
    f = out.frontier
    frontier = [summarise(out, f, i) for i in range(len(f))]
    chosen = summarise(out, out.evaluated, out.chosen)
    sources = {c.pool.name: c.cost_model.coefficients.source.value for c in out.contexts}
    obj = out.spec.objective
    fraction = obj.throughput_fraction if obj.kind is ObjectiveKind.THROUGHPUT_FRACTION else 0.99
    return PlanResult(
        out,
        chosen,
        summarise(out, out.evaluated, out.fastest),
        frontier,
        simulate_chosen(out, chosen),
        tolerance_spread(out, fraction),
        sources,
    )


def top_indices(result: PlanResult, n: int = 20) -> list[int]:
    """Indices into ``output.evaluated`` of the ``n`` highest-throughput plans scored, in the
    canonical order (`TIE_BREAK`: the first is the fastest plan)."""
    ev = result.output.evaluated
    order = canonical_order(ev)
    return [int(i) for i in order[ev.feasible[order]][:n]]


def top_by_throughput(result: PlanResult, n: int = 20) -> list[PlanSummary]:
    """The ``n`` highest-throughput plans scored — the paper's Fig. 8 — on the figures the
    objective ranks by, ties in the canonical order (`TIE_BREAK`)."""
    return [summarise(result.output, result.output.evaluated, i) for i in top_indices(result, n)]
