"""``shardmeter plan``: the case study end to end, machine output, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shardmeter.cli.main import main

REPO = Path(__file__).resolve().parents[1]
CASE = REPO / "examples" / "case-study.yaml"


def test_case_study_writes_pictures_and_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(CASE), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Pareto frontier" in out and "chosen (throughput-fraction 0.99)" in out
    assert "datasheet priors" in out
    for name in ("frontier.png", "top20.png", "timeline.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {
        "inner_step",
        "outer_all_reduce",
    }


def test_case_study_json_is_consistent(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(CASE), "--json", "--no-files"]) == 0
    data = json.loads(capsys.readouterr().out)
    chosen, fastest = data["chosen"], data["fastest"]
    assert chosen["islands"] <= 10
    assert chosen["tokens_per_s"] >= 0.99 * fastest["tokens_per_s"] * (1 - 1e-12)
    assert chosen["cost_usd"] <= fastest["cost_usd"]
    assert data["saving_vs_fastest"] == pytest.approx(1 - chosen["cost_usd"] / fastest["cost_usd"])
    assert chosen["sync_every"] % chosen["fragments"] == 0
    assert chosen["fragment_sync_delay"] < chosen["sync_every"] // chosen["fragments"]
    assert (
        sum(g["count"] * g["local_batch_tokens"] for g in chosen["groups"])
        == chosen["global_batch_tokens"]
    )
    assert chosen["global_batch_tokens"] >= 2_097_152
    times = [p["hours"] for p in data["frontier"]]
    costs = [p["cost_usd"] for p in data["frontier"]]
    assert times == sorted(times) and costs == sorted(costs, reverse=True)
    assert data["coefficients"] == {"cluster-a": "prior", "cluster-b": "prior"}
    assert len(data["top_by_throughput"]) == 20


def test_training_plan_manifest_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = yaml.safe_load(CASE.read_text())
    manifest = {
        "apiVersion": "shardmeter.io/v1alpha1",
        "kind": "TrainingPlan",
        "metadata": {"name": "x"},
        "spec": {**spec, "launch": False, "template": {"spec": {}}},
    }
    f = tmp_path / "tp.yaml"
    f.write_text(yaml.safe_dump(manifest))
    assert main(["plan", str(f), "--json", "--no-files"]) == 0
    assert json.loads(capsys.readouterr().out)["chosen"]["islands"] >= 1


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"model": "llama-9b"}, "unknown model preset 'llama-9b'"),
        (
            {"training": {"seqLenTokens": 8192, "globalBatchTokens": 1000}},
            "must be a multiple of seqLenTokens",
        ),
        (
            {"strategy": {"kind": "streaming-diloco", "syncEvery": 10, "fragments": 3}},
            "multiple of fragments",
        ),
        ({"constraints": {"allowedPools": ["nope"]}}, "allowedPools names unknown pool 'nope'"),
        ({"pools": []}, "pools"),
        ({"colour": "blue"}, "colour: unknown field"),
    ],
)
def test_bad_plan_files_exit_2_with_one_line(tmp_path: Path, patch: dict, message: str) -> None:
    spec = {**yaml.safe_load(CASE.read_text()), **patch}
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [sys.executable, "-m", "shardmeter.cli.main", "plan", str(f), "--no-files"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_infeasible_plan_exits_2_naming_the_constraint(tmp_path: Path) -> None:
    spec = {
        **yaml.safe_load(CASE.read_text()),
        "model": "llama-3.1-70b",
        "constraints": {"maxIslands": 10, "maxGpusPerIsland": 2},
    }
    f = tmp_path / "big.yaml"
    f.write_text(yaml.safe_dump(spec))
    result = subprocess.run(
        [sys.executable, "-m", "shardmeter.cli.main", "plan", str(f), "--no-files"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "per island for memory; constraints.maxGpusPerIsland is 2" in result.stderr


def test_time_limit_flag_reports_the_gap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = ["h100", "a100", "l40s", "h200"]
    spec = {
        "model": "llama-3.2-1b",
        "training": {"seqLenTokens": 4096, "globalBatchTokens": 4096 * 256},
        "pools": [
            {
                "name": f"p{i}",
                "gpu": gpus[i % 4],
                "nodes": 8,
                "gpusPerNode": 8,
                "site": f"s{i % 2}",
                "wanUplink": "wan-10g-30ms",
                "pricePerGpuHourUsd": 1 + 0.3 * i,
            }
            for i in range(6)
        ],
        "constraints": {"maxIslands": 8},
        "objective": {"kind": "min-time"},
    }
    f = tmp_path / "six.yaml"
    f.write_text(yaml.safe_dump(spec))
    assert main(["plan", str(f), "--json", "--no-files", "--time-limit", "0.000001"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["search"]["mode"] == "objective"
    assert data["search"]["proven_optimal"] is False
    # a microsecond ends the build: no gap is claimed over the shapes never simulated
    assert data["search"]["gap"] is None and data["search"]["shapes_not_simulated"] > 0
    assert data["runtime"] == "torchtitan-ft"
    assert main(["plan", str(f), "--no-files", "--time-limit", "0"]) == 2
    assert (
        "argument --time-limit: must be > 0 and ≤ 604800 seconds (got 0)" in capsys.readouterr().err
    )


def test_a_plan_without_a_token_budget_says_it_is_priced_for_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hours, cost and DiLoCo's quality price depend on the run's tokens: a plan file that
    leaves ``training.totalTokens`` out is planned for the default and says so; one that sets
    it does not."""
    plan = yaml.safe_load(CASE.read_text())
    del plan["training"]["totalTokens"]
    path = tmp_path / "no-budget.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["plan", str(path), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("training.totalTokens not given" in n and "1,000,000,000" in n for n in notes)
    assert main(["plan", str(CASE), "--json"]) == 0
    assert not any("totalTokens" in n for n in json.loads(capsys.readouterr().out)["notes"])
