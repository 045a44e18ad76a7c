"""TrainingPlan reconciliation: validate → plan (in a worker thread) → status → launch one
Job per island (everything rendered and validated before anything is created).

Launched plans are never re-planned: when their spec or a pool's coefficients change they
are *re-evaluated* (same islands and settings), and ``OuterStepBlocking`` says when the new
prediction blocks and which settings would not. Running Jobs are never touched."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from pydantic import ValidationError

from shardmeter.cost.coefficients import CoefficientsDocument, Source
from shardmeter.errors import InfeasibleError, SpecError, spec_error_from_validation
from shardmeter_operator import metrics
from shardmeter_operator.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.kube import Kube
from shardmeter_operator.launch import render_launch
from shardmeter_operator.manifests import coefficients_configmap_name, validate_template
from shardmeter_operator.planning import plan_request, plan_status, reevaluate
from shardmeter_operator.resources import GPUPoolSpec, TrainingPlanPhase, TrainingPlanSpec

Status = dict[str, Any]


@dataclass(frozen=True)
class PoolView:
    """What the operator knows about a GPUPool (from its index)."""

    spec: dict[str, Any]
    status: dict[str, Any]


def _invalid(
    conditions: list[dict[str, Any]], generation: int, reason: str, message: str
) -> Status:
    conditions = set_condition(conditions, Type.VALID, False, reason, message, generation)
    conditions = set_condition(
        conditions, Type.PLANNED, False, reason, "not planned: the spec is invalid", generation
    )
    return {
        "observedGeneration": generation,
        "phase": TrainingPlanPhase.INVALID.value,
        "conditions": conditions,
    }


def pool_revisions(spec: TrainingPlanSpec, pools: Mapping[str, PoolView]) -> dict[str, str]:
    return {
        ref.name: str(pools[ref.name].status.get("coefficientsRevision", ""))
        if ref.name in pools
        else ""
        for ref in spec.pools
    }


def needs_work(
    generation: int, spec_raw: dict[str, Any], status: Status, pools: Mapping[str, PoolView]
) -> bool:
    """Whether a periodic re-check should reconcile: new spec, changed pool revisions, or a
    missing pool that may exist now."""
    if int(status.get("observedGeneration", 0)) != generation:
        return True
    valid = get_condition(status.get("conditions"), Type.VALID)
    if valid and valid.get("reason") == Reason.POOL_NOT_FOUND:
        return True
    if status.get("phase") == TrainingPlanPhase.INVALID.value:
        return False
    try:
        spec = TrainingPlanSpec.model_validate(spec_raw)
    except ValidationError:
        return False
    used = {c.get("pool"): c.get("revision") for c in status.get("coefficients") or []}
    return any(
        used.get(name) != rev
        for name, rev in pool_revisions(spec, pools).items()
        if name in used or status.get("phase") == TrainingPlanPhase.INFEASIBLE.value
    )


async def _docs(
    spec: TrainingPlanSpec, cfg: OperatorConfig, kube: Kube
) -> tuple[dict[str, CoefficientsDocument | None], list[str]]:
    docs: dict[str, CoefficientsDocument | None] = {}
    notes: list[str] = []
    for ref in spec.pools:
        cm = await kube.get("v1", "ConfigMap", cfg.namespace, coefficients_configmap_name(ref.name))
        doc = None
        if cm is not None:
            try:
                doc = CoefficientsDocument.from_configmap_data(cm.get("data"), ref.name)
            except SpecError as exc:
                notes.append(
                    f"pool {ref.name}: unreadable coefficients ({exc}); using datasheet priors"
                )
        docs[ref.name] = doc if doc is not None and doc.source is Source.MEASURED else None
    return docs, notes


async def reconcile_plan(
    name: str,
    namespace: str,
    uid: str,
    generation: int,
    spec_raw: dict[str, Any],
    status: Status,
    pools: Mapping[str, PoolView],
    cfg: OperatorConfig,
    kube: Kube,
    body: Any = None,
) -> Status:
    """The status patch for TrainingPlan ``namespace/name``."""
    conditions = list(status.get("conditions") or [])
    try:
        spec = TrainingPlanSpec.model_validate(spec_raw)
    except ValidationError as exc:
        metrics.forget_plan(namespace, name)
        return _invalid(
            conditions,
            generation,
            Reason.INVALID_SPEC,
            str(spec_error_from_validation(exc, "spec")),
        )
    pool_specs: dict[str, GPUPoolSpec] = {}
    for i, ref in enumerate(spec.pools):
        view = pools.get(ref.name)
        if view is None:
            continue
        try:
            pool_specs[ref.name] = GPUPoolSpec.model_validate(view.spec)
        except ValidationError as exc:
            return _invalid(
                conditions,
                generation,
                Reason.POOL_NOT_FOUND,
                f"spec.pools[{i}]: GPUPool {ref.name!r} is invalid "
                f"({spec_error_from_validation(exc, 'spec')}); fix the GPUPool",
            )
    try:
        request = plan_request(spec, pool_specs)
        if spec.launch:
            validate_template(spec.template)
    except SpecError as exc:
        reason = (
            Reason.POOL_NOT_FOUND
            if "not found" in exc.message
            else (
                Reason.INVALID_TEMPLATE
                if exc.field.startswith("spec.template")
                else Reason.INVALID_SPEC
            )
        )
        metrics.forget_plan(namespace, name)
        return _invalid(conditions, generation, reason, str(exc))
    conditions = set_condition(
        conditions, Type.VALID, True, Reason.SPEC_VALID, "spec is valid", generation
    )
    docs, notes = await _docs(spec, cfg, kube)
    revisions = pool_revisions(spec, pools)
    priors = sorted(p for p, d in docs.items() if d is None)
    conditions = set_condition(
        conditions,
        Type.USING_PRIOR_COEFFICIENTS,
        bool(priors),
        Reason.PRIORS if priors else Reason.MEASURED,
        (
            f"datasheet priors for {', '.join(priors)}: predictions are estimates until those pools are benchmarked"
            if priors
            else "every pool has measured coefficients"
        )
        + "".join(f"; {n}" for n in notes),
        generation,
    )
    coefficients = [
        {"pool": p, "source": "prior" if docs[p] is None else "measured", "revision": revisions[p]}
        for p in docs
    ]
    if status.get("phase") == TrainingPlanPhase.LAUNCHED.value:
        return await _reevaluate(
            name, namespace, generation, request, docs, status, conditions, coefficients, body
        )
    started = time.perf_counter()
    try:
        outcome = await asyncio.to_thread(plan_status, name, request, docs, revisions)
    except (InfeasibleError, SpecError) as exc:
        metrics.plan_search_seconds.observe(time.perf_counter() - started)
        metrics.set_infeasible(namespace, name)
        conditions = set_condition(
            conditions, Type.PLANNED, False, Reason.INFEASIBLE, str(exc), generation
        )
        if body is not None and status.get("phase") != TrainingPlanPhase.INFEASIBLE.value:
            kopf.warn(body, reason="Infeasible", message=str(exc))
        return {
            "observedGeneration": generation,
            "phase": TrainingPlanPhase.INFEASIBLE.value,
            "conditions": conditions,
            "coefficients": coefficients,
            "predictions": None,
            "islands": [],
            "islandCount": 0,
            "gpus": 0,
            "plan": "",
            "frontier": [],
        }
    metrics.plan_search_seconds.observe(time.perf_counter() - started)
    st = outcome.status
    pred = st["predictions"]
    metrics.set_predictions(namespace, name, pred)
    conditions = set_condition(
        conditions,
        Type.PLANNED,
        True,
        Reason.PLANNED,
        f"{st['plan']}: {pred['tokensPerSecond']:,.0f} tokens/s, {pred['hours']:,.1f} h, "
        f"${pred['costUsd']:,.0f}",
        generation,
    )
    conditions = _blocking_condition(
        conditions,
        request.strategy.is_diloco,
        pred["outerStepBlockingSeconds"],
        st.get("streamingDiLoCo"),
        "",
        generation,
        namespace,
        name,
    )
    patch: Status = {
        **st,
        "observedGeneration": generation,
        "phase": TrainingPlanPhase.PLANNED.value,
    }
    if spec.launch:
        try:  # everything rendered and checked before anything is created
            manifests = render_launch(
                name, namespace, uid, spec, st, pool_specs, bench_image=cfg.bench_image
            )
        except SpecError as exc:
            return _not_launchable(patch, conditions, exc, generation)
        try:
            jobs = await _launch(uid, manifests, kube)
        except SpecError as exc:
            conditions = set_condition(
                conditions, Type.LAUNCHED, False, Reason.JOBS_FAILED, str(exc), generation
            )
            patch["conditions"] = conditions
            return patch
        conditions = set_condition(
            conditions,
            Type.LAUNCHED,
            True,
            Reason.JOBS_CREATED,
            f"{len(jobs)} Job(s): {', '.join(jobs)}",
            generation,
        )
        patch.update(phase=TrainingPlanPhase.LAUNCHED.value, jobs=jobs)
        if body is not None:
            kopf.info(
                body,
                reason="Launched",
                message=f"created {len(jobs)} island Job(s) for {st['plan']}",
            )
    else:
        conditions = set_condition(
            conditions,
            Type.LAUNCHED,
            False,
            Reason.PLAN_ONLY,
            "plan only: set spec.launch to create the Jobs",
            generation,
        )
        planned = get_condition(conditions, Type.PLANNED)
        if body is not None and planned is not None and status.get("plan") != st["plan"]:
            kopf.info(body, reason="Planned", message=planned["message"])
    patch["conditions"] = conditions
    return patch


def _blocking_condition(
    conditions: list[dict[str, Any]],
    diloco: bool,
    blocking: float,
    settings: Mapping[str, Any] | None,
    recommendation: str,
    generation: int,
    namespace: str,
    name: str,
) -> list[dict[str, Any]]:
    if not diloco:
        return set_condition(
            conditions,
            Type.OUTER_STEP_BLOCKING,
            False,
            Reason.NOT_DILOCO,
            "no outer step: FSDP strategy",
            generation,
        )
    s = settings or {}
    if blocking > 1e-9:
        text = f"compute blocks {blocking:.3g} s per outer step on the outer all_reduce"
        if recommendation:
            text += f"; recommended: {recommendation}"
        return set_condition(
            conditions, Type.OUTER_STEP_BLOCKING, True, Reason.OUTER_STEP_BLOCKS, text, generation
        )
    metrics.set_recommendation(
        namespace,
        name,
        int(s.get("syncEvery", 0)),
        int(s.get("fragments", 0)),
        int(s.get("fragmentSyncDelay", 0)),
    )
    return set_condition(
        conditions,
        Type.OUTER_STEP_BLOCKING,
        False,
        Reason.OUTER_STEP_HIDDEN,
        f"the outer all_reduce hides behind {s.get('fragmentSyncDelay')} inner step(s)",
        generation,
    )


async def _reevaluate(
    name: str,
    namespace: str,
    generation: int,
    request: Any,
    docs: Mapping[str, Any],
    status: Status,
    conditions: list[dict[str, Any]],
    coefficients: list[dict[str, Any]],
    body: Any,
) -> Status:
    ev = await asyncio.to_thread(reevaluate, request, docs, status)
    p = ev.predictions
    metrics.set_predictions(namespace, name, p)
    conditions = _blocking_condition(
        conditions,
        request.strategy.is_diloco,
        ev.blocking_s,
        status.get("streamingDiLoCo"),
        ev.recommendation,
        generation,
        namespace,
        name,
    )
    blocking = get_condition(conditions, Type.OUTER_STEP_BLOCKING)
    if ev.recommendation and body is not None and blocking is not None:
        kopf.warn(body, reason="OuterStepBlocking", message=blocking["message"])
    if int(status.get("observedGeneration", 0)) != generation and body is not None:
        kopf.info(
            body,
            reason="SpecChangedAfterLaunch",
            message="the spec changed after launch: running Jobs are unchanged; predictions re-evaluated. "
            "Delete the Jobs (or the TrainingPlan) to launch a new plan.",
        )
    return {
        "observedGeneration": generation,
        "predictions": p,
        "coefficients": coefficients,
        "conditions": conditions,
    }


def _not_launchable(
    patch: Status, conditions: list[dict[str, Any]], exc: SpecError, generation: int
) -> Status:
    """The plan stands (status keeps it) but cannot run as planned: Valid=False naming the
    field, nothing created."""
    reason = (
        Reason.INVALID_TEMPLATE if exc.field.startswith("spec.template") else Reason.NOT_LAUNCHABLE
    )
    conditions = set_condition(conditions, Type.VALID, False, reason, str(exc), generation)
    conditions = set_condition(
        conditions, Type.LAUNCHED, False, reason, "nothing created: " + str(exc), generation
    )
    return {**patch, "phase": TrainingPlanPhase.INVALID.value, "conditions": conditions}


async def _launch(uid: str, manifests: list[dict[str, Any]], kube: Kube) -> list[str]:
    jobs = []
    for m in manifests:
        obj, created = await kube.create(m)
        owners = [o.get("uid") for o in (obj.get("metadata") or {}).get("ownerReferences") or []]
        if not created and uid not in owners:
            raise SpecError(
                f"{m['kind'].lower()}/{m['metadata']['name']}",
                "already exists and is not owned by this TrainingPlan; rename the plan or delete it",
            )
        if m["kind"] == "Job":
            jobs.append(m["metadata"]["name"])
    return jobs
