"""Convergence guard-rails: auto never picks a syncEvery or fragmentSyncDelay beyond
``maxSyncEvery`` / ``maxFragmentSyncDelay``; when blocking cannot be hidden within them the
plan says so (blocking > 0, the reason names the guard-rails) — which is what the operator's
OuterStepBlocking alert fires on. The optimizer's vectorised rule equals the scalar one."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmeter.errors import SpecError
from shardmeter.plan.options import PoolContext
from shardmeter.plan.overhead import OuterModel
from shardmeter.plan.result import build_result
from shardmeter.plan.schema import PlanSpec, load_plan
from shardmeter.plan.search import build_space, search
from shardmeter.sim.outer import IslandPlacement, outer_link
from shardmeter.sim.scenario import fragment_all_reduce_seconds, outer_step_seconds_by_fragments
from shardmeter.sim.settings import (
    GuardRails,
    choose_sync_every,
    search_settings,
    sync_every_candidates,
)
from shardmeter.spec.hardware import LINK_PRESETS

REPO = Path(__file__).resolve().parents[1]


def slow_wan_case_study(**strategy: object) -> PlanSpec:
    spec, _ = load_plan(REPO / "examples" / "case-study.yaml")
    raw = spec.model_dump(by_alias=True)
    for pool in raw["pools"]:
        pool["wanUplink"] = LINK_PRESETS["wan-1g-80ms"].model_dump(by_alias=True)
    raw["strategy"].update(strategy)
    raw["objective"] = {"kind": "min-time"}
    return PlanSpec.model_validate(raw)


def test_auto_settings_stay_within_the_default_guard_rails_over_a_slow_wan() -> None:
    result = build_result(search(slow_wan_case_study()))
    for p in result.frontier:
        assert p.sync_every <= 500 and p.fragment_sync_delay <= 5
        assert p.sync_every % p.fragments == 0
        assert p.fragment_sync_delay < p.sync_every // p.fragments


def test_blocking_that_cannot_be_hidden_is_reported_with_the_guard_rails() -> None:
    spec = slow_wan_case_study(maxSyncEvery=100)
    result = build_result(search(spec))
    c = result.chosen
    assert len({g.pool for g in c.groups}) == 2, "the fastest plan spans both sites"
    assert c.sync_every <= 100 and c.fragment_sync_delay <= 5
    assert c.blocking_s_per_outer_step > 0 and not c.zero_blocking
    d = result.detail
    assert d.diloco is not None and d.diloco.blocking_s_per_outer_step > 0
    assert d.bottleneck == "outer-step-bound"
    assert "maxSyncEvery 100, maxFragmentSyncDelay 5" in d.settings_reason
    # the embedding's fragment alone needs more than 5 inner steps over 1 Gbit/s: the report
    # names the delay that would hide it instead of choosing it
    assert re.search(r"fragmentSyncDelay (\d+) would at syncEvery 100", d.settings_reason)


def test_the_operator_publishes_the_blocking_its_alert_fires_on() -> None:
    from shardmeter_operator.trainingplan.model import plan_outcome

    spec = slow_wan_case_study(maxSyncEvery=100)
    outcome = plan_outcome("slow", spec, {})
    assert outcome.predictions.outer_step_blocking_seconds > 0
    assert outcome.settings is not None and outcome.settings.sync_every <= 100


def test_scalar_rule_never_exceeds_the_guard_rails() -> None:
    # full model 3 s of all_reduce per inner step of 0.1 s: hiding it needs τ ≥ 30 with one
    # fragment; within τ ≤ 5 it needs ≥ 6 fragments with a window H/F > τ: not at H = 10 or
    # 20 (F = 10 needs τ = 3 but the window is 1 or 2); at H = 50, F = 10 and τ = 3
    def ar(f: int) -> list[float]:
        return [3.0 / f] * f

    c = choose_sync_every(0.1, ar, 32, max_sync_every=500, max_fragment_sync_delay=5)
    assert c.zero_blocking and c.fragment_sync_delay <= 5 and c.sync_every <= 500
    assert (c.sync_every, c.fragments, c.fragment_sync_delay) == (50, 10, 3)
    blocked = choose_sync_every(
        0.1, ar, 32, max_sync_every=20, max_fragment_sync_delay=2, outer_step_s=0.5
    )
    assert (
        not blocked.zero_blocking and blocked.sync_every <= 20 and blocked.fragment_sync_delay <= 2
    )
    # the hint keeps τ ≤ 2: 3 s / F ≤ 0.2 s needs F ≥ 15 and a window H/F > 2: F = 20 at H = 100
    assert blocked.sync_every_for_zero_blocking == 100
    assert "syncEvery ≥ 100 would allow zero blocking with fragmentSyncDelay ≤ 2" in blocked.reason
    fixed = search_settings(20, 0.1, ar, 32, max_fragment_sync_delay=2)
    assert fixed.fragment_sync_delay <= 2


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    st.lists(st.floats(0.0, 50.0), min_size=1, max_size=8),
    st.floats(0.01, 5.0),
    st.floats(0.0, 2.0),
    st.sampled_from([10, 20, 50, 100, 500]),
    st.integers(0, 6),
)
def test_effective_step_never_falls_when_the_inner_step_grows(
    weights: list[float], step_s: float, outer_s: float, max_h: int, max_fragment_sync_delay: int
) -> None:
    """What makes minimising the inner step exact: T + (blocking + outer step)/H is
    non-decreasing in T under the settings rule."""

    def ar(f: int) -> list[float]:
        total = sum(weights)
        return [total / f] * f

    def effective(t: float) -> float:
        c = choose_sync_every(
            t,
            ar,
            8,
            max_sync_every=max_h,
            max_fragment_sync_delay=max_fragment_sync_delay,
            outer_step_s=outer_s,
        )
        return t + (c.blocking_s_per_outer_step + outer_s) / c.sync_every

    values = [effective(step_s * (1 + 0.07 * i)) for i in range(12)]
    assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(values))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    st.lists(st.floats(0.0, 50.0), min_size=1, max_size=16),
    st.floats(0.01, 5.0),
    st.floats(0.0, 2.0),
    st.floats(0.0, 0.5),
    st.sampled_from([10, 20, 50, 100, 500]),
    st.integers(0, 6),
    st.sampled_from([None, 1.0, 3.0]),
)
def test_per_fragment_outer_steps_let_the_effective_step_fall_only_by_their_spread(
    weights: list[float],
    step_s: float,
    outer_s: float,
    per_call_s: float,
    max_h: int,
    max_fragment_sync_delay: int,
    layers_per_fragment: float | None,
) -> None:
    """With one outer optimizer call per fragment (outer(F) = base + F × per call) a longer
    inner step may let the rule move to fewer fragments: T + (blocking + outer(F))/H then
    falls, but by at most (outer(F) − outer(F'))/H at the shorter step's H (the bound the
    settings module states)."""
    layers = len(weights)
    target = None if layers_per_fragment is None else layers / layers_per_fragment

    def ar(f: int) -> list[float]:
        return [sum(weights) / f] * f

    def outer(f: int) -> float:
        return outer_s + per_call_s * f

    def effective(t: float) -> tuple[float, int, int]:
        c = choose_sync_every(
            t,
            ar,
            layers,
            max_sync_every=max_h,
            max_fragment_sync_delay=max_fragment_sync_delay,
            outer_step_s=outer,
            target_fragments=target,
        )
        eff = t + (c.blocking_s_per_outer_step + outer(c.fragments)) / c.sync_every
        return eff, c.fragments, c.sync_every

    values = [effective(step_s * (1 + 0.01 * i)) for i in range(40)]
    for (a, fa, ha), (b, fb, _) in itertools.pairwise(values):
        assert b >= a - max(0.0, outer(fa) - outer(fb)) / ha - 1e-12 * a


def test_pinned_fragments_get_auto_sync_every_candidates_that_torchft_accepts() -> None:
    """torchft needs syncEvery % fragments == 0: with fragments pinned, auto rounds each
    candidate up to a multiple (and the guard-rail down to one); none of the round candidates
    (10, 20, 50, …) is a multiple of 3, so without this no auto syncEvery existed for P = 3."""
    assert sync_every_candidates(500, fragments=3) == [12, 21, 51, 102, 201, 498]
    assert sync_every_candidates(20, fragments=3) == [12, 18]
    assert sync_every_candidates(500, fragments=7) == [14, 21, 56, 105, 203, 497]
    for p in (1, 2, 5, 10):  # a divisor of every candidate: the candidates as they were
        assert sync_every_candidates(500, fragments=p) == sync_every_candidates(500)
    assert sync_every_candidates(5, fragments=7) == []  # no multiple within the guard-rail

    def ar(f: int) -> list[float]:
        return [3.0 / f] * f

    c = choose_sync_every(0.1, ar, 32, fragments=3, max_sync_every=500, max_fragment_sync_delay=5)
    assert c.fragments == 3 and c.sync_every % 3 == 0 and c.sync_every <= 500
    assert c.fragment_sync_delay < c.sync_every // 3
    assert c.settings.window > c.fragment_sync_delay  # StreamingSettings checks torchft's rule


def test_pinned_fragments_that_no_auto_sync_every_fits_name_torchfts_rule() -> None:
    def ar(f: int) -> list[float]:
        return [1.0 / f] * f

    with pytest.raises(SpecError) as err:
        choose_sync_every(0.1, ar, 32, fragments=7, max_sync_every=5)
    assert err.value.field == "strategy.fragments"
    assert "torchft needs syncEvery % fragments == 0" in err.value.message
    assert "raise strategy.maxSyncEvery to at least 7" in err.value.message


def _outer_by_fragments(
    spec: PlanSpec, ctxs: list[PoolContext], used: list[int], ranks: int, per_call_s: float
) -> list[float]:
    """Index F − 1: the slowest used pool's outer optimizer steps with F fragments (one call
    per fragment, as the simulator charges them), plus ``per_call_s`` more per call."""
    layers = spec.model.num_layers
    return [
        max(
            outer_step_seconds_by_fragments(
                ctxs[p].cost_model, spec.model, spec.strategy, ranks, layers
            )[f - 1]
            for p in used
        )
        + per_call_s * f
        for f in range(1, layers + 1)
    ]


def _scalar(
    spec: PlanSpec,
    ctxs: list[PoolContext],
    used: list[int],
    k: int,
    ranks: int,
    step: float,
    outer: list[float],
) -> tuple[int, int, int, float]:
    strat = spec.strategy
    placements = [IslandPlacement(ctxs[p].cost_model, ranks) for p in used for _ in range(k)]
    link = outer_link(placements)
    islands = len(placements)

    def all_reduce(f: int) -> list[float]:
        return fragment_all_reduce_seconds(spec.model, strat, link, islands, f)

    rails = GuardRails.of(strat, spec.model.num_layers)
    c = choose_sync_every(
        step,
        all_reduce,
        spec.model.num_layers,
        strat.fragments if isinstance(strat.fragments, int) else None,
        max_sync_every=rails.max_sync_every,
        max_fragment_sync_delay=rails.max_fragment_sync_delay,
        outer_step_s=lambda f: outer[f - 1],
        max_fragment_sync_delay_fraction=rails.max_fragment_sync_delay_fraction,
        target_fragments=rails.target_fragments,
    )
    return (
        c.sync_every,
        c.fragments,
        c.fragment_sync_delay,
        (c.blocking_s_per_outer_step + outer[c.fragments - 1]) / c.sync_every,
    )


@pytest.mark.parametrize("per_call_s", [0.0, 0.05])
@pytest.mark.parametrize("fragments", ["auto", 3])
@pytest.mark.parametrize("wan", ["wan-100g-10ms", "wan-10g-30ms", "wan-1g-80ms"])
@pytest.mark.parametrize("max_h", [20, 100, 500])
def test_vectorised_settings_equal_the_scalar_rule(
    wan: str, max_h: int, fragments: Any, per_call_s: float
) -> None:
    """The same settings and overhead, the outer optimizer steps depending on the fragment
    count (one call per fragment; ``per_call_s`` inflates the per-call cost so that it
    decides between fragment counts where blocking cannot be hidden)."""
    spec, _ = load_plan(REPO / "examples" / "case-study.yaml")
    raw = spec.model_dump(by_alias=True)
    for pool in raw["pools"]:
        pool["wanUplink"] = LINK_PRESETS[wan].model_dump(by_alias=True)
    raw["strategy"]["maxSyncEvery"] = max_h
    raw["strategy"]["fragments"] = fragments
    spec = PlanSpec.model_validate(raw)
    ctxs = build_space(spec, {}).contexts
    model = OuterModel(spec, ctxs)
    rng = np.random.default_rng(max_h)
    for _ in range(40):
        used = sorted(rng.choice(2, size=int(rng.integers(1, 3)), replace=False).tolist())
        k = int(rng.integers(1, 6))
        ranks = int(rng.choice([8, 16, 32]))
        step = float(rng.uniform(0.2, 8.0))
        mask = np.zeros((1, 2), dtype=bool)
        mask[0, used] = True
        outer = _outer_by_fragments(spec, ctxs, used, ranks, per_call_s)
        got = model.evaluate(
            mask,
            np.array([k * len(used)]),
            np.array([ranks / 8]),  # the islands' share of node networks (8 GPUs per node)
            np.array([outer]),
            np.array([step]),
        )
        h, f, fragment_sync_delay, overhead = _scalar(spec, ctxs, used, k, ranks, step, outer)
        assert (int(got.sync_every[0]), int(got.fragments[0]), int(got.fragment_sync_delay[0])) == (
            h,
            f,
            fragment_sync_delay,
        )
        assert math.isclose(float(got.overhead_s[0]), overhead, rel_tol=1e-9)


def test_simulate_reports_blocking_instead_of_a_long_delay(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`shardmeter simulate` resolves auto settings with the same guard-rails."""
    import json

    from shardmeter.cli.main import main

    args = ["simulate", "--model", "llama-3.2-1b", "--gpu", "a100", "--seq-len", "4096"]
    args += ["--activation-checkpointing", "--strategy", "streaming-diloco", "--islands", "3"]
    assert main([*args, "--outer-link", "wan-10g-30ms", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["diloco"]
    assert d["fragment_sync_delay"] <= 5 and d["sync_every"] <= 500
    assert d["blocking_s_per_outer_step"] > 0 and not d["zero_blocking_possible"]
    assert "fragmentSyncDelay ≤ 5" in d["recommendation"]
