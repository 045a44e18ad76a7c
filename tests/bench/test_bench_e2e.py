"""The CPU quick run end to end: 12 small shapes and 2 Gloo ranks, and the coefficients it
writes drive ``shardmeter predict`` and ``shardmeter plan``. Its wall time (target ≤ 3 min)
is measured by ``benchmarks/bench_accuracy.py --quick``, not asserted here."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from scipy.stats import spearmanr

from shardmeter.cost.coefficients import COLLECTIVES, CoefficientsDocument, LinkRole, Source
from shardmeter.cost.features import Target, feature_values
from shardmeter.spec.model import MODEL_PRESETS, TransformerSpec
from shardmeter.spec.training import Precision

HANG_GUARD_S = 600


def _run(*argv: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=timeout,
    )


def _assert_fit_follows_the_samples(doc: CoefficientsDocument, target: Target) -> None:
    """The fitted model reproduces what was measured: it orders the shapes as the clock did
    (rank correlation) and its typical error is small. Both are read robustly (ranks and the
    median, not the mean) because a loaded host inflates a few samples even on the compute
    clock; the cross-validated MAPE (a mean) is reported by the fit, and the accuracy on
    unseen models is measured by ``benchmarks/bench_accuracy.py``."""
    fit = doc.compute[target]
    samples = [s for s in doc.samples.compute if s.target is target]
    measured = [s.seconds for s in samples]
    predicted = []
    for s in samples:
        values = feature_values(
            TransformerSpec(**s.model), s.micro_batch, s.seq_len, s.params_local
        )
        predicted.append(sum(c * values[f] for f, c in fit.coefficients.items()))
    errors = sorted(abs(p / m - 1) for p, m in zip(predicted, measured, strict=True))
    assert statistics.median(errors) < 0.15, errors
    # the shapes span ~two orders of magnitude: noise of tens of per cent cannot reorder them
    assert max(measured) > 10 * min(measured)
    assert spearmanr(predicted, measured).statistic > 0.9


@pytest.mark.slow
def test_cpu_quick_run_feeds_predict_and_plan(tmp_path: Path) -> None:
    out = tmp_path / "coefficients.json"
    quick = _run(
        "-m", "shardmeter_bench", "all", "--device", "cpu", "--scale", "small",
        "--configs", "12", "--ranks", "2", "--out", str(out), "--log-format", "json",
        cwd=tmp_path, timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert quick.returncode == 0, quick.stderr[-3000:]
    events = [json.loads(line)["event"] for line in quick.stderr.splitlines()]
    assert events.count("shape_done") == 12 and "coefficients_written" in events
    assert "block.forward" in quick.stdout and f"coefficients: {out}" in quick.stdout

    doc = CoefficientsDocument.read(out)
    assert doc.source is Source.MEASURED and doc.precision is Precision.FP32
    assert doc.gpu.name.startswith("cpu-") and doc.gpu.peak_fp32_flop_per_s > 1e9
    assert len({s.group for s in doc.samples.compute}) == 12
    for target in Target:  # every target measured and fitted, none left to priors
        fit = doc.compute[target]
        assert fit.n_samples >= 12 and fit.cv_mape is not None and fit.coefficients, target
        assert fit.leave_one_model_out_mape is not None
    _assert_fit_follows_the_samples(doc, Target.BLOCK_BACKWARD)
    # a sanity bound, not the accuracy figure (benchmarks/bench_accuracy.py measures that):
    # CPU timings on a machine loaded by other work scatter (0.31 seen at load ≈ 4), a fit in
    # the wrong units or of the wrong terms is off by far more
    assert doc.compute[Target.BLOCK_BACKWARD].cv_mape < 0.5
    for collective in COLLECTIVES:
        fit = doc.communication[LinkRole.INTRA_NODE][collective]
        assert fit.n_samples == 5 and fit.link == "gloo-loopback" and fit.seconds_per_byte > 0
        assert doc.communication[LinkRole.INTER_NODE][collective].n_samples == 0  # one node
    assert not any(n.startswith("compute.") for n in doc.notes)  # no compute priors
    assert doc.samples.memory and doc.memory.activation_scale != 1.0  # calibrated

    predict = _run(
        "-m", "shardmeter.cli.main", "predict", "--model", "smollm-360m", "--coefficients",
        str(out), "--gpus-per-node", "2", "--seq-len", "128", "--micro-batch", "2", "--json",
        cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert predict.returncode == 0, predict.stderr
    p = json.loads(predict.stdout)
    assert p["gpu"] == doc.gpu.name and p["coefficients_source"] == "measured"
    assert p["precision"] == "fp32" and p["island"]["ranks"] == 2
    spec = MODEL_PRESETS["smollm-360m"]
    values = feature_values(spec, 2, 128)
    by_hand = sum(c * values[f] for f, c in doc.compute[Target.BLOCK_FORWARD].coefficients.items())
    if "block.forward" not in p["roofline_clamped"]:
        assert p["units"]["block"]["forward_s"] == pytest.approx(by_hand)
    assert p["collectives"]["link"] == "gloo-loopback"

    plan_file = tmp_path / "plans" / "cpu.yaml"
    plan_file.parent.mkdir()
    plan = {
        "model": "smollm-360m",
        "training": {
            "seqLenTokens": 128,
            "globalBatchTokens": 128 * 16,
            "totalTokens": 10**7,
            "precision": "fp32",
        },
        "strategy": {"kind": "fsdp"},
        "pools": [
            {
                "name": "cpu-pool",
                "gpu": doc.gpu.model_dump(mode="json"),
                "nodes": 2,
                "gpusPerNode": 2,
                "coefficients": "../coefficients.json",  # relative to the plan file
                "pricePerGpuHourUsd": 0.05,
            }
        ],
        "constraints": {"maxIslands": 1},
    }
    plan_file.write_text(yaml.safe_dump(plan))
    planned = _run(
        "-m", "shardmeter.cli.main", "plan", str(plan_file), "--json", "--no-files",
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    result = json.loads(planned.stdout)
    assert result["coefficients"] == {"cpu-pool": "measured"}
    chosen = result["chosen"]
    assert chosen["groups"][0]["gpu"] == doc.gpu.name and chosen["step_s"] > 0
    assert chosen["global_batch_tokens"] >= 128 * 16


@pytest.mark.slow
def test_two_node_torchrun_launch_as_the_operator_starts_it(tmp_path: Path) -> None:
    """The Indexed Job's launch, one pod per node: ``torchrun --nnodes=2 --node-rank=i
    --master-addr --master-port -m shardmeter_bench all``. The ranks split the catalog, meet
    across "nodes" for the collectives (the inter-node fit) and rank 0 writes one document."""
    from shardmeter_bench.collectives.distributed import free_port

    out = tmp_path / "coefficients.json"
    port = free_port()

    def node(rank: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
             f"--node-rank={rank}", "--master-addr=127.0.0.1", f"--master-port={port}",
             "-m", "shardmeter_bench", "all", "--device", "cpu", "--scale", "small",
             "--configs", "2", "--out", str(out), "--log-format", "json", "--timeout", "120"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    procs = [node(0), node(1)]
    results = [proc.communicate(timeout=HANG_GUARD_S) for proc in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err[-3000:]
    assert f"coefficients: {out}" in results[0][0] and "coefficients:" not in results[1][0]
    doc = CoefficientsDocument.read(out)
    assert len({s.group for s in doc.samples.compute}) == 2  # one shape per rank, gathered
    for collective in COLLECTIVES:
        inter = doc.communication[LinkRole.INTER_NODE][collective]
        assert inter.n_samples > 0 and inter.seconds_per_byte > 0
        assert doc.communication[LinkRole.INTRA_NODE][collective].n_samples == 0  # 1 GPU/node


@pytest.mark.slow
def test_validate_quick_run_measures_unseen_architectures_between_catalog_shapes(
    tmp_path: Path,
) -> None:
    """``validate --scale small``: every validation model (the unseen Llama architectures,
    then the presets) is measured twice between the catalog's shapes — the events say so, in
    that order — none of them is a catalog architecture, and the report carries every
    (model, size) point with its median and maximum error."""
    from shardmeter_bench.compute.catalog import architecture_key
    from shardmeter_bench.validation.measure import validation_cases
    from shardmeter_bench.validation.unseen import unseen_cases

    run = _run(
        "-m", "shardmeter_bench", "validate", "--device", "cpu", "--scale", "small",
        "--configs", "6", "--ranks", "2", "--out", str(tmp_path / "c.json"),
        "--report-dir", str(tmp_path / "report"), "--log-format", "json",
        cwd=tmp_path, timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    events = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    order = [e["event"] for e in events if e["event"] in ("shape_done", "model_validated")]
    unseen = unseen_cases("small")
    cases = unseen + validation_cases("small", "cpu")
    # 6 shapes, 6 models × 2 passes: two models after every shape, all before the fit
    assert order == ["shape_done", "model_validated", "model_validated"] * 6
    names = [e["model"] for e in events if e["event"] == "model_validated"]
    assert names == [c.key for c in cases] * 2

    report = json.loads((tmp_path / "report" / "validation.json").read_text())
    assert report["meta"]["interleaved"] is True and report["meta"]["passes"] == 2
    points = report["unseen"]["points"]
    assert [(p["model"], p["micro_batch"], p["seq_len"]) for p in points] == [
        (c.key, b, s) for c in unseen for b, s in c.sizes
    ]
    errors = [p["fwd_error"] for p in points]
    assert report["unseen"]["fwd_max"] == max(errors)
    assert min(errors) <= report["unseen"]["fwd_median"]
    assert all(p["fwd_measured_s"] > 0 and p["bwd_measured_s"] > 0 for p in points)
    assert [m["key"] for m in report["models"]] == [c.key for c in validation_cases("small", "cpu")]
    doc = CoefficientsDocument.read(tmp_path / "c.json")
    seen = {architecture_key(TransformerSpec.model_validate(s.model)) for s in doc.samples.compute}
    assert not seen & {architecture_key(c.spec) for c in cases}
    assert "| unseen, 6 points | median | max |" in run.stdout
