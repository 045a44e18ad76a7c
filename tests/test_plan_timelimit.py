"""A time limit returns the best plan found with a proven gap (the gap's bound holds against
the true optimum), and long searches report progress: a bar on a terminal, JSON lines in
logs."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest

from shardmeter.cli.plan import JsonProgress
from shardmeter.plan import search as search_module
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


class BuildClock:
    """The clock `shardmeter.plan.search` reads, stopped long ago: building the search space
    never reaches its deadline, while branch and bound (the real clock) is past it."""

    perf_counter = staticmethod(time.perf_counter)
    stopped_at = time.monotonic() - 10**6

    @classmethod
    def monotonic(cls) -> float:
        return cls.stopped_at


@pytest.mark.parametrize("objective", [{"kind": "min-time"}, {"kind": "min-cost"}])
def test_time_limit_returns_the_best_found_with_a_valid_gap(
    objective: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = six_pools(objective)
    full = search(spec)
    assert full.stats.mode == "objective" and full.stats.proven and full.stats.gap is None
    monkeypatch.setattr(search_module, "time", BuildClock)
    cut = search(spec, time_limit_s=1.0)
    assert cut.stats.shapes_left == 0  # the whole space, the search cut
    assert not cut.stats.proven
    assert cut.stats.gap is not None and 0 <= cut.stats.gap < 1
    p = cut.stats.passes[-1]
    assert not p.completed and p.bound <= p.best
    optimum = full.stats.passes[-1].best
    assert p.bound <= optimum * (1 + 1e-12) <= p.best * (1 + 1e-12)
    result = build_result(cut)
    assert any("time limit reached" in n for n in cut.notes)
    assert result.chosen.islands <= 8


@pytest.mark.parametrize("objective", [{"kind": "min-time"}, {"kind": "min-cost"}])
def test_a_limit_within_the_build_searches_what_was_built_and_proves_no_gap(
    objective: dict[str, object],
) -> None:
    """The build stops at the deadline (each pool past its first shape that runs): the plan
    is a plan of the whole space, and no gap is claimed over the shapes never simulated."""
    spec = six_pools(objective)
    full = search(spec)
    optimum = full.stats.passes[-1].best
    cut = search(spec, time_limit_s=1e-6)
    assert cut.stats.shapes_left > 0
    assert not cut.stats.proven and cut.stats.gap is None
    assert all(c.shapes for c in cut.contexts)
    assert cut.stats.passes[-1].best >= optimum * (1 - 1e-12)
    # every shape built is one the full build has, with the same table
    for c, f in zip(cut.contexts, full.contexts, strict=True):
        tables = {t.shape: t for t in f.shapes}
        assert c.utilisation == f.utilisation
        for t in c.shapes:
            assert np.array_equal(t.step_s, tables[t.shape].step_s)
    assert any("not simulated" in n and "no gap proven" in n for n in cut.notes)
    build_result(cut)


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
