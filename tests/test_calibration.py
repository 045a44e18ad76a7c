"""The published-throughput reader behind benchmarks/bench_published.py: the shared file's
schema reads in full, and values the model cannot express are reported per point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shardmeter.calibration import apply_setups, evaluate, point_specs
from shardmeter.errors import SpecError
from shardmeter.spec.training import ActivationCheckpointing, Precision, Sharding

REPO = Path(__file__).resolve().parents[1]
SHARED = next(
    (
        p / "shared" / "calibration" / "published-throughput.json"
        for p in (REPO.parent, REPO.parent.parent)
        if (p / "shared" / "calibration" / "published-throughput.json").exists()
    ),
    None,
)


def point(**over: Any) -> dict[str, Any]:
    base = {
        "id": "p",
        "model": "llama-3.1-8b",
        "gpu": "h100",
        "nodes": 2,
        "gpus_per_node": 8,
        "seq_len": 4096,
        "micro_batch": 1,
        "accumulation": 1,
        "activation_checkpointing": "selective-op",
        "precision": "bf16",
        "torch_compile": False,
        "sharding": "FSDP",
        "inter_node_link": None,
        "other_parallelism": None,
        "published_tokens_per_s_per_gpu": 5000,
    }
    return {**base, **over}


@pytest.mark.skipif(SHARED is None, reason="shared/calibration not beside this checkout")
def test_every_point_of_the_shared_file_is_predicted() -> None:
    assert SHARED is not None
    report = evaluate(json.loads(SHARED.read_text()))
    assert report.skipped == [] and len(report.predictions) == 18
    assert all(
        p.predicted_tokens_per_s_per_gpu > 0 and 0 < p.predicted_mfu < 1 for p in report.predictions
    )


def test_file_schema_values_map_onto_the_specs() -> None:
    links = {
        "node-400g-per8": {
            "name": "node-400g-per8",
            "kind": "ethernet",
            "latency_s": 1e-5,
            "bandwidth_bytes_per_s": 6.25e9,
        }
    }
    models = {"tiny": {"name": "Tiny", "hidden_size": 1024, "num_layers": 4,
                       "num_attention_heads": 8, "intermediate_size": 4096,
                       "vocab_size": 32000}}  # fmt: skip
    model, training, pool, mb, acc, nodes = point_specs(
        point(
            model="tiny",
            precision="float8",
            torch_compile=True,
            sharding="HSDP",
            inter_node_link="node-400g-per8",
            accumulation=3,
        ),
        models,
        links,
    )
    assert model.name == "Tiny" and (mb, acc, nodes) == (1, 3, 2)
    assert training.precision is Precision.FP8 and training.torch_compile
    assert training.sharding is Sharding.HSDP
    assert training.activation_checkpointing is ActivationCheckpointing.SELECTIVE_OP
    # a per-GPU link = one rail per GPU: 8 × 50 Gbit/s = 400 Gbit/s per node
    assert pool.node_network.node_bandwidth_bytes_per_s == pytest.approx(50e9)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"activation_checkpointing": "sometimes"}, "activation_checkpointing: unknown mode"),
        ({"precision": "int4"}, "precision"),
        ({"gpu": "a100", "precision": "fp8"}, "training.precision"),
        ({"other_parallelism": "TP2"}, "other_parallelism"),
        ({"model": "gpt-5"}, "unknown model"),
        ({"inter_node_link": "ib-xdr"}, "unknown inter_node_link"),
        ({"sharding": "ZeRO-1"}, "sharding"),
        ({"micro_batch": 0}, "must be ≥ 1"),
        ({"precision": "fp8", "float8_recipe": "rowwise"}, "float8_recipe: 'rowwise'"),
        ({"grad_reduce_dtype": "fp16x"}, "grad_reduce_dtype: unknown dtype"),
        ({"network": "9x-ndr"}, "network"),
    ],
)
def test_unknown_values_are_reported_per_point(change: dict[str, Any], message: str) -> None:
    report = evaluate({"points": [point(), point(id="bad", **change)]})
    assert len(report.predictions) == 1
    assert [s.id for s in report.skipped] == ["bad"] and message in report.skipped[0].reason


def test_bench_script_reads_a_file_and_fails_cleanly_on_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "points.json"
    path.write_text(json.dumps({"points": [point()]}))
    script = REPO / "benchmarks" / "bench_published.py"
    ok = subprocess.run(
        [sys.executable, str(script), "--file", str(path), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    (payload,) = json.loads(ok.stdout)
    assert payload["points"][0]["id"] == "p" and payload["points"][0]["gpu"] == "H100"
    assert payload["bias"] == pytest.approx(payload["points"][0]["ratio"] - 1)
    missing = subprocess.run(
        [sys.executable, str(script), "--file", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_gpu_overrides_and_power_cap_describe_the_hardware_as_it_ran() -> None:
    # e.g. torchtitan's H100 hosts: 96 GB HBM2e at 2.4 TB/s, run at a 500 W power limit
    gpu = {"preset": "h100", "name": "H100-96GB-HBM2e", "hbmBandwidthBytesPerS": "2.4 TB/s"}
    _, _, pool, *_ = point_specs(point(gpu=gpu, power_cap_watts=500), {}, {})
    assert pool.gpu.hbm_bandwidth_bytes_per_s == pytest.approx(2.4e12)
    assert pool.gpu.peak_bf16_flop_per_s == pytest.approx(989.4e12)
    assert pool.power_cap_watts == 500
    report = evaluate(
        {"points": [point(gpu=gpu, power_cap_watts=500), point(id="full-power", gpu=gpu)]}
    )
    capped, full = report.predictions
    assert capped.predicted_tokens_per_s_per_gpu < full.predicted_tokens_per_s_per_gpu


def test_optional_keys_of_the_validation_schema_map_onto_the_specs() -> None:
    _, training, pool, *_ = point_specs(
        point(
            network={"nics_per_node": 4, "nic_bandwidth_bytes_per_s": "100 Gbit/s"},
            activation_checkpointing="selective-layer",
            activation_checkpointing_every=3,
            grad_reduce_dtype="bf16",
            torch_compile=True,
            torch_compile_loss=False,
            precision="fp8",
            float8_recipe="tensorwise",
        ),
        {},
        {},
    )
    assert pool.node_network.node_bandwidth_bytes_per_s == pytest.approx(50e9)
    assert training.activation_checkpointing_every == 3 and training.grad_reduce_bytes == 2
    assert training.torch_compile and not training.torch_compile_loss


def test_summary_bias_is_the_median_signed_error() -> None:
    fast, slow, exact = (
        point(id="a", published_tokens_per_s_per_gpu=1.0),
        point(id="b", published_tokens_per_s_per_gpu=1e9),
        point(id="c"),
    )
    report = evaluate({"points": [fast, slow, exact]})
    errors = sorted(p.ratio - 1 for p in report.predictions)
    assert report.bias == pytest.approx(errors[1])
    assert report.max_error == pytest.approx(max(abs(e) for e in errors))
    assert set(report.by(lambda p: p.gpu_family)) == {"H100"}


VALIDATION = REPO / "benchmarks" / "data" / "published-validation.json"


def test_validation_points_cite_their_source_and_read_in_full() -> None:
    document = json.loads(VALIDATION.read_text())
    for p in document["points"]:
        src = p["source"]
        assert {"repo", "path", "commit", "url", "table"} <= set(src), p["id"]
        assert len(src["commit"]) == 40 and src["commit"] in src["url"], p["id"]
        assert p["notes"] and p["published_tokens_per_s_per_gpu"] > 0, p["id"]
    report = evaluate(document)
    inexpressible = {
        p["id"]
        for p in document["points"]
        if p.get("other_parallelism") or p.get("float8_recipe", "tensorwise") != "tensorwise"
    }
    assert {s.id for s in report.skipped} == inexpressible
    assert {p.gpu_family for p in report.predictions} == {"A100", "H100", "H200"}


SETUPS = REPO / "benchmarks" / "data" / "calibration-setups.json"


def test_setup_facts_only_add_what_a_published_file_leaves_out() -> None:
    fact = {"value": "triton-flash", "source": "a script's default", "points": ["a"]}
    document = {"points": [point(id="a"), point(id="b")]}
    merged = apply_setups(document, {"facts": {"attention_kernel": fact}})
    assert [p.get("attention_kernel") for p in merged["points"]] == ["triton-flash", None]
    assert "attention_kernel" not in document["points"][0]  # the input is left as it was
    slower, same = evaluate(merged).predictions
    assert slower.predicted_tokens_per_s_per_gpu < same.predicted_tokens_per_s_per_gpu
    stated = {"points": [point(id="a", attention_kernel="flash2")]}
    with pytest.raises(SpecError, match="already states attention_kernel"):
        apply_setups(stated, {"facts": {"attention_kernel": fact}})
    with pytest.raises(SpecError, match="'a' is not a point"):
        apply_setups({"points": [point(id="z")]}, {"facts": {"attention_kernel": fact}})
    with pytest.raises(SpecError, match="source"):
        apply_setups(document, {"facts": {"attention_kernel": {"value": 1, "points": ["a"]}}})


@pytest.mark.skipif(SHARED is None, reason="shared/calibration not beside this checkout")
def test_the_calibration_setups_name_points_of_the_shared_file() -> None:
    assert SHARED is not None
    setups = json.loads(SETUPS.read_text())
    assert setups["file"] == SHARED.name
    merged = apply_setups(json.loads(SHARED.read_text()), setups)
    report = evaluate(merged)
    assert report.skipped == [] and len(report.predictions) == 18


@pytest.mark.skipif(SHARED is None, reason="shared/calibration not beside this checkout")
def test_the_accuracy_tables_page_is_what_the_benchmark_prints(tmp_path: Path) -> None:
    page = tmp_path / "accuracy-tables.md"
    script = REPO / "benchmarks" / "bench_published.py"
    run = subprocess.run(
        [sys.executable, str(script), "--markdown", str(page)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    checked_in = REPO / "docs" / "accuracy-tables.md"
    assert page.read_text() == checked_in.read_text(), (
        "docs/accuracy-tables.md is stale: run python benchmarks/bench_published.py "
        "--markdown docs/accuracy-tables.md"
    )
