"""Plan pictures: every scored plan's cost against runtime with the Pareto frontier
highlighted (paper Fig. 7), and the highest-throughput plans with their cost (Fig. 8)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shardmeter.output import format as fmt
from shardmeter.output.sim_plots import pyplot, save_figure
from shardmeter.plan.evaluate import Evaluation
from shardmeter.plan.result import PlanSummary


def plot_frontier(
    evaluated: Evaluation,
    frontier: Sequence[PlanSummary],
    chosen: PlanSummary,
    fastest: PlanSummary,
    path: str | Path,
    title: str = "",
    colour_by: str = "none",
) -> Path:
    """Every scored plan's cost against its runtime, on the figures the objective ranks by
    (data-parallel-equivalent when quality-adjusted), the frontier highlighted.
    ``colour_by="co2"`` colours the plans by their CO₂e, with a colour bar."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5), layout="constrained")
    ok = evaluated.feasible
    x, y = evaluated.rank_time_s[ok] / 3600, evaluated.rank_cost_usd[ok]
    if colour_by == "co2" and ok.any():
        co2 = evaluated.rank_co2_kg[ok] / 1000
        cloud = ax.scatter(
            x,
            y,
            s=8,
            c=co2,
            cmap="viridis",
            label=f"feasible plans ({int(ok.sum()):,}), coloured by CO₂e",
            rasterized=True,
        )
        fig.colorbar(cloud, ax=ax, label="CO₂e (t)")
    else:
        ax.scatter(
            x, y, s=6, color="#b0b0b0", label=f"feasible plans ({int(ok.sum()):,})", rasterized=True
        )
    fx = [p.rank_hours for p in frontier]
    fy = [p.rank_cost_usd for p in frontier]
    ax.plot(
        fx,
        fy,
        "-o",
        color="#1f77b4",
        markersize=4,
        linewidth=1.2,
        label=f"Pareto frontier ({len(frontier)})",
    )
    ax.scatter(
        [fastest.rank_hours],
        [fastest.rank_cost_usd],
        s=90,
        marker="^",
        color="#d62728",
        zorder=4,
        label=f"fastest: {fastest.label}",
    )
    ax.scatter(
        [chosen.rank_hours],
        [chosen.rank_cost_usd],
        s=160,
        marker="*",
        color="#2ca02c",
        zorder=5,
        label=f"chosen: {chosen.label}",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    eq = " to data-parallel's loss" if chosen.ranked_by_quality else ""
    ax.set_xlabel(f"wall-clock{eq} (hours)")
    ax.set_ylabel(f"cost{eq} (USD)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper right")
    if title:
        ax.set_title(title, fontsize=10)
    return save_figure(fig, path)


def plot_top(
    plans: Sequence[PlanSummary],
    path: str | Path,
    title: str = "",
    chosen: PlanSummary | None = None,
    throughput_fraction: float | None = None,
    chosen_position: int | None = None,
) -> Path:
    """The paper's Fig. 8: the highest-throughput plans (best first, ties in the canonical
    order) as labelled bars of tokens/s with their cost as a line — the figures the objective
    ranks, named as the text's frontier table names them: "DP-eq. tokens/s" and "DP-eq. cost"
    when quality-adjusted (what reaching data-parallel's loss takes), plain tokens/s and cost
    otherwise; the bar labels are written as that table writes them. With
    ``throughput_fraction`` bars within it of the best are dark, the rest light, and a dashed
    line marks it; the chosen plan (``chosen_position``, else the first bar with its layout)
    is starred. The axis starts near the plans, as the paper's does, but never at the best
    value: plans that all tie keep visible bars and the dashed line on the chart."""
    plt = pyplot()
    n = len(plans)
    equivalent = any(p.ranked_by_quality for p in plans)
    tps_name, cost_name = ("DP-eq. tokens/s", "DP-eq. cost") if equivalent else ("tokens/s", "cost")
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * n + 3), 5.5), layout="constrained")
    x = np.arange(n)
    tps = np.array([p.rank_tokens_per_s for p in plans])
    best = float(tps.max()) if n else 0.0
    floor = (throughput_fraction or 0.0) * best
    within = tps >= floor * (1 - 1e-12)
    colors = np.where(within, "#1f77b4", "#aec7e8")
    label = tps_name + (
        " = tokens/s ÷ the plan's token factor (data-parallel-equivalent)" if equivalent else ""
    )
    if throughput_fraction:
        label += f"; dark: ≥ {throughput_fraction:.0%} of the best"
    bars = ax.bar(x, tps, color=colors, label=label)
    if n:
        ax.bar_label(bars, labels=[fmt.si(v) for v in tps], rotation=90, fontsize=6, padding=2)
    if throughput_fraction:
        ax.axhline(
            floor,
            color="#555555",
            linestyle="--",
            linewidth=1,
            label=f"{throughput_fraction:.0%} of the best {tps_name}",
        )
    if n and best > 0:
        lo = float(tps.min())
        if throughput_fraction:
            lo = min(lo, floor)
        span = max(best - lo, 0.02 * best)  # all tied: a band of 2 % of the best
        ax.set_ylim(bottom=max(0.0, lo - 0.25 * span), top=best + 0.2 * span)
    ax.set_ylabel(f"{tps_name} (axis not from zero)")
    ax.yaxis.set_major_formatter(lambda v, _: fmt.si(v).replace(".00 ", " "))
    ax.set_xticks(
        x, [f"{i + 1}. {p.label}" for i, p in enumerate(plans)], rotation=60, ha="right", fontsize=7
    )
    ax2 = ax.twinx()
    costs = [p.rank_cost_usd for p in plans]
    ax2.plot(x, costs, "-o", color="#ff7f0e", markersize=4, label=f"{cost_name} (USD)")
    if chosen is not None:
        if chosen_position is None:
            chosen_position = next(
                (i for i, p in enumerate(plans) if p.layout == chosen.layout), None
            )
        if chosen_position is not None:
            ax2.scatter(
                [chosen_position],
                [costs[chosen_position]],
                s=180,
                marker="*",
                color="#2ca02c",
                zorder=5,
                label=f"chosen: {chosen_position + 1}. {chosen.label}",
            )
    if n:
        clo, chi = min(costs), max(costs)
        cspan = max(chi - clo, 0.02 * chi)
        ax2.set_ylim(bottom=max(0.0, clo - 0.25 * cspan), top=chi + 0.25 * cspan)
    ax2.set_ylabel(f"{cost_name} (USD)")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    fig.legend(handles=handles, fontsize=8, loc="outside upper right", ncol=2, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return save_figure(fig, path)
