"""Deciding a GPUPool's status, purely: from the pool as written, its coefficients ConfigMap,
its benchmark Job and the samples launched plans observed on it, the whole new status, the
Events, and what to write (the ConfigMap, the benchmark's children). No API calls here;
:mod:`shardmeter_operator.gpupool.reconcile` reads, calls :func:`decide_pool` and applies.

The benchmark state machine: Disabled → Running → Succeeded | BackOff → Running … → Failed
(``spec.benchmark.maxRetries`` retries, the wait doubling from ``--retry-backoff``); a new
spec generation measures again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from shardmeter.cost.coefficients import CoefficientsDocument, Source
from shardmeter.cost.observed import ObservedStepSample
from shardmeter.cost.priors import pool_priors
from shardmeter.errors import SpecError, spec_error_from_validation
from shardmeter.spec.training import Precision
from shardmeter_operator.api import BenchmarkPhase, Condition, GPUPoolSpec, GPUPoolStatus
from shardmeter_operator.api.conditions import Reason, Type, set_condition
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.gpupool.correction import (
    RESET_ANNOTATION,
    coefficients_revision,
    update_correction,
)
from shardmeter_operator.render.benchmark import (
    bench_job,
    bench_job_name,
    bench_role,
    coefficients_configmap,
    coefficients_configmap_name,
)
from shardmeter_operator.render.labels import owner_reference

Manifest = dict[str, Any]
Event = tuple[str, str, str]
"""(type "Normal" | "Warning", reason, message)."""


@dataclass(frozen=True)
class PoolInputs:
    """Everything deciding a GPUPool reads (:func:`pool_reads` says which objects)."""

    name: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    """``spec`` as written (validated here)."""
    status: GPUPoolStatus
    """The status as found."""
    now: datetime
    configmap: Manifest | None = None
    """The pool's coefficients ConfigMap (None: missing)."""
    bench_job: Manifest | None = None
    """The benchmark Job :func:`pool_reads` named (None: missing or not read)."""
    samples: Sequence[ObservedStepSample] = ()
    """Steps observed on the pool by launched plans, for its observed correction."""
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolGauges:
    """The pool's metrics (:mod:`shardmeter_operator.metrics`)."""

    source: str
    coefficients_timestamp_s: float
    fit_mape: float | None
    observed_compute_scale: float | None
    observed_samples: int


@dataclass
class PoolDecision:
    """The new status and what to do for it, in order: write the ConfigMap, create the rest."""

    status: GPUPoolStatus
    events: list[Event] = field(default_factory=list)
    requeue_s: float | None = None
    """When a benchmark retry is due."""
    configmap_create: Manifest | None = None
    configmap_data: dict[str, str] | None = None
    """Merge-patch the existing ConfigMap's ``data`` to this."""
    create: list[Manifest] = field(default_factory=list)
    """The benchmark's Role, RoleBinding, Service and Job (409 is success)."""
    gauges: PoolGauges | None = None
    """None: the spec is invalid (the pool's series are dropped)."""


@dataclass(frozen=True)
class PoolReads:
    """What :func:`decide_pool` needs read: the ConfigMap, and the benchmark Job by name."""

    configmap: str | None
    bench_job: str | None


def _spec(raw: Mapping[str, Any]) -> GPUPoolSpec:
    try:
        return GPUPoolSpec.model_validate(dict(raw))
    except ValidationError as exc:
        raise spec_error_from_validation(exc, "spec") from exc


def pool_reads(
    name: str, spec_raw: Mapping[str, Any], status: GPUPoolStatus, generation: int
) -> PoolReads:
    """The objects a reconcile of this pool reads (nothing for an invalid spec)."""
    try:
        spec = _spec(spec_raw)
    except SpecError:
        return PoolReads(None, None)
    return PoolReads(
        coefficients_configmap_name(name), _watched_job(name, spec, status, generation)
    )


def _watched_job(
    name: str, spec: GPUPoolSpec, status: GPUPoolStatus, generation: int
) -> str | None:
    """The benchmark Job whose outcome the state machine waits for (None: it waits for none)."""
    phase = status.benchmark_phase
    if (
        not spec.benchmark.enabled
        or status.benchmark_generation != generation
        or phase is not BenchmarkPhase.RUNNING
    ):
        return None
    return status.benchmark_job or bench_job_name(name, generation, status.benchmark_attempts)


