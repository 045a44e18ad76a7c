"""The predictions ``validate`` compares with (`shardmeter_bench.validation.measure`) are
the cost model's, and the report (`shardmeter_bench.validation.report`) has the paper's table
shape plus the unseen points with their median and maximum."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardmeter.cost.coefficients import CommSample, LinkRole
from shardmeter.cost.collectives import link_ring_seconds
from shardmeter.cost.priors import prior_coefficients
from shardmeter.spec.hardware import LINK_PRESETS, GPUSpec
from shardmeter.spec.model import MODEL_PRESETS
from shardmeter.spec.training import Precision
from shardmeter_bench.validation.measure import (
    TINY_SPECS,
    ModelResult,
    attach_predictions,
    cost_model,
    predict_forward_backward,
    predict_step,
    validation_cases,
)
from shardmeter_bench.validation.report import build_report, render_markdown, write_report
from shardmeter_bench.validation.unseen import UNSEEN, unseen_cases

CPU = GPUSpec(
    name="cpu-test-1t",
    memory_bytes=16 * 2**30,
    peak_bf16_flop_per_s=1e11,
    peak_fp32_flop_per_s=1e11,
    hbm_bandwidth_bytes_per_s=2e10,
    tdp_watts=10,
    default_intra_node_link="pcie4",
    default_inter_node_link="eth-100g",
)
DOC = prior_coefficients(CPU, LINK_PRESETS["pcie4"], LINK_PRESETS["eth-100g"], Precision.FP32)


def test_predictions_are_the_cost_models_unit_sums() -> None:
    spec = MODEL_PRESETS["llama-3.2-1b"].model_copy(update={"num_layers": 2})
    fwd, bwd = predict_forward_backward(DOC, spec, 2, 128)
    u = cost_model(DOC, spec, 2, 128).unit_times(2)
    assert fwd == pytest.approx(u.embedding_forward_s + 2 * u.block_forward_s + u.head_forward_s)
    assert bwd == pytest.approx(u.embedding_backward_s + 2 * u.block_backward_s + u.head_backward_s)
    one = predict_step(DOC, spec, 2, 128, nodes=1, gpus_per_node=1)
    two = predict_step(DOC, spec, 2, 128, nodes=1, gpus_per_node=2)
    assert one >= fwd + bwd  # a step also runs the optimizer
    # Two ranks: the same micro-batch per rank, so at least the same compute; the optimizer
    # runs over half the parameters and the collectives are added, so the step differs.
    assert two > fwd + bwd and two != pytest.approx(one)


def test_report_has_the_papers_table_shape(tmp_path: Path) -> None:
    cases = validation_cases("small", "cpu") + unseen_cases("small")
    rows = [
        {"key": c.key, "micro_batch": b, "seq_len": s, "fwd": 0.010, "bwd": 0.020}
        for c in cases
        for b, s in c.sizes
    ]
    results = attach_predictions(DOC, cases, rows)
    results[0].step = {
        "measured_s": 0.5,
        "predicted_s": 0.45,
        "micro_batch": 2,
        "seq_len": 48,
        "ranks": 2,
    }
    fit = DOC.communication[LinkRole.INTRA_NODE]["all_reduce"]
    truth = link_ring_seconds("all_reduce", 2**20, 2, fit.latency_s, fit.seconds_per_byte)
    coll = [CommSample(collective="all_reduce", role=LinkRole.INTRA_NODE, payload_bytes=2**20,
                       ranks=2, seconds=truth * 1.25)]  # fmt: skip
    report = build_report(DOC, results, coll, {"machine": "test box", "sizes": "1×48"})
    first = report["models"][0]
    expected = [abs(p["fwd_predicted_s"] - 0.010) / 0.010 for p in results[0].points]
    assert first["fwd_mape"] == pytest.approx(sum(expected) / len(expected))
    assert first["step_error"] == pytest.approx(0.1)
    assert report["collectives"]["all_reduce"]["mape"] == pytest.approx(0.2)
    assert report["median"]["step_error"] == pytest.approx(0.1)
    md = render_markdown(report)
    assert "| Model | Size | Layers built | Fwd | Bwd | Step |" in md
    assert "| tiny-llama | 0M | 2 |" in md and "| 10.0 |" in md and "test box" in md
    assert "| all_reduce | 2 | 20.0 |" in md
    # the unseen points: one per (model, size), errors checked against a direct computation
    unseen = report["unseen"]
    assert len(unseen["points"]) == sum(len(c.sizes) for c in unseen_cases("small"))
    assert [m["key"] for m in report["models"]] == list(TINY_SPECS)  # not in the paper table
    fwd = sorted(
        abs(p["fwd_predicted_s"] - 0.010) / 0.010
        for r in results
        if r.suite == UNSEEN
        for p in r.points
    )
    bwd = sorted(
        abs(p["bwd_predicted_s"] - 0.020) / 0.020
        for r in results
        if r.suite == UNSEEN
        for p in r.points
    )
    assert unseen["fwd_max"] == pytest.approx(fwd[-1]) and unseen["bwd_max"] == pytest.approx(
        bwd[-1]
    )
    assert unseen["fwd_median"] == pytest.approx((fwd[2] + fwd[3]) / 2)
    assert unseen["meets_goal"] == (
        max(fwd[-1], bwd[-1]) <= 0.2
        and (fwd[2] + fwd[3]) / 2 <= 0.1
        and (bwd[2] + bwd[3]) / 2 <= 0.1
    )
    assert "| unseen, 6 points | median | max |" in md and "tiny-h160-gqa" in md
    js, mdfile = write_report(report, tmp_path / "r")
    assert js.exists() and mdfile.read_text().startswith("Prediction error")
    assert isinstance(results[0], ModelResult)
