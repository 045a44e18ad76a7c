"""Host overhead (`shardmeter.cost.host`): a unit pass takes the longer of its GPU time and
the host's time to launch its kernels; compile fuses kernels, eager float8 adds casts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch_local import torchtitan_pythonpath
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
from shardmeter.spec.model import MODEL_PRESETS, MLPKind, NormKind, TransformerSpec
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import AttentionKernel, TrainingSpec

ROOT = Path(__file__).resolve().parents[1]

LLAMA = MODEL_PRESETS["llama-3.1-8b"]
SMOL = MODEL_PRESETS["smollm-360m"]
H200 = PoolSpec(name="p", gpu="h200", nodes=1, gpus_per_node=8)


def _cm(seq: int, **training: object) -> CostModel:
    t = TrainingSpec.model_validate({"seq_len_tokens": seq, "global_batch_tokens": seq, **training})
    return CostModel(SMOL, t, H200)


def _dispatched() -> dict[str, dict[str, object]]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_block_kernels.py"), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": torchtitan_pythonpath()},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])["eager"]
    return {row["variant"]: row for row in rows}


def test_block_kernels_are_the_ops_torchtitans_block_dispatches() -> None:
    # torchtitan 0.3.0's own Llama 3 block (GQA and MHA, SwiGLU, BF16) runs a forward and a
    # backward on the CPU under a dispatch mode; its ATen ops that launch kernels, turned into
    # a CUDA device's (the fused RMSNorm op, FlexAttention's launches), are what
    # block_kernels counts for the same spec
    measured = _dispatched()
    for variant, row in measured.items():
        spec = TransformerSpec.model_validate(row["spec"])
        model = block_kernels(spec, attention=AttentionKernel.FLEX)
        assert (row["cuda_forward"], row["cuda_backward"]) == (model.forward, model.backward), (
            variant,
            row,
        )
        # on a CUDA device the norm is one fused op each way (seen on a fake CUDA tensor)
        assert row["norm_cuda_ops"] == {
            "forward": ["_fused_rms_norm"],
            "backward": ["_fused_rms_norm_backward"],
        }
        assert row["norms"] == 2
    # grouped-query attention is the kernel's enable_gqa: no repeat_kv copies, MHA the same
    gqa, mha = measured["gqa"], measured["mha"]
    assert gqa["cpu_forward_ops"] == mha["cpu_forward_ops"]
    assert gqa["cpu_backward_ops"] == mha["cpu_backward_ops"]
    specs = {v: TransformerSpec.model_validate(row["spec"]) for v, row in measured.items()}
    assert specs["gqa"].kv_heads < specs["mha"].kv_heads
    assert block_kernels(specs["gqa"]) == block_kernels(specs["mha"])


def test_compile_cuts_and_eager_float8_adds_kernels() -> None:
    eager, compiled = block_kernels(LLAMA), block_kernels(LLAMA, compiled=True)
    fp8_eager, fp8_compiled = block_kernels(LLAMA, fp8=True), block_kernels(LLAMA, True, True)
    assert compiled.forward < eager.forward and compiled.backward < eager.backward
    # float8 casts every linear of the block: wqkv, wo, w1, w2, w3
    assert fp8_eager.forward == eager.forward + 5 * 16  # amax, scale, cast of input + weight
    assert compiled.forward < fp8_compiled.forward < fp8_eager.forward
    # a plain-MLP LayerNorm block launches fewer than SwiGLU's
    plain = LLAMA.model_copy(update={"mlp_kind": MLPKind.PLAIN, "norm": NormKind.LAYERNORM})
    assert block_kernels(plain).forward < eager.forward
    assert block_kernels(plain).backward < eager.backward
    # FlexAttention is a compiled region even in an eager block: its launches at the compiled
    # launcher's cost plus one graph call; FlashAttention-2 through SDPA is eager
    host = unit_host_seconds(LLAMA, compiled=False, compiled_loss=False, fp8=False)
    assert host.block_forward_s == pytest.approx(
        (eager.forward - 1) * EAGER_FORWARD_KERNEL_S + COMPILED_KERNEL_S + COMPILED_GRAPH_S
    )
    sdpa = block_kernels(LLAMA, attention=AttentionKernel.FLASH2)
    flash = unit_host_seconds(LLAMA, False, False, False, AttentionKernel.FLASH2)
    assert flash.block_backward_s == pytest.approx(sdpa.backward * EAGER_BACKWARD_KERNEL_S)
    fused = unit_host_seconds(LLAMA, compiled=True, compiled_loss=True, fp8=False)
    assert fused.block_forward_s == pytest.approx(
        compiled.forward * COMPILED_KERNEL_S + COMPILED_GRAPH_S
    )
    assert fused.block_forward_s < host.block_forward_s


def test_a_short_eager_pass_takes_the_hosts_time_and_a_long_one_hides_it() -> None:
    short, long = _cm(1024), _cm(16384)
    assert short.host is not None
    assert short.unit_times(1).block_forward_s == pytest.approx(short.host.block_forward_s)
    assert "block.forward" in short.unit_times(1).host_bound
    assert long.unit_times(1).host_bound == ()
    assert long.unit_times(1).block_forward_s > long.host.block_forward_s  # type: ignore[union-attr]
    # compiling shortens the launch-bound pass: fewer kernels at the launcher's cost
    compiled_cm = _cm(1024, torch_compile=True)
    compiled = compiled_cm.unit_times(1)
    assert compiled_cm.host is not None
    assert compiled.block_forward_s == pytest.approx(compiled_cm.host.block_forward_s)
    assert compiled.block_forward_s < short.unit_times(1).block_forward_s
    # at 2048 tokens the eager GPU pass outlasts the launches
    assert "block.forward" not in _cm(2048).unit_times(1).host_bound
    # eager float8's casts are launch-bound longer than bf16's whole pass
    fp8 = _cm(4096, precision="fp8").unit_times(1)
    assert "block.forward" in fp8.host_bound
    assert fp8.block_forward_s > _cm(4096).unit_times(1).block_forward_s


def test_checkpointing_relaunches_the_forward_in_the_backward() -> None:
    # the autograd engine's launches alone hide behind the backward's GPU time; re-running
    # the forward's Python in the backward makes it launch-bound
    plain = _cm(256).unit_times(1)
    full = _cm(256, activation_checkpointing="full").unit_times(1)
    cm = _cm(256)
    assert cm.host is not None
    assert "block.backward" not in plain.host_bound
    assert plain.block_backward_s > cm.host.block_backward_s
    assert "block.backward" in full.host_bound
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
