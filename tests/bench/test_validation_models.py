"""Whole models for ``validate`` (`shardmeter_bench.validation.hf_models`, `measure`,
`fsdp_step`): the Hugging Face models are the architectures the specs describe, the preset
suite is the paper's models at full width, models over the memory budget are left out with a
note, passes pool their timed iterations, and FSDP2 runs on 2 Gloo ranks."""

from __future__ import annotations

import statistics

import pytest
import torch

from shardmeter.spec.model import MODEL_PRESETS
from shardmeter_bench.collectives.distributed import spawn
from shardmeter_bench.collectives.timing import CommPlan
from shardmeter_bench.validation.fsdp_step import (
    DistributedValidation,
    distributed_validation_phase,
)
from shardmeter_bench.validation.hf_models import build_hf_model, hf_family
from shardmeter_bench.validation.measure import (
    TINY_SPECS,
    FsdpCase,
    fsdp_cases,
    merge_passes,
    time_forward_backward,
    validation_cases,
    within_budget,
)
from shardmeter_bench.validation.unseen import SMALL_UNSEEN_SPECS

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


def test_models_over_the_memory_budget_are_left_out_with_a_note() -> None:
    cases = validation_cases("full", "cpu")
    kept, notes = within_budget(cases, 5 * 2**30, 4)
    assert {c.key for c in kept} == {"smollm-360m", "phi-1.5"}
    assert len(notes) == 3 and all("--max-memory-gib" in n for n in notes)
    assert any(n.startswith("gemma-2b not measured: needs ~") for n in notes)
    assert within_budget(cases, None, 4) == (cases, [])


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
