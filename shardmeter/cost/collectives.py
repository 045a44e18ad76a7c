"""Collective times over a pool's topology, the way NCCL's performance notes define them.

NCCL's ``doc/PERFORMANCE.md`` (nccl-tests) defines the **bus bandwidth** B of a collective so
that it can be compared with the hardware: for a payload of S bytes over n ranks a ring
all_gather or reduce_scatter takes ``t = S·(n−1)/(n·B)`` and an all_reduce ``2·S·(n−1)/(n·B)``.
B is the bandwidth of the slowest hop every rank must cross:

* **inside one node** it is the link of one GPU into the NVSwitch / PCIe fabric;
* **across nodes** each ring (NCCL "channel") crosses the node boundary through one NIC,
  and NCCL runs one channel per NIC rail in parallel, so a node moves ``rails × NIC
  bandwidth`` — its inter-node bus bandwidth — capped by the intra-node link that feeds the
  rails. An island using G of a node's GPUs uses the rails next to those GPUs: with one NIC
  per GPU, G of them.

The latency term follows NCCL's tuning model (``src/graph/tuning.cc``): a ring takes
``nsteps = k·(n−1)`` steps (k = 2 for all_reduce), of which ``k·(nodes−1)`` cross the network;
each intra-node step costs the intra-node hop latency and each network step the NIC hop latency.

`CollectiveFit` coefficients (``latency_s``, ``seconds_per_byte`` = 1/B) exist per link role:
``intra_node`` (per GPU link) and ``inter_node`` (per **node**, all rails), so measured and
prior documents plug in the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardmeter.cost.coefficients import CollectiveFit


def ring_factor(collective: str) -> int:
    """k: 2 for all_reduce (reduce_scatter + all_gather), else 1."""
    return 2 if collective == "all_reduce" else 1


def link_ring_seconds(
    collective: str, payload_bytes: float, ranks: int, latency_s: float, seconds_per_byte: float
) -> float:
    """Ring collective time over P ranks on one kind of link, for a full payload of D bytes:
    k·(P−1)·(L + β·D/P) — the form the bench Job fits per link (`RingCollectiveRegressor`)."""
    if ranks <= 1:
        return 0.0
    per_step = latency_s + seconds_per_byte * payload_bytes / ranks
    return ring_factor(collective) * (ranks - 1) * per_step


@dataclass(frozen=True)
class Topology:
    """What the collective model needs to know about an island's hardware."""

    gpus_per_node: int
    """GPUs in one node of the pool (not of the island)."""
    nics_per_node: int
    """NIC rails of one node."""

    def rail_fraction(self, island_gpus_per_node: int) -> float:
        """Share of a node's rails an island with G GPUs per node drives: the rails next to
        its GPUs (G/GPUs-per-node of them, at least one NIC)."""
        share = island_gpus_per_node / self.gpus_per_node
        return min(1.0, max(1.0 / self.nics_per_node, share))


def ring_seconds(
    collective: str,
    payload_bytes: float,
    nodes: int,
    gpus_per_node: int,
    intra: CollectiveFit,
    inter: CollectiveFit,
    rail_fraction: float = 1.0,
) -> float:
    """Ring ``collective`` of a full payload (the unsharded tensor, in bytes) over
    ``nodes × gpus_per_node`` ranks."""
    ranks = nodes * gpus_per_node
    if ranks <= 1:
        return 0.0
    k = ring_factor(collective)
    steps = k * (ranks - 1)
    net_steps = k * (nodes - 1)
    latency = (steps - net_steps) * intra.latency_s + net_steps * inter.latency_s
    if nodes == 1:
        per_byte = intra.seconds_per_byte
    else:
        network = inter.seconds_per_byte / rail_fraction
        per_byte = network if gpus_per_node == 1 else max(intra.seconds_per_byte, network)
    return latency + k * (ranks - 1) / ranks * payload_bytes * per_byte


def replica_all_reduce_seconds(
    payload_bytes: float,
    replicas: int,
    gpus_per_node: int,
    inter: CollectiveFit,
    rail_fraction: float = 1.0,
) -> float:
    """HSDP's all_reduce of each rank's gradient shard with its replicas in the other shard
    groups: ``gpus_per_node`` rings run at once (one per local rank), sharing the node's
    rails, each over ``replicas`` ranks that sit on different nodes."""
    if replicas <= 1:
        return 0.0
    per_gpu_seconds_per_byte = inter.seconds_per_byte * gpus_per_node / rail_fraction
    steps = 2 * (replicas - 1)
    return (
        steps * inter.latency_s
        + 2 * (replicas - 1) / replicas * payload_bytes * per_gpu_seconds_per_byte
    )
