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
(t × out output, reduction depth K = in), and in backward the input gradient (t × in,
K = out) and the weight gradient (out × in, K = t).

**Reduction depth.** Each output tile also pays a fixed cost that does not scale with K:
the pipeline prologue, which loads the first k-blocks into shared memory before the first
MMA can issue, and the epilogue, which converts the FP32 accumulator tile and writes it out.
CUTLASS' multistage BF16 kernels (``…_128x256_64x3`` on Ampere, 3 stages of 64-deep
k-blocks; 4 stages on Hopper) fill S − 1 = 2–3 k-blocks before computing, and the epilogue of
a 128×256 tile (64 KiB of bf16 through shared memory) costs about one more k-block, so a tile
runs ``K / (K + K_FIXED)`` of the time at its main-loop rate with ``K_FIXED`` = 4 k-blocks
= 256. The MAMF figure behind ``matmul_efficiency`` was measured at one K (the GPU's
``matmul_reference_k``, 5,120–13,312 in the finder's best shapes), so a GEMM of depth K runs
at ``depth(K) / depth(K_ref)`` of it (at most 1: no credit beyond what was measured). This is
what makes small models' forward and input-gradient GEMMs (K = 1,536–2,560) 8–13 % slower
than the big shape the efficiency was taken at, while wide models (K ≥ 8,192) lose ≤ 2 %.
"""

from __future__ import annotations

import math
from functools import lru_cache

from shardmeter.spec.model import MLPKind, TransformerSpec

TILES: tuple[tuple[int, int], ...] = ((128, 256), (256, 128))
"""Output tile shapes (rows × columns) a thread block computes; see the module docstring."""
K_FIXED = 256
"""The per-tile prologue and epilogue in units of reduction depth: 4 k-blocks of 64 (see the
module docstring)."""


def depth_efficiency(k: int, reference_k: int | None) -> float:
    """Main-loop share of a depth-``k`` GEMM relative to one of ``reference_k`` (the depth
    the GPU's matmul efficiency was measured at); 1 without a reference, at most 1."""
    if reference_k is None:
        return 1.0
    if k <= 0:
        raise ValueError(f"GEMM depth must be positive (got {k})")
    return min(1.0, (k / (k + K_FIXED)) / (reference_k / (reference_k + K_FIXED)))


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


def _gemm(m: int, n: int, k: int, sm_count: int, reference_k: int | None) -> float:
    return wave_efficiency(m, n, sm_count) * depth_efficiency(k, reference_k)


@lru_cache(maxsize=1024)
def block_wave_efficiency(
    spec: TransformerSpec, tokens: int, sm_count: int, reference_k: int | None = None
) -> tuple[float, float]:
    """FLOP-weighted efficiency (waves × reduction depth) of one block's GEMMs at
    ``tokens`` tokens: (forward, backward)."""
    fwd_flops = fwd_time = bwd_flops = bwd_time = 0.0
    for out, inp in _weights(spec):
        flops = float(out * inp)
        fwd_flops += flops
        fwd_time += flops / _gemm(tokens, out, inp, sm_count, reference_k)
        bwd_flops += 2 * flops
        bwd_time += flops / _gemm(tokens, inp, out, sm_count, reference_k)
        bwd_time += flops / _gemm(out, inp, tokens, sm_count, reference_k)
    return fwd_flops / fwd_time, bwd_flops / bwd_time


@lru_cache(maxsize=1024)
def head_wave_efficiency(
    hidden_size: int,
    vocab_size: int,
    tokens: int,
    sm_count: int,
    reference_k: int | None = None,
) -> tuple[float, float]:
    """The same for the LM head (vocab × hidden): (forward, backward)."""
    h, v = hidden_size, vocab_size
    fwd = _gemm(tokens, v, h, sm_count, reference_k)
    bwd = 2 / (
        1 / _gemm(tokens, h, v, sm_count, reference_k)
        + 1 / _gemm(v, h, tokens, sm_count, reference_k)
    )
    return fwd, bwd
