"""The bench's side of the fit: a CPU peak probe that read low is raised to what the
profiled units demonstrably ran at, the summary shows the rate each FLOP coefficient
implies, and CPU timing uses this thread's CPU time (what a busy host cannot inflate)."""

from __future__ import annotations

import time

import pytest
import torch

from shardmeter.cost.coefficients import ComputeSample
from shardmeter.cost.features import Target, feature_values
from shardmeter.cost.floors import FLOPS_PER_UNIT, demonstrated_flop_per_s
from shardmeter.spec.hardware import LINK_PRESETS, GPUSpec
from shardmeter.spec.model import TransformerSpec
from shardmeter.spec.training import Precision
from shardmeter_bench.device import PROBE_HEADROOM, best_seconds, compute_clock
from shardmeter_bench.fit import fit, fit_summary, probed_peak_at_least_demonstrated, render_summary

CPU = GPUSpec(
    name="cpu-test-1t",
    memory_bytes=16 * 2**30,
    peak_bf16_flop_per_s=40e9,
    peak_fp32_flop_per_s=40e9,  # a probe on a busy host; the units below run at 80
    hbm_bandwidth_bytes_per_s=2e10,
    tdp_watts=10,
    default_intra_node_link="pcie4",
    default_inter_node_link="eth-100g",
)


pytestmark = pytest.mark.usefixtures("one_thread")


def samples_at(rate_flop_per_s: float) -> list[ComputeSample]:
    out = []
    for k, hidden in enumerate((256, 384, 512, 640, 768)):
        spec = TransformerSpec(
            name=f"s{k}",
            hidden_size=hidden,
            num_layers=2,
            num_attention_heads=hidden // 64,
            num_key_value_heads=1 + k % 2,
            intermediate_size=3 * hidden,
            vocab_size=32000,
        )
        for target in (Target.BLOCK_FORWARD, Target.BLOCK_BACKWARD, Target.HEAD_FORWARD):
            for b in (1, 2, 4):
                values = feature_values(spec, b, 128)
                flops = sum(n * values[f] for f, n in FLOPS_PER_UNIT[target].items())
                out.append(
                    ComputeSample(
                        target=target,
                        model=spec.model_dump(by_alias=False),
                        micro_batch=b,
                        seq_len=128,
                        seconds=flops / rate_flop_per_s + 1e-4,
                        group=spec.name,
                    )
                )
    return out


def test_a_probe_that_read_low_is_raised_to_the_demonstrated_rate() -> None:
    samples = samples_at(80e9)
    demonstrated = demonstrated_flop_per_s(samples)
    assert 75e9 < demonstrated < 80e9
    raised, notes = probed_peak_at_least_demonstrated(CPU, Precision.FP32, samples)
    assert raised.peak_fp32_flop_per_s == pytest.approx(demonstrated * PROBE_HEADROOM)
    assert raised.peak_bf16_flop_per_s == CPU.peak_bf16_flop_per_s  # the other precision
    assert len(notes) == 1 and "probe read 40.0 GFLOP/s" in notes[0]
    same, none = probed_peak_at_least_demonstrated(raised, Precision.FP32, samples)
    assert same == raised and none == []

    doc = fit(
        gpu=CPU,
        precision=Precision.FP32,
        intra_node=LINK_PRESETS["pcie4"],
        inter_node=LINK_PRESETS["eth-100g"],
        compute=samples,
        communication=[],
        memory=[],
        pool=None,
        device_type="cpu",
    )
    assert doc.gpu.peak_fp32_flop_per_s == pytest.approx(demonstrated * PROBE_HEADROOM)
    summary = fit_summary(doc)
    rates = summary["compute"]["block.forward"]["implied_flop_per_s"]
    assert set(rates) == set(FLOPS_PER_UNIT[Target.BLOCK_FORWARD])  # always kept
    assert all(r <= doc.gpu.peak_fp32_flop_per_s * (1 + 1e-9) for r in rates.values())
    assert "features (implied GFLOP/s)" in render_summary(summary)


def test_cpu_compute_is_timed_on_this_threads_cpu_clock() -> None:
    cpu = torch.device("cpu")
    assert compute_clock(cpu) is time.thread_time
    torch.set_num_threads(2)
    assert compute_clock(cpu) is time.perf_counter  # other threads' work would be missed
    torch.set_num_threads(1)
    # sleeping costs no CPU time: a descheduled process is not charged for the wait
    assert best_seconds(lambda: time.sleep(0.02), cpu, repeats=2) < 0.01
