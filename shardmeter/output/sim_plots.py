"""PNG timelines in the style of the paper's Figs. 1, 3 and 6 and a batch-size sweep
(Figs. 3/4). Matplotlib with the Agg backend; imported lazily (it is slow to import)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardmeter.sim.diloco import DiLoCoResult
from shardmeter.sim.engine import Kind, Schedule
from shardmeter.spec.base import format_seconds

LEGEND: dict[str, str] = {
    "all_gather": "#d62728",  # red, as in the paper
    "reduce_scatter": "#ff7f0e",  # orange
    "forward": "#6fa8e6",  # light blue
    "backward / inner step": "#1f5fa8",  # blue
    "optimizer / outer step": "#0b2e59",
    "outer all_reduce": "#2ca02c",  # green
    "blocked on outer all_reduce": "#7f0000",
    "waiting for slower islands": "#c7c7c7",
}
LABEL: dict[Kind, str] = {
    Kind.ALL_GATHER: "all_gather",
    Kind.REDUCE_SCATTER: "reduce_scatter",
    Kind.FORWARD: "forward",
    Kind.BACKWARD: "backward / inner step",
    Kind.INNER_STEP: "backward / inner step",
    Kind.OPTIMIZER: "optimizer / outer step",
    Kind.OUTER_STEP: "optimizer / outer step",
    Kind.OUTER_ALL_REDUCE: "outer all_reduce",
}
BLOCKED = "blocked on outer all_reduce"
IMBALANCE = "waiting for slower islands"


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` as a PNG (folders created) and release it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=120)
    pyplot().close(fig)
    return target


@dataclass(frozen=True)
class TimelineWindow:
    """The seconds a timeline shows and a caption saying which part of the run they are."""

    start_s: float
    end_s: float
    caption: str


def outer_step_window(result: DiLoCoResult, step_s: float) -> TimelineWindow:
    """The window a (Streaming) DiLoCo timeline shows: the last simulated outer step (steady
    state) — all of it when it spans few inner steps, else its first two fragment windows (at
    least 6 inner steps), long enough to show the fragments' all_reduces overlapping compute."""
    period, s = result.period_s, result.settings
    begin = result.schedule.makespan_s - period
    span = min(period, max(6, 2 * s.window) * step_s * 1.05) if step_s > 0 else period
    last = f"the last of {result.rounds} simulated outer steps"
    if span >= period:
        caption = f"shown: {last}, whole ({format_seconds(period)}: {s.sync_every} inner steps)"
    else:
        caption = (
            f"shown: the first {format_seconds(span)} (about {span / step_s:.0f} of "
            f"{s.sync_every} inner steps) of {last}, which lasts {format_seconds(period)}"
        )
    return TimelineWindow(begin, begin + span, caption)


def diloco_caption(kind: str, islands: int, link: str, result: DiLoCoResult) -> str:
    """A DiLoCo timeline's strategy line: islands, link, settings and blocking."""
    s = result.settings
    blocking = result.blocking_s_per_outer_step
    return (
        f"{kind}, {islands} islands over {link}: syncEvery {s.sync_every}, fragments "
        f"{s.fragments}, fragmentSyncDelay {s.fragment_sync_delay} — "
        + (f"blocked {format_seconds(blocking)} per outer step" if blocking > 0 else "no blocking")
    )


@dataclass(frozen=True)
class _Bar:
    row: str
    start_s: float
    dur_s: float
    label: str


def _bars(
    schedule: Schedule, window: tuple[float, float], inner: Mapping[int, Schedule] | None
) -> tuple[list[str], list[_Bar]]:
    g = schedule.graph
    rows: list[str] = []
    bars: list[_Bar] = []
    lo, hi = window

    def row(name: str) -> str:
        if name not in rows:
            rows.append(name)
        return name

    for sid, sname in enumerate(g.stream_names):
        expand = inner is not None and any(
            g.kind[i] is Kind.INNER_STEP and g.group[i] in inner for i in schedule.stream_tasks(sid)
        )
        base = sname.rpartition("/")[0] or sname
        if expand:
            row(f"{base}/compute")
            row(f"{base}/comm")
        else:
            row(sname)
        for i in schedule.stream_tasks(sid):
            s, e = schedule.start[i], schedule.end[i]
            if e < lo or s > hi:
                continue
            if expand and g.kind[i] is Kind.INNER_STEP and inner is not None:
                sub = inner[g.group[i]]
                sg = sub.graph
                for k in range(len(sg)):
                    target = (
                        f"{base}/comm"
                        if sg.kind[k].category.value == "communication"
                        else f"{base}/compute"
                    )
                    bars.append(_Bar(target, s + sub.start[k], sg.duration[k], LABEL[sg.kind[k]]))
            else:
                bars.append(
                    _Bar(
                        row(f"{base}/compute") if expand else sname,
                        s,
                        g.duration[i],
                        LABEL[g.kind[i]],
                    )
                )
        for gap, why in schedule.outer_waits(sid):
            if gap.end_s >= lo and gap.start_s <= hi:
                target = f"{base}/compute" if expand else sname
                bars.append(
                    _Bar(
                        target,
                        gap.start_s,
                        gap.seconds,
                        BLOCKED if why == "blocking" else IMBALANCE,
                    )
                )
    return rows, bars


