"""``shardmeter predict``: the documented command works; bad input exits 2 with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardmeter.cli.main import main
from shardmeter.cost.priors import prior_coefficients
from shardmeter.spec.hardware import GPU_PRESETS, LINK_PRESETS

ISSUE_COMMAND = [
    "predict",
    "--model",
    "llama-3.1-8b",
    "--gpu",
    "h200-141gb-sxm",
    "--seq-len",
    "8192",
    "--micro-batch",
    "1",
    "--nodes",
    "1",
    "--gpus-per-node",
    "8",
]


def test_issue_command_prints_a_table_with_mfu_in_unit_interval(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(ISSUE_COMMAND) == 0
    out = capsys.readouterr().out
    assert "block ×32" in out and "max micro-batch" in out and "MFU" in out
    assert main([*ISSUE_COMMAND, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert 0 < payload["mfu_compute_only"] < 1
    assert payload["coefficients_source"] == "prior"
    assert payload["memory"]["fits"] and payload["memory"]["max_micro_batch"] >= 1


def test_console_script_entry_point_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "shardmeter.cli.main", *ISSUE_COMMAND, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["island"]["ranks"] == 8


def test_coefficients_file_supplies_the_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = prior_coefficients(GPU_PRESETS["l40s"], LINK_PRESETS["pcie4"], LINK_PRESETS["eth-100g"])
    path = doc.write(tmp_path / "l40s.json")
    assert (
        main(
            [
                "predict",
                "--model",
                "smollm-360m",
                "--coefficients",
                str(path),
                "--gpus-per-node",
                "4",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["gpu"] == "L40S"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--model", "llama-3.1-8bb", "--gpu", "h200"],
            "--model: unknown model preset 'llama-3.1-8bb'",
        ),
        (["--model", "llama-3.1-8b", "--gpu", "b200"], "--gpu: unknown GPU preset 'b200'"),
        (["--model", "llama-3.1-8b"], "--gpu: is required"),
        (
            ["--model", "llama-3.1-8b", "--gpu", "h200", "--micro-batch", "0"],
            "--micro-batch: must be ≥ 1",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "h200", "--coefficients", "/nonexistent.json"],
            "cannot read",
        ),
        (["--model", "llama-3.1-8b", "--gpu", "h200", "--seq-len", "x"], "invalid int value"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "shardmeter.cli.main", "predict", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
