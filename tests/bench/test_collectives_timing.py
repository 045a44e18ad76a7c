"""Collective timing on 2 Gloo ranks (small payloads) and the group layout for multi-node
pools (`shardmeter_bench.collectives.timing`)."""

from __future__ import annotations

from shardmeter.cost.coefficients import LinkRole
from shardmeter.cost.fitting import fit_communication
from shardmeter.spec.hardware import LINK_PRESETS
from shardmeter_bench.collectives.distributed import DistContext, spawn
from shardmeter_bench.collectives.timing import CommPlan, comm_phase, group_layout


def test_collectives_on_two_gloo_ranks() -> None:
    plan = CommPlan(payloads=(1024, 65536), repeats=3, min_loop_s=0.005)
    samples = spawn(comm_phase, plan, nprocs=2, device_type="cpu", timeout_s=60)
    assert len(samples) == 3 * 2
    assert {s.collective for s in samples} == {"all_gather", "reduce_scatter", "all_reduce"}
    for s in samples:
        assert s.role is LinkRole.INTRA_NODE and s.ranks == 2
        assert s.payload_bytes % (2 * 4) == 0  # whole float32 shards on both ranks
        assert abs(s.payload_bytes - (1024 if s.payload_bytes < 4096 else 65536)) <= 8
        assert 0 < s.seconds < 0.5
    fits, notes = fit_communication(samples, LINK_PRESETS["pcie4"], LINK_PRESETS["eth-100g"])
    assert fits[LinkRole.INTRA_NODE]["all_reduce"].n_samples == 2
    assert any("inter_node" in n for n in notes)  # one node: inter-node stays a prior


def test_group_layout_single_node() -> None:
    ctx = DistContext(rank=0, world_size=2, local_world_size=2, nnodes=1, launched=True)
    assert group_layout(ctx) == [(LinkRole.INTRA_NODE, 2, [[0, 1]])]


def test_group_layout_two_nodes_of_four() -> None:
    ctx = DistContext(rank=5, world_size=8, local_rank=1, local_world_size=4, node_rank=1, nnodes=2)
    layout = group_layout(ctx)
    assert layout[0] == (LinkRole.INTRA_NODE, 2, [[0, 1], [2, 3], [4, 5], [6, 7]])
    assert layout[1] == (LinkRole.INTRA_NODE, 4, [[0, 1, 2, 3], [4, 5, 6, 7]])
    # across nodes: one group per rail (local rank), all rails measured at once
    assert layout[2] == (LinkRole.INTER_NODE, 2, [[0, 4], [1, 5], [2, 6], [3, 7]])
    for _, _, groups in layout:  # every rank in exactly one group per configuration
        assert sorted(r for g in groups for r in g) == list(range(8))


def test_group_layout_one_gpu_per_node_has_only_inter_node() -> None:
    ctx = DistContext(rank=0, world_size=3, local_world_size=1, nnodes=3, launched=True)
    assert group_layout(ctx) == [(LinkRole.INTER_NODE, 3, [[0, 1, 2]])]
