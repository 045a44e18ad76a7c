"""The steps of deciding a TrainingPlan that planning and launched plans share, all pure:
what a decision reads (:class:`PlanInputs`), the coefficients a plan uses, the search, the
``OuterStepBlocking`` condition, and recording a launch decision."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument, Source
from shardmeter.errors import InfeasibleError, SpecError
from shardmeter.sim.bottleneck import blocks
from shardmeter_operator.api import (
    DiLoCoSettings,
    LaunchRecord,
    PoolCoefficients,
    TrainingPlanPhase,
    TrainingPlanStatus,
    WorkloadKind,
)
from shardmeter_operator.api.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.decision import PlanInputs, PlanResult, PoolView, Validated
from shardmeter_operator.launch.rules import decision_revision, launch_digest
from shardmeter_operator.launch.workload import decide_launch, launch_record
from shardmeter_operator.trainingplan.model import PlanOutcome, plan_outcome
from shardmeter_operator.trainingplan.validate import apply_outcome, pool_revisions

Manifest = dict[str, Any]


def needs_reevaluation(
    st: TrainingPlanStatus, ok: Validated, pools: Mapping[str, PoolView]
) -> bool:
    """A launched plan's predictions are missing, or a pool's coefficients changed."""
    names = [r.name for r in ok.spec.pools]
    used = {c.pool: c.revision for c in st.coefficients}
    return st.predictions is None or any(
        used.get(n) != r for n, r in pool_revisions(names, pools).items()
    )


def plan(inputs: PlanInputs, ok: Validated, out: PlanResult) -> bool:
    """Search the spec with the pools' coefficients and put the plan into the status (with
    its coefficients and ``OuterStepBlocking``); False when no deployment fits."""
    docs = coefficients(inputs, ok, out)
    outcome = search(inputs, ok, docs, out)
    if outcome is None:
        return False
    apply_outcome(out.status, outcome)
    blocking(out, ok, outcome.predictions.outer_step_blocking_seconds, "", inputs.generation)
    return True


def record_launch(inputs: PlanInputs, ok: Validated, out: PlanResult) -> bool:
    """Decide the launch of the planned islands and record it in ``status.launch`` (rule 1 of
    :mod:`~.launch.rules`); False when torchtitan-FT or the cluster refuses it (nothing recorded)."""
    st = out.status
    kind: WorkloadKind | None = decide_launch(
        inputs.name,
        inputs.namespace,
        ok.spec,
        ok.pools,
        inputs.cluster,
        inputs.cfg.recheck_interval_s,
        out,
        inputs.generation,
        default_workload=inputs.cfg.default_workload,
    )
    if kind is None:
        return False
    revision = decision_revision(
        inputs.uid, ok.spec.relaunch, st.islands, st.streaming_di_lo_co, ok.spec.template
    )
    st.launch = LaunchRecord(
        revision=revision,
        relaunch=ok.spec.relaunch,
        generation=inputs.generation,
        complete=False,
        spec_digest=launch_digest(ok.spec),
        **launch_record(inputs.name, kind, ok.spec, out.decided_sites, out.decided_restart),
    )
    return True


# ---- planning steps ---------------------------------------------------------------------------
def planning_documents(
    documents: Mapping[str, CoefficientsDocument | None],
) -> dict[str, CoefficientsDocument | None]:
    """The documents planning uses: measured ones, and priors that carry an observed
    correction (None: the pool's datasheet priors)."""
    return {
        name: doc
        if doc is not None and (doc.source is Source.MEASURED or doc.compute_scale != 1.0)
        else None
        for name, doc in documents.items()
    }


def coefficients(
    inputs: PlanInputs, ok: Validated, out: PlanResult
) -> dict[str, CoefficientsDocument | None]:
    """The documents the plan's pools plan with; ``status.coefficients`` and
    ``UsingPriorCoefficients`` say which."""
    names = [r.name for r in ok.spec.pools]
    docs = planning_documents({n: inputs.documents.get(n) for n in names})
    revisions = pool_revisions(names, inputs.pools)
    priors = sorted(p for p, d in docs.items() if d is None or d.source is Source.PRIOR)
    st = out.status
    st.conditions = set_condition(
        st.conditions,
        Type.USING_PRIOR_COEFFICIENTS,
        bool(priors),
        Reason.PRIORS if priors else Reason.MEASURED,
        (
            f"datasheet priors for {', '.join(priors)}: predictions are estimates until those pools are benchmarked"
            if priors
            else "every pool has measured coefficients"
        )
        + "".join(f"; {n}" for n in inputs.document_notes),
        inputs.generation,
    )
    st.coefficients = [
        PoolCoefficients(
            pool=p,
            source="measured"
            if (d := docs[p]) is not None and d.source is Source.MEASURED
            else "prior",
            revision=revisions[p],
            observed_compute_scale=d.compute_scale
            if d is not None and d.compute_scale != 1.0
            else None,
        )
        for p in names
    ]
    return docs


def search(
    inputs: PlanInputs,
    ok: Validated,
    docs: Mapping[str, CoefficientsDocument | None],
    out: PlanResult,
) -> PlanOutcome | None:
    """The model's search (CPU-heavy: :func:`decide` runs in the planning worker thread);
    None, with ``Planned=False`` and phase Infeasible, when no deployment fits."""
    st, generation = out.status, inputs.generation
    started = time.perf_counter()
    try:
        outcome = plan_outcome(inputs.name, ok.request, docs)
    except (InfeasibleError, SpecError) as exc:
        out.search_s = time.perf_counter() - started
        if st.phase is not TrainingPlanPhase.INFEASIBLE:
            out.events.append(("Warning", Reason.INFEASIBLE, str(exc)))
        st.conditions = set_condition(
            st.conditions, Type.PLANNED, False, Reason.INFEASIBLE, str(exc), generation
        )
        st.phase = TrainingPlanPhase.INFEASIBLE
        st.predictions, st.islands, st.island_count, st.gpus = None, [], 0, 0
        st.plan, st.frontier, st.streaming_di_lo_co, st.jobs = "", [], None, []
        st.unused_pools = []
        return None
    out.search_s = time.perf_counter() - started
    p = outcome.predictions
    message = (
        f"{outcome.plan}: {p.tokens_per_second:,.0f} tokens/s, {p.hours:,.1f} h, ${p.cost_usd:,.0f}"
    )
    if outcome.unused_pools:
        message += (
            "; not used: "
            + ", ".join(u.pool for u in outcome.unused_pools)
            + " (status.unusedPools says why)"
        )
    if get_condition(st.conditions, Type.PLANNED) is None or st.plan != outcome.plan:
        out.events.append(("Normal", "Planned", message))
    st.conditions = set_condition(
        st.conditions, Type.PLANNED, True, Reason.PLANNED, message, generation
    )
    return outcome


def blocking(
    out: PlanResult,
    ok: Validated,
    blocking_s: float,
    recommendation: str,
    generation: int,
    recommended: DiLoCoSettings | None = None,
) -> None:
    """OuterStepBlocking, and ``recommendedStreamingDiLoCo``: the settings that block less,
    while those in use block (the gauges advertise them, or the settings in use)."""
    st = out.status
    s = st.streaming_di_lo_co
    blocked = ok.request.strategy.is_diloco and blocks(blocking_s)
    if not ok.request.strategy.is_diloco:
        reason, text = Reason.NOT_DILOCO, "no outer step: FSDP strategy"
    elif blocked:
        reason = Reason.OUTER_STEP_BLOCKS
        text = f"compute blocks {blocking_s:.3g} s per outer step on the outer all_reduce"
        if recommendation:
            text += f"; recommended: {recommendation}"
    else:
        reason = Reason.OUTER_STEP_HIDDEN
        text = (
            f"the outer all_reduce hides behind {s.fragment_sync_delay if s else 0} inner step(s)"
        )
    st.recommended_streaming_di_lo_co = recommended if blocked else None
    st.conditions = set_condition(
        st.conditions, Type.OUTER_STEP_BLOCKING, blocked, reason, text, generation
    )
