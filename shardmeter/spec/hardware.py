"""Hardware: GPUs, links, node networks and node pools, with datasheet presets.

A pool's fabric has two levels, as NCCL sees it:

* **inside a node** one link per GPU (`LinkSpec`: NVLink through NVSwitch, or PCIe);
* **between nodes** the node's network (`NetworkSpec`): ``nicsPerNode`` NICs ("rails") of
  ``nicBandwidthBytesPerS`` each. NCCL runs one ring (channel) per rail in parallel, so a node's
  inter-node bus bandwidth is about NICs × NIC bandwidth, capped by the intra-node link
  (see `shardmeter.cost.collectives`).
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from shardmeter.spec.base import Bytes, BytesPerSecond, Seconds, SpecEnum, SpecModel

MIN_FLOP_PER_S = 1e9
"""Slowest peak a GPU spec may state (1 GFLOP/s)."""
MAX_FLOP_PER_S = 1e18
"""Fastest (1 EFLOP/s; an H100 is 0.99 PFLOP/s dense BF16)."""
MAX_PRICE_PER_GPU_HOUR_USD = 10_000.0
"""Dearest GPU-hour a pool may charge (list prices are 1–10 USD): a bound that keeps every
plan's cost finite."""


class LinkKind(SpecEnum):
    NVLINK = "nvlink"
    PCIE = "pcie"
    INFINIBAND = "infiniband"
    ETHERNET = "ethernet"
    WAN = "wan"


class LinkSpec(SpecModel):
    """One communication path with one bandwidth. What the bandwidth belongs to depends on
    where the link is used:

    * ``intraNodeLink``: the link of **one GPU** into the node's fabric (NVLink through
      NVSwitch, or PCIe), per direction;
    * ``interNodeLink`` (legacy; prefer ``network``): **one rail per GPU** — the node has as
      many NICs of this bandwidth as GPUs (``ib-ndr`` on an 8-GPU node = 8 × 400 Gbit/s). A
      link that names a per-GPU share of a shared NIC (e.g. 400 Gbit/s per node / 8 GPUs =
      50 Gbit/s) therefore means the same node bandwidth;
    * ``wanUplink``: the site's whole uplink."""

    name: str = Field(default="custom", max_length=63)
    kind: LinkKind
    latency_s: Seconds
    """One-way latency of one hop (ring step)."""
    bandwidth_bytes_per_s: BytesPerSecond
    """Datasheet bandwidth per direction."""


class NetworkSpec(SpecModel):
    """A node's network to the other nodes: its NICs ("rails"), their speed and cabling.
    Example: DGX H100 = 8 NICs of 400 Gbit/s InfiniBand NDR, rail-optimised."""

    nics_per_node: int = Field(ge=1, le=64)
    """NICs per node used for GPU traffic (not the management/storage NICs)."""
    nic_bandwidth_bytes_per_s: BytesPerSecond
    """Datasheet bandwidth of one NIC, per direction (``400 Gbit/s`` is accepted)."""
    kind: LinkKind = LinkKind.INFINIBAND
    """infiniband or ethernet (RoCE)."""
    latency_s: Seconds | None = None
    """One NIC-to-NIC hop through the leaf switch (ring step across nodes); unset: 5 µs for
    InfiniBand, 10 µs for Ethernet (RoCE), as the link presets."""
    rail_optimized: bool = True
    """NIC i of every node hangs off the same leaf switch (rail-optimised, DGX SuperPOD
    style): ring traffic between nodes stays on one switch. When false, traffic between
    nodes may cross the spine and shares its ``oversubscription``."""
    oversubscription: float = Field(default=1.0, ge=1.0, le=64.0)
    """Leaf downlink : uplink bandwidth ratio (1 = non-blocking). Only used when the fabric
    is not rail-optimised."""

    @field_validator("kind")
    @classmethod
    def _network_kind(cls, value: LinkKind) -> LinkKind:
        if value not in (LinkKind.INFINIBAND, LinkKind.ETHERNET):
            raise ValueError(f"a node network is infiniband or ethernet (got {value.value!r})")
        return value

    @property
    def node_bandwidth_bytes_per_s(self) -> float:
        """All rails of one node together (datasheet)."""
        return self.nics_per_node * self.nic_bandwidth_bytes_per_s

    @property
    def hop_latency_s(self) -> float:
        if self.latency_s is not None:
            return self.latency_s
        return 5e-6 if self.kind is LinkKind.INFINIBAND else 10e-6

    @classmethod
    def one_rail_per_gpu(cls, link: LinkSpec, gpus_per_node: int) -> NetworkSpec:
        """The meaning of a legacy per-GPU ``interNodeLink``: one NIC of the link's bandwidth
        per GPU."""
        kind = (
            link.kind
            if link.kind in (LinkKind.INFINIBAND, LinkKind.ETHERNET)
            else (LinkKind.ETHERNET)
        )
        return cls(
            nics_per_node=gpus_per_node,
            nic_bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
            kind=kind,
            latency_s=link.latency_s,
        )


