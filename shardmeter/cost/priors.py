"""Datasheet priors: coefficients in the regression's own form, computed from a GPU's peak
FLOP/s and memory bandwidth and a link's datasheet bandwidth and latency, so every model
runs before a pool has ever been benchmarked. Anything computed from priors says so
(``source: prior``).

Efficiencies (fractions of peak reached in practice) are stated here once:

* dense matmuls reach ``MATMUL_EFFICIENCY`` of peak in the forward pass and
  ``MATMUL_BACKWARD_EFFICIENCY`` in the backward pass (cuBLAS on large BF16 GEMMs; TorchTitan
  reports 40–55 % end-to-end MFU for Llama-3 8B on H100, which includes the rest of the step);
* causal flash attention executes half of the QKᵀ/AV FLOPs and reaches
  ``ATTENTION_EFFICIENCY`` (forward) / ``ATTENTION_BACKWARD_EFFICIENCY`` (backward);
* element-wise work is bound by memory bandwidth (bytes moved per element stated below);
* NCCL ring collectives reach ``LINK_EFFICIENCY`` of a link's datasheet bandwidth.
"""

from __future__ import annotations

from datetime import UTC, datetime

from shardmeter import __version__
from shardmeter.cost.coefficients import (
    COLLECTIVES,
    CoefficientsDocument,
    CollectiveFit,
    LinearFit,
    LinkRole,
    Source,
)
from shardmeter.cost.features import Target
from shardmeter.spec.hardware import GPUSpec, LinkSpec
from shardmeter.spec.training import Precision

MATMUL_EFFICIENCY = 0.65
MATMUL_BACKWARD_EFFICIENCY = 0.60
ATTENTION_EFFICIENCY = 0.45
ATTENTION_BACKWARD_EFFICIENCY = 0.35
LINK_EFFICIENCY = 0.80
BLOCK_LAUNCH_OVERHEAD_S = 20e-6
"""~15 kernels per block forward at ~1.3 µs launch each; backward twice that."""
SMALL_UNIT_LAUNCH_OVERHEAD_S = 10e-6
OPTIMIZER_LAUNCH_OVERHEAD_S = 1e-3
"""Fused/foreach AdamW over a few hundred tensors."""


def compute_priors(gpu: GPUSpec, precision: Precision) -> dict[Target, LinearFit]:
    """Roofline-with-efficiency coefficients for every compute target."""
    flops = gpu.peak_flop_per_s(precision.value)
    bw = gpu.hbm_bandwidth_bytes_per_s
    c = precision.bytes
    mm_f, mm_b = 1.0 / (flops * MATMUL_EFFICIENCY), 1.0 / (flops * MATMUL_BACKWARD_EFFICIENCY)
    at_f, at_b = 1.0 / (flops * ATTENTION_EFFICIENCY), 1.0 / (flops * ATTENTION_BACKWARD_EFFICIENCY)
    fits = {
        # q,o: 2 matrices × 2 FLOPs; k,v likewise; t_h_i already counts the matrices.
        # Causal flash attention forward executes 2·t·s·q_dim FLOPs, backward 2.5× that.
        # t_h: ~16 element reads/writes (2 norms, 2 residuals, rotary) per token·h;
        # t_i: ~4 per token·i (activation, gating). Backward moves twice the bytes.
        Target.BLOCK_FORWARD: {
            "t_h_q": 4 * mm_f,
            "t_h_kv": 4 * mm_f,
            "t_h_i": 2 * mm_f,
            "t_s_q": 2 * at_f,
            "t_h": 16 * c / bw,
            "t_i": 4 * c / bw,
            "one": BLOCK_LAUNCH_OVERHEAD_S,
        },
        Target.BLOCK_BACKWARD: {
            "t_h_q": 8 * mm_b,
            "t_h_kv": 8 * mm_b,
            "t_h_i": 4 * mm_b,
            "t_s_q": 5 * at_b,
            "t_h": 32 * c / bw,
            "t_i": 8 * c / bw,
            "one": 2 * BLOCK_LAUNCH_OVERHEAD_S,
        },
        # embedding gather: read + write one row per token
        Target.EMBEDDING_FORWARD: {"t_h": 2 * c / bw, "one": SMALL_UNIT_LAUNCH_OVERHEAD_S},
        # scatter-add into an FP32 gradient buffer, which is zeroed / cast (V·h × 8 bytes)
        Target.EMBEDDING_BACKWARD: {
            "t_h": (c + 8) / bw,
            "v_h": 8 / bw,
            "one": SMALL_UNIT_LAUNCH_OVERHEAD_S,
        },
        # final norm, LM head matmul, FP32 softmax cross-entropy (~4 passes of 4 bytes)
        Target.HEAD_FORWARD: {
            "t_h_v": 2 * mm_f,
            "t_v": 16 / bw,
            "t_h": 4 * c / bw,
            "one": SMALL_UNIT_LAUNCH_OVERHEAD_S,
        },
        Target.HEAD_BACKWARD: {
            "t_h_v": 4 * mm_b,
            "t_v": 12 / bw,
            "t_h": 8 * c / bw,
            "one": 2 * SMALL_UNIT_LAUNCH_OVERHEAD_S,
        },
        # AdamW: read param, grad, m, v (16 B) and write param, m, v (12 B), plus the BF16
        # copy gathered next step (c bytes).
        Target.OPTIMIZER_STEP: {"p_local": (28 + c) / bw, "one": OPTIMIZER_LAUNCH_OVERHEAD_S},
    }
    return {t: LinearFit(coefficients=coefs) for t, coefs in fits.items()}


def link_prior(link: LinkSpec) -> CollectiveFit:
    return CollectiveFit(
        latency_s=link.latency_s,
        seconds_per_byte=1.0 / (link.bandwidth_bytes_per_s * LINK_EFFICIENCY),
        link=link.name,
    )


def prior_coefficients(
    gpu: GPUSpec,
    intra_node: LinkSpec,
    inter_node: LinkSpec,
    precision: Precision = Precision.BF16,
    pool: str | None = None,
) -> CoefficientsDocument:
    """A complete coefficients document from datasheets."""
    return CoefficientsDocument(
        source=Source.PRIOR,
        gpu=gpu,
        precision=precision,
        pool=pool,
        created_at=datetime.now(UTC),
        software={"shardmeter": __version__},
        compute=compute_priors(gpu, precision),
        communication={
            LinkRole.INTRA_NODE: {c: link_prior(intra_node) for c in COLLECTIVES},
            LinkRole.INTER_NODE: {c: link_prior(inter_node) for c in COLLECTIVES},
        },
        notes=["datasheet priors: benchmark the pool to replace them with measurements"],
    )
