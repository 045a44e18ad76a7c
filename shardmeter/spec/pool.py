"""A node pool: identical GPU nodes at one site — the GPU, the links inside and between its
nodes, its node network and its price — built from the hardware specs and presets of
`shardmeter.spec.hardware` (a preset's name, or a full spec, wherever one is expected)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator, model_validator

from shardmeter.spec.base import SpecModel
from shardmeter.spec.gpu_names import explain_unknown_gpu
from shardmeter.spec.hardware import (
    GPU_LOOKUP,
    LINK_PRESETS,
    MAX_PRICE_PER_GPU_HOUR_USD,
    NETWORK_PRESETS,
    GPUSpec,
    LinkSpec,
    NetworkSpec,
)
from shardmeter.spec.presets import resolve


def _resolve_gpu(value: Any) -> Any:
    return resolve(value, GPU_LOOKUP, "GPU", explain_unknown_gpu)


def _resolve_network(value: Any) -> Any:
    return resolve(value, NETWORK_PRESETS, "network")


def _resolve_link(value: Any) -> Any:
    return resolve(value, LINK_PRESETS, "link")


GPURef = Annotated[GPUSpec, BeforeValidator(_resolve_gpu, json_schema_input_type=str | GPUSpec)]
LinkRef = Annotated[LinkSpec, BeforeValidator(_resolve_link, json_schema_input_type=str | LinkSpec)]
NetworkRef = Annotated[
    NetworkSpec, BeforeValidator(_resolve_network, json_schema_input_type=str | NetworkSpec)
]

DEFAULT_PUE = 1.58
"""Average annual PUE reported by the Uptime Institute's Global Data Center Survey 2023."""
MAX_PUE = 3.0
"""Largest PUE a pool may state (the survey's worst sites are near 2.5)."""
DEFAULT_GRID_CARBON_INTENSITY_G_PER_KWH = 480.0
"""World-average carbon intensity of electricity in 2023: 480 gCO₂e/kWh (Ember, Global
Electricity Review 2024)."""
MAX_GRID_CARBON_INTENSITY = 2000.0
"""Largest carbon intensity a pool may state (lignite power is ~1,100 gCO₂e/kWh)."""
MAX_EGRESS_USD_PER_GB = 100.0
"""Dearest egress a pool may state (list prices are below 0.2 USD per GB)."""

