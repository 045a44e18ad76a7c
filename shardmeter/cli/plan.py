"""shardmeter plan FILE: search island layouts, micro-batch/accumulation and Streaming
DiLoCo settings for a plan file; print the frontier and the chosen plan; with --out, write
the frontier plot (Fig. 7), the top-20 chart (Fig. 8), and the chosen plan's timeline and
trace (nothing is written without --out)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from shardmeter.cli.args import (
    HelpFormatter,
    check_output_folder,
    float_arg,
    int_arg,
    writing,
)
from shardmeter.cli.common import emit_json
from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.errors import SpecError
from shardmeter.output.plan_json import result_dict
from shardmeter.output.plan_plots import plot_frontier, plot_top
from shardmeter.output.plan_text import DETAILS_HINT, render_text
from shardmeter.output.sim_plots import diloco_caption, outer_step_window, plot_timeline
from shardmeter.output.trace import write_trace
from shardmeter.plan.bnb import Progress, ProgressCallback
from shardmeter.plan.result import (
    PlanResult,
    build_result,
    summarise,
    top_by_throughput,
    top_indices,
)
from shardmeter.plan.schema import ObjectiveKind, PlanSpec, load_plan
from shardmeter.plan.search import search
from shardmeter.spec.base import format_seconds

PROGRESS_AFTER_S = 2.0
"""Searches shorter than this show no progress."""
MAX_TIME_LIMIT_S = 7 * 86_400.0
"""Longest ``--time-limit`` (a week)."""
OUTPUT_FILES = ("frontier.png", "top20.png", "timeline.png", "trace.json")
"""What ``plan`` writes into ``--out``."""

EXAMPLES = """examples:
  shardmeter plan examples/case-study.yaml --out out/case-study  # tables and pictures
  shardmeter plan examples/case-study.yaml --json --time-limit 30
  shardmeter plan examples/trainingplan.yaml --pool-file examples/gpupool-cluster-a.yaml \\
                  --pool-file examples/gpupool-cluster-b.yaml --out /tmp/plan
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="find the best deployment for a plan file",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    p.add_argument("file", help="plan YAML/JSON (or a TrainingPlan manifest)")
    p.add_argument(
        "--pool-file",
        action="append",
        default=[],
        metavar="FILE",
        help="GPUPool manifest(s) a TrainingPlan manifest's pools refer to (repeatable)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write " + ", ".join(OUTPUT_FILES) + " into this folder, checked before the "
        "search (default: write no files)",
    )
    p.add_argument(  # files are written only with --out; kept so older scripts still run
        "--no-files", action="store_true", help=argparse.SUPPRESS
    )
    p.add_argument(
        "--colour-by",
        choices=["none", "co2"],
        default="none",
        help="colour the frontier plot's plans by their CO₂e (co2) or not (none, the default)",
    )
    p.add_argument(
        "--rows",
        type=int_arg(0, 100_000),
        default=10,
        metavar="N",
        help="frontier rows to print (0–100,000)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--details", action="store_true", help=DETAILS_HINT.removeprefix("--details "))
    p.add_argument(
        "--time-limit",
        type=float_arg(0, MAX_TIME_LIMIT_S, low_open=True, unit=" seconds"),
        metavar="S",
        help="stop after S seconds (> 0, ≤ a week), counted from reading the plan file and "
        "including building the search space, with the best plan found and its proven gap; "
        "building the space (each island shape simulated once, about a second for the case "
        "study) takes at most half of it, and a plan found over part of the space claims no "
        "gap (default: search to the end)",
    )
    p.add_argument(
        "--progress",
        choices=["auto", "bar", "json", "none"],
        default="auto",
        help="search progress on stderr for searches over 2 s: a bar on a terminal, JSON "
        "lines otherwise (auto, the default)",
    )
    p.set_defaults(run=run, flags={})


def load_coefficients(spec: PlanSpec, base: Path) -> dict[str, CoefficientsDocument | None]:
    docs: dict[str, CoefficientsDocument | None] = {}
    for pool in spec.pools:
        if pool.coefficients:
            path = Path(pool.coefficients)
            docs[pool.name] = CoefficientsDocument.read(path if path.is_absolute() else base / path)
        else:
            docs[pool.name] = None
    return docs


