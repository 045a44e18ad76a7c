"""The operator under API faults. Targets: after a one-minute storm of faults (500s, 429s with
Retry-After, resets, answers lost after the write applied, 0.5–4 s delays, watch streams cut
mid-event, watch resumes answered 410, 409s on status patches) over 20 TrainingPlans and 3
GPUPools, every object converges to what a run without faults gives — statuses, children,
each Event exactly once, every gauge — within 15 s of the storm's end; and after an API
outage longer than kopf's default retries (150 s), the operator is still up and converges
as quickly.

The emulated API server and the operator run as subprocesses; the operator talks to the API
through the seeded fault proxy of ``tests/support/faultproxy.py`` (scenario:
``tests/support/storm.py``). Figures are medians over ``--runs`` seeds; the machine is shared,
so the convergence time also carries the planning of whatever reconciles were retried.

    .venv/bin/python benchmarks/bench_faults.py [--runs 3] [--plans 20] [--storm 60] [--outage 150]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support import storm  # noqa: E402
from support.faultproxy import FaultRates  # noqa: E402


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--runs", type=int, default=3)
    args.add_argument("--plans", type=int, default=20)
    args.add_argument("--storm", type=float, default=60.0, help="seconds of faults")
    args.add_argument("--outage", type=float, default=150.0, help="seconds of a total outage")
    opts = args.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        want = storm.reference(Path(tmp) / "reference", opts.plans)
        print(
            f"reference run without faults: {opts.plans} plans, 3 pools, settled in "
            f"{time.monotonic() - started:.1f} s"
        )
        converged: list[float] = []
        for seed in range(opts.runs):
            r = storm.run(
                Path(tmp) / f"storm-{seed}",
                want,
                plans_count=opts.plans,
                storm_s=opts.storm,
                seed=seed,
            )
            faults = sum(r.faults.values())
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(r.faults.items()))
            verdict = (
                f"converged {r.converged_after_s:.1f} s after the storm"
                if r.converged_after_s is not None
                else "NOT converged: " + "; ".join(r.problems[:5])
            )
            print(
                f"storm seed {seed}: {faults} faults in {opts.storm:.0f} s over {r.requests} "
                f"requests ({kinds}); {verdict}; operator {'up' if r.alive else 'DOWN'}"
            )
            if r.converged_after_s is not None:
                converged.append(r.converged_after_s)
        if converged:
            print(
                f"storm: converged in {len(converged)}/{opts.runs} runs; median "
                f"{statistics.median(converged):.1f} s, max {max(converged):.1f} s after the "
                "storm (target ≤ 15 s)"
            )
        if opts.outage > 0:
            r = storm.run(
                Path(tmp) / "outage",
                want,
                plans_count=opts.plans,
                storm_s=opts.outage,
                seed=100,
                rates=FaultRates(),
                blackout=True,
            )
            verdict = (
                f"converged {r.converged_after_s:.1f} s after the API came back"
                if r.converged_after_s is not None
                else "NOT converged: " + "; ".join(r.problems[:5])
            )
            print(
                f"outage: every request failed for {opts.outage:.0f} s (503 or a reset); "
                f"operator {'up' if r.alive else 'DOWN'}; {verdict}"
            )


if __name__ == "__main__":
    main()
