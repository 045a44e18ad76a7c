"""How well a training step's GEMM shapes fill the GPU: wave quantization.

A GEMM producing an m×n output is cut into ``ceil(m/Tm)·ceil(n/Tn)`` output tiles, one thread
block each, and the GPU runs them in waves of one block per SM; a wave costs the same whether
it is full or not, so the time is proportional to ``ceil(blocks / SMs)`` and the useful share
of the issued work is ``m·n / (waves · SMs · Tm·Tn)`` (S. Bekman, *Machine Learning
Engineering*, training/performance, "Do more SMs give more TFLOPS?", commit 744d01e1: the
Llama-3.1-8B MLP at 8K tokens is 64 × 56 = 3,584 blocks of 128×256).

Tiles: cuBLAS' and CUTLASS' BF16/FP8 tensor-core GEMMs on Ampere and Hopper use 128×256 or
256×128 output tiles for large problems (the kernel names carry them, e.g.
``ampere_bf16_s16816gemm_bf16_256x128_…``, ``sm90_xmma_gemm_bf16bf16_…_tilesize128x256x64``);
the better of the two orientations is taken. The matmul efficiency of a GPU preset is the
best of a shape sweep (MAMF), which by selection sits where the waves come out even, so the
factor here is applied on top of it unnormalised.

A Llama block runs, per weight matrix (out × in) and ``t`` tokens, one forward GEMM
(t × out output), and in backward the input gradient (t × in) and the weight gradient
(out × in).
"""

from __future__ import annotations

import math
from functools import lru_cache

from shardmeter.spec.model import MLPKind, TransformerSpec

TILES: tuple[tuple[int, int], ...] = ((128, 256), (256, 128))
"""Output tile shapes (rows × columns) a thread block computes; see the module docstring."""


def wave_efficiency(m: int, n: int, sm_count: int) -> float:
    """Useful share of the SM-time an m×n-output GEMM occupies (best tile orientation)."""
    if m <= 0 or n <= 0 or sm_count <= 0:
        raise ValueError(
            f"GEMM dimensions and SM count must be positive (got {m}, {n}, {sm_count})"
        )
    best = 0.0
    for tm, tn in TILES:
        blocks = math.ceil(m / tm) * math.ceil(n / tn)
        waves = math.ceil(blocks / sm_count)
        best = max(best, (m * n) / (waves * sm_count * tm * tn))
    return best


def _weights(spec: TransformerSpec) -> list[tuple[int, int]]:
    """(out, in) of a block's weight matrices: q, k, v, o and the MLP."""
    h, q, kv, i = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.intermediate_size
    mlp = [(i, h), (i, h), (h, i)] if spec.mlp_kind is MLPKind.GATED else [(i, h), (h, i)]
    return [(q, h), (kv, h), (kv, h), (h, q), *mlp]


@lru_cache(maxsize=1024)
def block_wave_efficiency(spec: TransformerSpec, tokens: int, sm_count: int) -> tuple[float, float]:
    """FLOP-weighted wave efficiency of one block's GEMMs at ``tokens`` tokens:
    (forward, backward)."""
    fwd_flops = fwd_time = bwd_flops = bwd_time = 0.0
    for out, inp in _weights(spec):
        flops = float(out * inp)
        fwd_flops += flops
        fwd_time += flops / wave_efficiency(tokens, out, sm_count)
        bwd_flops += 2 * flops
        bwd_time += flops / wave_efficiency(tokens, inp, sm_count)
        bwd_time += flops / wave_efficiency(out, inp, sm_count)
    return fwd_flops / fwd_time, bwd_flops / bwd_time


@lru_cache(maxsize=1024)
def head_wave_efficiency(
    hidden_size: int, vocab_size: int, tokens: int, sm_count: int
) -> tuple[float, float]:
    """The same for the LM head (vocab × hidden): (forward, backward)."""
    fwd = wave_efficiency(tokens, vocab_size, sm_count)
    bwd = 2 / (
        1 / wave_efficiency(tokens, hidden_size, sm_count)
        + 1 / wave_efficiency(vocab_size, hidden_size, sm_count)
    )
    return fwd, bwd
