"""Memory model: monotone in micro-batch, consistent max micro-batch, sensible knobs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shardmeter.cost.coefficients import MemoryCoefficients
from shardmeter.cost.memory import max_micro_batch, memory_breakdown, min_ranks_for_memory
from shardmeter.spec.hardware import GPU_PRESETS
from shardmeter.spec.model import MODEL_PRESETS, TransformerSpec
from shardmeter.spec.training import TrainingSpec
from strategies import transformer_specs

H200 = float(GPU_PRESETS["h200-141gb-sxm"].memory_bytes)
COEFS = MemoryCoefficients()


def training(seq: int = 4096, ac: bool = False) -> TrainingSpec:
    return TrainingSpec(seq_len_tokens=seq, global_batch_tokens=seq, activation_checkpointing=ac)


@given(
    transformer_specs(), st.integers(1, 64), st.integers(0, 16), st.sampled_from([512, 2048, 8192])
)
def test_memory_monotone_in_micro_batch(
    spec: TransformerSpec, ranks: int, b: int, seq: int
) -> None:
    t = training(seq)
    lo = memory_breakdown(spec, t, ranks, b, H200, COEFS).total_bytes
    hi = memory_breakdown(spec, t, ranks, b + 1, H200, COEFS).total_bytes
    assert hi > lo


@given(transformer_specs(), st.integers(2, 64), st.sampled_from([1024, 4096]), st.booleans())
def test_max_micro_batch_is_the_largest_that_fits(
    spec: TransformerSpec, ranks: int, seq: int, ac: bool
) -> None:
    t = training(seq, ac)
    b = max_micro_batch(spec, t, ranks, H200, COEFS)
    if b >= 1:
        assert memory_breakdown(spec, t, ranks, b, H200, COEFS).fits
    assert not memory_breakdown(spec, t, ranks, b + 1, H200, COEFS).fits


@given(transformer_specs(), st.integers(2, 32))
def test_more_ranks_never_lower_max_micro_batch(spec: TransformerSpec, ranks: int) -> None:
    t = training()
    assert max_micro_batch(spec, t, 2 * ranks, H200, COEFS) >= max_micro_batch(
        spec, t, ranks, H200, COEFS
    )


def test_checkpointing_and_no_accumulation_buy_micro_batch() -> None:
    m = MODEL_PRESETS["llama-3.1-8b"]
    plain = max_micro_batch(m, training(8192), 8, H200, COEFS)
    ac = max_micro_batch(m, training(8192, ac=True), 8, H200, COEFS)
    accum = max_micro_batch(m, training(8192), 8, H200, COEFS, accumulation=4)
    assert ac > plain >= accum
    on_gpu = max_micro_batch(m, training(8192), 8, H200, COEFS, outer_state_on_gpu=True)
    assert on_gpu <= plain


def test_seventy_b_needs_many_gpus() -> None:
    m = MODEL_PRESETS["llama-3.1-70b"]
    need = min_ranks_for_memory(m, training(4096, ac=True), H200, COEFS)
    assert need is not None and 8 < need <= 16  # 70.6 B × 16 bytes of state ≈ 1.1 TB
    assert max_micro_batch(m, training(4096, ac=True), need - 1, H200, COEFS) == 0


def test_activation_scale_is_a_coefficient() -> None:
    m = MODEL_PRESETS["llama-3.2-1b"]
    t = training(4096)
    base = memory_breakdown(m, t, 8, 2, H200, COEFS).activation_bytes
    doubled = memory_breakdown(m, t, 8, 2, H200, COEFS.model_copy(update={"activation_scale": 2.0}))
    assert doubled.activation_bytes == 2 * base
