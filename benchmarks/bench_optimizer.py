"""Optimizer speed (issue #11 targets, on a 2-core machine): the paper's case study searched
exhaustively in ≤ 1 s; 10 pools × 64 nodes × 8 GPUs with ≤ 16 islands at 2 Mi- and 8 Mi-token
global batches in ≤ 30 s with the optimum proven; ``seqLenTokens: 1`` without blowing up.
Prints medians (every run simulates from scratch: the FSDP step cache is cleared) and whether
each search proved its optimum, plus the case study's reading beside the paper's and what
explaining the unused pools costs after each search (`shardmeter.plan.unused`).

    .venv/bin/python benchmarks/bench_optimizer.py [--repeats N] [--skip-large] [--runtime R]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

from shardmeter.plan.result import PlanResult, build_result
from shardmeter.plan.schema import PlanSpec, load_plan
from shardmeter.plan.search import SearchOutput, search
from shardmeter.plan.unused import unused_pools
from shardmeter.sim.fsdp import fsdp_step_seconds

REPO = Path(__file__).resolve().parents[1]
GPUS = [("h200", 3.59), ("a100", 1.19), ("h100", 2.49), ("l40s", 0.86)]


def large_instance(
    pools: int = 10, nodes: int = 64, batch_tokens: int = 8 * 2**20, runtime: str = "torchtitan-ft"
) -> PlanSpec:
    """10 pools of 64 nodes × 8 GPUs: four GPU types, three sites, prices spread ±15 %."""
    return PlanSpec.model_validate(
        {
            "model": "llama-3.1-8b",
            "training": {
                "seqLenTokens": 8192,
                "globalBatchTokens": batch_tokens,
                "totalTokens": 50 * 10**9,
                "activationCheckpointing": True,
            },
            "strategy": {"kind": "streaming-diloco", "outerPrecision": "bf16"},
            "pools": [
                {
                    "name": f"pool-{i}",
                    "gpu": GPUS[i % 4][0],
                    "nodes": nodes,
                    "gpusPerNode": 8,
                    "site": f"site-{i % 3}",
                    "wanUplink": "wan-100g-10ms",
                    "pricePerGpuHourUsd": round(GPUS[i % 4][1] * (1 + 0.03 * i), 3),
                }
                for i in range(pools)
            ],
            "constraints": {"maxIslands": 16},
            "runtime": runtime,
        }
    )


def timed(spec: PlanSpec, repeats: int) -> tuple[list[float], SearchOutput]:
    samples: list[float] = []
    out: SearchOutput | None = None
    for _ in range(repeats):
        fsdp_step_seconds.cache_clear()  # every run simulates from scratch
        t0 = time.perf_counter()
        out = search(spec)
        samples.append(time.perf_counter() - t0)
    assert out is not None
    return samples, out


def line(name: str, samples: list[float], out: SearchOutput, target: str) -> str:
    s = out.stats
    proof = (
        "optimum exact (every layout)"
        if s.mode == "exhaustive" and s.proven
        else "optimum proven"
        if s.proven
        else f"gap ≤ {s.gap:.2%}"
        if s.gap is not None
        else "not proven"
    )
    return (
        f"{name}: median {statistics.median(samples):.2f} s over {len(samples)} runs "
        f"(min {min(samples):.2f}, max {max(samples):.2f}; target {target}); {s.mode}, "
        f"{s.candidates_evaluated:,} plans scored; {proof}"
    )


def unused_line(out: SearchOutput, repeats: int) -> str:
    """What explaining the unused pools costs on top of the search (`unused_pools`: the
    layouts scored that use each pool and, after branch and bound, the chosen plan with
    each of its options added), and the first explanation."""
    r = build_result(out)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        unused = unused_pools(r)
        samples.append(time.perf_counter() - t0)
    first = unused[0].reason if unused else "-"
    return (
        f"  unused pools explained: {len(unused)} in median {1000 * statistics.median(samples):.0f} ms "
        f"over {repeats} runs; first: {first[:160]}"
    )


def plan_line(r: PlanResult) -> str:
    c, f = r.chosen, r.fastest
    return (
        f"  chosen {c.label}: {c.tokens_per_s:,.0f} tokens/s, {c.hours:.2f} h, ${c.cost_usd:,.0f}; "
        f"fastest {f.label}: {f.tokens_per_s:,.0f} tokens/s, ${f.cost_usd:,.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument(
        "--runtime",
        action="append",
        choices=["torchtitan-ft", "weighted"],
        help="runtimes for the large instance (default: both)",
    )
    args = parser.parse_args()
    spec, _ = load_plan(REPO / "examples" / "case-study.yaml")
    samples, out = timed(spec, args.repeats)
    r = build_result(out)
    print(line(f"case study ({spec.runtime.value})", samples, out, "≤ 1 s"))
    print(plan_line(r))
    print(unused_line(out, args.repeats))
    s = r.spread
    print(
        f"  saving of the chosen plan against the fastest: {r.saving_vs_fastest:.2%}; "
        f"{s.plans} plans within {s.throughput_fraction:.0%} of the best throughput cost "
        f"${s.min_cost_usd:,.0f}–${s.max_cost_usd:,.0f} ({s.spread:.2%} spread) "
        "(paper: 21.69 % saving; ours from datasheet priors)"
    )
    seq1 = spec.model_copy(
        update={"training": spec.training.model_copy(update={"seq_len_tokens": 1})}
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    samples, out = timed(seq1, max(1, min(args.repeats, 3)))
    peak = max(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024
    print(line("case study, seqLenTokens 1", samples, out, "no blow-up"))
    print(f"  peak RSS of this process so far {peak:,.0f} MiB; notes: {'; '.join(out.notes)}")
    if args.skip_large:
        return
    for runtime in args.runtime or ["torchtitan-ft", "weighted"]:
        for batch in (2, 8):
            big = large_instance(batch_tokens=batch * 2**20, runtime=runtime)
            samples, out = timed(big, max(1, min(args.repeats, 3)))
            print(
                line(
                    f"10 pools × 64 nodes × 8 GPUs, ≤ 16 islands, {batch} Mi tokens, {runtime}",
                    samples,
                    out,
                    "≤ 30 s",
                )
            )
            print(plan_line(build_result(out)))
            print(unused_line(out, max(1, min(args.repeats, 3))))


if __name__ == "__main__":
    main()
