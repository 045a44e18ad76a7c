"""A TrainingPlan's spec against the pools: validation (:func:`validate`), the pools it
names, and whether a watch event calls for its reconcile (:func:`needs_work`). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from shardmeter.errors import spec_error_from_validation
from shardmeter_operator.api import (
    GPUPoolSpec,
    TrainingPlanPhase,
    TrainingPlanSpec,
    TrainingPlanStatus,
)
from shardmeter_operator.api.conditions import Reason, Type, get_condition
from shardmeter_operator.decision import PoolView, Validated
from shardmeter_operator.render.island import validate_template
from shardmeter_operator.trainingplan.model import PlanOutcome, plan_request

ELSEWHERE = (
    Reason.WORKLOAD_UNAVAILABLE,
    Reason.QUEUE_NOT_FOUND,
    Reason.FLAVOR_MISMATCH,
    Reason.MULTIKUEUE_MISCONFIGURED,
)
"""Refusals whose fix lies outside the plan and its pools: such a plan is rechecked on
every event (and every ``--recheck-interval``), also after the operator restarts."""


def referenced_pools(spec_raw: Mapping[str, Any]) -> set[str]:
    return {str(p.get("name")) for p in spec_raw.get("pools") or [] if isinstance(p, Mapping)}


def pool_revisions(names: set[str] | list[str], pools: Mapping[str, PoolView]) -> dict[str, str]:
    return {n: pools[n].revision if n in pools and not pools[n].problem else "" for n in names}


def needs_work(body: Mapping[str, Any], pools: Mapping[str, PoolView]) -> bool:
    """Whether a watch event (of the plan or of a pool it uses) calls for a reconcile: a new
    spec, a relaunch, pools whose coefficients changed, or pools that appeared, became
    valid or invalid since the plan's status was written. Cheap: no API calls."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = TrainingPlanStatus.model_validate(body.get("status") or {})
    if status.observed_generation != int(meta.get("generation") or 0):
        return True
    if status.phase is TrainingPlanPhase.PENDING:
        return True
    names = referenced_pools(spec)
    valid = get_condition(status.conditions, Type.VALID)
    if valid is not None and valid.reason in (Reason.POOL_NOT_FOUND, Reason.POOL_INVALID):
        return all(n in pools and not pools[n].problem for n in names)
    if valid is not None and valid.status == "False" and valid.reason in ELSEWHERE:
        return True  # fixed by installing JobSet or Kueue, a LocalQueue, a ResourceFlavor
    if status.phase is TrainingPlanPhase.INVALID:
        return False
    if any(n not in pools or pools[n].problem for n in names):
        return True  # a pool went away or became invalid
    used = {c.pool: c.revision for c in status.coefficients}
    return any(used.get(n) != rev for n, rev in pool_revisions(names, pools).items())


def validate(spec_raw: Mapping[str, Any], pools: Mapping[str, PoolView]) -> Validated:
    """Raises SpecError (of the type that names the reason) when the plan cannot be planned."""
    try:
        spec = TrainingPlanSpec.model_validate(dict(spec_raw))
    except ValidationError as exc:
        raise spec_error_from_validation(exc, "spec") from exc
    valid = {n: GPUPoolSpec.model_validate(v.spec) for n, v in pools.items() if not v.problem}
    invalid = {n: v.problem for n, v in pools.items() if v.problem}
    request = plan_request(spec, valid, invalid)
    if spec.launch:
        validate_template(spec.template)
    return Validated(spec, request, {r.name: valid[r.name] for r in spec.pools})


def apply_outcome(st: TrainingPlanStatus, outcome: PlanOutcome) -> None:
    st.plan, st.island_count, st.gpus = outcome.plan, outcome.island_count, outcome.gpus
    st.islands, st.streaming_di_lo_co = outcome.islands, outcome.settings
    st.predictions, st.frontier = outcome.predictions, outcome.frontier
    st.unused_pools = outcome.unused_pools
