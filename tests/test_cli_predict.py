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
            "argument --micro-batch: must be between 1 and 1,048,576 (got 0)",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "h200", "--coefficients", "/nonexistent.json"],
            "cannot read",
        ),
        (
            ["--model", "llama-3.1-8b", "--gpu", "h200", "--seq-len", "x"],
            "argument --seq-len: must be a whole number between 1 and 1,048,576 (got 'x')",
        ),
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


BASE = ["--model", "llama-3.1-8b", "--gpu", "h100", "--nodes", "2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--network", '{"nicsPerNode": 0, "nicBandwidthBytesPerS": 5e10}'],
            "--network.nicsPerNode",
        ),
        (
            ["--network", '{"nicsPerNode": -2, "nicBandwidthBytesPerS": 5e10}'],
            "--network.nicsPerNode",
        ),
        (
            ["--network", '{"nicsPerNode": 8, "nicBandwidthBytesPerS": NaN}'],
            "nicBandwidthBytesPerS",
        ),
        (
            ["--network", '{"nicsPerNode": 8, "nicBandwidthBytesPerS": "inf Gbit/s"}'],
            "nicBandwidthBytesPerS",
        ),
        (["--network", '{"nicsPerNode": 8, "nicBandwidthBytesPerS": 5e10, "kind": "wan"}'], "kind"),
        (["--network", "9x-xdr"], "unknown network preset '9x-xdr'"),
        (["--network", "8x-ndr", "--inter-node-link", "ib-ndr"], "not both"),
        (["--activation-checkpointing", "sometimes"], "--activation-checkpointing"),
        (["--gradient-sync", "never"], "--gradient-sync"),
        (["--sharding", "zero3"], "--sharding"),
        (["--precision", "int4"], "--precision"),
        (["--power-cap-watts", "900"], "powerCapWatts"),
        (["--power-cap-watts", "nan"], "--power-cap-watts"),
        (["--accumulation", "0"], "--accumulation"),
    ],
)
def test_bad_topology_and_options_exit_2_naming_the_field(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["predict", *BASE, *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_float8_on_a100_is_an_error_naming_precision(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "--model", "llama-3.1-8b", "--gpu", "a100", "--precision", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "--precision: fp8" in err and "H100" in err and "A100-80GB-SXM" in err


def test_new_options_show_in_the_prediction(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "predict", *BASE, "--seq-len", "8192", "--network", "8x-ndr", "--torch-compile",
        "--activation-checkpointing", "selective-op", "--accumulation", "2",
        "--gradient-sync", "last-micro-batch", "--power-cap-watts", "500", "--json",
    ]  # fmt: skip
    assert main(args) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["activation_checkpointing"] == "selective-op" and p["torch_compile"] is True
    assert p["gradient_sync"] == "last-micro-batch" and p["memory"]["accumulation_bytes"] > 0
    assert p["collectives"]["network"]["nics_per_node"] == 8 and 0 < p["clock_fraction"] < 1
    assert p["step"]["tokens_per_s_per_gpu"] > 0 and p["step"]["bottleneck"].endswith("bound")
    # the old flag alone still means full checkpointing
    assert main(["predict", *BASE, "--activation-checkpointing", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["activation_checkpointing"] == "full"