class GPUSpec(SpecModel):
    """An accelerator: datasheet figures (dense, no sparsity) and the fractions of them that
    measurements show real kernels reach (sources beside each preset)."""

    name: str = Field(max_length=63)
    """Display name, e.g. ``H200-141GB-SXM``."""
    memory_bytes: Bytes
    """Device memory (the total nvidia-smi reports)."""
    peak_bf16_flop_per_s: float = Field(ge=MIN_FLOP_PER_S, le=MAX_FLOP_PER_S)
    """Peak dense BF16 tensor-core throughput."""
    peak_fp32_flop_per_s: float = Field(ge=MIN_FLOP_PER_S, le=MAX_FLOP_PER_S)
    """Peak FP32 (non-tensor-core) throughput."""
    peak_fp8_flop_per_s: float | None = Field(default=None, ge=MIN_FLOP_PER_S, le=MAX_FLOP_PER_S)
    """Peak dense FP8 tensor-core throughput; unset for GPUs whose float8 training is not
    supported here (``precision: fp8`` is then an error)."""
    hbm_bandwidth_bytes_per_s: BytesPerSecond
    """Device memory bandwidth."""
    tdp_watts: float = Field(ge=1, le=100_000)
    """Board power limit (the default power cap): the figure the preset's measured
    efficiencies were taken at."""
    power_limit_watts: float | None = Field(default=None, ge=1, le=100_000)
    """The power limit this GPU variant ships or runs with when it is below ``tdp_watts`` —
    a power-capped SKU or a site default, e.g. the 500 W H100s (96 GB HBM2e) of Meta's Grand
    Teton hosts (torchtitan docs/performance.md): ``{preset: h100, powerLimitWatts: 500,
    memoryBytes: 96 GB, hbmBandwidthBytesPerS: 2.4 TB/s}``. Unset = the TDP. A pool's
    ``powerCapWatts`` lowers it further (the lower of the two holds); the clock follows the
    power-cap model of `shardmeter.cost.power`."""
    static_power_fraction: float = Field(default=0.15, gt=0, lt=1)
    """Share of the board power that does not scale with the SM clock (leakage, HBM, I/O):
    the idle draw nvidia-smi reports for SXM A100/H100 boards (≈ 55–60 W of 400 W,
    ≈ 70–100 W of 700 W). Used by the power-cap model."""
    matmul_efficiency: float = Field(default=0.75, gt=0, le=1)
    """Fraction of peak BF16 a large GEMM sustains (Maximum Achievable Matmul FLOPS ÷ peak)."""
    fp8_matmul_efficiency: float = Field(default=0.70, gt=0, le=1)
    """Fraction of peak FP8 a large FP8 GEMM sustains."""
    attention_efficiency: float = Field(default=0.32, gt=0, le=1)
    """Fraction of peak BF16 the flash-attention forward kernel reaches (causal, head dim
    128, counting the FLOPs it executes)."""
    attention_backward_efficiency: float = Field(default=0.30, gt=0, le=1)
    """The same for the flash-attention backward kernel."""
    attention_reference_seq_len_tokens: int | None = Field(default=None, ge=1, le=1_048_576)
    """Sequence length the attention efficiencies were measured at; other lengths then follow
    the kernels' ramp S/(S + 400) (`shardmeter.cost.attention`). Unset: one rate at every
    length."""
    cudnn_attention_speed: float = Field(default=1.0, gt=0, le=10)
    """cuDNN's fused attention (SDPA's cuDNN backend, which torchtitan 0.3.0 runs first)
    relative to FlashAttention-2 on this GPU, forward and backward (``attentionKernel:
    cudnn``; `shardmeter.cost.attention`). 1 = as fast (no measurement)."""
    flex_attention_speed: float = Field(default=0.90, gt=0, le=10)
    """FlexAttention (``torch.compile(flex_attention)`` with a causal block mask, what
    torchtitan 0.3.0's Llama 3 runs) relative to FlashAttention-2 on this GPU, forward, at
    head dim 128 (``attentionKernel: flex``). Default: the A100 figure of the FlexAttention
    announcement (a Triton kernel without Hopper instructions, like FlashAttention-2)."""
    flex_attention_backward_speed: float = Field(default=0.85, gt=0, le=10)
    """The same for the backward pass."""
    memory_efficiency: float = Field(default=0.85, gt=0, le=1)
    """Fraction of the HBM bandwidth element-wise kernels reach."""
    matmul_efficiency_duty_cycle: float = Field(default=1.0, gt=0, le=1)
    """Share of wall time the tensor cores were busy in the benchmark loop that measured
    ``matmul_efficiency`` (1 = matmuls back to back, as in training). Bekman's MAMF finder
    clears a 256 MiB buffer and rewrites the output before every timed matmul, so its
    power-limited clock runs above the one training sustains; see
    `shardmeter.cost.power.sustained_clock_ratio`."""
    fp8_matmul_efficiency_duty_cycle: float = Field(default=1.0, gt=0, le=1)
    """The same for ``fp8_matmul_efficiency``."""
    matmul_reference_k: int | None = Field(default=None, ge=1, le=1_048_576)
    """Reduction depth K of the shape ``matmul_efficiency`` was measured at (the MAMF
    finder's best m×n×k); GEMMs of smaller K run proportionally more per-tile prologue and
    epilogue (`shardmeter.cost.gemm.depth_efficiency`). Unset = no depth loss modelled; it
    acts with ``sm_count``."""
    sm_count: int | None = Field(default=None, ge=1, le=4096)
    """Streaming multiprocessors: GEMM output tiles run in waves of one per SM (see
    `shardmeter.cost.gemm`); unset = no wave-quantization loss is modelled."""
    default_intra_node_link: str = "nvlink4"
    """Link preset used inside a node when a pool does not name one."""
    default_inter_node_link: str = "ib-ndr"
    """Per-GPU rail used between nodes when neither the pool nor ``default_network`` says."""
    default_network: NetworkSpec | None = None
    """The node network of the usual server for this GPU (e.g. HGX H100: 8 × 400 Gbit/s)."""

    @field_validator("default_intra_node_link", "default_inter_node_link")
    @classmethod
    def _known_link(cls, value: str) -> str:
        if value not in LINK_PRESETS:
            raise ValueError(
                f"unknown link preset {value!r}; allowed: {', '.join(sorted(LINK_PRESETS))}"
            )
        return value

    @model_validator(mode="after")
    def _limit_within_board(self) -> GPUSpec:
        limit, static = self.power_limit_watts, self.static_power_fraction * self.tdp_watts
        if limit is not None and limit > self.tdp_watts:
            raise ValueError(
                f"powerLimitWatts ({limit:g}) exceeds tdpWatts ({self.tdp_watts:g}); a limit "
                "above the board's is raised with tdpWatts (and efficiencies measured there)"
            )
        if limit is not None and limit <= static:
            raise ValueError(
                f"powerLimitWatts ({limit:g}) is at or below the static power (≈ {static:.0f} W)"
            )
        return self

    def power_limit(self, power_cap_watts: float | None = None) -> float:
        """The limit the board runs at: the lowest of the TDP, this variant's
        ``power_limit_watts`` and a pool's ``power_cap_watts``."""
        limits = [self.tdp_watts, self.power_limit_watts, power_cap_watts]
        return min(x for x in limits if x is not None)

    def peak_flop_per_s(self, precision: str) -> float:
        """Peak of the precision the *model* FLOPs are counted against: BF16 tensor cores for
        bf16 and fp8 training (MFU is quoted against BF16 peak, as torchtitan does), FP32
        otherwise."""
        return (
            self.peak_bf16_flop_per_s
            if precision in ("bf16", "fp16", "fp8")
            else self.peak_fp32_flop_per_s
        )

    @property
    def supports_fp8(self) -> bool:
        return self.peak_fp8_flop_per_s is not None