class JsonProgress:
    """One JSON line on ``stream`` every `PROGRESS_AFTER_S` seconds once a search has run that
    long (for logs: containers, CI)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.next_s = PROGRESS_AFTER_S

    def __call__(self, p: Progress) -> None:
        if p.elapsed_s < self.next_s and p.fraction < 1.0:
            return
        if p.elapsed_s < PROGRESS_AFTER_S:
            return
        self.next_s = p.elapsed_s + PROGRESS_AFTER_S
        gap = (p.best - p.bound) / p.best if math.isfinite(p.best) and p.best > 0 else None
        line = {
            "event": "plan.search.progress",
            "phase": p.phase,
            "fraction": round(p.fraction, 4),
            "plans_scored": p.scored,
            "elapsed_s": round(p.elapsed_s, 2),
            "best": p.best if math.isfinite(p.best) else None,
            "bound": p.bound,
            "gap": round(gap, 6) if gap is not None else None,
        }
        self.stream.write(json.dumps(line) + "\n")
        self.stream.flush()


class BarProgress:
    """A tqdm bar (shown after `PROGRESS_AFTER_S` seconds): share of the search tree done,
    the incumbent and the proven gap."""

    def __init__(self, stream: TextIO) -> None:
        self.bar = tqdm(
            total=1000,
            unit="‰",
            delay=PROGRESS_AFTER_S,
            file=stream,
            desc="searching",
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining} {postfix}",
        )
        self.phase = ""

    def __call__(self, p: Progress) -> None:
        if p.phase != self.phase:
            self.phase = p.phase
            self.bar.reset(total=1000)
            self.bar.set_description(p.phase)
        self.bar.n = int(1000 * p.fraction)
        gap = (p.best - p.bound) / p.best if math.isfinite(p.best) and p.best > 0 else None
        self.bar.set_postfix_str(
            f"{p.scored:,} plans" + (f", gap ≤ {gap:.2%}" if gap is not None else ""),
            refresh=False,
        )
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def plan_file(
    path: str,
    progress: str = "auto",
    pool_files: list[str] | None = None,
    time_limit_s: float | None = None,
) -> PlanResult:
    if time_limit_s is not None and not 0 < time_limit_s <= MAX_TIME_LIMIT_S:
        raise SpecError("--time-limit", f"must be > 0 and ≤ {MAX_TIME_LIMIT_S:g} seconds")
    started = time.monotonic()  # the limit counts from here: reading the files is part of it
    spec, base = load_plan(path, pool_files or [])
    docs = load_coefficients(spec, base)
    mode = progress
    if mode == "auto":
        mode = "bar" if sys.stderr.isatty() else "json"
    bar = BarProgress(sys.stderr) if mode == "bar" else None
    callback: ProgressCallback | None = (
        bar if bar is not None else JsonProgress(sys.stderr) if mode == "json" else None
    )
    try:
        remaining = None
        if time_limit_s is not None:
            remaining = max(1e-9, time_limit_s - (time.monotonic() - started))
        out = search(spec, docs, progress=callback, time_limit_s=remaining)
    finally:
        if bar is not None:
            bar.close()
    return build_result(out)


def write_files(result: PlanResult, folder: Path, colour_by: str = "none") -> dict[str, str]:
    out = result.output
    top = top_indices(result, 20)
    title = f"{out.spec.model.name} — {out.spec.strategy.kind.value}"
    obj = out.spec.objective
    fraction = obj.throughput_fraction if obj.kind is ObjectiveKind.THROUGHPUT_FRACTION else None
    s = result.spread
    eq = " DP-eq." if result.chosen.ranked_by_quality else ""
    files = {
        "frontier": str(
            plot_frontier(
                out.evaluated,
                result.frontier,
                result.chosen,
                result.fastest,
                folder / "frontier.png",
                f"{title}: cost vs runtime",
                colour_by,
            )
        ),
        "top20": str(
            plot_top(
                [summarise(out, out.evaluated, i) for i in top],
                folder / "top20.png",
                f"{title}: the {len(top)} highest-throughput plans (ties in the canonical order)"
                + (
                    ", data-parallel-equivalent as the objective ranks them"
                    if result.chosen.ranked_by_quality
                    else ""
                )
                + (
                    f"\n{s.plans} plans within {s.throughput_fraction:.0%} of the best{eq} "
                    f"throughput have a{eq} cost of USD {s.min_cost_usd:,.0f} to "
                    f"{s.max_cost_usd:,.0f} ({s.spread:.1%} spread); the chosen plan saves "
                    f"{result.saving_vs_fastest:.1%} against the fastest"
                    if fraction is not None
                    else f"\nchosen by {obj.kind.value}"
                ),
                result.chosen,
                fraction,
                top.index(out.chosen) if out.chosen in top else None,
            )
        ),
    }
    d = result.detail
    c = result.chosen
    window: tuple[float, float] | None = None
    if d.diloco is not None:
        schedule = d.diloco.schedule
        shown = outer_step_window(d.diloco, max(st.step_s for st in d.steps))
        window = (shown.start_s, shown.end_s)
        caption = (
            diloco_caption(out.spec.strategy.kind.value, c.islands, d.outer_link or "", d.diloco)
            + "\n"
            + shown.caption
        )
    else:
        schedule = d.steps[0].schedule
        caption = f"fsdp: one island; shown: one step ({format_seconds(d.steps[0].step_s)})"
    files["timeline"] = str(
        plot_timeline(schedule, folder / "timeline.png", f"chosen: {c.label}\n{caption}", window)
    )
    files["trace"] = str(
        write_trace(schedule, folder / "trace.json", f"shardmeter plan: {result.chosen.label}")
    )
    return files


def run(args: argparse.Namespace) -> int:
    folder = None
    if args.out:  # files only when asked for
        folder = Path(args.out)
        check_output_folder(folder, "--out", OUTPUT_FILES)
    result = plan_file(args.file, args.progress, args.pool_file, args.time_limit)
    files: dict[str, str] = {}
    if folder is not None:
        target = folder
        files = writing("--out", folder, lambda: write_files(result, target, args.colour_by))
    if args.json:
        emit_json(result_dict(result, top_by_throughput(result, 20), files))
    else:
        print(render_text(result, files, args.rows, args.details))
    return 0
