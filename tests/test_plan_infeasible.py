"""Requests with no plan name the binding constraint, with its numbers — and requests that
do have a plan (an exact fit such as 6 + 4 = 10 sequences) are never declared infeasible."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from shardmeter.errors import InfeasibleError
from shardmeter.plan.result import build_result
from shardmeter.plan.schema import PlanSpec
from shardmeter.plan.search import search

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


def request(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": TINY,
        "training": {"seqLenTokens": 512, "globalBatchTokens": 512 * 10},
        "pools": [
            {"name": "six", "gpu": "h100", "nodes": 1, "gpusPerNode": 6, "site": "x"},
            {"name": "four", "gpu": "a100", "nodes": 1, "gpusPerNode": 4, "site": "x"},
        ],
        "constraints": {"maxIslands": 2, "minGpusPerIsland": 4, "globalBatchTolerance": 0.0},
        "objective": {"kind": "min-time"},
    }
    base.update(overrides)
    return base


def test_an_exact_fit_of_six_and_four_sequences_is_found() -> None:
    """10 sequences from a 6-GPU and a 4-GPU island (one sequence per GPU fits the batch
    exactly); a greedy trim of pool capacity in pool order declared this infeasible."""
    chosen = build_result(search(PlanSpec.model_validate(request(runtime="weighted")))).chosen
    assert sorted(
        g.micro_batch * g.accumulation * g.nodes * g.gpus_per_node for g in chosen.groups
    ) == [4, 6]
    assert chosen.global_batch_tokens == 512 * 10


def test_equal_batches_name_the_granularity_and_the_weighted_runtime() -> None:
    with pytest.raises(InfeasibleError) as err:
        search(PlanSpec.model_validate(request(runtime="torchtitan-ft")))
    msg = str(err.value)
    assert "batch granularity" in msg
    assert "needs exactly 10 sequences per inner step" in msg
    assert "can process 8 at the closest with equal batches per island" in msg
    assert "runtime: weighted" in msg and "constraints.globalBatchTolerance" in msg


def test_no_allowed_pool_is_named() -> None:
    raw = request(constraints={"allowedPools": []})
    with pytest.raises(ValidationError, match=r"constraints\.allowedPools is empty, so no pool"):
        PlanSpec.model_validate(raw)


def test_more_fragments_than_blocks_is_named(tmp_path: Path) -> None:
    raw = {
        **yaml.safe_load((REPO / "examples" / "case-study.yaml").read_text()),
        "strategy": {"kind": "streaming-diloco", "fragments": 33},
    }
    f = tmp_path / "frag.yaml"
    f.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, "-m", "shardmeter.cli.main", "plan", str(f), "--no-files"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "strategy.fragments 33 > the model's 32 blocks" in result.stderr


def test_a_missing_wan_uplink_is_named() -> None:
    raw = request(
        runtime="weighted",
        pools=[
            {
                "name": "six",
                "gpu": "h100",
                "nodes": 1,
                "gpusPerNode": 6,
                "site": "x",
                "wanUplink": "wan-10g-30ms",
            },
            {"name": "four", "gpu": "a100", "nodes": 1, "gpusPerNode": 4, "site": "y"},
        ],
    )
    with pytest.raises(InfeasibleError, match=r"pool\(s\) 'four' have no wanUplink"):
        search(PlanSpec.model_validate(raw))


def test_island_limit_is_named_with_the_numbers() -> None:
    raw = request(constraints={"maxIslands": 1, "minGpusPerIsland": 4, "globalBatchTolerance": 0.0})
    with pytest.raises(InfeasibleError) as err:
        search(PlanSpec.model_validate({**raw, "runtime": "weighted"}))
    msg = str(err.value)
    assert "within ≤ 1 island(s)" in msg and "constraints.maxIslands (1)" in msg


def test_pinned_fragments_with_auto_sync_every_are_planned() -> None:
    """``fragments: 3`` with ``syncEvery: auto``: none of the round candidates (10, 20, 50, …)
    is a multiple of 3, and a one-pool request was reported as "batch granularity"; auto now
    picks among multiples of 3 (torchft's syncEvery % fragments == 0)."""
    raw = request(
        runtime="weighted",
        pools=[{"name": "six", "gpu": "h100", "nodes": 1, "gpusPerNode": 6, "site": "x"}],
        strategy={"kind": "streaming-diloco", "fragments": 3},
        constraints={"maxIslands": 2, "globalBatchTolerance": 0.5},
    )
    result = build_result(search(PlanSpec.model_validate(raw)))
    for plan in result.frontier:
        assert plan.fragments == 3 and plan.sync_every % 3 == 0
        assert plan.sync_every <= 500


@pytest.mark.parametrize(
    ("strategy", "field", "expected"),
    [
        (
            {"fragments": 4, "maxSyncEvery": 3},
            "strategy.fragments",
            [
                "strategy.fragments: 4 divides none of the syncEvery values auto may pick (3; "
                "maxSyncEvery 3): torchft needs syncEvery % fragments == 0",
                "raise strategy.maxSyncEvery to at least 4, set strategy.syncEvery to a "
                "multiple of 4, or set strategy.fragments to at most 3 or auto",
            ],
        ),
        (
            {"fragments": 3, "fragmentSyncDelay": 5, "maxSyncEvery": 17},
            "strategy.fragmentSyncDelay",
            [
                "strategy.fragmentSyncDelay: 5 needs syncEvery > 5 × 3 fragment(s), but auto "
                "picks at most 17 (maxSyncEvery)",
                "torchft needs fragmentSyncDelay < syncEvery / fragments",
                "raise strategy.maxSyncEvery",
            ],
        ),
    ],
)
def test_settings_torchft_rejects_name_its_rule_not_the_batch(
    strategy: dict[str, Any], field: str, expected: list[str]
) -> None:
    """Where no auto syncEvery can satisfy torchft's rule with the pinned values, whatever the
    islands, the planner says so (one pool and two alike) instead of "batch granularity"."""
    for pools in (request()["pools"][:1], request()["pools"]):
        raw = request(
            runtime="weighted", pools=pools, strategy={"kind": "streaming-diloco", **strategy}
        )
        with pytest.raises(InfeasibleError) as err:
            search(PlanSpec.model_validate(raw))
        msg = str(err.value)
        assert msg.startswith("no feasible plan: ") and err.value.constraint == field
        assert "batch granularity" not in msg
        for text in expected:
            assert text in msg, msg