def _link(
    name: str, kind: LinkKind, latency_s: float, gbit_or_gbyte: float, *, bits: bool
) -> LinkSpec:
    bw = gbit_or_gbyte * (1e9 / 8 if bits else 1e9)
    return LinkSpec(name=name, kind=kind, latency_s=latency_s, bandwidth_bytes_per_s=bw)


LINK_PRESETS: dict[str, LinkSpec] = {
    # NVLink 3 (A100): 600 GB/s bidirectional per GPU → 300 GB/s per direction.
    "nvlink3": _link("nvlink3", LinkKind.NVLINK, 3e-6, 300, bits=False),
    # NVLink 4 (H100/H200): 900 GB/s bidirectional per GPU → 450 GB/s per direction.
    "nvlink4": _link("nvlink4", LinkKind.NVLINK, 3e-6, 450, bits=False),
    # PCIe 4.0 / 5.0 x16: ~32 / ~64 GB/s per direction.
    "pcie4": _link("pcie4", LinkKind.PCIE, 5e-6, 32, bits=False),
    "pcie5": _link("pcie5", LinkKind.PCIE, 5e-6, 64, bits=False),
    # InfiniBand HDR / NDR: one 200 / 400 Gbit/s HCA per GPU (as interNodeLink: one rail per GPU).
    "ib-hdr": _link("ib-hdr", LinkKind.INFINIBAND, 5e-6, 200, bits=True),
    "ib-ndr": _link("ib-ndr", LinkKind.INFINIBAND, 5e-6, 400, bits=True),
    # Ethernet (RoCE) 100 / 400 Gbit/s per GPU.
    "eth-100g": _link("eth-100g", LinkKind.ETHERNET, 10e-6, 100, bits=True),
    "eth-400g": _link("eth-400g", LinkKind.ETHERNET, 10e-6, 400, bits=True),
    # Wide-area uplinks of a site (examples).
    "wan-100g-10ms": _link("wan-100g-10ms", LinkKind.WAN, 10e-3, 100, bits=True),
    "wan-10g-30ms": _link("wan-10g-30ms", LinkKind.WAN, 30e-3, 10, bits=True),
    "wan-1g-80ms": _link("wan-1g-80ms", LinkKind.WAN, 80e-3, 1, bits=True),
}


