"""How fast each fused attention kernel runs, relative to FlashAttention-2 — whose measured
rates the GPU presets' ``attention_efficiency`` / ``attention_backward_efficiency`` are.

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

Only datasheet priors are FlashAttention-2 rates. A measured coefficients document says which
kernel its attention ran (``CoefficientsDocument.attention_kernel``, written by the benchmark
Job); the step is scaled by the ratio of the job's kernel to that one, and not at all when the
document does not say (a CPU pool: no fused kernel is involved).
"""

from __future__ import annotations

from shardmeter.spec.hardware import GPUSpec
from shardmeter.spec.training import AttentionKernel

TRITON_FLASH_SPEED = (1 / 1.4, 1 / 2.0)
"""(forward, backward) of FlashAttention in Triton relative to FlashAttention-2 (Dao 2023)."""


def kernel_speed(kernel: AttentionKernel, gpu: GPUSpec) -> tuple[float, float]:
    """(forward, backward) speed of ``kernel`` on ``gpu`` relative to FlashAttention-2."""
    if kernel is AttentionKernel.TRITON_FLASH:
        return TRITON_FLASH_SPEED
    if kernel is AttentionKernel.CUDNN:
        return gpu.cudnn_attention_speed, gpu.cudnn_attention_speed
    if kernel is AttentionKernel.FLEX:
        return gpu.flex_attention_speed, gpu.flex_attention_backward_speed
    return 1.0, 1.0


def relative_speed(
    job: AttentionKernel, measured: AttentionKernel | None, gpu: GPUSpec
) -> tuple[float, float]:
    """(forward, backward) speed of the job's kernel relative to the one its coefficients
    were timed with (``None``: not known, taken as the job's own)."""
    if measured is None or measured is job:
        return 1.0, 1.0
    (jf, jb), (mf, mb) = kernel_speed(job, gpu), kernel_speed(measured, gpu)
    return jf / mf, jb / mb
