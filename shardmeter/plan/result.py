"""Turn search output into plans people and the operator can read: island groups with their
micro-batch, accumulation, local batch and step time; Streaming DiLoCo settings; and, for
the chosen plan, a full re-simulation (FSDP step per island group and the DiLoCo level)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from shardmeter.plan.evaluate import Evaluation
from shardmeter.plan.search import SearchOutput
from shardmeter.sim.diloco import DiLoCoResult
from shardmeter.sim.fsdp import StepResult
from shardmeter.sim.outer import IslandPlacement, outer_link
from shardmeter.sim.scenario import DiLoCoIsland, simulate_islands
from shardmeter.sim.settings import SettingsChoice
from shardmeter.spec.training import StrategyKind


@dataclass(frozen=True)
class IslandGroup:
    """``count`` identical islands from one pool."""

    pool: str
    gpu: str
    count: int
    nodes: int
    gpus_per_node: int
    micro_batch: int
    accumulation: int
    local_batch_tokens: int
    """Tokens one island processes per inner step."""
    step_s: float
    """One island's inner step."""

    @property
    def label(self) -> str:
        """ "k×N×G GPU", as in the paper's Fig. 8."""
        return f"{self.count}×{self.nodes}×{self.gpus_per_node} {self.gpu.split('-')[0]}"


@dataclass(frozen=True)
class PlanSummary:
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
    usd_per_hour: float
    mfu: float
    sync_every: int
    fragments: int
    fragment_sync_delay: int
    blocking_s_per_outer_step: float
    zero_blocking: bool

    @property
    def label(self) -> str:
        """Groups joined by "+"; a group names its pool when another group has the same GPU."""
        gpus = [g.gpu for g in self.groups]
        return " + ".join(
            g.label + (f" ({g.pool})" if gpus.count(g.gpu) > 1 else "") for g in self.groups
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["label"] = self.label
        return d


def summarise(out: SearchOutput, ev: Evaluation, i: int) -> PlanSummary:
    t = out.table
    groups = []
    seq_len = out.spec.training.seq_len_tokens
    for p, o in enumerate(ev.choice[i]):
        if o < 0:
            continue
        opt = t.options[o]
        ctx = out.contexts[opt.pool]
        prof = ctx.shapes[opt.shape]
        pos = int(ev.config_pos[i, p]) - int(t.seg_start[t.segment[o]])
        cfg = prof.configs[pos]
        groups.append(
            IslandGroup(
                pool=ctx.pool.name,
                gpu=ctx.pool.gpu.name,
                count=opt.islands,
                nodes=prof.shape.nodes,
                gpus_per_node=prof.shape.gpus_per_node,
                micro_batch=cfg.micro_batch,
                accumulation=cfg.accumulation,
                local_batch_tokens=cfg.sequences * seq_len,
                step_s=cfg.step_s,
            )
        )
    return PlanSummary(
        groups=tuple(groups),
        islands=int(ev.islands[i]),
        gpus=int(ev.gpus[i]),
        step_s=float(ev.step_s[i]),
        effective_step_s=float(ev.effective_step_s[i]),
        global_batch_tokens=int(ev.sequences[i]) * seq_len,
        tokens_per_s=float(ev.tokens_per_s[i]),
        hours=float(ev.time_s[i]) / 3600,
        cost_usd=float(ev.cost_usd[i]),
        usd_per_hour=float(ev.usd_per_hour[i]),
        mfu=float(ev.mfu[i]),
        sync_every=int(ev.sync_every[i]),
        fragments=int(ev.fragments[i]),
        fragment_sync_delay=int(ev.delay[i]),
        blocking_s_per_outer_step=float(ev.blocking_s[i]),
        zero_blocking=bool(ev.zero_blocking[i]),
    )


@dataclass
class ChosenDetail:
    """The chosen plan simulated in full."""

    steps: list[StepResult]
    """One FSDP step per island group (at its micro-batch and accumulation)."""
    bottleneck: str
    evidence: str
    diloco: DiLoCoResult | None = None
    outer_link: str | None = None


@dataclass
class PlanResult:
    output: SearchOutput
    chosen: PlanSummary
    fastest: PlanSummary
    frontier: list[PlanSummary]
    detail: ChosenDetail
    coefficient_sources: dict[str, str] = field(default_factory=dict)

    @property
    def saving_vs_fastest(self) -> float:
        """Cost saved by the chosen plan relative to the fastest plan (paper §V: 21.69 %)."""
        return (
            1.0 - self.chosen.cost_usd / self.fastest.cost_usd if self.fastest.cost_usd > 0 else 0.0
        )


def simulate_chosen(out: SearchOutput, plan: PlanSummary, rounds: int = 3) -> ChosenDetail:
    by_pool = {c.pool.name: c for c in out.contexts}
    steps, islands, placements = [], [], []
    for g in plan.groups:
        ctx = by_pool[g.pool]
        prof = next(
            s
            for s in ctx.shapes
            if s.shape.nodes == g.nodes and s.shape.gpus_per_node == g.gpus_per_node
        )
        model = prof.models[g.micro_batch]
        step = model.simulate(g.accumulation)
        steps.append(step)
        for k in range(g.count):
            islands.append(DiLoCoIsland(f"{g.pool}-{k}", ctx.cost_model, prof.shape, step.step_s))
            placements.append(IslandPlacement(ctx.cost_model, prof.shape.ranks))
    binding = max(range(len(steps)), key=lambda i: steps[i].step_s)
    bottleneck, evidence = (
        steps[binding].verdict,
        f"{plan.groups[binding].label}: {steps[binding].evidence()}",
    )
    detail = ChosenDetail(steps, bottleneck, evidence)
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
        if outcome.result.blocking_s_per_outer_step > 1e-9:
            detail.bottleneck = "outer-step-bound"
            detail.evidence = (
                f"compute blocks {outcome.result.blocking_s_per_outer_step:.3g} s per outer step "
                f"waiting on the outer all_reduce ({link.description})"
            )
    return detail


def build_result(out: SearchOutput) -> PlanResult:
    f = out.frontier
    frontier = [summarise(out, f, i) for i in range(len(f))]
    chosen = frontier[out.chosen]
    sources = {c.pool.name: c.cost_model.coefficients.source.value for c in out.contexts}
    return PlanResult(
        out, chosen, frontier[out.fastest], frontier, simulate_chosen(out, chosen), sources
    )
