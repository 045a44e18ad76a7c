"""``shardmeter plan --time-limit S`` honoured (issue #28): the wall time of planning a file
under a limit — from reading the plan file to the result built, what the limit counts
(`shardmeter.cli.plan.plan_file`) — against the limit, for the case study, six pools and
10 pools × 64 nodes × 8 GPUs at several limits. Target: within 10 % of the limit (a search
that finishes sooner is fine). Every run simulates from scratch (the FSDP step cache is
cleared), as a fresh ``shardmeter plan`` process does. Prints medians over the repeats, and
how each run ended: finished (optimum proven), stopped in the search (proven gap) or stopped
while building the space (shapes left unsimulated, no gap over them).

    .venv/bin/python benchmarks/bench_timelimit.py [--repeats 3] [--skip-large]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from bench_optimizer import large_instance  # noqa: E402
from test_plan_timelimit import six_pools  # noqa: E402

from shardmeter.cli.plan import plan_file  # noqa: E402
from shardmeter.plan.schema import PlanSpec  # noqa: E402
from shardmeter.plan.search import SearchStats  # noqa: E402
from shardmeter.sim.fsdp import fsdp_step_seconds  # noqa: E402


def write(spec: PlanSpec, folder: Path, name: str) -> str:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", by_alias=True)))
    return str(path)


def ended(s: SearchStats) -> str:
    if s.shapes_left:
        return f"build cut ({s.shapes_left} shapes left)"
    if s.proven:
        return "finished"
    return f"search cut (gap {s.gap:.1%})" if s.gap is not None else "search cut (no bound)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-large", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = [
            ("case study", str(REPO / "examples" / "case-study.yaml"), [0.25, 0.5, 1.0, 2.0]),
            ("six pools", write(six_pools({"kind": "min-cost"}), folder, "six"), [0.25, 0.5, 1.0]),
        ]
        if not args.skip_large:
            big = write(large_instance(batch_tokens=2 * 2**20), folder, "big")
            cases.append(("10 pools × 64 nodes, 2 Mi tokens", big, [1.0, 3.0, 5.0, 12.0, 15.0]))
            big8 = write(large_instance(batch_tokens=8 * 2**20), folder, "big8")
            cases.append(("10 pools × 64 nodes, 8 Mi tokens", big8, [5.0, 12.0]))
        print(f"{'instance':<34} {'limit':>7} {'median wall':>12} {'max':>8} {'ratio':>6}  ended")
        worst = 0.0
        for name, path, limits in cases:
            for limit in limits:
                walls, how = [], []
                for _ in range(args.repeats):
                    fsdp_step_seconds.cache_clear()
                    started = time.monotonic()
                    result = plan_file(path, progress="none", time_limit_s=limit)
                    walls.append(time.monotonic() - started)
                    how.append(ended(result.output.stats))
                median = statistics.median(walls)
                worst = max(worst, median / limit)
                print(
                    f"{name:<34} {limit:6.2f}s {median:11.2f}s {max(walls):7.2f}s "
                    f"{median / limit:5.0%}  {', '.join(sorted(set(how)))}",
                    flush=True,
                )
        verdict = "met" if worst <= 1.1 else "NOT met"
        print(f"target: median wall ≤ 110 % of the limit: {verdict} (worst {worst:.0%})")


if __name__ == "__main__":
    main()
