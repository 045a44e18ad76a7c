"""Pure planning for TrainingPlans: resources → the model's PlanSpec → search → status.
No Kubernetes calls here; the handlers run `plan_status` in a worker thread."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.errors import SpecError
from shardmeter.plan.fixed import FixedGroup, evaluate_fixed
from shardmeter.plan.result import PlanResult, build_result
from shardmeter.plan.schema import PlanPool, PlanSpec
from shardmeter.plan.search import search
from shardmeter_operator.manifests import island_job_name
from shardmeter_operator.resources import GPUPoolSpec, TrainingPlanSpec

FRONTIER_IN_STATUS = 5


def revision(*parts: Any) -> str:
    """A short stable hash of JSON-able parts (pool spec + coefficients)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_request(spec: TrainingPlanSpec, pools: Mapping[str, GPUPoolSpec]) -> PlanSpec:
    """The model's planning request for a TrainingPlan; unknown pools are spec errors."""
    plan_pools = []
    for i, ref in enumerate(spec.pools):
        pool = pools.get(ref.name)
        if pool is None:
            known = ", ".join(sorted(pools)) or "none"
            raise SpecError(
                f"spec.pools[{i}].name",
                f"GPUPool {ref.name!r} not found (GPUPools: {known}); create it or fix the name",
            )
        hardware = pool.model_dump(
            by_alias=False,
            include=set(PlanPool.model_fields) - {"name", "coefficients", "max_nodes"},
        )
        plan_pools.append(
            PlanPool.model_validate({**hardware, "name": ref.name, "max_nodes": ref.max_nodes})
        )
    base = spec.model_dump(
        by_alias=False,
        include={"model", "training", "strategy", "constraints", "objective", "runtime"},
    )
    try:
        return PlanSpec.model_validate({**base, "model": spec.model, "pools": plan_pools})
    except Exception as exc:
        raise SpecError("spec", str(exc).splitlines()[0]) from exc


@dataclass(frozen=True)
class PlanOutcome:
    status: dict[str, Any]
    """The status fields of a planned TrainingPlan (camelCase)."""
    result: PlanResult


def plan_status(
    name: str,
    request: PlanSpec,
    docs: Mapping[str, CoefficientsDocument | None],
    revisions: Mapping[str, str],
) -> PlanOutcome:
    """Search and describe the chosen plan. Raises InfeasibleError / SpecError."""
    result = build_result(search(request, dict(docs)))
    c, d = result.chosen, result.detail
    islands: list[dict[str, Any]] = []
    for g in c.groups:
        for _ in range(g.count):
            islands.append(
                {
                    "name": island_job_name(name, len(islands)),
                    "pool": g.pool,
                    "nodes": g.nodes,
                    "gpusPerNode": g.gpus_per_node,
                    "microBatch": g.micro_batch,
                    "accumulation": g.accumulation,
                    "localBatchTokens": g.local_batch_tokens,
                    "stepSeconds": round(g.step_s, 6),
                }
            )
    blocking = d.diloco.blocking_s_per_outer_step if d.diloco is not None else 0.0
    status: dict[str, Any] = {
        "plan": c.label,
        "islandCount": c.islands,
        "gpus": c.gpus,
        "islands": islands,
        "streamingDiLoCo": (
            {
                "syncEvery": c.sync_every,
                "fragments": c.fragments,
                "fragmentSyncDelay": c.fragment_sync_delay,
            }
            if request.strategy.is_diloco
            else None
        ),
        "predictions": {
            "stepSeconds": round(c.step_s, 6),
            "tokensPerSecond": round(c.tokens_per_s, 3),
            "hours": round(c.hours, 4),
            "costUsd": round(c.cost_usd, 2),
            "mfu": round(c.mfu, 4),
            "bottleneck": d.bottleneck,
            "outerStepBlockingSeconds": round(blocking, 6),
        },
        "frontier": [
            {
                "label": p.label,
                "tokensPerSecond": round(p.tokens_per_s, 3),
                "hours": round(p.hours, 4),
                "costUsd": round(p.cost_usd, 2),
            }
            for p in result.frontier[:FRONTIER_IN_STATUS]
        ],
        "coefficients": [
            {
                "pool": pool,
                "source": result.coefficient_sources[pool],
                "revision": revisions.get(pool, ""),
            }
            for pool in result.coefficient_sources
        ],
    }
    return PlanOutcome(status, result)


@dataclass(frozen=True)
class Reevaluation:
    predictions: dict[str, Any]
    blocking_s: float
    recommendation: str
    """Empty when the outer step is hidden; else the settings to use instead."""


def reevaluate(
    request: PlanSpec, docs: Mapping[str, CoefficientsDocument | None], status: Mapping[str, Any]
) -> Reevaluation:
    """Predict a launched plan again with the current coefficients (islands unchanged)."""
    groups: dict[tuple[Any, ...], int] = {}
    for isl in status.get("islands", []):
        key = (
            isl["pool"],
            isl["nodes"],
            isl["gpusPerNode"],
            isl["microBatch"],
            isl["accumulation"],
        )
        groups[key] = groups.get(key, 0) + 1
    fixed = [FixedGroup(k[0], n, k[1], k[2], k[3], k[4]) for k, n in groups.items()]
    s = status.get("streamingDiLoCo") or {}
    ev = evaluate_fixed(
        request,
        docs,
        fixed,
        int(s.get("syncEvery", 1)),
        int(s.get("fragments", 1)),
        int(s.get("fragmentSyncDelay", 0)),
    )
    rec = ""
    if ev.blocking_s_per_outer_step > 1e-9 and ev.recommended is not None:
        r = ev.recommended
        rec = (
            f"fragments {r.fragments}, fragmentSyncDelay {r.delay} at syncEvery {r.sync_every}"
            + (
                ""
                if r.zero_blocking
                else f" (still {r.blocking_s_per_outer_step:.3g} s blocking; "
                f"syncEvery ≥ {r.sync_every_for_zero_blocking} would hide it)"
            )
        )
    prev = status.get("predictions") or {}
    predictions = {
        **prev,
        "stepSeconds": round(ev.step_s, 6),
        "tokensPerSecond": round(ev.tokens_per_s, 3),
        "hours": round(ev.hours, 4),
        "costUsd": round(ev.cost_usd, 2),
        "mfu": round(ev.mfu, 4),
        "outerStepBlockingSeconds": round(ev.blocking_s_per_outer_step, 6),
    }
    if ev.blocking_s_per_outer_step > 1e-9:
        predictions["bottleneck"] = "outer-step-bound"
    return Reevaluation(predictions, ev.blocking_s_per_outer_step, rec)