def _network(nics: int, gbit: float, kind: LinkKind, latency_s: float) -> NetworkSpec:
    return NetworkSpec(
        nics_per_node=nics, nic_bandwidth_bytes_per_s=gbit * 1e9 / 8, kind=kind, latency_s=latency_s
    )


_MIB = 2**20

MAMF_FLUSH_BYTES = 256 * _MIB
"""mamf-finder.py (stas00/ml-engineering, compute/accelerator/benchmarks, commit 744d01e1)
zeroes a 256 MiB buffer (``l2_cache.zero_()``) before every timed matmul to clear the L2."""


def mamf_duty_cycle(
    m: int,
    n: int,
    k: int,
    achieved_flop_per_s: float,
    hbm_bandwidth_bytes_per_s: float,
    out_bytes: int = 2,
    memory_efficiency: float = 0.85,
) -> float:
    """Tensor-core share of the MAMF finder's timing loop at its best shape m×n×k: each
    iteration runs ``l2_cache.zero_()`` (a 256 MiB write), ``C.copy_(C_rand)`` (read + write
    of the m×n output) and then the timed ``torch.mm`` at the measured rate; the two copies
    stream at ``memory_efficiency`` of the HBM bandwidth."""
    matmul_s = 2.0 * m * n * k / achieved_flop_per_s
    stream = hbm_bandwidth_bytes_per_s * memory_efficiency
    copies_s = (MAMF_FLUSH_BYTES + 2.0 * m * n * out_bytes) / stream
    return matmul_s / (matmul_s + copies_s)


