"""What the benchmark Job profiles (issue 34): torchtitan's own Llama 3 block with the attention
it builds, the verdict against the priors, and — on a GPU only — units timed as a step pays
them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from launch_local import torchtitan_pythonpath
from shardmeter.cost.coefficients import ValidationVerdict
from shardmeter.cost.features import Target
from shardmeter.cost.floors import executed_flops
from shardmeter.spec.training import AttentionKernel
from shardmeter_bench.compute import titan_block
from shardmeter_bench.compute.blocks import UnitModel
from shardmeter_bench.compute.profiling import profile_shape
from shardmeter_bench.errors import BenchError
from shardmeter_bench.runconfig import RunConfig, profiled_block
from shardmeter_bench.validation.report import verdict

_BUILD = """
import json, torch
from shardmeter_bench.compute.blocks import Block, Rotary
from shardmeter_bench.compute.catalog import SMALL, generate_catalog
from shardmeter_bench.compute.sweep import build_model
from shardmeter_bench.compute.titan_block import unavailable
assert unavailable() is None, unavailable()
shape = generate_catalog(SMALL, 1, seed=3)[0]
model = build_model(shape, 2, "torchtitan", torch.device("cpu"), torch.float32, shape.seq_len)
first = model.blocks[0]
ids = torch.randint(0, shape.spec.vocab_size, (2, shape.seq_len))
model(ids, ids).backward()
print(json.dumps({
    "kind": type(first.block).__name__,
    "params": sum(p.numel() for p in first.parameters()),
    "reference": sum(p.numel() for p in Block(shape.spec, Rotary(shape.spec.head_width)).parameters()),
    "rope_complex": any(b.is_complex() for b in first.buffers()),
    "grads": all(p.grad is not None for p in model.parameters() if p.requires_grad),
}))
"""


def test_torchtitans_block_is_built_trained_and_keeps_its_rope_table() -> None:
    # torchtitan's Llama3TransformerBlock from its own config builders (the same parameters
    # as the reference block), forward and backward through the bench's unit model; on a CPU
    # its attention is torchtitan's SDPA module (FlexAttention has no CPU backward); the
    # complex RoPE table survives the cast to the profiling dtype
    result = subprocess.run(
        [sys.executable, "-c", _BUILD],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": torchtitan_pythonpath()},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["kind"] == "Llama3TransformerBlock"
    assert facts["params"] == facts["reference"]
    assert facts["rope_complex"] and facts["grads"]


def test_the_profiled_block_and_the_kernel_the_document_records() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    auto = profiled_block(RunConfig(mode="compute"), cpu)
    assert (auto.name, auto.attention_kernel) == ("reference", None)  # CPU accuracy as before
    assert "SDPA's CPU kernel" in auto.note
    reference = profiled_block(RunConfig(mode="compute", block="reference"), cuda)
    assert reference.attention_kernel is AttentionKernel.CUDNN  # torchtitan's SDPA order
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(titan_block, "unavailable", lambda: None)
        titan = profiled_block(RunConfig(mode="compute"), cuda)
        assert (titan.name, titan.attention_kernel) == ("torchtitan", AttentionKernel.FLEX)
        assert "FlexAttention" in titan.note
        mp.setattr(titan_block, "unavailable", lambda: "no torchtitan here")
        fallback = profiled_block(RunConfig(mode="compute"), cuda)
        assert fallback.name == "reference" and "no torchtitan here" in fallback.note
        with pytest.raises(BenchError, match="--block torchtitan: no torchtitan here"):
            profiled_block(RunConfig(mode="compute", block="torchtitan"), cuda)


def test_the_document_beats_the_priors_only_on_median_and_max() -> None:
    def point(doc: float, prior: float) -> dict[str, float]:
        return {
            "fwd_error": doc,
            "bwd_error": doc,
            "fwd_prior_error": prior,
            "bwd_prior_error": prior,
        }

    wins = verdict({"points": [point(0.05, 0.06), point(0.10, 0.20)]})
    assert wins is not None and wins.beats_priors and wins.points == 2
    loses_max = verdict({"points": [point(0.01, 0.06), point(0.30, 0.20)]})
    assert loses_max is not None and not loses_max.beats_priors
    assert verdict(None) is None
    assert ValidationVerdict(
        points=1,
        document_median_error=0.1,
        document_max_error=0.1,
        priors_median_error=0.1,
        priors_max_error=0.1,
    ).beats_priors  # a tie keeps the document: "at least as well"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events need a GPU")
def test_on_a_gpu_every_unit_is_timed_as_the_step_pays_it() -> None:
    # the head of a 151,936-token vocabulary at 64 × 512 tokens once read 0.41 ms from the
    # profiler's kernel ranges (a 12.7 TFLOP matmul, 31× the peak); CUDA events around the
    # unit cannot miss a kernel: no unit beats the peak, and the summed kernels fit inside
    from shardmeter.spec.hardware import GPU_PRESETS
    from shardmeter.spec.model import TransformerSpec

    spec = TransformerSpec(
        name="head-check",
        hidden_size=1280,
        num_layers=2,
        num_attention_heads=10,
        intermediate_size=3456,
        vocab_size=151936,
    )
    model = UnitModel(spec, 1).to(device="cuda", dtype=torch.bfloat16)
    prof = profile_shape(model, 64, 512, 3, kernel_diagnostic=True)
    peak = GPU_PRESETS["h100-80gb-sxm"].peak_bf16_flop_per_s
    from shardmeter.cost.coefficients import ComputeSample

    for target, seconds in prof.seconds.items():
        sample = ComputeSample(
            target=target,
            model=spec.model_dump(),
            micro_batch=64,
            seq_len=512,
            seconds=seconds,
        )
        assert executed_flops(sample) / seconds <= peak, target
        kernels = prof.kernel_seconds.get(target)
        assert kernels is None or kernels <= 1.05 * seconds, target
    assert prof.seconds[Target.HEAD_FORWARD] > 1e-3
