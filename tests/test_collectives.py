"""Collectives over a pool's topology, checked against NCCL's bus-bandwidth definitions worked
out by hand (nccl-tests doc/PERFORMANCE.md: t = S·(n−1)/(n·B) for all_gather and
reduce_scatter, twice that for all_reduce; NCCL's tuning model for the latency steps)."""

from __future__ import annotations

import pytest

from shardmeter.cost.model import CostModel
from shardmeter.spec.model import MODEL_PRESETS
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import TrainingSpec

GB = 1e9


def cost_model(pool: PoolSpec, **training: object) -> CostModel:
    t = TrainingSpec(seq_len_tokens=1024, global_batch_tokens=1024, **training)  # type: ignore[arg-type]
    return CostModel(MODEL_PRESETS["llama-3.2-1b"], t, pool)


A100 = PoolSpec(name="a", gpu="a100", nodes=4, gpus_per_node=8)
# A100 priors: NVLink 3 at 80 % of 300 GB/s = 240 GB/s per GPU, 3 µs per hop; the node's
# 8 × 200 Gbit/s HDR rails at 90 % = 8 × 25 GB/s × 0.9 = 180 GB/s, 5 µs per network hop.


def test_one_node_ring_is_bound_by_nvlink() -> None:
    cm = cost_model(A100)
    # 8 ranks: 7 steps × 3 µs + 7/8 × 1 GB / 240 GB/s
    expected = 7 * 3e-6 + 7 / 8 * GB / 240e9
    assert cm.collective_seconds("all_gather", GB, 1, 8) == pytest.approx(expected)
    assert cm.collective_seconds("reduce_scatter", GB, 1, 8) == pytest.approx(expected)


def test_across_nodes_all_rails_carry_the_ring() -> None:
    cm = cost_model(A100)
    # 16 ranks on 2 nodes: 15 steps, 1 of them across the network (NCCL: nodes − 1);
    # bus bandwidth = min(NVLink 240, 8 rails × 25 × 0.9 = 180) GB/s
    expected = 14 * 3e-6 + 1 * 5e-6 + 15 / 16 * GB / 180e9
    assert cm.collective_seconds("all_gather", GB, 2, 8) == pytest.approx(expected)
    # all_reduce = reduce_scatter + all_gather: twice the steps (2·(nodes−1) across)
    ar = 2 * 14 * 3e-6 + 2 * 5e-6 + 2 * 15 / 16 * GB / 180e9
    assert cm.collective_seconds("all_reduce", GB, 2, 8) == pytest.approx(ar)
    # one NIC as the bottleneck (the pre-topology model) would be 8× slower than this
    one_rail = 15 / 16 * GB / (25e9 * 0.9)
    assert cm.collective_seconds("all_gather", GB, 2, 8) < one_rail / 7


def test_an_island_using_half_of_each_node_drives_half_the_rails() -> None:
    cm = cost_model(A100)
    # 2 nodes × 4 GPUs: the 4 rails next to those GPUs, 4 × 25 × 0.9 = 90 GB/s
    expected = 6 * 3e-6 + 5e-6 + 7 / 8 * GB / 90e9
    assert cm.collective_seconds("all_gather", GB, 2, 4) == pytest.approx(expected)


def test_network_field_and_legacy_link_agree_when_they_describe_the_same_nodes() -> None:
    legacy = PoolSpec(name="l", gpu="h100", nodes=2, gpus_per_node=8, interNodeLink="ib-ndr")
    network = PoolSpec(
        name="n",
        gpu="h100",
        nodes=2,
        gpus_per_node=8,
        network={"nicsPerNode": 8, "nicBandwidthBytesPerS": "400 Gbit/s", "latencyS": 5e-6},
    )
    a, b = cost_model(legacy), cost_model(network)
    assert a.collective_seconds("reduce_scatter", GB, 2, 8) == pytest.approx(
        b.collective_seconds("reduce_scatter", GB, 2, 8)
    )


