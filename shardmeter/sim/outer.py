"""The inter-island path of DiLoCo's outer all_reduce and its duration.

The pseudo-gradient (parameters × outer precision bytes) is all-reduced across the P
islands with a ring, ``T = 2·(P−1)·(L + β·D/P)`` (paper §III-B):

* **islands at different sites** talk over the sites' WAN uplinks: L = the largest uplink
  latency, β = 1 / (smallest uplink bandwidth × link efficiency). The ring, ordered by site,
  crosses each uplink once per direction, and every rank's shard shares that uplink, so the
  whole payload goes through one uplink (``parallel_rails = 1``);
* **islands at one site** talk over the inter-node fabric. Each FSDP rank all-reduces its own
  shard with its counterparts in the other islands, so every node of an island pushes its
  GPUs' shards through its NIC rails at once: the payload is spread over as many node
  networks as the smallest island fills (``parallel_rails`` = its GPUs ÷ GPUs per node),
  each moving at the node's inter-node bus bandwidth (the inter-node fit's
  ``seconds_per_byte`` is per node, all rails); L and β are the slowest pool's fitted
  inter-node all_reduce coefficients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardmeter.cost.coefficients import LinkRole
from shardmeter.cost.collectives import link_ring_seconds
from shardmeter.cost.model import CostModel
from shardmeter.cost.priors import LINK_EFFICIENCY_BY_KIND
from shardmeter.errors import SpecError
from shardmeter.spec.hardware import LinkSpec


@dataclass(frozen=True)
class OuterLink:
    latency_s: float
    seconds_per_byte: float
    parallel_rails: float
    description: str

    def all_reduce_seconds(self, payload_bytes: float, islands: int) -> float:
        return link_ring_seconds(
            "all_reduce",
            payload_bytes / self.parallel_rails,
            islands,
            self.latency_s,
            self.seconds_per_byte,
        )


def wan_link(uplinks: Sequence[LinkSpec]) -> OuterLink:
    slowest = min(uplinks, key=lambda link: link.bandwidth_bytes_per_s)
    return OuterLink(
        latency_s=max(link.latency_s for link in uplinks),
        seconds_per_byte=1.0
        / (slowest.bandwidth_bytes_per_s * LINK_EFFICIENCY_BY_KIND[slowest.kind]),
        parallel_rails=1,
        description=f"WAN ({slowest.name})",
    )


def fabric_link(link: LinkSpec, rails: int) -> OuterLink:
    """A datasheet inter-node link between islands at one site, ``rails`` shards in parallel."""
    return OuterLink(
        latency_s=link.latency_s,
        seconds_per_byte=1.0 / (link.bandwidth_bytes_per_s * LINK_EFFICIENCY_BY_KIND[link.kind]),
        parallel_rails=rails,
        description=f"inter-node fabric ({link.name})",
    )


def fabric_fit(cm: CostModel) -> tuple[float, float]:
    """(latency s, seconds per byte) of the outer all_reduce between islands of one pool's
    site over its inter-node fabric."""
    fit = cm.coefficients.communication[LinkRole.INTER_NODE]["all_reduce"]
    return fit.latency_s, fit.seconds_per_byte


@dataclass(frozen=True)
class IslandPlacement:
    """Where one island runs: its pool's cost model, site and GPU count."""

    cost_model: CostModel
    ranks: int

    @property
    def site(self) -> str:
        return self.cost_model.pool.site

    @property
    def node_rails(self) -> float:
        """The island's share of node networks: its GPUs ÷ GPUs per node (a 2 × 4 island on
        8-GPU nodes drives half the rails of two nodes = one node's worth)."""
        return self.ranks / self.cost_model.pool.gpus_per_node


def outer_link(islands: Sequence[IslandPlacement]) -> OuterLink:
    """The path the outer all_reduce takes between ``islands`` (see the module docstring)."""
    sites = {isl.site for isl in islands}
    if len(sites) > 1:
        uplinks = []
        for isl in islands:
            pool = isl.cost_model.pool
            if pool.wan_uplink is None:
                raise SpecError(
                    f"pools[{pool.name}].wanUplink",
                    f"is required: the plan spans sites {sorted(sites)}",
                )
            uplinks.append(pool.wan_uplink)
        return wan_link(uplinks)
    fits = [fabric_fit(isl.cost_model) for isl in islands]
    link = islands[0].cost_model.coefficients.communication[LinkRole.INTER_NODE]["all_reduce"].link
    return OuterLink(
        latency_s=max(f[0] for f in fits),
        seconds_per_byte=max(f[1] for f in fits),
        parallel_rails=min(isl.node_rails for isl in islands),
        description=f"inter-node fabric ({link})",
    )