# Achieved fractions (sources for every preset below):
# * matmul_efficiency / fp8_matmul_efficiency: Maximum Achievable Matmul FLOPS ÷ datasheet
#   peak, mean of 100 iterations at the best shape — stas00/ml-engineering,
#   compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table"
#   (commit 744d01e1): A100 SXM 271.2/312 = 86.9 %; H100 SXM 794.5/989 = 80.3 % ("H200 is the
#   same"); FP8: H100 SXM 1402.6/1979 = 70.9 %, H200 SXM 1453.4/1979 = 73.4 %.
# * attention_efficiency / attention_backward_efficiency: FlashAttention-2, the kernel behind
#   PyTorch's SDPA flash backend. A100: 50–73 % of peak (Dao 2023, arXiv 2307.08691,
#   abstract; 0.60 taken for both passes). H100: FA2 uses no Hopper-specific instructions —
#   "only 35 % utilization" (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, abstract);
#   its Figure 5 measures FA2 at head dim 128, sequence 2k–8k: causal forward 298–333 TFLOP/s
#   (0.32 of 989) and backward 291–318 TFLOP/s (0.30).
# * cudnn_attention_speed: cuDNN fused attention ÷ FlashAttention-2, the same FA3 paper
#   figures at head dim 128, sequence 2k–8k on H100 SXM: causal forward 484–529 vs 298–333
#   TFLOP/s (Fig. 5), backward 465–518 vs 291–318 (Fig. 6), the figures' bar labels: 1.6
#   both; H200 is the same chip.
#   A100: cuDNN SDPA runs at 0.82x FlashAttention-2 for training shapes, L40S 1.00x
#   (huggingface/transformers#48163, six GPUs benchmarked, 2026-08).
#   H200: measured on the chip (one H200 SXM, torch 2.11 cu130, cuDNN 9.19, 2026-12-04;
#   ../shared/calibration/h200-2026-12-04/probes-and-attention.jsonl): causal bf16 at head dim
#   128, sequence 8k-16k, cuDNN ÷ SDPA's flash kernel 1.80-1.88 forward, 1.66-1.90 backward:
#   1.8 both (a newer cuDNN than the FA3 paper's; the H100 keeps the paper's figure).
# * flex_attention_speed / flex_attention_backward_speed: FlexAttention (compiled, causal
#   block mask) ÷ FlashAttention-2. H100/H200: the same H200 measurement, head dim 128:
#   1.08-1.20 forward (median 1.18), 1.23-1.29 backward (1.28) — 0.60-0.64 / 0.68-0.78 of
#   cuDNN's; Inductor's Triton template issues Hopper's wgmma, FlashAttention-2 does not. At
#   head dim 64 it measured 0.93 / 0.94 of FlashAttention-2 (0.65 / 0.57 of cuDNN's): each
#   kernel's head-dim law is in `shardmeter.cost.attention`. A100: "FlexAttention achieves
#   90% of FlashAttention2's performance in the forward pass and 85% in the backward pass"
#   (PyTorch blog "FlexAttention: The Flexibility of PyTorch with the Performance of
#   FlashAttention", 2024-08-07, causal, A100).
#   L40S: no measurement; Ada has no wgmma either, so both kernels issue the same mma.sync
#   instructions as on the A100: the A100 ratios.
# * attention_reference_seq_len_tokens: the length the attention figures stand for. H100/H200
#   (and the L40S, which takes them): the FA3 paper's 2k-8k, 4096. A100: none (a range over
#   the FA2 paper's 512-16k sweep).
# * memory_efficiency: element-wise PyTorch kernels stream at about 85 % of HBM peak
#   (vectorised loads; STREAM-style copies on A100/H100 reach 85–90 %).
# * matmul_efficiency_duty_cycle: the tensor-core share of the MAMF finder's timing loop at the
#   best shape (`mamf_duty_cycle`), which `shardmeter.cost.power.sustained_clock_ratio` turns
#   into the clock a training step sustains.
# * sm_count: datasheet SM counts (A100 whitepaper: 108; H100 SXM5 / H200: 132; L40S: 142).
FLEX_HOPPER = (1.18, 1.28)
"""FlexAttention ÷ FlashAttention-2 on H100/H200, (forward, backward), head dim 128: medians of
the H200 measurement above."""