def test_fewer_or_slower_nics_are_slower_and_oversubscription_counts_off_rail() -> None:
    def pool(**net: object) -> PoolSpec:
        return PoolSpec(name="p", gpu="h100", nodes=4, gpus_per_node=8, network=net)

    base = {"nicsPerNode": 8, "nicBandwidthBytesPerS": "400 Gbit/s"}
    full = cost_model(pool(**base)).collective_seconds("all_gather", GB, 4, 8)
    half = cost_model(pool(**{**base, "nicsPerNode": 4})).collective_seconds("all_gather", GB, 4, 8)
    assert half > full
    blocking = cost_model(pool(**base, railOptimized=False, oversubscription=2)).collective_seconds(
        "all_gather", GB, 4, 8
    )
    rail = cost_model(pool(**base, railOptimized=True, oversubscription=2)).collective_seconds(
        "all_gather", GB, 4, 8
    )
    assert rail == pytest.approx(full) and blocking > 1.9 * (full - 30e-6)


def test_hsdp_gathers_inside_a_node_and_all_reduces_shards_across() -> None:
    cm = cost_model(A100, sharding="hsdp", shard_group_nodes=1, grad_reduce_bytes=4)
    params = 1e8
    # gather: over the 8 GPUs of one node only
    assert cm.gather_seconds(params, 4, 8) == pytest.approx(
        cm.collective_seconds("all_gather", params * 2, 1, 8)
    )
    # gradients: reduce_scatter inside the node, then each GPU all-reduces its 1/8 shard with
    # the 3 other replicas; the 8 rings share the node's 180 GB/s (22.5 GB/s each)
    shard = params * 4 / 8
    replicas = 2 * 3 * 5e-6 + 2 * 3 / 4 * shard / (180e9 / 8)
    expected = cm.collective_seconds("reduce_scatter", params * 4, 1, 8) + replicas
    assert cm.gradient_sync_seconds(params, 4, 8) == pytest.approx(expected)


def test_measured_rings_become_node_bandwidth() -> None:
    from shardmeter.cost.coefficients import CommSample, LinkRole, Source
    from shardmeter.cost.fitting import fit_communication
    from shardmeter.cost.priors import pool_priors

    pool = PoolSpec(name="p", gpu="h100", nodes=2, gpus_per_node=8)
    # the benchmark Job's inter-node layout: 8 rings at once (one per local GPU), each
    # across the 2 nodes on its own 400 Gbit/s rail at 45 GB/s; 8 µs per network step
    rail_bw, latency = 45e9, 8e-6
    samples = [
        CommSample(
            collective=c,
            role=LinkRole.INTER_NODE,
            payload_bytes=d,
            ranks=2,
            seconds=(2 if c == "all_reduce" else 1) * (latency + d / 2 / rail_bw),
            parallel_rings=8,
        )
        for c in ("all_gather", "reduce_scatter", "all_reduce")
        for d in (1e6, 1e8, 1e9)
    ]
    fits, _ = fit_communication(samples, pool.intra, pool.inter)
    inter = fits[LinkRole.INTER_NODE]["all_gather"]
    assert inter.parallel_rings == 8
    assert 1 / inter.seconds_per_byte == pytest.approx(rail_bw, rel=1e-3)
    doc = pool_priors(pool).model_copy(
        update={"communication": fits, "source": Source.MEASURED, "measured_at": None}
    )
    doc = doc.model_copy(update={"measured_at": doc.created_at})
    cm = CostModel(
        MODEL_PRESETS["llama-3.2-1b"],
        TrainingSpec(seq_len_tokens=8, global_batch_tokens=8),
        pool,
        doc,
    )
    node = cm.coefficients.communication[LinkRole.INTER_NODE]["all_gather"]
    assert 1 / node.seconds_per_byte == pytest.approx(8 * rail_bw, rel=1e-3)
    # a document from before topology (no parallel_rings): one rail per GPU of the pool
    legacy = {
        role: {c: f.model_copy(update={"parallel_rings": None}) for c, f in fits_.items()}
        for role, fits_ in fits.items()
    }
    old = CostModel(
        MODEL_PRESETS["llama-3.2-1b"],
        TrainingSpec(seq_len_tokens=8, global_batch_tokens=8),
        pool,
        doc.model_copy(update={"communication": legacy}),
    )
    assert old.coefficients.communication[LinkRole.INTER_NODE]["all_gather"].seconds_per_byte == (
        pytest.approx(node.seconds_per_byte)
    )
