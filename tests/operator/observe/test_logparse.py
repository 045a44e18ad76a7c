"""The rank-0 log parser and the island observation, on lines the runtimes print themselves:
torchtitan's own ``MetricsProcessor.log`` (colours, rounding, ``N/A``), and the real output of
the launch end-to-end run (``tests/fixtures/observe``, captured from ``test_launch_e2e.py``:
torchtitan's metric lines, torchft's fragment syncs and quorums), held against the stand-in
trainer's own timer in the same log."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launch_local import torchtitan_pythonpath
from shardmeter_operator.api.observation import ObserveReason
from shardmeter_operator.observe.logparse import parse_log
from shardmeter_operator.observe.summary import MIN_INTERVALS, IslandFacts, percentile, summarize

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "observe"
E2E_TOKENS_PER_STEP = 2 * 2 * 64  # micro-batch × accumulation × sequence (test_launch_e2e)
E2E_STEPS, E2E_FRAGMENTS = 12, 2
TIMESTAMP_S = 0.002  # the asctime's millisecond, on both ends of an interval


def torchtitan_lines(cases: list[dict[str, Any]]) -> list[str]:
    """torchtitan's metric lines for ``cases`` (see ``launch_local.metric_lines``)."""
    done = subprocess.run(
        [sys.executable, "-m", "launch_local.metric_lines"],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": torchtitan_pythonpath(), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    return [line for line in done.stdout.splitlines() if line.startswith("[titan]")]


def island_lines(text: str) -> dict[int, dict[str, str]]:
    """The stand-in's ``step_end`` lines by step."""
    out = {}
    for line in text.splitlines():
        if line.startswith("[island] event=step_end"):
            kv = dict(p.split("=", 1) for p in line.split()[1:])
            out[int(kv["step"])] = kv
    return out


CASES = [
    {"step": 10, "loss": 7.7489, "grad_norm": 1.74, "tokens": 81920, "seconds": 2.0,
     "flops_per_token": 6e9, "quantized": False, "color": True},
    {"step": 1230, "loss": 2.5, "grad_norm": 0.31, "tokens": 12_345_678, "seconds": 3.5,
     "flops_per_token": 5.2e10, "quantized": True, "color": False},
    {"step": 7, "loss": float("nan"), "grad_norm": float("inf"), "tokens": 4096, "seconds": 0.25,
     "flops_per_token": 1e9, "quantized": False, "color": True},
]  # fmt: skip


@pytest.mark.slow
def test_reads_torchtitans_own_metric_lines() -> None:
    lines = torchtitan_lines(CASES)
    assert len(lines) == len(CASES), lines
    assert "\x1b[" in lines[0] and "\x1b[" not in lines[1]  # colours on, off
    parsed = parse_log("\n".join(lines)).metrics
    # steps go back between the cases (10, 1230, 7): a restart; the last process stays
    assert [m.step for m in parsed] == [7]
    for case, line in zip(CASES, lines, strict=True):
        (m,) = parse_log(line).metrics
        assert m.step == case["step"]
        tps = case["tokens"] / case["seconds"]
        assert abs(m.tokens_per_s_per_device - tps) <= 1 + 1e-3 * tps  # round(tps), comma'd
        if case["quantized"]:
            assert m.mfu_percent is None  # torchtitan prints "mfu: N/A"
        else:
            expected = 100 * case["flops_per_token"] * tps / 989e12
            assert m.mfu_percent == pytest.approx(expected, abs=0.01 + 1e-3 * expected)
        if math.isnan(case["loss"]):
            assert math.isnan(m.loss)
        else:
            assert m.loss == pytest.approx(case["loss"], abs=1e-5)
        assert m.memory_gib == pytest.approx(12.25)


@pytest.mark.parametrize("island", [0, 1])
def test_e2e_logs_parse_against_the_trainers_own_timer(island: int) -> None:
    text = (FIXTURES / f"e2e-island-{island}.log").read_text()
    parsed = parse_log(text)
    truth = island_lines(text)
    assert parsed.unparsed == 0 and parsed.processes == 1
    assert [m.step for m in parsed.metrics] == list(range(1, E2E_STEPS + 1))
    # each line's interval (one step at log_freq 1), from torchtitan's tps, is the step the
    # trainer timed itself (tps is rounded to an integer, the timer excludes the logging)
    for m in parsed.metrics[1:]:
        from_tps = E2E_TOKENS_PER_STEP / m.tokens_per_s_per_device
        timed = float(truth[m.step]["step_s"])
        assert from_tps == pytest.approx(timed, rel=2e-3, abs=1e-3), m.step
    # torchft synced fragment 0, 1, 0, 1, … once per H/F = 2 steps, every sync committed
    assert [s.fragment for s in parsed.syncs] == [0, 1] * (E2E_STEPS // 4)
    assert [s.manager_step for s in parsed.syncs] == list(range(E2E_STEPS // 2))
    assert all(s.committed for s in parsed.syncs)
    for s in parsed.syncs:  # prepared (delay 1) one step before it synced, then committed
        assert s.prepared_at_s is not None and s.committed_at_s is not None
        assert s.prepared_at_s <= s.synced_at_s <= s.committed_at_s
    assert len(parsed.quorums) == E2E_STEPS // 2  # one quorum per fragment sync


@pytest.mark.parametrize("island", [0, 1])
def test_e2e_observation_is_bracketed_by_the_trainers_timer(island: int) -> None:
    text = (FIXTURES / f"e2e-island-{island}.log").read_text()
    truth = island_lines(text)
    facts = IslandFacts(E2E_TOKENS_PER_STEP, 1, E2E_FRAGMENTS, 0.05)
    obs = summarize(parse_log(text), facts, "2026-12-01T00:00:00Z")
    assert obs.reason == ObserveReason.OBSERVED, obs.message
    steps = range(2, E2E_STEPS + 1)  # step 1's interval is start-up: never used
    assert (obs.first_step, obs.last_step, obs.steps) == (1, E2E_STEPS, len(steps))
    step_s = [float(truth[n]["step_s"]) for n in steps]
    outside_optimizer = [float(truth[n]["step_s"]) - float(truth[n]["optimizer_s"]) for n in steps]
    # the effective step is the trainer's mean step; the inner step lies between the step
    # without anything inside optimizer.step() (AdamW + DiLoCo's hooks) and the whole step
    assert obs.effective_step_seconds == pytest.approx(statistics.fmean(step_s), rel=3e-3)
    assert obs.step_seconds_p50 is not None and obs.step_seconds_p90 is not None
    low = statistics.median(outside_optimizer) - TIMESTAMP_S
    high = statistics.median(step_s) + TIMESTAMP_S
    assert low <= obs.step_seconds_p50 <= high
    assert obs.step_seconds_p50 <= obs.step_seconds_p90 <= max(step_s) + TIMESTAMP_S
    assert obs.tokens_per_second == pytest.approx(
        E2E_TOKENS_PER_STEP / statistics.fmean(step_s), rel=3e-3
    )
    # the stalls are part of optimizer.step() (where DiLoCo's hooks wait)
    assert obs.fragment_syncs == 6 and obs.sync_stall_seconds is not None
    assert obs.sync_stall_seconds <= max(float(truth[n]["optimizer_s"]) for n in steps) + 0.002
    assert obs.outer_step_blocking_seconds == pytest.approx(
        obs.sync_stall_seconds * E2E_FRAGMENTS, abs=2e-6
    )
    assert obs.error_ratio == pytest.approx(obs.step_seconds_p50 / 0.05 - 1, abs=1e-5)


def test_torchrun_rank_prefixes_keep_local_rank_zero() -> None:
    text = (FIXTURES / "e2e-island-0.log").read_text()
    other = text.replace("tps: ", "tps: 9")  # another rank with other numbers
    prefixed = "\n".join(
        [f"[default0]:{line}" for line in text.splitlines()]
        + [f"[default1]:{line}" for line in other.splitlines()]
        + ["I1201 torchrun: Starting elastic_operator"]
    )
    a, b = parse_log(text), parse_log(prefixed)
    assert [m.tokens_per_s_per_device for m in b.metrics] == [
        m.tokens_per_s_per_device for m in a.metrics
    ]
    assert len(b.syncs) == len(a.syncs)


def test_unprefixed_ranks_count_each_event_once() -> None:
    text = (FIXTURES / "e2e-island-0.log").read_text()
    doubled = "\n".join(line for line in text.splitlines() for _ in range(2))
    a, b = parse_log(text), parse_log(doubled)
    assert [m.step for m in b.metrics] == [m.step for m in a.metrics]
    assert [(s.fragment, s.manager_step) for s in b.syncs] == [
        (s.fragment, s.manager_step) for s in a.syncs
    ]


def test_bad_lines_give_no_observation_and_no_number() -> None:
    facts = IslandFacts(256, 1, 2, 0.05)
    at = "2026-12-01T00:00:00Z"
    garbage = (
        "\x00\xff not a log\n[titan] 2026-12-01 02:30:14,024 - root - INFO - step: x loss: y\n"
    )
    obs = summarize(parse_log(garbage), facts, at)
    assert obs.reason == ObserveReason.UNPARSABLE and obs.step_seconds_p50 is None
    obs = summarize(parse_log("hello\nworld\n"), facts, at)
    assert obs.reason == ObserveReason.NO_METRIC_LINES and obs.tokens_per_second is None
    text = (FIXTURES / "e2e-island-0.log").read_text()
    metric_lines = [i for i, line in enumerate(text.splitlines()) if "tps:" in line]
    early = "\n".join(text.splitlines()[: metric_lines[MIN_INTERVALS - 1] + 1])
    obs = summarize(parse_log(early), facts, at, restarts=1)
    assert obs.reason == ObserveReason.POD_RESTARTED and obs.step_seconds_p50 is None
    assert "restarted 1 time" in obs.message
    # a process restart inside the log: only the new process's lines count
    restarted = text + "\n" + early
    parsed = parse_log(restarted)
    assert parsed.processes == 2 and len(parsed.metrics) == MIN_INTERVALS
    assert summarize(parsed, facts, at).reason == ObserveReason.NOT_ENOUGH_STEPS


def test_percentile_is_numpys_linear() -> None:
    import numpy as np

    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4]
    for q in (0.0, 0.5, 0.9, 1.0):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q * 100)))
