"""Peak memory of the CPU compute profiling run (issue goal: ≤ 8 GiB; before the memory
budget it was OOM-killed on a 24 GiB host at 24.3 GB resident, shape 15 of 16).

    python benchmarks/bench_compute_memory.py                    # compute --scale full
    python benchmarks/bench_compute_memory.py --max-memory-gib 4  # a tighter budget

Runs ``python -m shardmeter_bench compute --device cpu --scale full`` and follows the
resident memory of its process tree from ``/proc`` (every 0.2 s) and the kernel's own
maximum RSS; prints both, the wall time and the shapes profiled. The run is ended if the tree
passes ``--kill-above-gib`` (the host is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rss_watch import gib, run_watched

GOAL_BYTES = 8 * 2**30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, help="catalog shapes (default: the scale's)")
    parser.add_argument("--max-memory-gib", type=float, help="the bench's budget (default 5)")
    parser.add_argument("--kill-above-gib", type=float, default=7.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as folder:
        out = Path(folder) / "coefficients.json"
        cmd = [sys.executable, "-m", "shardmeter_bench", "compute", "--device", "cpu",
               "--scale", "full", "--out", str(out), "--log-format", "json"]  # fmt: skip
        if args.configs:
            cmd += ["--configs", str(args.configs)]
        if args.max_memory_gib:
            cmd += ["--max-memory-gib", str(args.max_memory_gib)]
        print("$", " ".join(cmd[1:]), flush=True)
        errors = Path(folder) / "stderr.jsonl"
        with open(errors, "w") as err:
            watched = run_watched(
                cmd, args.kill_above_gib * 2**30, stdout=subprocess.DEVNULL, stderr=err
            )
        events = [json.loads(line) for line in errors.read_text().splitlines() if line[:1] == "{"]
    shapes = sum(1 for e in events if e.get("event") == "shape_done")
    if watched.killed:
        print(f"ended: the process tree passed {args.kill_above_gib} GiB after {shapes} shapes")
        return 1
    if watched.returncode != 0:
        print(f"compute failed with status {watched.returncode} after {shapes} shapes")
        return watched.returncode
    verdict = "meets" if watched.peak_process_bytes <= GOAL_BYTES else "misses"
    print(
        f"{shapes} shapes in {watched.wall_s / 60:.1f} min; peak RSS {gib(watched.peak_process_bytes)}"
        f" (kernel maximum), process tree {gib(watched.peak_tree_bytes)} (sampled); "
        f"goal ≤ {gib(GOAL_BYTES)}: {verdict}; load (1 min) after {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
