"""The optimizer against an independent brute force (`brute_force.py`): on random small
instances the Pareto frontier is the same, plan for plan, with the same figures — time, cost
(whole nodes and WAN egress included), energy, CO₂e and the quality factor — and every
objective (min-energy, min-co2, a CO₂ budget, quality-adjusted or not) picks the same plan."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brute_force import Ref, brute_force, canonical, frontier
from shardmeter.errors import InfeasibleError
from shardmeter.plan.result import PlanSummary, build_result, summarise
from shardmeter.plan.schema import PlanSpec
from shardmeter.plan.search import search
from shardmeter.plan.unused import unused_pools
from strategies import random_spec, tiny_plans

REL = 1e-6
STATS = {"instances": 0, "feasible": 0, "seconds": 0.0}


def layout(p: PlanSummary) -> tuple[tuple[str, int, int, int], ...]:
    order = {g.pool: i for i, g in enumerate(p.groups)}
    return tuple(sorted(p.layout, key=lambda x: order[x[0]]))


def assert_same_frontier(got: list[PlanSummary], want: list[Ref], seq_len: int) -> None:
    assert [layout(p) for p in got] == [r.layout for r in want]
    for p, r in zip(got, want, strict=True):
        assert p.hours * 3600 == pytest.approx(r.time_s, rel=REL)
        assert p.cost_usd == pytest.approx(r.cost_usd, rel=REL)
        assert p.step_s == pytest.approx(r.step_s, rel=REL)
        assert p.global_batch_tokens == r.sequences * seq_len
        assert p.energy_kwh == pytest.approx(r.energy_kwh, rel=REL)
        assert p.co2_kg == pytest.approx(r.co2_kg, rel=REL, abs=1e-12)
        assert p.egress_usd == pytest.approx(r.egress_usd, rel=REL, abs=1e-12)
        assert p.quality.equivalent_token_factor == pytest.approx(r.factor, rel=REL)


def assert_every_layout(result: Any, refs: list[Ref]) -> None:
    """Every layout the brute force finds is scored the same — or, where the optimizer left
    out a shape because the same GPUs on fewer nodes are never slower, that layout with
    fewer nodes is at least as fast and as cheap."""
    out = result.output
    got = {}
    for i in range(len(out.evaluated)):
        p = summarise(out, out.evaluated, i)
        got[layout(p)] = p
    for r in refs:
        p = got.get(r.layout)
        if p is not None:
            assert p.hours * 3600 == pytest.approx(r.time_s, rel=REL), r.layout
            assert p.cost_usd == pytest.approx(r.cost_usd, rel=REL), r.layout
            assert p.energy_kwh == pytest.approx(r.energy_kwh, rel=REL), r.layout
            continue
        gpus = [(pool, k, n * g) for pool, k, n, g in r.layout]
        better = [
            q
            for key, q in got.items()
            if [(pool, k, n * g) for pool, k, n, g in key] == gpus
            and all(a[2] <= b[2] for a, b in zip(key, r.layout, strict=True))
        ]
        assert better, f"layout {r.layout} missing"
        assert min(q.rank_hours for q in better) * 3600 <= r.rank_time_s * (1 + REL)
    assert len(got) <= len(refs)


def check(raw: dict[str, Any], mode: str | None = None, refs: list[Ref] | None = None) -> None:
    spec = PlanSpec.model_validate(raw)
    refs = brute_force(spec) if refs is None else refs
    want = frontier(refs)
    if not want:
        with pytest.raises(InfeasibleError):
            search(spec, force_mode=mode)
        return
    result = build_result(search(spec, force_mode=mode))
    assert_same_frontier(result.frontier, want, spec.training.seq_len_tokens)
    if result.output.stats.mode == "exhaustive":
        assert_every_layout(result, refs)
    STATS["feasible"] += 1


@pytest.mark.slow
@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(tiny_plans())
def test_frontier_matches_brute_force(raw: dict[str, Any]) -> None:
    started = time.perf_counter()
    check(raw)
    STATS["instances"] += 1
    STATS["seconds"] += time.perf_counter() - started


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(tiny_plans())
def test_branch_and_bound_frontier_matches_brute_force(raw: dict[str, Any]) -> None:
    check(raw, mode="frontier")


def expected_choice(want: list[Ref], objective: dict[str, Any], every: list[Ref]) -> Ref:
    """The objective's plan from the brute force's frontier (``want``) or, for min-energy and
    min-co2, from every layout (``every``): ties in canonical order."""
    kind = objective["kind"]
    if kind == "min-time":
        return want[0]
    if kind == "min-cost":
        return want[-1]
    if kind in ("min-energy", "min-co2"):
        ordered = canonical(every)
        key = (lambda r: r.rank_energy_kwh) if kind == "min-energy" else (lambda r: r.rank_co2_kg)
        least = min(key(r) for r in ordered)
        return next(r for r in ordered if key(r) == least)
    if kind == "cost-budget":
        return next(r for r in want if r.rank_cost_usd <= objective["costBudgetUsd"])
    if kind == "time-budget":
        return [r for r in want if r.rank_time_s <= objective["timeBudgetHours"] * 3600][-1]
    floor = objective["throughputFraction"] * (1 / want[0].rank_time_s) * (1 - 1e-12)
    return [r for r in want if 1 / r.rank_time_s >= floor][-1]


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(
    tiny_plans(),
    st.sampled_from(
        [
            {"kind": "min-time"},
            {"kind": "min-cost"},
            {"kind": "throughput-fraction", "throughputFraction": 0.9},
            {"kind": "throughput-fraction", "throughputFraction": 0.5},
            {"kind": "cost-budget", "costBudgetUsd": 1.0},
            {"kind": "time-budget", "timeBudgetHours": 1.0},
            {"kind": "min-energy"},
            {"kind": "min-co2"},
            {"kind": "min-cost", "qualityAdjusted": False},
            {"kind": "throughput-fraction", "throughputFraction": 0.9, "qualityAdjusted": False},
        ]
    ),
)
def test_branch_and_bound_objective_matches_brute_force(
    raw: dict[str, Any], objective: dict[str, Any]
) -> None:
    objective = {**raw["objective"], **objective}
    spec = PlanSpec.model_validate({**raw, "objective": objective})
    every = brute_force(spec)
    want = frontier(every)
    if not want:
        return
    if objective["kind"] in ("cost-budget", "time-budget"):
        # a budget between two frontier plans (or at the cheapest/fastest end)
        mid = want[len(want) // 2]
        budget = (
            {"costBudgetUsd": mid.rank_cost_usd * 1.0001}
            if objective["kind"] == "cost-budget"
            else {"timeBudgetHours": mid.rank_time_s * 1.0001 / 3600}
        )
        objective = {**objective, **budget}
        spec = PlanSpec.model_validate({**raw, "objective": objective})
    out = search(spec, force_mode="objective")
    assert out.stats.proven
    chosen = build_result(out).chosen
    best = expected_choice(want, objective, every)
    assert layout(chosen) == best.layout
    assert chosen.hours * 3600 == pytest.approx(best.time_s, rel=REL)
    assert chosen.cost_usd == pytest.approx(best.cost_usd, rel=REL)
    assert chosen.energy_kwh == pytest.approx(best.energy_kwh, rel=REL)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    tiny_plans(),
    st.sampled_from(
        [
            {"kind": "min-time"},
            {"kind": "min-cost"},
            {"kind": "throughput-fraction", "throughputFraction": 0.9},
        ]
    ),
)
def test_an_unused_pools_best_plan_matches_brute_force(
    raw: dict[str, Any], objective: dict[str, Any]
) -> None:
    """Each pool the chosen plan leaves out is explained with the plan the objective would
    pick among the brute force's plans that use it (or none, when none does)."""
    objective = {**raw["objective"], **objective}
    spec = PlanSpec.model_validate({**raw, "objective": objective})
    every = brute_force(spec)
    if not every:
        return
    result = build_result(search(spec, force_mode="exhaustive"))
    fastest = min(r.rank_time_s for r in every)
    for u in unused_pools(result):
        mine = [r for r in every if any(g[0] == u.pool for g in r.layout)]
        if not mine:
            assert u.plan is None and u.lost_on in ("infeasible", "excluded"), u
            continue
        assert u.plan is not None and u.exact, u
        got_time, got_cost = u.plan.rank_hours * 3600, u.plan.rank_cost_usd
        if objective["kind"] == "min-time":
            assert got_time == pytest.approx(min(r.rank_time_s for r in mine), rel=REL)
            continue
        if objective["kind"] == "throughput-fraction":
            cap = fastest / 0.9 * (1 + 1e-12)
            within = [r for r in mine if r.rank_time_s <= cap]
            if not within:
                assert u.lost_on == "throughput"
                assert got_time == pytest.approx(min(r.rank_time_s for r in mine), rel=REL)
                continue
            mine = within
        assert got_cost == pytest.approx(min(r.rank_cost_usd for r in mine), rel=REL)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(tiny_plans(), st.sampled_from(["time-budget", "cost-budget"]))
