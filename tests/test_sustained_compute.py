"""What a datasheet GPU sustains in a training step: GEMM wave quantization (checked against
S. Bekman's worked staircase), the MAMF benchmark's duty cycle (checked against its loop
worked out by hand) and the power-limited clock of a busier step."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardmeter.cost.coefficients import Source
from shardmeter.cost.gemm import block_wave_efficiency, wave_efficiency
from shardmeter.cost.model import CostModel
from shardmeter.cost.power import sustained_clock_ratio
from shardmeter.spec.hardware import GPU_PRESETS, mamf_duty_cycle
from shardmeter.spec.model import MODEL_PRESETS
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import TrainingSpec


def test_waves_reproduce_bekmans_staircase() -> None:
    # ML Engineering, "Do more SMs give more TFLOPS?": the Llama-3.1-8B MLP up-projection at
    # 8K tokens, 8192 x 14336 over 128x256 tiles = 3,584 blocks: 25 waves on 148 SMs, 24 on
    # 152, a 1.042x speedup for 2.7 % more SMs
    m, n = 8192, 14336
    speedup = (152 * wave_efficiency(m, n, 152)) / (148 * wave_efficiency(m, n, 148))
    assert speedup == pytest.approx(1.042, abs=5e-4)
    assert wave_efficiency(m, n, 148) == pytest.approx(3584 / (25 * 148))
    # 148 blocks on 148 SMs: one full wave; on 152, 4 SMs idle
    assert wave_efficiency(128, 148 * 256, 148) == 1.0
    assert wave_efficiency(128, 148 * 256, 152) == pytest.approx(148 / 152)


@given(st.integers(1, 20000), st.integers(1, 20000), st.integers(1, 200))
def test_wave_efficiency_is_a_fraction(m: int, n: int, sms: int) -> None:
    assert 0 < wave_efficiency(m, n, sms) <= 1


def test_block_gemms_on_one_sm_waste_only_partial_tiles() -> None:
    spec = MODEL_PRESETS["llama-3.1-8b"]  # every width a multiple of 256
    assert block_wave_efficiency(spec, 8192, 1) == (1.0, 1.0)
    fwd, bwd = block_wave_efficiency(spec, 8192, 132)
    assert 0.9 < fwd < 1 and 0.9 < bwd < 1


def test_mamf_duty_cycle_matches_the_finder_loop_by_hand() -> None:
    # A100 best shape 1024x10240x5120 at 271.2 TFLOP/s: 2*1024*10240*5120 = 107.4 GFLOP in
    # 396 µs; per iteration the finder zeroes 256 MiB and rewrites the 21 MB output (read +
    # write): 310.4 MB at 0.85 x 2.039 TB/s = 179 µs
    assert mamf_duty_cycle(1024, 10240, 5120, 271.2e12, 2.039e12) == pytest.approx(
        395.9 / (395.9 + 179.1), abs=1e-3
    )
    a100 = GPU_PRESETS["a100-80gb-sxm"]
    assert a100.matmul_efficiency_duty_cycle == pytest.approx(0.689, abs=1e-3)
    # faster HBM: shorter copies between the matmuls, a busier loop
    h100, h200 = GPU_PRESETS["h100-80gb-sxm"], GPU_PRESETS["h200-141gb-sxm"]
    assert h100.matmul_efficiency_duty_cycle < h200.matmul_efficiency_duty_cycle < 1


def test_sustained_clock_follows_the_cube_law() -> None:
    # back-to-back tensor work: the clock falls by the cube root of the benchmark's duty
    assert sustained_clock_ratio(0.6, 1.0) == pytest.approx(0.6 ** (1 / 3))
    # a step no busier than the benchmark keeps the benchmark's clock (no boost credited)
    assert sustained_clock_ratio(0.6, 0.6) == 1.0 and sustained_clock_ratio(0.6, 0.3) == 1.0
    with pytest.raises(ValueError, match="duty cycles"):
        sustained_clock_ratio(0.0, 0.5)


@given(st.floats(0.05, 1.0), st.floats(0.05, 1.0))
def test_sustained_clock_holds_the_power_balance(bench: float, step: float) -> None:
    r = sustained_clock_ratio(bench, step)
    assert 0 < r <= 1
    if r < 1:
        # duty at the new clock x clock³ equals the benchmark's: the same average power
        tensor, other = step / r, 1 - step
        assert tensor / (tensor + other) * r**3 == pytest.approx(bench, rel=1e-6)
    assert sustained_clock_ratio(bench, min(1.0, step + 0.01)) <= r + 1e-12


def test_priors_run_a_busier_step_at_a_lower_clock_and_measured_fits_as_measured() -> None:
    spec = MODEL_PRESETS["llama-3.1-8b"]
    pool = PoolSpec(name="p", gpu="h100", nodes=1, gpus_per_node=8)

    def cm(**options: object) -> CostModel:
        t = TrainingSpec(seq_len_tokens=8192, global_batch_tokens=8192, **options)  # type: ignore[arg-type]
        return CostModel(spec, t, pool)

    eager, compiled = cm().unit_times(1), cm(torch_compile=True).unit_times(1)
    # compile removes memory-bound time: busier tensor cores, a lower power-limited clock
    assert compiled.tensor_duty_cycle > eager.tensor_duty_cycle
    assert compiled.matmul_clock_ratio < eager.matmul_clock_ratio < 1
    # …and is still faster end to end
    assert compiled.block_forward_s < eager.block_forward_s
    bench = pool.gpu.matmul_efficiency_duty_cycle
    assert compiled.matmul_clock_ratio == pytest.approx(
        sustained_clock_ratio(bench, compiled.tensor_duty_cycle)
    )
    # a pool's measured coefficients were timed on the pool: no benchmark duty to convert
    prior = cm().coefficients
    measured = prior.model_copy(update={"source": Source.MEASURED, "measured_at": prior.created_at})
    t = TrainingSpec(seq_len_tokens=8192, global_batch_tokens=8192)
    as_measured = CostModel(spec, t, pool, measured).unit_times(1)
    assert as_measured.matmul_clock_ratio == 1.0
    assert as_measured.block_forward_s < eager.block_forward_s
