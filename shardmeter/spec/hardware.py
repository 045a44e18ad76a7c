"""Hardware: GPUs, links and node pools, with datasheet presets."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator

from shardmeter.spec.base import Bytes, BytesPerSecond, Seconds, SpecModel
from shardmeter.spec.presets import resolve


class GPUSpec(SpecModel):
    """An accelerator's datasheet figures (dense, no sparsity)."""

    name: str = Field(max_length=63)
    """Display name, e.g. ``H200-141GB-SXM``."""
    memory_bytes: Bytes
    """Device memory (the total nvidia-smi reports)."""
    peak_bf16_flop_per_s: float = Field(gt=0)
    """Peak dense BF16 tensor-core throughput."""
    peak_fp32_flop_per_s: float = Field(gt=0)
    """Peak FP32 (non-tensor-core) throughput."""
    hbm_bandwidth_bytes_per_s: BytesPerSecond
    """Device memory bandwidth."""
    tdp_watts: float = Field(gt=0)
    """Board power limit."""
    default_intra_node_link: str = "nvlink4"
    """Link preset used inside a node when a pool does not name one."""
    default_inter_node_link: str = "ib-ndr"
    """Per-GPU network rail used between nodes when a pool does not name one."""

    @field_validator("default_intra_node_link", "default_inter_node_link")
    @classmethod
    def _known_link(cls, value: str) -> str:
        if value not in LINK_PRESETS:
            raise ValueError(
                f"unknown link preset {value!r}; allowed: {', '.join(sorted(LINK_PRESETS))}"
            )
        return value

    def peak_flop_per_s(self, precision: str) -> float:
        return (
            self.peak_bf16_flop_per_s
            if precision in ("bf16", "fp16")
            else self.peak_fp32_flop_per_s
        )


class LinkKind(StrEnum):
    NVLINK = "nvlink"
    PCIE = "pcie"
    INFINIBAND = "infiniband"
    ETHERNET = "ethernet"
    WAN = "wan"


class LinkSpec(SpecModel):
    """A communication path. For fabrics between nodes, ``bandwidth_bytes_per_s`` is the
    bandwidth available to *one GPU* (one NIC rail per GPU, as in DGX/HGX nodes); for a WAN
    uplink it is the site's whole uplink."""

    name: str = Field(default="custom", max_length=63)
    kind: LinkKind
    latency_s: Seconds
    """One-way latency of one hop (ring step)."""
    bandwidth_bytes_per_s: BytesPerSecond
    """Datasheet bandwidth per direction."""


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
    # InfiniBand HDR / NDR, one 200 / 400 Gbit/s HCA per GPU.
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


_MIB = 2**20

GPU_PRESETS: dict[str, GPUSpec] = {
    # NVIDIA A100 datasheet (SXM4 80 GB): 312 TFLOP/s BF16 dense, 19.5 TFLOP/s FP32,
    # 2,039 GB/s HBM2e, 400 W; NVLink 3 (600 GB/s bidirectional).
    "a100-80gb-sxm": GPUSpec(
        name="A100-80GB-SXM",
        memory_bytes=81920 * _MIB,
        peak_bf16_flop_per_s=312e12,
        peak_fp32_flop_per_s=19.5e12,
        hbm_bandwidth_bytes_per_s=2.039e12,
        tdp_watts=400,
        default_intra_node_link="nvlink3",
        default_inter_node_link="ib-hdr",
    ),
    # NVIDIA H100 SXM5 80 GB: 989.4 TFLOP/s BF16 dense, 66.9 TFLOP/s FP32, 3.35 TB/s, 700 W.
    "h100-80gb-sxm": GPUSpec(
        name="H100-80GB-SXM",
        memory_bytes=81559 * _MIB,
        peak_bf16_flop_per_s=989.4e12,
        peak_fp32_flop_per_s=66.9e12,
        hbm_bandwidth_bytes_per_s=3.35e12,
        tdp_watts=700,
    ),
    # NVIDIA H200 SXM 141 GB: same compute as H100 SXM, 4.8 TB/s HBM3e, 700 W.
    "h200-141gb-sxm": GPUSpec(
        name="H200-141GB-SXM",
        memory_bytes=143771 * _MIB,
        peak_bf16_flop_per_s=989.4e12,
        peak_fp32_flop_per_s=66.9e12,
        hbm_bandwidth_bytes_per_s=4.8e12,
        tdp_watts=700,
    ),
    # NVIDIA L40S 48 GB GDDR6: 362.05 TFLOP/s BF16 dense, 91.6 TFLOP/s FP32, 864 GB/s, 350 W;
    # PCIe 4.0 only, no NVLink.
    "l40s": GPUSpec(
        name="L40S",
        memory_bytes=46068 * _MIB,
        peak_bf16_flop_per_s=362.05e12,
        peak_fp32_flop_per_s=91.6e12,
        hbm_bandwidth_bytes_per_s=864e9,
        tdp_watts=350,
        default_intra_node_link="pcie4",
        default_inter_node_link="eth-100g",
    ),
}


