"""Predicted vs published GPU-cluster training throughput, from datasheet priors.

    .venv/bin/python benchmarks/bench_published.py [--file PATH] [--json]

Default file: ``../shared/calibration/published-throughput.json`` (torchtitan A100 Llama and
llm-foundry MPT A100/H100 runs). Prints one row per point — id, setup, published and
predicted tokens/s per GPU, their ratio, the bottleneck, predicted vs published MFU — and
the median and max |error| (goal: ≤ 10 % and ≤ 25 %). Points the model cannot express are
listed with the reason and left out of the figures. Exit status 0 whether or not the goal is
met (this is a measurement); 2 when the file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from shardmeter.calibration import Report, read
from shardmeter.errors import ShardMeterError

_ROOT = Path(__file__).resolve().parents[1]
_CANDIDATES = [
    base / "shared" / "calibration" / "published-throughput.json"
    for base in (_ROOT.parent, _ROOT.parent.parent)  # checkout beside shared/, or a worktree
]
DEFAULT_FILE = next((c for c in _CANDIDATES if c.exists()), _CANDIDATES[0])
MEDIAN_GOAL, MAX_GOAL = 0.10, 0.25


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def render(report: Report, path: str) -> str:
    head = (
        f"{'id':<30} {'setup':<62} {'published':>9} {'predicted':>9} {'ratio':>6} "
        f"{'bottleneck':<20} {'MFU pred':>8} {'MFU pub':>8}"
    )
    lines = [f"{path} — predictions from datasheet priors", head, "-" * len(head)]
    for p in report.predictions:
        fit = "" if p.fits_in_memory else "  (predicted not to fit in memory)"
        lines.append(
            f"{p.id:<30} {p.setup:<62} {p.published_tokens_per_s_per_gpu:>9.0f} "
            f"{p.predicted_tokens_per_s_per_gpu:>9.0f} {p.ratio:>6.2f} {p.bottleneck:<20} "
            f"{_pct(p.predicted_mfu):>8} {_pct(p.published_mfu):>8}{fit}"
        )
    for s in report.skipped:
        lines.append(f"{s.id:<30} not predicted: {s.reason}")
    n = len(report.predictions)
    if n:
        med, worst = report.median_error, report.max_error
        lines += [
            "",
            f"{n} points predicted, {len(report.skipped)} skipped; "
            f"median |error| {_pct(med)} (goal ≤ {_pct(MEDIAN_GOAL)}), "
            f"max |error| {_pct(worst)} (goal ≤ {_pct(MAX_GOAL)}) — "
            + ("goal met" if med <= MEDIAN_GOAL and worst <= MAX_GOAL else "goal NOT met"),
        ]
    lines.append(
        f"machine: {platform.machine()} {platform.processor() or ''} Python {platform.python_version()}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(DEFAULT_FILE), help="calibration JSON file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    try:
        report = read(args.file)
    except ShardMeterError as exc:
        print(
            f"bench_published: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            file=sys.stderr,
        )
        return 2
    if args.json:
        payload = {
            "file": args.file,
            "median_error": report.median_error,
            "max_error": report.max_error,
            "points": [
                {
                    "id": p.id,
                    "setup": p.setup,
                    "published": p.published_tokens_per_s_per_gpu,
                    "predicted": p.predicted_tokens_per_s_per_gpu,
                    "ratio": p.ratio,
                    "bottleneck": p.bottleneck,
                    "predicted_mfu": p.predicted_mfu,
                    "published_mfu": p.published_mfu,
                    "fits_in_memory": p.fits_in_memory,
                }
                for p in report.predictions
            ],
            "skipped": [{"id": s.id, "reason": s.reason} for s in report.skipped],
        }
        print(json.dumps(payload, indent=2))
    else:
        print(render(report, args.file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
