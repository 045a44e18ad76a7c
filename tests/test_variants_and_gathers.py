"""Issue 26: GPU and model variants as a preset plus overrides (CLI values, files, pools),
named as variants; a GPU variant's own power limit; the format FSDP all-gathers in."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from shardmeter.cost.attention import relative_speed
from shardmeter.cost.model import CostModel
from shardmeter.cost.power import clock_fraction
from shardmeter.errors import SpecError
from shardmeter.spec.hardware import GPU_PRESETS
from shardmeter.spec.loading import gpu_from_arg, model_from_arg
from shardmeter.spec.model import MODEL_PRESETS
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import AttentionKernel as K
from shardmeter.spec.training import TrainingSpec


def test_inline_model_override_is_named_as_a_variant() -> None:
    m = model_from_arg("{preset: llama-3.1-8b, numLayers: 16}")
    assert m.num_layers == 16 and m.name == "Llama-3.1-8B (numLayers=16)"
    assert m.hidden_size == MODEL_PRESETS["llama-3.1-8b"].hidden_size
    named = model_from_arg('{"preset": "llama-3.1-8b", "numLayers": 16, "name": "mine"}')
    assert named.name == "mine"


def test_a_file_with_a_preset_needs_only_the_overrides(tmp_path: Path) -> None:
    path = tmp_path / "gpu.yaml"
    path.write_text("preset: h100\npowerLimitWatts: 500\nmemoryBytes: 96 GB\n")
    gpu = gpu_from_arg(str(path))
    assert gpu.memory_bytes == 96e9 and gpu.power_limit_watts == 500
    assert gpu.name.startswith("H100-80GB-SXM (powerLimitWatts=500")


def test_bad_overrides_name_the_field() -> None:
    with pytest.raises(SpecError, match=r"--model\.numLayers"):
        model_from_arg("{preset: llama-3.1-8b, numLayers: 0}")
    with pytest.raises(SpecError, match=r"--gpu\.preset: unknown GPU preset"):
        gpu_from_arg("{preset: h1000}")
    with pytest.raises(SpecError, match="exceeds tdpWatts"):
        gpu_from_arg("{preset: h100, powerLimitWatts: 900}")


def test_a_gpu_variants_power_limit_is_a_cap_the_pool_can_lower() -> None:
    h100 = GPU_PRESETS["h100-80gb-sxm"]
    capped = gpu_from_arg("{preset: h100, powerLimitWatts: 500}")
    assert clock_fraction(h100, 500) == clock_fraction(capped, None) < 1.0
    assert clock_fraction(capped, 400) == clock_fraction(h100, 400)
    assert clock_fraction(capped, 650) == clock_fraction(capped, None)  # the lower holds
    pool = PoolSpec(
        name="p", gpu={"preset": "h100", "powerLimitWatts": 500}, nodes=1, gpus_per_node=8
    )
    assert pool.gpu.power_limit() == 500


def _cm(**training: object) -> CostModel:
    t = TrainingSpec(seq_len_tokens=4096, global_batch_tokens=4096, **training)  # type: ignore[arg-type]
    return CostModel(
        MODEL_PRESETS["llama-3.1-8b"], t, PoolSpec(name="p", gpu="h100", nodes=4, gpus_per_node=8)
    )


def test_float8_and_fp32_all_gathers_move_the_bytes_they_name() -> None:
    bf16, fp8 = _cm(precision="fp8"), _cm(precision="fp8", param_all_gather="fp8")
    fp32 = _cm(param_all_gather="fp32")
    block = bf16.payloads().block_params
    assert fp8.training.gather_bytes() == 1 and fp8.training.gather_bytes(block=False) == 2
    assert fp32.training.gather_bytes() == 4 == fp32.training.gather_bytes(block=False)
    b, f, w = (m.gather_seconds(block, 4, 8) for m in (bf16, fp8, fp32))
    assert f < b < w
    # the root unit (embedding, LM head) is no float8 linear: gathered in bf16 either way
    root = bf16.payloads().embedding_params
    assert fp8.gather_seconds(root, 4, 8, block=False) == bf16.gather_seconds(root, 4, 8, False)
    # gathering FP32 master weights for bf16 compute also casts them after the gather
    assert fp32.fsdp_copy_seconds(block)[0] > bf16.fsdp_copy_seconds(block)[0]


def test_float8_all_gather_needs_float8_compute() -> None:
    with pytest.raises(ValidationError, match="needs precision fp8"):
        TrainingSpec(seq_len_tokens=8, global_batch_tokens=8, paramAllGather="fp8")


def test_gemm_depth_costs_small_k_and_credits_nothing_beyond_the_reference() -> None:
    from shardmeter.cost.gemm import K_FIXED, depth_efficiency

    ref = 13312
    assert depth_efficiency(2048, None) == 1.0
    assert depth_efficiency(4 * ref, ref) == 1.0
    by_hand = (2048 / (2048 + K_FIXED)) / (ref / (ref + K_FIXED))
    assert depth_efficiency(2048, ref) == pytest.approx(by_hand) and 0.88 < by_hand < 0.92
    assert depth_efficiency(1536, ref) < depth_efficiency(2048, ref) < depth_efficiency(8192, ref)


def test_a_gpupool_takes_a_power_capped_memory_variant() -> None:
    from shardmeter_operator.api import GPUPoolSpec

    pool = GPUPoolSpec.model_validate(
        {
            "gpu": {"preset": "h100", "powerLimitWatts": 500, "memoryBytes": "96 GB"},
            "nodes": 2,
            "gpusPerNode": 8,
        }
    )
    assert pool.gpu.power_limit() == 500 and pool.gpu.memory_bytes == 96e9
    assert "(powerLimitWatts=500" in pool.gpu.name


def test_the_attention_kernel_sets_the_attention_rate_and_nothing_else() -> None:
    # FlashAttention in Triton: FlashAttention-2 is ~1.4x faster forward, 2x backward (Dao
    # 2023 §4.1); matmuls and element-wise work do not depend on the attention kernel
    flash = _cm(attention_kernel="flash2").block_work(2)
    triton = _cm(attention_kernel="triton-flash").block_work(2)
    for f, t, slower in zip(flash, triton, (1.4, 2.0), strict=True):
        assert t.attention_s == pytest.approx(slower * f.attention_s, rel=1e-9)
        assert (t.matmul_s, t.elementwise_s, t.launch_s) == pytest.approx(
            (f.matmul_s, f.elementwise_s, f.launch_s), rel=0.02
        )  # the clock a slower step sustains moves matmuls a little, never by the ratio
    with pytest.raises(ValidationError, match=r"attention_kernel|attentionKernel"):
        _cm(attention_kernel="flash9")


def test_flex_attention_is_the_default_at_each_gpus_measured_speed() -> None:
    # torchtitan 0.3.0's Llama 3 runs FlexAttention: the default. Against FlashAttention-2:
    # 1.18x forward, 1.28x backward on H100/H200 (measured on an H200, head dim 128), 0.90x /
    # 0.85x on A100 (the FlexAttention announcement); cuDNN 1.6x on H100 (FlashAttention-3
    # paper), 1.8x on H200 (measured), 0.82x on A100 (transformers#48163)
    assert _cm().training.attention_kernel is K.FLEX
    model = MODEL_PRESETS["llama-3.1-8b"]
    cases = (
        ("h100", K.FLEX, (1.18, 1.28)),
        ("h200", K.FLEX, (1.18, 1.28)),
        ("a100", K.FLEX, (0.90, 0.85)),
        ("l40s", K.FLEX, (0.90, 0.85)),
        ("h100", K.CUDNN, (1.6, 1.6)),
        ("h200", K.CUDNN, (1.8, 1.8)),
        ("a100", K.CUDNN, (0.82, 0.82)),
    )
    for gpu, kernel, speeds in cases:
        pool = PoolSpec(name="p", gpu=gpu, nodes=1, gpus_per_node=8)
        fast, flash = (
            CostModel(
                model,
                TrainingSpec(seq_len_tokens=4096, global_batch_tokens=4096, attention_kernel=k),
                pool,
            ).block_work(2)
            for k in (kernel, K.FLASH2)
        )
        for c, f, speed in zip(fast, flash, speeds, strict=True):
            assert c.attention_s == pytest.approx(f.attention_s / speed, rel=1e-9), (gpu, kernel)


def test_flex_against_cudnn_stays_inside_the_h200_measurement() -> None:
    # FlexAttention ÷ cuDNN measured on the H200 at head dim 128: 0.60-0.64 forward, 0.68-0.78
    # backward (../shared/calibration/h200-2026-12-04); a document timed with cuDNN is scaled
    # to a FlexAttention job by the ratio of the two speeds
    h200 = GPU_PRESETS["h200-141gb-sxm"]
    forward, backward = relative_speed(K.FLEX, K.CUDNN, h200)
    assert 0.59 <= forward <= 0.67 and 0.67 <= backward <= 0.78


def test_measured_coefficients_are_scaled_only_against_the_kernel_they_ran() -> None:
    h100 = GPU_PRESETS["h100-80gb-sxm"]
    assert relative_speed(K.CUDNN, None, h100) == (1.0, 1.0)  # not known: as measured
    assert relative_speed(K.CUDNN, K.CUDNN, h100) == (1.0, 1.0)
    assert relative_speed(K.FLASH2, K.CUDNN, h100) == pytest.approx((1 / 1.6, 1 / 1.6))
    assert relative_speed(K.TRITON_FLASH, K.FLASH2, h100) == pytest.approx((1 / 1.4, 0.5))
