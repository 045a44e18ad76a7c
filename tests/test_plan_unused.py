"""A pool the chosen plan leaves out is explained (issue 37): the best plan that uses it, by
the objective's own rule, and what it lost on — in the text report, the JSON and (through
`shardmeter.plan.unused`) the TrainingPlan status. Agreement with the brute force on small
instances: `test_plan_bruteforce.py`."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from shardmeter.cli.main import main
from shardmeter.plan.result import PlanResult, build_result
from shardmeter.plan.schema import PlanSpec, load_plan
from shardmeter.plan.search import search
from shardmeter.plan.unused import unused_pools

FIXTURES = Path(__file__).parent / "fixtures" / "plans"


def llama70b(**changes: Any) -> PlanSpec:
    spec, _ = load_plan(FIXTURES / "llama70b-h100-a100-wan10g.yaml")
    return PlanSpec.model_validate({**spec.model_dump(), **changes})


@pytest.fixture(scope="module")
def equal_tokens() -> PlanResult:
    return build_result(search(llama70b()))


def test_the_a100_pool_is_explained_by_the_island_that_sets_the_inner_step(
    equal_tokens: PlanResult,
) -> None:
    r = equal_tokens
    assert {g.pool for g in r.chosen.groups} == {"h100"}
    (u,) = unused_pools(r)
    assert u.pool == "a100" and u.exact and u.plan is not None
    assert any(g.pool == "a100" for g in u.plan.groups)
    assert u.lost_on == "throughput"
    # its A100 island, at the same tokens as each H100 island, is the slowest
    slowest = max(u.plan.groups, key=lambda g: g.step_s)
    assert slowest.pool == "a100" and u.plan.step_s > r.chosen.step_s
    assert f"set by its {slowest.label} island" in u.reason
    assert "runtime torchtitan-ft" in u.reason
    assert f"{u.plan.rank_hours:,.1f} h" in u.reason and u.plan.label in u.reason


def test_with_token_weighted_islands_the_a100_pool_loses_on_quality() -> None:
    """Weighted islands run as fast with the A100s (the batch moves to the H100s), but two
    islands need more tokens to reach data-parallel's loss than one."""
    r = build_result(search(llama70b(runtime="weighted")))
    (u,) = unused_pools(r)
    assert u.plan is not None and u.lost_on == "throughput"
    assert u.plan.hours <= r.chosen.hours * 1.001  # as fast on the raw figures …
    f = u.plan.quality.equivalent_token_factor
    assert f > r.chosen.quality.equivalent_token_factor  # … but not to data-parallel's loss
    assert f"need ×{f:.3f} the tokens to reach data-parallel's loss" in u.reason


def test_branch_and_bound_names_the_best_plan_it_found_and_says_so() -> None:
    exact = build_result(search(llama70b()))
    bnb = build_result(search(llama70b(), force_mode="objective"))
    assert bnb.chosen.layout == exact.chosen.layout
    (u,) = unused_pools(bnb)
    assert not u.exact and u.plan is not None and "not proven best" in u.reason
    # it is never better than the exhaustive search's best plan with the pool
    (best,) = unused_pools(exact)
    assert best.plan is not None
    assert u.plan.rank_hours >= best.plan.rank_hours * (1 - 1e-9)


def test_a_pool_left_out_by_allowed_pools_or_memory_says_so() -> None:
    r = build_result(search(llama70b(constraints={"allowedPools": ["h100"]})))
    (u,) = unused_pools(r)
    assert (u.pool, u.plan, u.lost_on) == ("a100", None, "excluded")
    assert "constraints.allowedPools" in u.reason
    small = llama70b(
        pools=[
            *llama70b().model_dump()["pools"],
            {"name": "tiny", "gpu": "l40s", "nodes": 1, "gpusPerNode": 1, "site": "site-a"},
        ]
    )
    tiny = next(u for u in unused_pools(build_result(search(small))) if u.pool == "tiny")
    assert tiny.plan is None and tiny.lost_on == "infeasible"
    assert tiny.reason.startswith("no island of it fits:") and "memory" in tiny.reason


def test_the_text_report_and_the_json_explain_every_unused_pool() -> None:
    path = str(FIXTURES / "llama70b-h100-a100-wan10g.yaml")
    text, data = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(["plan", path]) in (0, None)
    with contextlib.redirect_stdout(data):
        assert main(["plan", path, "--json"]) in (0, None)
    assert "unused pool a100: the best plan with it, " in text.getvalue()
    (u,) = json.loads(data.getvalue())["unused_pools"]
    assert u["pool"] == "a100" and u["lost_on"] == "throughput" and u["best_plan_exact"]
    assert any(g["pool"] == "a100" for g in u["best_plan"]["groups"])
    assert f"unused pool a100: {u['reason']}" in text.getvalue()


def test_an_equally_fast_pool_is_left_out_for_its_price() -> None:
    """Two pools of the same H100 nodes at two sites over a slow WAN, min-time: each alone is
    as fast, the dearer is left out by the canonical order (at equal time, less cost)."""
    pool: dict[str, Any] = {
        "gpu": "h100",
        "nodes": 4,
        "gpusPerNode": 8,
        "wanUplink": {"kind": "wan", "latencyS": 0.05, "bandwidthBytesPerS": "0.05 Gbit/s"},
    }
    spec = PlanSpec.model_validate(
        {
            "model": "llama-3.1-8b",
            "training": {"seqLenTokens": 8192, "globalBatchTokens": 2097152},
            "strategy": {"kind": "streaming-diloco", "maxSyncEvery": 20},
            "pools": [
                {**pool, "name": "east", "site": "east", "pricePerGpuHourUsd": 2.5},
                {**pool, "name": "west", "site": "west", "pricePerGpuHourUsd": 2.0},
            ],
            "objective": {"kind": "min-time"},
        }
    )
    r = build_result(search(spec))
    assert [g.pool for g in r.chosen.groups] == ["west"]
    (u,) = unused_pools(r)
    assert u.pool == "east" and u.lost_on == "tie" and u.plan is not None
    assert u.plan.rank_hours == pytest.approx(r.chosen.rank_hours)
    assert "of equally fast plans the cheaper goes first" in u.reason
