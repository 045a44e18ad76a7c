"""``shardmeter plan`` as text: the frontier table, the chosen plan, the paper's reading
(saving against the fastest plan, the cost spread within the throughput tolerance) and how
the search went."""

from __future__ import annotations

import math

from shardmeter.output import format as fmt
from shardmeter.plan.result import PlanResult, PlanSummary


def _blocking(p: PlanSummary) -> str:
    if p.sync_every <= 1 and p.fragments <= 1 and p.blocking_s_per_outer_step == 0:
        return "-"
    return fmt.seconds(p.blocking_s_per_outer_step) if p.blocking_s_per_outer_step > 0 else "0"


def plans_table(plans: list[PlanSummary], chosen: PlanSummary) -> str:
    rows = []
    for p in plans:
        mark = "→" if p == chosen else " "
        rows.append(
            [
                f"{mark} {p.label}",
                p.gpus,
                fmt.si(p.tokens_per_s),
                f"{p.hours:,.1f}",
                fmt.usd(p.cost_usd),
                fmt.percent(p.mfu),
                _blocking(p),
            ]
        )
    return fmt.table(
        [
            "plan (islands×nodes×GPUs)",
            "GPUs",
            "tokens/s",
            "hours",
            "cost",
            "MFU",
            "blocking/outer step",
        ],
        rows,
        "lrrrrrr",
    )


def search_line(result: PlanResult) -> str:
    s = result.output.stats
    verdict = {
        "exhaustive": "every layout scored (exact frontier)",
        "frontier": "exact Pareto frontier by branch and bound",
        "objective": "branch and bound",
    }[s.mode]
    if s.proven:
        proof = "optimum proven" if s.mode != "exhaustive" else "optimum exact"
    elif s.gap is not None and math.isfinite(s.gap):
        proof = f"time limit reached: best found, proven gap ≤ {fmt.percent(s.gap)}"
    else:
        proof = "time limit reached: best found, gap unknown"
    return (
        f"search: {verdict}; {s.candidates_evaluated:,} plans scored in {s.seconds:.2f} s, "
        f"{s.frontier_size} on the Pareto frontier; {proof}"
    )


def render_text(result: PlanResult, files: dict[str, str] | None = None, rows: int = 10) -> str:
    out = result.output
    spec = out.spec
    c, d = result.chosen, result.detail
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
        "",
        "Pareto frontier (fastest first):",
        plans_table(result.frontier[:rows], c),
    ]
    if len(result.frontier) > rows:
        lines.append(f"  … {len(result.frontier) - rows} more on the frontier (see --json)")
    obj = spec.objective
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
    lines += [
        f"global batch {c.global_batch_tokens:,} tokens per inner step; inner step {fmt.seconds(c.step_s)} "
        f"(with outer-step overhead {fmt.seconds(c.effective_step_s)})",
        f"{fmt.si(c.tokens_per_s)} tokens/s, {c.hours:,.1f} h, {fmt.usd(c.cost_usd)} ({fmt.usd(c.usd_per_hour)}/h), "
        f"MFU {fmt.percent(c.mfu)}",
        f"bottleneck: {d.bottleneck} — {d.evidence}",
    ]
    if d.diloco is not None:
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
        if d.settings_reason:
            lines.append(f"settings: {d.settings_reason}")
    lines += paper_reading(result)
    for note in out.notes:
        lines.append(f"note: {note}")
    if files:
        lines += ["", *[f"wrote {v}" for v in files.values()]]
    return "\n".join(lines)


def paper_reading(result: PlanResult) -> list[str]:
    """The paper's §V reading: what the chosen plan saves against the fastest, and how much
    the plans within the throughput tolerance differ in cost."""
    c, f, s = result.chosen, result.fastest, result.spread
    lines = []
    if f.layout != c.layout:
        lines.append(
            f"vs the fastest plan ({f.label}, {fmt.usd(f.cost_usd)}): {fmt.percent(result.saving_vs_fastest)} "
            f"cheaper, {fmt.percent(1 - c.tokens_per_s / f.tokens_per_s)} less throughput"
        )
    else:
        lines.append("the chosen plan is the fastest plan (no saving against it)")
    scope = "" if s.complete else " scored"
    lines.append(
        f"within {fmt.percent(s.throughput_fraction)} of the best throughput: {s.plans:,} plan(s){scope}, "
        f"{fmt.usd(s.min_cost_usd)} ({s.cheapest}) to {fmt.usd(s.max_cost_usd)} ({s.dearest}): "
        f"the cheapest saves {fmt.percent(s.spread)} against the dearest (paper §V: 21.69 % against "
        "the fastest)"
    )
    return lines
