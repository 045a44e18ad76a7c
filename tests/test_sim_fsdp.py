"""FSDP step graphs: golden timelines worked out by hand, accumulation, prefetch bound,
linearity in accumulation, and trace determinism."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmeter.cost.model import CostModel
from shardmeter.output.trace import trace_json
from shardmeter.sim.engine import Kind
from shardmeter.sim.fsdp import (
    FSDPDurations,
    build_fsdp_step,
    fsdp_step_seconds,
    simulate_fsdp_step,
)
from shardmeter.sim.scenario import IslandShape, IslandStepModel
from shardmeter.spec.model import MODEL_PRESETS
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import GradientSync, TrainingSpec

LAST = GradientSync.LAST_MICRO_BATCH


def two_units(fwd: float, bwd: float, ag: float, rs: float, opt: float) -> FSDPDurations:
    return FSDPDurations(("A", "B"), (fwd, fwd), (bwd, bwd), (ag, ag), (rs, rs), opt)


def times(r: object) -> dict[str, tuple[float, float]]:
    s = r.schedule  # type: ignore[attr-defined]
    return {s.graph.name[i]: (s.start[i], s.end[i]) for i in range(len(s.graph))}


def test_golden_compute_bound() -> None:
    r = simulate_fsdp_step(two_units(fwd=2, bwd=4, ag=1, rs=1, opt=1))
    assert times(r) == {
        "all_gather A": (0, 1),
        "all_gather B": (1, 2),
        "forward A": (1, 3),
        "forward B": (3, 5),
        "all_gather B (bwd)": (3, 4),
        "all_gather A (bwd)": (5, 6),
        "backward B": (5, 9),
        "reduce_scatter B": (9, 10),
        "backward A": (9, 13),
        "reduce_scatter A": (13, 14),
        "optimizer step": (14, 15),
    }
    assert r.step_s == 15 and r.verdict == "compute-bound"
    assert r.compute_idle_s == {"all_gather": 1.0, "reduce_scatter": 1.0}
    assert r.compute_busy_s == 13 and r.comm_busy_s == 6


def test_golden_communication_bound() -> None:
    r = simulate_fsdp_step(two_units(fwd=1, bwd=1, ag=3, rs=3, opt=0))
    t = times(r)
    assert t["all_gather B (bwd)"] == (6, 9) and t["all_gather A (bwd)"] == (9, 12)
    assert t["reduce_scatter B"] == (12, 15) and t["reduce_scatter A"] == (15, 18)
    assert r.step_s == 18 and r.verdict == "communication-bound"
    assert r.compute_idle_s == {"all_gather": 9.0, "reduce_scatter": 5.0}


def test_last_micro_batch_sync_skips_reduce_scatter_but_keeps_all_gather() -> None:
    d = two_units(fwd=2, bwd=4, ag=1, rs=1, opt=1)
    g = build_fsdp_step(d, accumulation=2, gradient_sync=LAST)
    kinds = [(g.kind[i], g.group[i]) for i in range(len(g))]
    assert kinds.count((Kind.REDUCE_SCATTER, 0)) == 0 and kinds.count((Kind.REDUCE_SCATTER, 1)) == 2
    assert (
        sum(1 for k, _ in kinds if k is Kind.ALL_GATHER) == 8
    )  # 2 units × fwd/bwd × 2 micro-steps
    r = simulate_fsdp_step(d, accumulation=2, gradient_sync=LAST)
    t = times(r)
    # micro-step 1's forward all_gather of B waits until micro-step 0's backward of A freed a buffer
    assert t["all_gather B[1]"] == (13, 14) and t["forward B[1]"] == (15, 17)
    assert r.step_s == 27


def test_golden_every_micro_batch_sync() -> None:
    # FSDP2's default: reduce_scatter after every micro-step. Worked by hand (comm stream in
    # issue order, prefetch bound 2):
    #   AG A0 [0,1] → fwd A0 [1,3]; AG B0 [1,2] → fwd B0 [3,5]
    #   AG B0(bwd) waits fwd A0 → [3,4]; AG A0(bwd) waits fwd B0 → [5,6]
    #   bwd B0 [5,9] → RS B0 [9,10]; bwd A0 [9,13] → RS A0 [13,14]
    #   AG A1 is queued behind RS A0 → [14,15]: compute idles 13–15 → fwd A1 [15,17]
    #   AG B1 [15,16] → fwd B1 [17,19]; AG B1(bwd) waits fwd A1 → [17,18]
    #   AG A1(bwd) waits fwd B1 → [19,20]; bwd B1 [19,23] → RS B1 [23,24]
    #   bwd A1 [23,27] → RS A1 [27,28] → optimizer [28,29]
    d = two_units(fwd=2, bwd=4, ag=1, rs=1, opt=1)
    r = simulate_fsdp_step(d, accumulation=2)
    assert times(r) == {
        "all_gather A[0]": (0, 1),
        "forward A[0]": (1, 3),
        "all_gather B[0]": (1, 2),
        "forward B[0]": (3, 5),
        "all_gather B[0] (bwd)": (3, 4),
        "all_gather A[0] (bwd)": (5, 6),
        "reduce_scatter B[0]": (9, 10),
        "reduce_scatter A[0]": (13, 14),
        "backward B[0]": (5, 9),
        "backward A[0]": (9, 13),
        "all_gather A[1]": (14, 15),
        "forward A[1]": (15, 17),
        "all_gather B[1]": (15, 16),
        "forward B[1]": (17, 19),
        "all_gather B[1] (bwd)": (17, 18),
        "all_gather A[1] (bwd)": (19, 20),
        "reduce_scatter B[1]": (23, 24),
        "reduce_scatter A[1]": (27, 28),
        "backward B[1]": (19, 23),
        "backward A[1]": (23, 27),
        "optimizer step": (28, 29),
    }
    assert r.step_s == 29 and r.compute_busy_s == 25
    assert r.compute_idle_s == {"all_gather": 3.0, "reduce_scatter": 1.0}


def test_golden_root_unit_stays_unsharded_after_forward() -> None:
    # E(mbedding) and H(ead) form FSDP2's root: one gather of both before E's forward (2 s,
    # on E), no gather before their backwards, one reduce_scatter after E's backward (2 s).
    #   AG E [0,2] → fwd E [2,3]; AG B [2,3] → fwd B [3,5]; fwd H [5,6] (nothing to gather)
    #   AG B(bwd) waits fwd E (prefetch bound 2) → [3,4]
    #   bwd H [6,8]; bwd B [8,12] → RS B [12,13]; bwd E [12,13] → RS E [13,15]
    #   optimizer after RS E [15,16]
    d = FSDPDurations(
        ("E", "B", "H"),
        (1, 2, 1),
        (1, 4, 2),
        (2, 1, 0),
        (2, 1, 0),
        1,
        reshard_after_forward=(False, True, False),
    )
    r = simulate_fsdp_step(d)
    assert times(r) == {
        "all_gather E": (0, 2),
        "forward E": (2, 3),
        "all_gather B": (2, 3),
        "forward B": (3, 5),
        "forward H": (5, 6),
        "all_gather B (bwd)": (3, 4),
        "reduce_scatter B": (12, 13),
        "reduce_scatter E": (13, 15),
        "backward H": (6, 8),
        "backward B": (8, 12),
        "backward E": (12, 13),
        "optimizer step": (15, 16),
    }
    assert r.step_s == 16 and r.compute_idle_s == {"all_gather": 2.0, "reduce_scatter": 2.0}


def test_golden_interference_charges_overlapped_seconds() -> None:
    # the compute-bound golden above overlaps compute with AG B [1,2], AG B(bwd) [3,4],
    # AG A(bwd) [5,6] and RS B [9,10] (AG A and RS A run while compute idles): 4 s; at 0.5 s
    # lost per overlapped second the step grows from 15 to 17
    d = dataclasses.replace(two_units(fwd=2, bwd=4, ag=1, rs=1, opt=1), overlap_slowdown=0.5)
    r = simulate_fsdp_step(d)
    assert r.overlap_s == 4 and r.interference_s == 2 and r.step_s == 17
    assert fsdp_step_seconds(d) == 17


def test_prefetch_bound() -> None:
    d = two_units(fwd=2, bwd=4, ag=1, rs=1, opt=1)
    one = simulate_fsdp_step(d, max_inflight=1)
    t = times(one)
    assert t["all_gather B"] == (3, 4)  # cannot prefetch: waits for forward A to free its unit
    assert one.step_s == 18
    assert simulate_fsdp_step(d, max_inflight=2).step_s == 15
    three = simulate_fsdp_step(d, max_inflight=3)
    assert times(three)["all_gather B (bwd)"] == (2, 3) and three.step_s == 15
    for k in (1, 2, 3):  # invariant: the j-th gather starts after the (j−k)-th consumer ended
        s = simulate_fsdp_step(d, accumulation=2, max_inflight=k).schedule
        gathers = [i for i in range(len(s.graph)) if s.graph.kind[i] is Kind.ALL_GATHER]
        consumers = [
            next(
                c
                for c in range(len(s.graph))
                if g in s.graph.deps[c] and s.graph.kind[c] in (Kind.FORWARD, Kind.BACKWARD)
            )
            for g in gathers
        ]
        for j in range(k, len(gathers)):
            assert s.start[gathers[j]] >= s.end[consumers[j - k]]


durations = st.floats(0, 5, allow_nan=False)


@st.composite
def fsdp_durations(draw: st.DrawFn) -> FSDPDurations:
    n = draw(st.integers(1, 6))
    cols = [tuple(draw(st.lists(durations, min_size=n, max_size=n))) for _ in range(4)]
    # FSDP2's root: first and last unit kept unsharded after forward (when there are two)
    root = n >= 2 and draw(st.booleans())
    reshard = (False, *([True] * (n - 2)), False) if root else ()
    slowdown = draw(st.sampled_from([0.0, 0.61]))
    return FSDPDurations(
        tuple(f"u{i}" for i in range(n)), *cols, draw(durations), reshard, slowdown
    )


syncs = st.sampled_from(list(GradientSync)[:2])


@given(fsdp_durations(), st.integers(1, 3), st.integers(1, 8), syncs)
@settings(max_examples=200)
def test_step_time_is_linear_in_accumulation_from_the_second_micro_step(
    d: FSDPDurations, k: int, a: int, sync: GradientSync
) -> None:
    # what IslandStepModel relies on: T(A) = T(2) + (A − 2)·(T(3) − T(2)) for A ≥ 2
    t2, t3 = simulate_fsdp_step(d, 2, k, sync).step_s, simulate_fsdp_step(d, 3, k, sync).step_s
    expected = simulate_fsdp_step(d, 1, k, sync).step_s if a == 1 else t2 + (a - 2) * (t3 - t2)
    assert simulate_fsdp_step(d, a, k, sync).step_s == pytest.approx(expected, rel=1e-9, abs=1e-9)


@given(fsdp_durations(), st.integers(1, 4))
def test_every_micro_batch_sync_is_never_faster_than_last(d: FSDPDurations, a: int) -> None:
    # every-micro-batch does strictly more communication (A reduce_scatters, not one)
    every = simulate_fsdp_step(d, a, gradient_sync=GradientSync.EVERY_MICRO_BATCH)
    last = simulate_fsdp_step(d, a, gradient_sync=LAST)
    assert every.schedule.makespan_s >= last.schedule.makespan_s - 1e-9


def test_first_micro_step_can_differ_from_the_steady_increment() -> None:
    # found by hypothesis: with three gathers in flight the first increment is larger, which
    # is why the model extrapolates from micro-steps 2 and 3, not 1 and 2
    d = FSDPDurations(
        ("u0", "u1", "u2"), (1.0, 1.0, 1.0), (2.0, 0.0, 1.0), (1.0, 1.0, 1.0), (0.0, 0.0, 0.0), 0.0
    )
    t = [simulate_fsdp_step(d, a, 3, LAST).step_s for a in (1, 2, 3, 4)]
    assert t[1] - t[0] != t[2] - t[1] and t[2] - t[1] == t[3] - t[2]


@given(fsdp_durations(), st.integers(1, 3))
def test_step_bounds(d: FSDPDurations, a: int) -> None:
    r = simulate_fsdp_step(d, a)
    g = r.schedule.graph
    assert r.step_s >= r.compute_busy_s - 1e-9 and r.step_s >= r.comm_busy_s - 1e-9
    # interference never makes overlap worse than running compute and comm back to back
    assert r.step_s <= sum(g.duration) + 1e-9
    assert 0 <= r.interference_s <= d.overlap_slowdown * min(r.compute_busy_s, r.comm_busy_s) + 1e-9


@given(fsdp_durations())
def test_trace_is_byte_identical(d: FSDPDurations) -> None:
    a, b = (
        trace_json(simulate_fsdp_step(d, 2).schedule),
        trace_json(simulate_fsdp_step(d, 2).schedule),
    )
    assert a == b
    events = json.loads(a)["traceEvents"]
    colours = {e["cat"]: e["cname"] for e in events if e["ph"] == "X"}
    assert (
        colours.get("all_gather", "bad") == "bad"
        and colours.get("reduce_scatter", "thread_state_iowait") == "thread_state_iowait"
    )


def test_island_step_model_matches_full_simulation() -> None:
    m = MODEL_PRESETS["llama-3.2-1b"]
    cm = CostModel(
        m,
        TrainingSpec(seq_len_tokens=4096, global_batch_tokens=4096 * 64),
        PoolSpec(name="p", gpu="a100", nodes=4, gpus_per_node=8),
    )
    model = IslandStepModel(cm, IslandShape(2, 8), micro_batch=2)
    for a in (1, 3, 7):
        assert model.step_s(a) == pytest.approx(model.simulate(a).step_s, rel=1e-12)
    assert 0 < model.mfu(4) < 1 and model.tokens_per_step(4) == 4 * 2 * 16 * 4096


def test_durations_file_format_and_errors() -> None:
    from shardmeter.errors import SpecError
    from shardmeter.sim.whatif import WhatIfDocument
    from shardmeter.spec.loading import validate

    doc = {
        "units": [
            {"name": "emb", "forward_s": 1},
            {"name": "block", "repeat": 3, "forward_s": 2, "all_gather_s": 1},
        ],
        "optimizer_s": 0.5,
    }
    d = validate(WhatIfDocument, doc).fsdp_durations()
    assert d.unit_names == ("emb", "block0", "block1", "block2") and d.all_gather_s == (0, 1, 1, 1)

    with pytest.raises(SpecError, match=r"units\[1\]\.forward_s: must be between 0 and 1e9"):
        validate(WhatIfDocument, {"units": [{"forward_s": 1}, {"forward_s": -1}]}, "durations")
    with pytest.raises(SpecError, match="unknown field"):
        validate(WhatIfDocument, {"units": [{"fwd": 1}]})
