"""How fast each fused attention kernel runs: relative to FlashAttention-2, whose measured
rates the GPU presets' ``attention_efficiency`` / ``attention_backward_efficiency`` are (at
head dim 128 and, where the preset says, ``attention_reference_seq_len_tokens``), and how
that rate moves with the head dim and the sequence length.

**Kernels** at head dim 128:

* ``flash2``: FlashAttention-2 (PyTorch SDPA's flash backend; what torchtitan ran on H100
  until 2025 and what most published stacks before it ran): 1 by definition.
* ``triton-flash``: FlashAttention in Triton (flash-attn's ``flash_attn_triton.py``;
  llm-foundry's ``attn_impl: triton`` runs it on the triton-pre-mlir fork): "FlashAttention-2
  is around 1.3-1.5x faster than FlashAttention in Triton in the forward pass and around 2x
  faster in the backward pass" (Dao 2023, arXiv 2307.08691, §4.1, on A100 80GB). The midpoint
  1.4 forward and 2 backward; neither kernel uses Hopper's wgmma/TMA, so the same ratio is
  taken on every GPU.
* ``flex``: FlexAttention, ``torch.compile(flex_attention)`` with a block mask — what
  torchtitan 0.3.0's Llama 3 runs (``torchtitan/models/llama3/__init__.py``:
  ``model_registry(flavor, attn_backend="flex")``; ``models/common/config_utils.py``
  refuses ``sdpa`` for language models): the GPU's ``flex_attention_speed`` forward and
  ``flex_attention_backward_speed`` backward (measured on an H200; sources with the presets).
* ``cudnn``: cuDNN's fused attention (SDPA's cuDNN backend, for a runtime that calls SDPA
  with ``CUDNN_ATTENTION`` first — torchtitan 0.3.0's ``ScaledDotProductAttention`` does, but
  none of its language models builds it): the GPU's ``cudnn_attention_speed``, both passes.

**Head dim** (`head_dim_ratio`). Per score element a flash kernel does 4·d matmul FLOPs (QKᵀ
and PV) and a fixed amount of other work (exp, running max, rescale) on the SFUs, which run
at 1/256 of the tensor cores' rate on an H100 (Shah et al. 2024, FlashAttention-3, arXiv
2407.08608, why it overlaps softmax with the GEMMs: 989 TFLOP/s of FP16 matmul against 3.9
TFLOP/s of special functions such as exp). So the time per
FLOP is a + b/d: a kernel reaches less of its rate at d = 64 than at 128. Each kernel's rate
at 64 ÷ at 128, forward and backward, is in `HEAD_DIM_64_RATIO` (sources there); between 64
and 128 the inverse rate is linear in 1/d (the a + b/d law through both figures); below 64
the figure at 64 holds (no published figure below it), above 128 the presets' rate (the FA3
paper's head dim 256 figures are within 6-11 % of 128's, FlashAttention-2 and cuDNN slower,
not faster: tiles shrink, so the law stops at 128). No figure per GPU family was found beside
the Hopper ones; the same ratios are taken on every GPU.

**Sequence length** (`sequence_ratio`). Each tile of queries pays a fixed prologue and
epilogue (load Q, write O and the softmax statistics) and, causal, one half-masked diagonal
tile, amortised over the keys it loops over: the rate is R·S/(S + S₀). Fitted to the FA3
paper's H100 figures (Fig. 5, causal forward, 16k tokens per batch, 512-16k tokens): S₀ =
403 (FlashAttention-2, head dim 128), 359 (64), cuDNN 387 / 391, Triton's FlashAttention-2
408 (2k-16k); S₀ = 400 meets FlashAttention-2's and cuDNN's curves within 3.5 % at every
length, Triton's within 2 % (head dim 128) and 6 % (64) from 1k on. The backward figures
(Fig. 6) are without the causal mask and give 252-376, a lower bound for the causal
backward: S₀ = 400 for both passes, every kernel. It applies where the GPU's efficiency figure
names the length it was measured at (``attention_reference_seq_len_tokens``: the H100/H200
presets' FA3 figures, 2k-8k, 4096); the A100's figure is a range over a sweep, so no length
law there.

The head-dim and sequence laws shape the **datasheet priors** only (`prior_shape`): a measured
coefficients document fitted the pool's kernel over its catalog's shapes. A document says
which kernel its attention ran (``CoefficientsDocument.attention_kernel``, written by the
benchmark Job); the step is scaled by the ratio of the job's kernel to that one at the model's
head dim (`relative_speed`), and not at all when the document does not say (a CPU pool: no
fused kernel is involved).
"""

from __future__ import annotations

from shardmeter.spec.hardware import GPUSpec
from shardmeter.spec.training import AttentionKernel

TRITON_FLASH_SPEED = (1 / 1.4, 1 / 2.0)
"""(forward, backward) of FlashAttention in Triton relative to FlashAttention-2 (Dao 2023)."""

REFERENCE_HEAD_DIM = 128
"""Head dim of the presets' attention rates and kernel speeds."""
SMALLEST_FIGURE_HEAD_DIM = 64
"""Smallest head dim any published or measured figure covers."""

