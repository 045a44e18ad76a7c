"""The paper's case study (`examples/case-study.yaml`) pinned: a change in the priors, the
cost model or the optimizer that changes the chosen plan or its figures shows up here.

To re-pin after a deliberate change (e.g. new priors), run

    SHARDMETER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_plan_golden.py

and commit ``tests/golden/case_study.json`` with a note saying why the answer moved."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from shardmeter.plan.result import PlanResult, build_result
from shardmeter.plan.schema import load_plan
from shardmeter.plan.search import search

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "case_study.json"
REL = 1e-6


def reading(result: PlanResult) -> dict[str, Any]:
    c, f, s = result.chosen, result.fastest, result.spread
    return {
        "runtime": c.runtime,
        "chosen": {
            "label": c.label,
            "groups": [
                {
                    "pool": g.pool,
                    "islands": g.count,
                    "nodes": g.nodes,
                    "gpus_per_node": g.gpus_per_node,
                    "micro_batch": g.micro_batch,
                    "accumulation": g.accumulation,
                    "local_batch_tokens": g.local_batch_tokens,
                }
                for g in c.groups
            ],
            "sync_every": c.sync_every,
            "fragments": c.fragments,
            "fragment_sync_delay": c.fragment_sync_delay,
            "tokens_per_s": c.tokens_per_s,
            "hours": c.hours,
            "cost_usd": c.cost_usd,
            "egress_gb": c.egress_gb,
            "egress_usd": c.egress_usd,
            "energy_kwh": c.energy_kwh,
            "co2_kg": c.co2_kg,
            "loss_penalty_vs_dp": c.quality.loss_penalty_vs_dp,
            "loss_penalty_uncertainty": c.quality.loss_penalty_uncertainty,
            "equivalent_token_factor": c.quality.equivalent_token_factor,
            "quality_warnings": list(c.quality.warnings),
            "dp_equivalent_hours": c.dp_equivalent_hours,
            "dp_equivalent_cost_usd": c.dp_equivalent_cost_usd,
        },
        "ranked_by_quality": c.ranked_by_quality,
        "fastest": {
            "label": f.label,
            "tokens_per_s": f.tokens_per_s,
            "cost_usd": f.cost_usd,
            "equivalent_token_factor": f.quality.equivalent_token_factor,
        },
        "saving_vs_fastest": result.saving_vs_fastest,
        "within_tolerance": {
            "plans": s.plans,
            "min_cost_usd": s.min_cost_usd,
            "max_cost_usd": s.max_cost_usd,
        },
        "frontier": [p.label for p in result.frontier],
    }


def approx(value: Any) -> Any:
    if isinstance(value, float):
        return pytest.approx(value, rel=REL)
    if isinstance(value, dict):
        return {k: approx(v) for k, v in value.items()}
    if isinstance(value, list):
        return [approx(v) for v in value]
    return value


def test_case_study_answer_is_pinned() -> None:
    spec, _ = load_plan(REPO / "examples" / "case-study.yaml")
    got = reading(build_result(search(spec)))
    if os.environ.get("SHARDMETER_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert got == approx(want), "the case study's answer moved; see this file's docstring"