GPU_PRESETS: dict[str, GPUSpec] = {
    # NVIDIA A100 datasheet (SXM4 80 GB): 312 TFLOP/s BF16 dense, 19.5 TFLOP/s FP32,
    # 2,039 GB/s HBM2e, 400 W; NVLink 3 (600 GB/s bidirectional). HGX/DGX A100 nodes carry
    # 8 ConnectX-6 HDR 200 Gbit/s InfiniBand NICs, one per GPU (DGX A100 user guide).
    "a100-80gb-sxm": GPUSpec(
        name="A100-80GB-SXM",
        memory_bytes=81920 * _MIB,
        peak_bf16_flop_per_s=312e12,
        peak_fp32_flop_per_s=19.5e12,
        hbm_bandwidth_bytes_per_s=2.039e12,
        tdp_watts=400,
        sm_count=108,
        matmul_efficiency=0.869,
        matmul_reference_k=5120,  # MAMF best shape 1024x10240x5120
        # MAMF best shape 1024x10240x5120 at 271.2 TFLOP/s: 396 µs of matmul per 179 µs of
        # copies (256 MiB + 2 x 21 MB at 85 % of 2.039 TB/s) -> 0.689
        matmul_efficiency_duty_cycle=mamf_duty_cycle(1024, 10240, 5120, 271.2e12, 2.039e12),
        attention_efficiency=0.60,
        attention_backward_efficiency=0.60,
        cudnn_attention_speed=0.82,
        flex_attention_speed=0.90,
        flex_attention_backward_speed=0.85,
        memory_efficiency=0.85,
        default_intra_node_link="nvlink3",
        default_inter_node_link="ib-hdr",
        default_network=_network(8, 200, LinkKind.INFINIBAND, 5e-6),
    ),
    # NVIDIA H100 SXM5 80 GB: 989.4 TFLOP/s BF16 dense, 1,979 TFLOP/s FP8 dense, 66.9 TFLOP/s
    # FP32, 3.35 TB/s, 700 W. HGX/DGX H100: 8 ConnectX-7 NDR 400 Gbit/s NICs, one per GPU.
    "h100-80gb-sxm": GPUSpec(
        name="H100-80GB-SXM",
        memory_bytes=81559 * _MIB,
        peak_bf16_flop_per_s=989.4e12,
        peak_fp32_flop_per_s=66.9e12,
        peak_fp8_flop_per_s=1978.9e12,
        hbm_bandwidth_bytes_per_s=3.35e12,
        tdp_watts=700,
        sm_count=132,
        matmul_efficiency=0.803,
        matmul_reference_k=13312,  # MAMF best shape 2048x2048x13312 (FP8's: K = 14336)
        fp8_matmul_efficiency=0.709,
        # BF16 best shape 2048x2048x13312 at 794.5 TFLOP/s: 141 µs of matmul per 100 µs of
        # copies at 85 % of 3.35 TB/s -> 0.584; FP8 1024x9216x14336 at 1402.6 (1-byte
        # output) -> 0.657
        matmul_efficiency_duty_cycle=mamf_duty_cycle(2048, 2048, 13312, 794.5e12, 3.35e12),
        fp8_matmul_efficiency_duty_cycle=mamf_duty_cycle(
            1024, 9216, 14336, 1402.6e12, 3.35e12, out_bytes=1
        ),
        attention_efficiency=0.32,
        attention_backward_efficiency=0.30,
        attention_reference_seq_len_tokens=4096,
        cudnn_attention_speed=1.6,
        flex_attention_speed=FLEX_HOPPER[0],
        flex_attention_backward_speed=FLEX_HOPPER[1],
        memory_efficiency=0.85,
        default_network=_network(8, 400, LinkKind.INFINIBAND, 5e-6),
    ),
    # NVIDIA H200 SXM 141 GB: same compute as H100 SXM, 4.8 TB/s HBM3e, 700 W; HGX H200 has
    # the HGX H100 network (8 × 400 Gbit/s).
    "h200-141gb-sxm": GPUSpec(
        name="H200-141GB-SXM",
        memory_bytes=143771 * _MIB,
        peak_bf16_flop_per_s=989.4e12,
        peak_fp32_flop_per_s=66.9e12,
        peak_fp8_flop_per_s=1978.9e12,
        hbm_bandwidth_bytes_per_s=4.8e12,
        tdp_watts=700,
        sm_count=132,
        matmul_efficiency=0.803,
        matmul_reference_k=13312,  # as H100 (FP8's best shape: K = 12032)
        fp8_matmul_efficiency=0.734,
        # BF16 as H100 ("H200 is the same") with the copies at 4.8 TB/s -> 0.668; FP8 best
        # shape 1280x4096x12032 at 1453.4 TFLOP/s -> 0.562
        matmul_efficiency_duty_cycle=mamf_duty_cycle(2048, 2048, 13312, 794.5e12, 4.8e12),
        fp8_matmul_efficiency_duty_cycle=mamf_duty_cycle(
            1280, 4096, 12032, 1453.4e12, 4.8e12, out_bytes=1
        ),
        attention_efficiency=0.32,
        attention_backward_efficiency=0.30,
        attention_reference_seq_len_tokens=4096,
        cudnn_attention_speed=1.8,
        flex_attention_speed=FLEX_HOPPER[0],
        flex_attention_backward_speed=FLEX_HOPPER[1],
        memory_efficiency=0.85,
        default_network=_network(8, 400, LinkKind.INFINIBAND, 5e-6),
    ),
    # NVIDIA L40S 48 GB GDDR6: 362.05 TFLOP/s BF16 dense, 91.6 TFLOP/s FP32, 864 GB/s, 350 W;
    # PCIe 4.0 only, no NVLink. No MAMF measurement is published: a power-limited (350 W) Ada
    # part is taken below the A100 PCIe figure (81.1 %, same table): 0.75; FlashAttention-2
    # at the H100 figures (no Ada measurement either). Typical L40S servers pair one 200 GbE ConnectX-7
    # with every two GPUs (NVIDIA OVX / L40S reference configurations): 4 × 200 Gbit/s RoCE.
    "l40s": GPUSpec(
        name="L40S",
        memory_bytes=46068 * _MIB,
        peak_bf16_flop_per_s=362.05e12,
        peak_fp32_flop_per_s=91.6e12,
        hbm_bandwidth_bytes_per_s=864e9,
        tdp_watts=350,
        sm_count=142,
        matmul_efficiency=0.75,
        matmul_reference_k=6144,  # the A100 PCIe best shape the estimate stands for
        # the estimate stands for what the MAMF finder would report on an L40S: its loop at the
        # A100 PCIe best shape (2048x5120x6144) at 0.75 x 362 TFLOP/s with 864 GB/s copies
        matmul_efficiency_duty_cycle=mamf_duty_cycle(2048, 5120, 6144, 0.75 * 362.05e12, 864e9),
        attention_efficiency=0.32,
        attention_backward_efficiency=0.30,
        attention_reference_seq_len_tokens=4096,
        cudnn_attention_speed=1.0,
        flex_attention_speed=0.90,
        flex_attention_backward_speed=0.85,
        memory_efficiency=0.85,
        default_intra_node_link="pcie4",
        default_inter_node_link="eth-100g",
        default_network=_network(4, 200, LinkKind.ETHERNET, 10e-6),
    ),
}


