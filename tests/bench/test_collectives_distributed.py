"""The launch-environment parsing (torchrun and Indexed Job variables) of
`shardmeter_bench.collectives.distributed`."""

from __future__ import annotations

import pytest

from shardmeter_bench.collectives.distributed import DistContext
from shardmeter_bench.errors import DistributedError


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
