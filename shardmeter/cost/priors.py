"""Datasheet priors: a roofline written in the regression's own form, so every model runs
before a pool has ever been benchmarked (``source: prior`` says so wherever it shows).

Each unit's time is the sum of three kinds of work, each at its own measured rate:

* **matmuls** — model FLOPs ÷ (peak tensor-core FLOP/s × the GPU's ``matmul_efficiency``:
  Maximum Achievable Matmul FLOPS ÷ peak, sources with the presets in
  `shardmeter.spec.hardware`);
* **attention** — the FLOPs causal flash attention executes (half of QKᵀ and AV forward;
  2.5× that backward, which recomputes the scores) ÷ (peak × ``attention_efficiency``, the
  FlashAttention-2 figure for the architecture);
* **memory-bound work** — the bytes of `shardmeter.cost.elementwise` (norms, rotary,
  SwiGLU/GELU, residual adds, gradient sums, cross-entropy, optimizer) ÷ (HBM bandwidth ×
  ``memory_efficiency``), eager PyTorch.

A100 and H100 differ in all three: H100 has 3.2× A100's BF16 peak but only 1.6× its HBM
bandwidth (295 vs 153 FLOP/byte), so memory-bound work weighs twice as much, and
FlashAttention-2 reaches 35 % of H100's peak against ~60 % of A100's. ``torch.compile``,
float8, activation checkpointing and a power cap are applied on top of these coefficients
(measured or prior) by `shardmeter.cost.model.CostModel`.

Element-wise bytes depend on the architecture (RMSNorm or LayerNorm, gated MLP, grouped-query
attention): priors built for a model (``model=``) fold its widths into the ``t_h`` / ``t_i``
coefficients; without a model the reference is Llama-3.1-8B's shape.

Collectives: NCCL bus bandwidth per link role (`shardmeter.cost.collectives`) at these
measured fractions of the datasheet bandwidth:
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
from shardmeter.cost.elementwise import (
    OPTIMIZER_BYTES_PER_PARAM,
    block_bytes,
    head_bytes,
)
from shardmeter.cost.features import Target
from shardmeter.spec.hardware import GPUSpec, LinkKind, LinkSpec, NetworkSpec
from shardmeter.spec.model import MODEL_PRESETS, TransformerSpec
from shardmeter.spec.pool import PoolHardware
from shardmeter.spec.training import Precision

LINK_EFFICIENCY_BY_KIND: dict[LinkKind, float] = {
    # NVLink 4 peer-to-peer reaches 380 of 450 GB/s per direction (84 %, NVIDIA/nccl issue
    # #1264, p2pBandwidthLatencyTest on 8×H100 SXM); ring collectives through NVSwitch
    # lose a little more to protocol overhead: 80 %.
    LinkKind.NVLINK: 0.80,
    # PCIe x16 data rate after TLP/DLLP overhead and NCCL's copy through host bridges.
    LinkKind.PCIE: 0.75,
    # InfiniBand / RoCE: 64b/66b encoding and headers cost ~3 %; NCCL's proxy and chunking a
    # few more (nccl-tests across nodes report ~90 % of the rails' line rate).
    LinkKind.INFINIBAND: 0.90,
    LinkKind.ETHERNET: 0.85,
    LinkKind.WAN: 0.80,
}
LINK_EFFICIENCY = LINK_EFFICIENCY_BY_KIND[LinkKind.WAN]
"""The fraction for a WAN uplink (kept under this name for the planner's WAN arithmetic)."""
SPINE_HOP_LATENCY_S = 1e-6
"""Extra latency of a hop through the spine when the fabric is not rail-optimised."""

BLOCK_LAUNCH_OVERHEAD_S = 20e-6
"""~15 kernels per block forward at ~1.3 µs launch each; backward twice that."""
SMALL_UNIT_LAUNCH_OVERHEAD_S = 10e-6
OPTIMIZER_LAUNCH_OVERHEAD_S = 1e-3
"""Foreach AdamW over a few hundred tensors."""

REFERENCE_MODEL = "llama-3.1-8b"
"""Shape whose element-wise widths model-independent priors use."""


def _rates(gpu: GPUSpec, precision: Precision) -> tuple[float, float, float, float]:
    """(matmul, attention forward, attention backward, memory) rates: FLOP/s ×3, bytes/s."""
    if precision.base is Precision.FP32:
        # FP32 runs on CUDA cores; flash attention does not run in FP32 (math SDPA instead)
        rate = gpu.peak_fp32_flop_per_s * gpu.matmul_efficiency
        return rate, rate, rate, gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency
    peak = gpu.peak_bf16_flop_per_s
    return (
        peak * gpu.matmul_efficiency,
        peak * gpu.attention_efficiency,
        peak * gpu.attention_backward_efficiency,
        gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency,
    )


def compute_priors(
    gpu: GPUSpec, precision: Precision, model: TransformerSpec | None = None
) -> dict[Target, LinearFit]:
    """Roofline coefficients for every compute target (eager PyTorch, BF16 or FP32)."""
    spec = model or MODEL_PRESETS[REFERENCE_MODEL]
    mm, at, at_b, bw = _rates(gpu, precision)
    scale = precision.base.bytes / 2  # the element-wise byte counts are for BF16
    blk = block_bytes(spec)
    h, i = spec.hidden_size, spec.intermediate_size
    hn_f, ce_f, hn_b, ce_b = head_bytes(spec)
    v = spec.vocab_size
    fits = {
        # q,o: 2 matrices × 2 FLOPs per weight; k,v likewise; t_h_i already counts matrices.
        # Causal flash attention forward executes 2·t·s·q_dim FLOPs, backward 2.5× that.
        Target.BLOCK_FORWARD: {
            "t_h_q": 4 / mm,
            "t_h_kv": 4 / mm,
            "t_h_i": 2 / mm,
            "t_s_q": 2 / at,
            "t_h": scale * blk.forward_width / h / bw,
            "t_i": scale * blk.forward_intermediate / i / bw,
            "one": BLOCK_LAUNCH_OVERHEAD_S,
        },
        Target.BLOCK_BACKWARD: {
            "t_h_q": 8 / mm,
            "t_h_kv": 8 / mm,
            "t_h_i": 4 / mm,
            "t_s_q": 5 / at_b,
            "t_h": scale * blk.backward_width / h / bw,
            "t_i": scale * blk.backward_intermediate / i / bw,
            "one": 2 * BLOCK_LAUNCH_OVERHEAD_S,
        },
        # embedding gather: read + write one row per token
        Target.EMBEDDING_FORWARD: {"t_h": 2 * 2 * scale / bw, "one": SMALL_UNIT_LAUNCH_OVERHEAD_S},
        # scatter-add of the rows into the dense gradient, which is zeroed every step (V·h)
        Target.EMBEDDING_BACKWARD: {
            "t_h": 3 * 2 * scale / bw,
            "v_h": 2 * scale / bw,
            "one": SMALL_UNIT_LAUNCH_OVERHEAD_S,
        },
        # final norm, LM head matmul, FP32 softmax cross-entropy
        Target.HEAD_FORWARD: {
            "t_h_v": 2 / mm,
            "t_v": ce_f / v / bw,
            "t_h": scale * hn_f / h / bw,
            "one": SMALL_UNIT_LAUNCH_OVERHEAD_S,
        },
        Target.HEAD_BACKWARD: {
            "t_h_v": 4 / mm,
            "t_v": ce_b / v / bw,
            "t_h": scale * hn_b / h / bw,
            "one": 2 * SMALL_UNIT_LAUNCH_OVERHEAD_S,
        },
        # foreach AdamW + gradient clipping on the FP32 shard
        Target.OPTIMIZER_STEP: {
            "p_local": OPTIMIZER_BYTES_PER_PARAM / bw,
            "one": OPTIMIZER_LAUNCH_OVERHEAD_S,
        },
    }
    return {t: LinearFit(coefficients=coefs) for t, coefs in fits.items()}


def link_prior(link: LinkSpec) -> CollectiveFit:
    """One link at its measured fraction of the datasheet bandwidth (per GPU inside a node;
    per rail when a legacy inter-node link stands alone)."""
    return CollectiveFit(
        latency_s=link.latency_s,
        seconds_per_byte=1.0 / (link.bandwidth_bytes_per_s * LINK_EFFICIENCY_BY_KIND[link.kind]),
        link=link.name,
    )


def network_prior(network: NetworkSpec) -> CollectiveFit:
    """A node's inter-node bus bandwidth: all rails together (NCCL runs one ring per rail),
    divided by the spine oversubscription when the fabric is not rail-optimised."""
    bandwidth = network.node_bandwidth_bytes_per_s * LINK_EFFICIENCY_BY_KIND[network.kind]
    latency = network.hop_latency_s
    if not network.rail_optimized:
        bandwidth /= network.oversubscription
        latency += SPINE_HOP_LATENCY_S
    return CollectiveFit(
        latency_s=latency,
        seconds_per_byte=1.0 / bandwidth,
        parallel_rings=1,
        link=(
            f"{network.nics_per_node}×{network.nic_bandwidth_bytes_per_s * 8 / 1e9:g} Gbit/s "
            f"{network.kind.value}"
        ),
    )


def prior_coefficients(
    gpu: GPUSpec,
    intra_node: LinkSpec,
    inter_node: LinkSpec | NetworkSpec,
    precision: Precision = Precision.BF16,
    pool: str | None = None,
    *,
    model: TransformerSpec | None = None,
    gpus_per_node: int = 8,
) -> CoefficientsDocument:
    """A complete coefficients document from datasheets. ``inter_node`` is the node network,
    or a legacy per-GPU rail (one NIC per GPU of a ``gpus_per_node``-GPU node)."""
    network = (
        inter_node
        if isinstance(inter_node, NetworkSpec)
        else NetworkSpec.one_rail_per_gpu(inter_node, gpus_per_node)
    )
    notes = ["datasheet priors: benchmark the pool to replace them with measurements"]
    if model is not None:
        notes.append(f"element-wise work counted for {model.name}'s shape")
    return CoefficientsDocument(
        source=Source.PRIOR,
        gpu=gpu,
        precision=precision.base,
        pool=pool,
        created_at=datetime.now(UTC),
        software={"shardmeter": __version__},
        compute=compute_priors(gpu, precision, model),
        communication={
            LinkRole.INTRA_NODE: {c: link_prior(intra_node) for c in COLLECTIVES},
            LinkRole.INTER_NODE: {c: network_prior(network) for c in COLLECTIVES},
        },
        notes=notes,
    )


def pool_priors(
    pool: PoolHardware,
    precision: Precision = Precision.BF16,
    name: str | None = None,
    model: TransformerSpec | None = None,
) -> CoefficientsDocument:
    """The priors of a pool: its GPU, intra-node link and node network."""
    return prior_coefficients(
        pool.gpu,
        pool.intra,
        pool.node_network,
        precision,
        name,
        model=model,
        gpus_per_node=pool.gpus_per_node,
    )
