"""``shardmeter plan FILE``: search island layouts, micro-batch/accumulation and Streaming
DiLoCo settings for a plan file; print the frontier and the chosen plan; write the frontier
plot (Fig. 7), the top-20 chart (Fig. 8), and the chosen plan's timeline and trace."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from shardmeter.cli.common import emit_json
from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.plan.plots import plot_frontier, plot_top
from shardmeter.plan.report import render_text, result_dict, top_by_throughput
from shardmeter.plan.result import PlanResult, build_result
from shardmeter.plan.schema import PlanSpec, load_plan
from shardmeter.plan.search import search
from shardmeter.sim.plot import plot_timeline
from shardmeter.sim.trace import write_trace


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="find the best deployment for a plan file", description=__doc__)
    p.add_argument("file", help="plan YAML/JSON (or a TrainingPlan manifest)")
    p.add_argument(
        "--pool-file",
        action="append",
        default=[],
        metavar="FILE",
        help="GPUPool manifest(s) a TrainingPlan manifest's pools refer to (repeatable)",
    )
    p.add_argument("--out", help="folder for pictures and the trace (default out/<file name>)")
    p.add_argument("--no-files", action="store_true", help="write no pictures or trace")
    p.add_argument("--rows", type=int, default=10, help="frontier rows to print (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(run=run)


def load_coefficients(spec: PlanSpec, base: Path) -> dict[str, CoefficientsDocument | None]:
    docs: dict[str, CoefficientsDocument | None] = {}
    for pool in spec.pools:
        if pool.coefficients:
            path = Path(pool.coefficients)
            docs[pool.name] = CoefficientsDocument.read(path if path.is_absolute() else base / path)
        else:
            docs[pool.name] = None
    return docs


def plan_file(path: str, progress: bool = True, pool_files: list[str] | None = None) -> PlanResult:
    spec, base = load_plan(path, pool_files or [])
    docs = load_coefficients(spec, base)
    bar = tqdm(
        unit=" plans",
        delay=1.0,
        disable=not progress or not sys.stderr.isatty(),
        file=sys.stderr,
        desc="searching",
    )
    try:
        out = search(spec, docs, progress=bar.update)
    finally:
        bar.close()
    return build_result(out)


def write_files(result: PlanResult, folder: Path) -> dict[str, str]:
    out = result.output
    title = f"{out.spec.model.name} — {out.spec.strategy.kind.value}"
    files = {
        "frontier": str(
            plot_frontier(
                out.evaluated,
                result.frontier,
                result.chosen,
                result.fastest,
                folder / "frontier.png",
                f"{title}: cost vs runtime",
            )
        ),
        "top20": str(
            plot_top(
                top_by_throughput(result, 20),
                folder / "top20.png",
                f"{title}: the 20 highest-throughput plans",
            )
        ),
    }
    d = result.detail
    if d.diloco is not None:
        schedule = d.diloco.schedule
        step = max(s.step_s for s in d.steps)
        span = min(d.diloco.period_s, max(6, 2 * d.diloco.settings.window) * step * 1.05)
        begin = schedule.makespan_s - d.diloco.period_s
        window: tuple[float, float] | None = (begin, begin + span)
    else:
        schedule = d.steps[0].schedule
        window = None
    files["timeline"] = str(
        plot_timeline(schedule, folder / "timeline.png", f"chosen: {result.chosen.label}", window)
    )
    files["trace"] = str(
        write_trace(schedule, folder / "trace.json", f"shardmeter plan: {result.chosen.label}")
    )
    return files


def run(args: argparse.Namespace) -> int:
    result = plan_file(args.file, progress=not args.json, pool_files=args.pool_file)
    files: dict[str, str] = {}
    if not args.no_files:
        folder = Path(args.out) if args.out else Path("out") / Path(args.file).stem
        files = write_files(result, folder)
    if args.json:
        emit_json(result_dict(result, top_by_throughput(result, 20), files))
    else:
        print(render_text(result, files, args.rows))
    return 0
