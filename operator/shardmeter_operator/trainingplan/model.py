"""Pure planning for TrainingPlans: resources → the model's PlanSpec → search → the typed
status pieces (:mod:`shardmeter_operator.api`). No Kubernetes calls here; the
reconciler runs `plan_outcome` and `reevaluate` in a worker thread."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.quality import QualityEstimate
from shardmeter.errors import spec_error_from_validation
from shardmeter.plan.fixed import evaluate_fixed
from shardmeter.plan.groups import IslandGroup
from shardmeter.plan.result import build_result
from shardmeter.plan.schema import PlanPool, PlanSpec
from shardmeter.plan.search import SpaceStore, search
from shardmeter.plan.unused import unused_pools
from shardmeter.sim.bottleneck import Bottleneck, blocks
from shardmeter.sim.settings import SettingsChoice
from shardmeter_operator.api import (
    DiLoCoSettings,
    FrontierPoint,
    GPUPoolSpec,
    IslandStatus,
    PredictedQuality,
    Predictions,
    TrainingPlanSpec,
    UnusedPool,
)
from shardmeter_operator.api.errors import PoolInvalidError, PoolNotFoundError
from shardmeter_operator.render.island import island_job_name

FRONTIER_IN_STATUS = 5
SEARCHES_KEPT = 8
"""Searches remembered by request (:func:`searched`)."""
_searches: OrderedDict[str, Any] = OrderedDict()
_searches_lock = threading.Lock()
SPACE_STORE = SpaceStore()
"""The search spaces of recent requests (:class:`SpaceStore`, bounded): island shapes' tables
and the exhaustive pass's layouts. A new request over the same pools, model and batch —
another total tokens or objective — simulates nothing again and scores the layouts in one
pass; a pool's new coefficients build its tables anew (the plans that use a changed pool are
reconciled in the planning worker, :meth:`~.controller.Controller.fan_out`: where they are
searched again, that builds the new tables before an admission needs them)."""


def searched(request: PlanSpec, docs: Mapping[str, CoefficientsDocument | None]) -> Any:
    """``build_result(search(request, docs))``, remembered for the last :data:`SEARCHES_KEPT`
    requests: the same request over the same coefficients gives the same plan (the search is
    deterministic), and it recurs — a workload placed at admission and its TrainingPlan, the
    same recipe submitted again. The result is only read. Thread-safe (the planning and
    admission workers)."""
    key = hashlib.sha256(
        "\0".join(
            [request.model_dump_json()]
            + [f"{n}={d.model_dump_json() if d else ''}" for n, d in sorted(docs.items())]
        ).encode()
    ).hexdigest()
    with _searches_lock:
        if key in _searches:
            _searches.move_to_end(key)
            return _searches[key]
    result = build_result(search(request, dict(docs), store=SPACE_STORE))
    with _searches_lock:
        _searches[key] = result
        while len(_searches) > SEARCHES_KEPT:
            _searches.popitem(last=False)
    return result


def plan_request(
    spec: TrainingPlanSpec,
    pools: Mapping[str, GPUPoolSpec],
    invalid: Mapping[str, str] | None = None,
) -> PlanSpec:
    """The model's planning request for a TrainingPlan. A pool in ``invalid`` (name → why)
    raises PoolInvalidError, a pool in neither PoolNotFoundError."""
    plan_pools = []
    for i, ref in enumerate(spec.pools):
        if invalid and ref.name in invalid:
            raise PoolInvalidError(
                f"spec.pools[{i}].name",
                f"GPUPool {ref.name!r} is invalid ({invalid[ref.name]}); fix the GPUPool",
            )
        pool = pools.get(ref.name)
        if pool is None:
            known = ", ".join(sorted(pools)) or "none"
            raise PoolNotFoundError(
                f"spec.pools[{i}].name",
                f"GPUPool {ref.name!r} not found (GPUPools: {known}); create it or fix the name",
            )
        hardware = pool.model_dump(
            by_alias=False,
            include=set(PlanPool.model_fields) - {"name", "coefficients", "max_nodes"},
        )
        try:
            plan_pools.append(
                PlanPool.model_validate({**hardware, "name": ref.name, "max_nodes": ref.max_nodes})
            )
        except ValidationError as exc:
            raise spec_error_from_validation(exc, f"spec.pools[{i}]") from exc
    base = spec.model_dump(
        by_alias=False,
        include={"model", "training", "strategy", "constraints", "objective", "runtime"},
    )
    try:
        return PlanSpec.model_validate({**base, "model": spec.model, "pools": plan_pools})
    except ValidationError as exc:  # a rule across the plan and its pools (unique names, …)
        raise spec_error_from_validation(exc, "spec") from exc


def footprint(
    energy_kwh: float,
    co2_kg: float,
    egress_gb: float,
    egress_usd: float,
    quality: QualityEstimate | None,
    hours: float,
    cost_usd: float,
) -> dict[str, Any]:
    """The predictions' energy, CO₂, egress and quality fields, rounded as status holds them
    (egress only where there is some; quality for DiLoCo plans)."""
    out: dict[str, Any] = {"energy_kwh": round(energy_kwh, 1), "co2_kg": round(co2_kg, 1)}
    if egress_gb > 0:
        out |= {"egress_gb": round(egress_gb, 1), "egress_usd": round(egress_usd, 2)}
    if quality is not None:
        f = quality.equivalent_token_factor
        out["quality"] = PredictedQuality(
            loss_penalty_vs_dp=round(quality.loss_penalty_vs_dp, 6),
            loss_penalty_uncertainty=round(quality.loss_penalty_uncertainty, 6),
            equivalent_token_factor=round(f, 4),
            dp_equivalent_hours=round(hours * f, 4),
            dp_equivalent_cost_usd=round(cost_usd * f, 2),
            basis=quality.basis[:1024],
            warnings=[w[:512] for w in quality.warnings[:16]],
            runs=quality.runs[:512],
        )
    return out


@dataclass(frozen=True)
class PlanOutcome:
    """The chosen plan as status pieces."""

    plan: str
    island_count: int
    gpus: int
    islands: list[IslandStatus]
    settings: DiLoCoSettings | None
    predictions: Predictions
    frontier: list[FrontierPoint]
    sources: dict[str, str]
    """Pool → "measured" | "prior"."""
    unused_pools: list[UnusedPool]
    """The pools the plan leaves out, and why."""


def plan_outcome(
    name: str, request: PlanSpec, docs: Mapping[str, CoefficientsDocument | None]
) -> PlanOutcome:
    """Search and describe the chosen plan. Raises InfeasibleError / SpecError."""
    result = searched(request, docs)
    c, d = result.chosen, result.detail
    islands: list[IslandStatus] = []
    for g in c.groups:
        for _ in range(g.count):
            islands.append(
                IslandStatus(
                    name=island_job_name(name, len(islands)),
                    pool=g.pool,
                    nodes=g.nodes,
                    gpus_per_node=g.gpus_per_node,
                    micro_batch=g.micro_batch,
                    accumulation=g.accumulation,
                    local_batch_tokens=g.local_batch_tokens,
                    step_seconds=round(g.step_s, 6),
                )
            )
    blocking = d.diloco.blocking_s_per_outer_step if d.diloco is not None else 0.0
    settings = DiLoCoSettings.of(c.settings) if request.strategy.is_diloco else None
    predictions = Predictions(
        step_seconds=round(c.step_s, 6),
        tokens_per_second=round(c.tokens_per_s, 3),
        hours=round(c.hours, 4),
        cost_usd=round(c.cost_usd, 2),
        mfu=round(c.mfu, 4),
        bottleneck=d.bottleneck,
        outer_step_blocking_seconds=round(blocking, 6),
        **footprint(
            c.energy_kwh,
            c.co2_kg,
            c.egress_gb,
            c.egress_usd,
            c.quality if request.strategy.is_diloco else None,
            c.hours,
            c.cost_usd,
        ),
    )
    frontier = [
        FrontierPoint(
            label=p.label,
            tokens_per_second=round(p.tokens_per_s, 3),
            hours=round(p.hours, 4),
            cost_usd=round(p.cost_usd, 2),
        )
        for p in result.frontier[:FRONTIER_IN_STATUS]
    ]
    unused = [
        UnusedPool(
            pool=u.pool,
            best_plan=u.plan.label[:512] if u.plan is not None else "",
            hours=round(u.plan.hours, 4) if u.plan is not None else None,
            cost_usd=round(u.plan.cost_usd, 2) if u.plan is not None else None,
            lost_on=u.lost_on,
            reason=u.reason[:2048],
        )
        for u in unused_pools(result)
    ]
    return PlanOutcome(
        c.label,
        c.islands,
        c.gpus,
        islands,
        settings,
        predictions,
        frontier,
        dict(result.coefficient_sources),
        unused,
    )


@dataclass(frozen=True)
class Recommendation:
    """Streaming DiLoCo settings for the islands in use that block less (or not at all)."""

    choice: SettingsChoice
    text: str
    changes: bool = True
    """The settings differ from those in use (False: none within the guard-rails block less at
    this syncEvery; ``text`` says what would)."""


@dataclass(frozen=True)
class Reevaluation:
    predictions: Predictions
    blocking_s: float
    recommendation: Recommendation | None
    """None when the outer step is hidden; else the settings to use instead."""


def reevaluate(
    request: PlanSpec,
    docs: Mapping[str, CoefficientsDocument | None],
    islands: Sequence[IslandStatus],
    settings: DiLoCoSettings | None,
    previous: Predictions | None,
) -> Reevaluation:
    """Predict a launched plan again with the current coefficients (islands unchanged)."""
    groups: dict[tuple[Any, ...], int] = {}
    for isl in islands:
        key = (isl.pool, isl.nodes, isl.gpus_per_node, isl.micro_batch, isl.accumulation)
        groups[key] = groups.get(key, 0) + 1
    fixed = [IslandGroup(k[0], n, k[1], k[2], k[3], k[4]) for k, n in groups.items()]
    s = settings or DiLoCoSettings(sync_every=1, fragments=1, fragment_sync_delay=0)
    ev = evaluate_fixed(request, docs, fixed, s.sync_every, s.fragments, s.fragment_sync_delay)
    rec = None
    if blocks(ev.blocking_s_per_outer_step) and ev.recommended is not None:
        r = ev.recommended
        same = (r.sync_every, r.fragments, r.fragment_sync_delay) == (
            s.sync_every,
            s.fragments,
            s.fragment_sync_delay,
        )
        if same:  # the guard-rails (spec.strategy) leave nothing better at this syncEvery
            text = (
                f"no other fragments or fragmentSyncDelay at syncEvery {r.sync_every} block less "
                "within spec.strategy's guard-rails"
                + (
                    f"; syncEvery ≥ {r.sync_every_for_zero_blocking} would hide it (relaunch)"
                    if r.sync_every_for_zero_blocking
                    else ""
                )
            )
        else:
            text = (
                f"fragments {r.fragments}, fragmentSyncDelay {r.fragment_sync_delay} at syncEvery "
                f"{r.sync_every}"
            )
            if not r.zero_blocking:
                text += (
                    f" (still {r.blocking_s_per_outer_step:.3g} s blocking; "
                    f"syncEvery ≥ {r.sync_every_for_zero_blocking} would hide it)"
                )
        rec = Recommendation(r, text, changes=not same)
    bottleneck = (
        Bottleneck.OUTER_STEP
        if blocks(ev.blocking_s_per_outer_step)
        else (previous.bottleneck if previous is not None else "")
    )
    predictions = Predictions(
        step_seconds=round(ev.step_s, 6),
        tokens_per_second=round(ev.tokens_per_s, 3),
        hours=round(ev.hours, 4),
        cost_usd=round(ev.cost_usd, 2),
        mfu=round(ev.mfu, 4),
        bottleneck=bottleneck,
        outer_step_blocking_seconds=round(ev.blocking_s_per_outer_step, 6),
        **footprint(
            ev.energy_kwh,
            ev.co2_kg,
            ev.egress_gb,
            ev.egress_usd,
            ev.quality if request.strategy.is_diloco else None,
            ev.hours,
            ev.cost_usd,
        ),
    )
    return Reevaluation(predictions, ev.blocking_s_per_outer_step, rec)
