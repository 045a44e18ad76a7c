"""``shardmeter plan`` as text: the frontier table, the chosen plan, the paper's reading
(saving against the fastest plan, the cost spread within the throughput tolerance) and how
the search went."""

from __future__ import annotations

import math

from shardmeter.cost.quality import DATA_PARALLEL_BASIS
from shardmeter.output import format as fmt
from shardmeter.plan.result import TIE_BREAK, PlanResult, PlanSummary
from shardmeter.plan.schema import ObjectiveKind
from shardmeter.plan.unused import unused_pools


def _blocking(p: PlanSummary) -> str:
    if p.islands <= 1 or (
        p.sync_every <= 1 and p.fragments <= 1 and p.blocking_s_per_outer_step == 0
    ):
        return "-"
    return fmt.seconds(p.blocking_s_per_outer_step) if p.blocking_s_per_outer_step > 0 else "0"


def _penalty(p: PlanSummary) -> str:
    q = p.quality
    if q.equivalent_token_factor == 1.0 and q.loss_penalty_vs_dp == 0.0:
        return "-"
    return f"{100 * q.loss_penalty_vs_dp:+.2f} %"


def plans_table(plans: list[PlanSummary], chosen: PlanSummary, details: bool = False) -> str:
    """Each plan's figures for the requested tokens and, where DiLoCo costs quality, what
    reaching data-parallel's loss takes (the "DP-eq." figures a quality-adjusted objective
    ranks and the top-20 chart plots). ``details`` adds the token factor and the energy."""
    rows = []
    for p in plans:
        mark = "→" if p.layout == chosen.layout else " "
        factor = p.quality.equivalent_token_factor
        row: list[object] = [
            f"{mark} {p.label}",
            p.gpus,
            fmt.si(p.tokens_per_s),
            f"{p.hours:,.1f}",
            fmt.usd(p.cost_usd),
            _penalty(p),
        ]
        if details:
            row.append(f"×{factor:.3f}")
        row += [
            fmt.si(p.tokens_per_s / factor),
            f"{p.dp_equivalent_hours:,.1f}",
            fmt.usd(p.dp_equivalent_cost_usd),
        ]
        if details:
            row.append(fmt.energy(p.energy_kwh))
        row += [fmt.mass(p.co2_kg), fmt.percent(p.mfu), _blocking(p)]
        rows.append(row)
    headers = ["plan (islands×nodes×GPUs)", "GPUs", "tokens/s", "hours", "cost", "loss vs DP"]
    headers += ["tokens"] if details else []
    headers += ["DP-eq. tokens/s", "DP-eq. h", "DP-eq. cost"]
    headers += ["energy"] if details else []
    headers += ["CO₂e", "MFU", "blocking/outer step"]
    return fmt.table(headers, rows, "l" + "r" * (len(headers) - 1))


def footprint_lines(c: PlanSummary, details: bool = False) -> list[str]:
    """The chosen plan's quality, energy, CO₂e, egress and billing, one line each; the
    quality's basis (its sources and uncertainty budget) only with ``details``."""
    q = c.quality
    lo, hi = q.equivalent_token_factor_range
    lines = []
    if q.basis and (q.loss_penalty_vs_dp != 0.0 or q.equivalent_token_factor != 1.0):
        lines.append(
            f"quality: eval loss {100 * q.loss_penalty_vs_dp:+.2f} % ± "
            f"{100 * q.loss_penalty_uncertainty:.2f} pp against data-parallel on the same "
            f"tokens; ×{q.equivalent_token_factor:.3f} tokens ({lo:.3f}–{hi:.3f}) to reach its "
            f"loss: {c.dp_equivalent_hours:,.1f} h, {fmt.usd(c.dp_equivalent_cost_usd)}, "
            f"{fmt.energy(c.dp_equivalent_energy_kwh)}, {fmt.mass(c.dp_equivalent_co2_kg)} CO₂e"
            + (" (what the objective ranked)" if c.ranked_by_quality else "")
        )
        if details:
            lines.append(f"  basis: {q.basis}")
    else:
        lines.append(f"quality: {q.basis}")
    if c.islands == 1 and q.runs != DATA_PARALLEL_BASIS:
        lines.append(f"  runs: {q.runs}")
    lines += [f"  warning: {w}" for w in q.warnings]
    lines.append(
        f"energy: {fmt.energy(c.energy_kwh)} at the sites' meters (GPU draw × PUE), "
        f"{fmt.mass(c.co2_kg)} CO₂e"
    )
    if c.egress_gb > 0:
        lines.append(
            f"WAN egress: {c.egress_gb:,.0f} GB out of the sites, {fmt.usd(c.egress_usd)} "
            f"(in the cost; GPUs {fmt.usd(c.gpu_cost_usd)})"
        )
    if c.billed_gpus != c.gpus:
        lines.append(
            f"billed: {c.billed_gpus} GPUs for the {c.gpus} used (exclusiveNodes: whole nodes)"
        )
    return lines


