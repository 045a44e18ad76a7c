"""Collective timing on 2 Gloo ranks (small payloads), the group layout for multi-node
pools, and the launch-environment parsing (torchrun and Indexed Job variables)."""

from __future__ import annotations

import pytest

from shardmeter.cost.coefficients import LinkRole
from shardmeter.cost.fitting import fit_communication
from shardmeter.spec.hardware import LINK_PRESETS
from shardmeter_bench.comm import CommPlan, comm_phase, group_layout
from shardmeter_bench.distributed import DistContext, spawn
from shardmeter_bench.errors import DistributedError


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


def test_context_from_torchrun_environment() -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
    }
    ctx = DistContext.from_env(env)
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size) == (5, 8, 1, 4)
    assert (ctx.node_rank, ctx.nnodes, ctx.launched, ctx.is_main) == (1, 2, True, False)


def test_context_falls_back_to_indexed_job_variables() -> None:
    env = {"RANK": "2", "WORLD_SIZE": "4", "NPROC_PER_NODE": "2", "NNODES": "2", "NODE_RANK": "1"}
    ctx = DistContext.from_env(env)
    assert (ctx.local_world_size, ctx.nnodes, ctx.node_rank, ctx.local_rank) == (2, 2, 1, 0)


def test_plain_process_is_a_world_of_one() -> None:
    ctx = DistContext.from_env({})
    assert (ctx.world_size, ctx.launched, ctx.is_main) == (1, False, True)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "3"}, "inconsistent"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "inconsistent"),
        ({"RANK": "x", "WORLD_SIZE": "4"}, "not an integer"),
    ],
)
def test_inconsistent_launch_environment_is_an_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(DistributedError, match=message):
        DistContext.from_env(env)
