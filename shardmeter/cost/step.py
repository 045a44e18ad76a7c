"""One micro-step's block and head passes as a training step runs them on a datasheet GPU:
GEMM wave quantization and the power-limited clock a step of this tensor duty cycle
sustains (`shardmeter.cost.gemm`, `shardmeter.cost.power`). Only datasheet priors get
these corrections: a pool's measured coefficients were timed on the pool itself."""

from __future__ import annotations

from collections.abc import Callable

from shardmeter.cost.gemm import block_wave_efficiency, head_wave_efficiency
from shardmeter.cost.power import sustained_clock_ratio
from shardmeter.cost.units import StepParts, slow_matmuls, tensor_seconds
from shardmeter.spec.hardware import GPUSpec
from shardmeter.spec.model import TransformerSpec

Parts = dict[str, float]


def sustained_step_parts(
    *,
    model: TransformerSpec,
    gpu: GPUSpec,
    tokens: int,
    fp8_blocks: bool,
    block: tuple[Parts, Parts],
    head: tuple[Parts, Parts],
    embedding_s: float,
    recompute_split: Callable[[Parts], tuple[float, float]],
) -> StepParts:
    """``block`` and ``head`` are (forward, backward) per-feature seconds at the benchmark
    clock with perfectly filled waves; ``recompute_split`` gives a block forward's recomputed
    (tensor, other) seconds under the step's checkpointing mode."""
    fwd, bwd = block
    head_fwd, head_bwd = head
    # The duty cycle counts the useful tensor-core work: SMs left idle in a GEMM's last wave
    # draw no dynamic power, so wave quantization lengthens the step but not its power.
    layers = model.num_layers
    rc_tensor, rc_other = recompute_split(fwd)
    tensor = layers * (tensor_seconds(fwd) + tensor_seconds(bwd) + rc_tensor)
    tensor += tensor_seconds(head_fwd) + tensor_seconds(head_bwd)
    total = layers * (sum(fwd.values()) + sum(bwd.values()) + rc_tensor + rc_other)
    total += sum(head_fwd.values()) + sum(head_bwd.values()) + embedding_s
    duty = tensor / total if tensor > 0 else 1.0
    ratio_head = sustained_clock_ratio(gpu.matmul_efficiency_duty_cycle, duty)
    ratio_block = (
        sustained_clock_ratio(gpu.fp8_matmul_efficiency_duty_cycle, duty)
        if fp8_blocks
        else ratio_head
    )
    if gpu.sm_count is not None:
        k_ref = gpu.matmul_reference_k
        bf, bb = block_wave_efficiency(model, tokens, gpu.sm_count, k_ref)
        hf, hb = head_wave_efficiency(
            model.hidden_size, model.vocab_size, tokens, gpu.sm_count, k_ref
        )
        ratio_fwd, ratio_bwd = ratio_block * bf, ratio_block * bb
        ratio_head_fwd, ratio_head_bwd = ratio_head * hf, ratio_head * hb
    else:
        ratio_fwd = ratio_bwd = ratio_block
        ratio_head_fwd = ratio_head_bwd = ratio_head
    return StepParts(
        block_forward=slow_matmuls(fwd, ratio_fwd),
        block_backward=slow_matmuls(bwd, ratio_bwd),
        head_forward=slow_matmuls(head_fwd, ratio_head_fwd),
        head_backward=slow_matmuls(head_bwd, ratio_head_bwd),
        tensor_duty_cycle=duty,
        matmul_clock_ratio=ratio_block,
    )