def search_line(result: PlanResult) -> str:
    """How the search went: what was scored and whether the optimum is proven (or, stopped by
    ``--time-limit``, the proven gap)."""
    s = result.output.stats
    if s.mode == "exhaustive" and s.proven:
        verdict = "every layout scored (exact frontier)"
    elif s.mode == "frontier":
        verdict = "Pareto frontier by branch and bound" + (" (exact)" if s.proven else "")
    else:
        verdict = "branch and bound"
    if s.shapes_left:
        proof = (
            "time limit reached while building the search space: best found over the island "
            f"shapes built, {s.shapes_left:,} candidate shapes not simulated (no gap proven)"
        )
    elif s.proven:
        proof = "optimum exact" if s.mode == "exhaustive" else "optimum proven"
    elif s.gap is not None and math.isfinite(s.gap):
        proof = f"time limit reached: best found, proven gap ≤ {fmt.percent(s.gap)}"
    else:
        proof = "time limit reached: best found, no bound proven yet"
    return (
        f"search: {verdict}; {s.candidates_evaluated:,} plans scored in {s.seconds:.2f} s, "
        f"{s.frontier_size} on the Pareto frontier; {proof}"
    )


DETAILS_HINT = (
    "--details adds the token factor and energy columns, where the step's time goes, the "
    "quality's basis, why these DiLoCo settings when nothing blocks, the tie-break rule and "
    "the paper's §V figure"
)