def _iso(at: datetime) -> str:
    return at.replace(microsecond=0).isoformat().replace("+00:00", "Z")


# ---- the decision -----------------------------------------------------------------------------
def decide_pool(inputs: PoolInputs, cfg: OperatorConfig) -> PoolDecision:
    """The new status of a GPUPool, the Events and the writes (module docstring)."""
    name, generation, now = inputs.name, inputs.generation, _iso(inputs.now)
    before = inputs.status
    st = before.model_copy(deep=True, update={"observed_generation": generation})
    out = PoolDecision(st)
    try:
        spec = _spec(inputs.spec)
    except SpecError as exc:
        err = str(exc)
        old = next((c for c in before.conditions if c.type == Type.VALID), None)
        if old is None or old.message != err:
            out.events.append(("Warning", Reason.INVALID_SPEC, err))
        st.conditions = set_condition(
            st.conditions, Type.VALID, False, Reason.INVALID_SPEC, err, generation, now
        )
        return out
    st.conditions = set_condition(
        st.conditions, Type.VALID, True, Reason.SPEC_VALID, "spec is valid", generation, now
    )
    ns, cm_name = cfg.namespace, coefficients_configmap_name(name)
    doc, note = _stored_document(inputs, spec, cfg)
    st.coefficients_config_map = f"{ns}/{cm_name}"
    step = _benchmark(inputs, spec, doc, cfg)
    st = out.status = st.model_copy(update=step.update)
    out.requeue_s, out.create = step.requeue_s, step.create
    doc, rejected = judged(step.adopted or doc, spec, inputs.name)
    note = note or rejected
    rec = update_correction(
        doc,
        inputs.samples,
        inputs.annotations,
        before,
        cfg.observed_min_samples,
        inputs.now,
    )
    doc, st.observed = rec.document, rec.observed
    out.events += rec.events
    if inputs.configmap is None:
        owner = owner_reference("GPUPool", name, inputs.uid)
        out.configmap_create = coefficients_configmap(name, ns, owner, doc)
    elif note or rec.changed:
        out.configmap_data = doc.to_configmap_data()
    st.conditions = _bench_conditions(st.conditions, step, st.benchmark_phase, generation, now)
    if step.message and step.update.get("benchmark_phase") in (
        BenchmarkPhase.BACKOFF,
        BenchmarkPhase.FAILED,
    ):
        out.events.append(("Warning", "BenchmarkFailed", step.message))
    _publish(out, before, spec, doc, note, f"{ns}/{cm_name}", generation, now)
    return out


def judged(
    doc: CoefficientsDocument, spec: GPUPoolSpec, name: str
) -> tuple[CoefficientsDocument, str]:
    """A measured document whose validation did not beat the datasheet priors on unseen
    models (`ValidationVerdict`) is not adopted: the priors are, carrying its verdict so the
    status says why, and a note to write them. Anything else is returned as it is (a
    measured document without a verdict — written by hand or by a run that did not
    validate — is adopted, and the status says it was not checked)."""
    verdict = doc.validation
    if doc.source is not Source.MEASURED or verdict is None or verdict.beats_priors:
        return doc, ""
    measured = doc.measured_at.isoformat() if doc.measured_at else "?"
    prior = pool_priors(spec, Precision.BF16, name).model_copy(
        update={
            "validation": verdict,
            "observed": doc.observed,
            "notes": [
                f"datasheet priors kept over the measured coefficients of {measured}: "
                f"{verdict.describe()}"
            ],
        }
    )
    return prior, f"kept over the measured coefficients of {measured}, which did not beat them"


def _stored_document(
    inputs: PoolInputs, spec: GPUPoolSpec, cfg: OperatorConfig
) -> tuple[CoefficientsDocument, str]:
    """The ConfigMap's document, or the datasheet priors with a note why it was reset (a
    missing ConfigMap is created with the priors, no note)."""
    prior = pool_priors(spec, Precision.BF16, inputs.name)
    cm = inputs.configmap
    if cm is None:
        return prior, ""
    where = f"configmap {cfg.namespace}/{coefficients_configmap_name(inputs.name)}"
    try:
        doc = CoefficientsDocument.from_configmap_data(cm.get("data"), where)
    except SpecError as exc:
        return prior, f"the ConfigMap held invalid coefficients ({exc}); reset to datasheet priors"
    if doc.gpu.name.lower() != spec.gpu.name.lower():
        note = f"the ConfigMap described {doc.gpu.name}, the pool is {spec.gpu.name}; reset to datasheet priors"
        return prior, note
    return doc, ""