GPU_ALIASES: dict[str, str] = {
    "a100": "a100-80gb-sxm",
    "a100-80gb": "a100-80gb-sxm",
    "h100": "h100-80gb-sxm",
    "h100-80gb": "h100-80gb-sxm",
    "h200": "h200-141gb-sxm",
    "h200-141gb": "h200-141gb-sxm",
}
"""Short names accepted wherever a GPU preset is (``gpu: h200``)."""
GPU_LOOKUP: dict[str, GPUSpec] = {
    **GPU_PRESETS,
    **{a: GPU_PRESETS[n] for a, n in GPU_ALIASES.items()},
}


def _resolve_gpu(value: Any) -> Any:
    return resolve(value, GPU_LOOKUP, "GPU")


def _resolve_link(value: Any) -> Any:
    return resolve(value, LINK_PRESETS, "link")


GPURef = Annotated[GPUSpec, BeforeValidator(_resolve_gpu, json_schema_input_type=str | GPUSpec)]
LinkRef = Annotated[LinkSpec, BeforeValidator(_resolve_link, json_schema_input_type=str | LinkSpec)]

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class PoolHardware(SpecModel):
    """A pool of identical GPU nodes at one site (everything but its name; the ``GPUPool``
    custom resource takes the name from its metadata)."""

    gpu: GPURef
    """GPU preset name or an inline GPU spec."""
    nodes: int = Field(ge=1, le=4096)
    """Nodes available in the pool."""
    gpus_per_node: int = Field(ge=1, le=16)
    """GPUs in each node."""
    intra_node_link: LinkRef | None = None
    """Link between GPUs of one node; defaults to the GPU's usual one (NVLink or PCIe)."""
    inter_node_link: LinkRef | None = None
    """Per-GPU network rail between nodes; defaults to the GPU's usual fabric."""
    site: str = Field(default="default", min_length=1, max_length=63)
    """Site (data centre). Islands at different sites talk over the sites' WAN uplinks."""
    wan_uplink: LinkRef | None = None
    """The site's WAN uplink, needed when a plan spans sites."""
    price_per_gpu_hour_usd: float = Field(default=0.0, ge=0)
    """Price of one GPU for one hour."""

    @property
    def intra(self) -> LinkSpec:
        """The link inside a node (the pool's, else the GPU's usual one)."""
        return self.intra_node_link or LINK_PRESETS[self.gpu.default_intra_node_link]

    @property
    def inter(self) -> LinkSpec:
        """The per-GPU rail between nodes (the pool's, else the GPU's usual fabric)."""
        return self.inter_node_link or LINK_PRESETS[self.gpu.default_inter_node_link]

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class PoolSpec(PoolHardware):
    """A named pool."""

    name: str = Field(min_length=1, max_length=63)
    """Pool name (a DNS-1123 label: lower case, digits and '-')."""

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError("must be a DNS-1123 label (lower-case letters, digits and '-')")
        return value