GPU_ALIASES: dict[str, str] = {
    "a100": "a100-80gb-sxm",
    "a100-80gb": "a100-80gb-sxm",
    "a100-sxm": "a100-80gb-sxm",
    "a100-sxm4": "a100-80gb-sxm",
    "h100": "h100-80gb-sxm",
    "h100-80gb": "h100-80gb-sxm",
    "h100-sxm": "h100-80gb-sxm",
    "h100-sxm5": "h100-80gb-sxm",
    "h200": "h200-141gb-sxm",
    "h200-141gb": "h200-141gb-sxm",
    "h200-sxm": "h200-141gb-sxm",
    "l40s-48gb": "l40s",
}
"""Short names accepted wherever a GPU preset is (``gpu: h200``)."""
GPU_LOOKUP: dict[str, GPUSpec] = {
    **GPU_PRESETS,
    **{a: GPU_PRESETS[n] for a, n in GPU_ALIASES.items()},
}


NETWORK_PRESETS: dict[str, NetworkSpec] = {
    # DGX/HGX A100: 8 ConnectX-6 HDR InfiniBand NICs, one per GPU
    "8x-hdr": _network(8, 200, LinkKind.INFINIBAND, 5e-6),
    # DGX/HGX H100 and H200: 8 ConnectX-7 NDR InfiniBand NICs, one per GPU
    "8x-ndr": _network(8, 400, LinkKind.INFINIBAND, 5e-6),
    # the same cabled as 400 GbE RoCE (e.g. Spectrum-X)
    "8x-400gbe": _network(8, 400, LinkKind.ETHERNET, 10e-6),
    # PCIe servers (L40S): one 200 GbE NIC per two GPUs
    "4x-200gbe": _network(4, 200, LinkKind.ETHERNET, 10e-6),
    # a single shared 100 GbE NIC
    "1x-100gbe": _network(1, 100, LinkKind.ETHERNET, 10e-6),
}
