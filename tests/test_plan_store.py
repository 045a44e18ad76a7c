"""Shape tables kept across planning requests (`SpaceStore`, the operator's): a request
served from the store gets exactly the plan, predictions and scored layouts a fresh build
gives, and a change of a pool's coefficients builds that pool's tables anew."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardmeter.cost.coefficients import CoefficientsDocument, Source
from shardmeter.cost.model import CostModel
from shardmeter.cost.observed import ObservedCorrection
from shardmeter.output.plan_json import result_dict
from shardmeter.plan.evaluate import Evaluation
from shardmeter.plan.result import build_result
from shardmeter.plan.schema import ObjectiveKind, PlanSpec, load_plan
from shardmeter.plan.search import SearchOutput, SpaceStore, search
from shardmeter.spec.training import AttentionKernel
from strategies import random_spec

REPO = Path(__file__).resolve().parents[1]


def case_study(tokens: float, objective: str = "throughput-fraction") -> PlanSpec:
    spec, _ = load_plan(REPO / "examples" / "case-study.yaml")
    training = spec.training.model_copy(update={"total_tokens": tokens})
    obj = spec.objective.model_copy(update={"kind": ObjectiveKind(objective)})
    return spec.model_copy(update={"training": training, "objective": obj})


def answer(out: SearchOutput) -> dict[str, Any]:
    """Everything a request gets back but the search's own timing."""
    d = result_dict(build_result(out))
    d["search"].pop("seconds")
    return d


def assert_same(a: SearchOutput, b: SearchOutput) -> None:
    assert answer(a) == answer(b)
    for f in fields(Evaluation):
        assert np.array_equal(getattr(a.evaluated, f.name), getattr(b.evaluated, f.name)), f.name
    assert np.array_equal(a.table.steps, b.table.steps)


def test_a_request_served_from_the_store_is_planned_exactly_as_a_fresh_one() -> None:
    store = SpaceStore()
    search(case_study(5e10), store=store)
    built = len(store)
    assert built > 0 and store.hits == 0
    for tokens, objective in [(5.1e10, "throughput-fraction"), (2e11, "min-cost")]:
        spec = case_study(tokens, objective)
        misses = store.misses
        cached = search(spec, store=store)
        assert store.misses == misses and len(store) == built  # every table from the store
        assert_same(cached, search(spec))


def measured(spec: PlanSpec, pool: int, scale: float = 1.0) -> CoefficientsDocument:
    """The pool's priors as a measured document, compute times × ``scale``."""
    doc = CostModel(spec.model, spec.training, spec.pools[pool]).coefficients
    compute = {
        t: fit.model_copy(
            update={"coefficients": {k: v * scale for k, v in fit.coefficients.items()}}
        )
        for t, fit in doc.compute.items()
    }
    return doc.model_copy(
        update={"source": Source.MEASURED, "measured_at": datetime.now(UTC), "compute": compute}
    )


def test_a_coefficient_change_builds_the_pools_tables_anew() -> None:
    spec = case_study(5e10)
    name = spec.pools[0].name
    store = SpaceStore()
    before = {name: measured(spec, 0)}
    first = search(spec, before, store=store)
    slower = {name: measured(spec, 0, 1.25)}
    observed = {
        name: before[name].model_copy(update={"observed": ObservedCorrection(compute_scale=1.2)})
    }
    # the same fits, timed with FlashAttention-2 instead of the job's cuDNN attention
    other_kernel = {
        name: before[name].model_copy(update={"attention_kernel": AttentionKernel.FLASH2})
    }
    for docs in (slower, observed, other_kernel):
        misses = store.misses
        cached = search(spec, dict(docs), store=store)
        assert store.misses > misses
        fresh = search(spec, dict(docs))
        assert_same(cached, fresh)
        assert not np.array_equal(fresh.table.steps, first.table.steps)
    assert_same(search(spec, before, store=store), search(spec, before))


def test_the_store_is_bounded() -> None:
    store = SpaceStore(max_cells=2000)
    search(case_study(5e10), store=store)
    assert len(store) > 0 and store.weight <= 2000
    assert_same(search(case_study(6e10), store=store), search(case_study(6e10)))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("runtime", ["weighted", "torchtitan-ft"])
def test_random_requests_are_planned_the_same_from_the_store(seed: int, runtime: str) -> None:
    """Random instances (both runtimes, DiLoCo variants), each planned first for one total
    and objective, then for others from the store: the same answer as fresh."""
    strategy = ["streaming-diloco", "diloco", "fsdp"][seed % 3]
    store = SpaceStore()
    search(random_spec(seed, strategy, runtime=runtime), store=store)
    for tokens, objective in [(3 * 10**9, "min-cost"), (7 * 10**8, "min-time")]:
        base = random_spec(seed, strategy, {"kind": objective}, runtime=runtime)
        spec = base.model_copy(
            update={"training": base.training.model_copy(update={"total_tokens": tokens})}
        )
        hits = store.hits
        cached = search(spec, store=store)
        assert store.hits > hits
        assert_same(cached, search(spec))
