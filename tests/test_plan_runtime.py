"""The runtime a plan targets: torchtitan + torchft averages pseudo-gradients unweighted, so
its islands must process equal batches; the paper's weighted apportioning may differ."""

from __future__ import annotations

from pathlib import Path

from shardmeter.plan.result import build_result, summarise
from shardmeter.plan.schema import PlanSpec, Runtime, load_plan
from shardmeter.plan.search import search

REPO = Path(__file__).resolve().parents[1]


def case_study(runtime: str) -> PlanSpec:
    spec, _ = load_plan(REPO / "examples" / "case-study.yaml")
    return spec.model_copy(update={"runtime": Runtime(runtime)})


def test_torchtitan_ft_is_the_default() -> None:
    spec = PlanSpec.model_validate(
        {
            "model": "llama-3.2-1b",
            "training": {"seqLenTokens": 4096, "globalBatchTokens": 4096 * 64},
            "pools": [{"name": "a", "gpu": "h100", "nodes": 2, "gpusPerNode": 8}],
        }
    )
    assert spec.runtime is Runtime.TORCHTITAN_FT


def test_torchtitan_ft_plans_give_every_island_the_same_batch() -> None:
    result = build_result(search(case_study("torchtitan-ft")))
    assert result.runtime is Runtime.TORCHTITAN_FT
    for plan in result.frontier:
        assert plan.runtime == "torchtitan-ft"
        assert len({g.local_batch_tokens for g in plan.groups}) == 1, plan.label
        assert plan.islands * plan.groups[0].local_batch_tokens == plan.global_batch_tokens


def test_weighted_case_study_splits_the_batch_unequally_and_is_faster() -> None:
    weighted = build_result(search(case_study("weighted"))).chosen
    equal = build_result(search(case_study("torchtitan-ft"))).fastest
    assert len({g.local_batch_tokens for g in weighted.groups}) > 1
    # the weighted runtime can only be at least as fast: equal batches are one of its options
    assert weighted.tokens_per_s >= equal.tokens_per_s * (1 - 1e-12)


def test_islands_may_differ_in_micro_batch_and_accumulation_under_torchtitan_ft() -> None:
    """Equal tokens per island, reached with different GPUs, micro-batches or accumulations."""
    spec = PlanSpec.model_validate(
        {
            "model": "llama-3.2-1b",
            "training": {"seqLenTokens": 4096, "globalBatchTokens": 4096 * 48},
            "pools": [
                {"name": "a", "gpu": "h100", "nodes": 1, "gpusPerNode": 8, "site": "x"},
                {"name": "b", "gpu": "a100", "nodes": 1, "gpusPerNode": 4, "site": "x"},
            ],
            "constraints": {"maxIslands": 2, "globalBatchTolerance": 0.0},
            "objective": {"kind": "min-time"},
        }
    )
    out = search(spec)
    plans = [summarise(out, out.evaluated, i) for i in range(len(out.evaluated))]
    mixed = [p for p in plans if len(p.groups) == 2]
    assert mixed, "two-pool plans are scored"
    for p in mixed:
        a, b = p.groups
        assert a.local_batch_tokens == b.local_batch_tokens
        sequences = [g.micro_batch * g.accumulation * g.nodes * g.gpus_per_node for g in (a, b)]
        assert sequences[0] == sequences[1] == a.local_batch_tokens // 4096
    assert any(
        (a.micro_batch, a.accumulation) != (b.micro_batch, b.accumulation)
        for a, b in (p.groups for p in mixed)
    )


def test_the_operator_plans_with_the_trainingplans_runtime() -> None:
    import yaml

    from shardmeter_operator.api import GPUPoolSpec, TrainingPlanSpec
    from shardmeter_operator.trainingplan.model import plan_request

    raw = yaml.safe_load((REPO / "examples" / "trainingplan.yaml").read_text())["spec"]
    pools = {
        name: GPUPoolSpec.model_validate(
            yaml.safe_load((REPO / "examples" / f"gpupool-{name}.yaml").read_text())["spec"]
        )
        for name in ("cluster-a", "cluster-b")
    }
    assert (
        plan_request(TrainingPlanSpec.model_validate(raw), pools).runtime is Runtime.TORCHTITAN_FT
    )
    weighted = TrainingPlanSpec.model_validate({**raw, "runtime": "weighted"})
    assert plan_request(weighted, pools).runtime is Runtime.WEIGHTED
