"""The optimizer: same frontier and optimum as brute force; properties users rely on;
infeasible requests name the binding constraint."""

from __future__ import annotations

import random

import pytest

from brute_force import brute_force, frontier
from shardmeter.errors import InfeasibleError
from shardmeter.plan.result import build_result
from shardmeter.plan.schema import PlanSpec
from shardmeter.plan.search import search

TINY = {
    "name": "tiny",
    "hiddenSize": 512,
    "numLayers": 4,
    "numAttentionHeads": 8,
    "numKeyValueHeads": 4,
    "intermediateSize": 1536,
    "vocabSize": 8000,
}
GPUS = [("a100", 1.19), ("h100", 2.49), ("h200", 3.59), ("l40s", 0.86)]


def random_spec(
    seed: int, strategy: str = "streaming-diloco", objective: dict | None = None
) -> PlanSpec:
    rnd = random.Random(seed)
    pools = []
    for i in range(rnd.choice([2, 3])):
        gpu, price = rnd.choice(GPUS)
        pools.append(
            {
                "name": f"p{i}",
                "gpu": gpu,
                "nodes": rnd.randint(1, 4),
                "gpusPerNode": rnd.choice([2, 4]),
                "site": rnd.choice(["a", "b"]),
                "wanUplink": rnd.choice(["wan-10g-30ms", "wan-1g-80ms"]),
                "pricePerGpuHourUsd": round(price * rnd.uniform(0.8, 1.2), 3),
            }
        )
    seq = 512
    return PlanSpec.model_validate(
        {
            "model": TINY,
            "training": {
                "seqLenTokens": seq,
                "globalBatchTokens": seq * rnd.choice([8, 12, 16, 24]),
                "totalTokens": 10**9,
            },
            "strategy": {"kind": strategy, "outerPrecision": rnd.choice(["bf16", "fp32"])},
            "pools": pools,
            "constraints": {
                "maxIslands": rnd.choice([2, 3, 4]),
                "globalBatchTolerance": rnd.choice([0.0, 0.1]),
            },
            "objective": objective or {"kind": "min-time"},
        }
    )


def same(a: list, b: list) -> None:
    assert [r.label for r in a] == [r.label for r in b]
    for x, y in zip(a, b, strict=True):
        assert x.time_s == pytest.approx(y.time_s, rel=1e-9) and x.cost_usd == pytest.approx(
            y.cost_usd, rel=1e-9
        )


OBJECTIVES = [
    {"kind": "min-time"},
    {"kind": "min-cost"},
    {"kind": "throughput-fraction", "throughputFraction": 0.9},
]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("strategy", ["streaming-diloco", "diloco", "fsdp"])
def test_frontier_and_optimum_match_brute_force(seed: int, strategy: str) -> None:
    spec = random_spec(seed, strategy)
    ref = brute_force(spec)
    if not ref:
        with pytest.raises(InfeasibleError):
            search(spec)
        return
    want = frontier(ref)
    for mode in ("exhaustive", "frontier"):
        result = build_result(search(spec, force_mode=mode))
        got = [
            type("R", (), {"label": p.label, "time_s": p.hours * 3600, "cost_usd": p.cost_usd})
            for p in result.frontier
        ]
        same(got, want)
    for obj in OBJECTIVES:
        s = spec.model_copy(
            update={
                "objective": PlanSpec.model_validate(
                    {**spec.model_dump(), "objective": obj}
                ).objective
            }
        )
        if obj["kind"] == "min-time":
            best = want[0]
        elif obj["kind"] == "min-cost":
            best = want[-1]
        else:
            floor = obj["throughputFraction"] * (1 / want[0].time_s) * (1 - 1e-12)
            best = [r for r in want if 1 / r.time_s >= floor][-1]
        for mode in ("exhaustive", "objective"):
            chosen = build_result(search(s, force_mode=mode)).chosen
            assert chosen.label == best.label, (mode, obj)
            assert chosen.hours * 3600 == pytest.approx(best.time_s, rel=1e-9)


