"""``shardmeter simulate``: outputs from the cost model and from a durations file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardmeter.cli.main import main

BASE = ["simulate", "--model", "llama-3.2-1b", "--gpu", "a100", "--seq-len", "4096"]


def test_fsdp_step_with_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, png, sweep = tmp_path / "t.json", tmp_path / "t.png", tmp_path / "s.png"
    assert (
        main(
            [
                *BASE,
                "--accumulation",
                "2",
                "--trace",
                str(trace),
                "--png",
                str(png),
                "--sweep-png",
                str(sweep),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    step = out["step"]
    assert step["bottleneck"] in {"compute-bound", "communication-bound"}
    assert 0 < step["mfu"] < 1 and step["tokens_per_step"] == 2 * 8 * 4096
    assert "waiting on" in step["evidence"]
    assert json.loads(trace.read_text())["traceEvents"]
    for p in (png, sweep):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_streaming_diloco_over_wan(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                *BASE,
                "--activation-checkpointing",
                "--micro-batch",  # an inner step long enough to hide the embedding's fragment
                "2",  # within the default fragmentSyncDelay guard-rail of 5
                "--strategy",
                "streaming-diloco",
                "--islands",
                "3",
                "--outer-link",
                "wan-10g-30ms",
                "--json",
            ]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)["diloco"]
    assert d["outer_link"].startswith("WAN") and d["zero_blocking_possible"]
    assert d["blocking_s_per_outer_step"] == 0.0 and d["sync_every"] % d["fragments"] == 0
    assert d["fragment_sync_delay"] < d["sync_every"] // d["fragments"]
    assert d["fragment_sync_delay"] <= 5 and d["sync_every"] <= 500


def test_pinned_fragments_with_auto_sync_every(capsys: pytest.CaptureFixture[str]) -> None:
    """``--fragments 3`` alone: auto picks a syncEvery that is a multiple of 3 (torchft's
    rule); none of the round candidates 10, 20, 50, … is, and this used to exit 2."""
    args = [*BASE, "--strategy", "streaming-diloco", "--islands", "2", "--fragments", "3"]
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["diloco"]
    assert d["fragments"] == 3 and d["sync_every"] % 3 == 0 and d["sync_every"] <= 500
    assert d["fragment_sync_delay"] < d["sync_every"] // 3


def test_fixed_settings_that_block_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                *BASE,
                "--strategy",
                "streaming-diloco",
                "--islands",
                "2",
                "--outer-link",
                "wan-1g-80ms",
                "--sync-every",
                "20",
                "--fragments",
                "2",
                "--fragment-sync-delay",
                "0",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "blocking per outer step" in out and "recommended instead" in out


def test_durations_file_what_if(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "d.yaml"
    f.write_text(
        "units:\n  - {name: A, forward_s: 2, backward_s: 4, all_gather_s: 1, reduce_scatter_s: 1}\n"
        "  - {name: B, forward_s: 2, backward_s: 4, all_gather_s: 1, reduce_scatter_s: 1}\n"
        "optimizer_s: 1\n"
        "diloco: {islands: 2, sync_every: 4, fragments: 2, fragment_sync_delay: 1, all_reduce_s: 20}\n"
    )
    assert main(["simulate", "--durations", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step"]["step_s"] == 15.0  # the hand-worked golden step
    assert out["diloco"]["blocking_s_per_outer_step"] == pytest.approx(2 * (20 - 15))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [*BASE, "--strategy", "streaming-diloco", "--sync-every", "10", "--fragments", "3"],
            "--sync-every: syncEvery (10) must be a multiple of fragments (3)",
        ),
        ([*BASE, "--sync-every", "x"], "--sync-every: must be 'auto' or a whole number"),
        ([*BASE, "--accumulation", "0"], "--accumulation: must be between 1 and 65,536 (got 0)"),
        (["simulate", "--durations", "/nonexistent.yaml"], "cannot read file"),
        ([*BASE, "--strategy", "diloco", "--outer-link", "wan-5g"], "unknown link preset"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "shardmeter.cli.main", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_simulate_is_short_by_default_and_details_add_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Streaming DiLoCo over a fabric that hides it: the default text has the busy times, the
    longest fragment all_reduce and the quality's figures; --details adds the idle time, each
    fragment's all_reduce, the quality's basis and why these settings."""
    args = [*BASE, "--strategy", "streaming-diloco", "--islands", "4"]
    args += ["--total-tokens", "25000000000"]
    assert main(args) == 0
    short = capsys.readouterr().out
    assert main([*args, "--details"]) == 0
    full = capsys.readouterr().out
    for text in ("compute idle: ", "  basis: ", "hides behind"):
        assert text not in short and text in full, text
    assert "fragment all_reduce: up to " in short and "--details lists each" in short
    assert "quality: eval loss" in short and "compute busy" in short


def test_simulate_always_says_what_would_hide_blocking(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [*BASE, "--strategy", "diloco", "--islands", "4", "--outer-link", "wan-1g-80ms"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "blocking per outer step 0;" not in out and "no zero-blocking settings" in out
