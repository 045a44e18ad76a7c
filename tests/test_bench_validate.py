"""``validate``: the Hugging Face models are the architectures the specs describe, the
unseen suite covers MHA/GQA/MQA and is never in the catalog, its measurements are spread
over the catalog, the predictions are the cost model's, FSDP2 runs on 2 Gloo ranks, and the
report has the paper's table shape plus the unseen points with their median and maximum."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shardmeter.cost.coefficients import CommSample, LinkRole
from shardmeter.cost.collectives import link_ring_seconds
from shardmeter.cost.priors import prior_coefficients
from shardmeter.spec.hardware import LINK_PRESETS, GPUSpec
from shardmeter.spec.model import MODEL_PRESETS
from shardmeter.spec.training import Precision
from shardmeter_bench.catalog import FULL_CPU, architecture_key, generate_catalog
from shardmeter_bench.comm import CommPlan
from shardmeter_bench.distributed import spawn
from shardmeter_bench.fsdp_step import DistributedValidation, distributed_validation_phase
from shardmeter_bench.hf_models import build_hf_model, hf_family
from shardmeter_bench.report import build_report, render_markdown, write_report
from shardmeter_bench.unseen import (
    SMALL_UNSEEN_SPECS,
    UNSEEN,
    interleave_schedule,
    unseen_cases,
)
from shardmeter_bench.validate import (
    TINY_SPECS,
    FsdpCase,
    ModelResult,
    attach_predictions,
    cost_model,
    fsdp_cases,
    merge_passes,
    predict_forward_backward,
    predict_step,
    time_forward_backward,
    validation_cases,
    within_budget,
)

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


pytestmark = pytest.mark.usefixtures("one_thread")


def test_presets_map_to_their_hugging_face_families() -> None:
    families = {k: hf_family(MODEL_PRESETS[k]) for k in MODEL_PRESETS}
    assert families["phi-1.5"] == "phi" and families["gemma-2b"] == "gemma"
    assert {families[k] for k in ("smollm-360m", "llama-3.2-1b", "yi-1.5-6b")} == {"llama"}


SMALL_SPECS = {**TINY_SPECS, **{s.name: s for s, _ in SMALL_UNSEEN_SPECS}}


@pytest.mark.parametrize("key", sorted(SMALL_SPECS))
def test_hugging_face_model_is_the_architecture_the_spec_describes(key: str) -> None:
    spec = SMALL_SPECS[key]
    model = build_hf_model(spec, 3, torch.device("cpu"))
    assert (
        sum(p.numel() for p in model.parameters())
        == spec.model_copy(update={"num_layers": 3}).total_params
    )
    fwd, bwd = time_forward_backward(model, 2, 24, spec.vocab_size, repeats=3)
    assert statistics.median(fwd) > 0 and statistics.median(bwd) > 0
    assert all(p.grad is None for p in model.parameters())  # zeroed after each iteration


def test_full_validation_uses_the_papers_models_at_full_width() -> None:
    cases = validation_cases("full", "cpu")
    assert [c.key for c in cases] == [
        "smollm-360m",
        "llama-3.2-1b",
        "phi-1.5",
        "gemma-2b",
        "yi-1.5-6b",
    ]
    assert all(2 <= c.layers <= 4 and c.spec == MODEL_PRESETS[c.key] for c in cases)
    assert all(c.layers < c.spec.num_layers for c in fsdp_cases("full", "cpu"))


def test_unseen_suite_is_eight_llama_architectures_the_catalog_never_draws() -> None:
    cases = unseen_cases("full")
    assert len(cases) == 8 and all(c.suite == UNSEEN for c in cases)
    assert all(hf_family(c.spec) == "llama" for c in cases)
    widths = [c.spec.hidden_size for c in cases]
    assert min(widths) == 448 and max(widths) == 2048
    kinds = {
        "mha" if c.spec.kv_heads == c.spec.num_attention_heads else
        "mqa" if c.spec.kv_heads == 1 else "gqa"
        for c in cases
    }  # fmt: skip
    assert kinds == {"mha", "gqa", "mqa"}
    # the default CPU budget measures every one of them
    kept, left_out = within_budget(cases, FULL_CPU.max_process_bytes, 4)
    assert kept == cases and not left_out
    catalog = generate_catalog(
        FULL_CPU, 200, seed=0, exclude=[c.spec for c in cases + validation_cases("full", "cpu")]
    )
    drawn = {architecture_key(s.spec) for s in catalog}
    assert not drawn & {architecture_key(c.spec) for c in cases}


def test_models_over_the_memory_budget_are_left_out_with_a_note() -> None:
    cases = validation_cases("full", "cpu")
    kept, notes = within_budget(cases, 5 * 2**30, 4)
    assert {c.key for c in kept} == {"smollm-360m", "phi-1.5"}
    assert len(notes) == 3 and all("--max-memory-gib" in n for n in notes)
    assert any(n.startswith("gemma-2b not measured: needs ~") for n in notes)
    assert within_budget(cases, None, 4) == (cases, [])


@given(shapes=st.integers(0, 40), cases=st.integers(0, 12))
def test_interleaving_spreads_every_case_over_the_catalog_once(shapes: int, cases: int) -> None:
    schedule = interleave_schedule(shapes, cases)
    order = [j for k in sorted(schedule) for j in schedule[k]]
    assert order == list(range(cases))  # each once, in order
    if shapes == 0 or cases == 0:
        return
    assert all(0 <= k < shapes for k in schedule)
    assert max(schedule) == shapes - 1  # the last case after the last shape
    after = [k for k in sorted(schedule) for _ in schedule[k]]
    gaps = [b - a for a, b in zip([-1, *after], after, strict=False)]
    if cases <= shapes:
        assert max(gaps) - min(gaps) <= 1  # evenly spread
    else:
        per_shape = [len(schedule.get(k, [])) for k in range(shapes)]
        assert max(per_shape) - min(per_shape) <= 1  # as many after every shape


def test_passes_pool_their_timed_iterations() -> None:
    first = [
        {"key": "a", "micro_batch": 1, "seq_len": 8, "fwd": 2.0, "bwd": 4.0,
         "fwd_all": [1.0, 2.0, 3.0], "bwd_all": [4.0, 4.0, 4.0]},
        {"key": "b", "micro_batch": 1, "seq_len": 8, "fwd": 1.0, "bwd": 1.0,
         "fwd_all": [1.0], "bwd_all": [1.0]},
    ]  # fmt: skip
    second = [{**first[0], "fwd_all": [10.0, 11.0, 12.0], "bwd_all": [5.0, 5.0, 5.0]}]
    merged = merge_passes(first + second)
    assert [(m["key"], m["passes"]) for m in merged] == [("a", 2), ("b", 1)]
    assert merged[0]["fwd"] == 6.5 and merged[0]["bwd"] == 4.5  # medians of all six
    assert merged[0]["fwd_all"] == [1.0, 2.0, 3.0, 10.0, 11.0, 12.0]


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


@pytest.mark.slow
def test_distributed_validation_on_two_gloo_ranks() -> None:
    job = DistributedValidation(
        cases=(FsdpCase("tiny-llama", TINY_SPECS["tiny-llama"], 2, 2, 24),),
        device_type="cpu",
        bf16=False,
        repeats=3,
        seed=0,
        comm=CommPlan(payloads=(4096,), repeats=3, min_loop_s=0.002, inter_node=False),
    )
    out = spawn(distributed_validation_phase, job, nprocs=2, device_type="cpu", timeout_s=120)
    assert [s["key"] for s in out["steps"]] == ["tiny-llama"] and out["steps"][0]["seconds"] > 0
    assert {c.collective for c in out["collectives"]} == {
        "all_gather",
        "reduce_scatter",
        "all_reduce",
    }
    assert all(c.ranks == 2 for c in out["collectives"])


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
