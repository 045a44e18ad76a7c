"""Simulator speed (issue targets: one FSDP step of a 32-block model with 8 micro-steps
≤ 5 ms; Streaming DiLoCo with 10 islands and 1,000 inner steps ≤ 1 s). Prints medians.

    .venv/bin/python benchmarks/bench_simulator.py
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

from shardmeter.cost.model import CostModel
from shardmeter.sim.diloco import IslandSteps, simulate_diloco
from shardmeter.sim.fsdp import FSDPDurations, simulate_fsdp_step
from shardmeter.spec.model import MODEL_PRESETS
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import StreamingSettings, TrainingSpec


def median_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float, float]:
    fn()  # warm up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), min(samples), max(samples)


def main() -> None:
    model = MODEL_PRESETS["llama-3.1-8b"]  # 32 blocks
    cm = CostModel(
        model,
        TrainingSpec(seq_len_tokens=8192, global_batch_tokens=8192 * 64),
        PoolSpec(name="p", gpu="h200", nodes=1, gpus_per_node=8),
    )
    durations = FSDPDurations.from_cost_model(cm, 1, 8, 1)
    med, lo, hi = median_ms(lambda: simulate_fsdp_step(durations, accumulation=8), 50)
    print(
        f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    print(
        f"FSDP step, 32 blocks, 8 micro-steps (build + simulate + analyse): median {med:.2f} ms "
        f"(min {lo:.2f}, max {hi:.2f}; target ≤ 5 ms)"
    )
    islands = [IslandSteps(f"island{i}", 1.0 + 0.01 * i, (0.01,) * 4) for i in range(10)]
    settings = StreamingSettings(sync_every=100, fragments=4, fragment_sync_delay=10)
    med, lo, hi = median_ms(lambda: simulate_diloco(islands, settings, [5.0] * 4, rounds=10), 5)
    print(
        f"Streaming DiLoCo, 10 islands × 1,000 inner steps (with the no-communication baseline): "
        f"median {med:.1f} ms (min {lo:.1f}, max {hi:.1f}; target ≤ 1,000 ms)"
    )


if __name__ == "__main__":
    main()
