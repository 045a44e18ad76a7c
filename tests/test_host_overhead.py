"""Host overhead (`shardmeter.cost.host`): a unit pass takes the longer of its GPU time and
the host's time to launch its kernels; compile fuses kernels, eager float8 adds casts."""

from __future__ import annotations

import pytest

from shardmeter.cost.fitting import fit_coefficients
from shardmeter.cost.host import (
    COMPILED_GRAPH_S,
    COMPILED_KERNEL_S,
    EAGER_BACKWARD_KERNEL_S,
    EAGER_FORWARD_KERNEL_S,
    block_kernels,
    unit_host_seconds,
)
from shardmeter.cost.model import CostModel
from shardmeter.cost.priors import pool_priors
from shardmeter.spec.model import MODEL_PRESETS, MLPKind, NormKind
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import TrainingSpec

LLAMA = MODEL_PRESETS["llama-3.1-8b"]
SMOL = MODEL_PRESETS["smollm-360m"]
H200 = PoolSpec(name="p", gpu="h200", nodes=1, gpus_per_node=8)


def _cm(seq: int, **training: object) -> CostModel:
    t = TrainingSpec.model_validate({"seq_len_tokens": seq, "global_batch_tokens": seq, **training})
    return CostModel(SMOL, t, H200)


def test_a_llama_blocks_kernels_counted_by_hand() -> None:
    # forward, eager: 2 RMSNorms × 8 ops, 7 GEMMs (q k v o gate up down), rotary 3 ops on q
    # and on k, repeat_kv's 2 copies (GQA), attention, the output's contiguous copy, 2
    # residual adds, SiLU and the gate product
    assert block_kernels(LLAMA).forward == 16 + 7 + 6 + 2 + 1 + 1 + 2 + 2
    # compiled: the 7 GEMMs, attention, and 5 fused element-wise kernels
    assert block_kernels(LLAMA, compiled=True).forward == 7 + 1 + 5
    # a plain-MLP LayerNorm model without GQA launches fewer
    plain = LLAMA.model_copy(
        update={"mlp_kind": MLPKind.PLAIN, "norm": NormKind.LAYERNORM, "num_key_value_heads": 32}
    )
    assert block_kernels(plain).forward == 2 + 6 + 6 + 0 + 1 + 1 + 2 + 1


def test_compile_cuts_and_eager_float8_adds_kernels() -> None:
    eager, compiled = block_kernels(LLAMA), block_kernels(LLAMA, compiled=True)
    fp8_eager, fp8_compiled = block_kernels(LLAMA, fp8=True), block_kernels(LLAMA, True, True)
    assert compiled.forward < eager.forward and compiled.backward < eager.backward
    assert fp8_eager.forward == eager.forward + 7 * 16  # amax, scale, cast of input + weight
    assert compiled.forward < fp8_compiled.forward < fp8_eager.forward
    host = unit_host_seconds(LLAMA, compiled=False, compiled_loss=False, fp8=False)
    assert host.block_forward_s == pytest.approx(37 * EAGER_FORWARD_KERNEL_S)
    assert host.block_backward_s == pytest.approx(eager.backward * EAGER_BACKWARD_KERNEL_S)
    fused = unit_host_seconds(LLAMA, compiled=True, compiled_loss=True, fp8=False)
    assert fused.block_forward_s == pytest.approx(13 * COMPILED_KERNEL_S + COMPILED_GRAPH_S)
    assert fused.block_forward_s < host.block_forward_s


def test_a_short_eager_pass_takes_the_hosts_time_and_a_long_one_hides_it() -> None:
    short, long = _cm(2048), _cm(16384)
    assert short.host is not None
    assert short.unit_times(1).block_forward_s == pytest.approx(short.host.block_forward_s)
    assert "block.forward" in short.unit_times(1).host_bound
    assert long.unit_times(1).host_bound == ()
    assert long.unit_times(1).block_forward_s > long.host.block_forward_s  # type: ignore[union-attr]
    # compiling shortens the launch-bound pass: fewer kernels, fused bytes
    compiled = _cm(2048, torch_compile=True).unit_times(1)
    assert compiled.block_forward_s < short.unit_times(1).block_forward_s
    assert "block.forward" not in compiled.host_bound
    # eager float8's casts are launch-bound longer than bf16's whole pass
    fp8 = _cm(8192, precision="fp8").unit_times(1)
    assert "block.forward" in fp8.host_bound
    assert fp8.block_forward_s > _cm(8192).unit_times(1).block_forward_s


def test_checkpointing_relaunches_the_forward_in_the_backward() -> None:
    plain = _cm(512).unit_times(1)
    full = _cm(512, activation_checkpointing="full").unit_times(1)
    cm = _cm(512)
    assert cm.host is not None
    assert "block.backward" in plain.host_bound
    assert plain.block_backward_s == pytest.approx(cm.host.block_backward_s)
    assert full.block_backward_s == pytest.approx(
        cm.host.block_backward_s + cm.host.block_forward_s
    )


def test_measured_coefficients_are_left_as_measured() -> None:
    # a measured document timed what the step paid (wall clock): no host floor on top
    prior = pool_priors(H200)
    doc = fit_coefficients(
        gpu=prior.gpu,
        precision=prior.precision,
        intra_node=H200.intra,
        inter_node=H200.inter,
    )
    cm = CostModel(SMOL, TrainingSpec(seq_len_tokens=512, global_batch_tokens=512), H200, doc)
    assert cm.host is None and cm.unit_times(1).host_bound == ()