HEAD_DIM_64_RATIO: dict[AttentionKernel, tuple[float, float]] = {
    # FA3 paper Fig. 5 (causal forward, H100 SXM5, bf16, 16k tokens per batch, hidden 2048):
    # head dim 64 ÷ 128 at equal length 2k-16k 262/298, 284/319, 295/333, 299/335 = 0.88-0.89;
    # Fig. 6 (backward) 264/291 ... 291/322 = 0.90-0.91. The H200 measurement
    # (../shared/calibration/h200-2026-12-04) puts every kernel's 64-head-dim shape 22-25 %
    # below these figures alike (its one such shape does a quarter of the others' work), so it
    # is read only as ratios between kernels (flex, cudnn below).
    AttentionKernel.FLASH2: (0.89, 0.90),
    # no figure; a FlashAttention kernel doing the same work per score element: FA2's
    AttentionKernel.TRITON_FLASH: (0.89, 0.90),
    # FA3 paper, cuDNN: forward 334/484, 363/518, 379/529, 388/539 = 0.69-0.72; backward
    # 395/465 ... 433/516 = 0.83-0.85. Cross-check on the H200 (cuDNN 9.19): cuDNN ÷ SDPA-flash
    # 1.42 / 1.65 at head dim 64 against the preset's 1.8 at 128 gives 0.89 x 1.42/1.8 = 0.70
    # and 0.90 x 1.65/1.8 = 0.82
    AttentionKernel.CUDNN: (0.71, 0.84),
    # no published figure; the H200 measurement, FlexAttention ÷ SDPA-flash on the same machine:
    # 0.93 / 0.94 at head dim 64 (204.5/220.7, 193.8/205.1 TFLOP/s) against 1.18 / 1.28 at 128
    # (the presets' FLEX_HOPPER), times FA2's own ratio: 0.89 x 0.93/1.18, 0.90 x 0.94/1.28
    AttentionKernel.FLEX: (0.70, 0.66),
}
"""(forward, backward) rate of each kernel at head dim 64 ÷ its rate at 128."""

SEQUENCE_RAMP_TOKENS = 400.0
"""S₀ of the tiles' ramp R·S/(S + S₀) (module docstring)."""


def head_dim_ratio(kernel: AttentionKernel, head_dim: int) -> tuple[float, float]:
    """(forward, backward) rate of ``kernel`` at ``head_dim`` ÷ its rate at head dim 128."""
    d = min(max(head_dim, SMALLEST_FIGURE_HEAD_DIM), REFERENCE_HEAD_DIM)
    # 1/rate = a + b/d through the figures at 64 and 128: 1/f(d) = 1 + (1/ρ − 1)(128/d − 1)
    share = REFERENCE_HEAD_DIM / d - 1.0
    fwd, bwd = HEAD_DIM_64_RATIO[kernel]
    return 1.0 / (1.0 + (1.0 / fwd - 1.0) * share), 1.0 / (1.0 + (1.0 / bwd - 1.0) * share)


def sequence_ratio(gpu: GPUSpec, seq_len_tokens: int) -> float:
    """Attention's rate at ``seq_len_tokens`` ÷ at the length the GPU's efficiency figure
    was measured at (1 where the figure names none)."""
    reference = gpu.attention_reference_seq_len_tokens
    if reference is None:
        return 1.0

    def ramp(s: float) -> float:
        return s / (s + SEQUENCE_RAMP_TOKENS)

    return ramp(seq_len_tokens) / ramp(reference)


def kernel_speed(
    kernel: AttentionKernel, gpu: GPUSpec, head_dim: int = REFERENCE_HEAD_DIM
) -> tuple[float, float]:
    """(forward, backward) speed of ``kernel`` on ``gpu`` relative to FlashAttention-2 at the
    same head dim."""
    if kernel is AttentionKernel.TRITON_FLASH:
        speed = TRITON_FLASH_SPEED
    elif kernel is AttentionKernel.CUDNN:
        speed = gpu.cudnn_attention_speed, gpu.cudnn_attention_speed
    elif kernel is AttentionKernel.FLEX:
        speed = gpu.flex_attention_speed, gpu.flex_attention_backward_speed
    else:
        speed = 1.0, 1.0
    (kf, kb), (ff, fb) = (
        head_dim_ratio(kernel, head_dim),
        head_dim_ratio(AttentionKernel.FLASH2, head_dim),
    )
    return speed[0] * kf / ff, speed[1] * kb / fb


def relative_speed(
    job: AttentionKernel,
    measured: AttentionKernel | None,
    gpu: GPUSpec,
    head_dim: int = REFERENCE_HEAD_DIM,
) -> tuple[float, float]:
    """(forward, backward) speed of the job's kernel relative to the one its coefficients
    were timed with (``None``: not known, taken as the job's own), at ``head_dim``."""
    if measured is None or measured is job:
        return 1.0, 1.0
    (jf, jb), (mf, mb) = kernel_speed(job, gpu, head_dim), kernel_speed(measured, gpu, head_dim)
    return jf / mf, jb / mb


def prior_shape(gpu: GPUSpec, head_dim: int, seq_len_tokens: int) -> tuple[float, float]:
    """(forward, backward) FlashAttention-2 rate at this head dim and length ÷ the preset's
    rate (head dim 128, its reference length): what a datasheet prior's attention is scaled
    by, beside the kernel's speed (`kernel_speed`)."""
    fwd, bwd = head_dim_ratio(AttentionKernel.FLASH2, head_dim)
    seq = sequence_ratio(gpu, seq_len_tokens)
    return fwd * seq, bwd * seq
