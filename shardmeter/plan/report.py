"""Plan results as text tables and as JSON-ready dicts (the CLI's ``--json`` and the
operator's status both use `result_dict`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardmeter.cli import format as fmt
from shardmeter.plan.result import PlanResult, PlanSummary, summarise


def top_by_throughput(result: PlanResult, n: int = 20) -> list[PlanSummary]:
    """The ``n`` highest-throughput distinct plans scored (ties: cheaper first)."""
    ev = result.output.evaluated
    ok = np.flatnonzero(ev.feasible)
    order = ok[np.lexsort((ev.cost_usd[ok], -ev.tokens_per_s[ok]))]
    out: list[PlanSummary] = []
    seen: set[str] = set()
    for i in order:
        s = summarise(result.output, ev, int(i))
        if s.label not in seen:
            seen.add(s.label)
            out.append(s)
        if len(out) == n:
            break
    return out


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


def render_text(result: PlanResult, files: dict[str, str] | None = None, rows: int = 10) -> str:
    out = result.output
    spec = out.spec
    c, d = result.chosen, result.detail
    lines = [
        f"{spec.model.name}: {spec.training.total_tokens / 1e9:,.0f} B tokens, global batch "
        f"{spec.training.global_batch_tokens:,} tokens, seq {spec.training.seq_len_tokens}, "
        f"{spec.strategy.kind.value}, ≤ {spec.constraints.max_islands} islands",
        "coefficients: "
        + ", ".join(f"{k} {v}" for k, v in result.coefficient_sources.items())
        + (
            " — datasheet priors until the pools are benchmarked"
            if "prior" in result.coefficient_sources.values()
            else ""
        ),
        f"search: {out.stats.mode}, {out.stats.candidates_evaluated:,} plans scored in {out.stats.seconds:.2f} s, "
        f"{out.stats.frontier_size} on the Pareto frontier",
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
    if result.fastest != c:
        lines.append(
            f"vs the fastest plan ({result.fastest.label}): {fmt.percent(result.saving_vs_fastest)} cheaper, "
            f"{fmt.percent(1 - c.tokens_per_s / result.fastest.tokens_per_s)} less throughput"
        )
    for note in out.notes:
        lines.append(f"note: {note}")
    if files:
        lines += ["", *[f"wrote {v}" for v in files.values()]]
    return "\n".join(lines)


def result_dict(
    result: PlanResult, top: list[PlanSummary] | None = None, files: dict[str, str] | None = None
) -> dict[str, Any]:
    d = result.detail
    diloco = None
    if d.diloco is not None:
        r = d.diloco
        diloco = {
            "outer_link": d.outer_link,
            "period_s": r.period_s,
            "blocking_s_per_outer_step": r.blocking_s_per_outer_step,
            "slowdown": r.slowdown,
            "fragment_all_reduce_s": list(r.fragment_all_reduce_s),
            "island_idle_s_per_outer_step": list(r.island_idle_s_per_outer_step),
        }
    out = result.output
    return {
        "chosen": {
            **result.chosen.as_dict(),
            "bottleneck": d.bottleneck,
            "evidence": d.evidence,
            "simulated_diloco": diloco,
        },
        "fastest": result.fastest.as_dict(),
        "saving_vs_fastest": result.saving_vs_fastest,
        "objective": out.spec.objective.model_dump(),
        "frontier": [p.as_dict() for p in result.frontier],
        "top_by_throughput": [p.as_dict() for p in (top or [])],
        "coefficients": result.coefficient_sources,
        "search": {
            "mode": out.stats.mode,
            "plans_scored": out.stats.candidates_evaluated,
            "seconds": out.stats.seconds,
            "frontier_size": out.stats.frontier_size,
        },
        "notes": out.notes,
        "excluded_shapes": {c.pool.name: c.notes for c in out.contexts if c.notes},
        "files": files or {},
    }
