"""DiLoCo and Streaming DiLoCo: golden timelines, the paper's Fig. 6 configurations in
miniature, the closed form, and the settings search."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardmeter.cost.model import CostModel
from shardmeter.errors import SpecError
from shardmeter.sim.diloco import IslandSteps, fragment_params, simulate_diloco
from shardmeter.sim.engine import Kind
from shardmeter.sim.outer import IslandPlacement, outer_link, wan_link
from shardmeter.sim.scenario import DiLoCoIsland, IslandShape, resolve_settings, simulate_islands
from shardmeter.sim.settings import closed_form_blocking, search_settings
from shardmeter.spec.hardware import LINK_PRESETS
from shardmeter.spec.model import MODEL_PRESETS
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import StrategySpec, StreamingSettings, TrainingSpec


def islands(n: int, step_s: float, fragments: int, outer_s: float = 0.0) -> list[IslandSteps]:
    return [IslandSteps(f"i{k}", step_s, (outer_s,) * fragments) for k in range(n)]


def test_blocking_diloco_two_unequal_islands() -> None:
    fast, slow = IslandSteps("fast", 1.0, (0.5,)), IslandSteps("slow", 1.5, (0.5,))
    r = simulate_diloco([fast, slow], StreamingSettings(sync_every=2), [3.0], rounds=2)
    s, g = r.schedule, r.schedule.graph
    ar = [i for i in range(len(g)) if g.kind[i] is Kind.OUTER_ALL_REDUCE]
    assert [(s.start[i], s.end[i]) for i in ar] == [(3.0, 6.0), (9.5, 12.5)]
    outer = [(s.start[i], s.end[i]) for i in range(len(g)) if g.kind[i] is Kind.OUTER_STEP]
    assert outer == [(6.0, 6.5), (6.0, 6.5), (12.5, 13.0), (12.5, 13.0)]
    assert r.period_s == pytest.approx(6.5)
    assert r.island_idle_s_per_outer_step == pytest.approx(
        (4.0, 3.0)
    )  # the fast island waits longer
    assert r.blocking_s_per_outer_step == pytest.approx(3.0)  # the slowest island's stall
    assert r.no_comm_period_s == pytest.approx(3.5)
    assert r.slowdown == pytest.approx(6.5 / 3.5 - 1)


# Fig. 6 in miniature: two islands, 1 s inner steps, the full model's all_reduce takes
# `full` seconds, so each of F fragments takes full / F.
@pytest.mark.parametrize(
    ("case", "full", "h", "f", "fragment_sync_delay", "blocking"),
    [
        ("A fast link: no blocking", 1.0, 4, 2, 1, 0.0),
        ("B slow link blocks", 3.0, 4, 2, 1, 1.0),  # 2 × (1.5 − 1)
        ("C more fragments fix it", 3.0, 8, 4, 1, 0.0),  # 0.75 ≤ 1 step
        ("D a longer delay fixes it", 3.0, 6, 2, 2, 0.0),  # 1.5 ≤ 2 steps
        ("tau = 0 is synchronous", 3.0, 4, 2, 0, 3.0),
    ],
)
def test_fig6_configurations(
    case: str, full: float, h: int, f: int, fragment_sync_delay: int, blocking: float
) -> None:
    r = simulate_diloco(
        islands(2, 1.0, f), StreamingSettings(h, f, fragment_sync_delay), [full / f] * f
    )
    assert r.blocking_s_per_outer_step == pytest.approx(blocking), case
    assert r.period_s == pytest.approx(h * 1.0 + blocking), case
    assert (r.slowdown > 0) == (blocking > 0)


@given(st.floats(0.1, 5), st.sampled_from([(4, 2), (6, 3), (8, 2), (12, 4), (10, 1)]), st.data())
def test_simulation_matches_closed_form_with_one_fragment_in_flight(
    step: float, hf: tuple[int, int], data: st.DataObject
) -> None:
    h, f = hf
    window = h // f
    fragment_sync_delay = data.draw(st.integers(0, window - 1))
    ar = data.draw(st.floats(0, 0.99 * window * step))  # ≤ one window: one all_reduce in flight
    r = simulate_diloco(islands(3, step, f), StreamingSettings(h, f, fragment_sync_delay), [ar] * f)
    # the simulator counts idle below 1e-9 of an island's busy time (≤ 60 s here) as float
    # noise, so a closed-form blocking of a few nanoseconds may read as 0
    assert r.blocking_s_per_outer_step == pytest.approx(
        closed_form_blocking([ar] * f, step, fragment_sync_delay), abs=1e-7
    )


def test_torchft_rules_are_enforced() -> None:
    with pytest.raises(SpecError, match="multiple of fragments"):
        StreamingSettings(10, 3)
    with pytest.raises(SpecError, match="must be < syncEvery / fragments = 5"):
        StreamingSettings(10, 2, 5)


def test_fragment_layouts() -> None:
    m = MODEL_PRESETS["llama-3.1-8b"]
    contiguous = fragment_params(m, 3)
    assert sum(contiguous) == m.total_params
    assert contiguous[1] == 11 * m.params_per_block  # 32 blocks → 11, 11, 10
    strided = fragment_params(m, 3, "strided")
    assert sum(strided) == m.total_params
    with pytest.raises(SpecError, match="between 1 and the model's 32 blocks"):
        fragment_params(m, 33)


def test_settings_search_fewest_fragments_then_shortest_delay() -> None:
    # full model all_reduce 3 s, step 1 s, H = 8: F=1 needs τ=3 < 8 → fewest fragments wins
    def ar(f: int) -> list[float]:
        return [3.0 / f] * f

    c = search_settings(8, 1.0, ar, max_fragments=32)
    assert (c.fragments, c.fragment_sync_delay, c.zero_blocking) == (1, 3, True)
    # H = 2: F=1 would need τ=3 ≥ 2; F=2 (1.5 s each) needs τ=2 ≥ W=1 → impossible at H=2
    c = search_settings(2, 1.0, ar, max_fragments=32, candidates=(2, 4, 10))
    assert not c.zero_blocking and c.sync_every_for_zero_blocking == 4
    assert c.blocking_s_per_outer_step == pytest.approx(2.0)  # F=1, τ=1 hides 1 s of 3
    fixed = search_settings(8, 1.0, ar, max_fragments=32, fragments=2)
    assert (fixed.fragments, fixed.fragment_sync_delay) == (2, 2)


def test_resolve_settings_from_cost_models_and_wan() -> None:
    m = MODEL_PRESETS["llama-3.2-1b"]
    training = TrainingSpec(
        seq_len_tokens=4096, global_batch_tokens=4096 * 64, activation_checkpointing=True
    )
    pool = PoolSpec(
        name="p",
        gpu="h100",
        nodes=2,
        gpus_per_node=8,
        site="eu",
        wanUplink=LINK_PRESETS["wan-10g-30ms"],
    )
    other = pool.model_copy(update={"name": "q", "site": "us"})
    cm, cm2 = CostModel(m, training, pool), CostModel(m, training, other)
    link = outer_link([IslandPlacement(cm, 8), IslandPlacement(cm2, 8)])
    assert link.description.startswith("WAN") and link.parallel_rails == 1
    # one site: every node of the smaller island (1 node of 8 GPUs) drives all its rails
    same_site = outer_link([IslandPlacement(cm, 8), IslandPlacement(cm, 16)])
    assert same_site.parallel_rails == 1.0
    strategy = StrategySpec(kind="streaming-diloco")
    choice = resolve_settings(m, strategy, link, islands=2, step_s=0.5)
    assert choice.zero_blocking and choice.sync_every % choice.fragments == 0
    outcome = simulate_islands(
        m,
        strategy,
        [
            DiLoCoIsland("a", cm, IslandShape(1, 8), 0.5),
            DiLoCoIsland("b", cm2, IslandShape(1, 8), 0.5),
        ],
        link,
    )
    assert outcome.result.blocking_s_per_outer_step == 0.0
    fixed = resolve_settings(
        m, StrategySpec(sync_every=10, fragments=1, fragment_sync_delay=0), link, 2, 0.5
    )
    assert (
        not fixed.zero_blocking
        and fixed.recommended is not None
        and "recommended instead" in fixed.reason
    )


def test_wan_link_uses_slowest_uplink() -> None:
    link = wan_link([LINK_PRESETS["wan-10g-30ms"], LINK_PRESETS["wan-1g-80ms"]])
    assert link.latency_s == 0.08
    assert link.all_reduce_seconds(1e9, 2) > 8.0  # 2·(1)·(0.08 + 0.5e9/(0.125e9·0.8))