def _publish(
    out: PoolDecision,
    before: GPUPoolStatus,
    spec: GPUPoolSpec,
    doc: CoefficientsDocument,
    note: str,
    configmap: str,
    generation: int,
    now: str,
) -> None:
    """The coefficients plans use: source, revision, ``CoefficientsReady``, the gauges."""
    st = out.status
    measured = doc.source is Source.MEASURED
    st.source = "measured" if measured else "prior"
    st.measured_at = doc.measured_at.isoformat() if doc.measured_at else ""
    st.fit_mape = doc.fit_mape()
    st.coefficients_revision = coefficients_revision(spec, doc)
    verdict = doc.validation
    kept = not measured and verdict is not None
    if measured:
        checked = (
            f"; against the priors on unseen models: {verdict.describe()}"
            if verdict is not None
            else "; not checked against the priors (no validation in the document)"
        )
        message = f"measured coefficients from {st.measured_at} in {configmap}{checked}"
    elif kept:
        assert verdict is not None
        message = (
            f"datasheet priors for {spec.gpu.name} in {configmap}: the benchmark's measured "
            f"coefficients did not predict unseen models better ({verdict.describe()})"
        )
    else:
        message = (
            f"datasheet priors for {spec.gpu.name} in {configmap}; enable spec.benchmark to measure"
        )
    if note:
        message = f"{message} ({note})"
    if st.observed is not None and st.observed.compute_scale is not None:
        message += (
            f"; observed correction: compute ×{st.observed.compute_scale:.3g} from "
            f"{st.observed.samples} island(s) (annotate {RESET_ANNOTATION} to reset)"
        )
    st.conditions = set_condition(
        st.conditions,
        Type.COEFFICIENTS_READY,
        True,
        Reason.MEASURED if measured else Reason.PRIORS_KEPT if kept else Reason.PRIORS,
        message,
        generation,
        now,
    )
    out.gauges = PoolGauges(
        st.source,
        (doc.measured_at or doc.created_at).timestamp(),
        st.fit_mape,
        st.observed.compute_scale if st.observed else None,
        st.observed.samples if st.observed else 0,
    )
    if before.source != st.source and measured:
        out.events.append(("Normal", "CoefficientsMeasured", message))
    if kept and note:
        out.events.append(("Warning", Reason.PRIORS_KEPT, message))


# ---- the benchmark state machine --------------------------------------------------------------
@dataclass(frozen=True)
class BenchStep:
    """What one pass of the benchmark state machine decided."""

    update: dict[str, Any] = field(default_factory=dict)
    """GPUPoolStatus fields to change (python names)."""
    adopted: CoefficientsDocument | None = None
    message: str = ""
    requeue_s: float | None = None
    create: list[Manifest] = field(default_factory=list)


def _job_state(job: Manifest | None) -> tuple[str, str]:
    """("complete" | "failed" | "running" | "missing", reason)."""
    if job is None:
        return "missing", ""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "complete", ""
        if c.get("status") == "True" and c.get("type") == "Failed":
            return "failed", f"{c.get('reason', 'Failed')}: {c.get('message', '')}".strip(": ")
    return "running", ""


def _benchmark(
    inputs: PoolInputs, spec: GPUPoolSpec, stored: CoefficientsDocument, cfg: OperatorConfig
) -> BenchStep:
    """One pass of the state machine; ``stored``: the ConfigMap's document (after a reset to
    the priors), which a finished benchmark must have replaced by measured coefficients."""
    status, generation = inputs.status, inputs.generation
    if not spec.benchmark.enabled:
        return BenchStep(
            {"benchmark_phase": BenchmarkPhase.DISABLED, "benchmark_job": "", "next_retry_at": ""}
        )
    phase = status.benchmark_phase
    attempts = status.benchmark_attempts
    if status.benchmark_generation != generation or phase is BenchmarkPhase.DISABLED:
        return _start(inputs, spec, 0, cfg)  # measure again
    if phase in (BenchmarkPhase.SUCCEEDED, BenchmarkPhase.FAILED):
        return BenchStep()
    if phase is BenchmarkPhase.BACKOFF:
        if status.next_retry_at and (left := _due_in_s(status.next_retry_at, inputs.now)) > 0:
            return BenchStep(requeue_s=left)
        return _start(inputs, spec, attempts, cfg)
    job_name = _watched_job(inputs.name, spec, status, generation)
    assert job_name is not None  # Running, of this generation
    ns = cfg.namespace
    state, why = _job_state(inputs.bench_job)
    if state == "missing":
        return _start(inputs, spec, attempts, cfg)
    if state == "running":
        return BenchStep()
    if state == "complete":
        if stored.source is not Source.MEASURED:
            unpublished = SpecError(
                "source", "the benchmark Job finished without publishing measured coefficients"
            )
            why = f"{Reason.INVALID_COEFFICIENTS}: {unpublished}"
        else:
            return BenchStep(
                {"benchmark_phase": BenchmarkPhase.SUCCEEDED, "next_retry_at": ""},
                stored,
                f"benchmark Job {ns}/{job_name} succeeded",
            )
    return _failed(job_name, why, attempts + 1, spec, inputs.now, cfg)