def render_text(
    result: PlanResult,
    files: dict[str, str] | None = None,
    rows: int = 10,
    details: bool = False,
) -> str:
    """``shardmeter plan``'s text: short by default; ``details`` adds what `DETAILS_HINT`
    lists."""
    out = result.output
    spec = out.spec
    c, d = result.chosen, result.detail
    obj = spec.objective
    lines = [
        f"{spec.model.name}: {spec.training.total_tokens / 1e9:,.0f} B tokens, global batch "
        f"{spec.training.global_batch_tokens:,} tokens, seq {spec.training.seq_len_tokens}, "
        f"{spec.strategy.kind.value}, ≤ {spec.constraints.max_islands} islands",
        f"runtime: {spec.runtime.value}"
        + (
            " (equal tokens per island and inner step: what torchtitan + torchft can launch)"
            if spec.runtime.value == "torchtitan-ft"
            else " (token-weighted islands, the paper's ideal: not launchable with torchtitan-ft)"
        ),
        "coefficients: "
        + ", ".join(f"{k} {v}" for k, v in result.coefficient_sources.items())
        + (
            " — datasheet priors until the pools are benchmarked"
            if "prior" in result.coefficient_sources.values()
            else ""
        ),
        search_line(result),
        "ranking: "
        + (
            "by what reaching data-parallel's loss takes (figures × the equivalent-token "
            "factor; objective.qualityAdjusted)"
            if obj.quality_adjusted
            else "by the figures for the requested tokens (objective.qualityAdjusted: false)"
        )
        + (f"; CO₂e budget {fmt.mass(obj.co2_budget_kg)}" if obj.co2_budget_kg else ""),
        *([f"ties: {TIE_BREAK}"] if details else []),
        "",
        "Pareto frontier (fastest first):",
        plans_table(result.frontier[:rows], c, details),
    ]
    if len(result.frontier) > rows:
        lines.append(f"  … {len(result.frontier) - rows} more on the frontier (see --json)")
    lines += [
        "",
        f"chosen ({obj.kind.value}"
        + (f" {obj.throughput_fraction:g}" if obj.kind.value == "throughput-fraction" else "")
        + f"): {c.label}",
    ]
    group_rows = [
        [
            g.pool,
            g.label,
            g.micro_batch,
            g.accumulation,
            f"{g.local_batch_tokens:,}",
            fmt.seconds(g.step_s),
        ]
        for g in c.groups
    ]
    lines.append(
        fmt.table(
            [
                "pool",
                "islands",
                "micro-batch",
                "accumulation",
                "local batch (tokens)",
                "inner step",
            ],
            group_rows,
            "llrrrr",
        )
    )
    multi = c.islands > 1  # DiLoCo settings and outer steps exist only between islands
    lines += [
        f"global batch {c.global_batch_tokens:,} tokens per inner step; inner step {fmt.seconds(c.step_s)}"
        + (f" (with outer-step overhead {fmt.seconds(c.effective_step_s)})" if multi else ""),
        f"{fmt.si(c.tokens_per_s)} tokens/s, {c.hours:,.1f} h, {fmt.usd(c.cost_usd)} ({fmt.usd(c.usd_per_hour)}/h), "
        f"MFU {fmt.percent(c.mfu)} of the GPUs' dense "
        + ("fp32" if spec.training.precision.value == "fp32" else "bf16")
        + " peak"
        + (
            " (fp8 training: float8 matmuls run against a peak up to 2× that)"
            if spec.training.precision.value == "fp8"
            else ""
        ),
        f"bottleneck: {d.bottleneck} — {d.evidence if details else d.evidence_summary or d.evidence}",
        *footprint_lines(c, details),
    ]
    if d.diloco is not None and multi:
        r = d.diloco
        lines.append(
            f"Streaming DiLoCo: syncEvery {c.sync_every}, fragments {c.fragments}, fragmentSyncDelay "
            f"{c.fragment_sync_delay} over {d.outer_link}; fragment all_reduce "
            f"{fmt.seconds(max(r.fragment_all_reduce_s))}; blocking per outer step "
            f"{fmt.seconds(r.blocking_s_per_outer_step) if r.blocking_s_per_outer_step else '0'}; "
            f"slowdown vs no DiLoCo communication {fmt.percent(r.slowdown)}"
            if spec.strategy.kind.value == "streaming-diloco"
            else f"DiLoCo: syncEvery {c.sync_every} over {d.outer_link}; all_reduce "
            f"{fmt.seconds(max(r.fragment_all_reduce_s))} per outer step; slowdown {fmt.percent(r.slowdown)}"
        )
        if d.settings_reason and (details or r.blocking_s_per_outer_step > 0):
            lines.append(f"settings: {d.settings_reason}")  # what would hide blocking: always
    elif d.diloco is not None:  # one island: no outer all_reduce, fragments or overlap
        lines.append(
            f"one island: its outer optimizer steps every {c.sync_every} inner steps "
            "(syncEvery); nothing is exchanged between islands"
        )
    lines += paper_reading(result, details)
    lines += [f"unused pool {u.pool}: {u.reason}" for u in unused_pools(result)]
    for note in out.notes:
        lines.append(f"note: {note}")
    if not details:
        lines.append(f"({DETAILS_HINT})")
    if files:
        lines += ["", *[f"wrote {v}" for v in files.values()]]
    return "\n".join(lines)


def paper_reading(result: PlanResult, details: bool = False) -> list[str]:
    """The paper's §V reading: what the chosen plan saves against the fastest, and how much
    the plans within the throughput tolerance differ in cost (with ``details``, beside the
    paper's own figure)."""
    c, f, s = result.chosen, result.fastest, result.spread
    lines = []
    ranked = " (data-parallel-equivalent)" if c.ranked_by_quality else ""
    eq = " DP-eq." if c.ranked_by_quality else ""
    obj = result.output.spec.objective
    if f.layout != c.layout:
        lines.append(
            f"vs the fastest plan, {f.label} ({fmt.usd(f.rank_cost_usd)}{eq}): "
            f"{fmt.percent(result.saving_vs_fastest)} cheaper, "
            f"{fmt.percent(1 - c.rank_tokens_per_s / f.rank_tokens_per_s)} less{eq} throughput"
        )
    else:
        lines.append("the chosen plan is the fastest plan (no saving against it)")
    if obj.kind is not ObjectiveKind.THROUGHPUT_FRACTION:
        return lines  # the tolerance band and the paper's figure belong to that objective
    scope = "" if s.complete else " scored"
    lines.append(
        f"within {fmt.percent(s.throughput_fraction)} of the best throughput{ranked}: {s.plans:,} plan(s){scope}, "
        f"{fmt.usd(s.min_cost_usd)} ({s.cheapest}"
        + (", the chosen plan" if s.cheapest == c.label else "")
        + f") to {fmt.usd(s.max_cost_usd)} "
        f"({s.dearest}): the cheapest saves {fmt.percent(s.spread)} against the dearest"
        + (
            " (paper §V: the chosen plan saved 21.69 % against the fastest; here "
            f"{fmt.percent(result.saving_vs_fastest)})"
            if details
            else ""
        )
    )
    return lines