_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class PoolHardware(SpecModel):
    """A pool of identical GPU nodes at one site (everything but its name; the ``GPUPool``
    custom resource takes the name from its metadata)."""

    model_config = SpecModel.model_config | {
        "json_schema_extra": {
            # network and interNodeLink are schemaless (a preset name or an object): CEL
            # cannot see them (kube-apiserver refuses a rule naming them: "undefined field"),
            # so "not both" is _one_network's, reported by the operator as Valid=False
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.powerCapWatts) || self.powerCapWatts > 0.0",
                    "message": "powerCapWatts must be greater than 0",
                },
            ]
        }
    }

    gpu: GPURef
    """GPU preset name or an inline GPU spec."""
    nodes: int = Field(ge=1, le=4096)
    """Nodes available in the pool."""
    gpus_per_node: int = Field(ge=1, le=16)
    """GPUs in each node."""
    intra_node_link: LinkRef | None = None
    """Link of one GPU inside a node; defaults to the GPU's usual one (NVLink or PCIe)."""
    network: NetworkRef | None = None
    """The nodes' network: a preset (``8x-ndr``, ``8x-hdr``, ``8x-400gbe``, ``4x-200gbe``,
    ``1x-100gbe``) or NICs per node, bandwidth per NIC, rail-optimised or not (e.g.
    ``{nicsPerNode: 8, nicBandwidthBytesPerS: 400 Gbit/s}``); defaults to the GPU's usual
    server network."""
    inter_node_link: LinkRef | None = None
    """Legacy form of ``network``: a per-GPU rail (a link preset such as ``ib-ndr``), meaning
    one NIC of that bandwidth per GPU."""
    site: str = Field(default="default", min_length=1, max_length=63)
    """Site (data centre). Islands at different sites talk over the sites' WAN uplinks."""
    wan_uplink: LinkRef | None = None
    """The site's WAN uplink, needed when a plan spans sites."""
    price_per_gpu_hour_usd: float = Field(default=0.0, ge=0, le=MAX_PRICE_PER_GPU_HOUR_USD)
    """Price of one GPU for one hour (0 to 10,000 USD)."""
    power_cap_watts: float | None = Field(default=None, gt=0)
    """GPU power limit set on the nodes (``nvidia-smi -pl``); unset = the board's TDP. Lower
    caps lower the sustained clock (see `shardmeter.cost.power`)."""
    pue: float = Field(default=DEFAULT_PUE, ge=1.0, le=MAX_PUE)
    """Power usage effectiveness of the site: facility energy ÷ IT energy (1.0–3.0). Default
    1.58, the average annual PUE of the Uptime Institute's Global Data Center Survey 2023;
    hyperscale sites report 1.1–1.2."""
    grid_carbon_intensity_g_per_kwh: float = Field(
        default=DEFAULT_GRID_CARBON_INTENSITY_G_PER_KWH, ge=0, le=MAX_GRID_CARBON_INTENSITY
    )
    """Carbon intensity of the site's electricity in gCO₂e per kWh (0–2,000). Default 480,
    the world average of 2023 (Ember, Global Electricity Review 2024); grids range from
    ~30 (hydro/nuclear) to ~800 (coal)."""
    wan_egress_usd_per_gb: float = Field(
        default=0.0, ge=0, le=MAX_EGRESS_USD_PER_GB, alias="wanEgressUsdPerGB"
    )
    """Price of one GB (10⁹ bytes, not a gigabit) leaving the site over its WAN uplink (0–100
    USD; ``wanEgressUsdPerGB``). Default
    0 (no egress billing, e.g. own sites); clouds charge about 0.02 between regions and
    0.05–0.09 to the internet. DiLoCo's outer all_reduce across sites is priced with it."""
    exclusive_nodes: bool = False
    """An island pays for (and powers) its nodes whole, all ``gpusPerNode`` GPUs, even when
    it uses fewer — clouds that rent whole nodes, or pools whose left-over GPUs no other job
    may use; the planner then prefers shapes that fill their nodes. Default false: GPUs are
    billed one by one, as the paper's USD per GPU-hour (a shared Kubernetes pool schedules
    other pods on the GPUs an island leaves free)."""

    @model_validator(mode="after")
    def _one_network(self) -> PoolHardware:
        if self.network is not None and self.inter_node_link is not None:
            raise ValueError(
                "give either network (NICs per node) or the legacy interNodeLink "
                "(one rail per GPU), not both"
            )
        cap, gpu = self.power_cap_watts, self.gpu
        if cap is not None and cap > gpu.tdp_watts:
            raise ValueError(
                f"powerCapWatts ({cap:g}) exceeds the {gpu.name} board limit of "
                f"{gpu.tdp_watts:g} W; leave it unset to run at the TDP"
            )
        static = gpu.static_power_fraction * gpu.tdp_watts
        if cap is not None and cap <= static:
            raise ValueError(
                f"powerCapWatts ({cap:g}) is at or below the {gpu.name}'s static power "
                f"(≈ {static:.0f} W): the GPU could not clock at all; raise it"
            )
        return self

    @property
    def intra(self) -> LinkSpec:
        """The link inside a node (the pool's, else the GPU's usual one)."""
        return self.intra_node_link or LINK_PRESETS[self.gpu.default_intra_node_link]

    @property
    def inter(self) -> LinkSpec:
        """One rail of the node network as a link (its NIC bandwidth and hop latency)."""
        net = self.node_network
        return LinkSpec(
            name=self.inter_node_link.name
            if self.inter_node_link is not None
            else f"{net.nics_per_node}x{net.nic_bandwidth_bytes_per_s * 8 / 1e9:g}G",
            kind=net.kind,
            latency_s=net.hop_latency_s,
            bandwidth_bytes_per_s=net.nic_bandwidth_bytes_per_s,
        )

    @property
    def node_network(self) -> NetworkSpec:
        """The node network: the pool's ``network``, else its legacy per-GPU
        ``interNodeLink`` (one rail per GPU), else the GPU's usual server network."""
        if self.network is not None:
            return self.network
        if self.inter_node_link is not None:
            return NetworkSpec.one_rail_per_gpu(self.inter_node_link, self.gpus_per_node)
        if self.gpu.default_network is not None:
            return self.gpu.default_network
        return NetworkSpec.one_rail_per_gpu(
            LINK_PRESETS[self.gpu.default_inter_node_link], self.gpus_per_node
        )

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
        if not _NAME_RE.fullmatch(value):
            raise ValueError("must be a DNS-1123 label (lower-case letters, digits and '-')")
        return value