def _failed(
    job_name: str,
    why: str,
    attempts: int,
    spec: GPUPoolSpec,
    now: datetime,
    cfg: OperatorConfig,
) -> BenchStep:
    """BackOff until the retry is due, or Failed after ``spec.benchmark.maxRetries``."""
    message = f"benchmark Job {cfg.namespace}/{job_name} failed ({why or 'no reason given'})"
    if attempts > spec.benchmark.max_retries:
        return BenchStep(
            {
                "benchmark_phase": BenchmarkPhase.FAILED,
                "benchmark_attempts": attempts,
                "next_retry_at": "",
            },
            None,
            f"{message}; gave up after {attempts} attempts — fix the cause and change the spec to retry",
        )
    backoff_s = cfg.retry_backoff_s * 2 ** (attempts - 1)
    due = _iso(now + timedelta(seconds=backoff_s))
    return BenchStep(
        {
            "benchmark_phase": BenchmarkPhase.BACKOFF,
            "benchmark_attempts": attempts,
            "next_retry_at": due,
        },
        None,
        f"{message}; retry {attempts}/{spec.benchmark.max_retries} at {due}",
        requeue_s=backoff_s,
    )


def _due_in_s(due: str, now: datetime) -> float:
    return (datetime.fromisoformat(due.replace("Z", "+00:00")) - now).total_seconds()


def _start(inputs: PoolInputs, spec: GPUPoolSpec, attempt: int, cfg: OperatorConfig) -> BenchStep:
    name, generation, ns = inputs.name, inputs.generation, cfg.namespace
    owner = owner_reference("GPUPool", name, inputs.uid)
    job, service = bench_job(
        name,
        spec,
        namespace=ns,
        image=spec.benchmark.image or cfg.bench_image,
        service_account=cfg.bench_service_account,
        generation=generation,
        attempt=attempt,
        owner=owner,
    )
    return BenchStep(
        {
            "benchmark_phase": BenchmarkPhase.RUNNING,
            "benchmark_job": job["metadata"]["name"],
            "benchmark_attempts": attempt,
            "benchmark_generation": generation,
            "next_retry_at": "",
        },
        None,
        f"benchmark Job {ns}/{job['metadata']['name']} started",
        create=[*bench_role(name, ns, cfg.bench_service_account, owner), service, job],
    )


def _bench_conditions(
    conditions: list[Condition],
    step: BenchStep,
    phase: BenchmarkPhase,
    generation: int,
    now: str,
) -> list[Condition]:
    message = step.message
    if phase is BenchmarkPhase.DISABLED:
        return set_condition(
            conditions,
            Type.BENCHMARK_SUCCEEDED,
            None,
            Reason.BENCHMARK_DISABLED,
            "benchmarking is disabled; the pool uses datasheet priors",
            generation,
            now,
        )
    if not message:
        return conditions
    table = {
        BenchmarkPhase.RUNNING: (None, Reason.BENCHMARK_RUNNING),
        BenchmarkPhase.SUCCEEDED: (True, Reason.MEASURED),
        BenchmarkPhase.BACKOFF: (False, Reason.BENCHMARK_RETRYING),
        BenchmarkPhase.FAILED: (False, Reason.BENCHMARK_FAILED),
    }
    value, reason = table[phase]
    return set_condition(
        conditions, Type.BENCHMARK_SUCCEEDED, value, reason, message, generation, now
    )
