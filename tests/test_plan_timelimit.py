"""A time limit returns the best plan found with a proven gap (the gap's bound holds against
the true optimum), and long searches report progress: a bar on a terminal, JSON lines in
logs."""

from __future__ import annotations

import io
import json

import pytest

from shardmeter.cli.plan import JsonProgress
from shardmeter.plan.bnb import Progress
from shardmeter.plan.result import build_result
from shardmeter.plan.schema import PlanSpec
from shardmeter.plan.search import search

GPUS = ["h100", "a100", "l40s", "h200"]


def six_pools(objective: dict[str, object]) -> PlanSpec:
    """Too many layouts to score them all (about 3·10¹⁰): branch and bound."""
    return PlanSpec.model_validate(
        {
            "model": "llama-3.2-1b",
            "training": {
                "seqLenTokens": 4096,
                "globalBatchTokens": 4096 * 256,
                "totalTokens": 10**10,
            },
            "pools": [
                {
                    "name": f"p{i}",
                    "gpu": GPUS[i % 4],
                    "nodes": 8,
                    "gpusPerNode": 8,
                    "site": f"s{i % 2}",
                    "wanUplink": "wan-10g-30ms",
                    "pricePerGpuHourUsd": 1 + 0.3 * i,
                }
                for i in range(6)
            ],
            "constraints": {"maxIslands": 8},
            "objective": objective,
        }
    )


@pytest.mark.parametrize("objective", [{"kind": "min-time"}, {"kind": "min-cost"}])
def test_time_limit_returns_the_best_found_with_a_valid_gap(objective: dict[str, object]) -> None:
    spec = six_pools(objective)
    full = search(spec)
    assert full.stats.mode == "objective" and full.stats.proven and full.stats.gap is None
    cut = search(spec, time_limit_s=1e-6)
    assert not cut.stats.proven
    assert cut.stats.gap is not None and 0 <= cut.stats.gap < 1
    p = cut.stats.passes[-1]
    assert not p.completed and p.bound <= p.best
    optimum = full.stats.passes[-1].best
    assert p.bound <= optimum * (1 + 1e-12) <= p.best * (1 + 1e-12)
    result = build_result(cut)
    assert any("time limit reached" in n for n in cut.notes)
    assert result.chosen.islands <= 8


def test_json_progress_lines_only_after_two_seconds() -> None:
    stream = io.StringIO()
    report = JsonProgress(stream)
    report(Progress("fastest plan", 0.1, 100, 0.5, 10.0, 9.0))
    assert stream.getvalue() == ""
    report(Progress("fastest plan", 0.4, 5000, 2.5, 10.0, 9.0))
    report(Progress("fastest plan", 0.5, 6000, 3.0, 10.0, 9.5))  # within 2 s of the last line
    report(Progress("fastest plan", 0.9, 9000, 4.6, 9.8, 9.7))
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert [x["plans_scored"] for x in lines] == [5000, 9000]
    assert lines[0]["event"] == "plan.search.progress"
    assert lines[0]["gap"] == pytest.approx(0.1)
    assert lines[1]["fraction"] == 0.9