MIN_BAR_PX = 3.0
"""Tasks shorter than this many pixels are drawn this wide, so that every kind in the legend
is visible (an outer optimizer step of 20 ms in a 200 s window would be 0.1 px)."""
AXES_PX = 1250
"""About the axes' width in pixels (a 12-inch figure at 120 dpi, less the row labels)."""


def plot_timeline(
    schedule: Schedule,
    path: str | Path,
    title: str = "",
    window: tuple[float, float] | None = None,
    inner: Mapping[int, Schedule] | None = None,
) -> Path:
    """Draw ``schedule`` (optionally only ``window`` seconds). ``inner`` maps an island
    index to its FSDP step schedule: inner steps are then drawn with their all_gathers,
    reduce_scatters and forward/backward passes, as in the paper's Fig. 6. Tasks too short to
    see are drawn `MIN_BAR_PX` wide; the legend lists the kinds drawn; a margin on either side
    shows where the window ends."""
    plt = pyplot()
    from matplotlib.patches import Patch

    window = window or (0.0, schedule.makespan_s)
    rows, bars = _bars(schedule, window, inner)
    lines = _wrapped(title).count("\n") + 1 if title else 0
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 2.0 + 0.2 * lines), layout="constrained")
    y = {name: idx for idx, name in enumerate(rows)}
    span_s = window[1] - window[0]
    scale, unit = (1e3, "ms") if span_s < 2 else (1.0, "s")
    min_s = span_s * MIN_BAR_PX / AXES_PX
    separate = len(bars) < 400  # thin white edges between tasks, unless they would drown them
    for bar in bars:
        blocked = bar.label == BLOCKED
        widened = bar.dur_s < min_s
        ax.broken_barh(
            [(bar.start_s * scale, max(bar.dur_s, min_s) * scale)],
            (y[bar.row] - 0.4, 0.8),
            facecolors=LEGEND[bar.label],
            edgecolor=LEGEND[BLOCKED]
            if blocked
            else ("white" if separate and not widened else "none"),
            linewidth=0.3 if (separate and not widened) or blocked else 0,
            hatch="///" if blocked else None,
        )
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    margin = 0.01 * span_s
    ax.set_xlim((window[0] - margin) * scale, (window[1] + margin) * scale)
    ax.set_xlabel(f"time ({unit})")
    if title:
        ax.set_title(_wrapped(title), fontsize=10)
    longest: dict[str, float] = {}
    per_row: dict[tuple[str, str], float] = {}
    for bar in bars:
        longest[bar.label] = max(longest.get(bar.label, 0.0), bar.dur_s)
        per_row[bar.label, bar.row] = per_row.get((bar.label, bar.row), 0.0) + bar.dur_s
    slivers = {  # a kind that would be invisible at this scale, drawn wider: the legend says so
        label
        for label, dur in longest.items()
        if dur < min_s and max(t for (k, _), t in per_row.items() if k == label) < 5 * min_s
    }
    handles = [
        Patch(
            facecolor=colour,
            hatch="///" if label == BLOCKED else None,
            label=label
            + (
                f" (≤ {format_seconds(longest[label])} each, drawn {MIN_BAR_PX:g} px wide)"
                if label in slivers
                else ""
            ),
        )
        for label, colour in LEGEND.items()
        if label in longest
    ]
    if handles:
        fig.legend(
            handles=handles,
            loc="outside lower center",
            ncol=min(len(handles), 7),
            fontsize=8,
            frameon=False,
        )
    return save_figure(fig, path)


TITLE_CHARS = 150
"""A title line longer than this is wrapped (a 12-inch figure at font size 10 holds ~160)."""


def _wrapped(title: str) -> str:
    import textwrap

    return "\n".join(textwrap.fill(line, TITLE_CHARS) for line in title.splitlines())


@dataclass(frozen=True)
class SweepPoint:
    micro_batch: int
    step_s: float
    compute_idle_fraction: float
    tokens_per_s: float
    fits: bool


def plot_batch_sweep(points: Sequence[SweepPoint], path: str | Path, title: str = "") -> Path:
    """Step time and compute idle fraction versus micro-batch (paper Figs. 3 and 4); points
    that exceed GPU memory are drawn hollow, as the paper greys them, and the legend says so."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    b = [p.micro_batch for p in points]
    for ax, values, label in (
        (ax1, [p.step_s for p in points], "step time (s)"),
        (ax2, [100 * p.compute_idle_fraction for p in points], "compute idle (%)"),
    ):
        ax.plot(b, values, color="#1f77b4", linewidth=1)
        for p, v in zip(points, values, strict=True):
            ax.scatter(
                [p.micro_batch],
                [v],
                color="#1f77b4" if p.fits else "white",
                edgecolors="#1f77b4",
                zorder=3,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(b, [str(x) for x in b])
        ax.set_xlabel("micro-batch (sequences per GPU)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    handles = [
        Line2D(
            [], [], marker="o", color="#1f77b4", linestyle="none", markerfacecolor=face, label=text
        )
        for face, text in (("#1f77b4", "fits in GPU memory"), ("white", "exceeds GPU memory"))
    ]
    if not all(p.fits for p in points):
        fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    else:
        fig.legend(handles=handles[:1], loc="outside lower center", fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)