def test_a_refused_budget_names_the_brute_forces_fastest_or_cheapest_plan(
    raw: dict[str, Any], kind: str
) -> None:
    """A budget below every plan is refused naming the plan the brute force finds fastest
    (time budget) or cheapest (cost budget), by branch and bound as exhaustively."""
    refs = brute_force(PlanSpec.model_validate(raw))
    want = frontier(refs)
    if not want:
        return
    if kind == "time-budget":
        budget = {"timeBudgetHours": want[0].rank_time_s * 0.99 / 3600}
        figure = f"takes {want[0].rank_time_s / 3600:,.4g} h"
    else:
        budget = {"costBudgetUsd": want[-1].rank_cost_usd * 0.99}
        figure = f"costs ${want[-1].rank_cost_usd:,.0f}"
    spec = PlanSpec.model_validate(
        {**raw, "objective": {**raw["objective"], "kind": kind, **budget}}
    )
    for mode in ("exhaustive", "objective"):
        with pytest.raises(InfeasibleError) as refused:
            search(spec, force_mode=mode)
        assert figure in str(refused.value), (mode, str(refused.value))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(tiny_plans())
def test_the_least_factor_branch_and_bound_prunes_with_holds_for_every_plan(
    raw: dict[str, Any],
) -> None:
    """Branch and bound bounds a subtree's ranked figures with the least equivalent-token
    factor of its island count at its least inner step (`QualityTable.least_factor`: each
    syncEvery's least fragmentSyncDelay — at least one overlapped step for Streaming DiLoCo
    once the step hides the outer all_reduce); no plan of the brute force, whose settings the
    scalar rule picks, has a smaller factor."""
    spec = PlanSpec.model_validate(raw)
    every = [r for r in brute_force(spec) if r.islands >= 2]
    if not every:
        return
    out = search(spec, force_mode="exhaustive")
    quality = out.evaluator.quality
    for r in every:
        least = float(quality.least_factor(np.array([r.islands]), r.step_s)[0])
        assert r.factor >= least * (1 - 1e-12), (r.layout, r.step_s, quality.hidden_above_s)
    # the settings behind it (`OuterModel.delay_floors`): each H's least τ, and every plan
    # whose inner step exceeds hidden_above_s hides its all_reduce
    floors, ev = quality.floors, out.evaluated
    for i in np.flatnonzero(ev.islands >= 2):
        h, tau = int(ev.sync_every[i]), int(ev.fragment_sync_delay[i])
        assert tau >= floors.any_plan[h]
        if ev.step_s[i] > floors.hidden_above_s:
            assert ev.zero_blocking[i], (i, ev.step_s[i], floors)
        if ev.zero_blocking[i]:
            assert tau >= floors.hidden[h]


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(tiny_plans())
def test_a_co2_budget_matches_brute_force(raw: dict[str, Any]) -> None:
    """A budget between the least and the most CO₂e of the plans: the same plans survive it
    and the objective picks the same one (or both say there is none)."""
    every = brute_force(PlanSpec.model_validate(raw))
    if not every:
        return
    co2 = sorted(r.rank_co2_kg for r in every)
    budget = co2[len(co2) // 2] * 1.0000001 if co2[len(co2) // 2] > 0 else 1.0
    objective = {**raw["objective"], "co2BudgetKg": budget}
    spec = PlanSpec.model_validate({**raw, "objective": objective})
    refs = brute_force(spec)
    assert all(r.rank_co2_kg <= budget * (1 + 1e-12) for r in refs)
    for mode in ("exhaustive", "objective"):
        if not refs:
            with pytest.raises(InfeasibleError, match=r"co2BudgetKg"):
                search(spec, force_mode=mode)
            continue
        chosen = build_result(search(spec, force_mode=mode)).chosen
        assert layout(chosen) == expected_choice(frontier(refs), objective, refs).layout


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("runtime", ["torchtitan-ft", "weighted"])
@pytest.mark.parametrize("strategy", ["streaming-diloco", "diloco", "fsdp"])
def test_medium_instances_match_brute_force(seed: int, runtime: str, strategy: str) -> None:
    """Larger instances (up to 3 pools × 4 nodes × 4 GPUs, batches of 8–24 sequences) in
    every search mode."""
    spec = random_spec(seed, strategy, runtime=runtime)
    raw = spec.model_dump(by_alias=True)
    every = brute_force(spec)
    for mode in ("exhaustive", "frontier"):
        check(raw, mode, every)
    refs = frontier(every)
    for objective in (
        {"kind": "min-cost"},
        {"kind": "throughput-fraction", "throughputFraction": 0.9},
    ):
        if not refs:
            continue
        s = PlanSpec.model_validate({**raw, "objective": objective})
        chosen = build_result(search(s, force_mode="objective")).chosen
        assert layout(chosen) == expected_choice(refs, objective, every).layout