def plan(spec: PlanSpec) -> object:
    return build_result(search(spec)).chosen


def test_more_budget_never_yields_a_slower_plan() -> None:
    spec = random_spec(11)
    cheapest = build_result(
        search(
            spec.model_copy(
                update={
                    "objective": PlanSpec.model_validate(
                        {**spec.model_dump(), "objective": {"kind": "min-cost"}}
                    ).objective
                }
            )
        )
    ).chosen.cost_usd
    hours = []
    for factor in (1.0, 1.05, 1.2, 1.5, 3.0):
        s = PlanSpec.model_validate(
            {
                **spec.model_dump(),
                "objective": {"kind": "cost-budget", "costBudgetUsd": cheapest * factor},
            }
        )
        hours.append(build_result(search(s)).chosen.hours)
    assert hours == sorted(hours, reverse=True)


@pytest.mark.parametrize("kind", ["min-time", "min-cost"])
def test_removing_a_pool_never_yields_a_better_plan(kind: str) -> None:
    for seed in range(4):
        spec = PlanSpec.model_validate(
            {**random_spec(seed).model_dump(), "objective": {"kind": kind}}
        )
        full = build_result(search(spec)).chosen
        for name in [p.name for p in spec.pools]:
            rest = [p.name for p in spec.pools if p.name != name]
            sub = PlanSpec.model_validate(
                {
                    **spec.model_dump(),
                    "constraints": {**spec.constraints.model_dump(), "allowedPools": rest},
                }
            )
            try:
                chosen = build_result(search(sub)).chosen
            except InfeasibleError:
                continue
            if kind == "min-time":
                assert chosen.hours >= full.hours * (1 - 1e-12)
            else:
                assert chosen.cost_usd >= full.cost_usd * (1 - 1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_every_frontier_plan_satisfies_every_constraint(seed: int) -> None:
    spec = random_spec(seed)
    try:
        result = build_result(search(spec))
    except InfeasibleError:
        return
    pools = {p.name: p for p in spec.pools}
    b = spec.training.global_batch_tokens
    for p in result.frontier:
        assert 1 <= p.islands <= spec.constraints.max_islands
        assert (
            b <= p.global_batch_tokens <= b * (1 + spec.constraints.global_batch_tolerance) + 1e-6
        )
        assert sum(g.count * g.local_batch_tokens for g in p.groups) == p.global_batch_tokens
        for g in p.groups:
            pool = pools[g.pool]
            assert g.count * g.nodes <= pool.nodes and pool.gpus_per_node % g.gpus_per_node == 0
            assert g.step_s <= p.step_s + 1e-12
        assert (
            p.sync_every % p.fragments == 0 and p.fragment_sync_delay < p.sync_every // p.fragments
        )


def test_infeasible_memory_names_the_binding_constraint() -> None:
    spec = PlanSpec.model_validate(
        {
            "model": "llama-3.1-70b",
            "training": {"seqLenTokens": 4096, "globalBatchTokens": 4096 * 64},
            "pools": [{"name": "a", "gpu": "h200", "nodes": 4, "gpusPerNode": 8}],
            "constraints": {"maxGpusPerIsland": 2},
        }
    )
    with pytest.raises(
        InfeasibleError,
        match=r"Llama-3.1-70B needs ≥ \d+ H200-141GB-SXM per island for memory; "
        r"maxGpusPerIsland is 2",
    ):
        search(spec)


def test_infeasible_budget_names_the_objective_field() -> None:
    spec = PlanSpec.model_validate(
        {
            **random_spec(1).model_dump(),
            "objective": {"kind": "time-budget", "timeBudgetHours": 1e-6},
        }
    )
    with pytest.raises(InfeasibleError, match=r"raise objective\.timeBudgetHours"):
        search(spec)
