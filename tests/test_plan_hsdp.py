"""HSDP islands are whole shard groups: the planner enumerates only islands whose nodes are a
multiple of ``shardGroupNodes`` (torchtitan replicates over nodes / shardGroupNodes groups
and cannot run the others), says so when no such island exists, and the model refuses to
price one instead of clamping the group to the island."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardmeter.cli.main import main
from shardmeter.cost.model import CostModel
from shardmeter.errors import InfeasibleError, SpecError
from shardmeter.plan.result import build_result, summarise
from shardmeter.plan.schema import PlanSpec
from shardmeter.plan.search import search
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import TrainingSpec
from shardmeter_operator.api import GPUPoolSpec, TrainingPlanSpec
from shardmeter_operator.trainingplan.model import plan_outcome, plan_request

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "name": "tiny",
    "hiddenSize": 512,
    "numLayers": 4,
    "numAttentionHeads": 8,
    "numKeyValueHeads": 4,
    "intermediateSize": 1536,
    "vocabSize": 8000,
}


def request(sharding: str = "hsdp", group: int = 2, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": TINY,
        "training": {
            "seqLenTokens": 512,
            "globalBatchTokens": 512 * 12,
            "sharding": sharding,
            "shardGroupNodes": group,
        },
        "strategy": {"kind": "streaming-diloco"},
        "pools": [{"name": "p", "gpu": "h100", "nodes": 4, "gpusPerNode": 2, "site": "x"}],
        "constraints": {"maxIslands": 4, "globalBatchTolerance": 0.5},
        "objective": {"kind": "min-time"},
        "runtime": "weighted",
    }
    base.update(overrides)
    return base


TINY_SPEC = PlanSpec.model_validate(request()).model


def island_nodes(raw: dict[str, Any]) -> set[int]:
    """The node counts of the islands of every layout the (exhaustive) search scored."""
    out = search(PlanSpec.model_validate(raw), force_mode="exhaustive")
    return {
        nodes
        for i in range(len(out.evaluated))
        for _, _, nodes, _ in summarise(out, out.evaluated, i).layout
    }


def test_the_planner_enumerates_only_whole_shard_groups() -> None:
    assert island_nodes(request("fsdp")) == {1, 2, 3, 4}  # what the rule takes away
    assert island_nodes(request("hsdp", 2)) == {2, 4}
    assert island_nodes(request("hsdp", 3)) == {3}
    assert island_nodes(request("hsdp", 1)) == {1, 2, 3, 4}


def test_every_plan_on_the_frontier_is_whole_shard_groups() -> None:
    result = build_result(search(PlanSpec.model_validate(request("hsdp", 2))))
    assert result.frontier
    for plan in result.frontier:
        assert all(g.nodes % 2 == 0 for g in plan.groups), plan.label


def test_a_pool_smaller_than_a_shard_group_is_named() -> None:
    with pytest.raises(InfeasibleError) as err:
        search(PlanSpec.model_validate(request("hsdp", 5)))
    msg = str(err.value)
    assert "an hsdp island's nodes must be a multiple of training.shardGroupNodes (5)" in msg
    assert "the pool has 4 usable node(s); lower training.shardGroupNodes to at most 4" in msg


def test_constraints_that_leave_no_whole_shard_group_are_named() -> None:
    # the smallest island of whole 2-node groups has 2 GPUs (2 nodes × 1 GPU)
    raw = request("hsdp", 2, constraints={"maxGpus": 1, "maxIslands": 4})
    with pytest.raises(InfeasibleError) as err:
        search(PlanSpec.model_validate(raw))
    msg = str(err.value)
    assert "multiple of training.shardGroupNodes (2)" in msg
    assert "constraints.minGpusPerIsland 1, maxGpus 1" in msg
    assert "lower training.shardGroupNodes or change those constraints" in msg


def test_the_plan_command_exits_2_naming_shard_group_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "hsdp.yaml"
    f.write_text(yaml.safe_dump(request("hsdp", 5)))
    assert main(["plan", str(f), "--no-files"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == ""
    assert "training.shardGroupNodes (5)" in lines[0]


def test_a_trainingplan_is_planned_with_whole_shard_groups() -> None:
    """The operator's planning path (TrainingPlan + GPUPool → the model's search): with fsdp
    the fastest plan is three 1-node islands, which hsdp with 2-node groups cannot run. (Raw
    wall-clock: ranked by quality, a tiny model's three islands cost more than they gain.)"""
    pool_doc = yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())["spec"]
    pool = GPUPoolSpec.model_validate({**pool_doc, "nodes": 3, "gpusPerNode": 2})
    example = yaml.safe_load((REPO / "examples" / "trainingplan.yaml").read_text())["spec"]
    shapes = {}
    for sharding in ("fsdp", "hsdp"):
        doc = copy.deepcopy(example)
        doc |= {
            "model": TINY,
            "training": {
                "seqLenTokens": 512,
                "globalBatchTokens": 512 * 12,
                "sharding": sharding,
                "shardGroupNodes": 2,
            },
            "pools": [{"name": "cluster-a"}],
            "constraints": {"maxIslands": 3},
            "objective": {"kind": "min-time", "qualityAdjusted": False},
        }
        spec = TrainingPlanSpec.model_validate(doc)
        outcome = plan_outcome("p", plan_request(spec, {"cluster-a": pool}), {})
        shapes[sharding] = [(i.nodes, i.gpus_per_node) for i in outcome.islands]
    assert shapes["fsdp"] == [(1, 2)] * 3
    assert shapes["hsdp"] == [(2, 2)]


@pytest.mark.parametrize(("group", "nodes"), [(2, 3), (2, 1), (3, 4), (5, 4)])
def test_the_model_never_clamps_a_group_to_the_island(group: int, nodes: int) -> None:
    training = TrainingSpec.model_validate(
        {
            "seqLenTokens": 512,
            "globalBatchTokens": 4096,
            "sharding": "hsdp",
            "shardGroupNodes": group,
        }
    )
    cm = CostModel(TINY_SPEC, training, PoolSpec(name="p", gpu="h100", nodes=8, gpus_per_node=8))
    with pytest.raises(SpecError) as err:
        cm.gather_seconds(1e6, nodes, 8)
    assert err.value.field == "training.shardGroupNodes"
    assert f"the island's {nodes} node" in err.value.message
    with pytest.raises(SpecError):
        cm.gradient_sync_seconds(1e6, nodes, 8)
    with pytest.raises(SpecError):
        cm.memory(nodes * 8, 1, gpus_per_node=8)
    assert cm.shard_ranks(group * 2, 8) == group * 8  # whole groups: one group's GPUs
