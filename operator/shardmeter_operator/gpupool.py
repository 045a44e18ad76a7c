"""GPUPool reconciliation: keep the pool's coefficients ConfigMap, run (and retry) its
benchmark Job, adopt measured coefficients, and publish a revision plans can follow.

Level-triggered: the same function runs when the pool, its coefficients ConfigMap or its
benchmark Job change (and when a benchmark retry is due); it reads what exists and returns
the whole new status (a :class:`GPUPoolStatus`). Running it twice changes nothing the second
time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from shardmeter.cost.coefficients import CoefficientsDocument, Source
from shardmeter.cost.observed import ObservedStepSample
from shardmeter.cost.priors import pool_priors
from shardmeter.errors import SpecError, spec_error_from_validation
from shardmeter.spec.training import Precision
from shardmeter_operator import metrics
from shardmeter_operator.conditions import Reason, Type, set_condition
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.kube import Kube
from shardmeter_operator.manifests import (
    bench_job,
    bench_job_name,
    bench_role,
    coefficients_configmap,
    coefficients_configmap_name,
    owner_reference,
)
from shardmeter_operator.recalibrate import RESET_ANNOTATION, coefficients_revision, recalibrate
from shardmeter_operator.resources import BenchmarkPhase, Condition, GPUPoolSpec, GPUPoolStatus

Status = dict[str, Any]
Event = tuple[str, str, str]


@dataclass
class PoolResult:
    status: GPUPoolStatus
    events: list[Event] = field(default_factory=list)
    requeue_s: float | None = None
    """When a benchmark retry is due."""


def _job_state(job: dict[str, Any] | None) -> tuple[str, str]:
    """("complete" | "failed" | "running" | "missing", reason)."""
    if job is None:
        return "missing", ""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "complete", ""
        if c.get("status") == "True" and c.get("type") == "Failed":
            return "failed", f"{c.get('reason', 'Failed')}: {c.get('message', '')}".strip(": ")
    return "running", ""


async def reconcile_pool(
    body: Any,
    cfg: OperatorConfig,
    kube: Kube,
    samples: Sequence[ObservedStepSample] = (),
) -> PoolResult:
    """The new status of a GPUPool (see the module docstring); ``samples``: steps observed
    on the pool by launched plans, for its observed correction (:mod:`~.recalibrate`)."""
    meta = body.get("metadata") or {}
    name, uid = str(meta["name"]), str(meta["uid"])
    generation = int(meta.get("generation") or 1)
    before = GPUPoolStatus.model_validate(body.get("status") or {})
    st = before.model_copy(deep=True, update={"observed_generation": generation})
    out = PoolResult(st)
    try:
        spec = GPUPoolSpec.model_validate(dict(body.get("spec") or {}))
    except ValidationError as exc:
        err = str(spec_error_from_validation(exc, "spec"))
        metrics.forget_pool(name)
        old = next((c for c in before.conditions if c.type == Type.VALID), None)
        if old is None or old.message != err:
            out.events.append(("Warning", Reason.INVALID_SPEC, err))
        st.conditions = set_condition(
            st.conditions, Type.VALID, False, Reason.INVALID_SPEC, err, generation
        )
        return out
    st.conditions = set_condition(
        st.conditions, Type.VALID, True, Reason.SPEC_VALID, "spec is valid", generation
    )
    owner = owner_reference("GPUPool", name, uid)
    ns = cfg.namespace
    cm_name = coefficients_configmap_name(name)
    prior = pool_priors(spec, Precision.BF16, name)
    cm = await kube.get("v1", "ConfigMap", ns, cm_name)
    doc: CoefficientsDocument | None = None
    note = ""
    if cm is None:
        await kube.create(coefficients_configmap(name, ns, owner, prior))
        doc = prior
    else:
        try:
            doc = CoefficientsDocument.from_configmap_data(
                cm.get("data"), f"configmap {ns}/{cm_name}"
            )
        except SpecError as exc:
            note = f"the ConfigMap held invalid coefficients ({exc}); reset to datasheet priors"
        if doc is not None and doc.gpu.name.lower() != spec.gpu.name.lower():
            note = f"the ConfigMap described {doc.gpu.name}, the pool is {spec.gpu.name}; reset to datasheet priors"
            doc = None
        if doc is None:
            await kube.patch("v1", "ConfigMap", ns, cm_name, {"data": prior.to_configmap_data()})
            doc = prior
    st.coefficients_config_map = f"{ns}/{cm_name}"
    step = await _benchmark(name, spec, before, generation, owner, cfg, kube)
    st = out.status = st.model_copy(update=step.update)
    out.requeue_s = step.requeue_s
    doc = step.adopted or doc
    doc, st.observed, observed_events = await recalibrate(
        name,
        doc,
        samples,
        meta.get("annotations") or {},
        before,
        cfg.observed_min_samples,
        (ns, cm_name),
        kube,
    )
    out.events += observed_events
    st.conditions = _bench_conditions(st.conditions, step, st.benchmark_phase, generation)
    if step.message and step.update.get("benchmark_phase") in (
        BenchmarkPhase.BACKOFF,
        BenchmarkPhase.FAILED,
    ):
        out.events.append(("Warning", "BenchmarkFailed", step.message))
    source = doc.source.value
    st.source = source  # type: ignore[assignment]
    st.measured_at = doc.measured_at.isoformat() if doc.measured_at else ""
    st.fit_mape = doc.fit_mape()
    st.coefficients_revision = coefficients_revision(spec, doc)
    message = (
        f"measured coefficients from {st.measured_at} in {ns}/{cm_name}"
        if doc.source is Source.MEASURED
        else f"datasheet priors for {spec.gpu.name} in {ns}/{cm_name}; enable spec.benchmark to measure"
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
        Reason.MEASURED if doc.source is Source.MEASURED else Reason.PRIORS,
        message,
        generation,
    )
    stamp = (doc.measured_at or doc.created_at).timestamp()
    metrics.set_pool(name, source, stamp, doc.fit_mape())
    metrics.set_pool_observed(
        name,
        st.observed.compute_scale if st.observed else None,
        st.observed.samples if st.observed else 0,
    )
    if before.source != source and source == "measured":
        out.events.append(("Normal", "CoefficientsMeasured", message))
    return out


@dataclass(frozen=True)
class BenchStep:
    """What one pass of the benchmark state machine decided."""

    update: dict[str, Any] = field(default_factory=dict)
    """GPUPoolStatus fields to change (python names)."""
    adopted: CoefficientsDocument | None = None
    message: str = ""
    requeue_s: float | None = None


def _due_in_s(due: str) -> float:
    return (datetime.fromisoformat(due.replace("Z", "+00:00")) - datetime.now(UTC)).total_seconds()


async def _benchmark(
    name: str,
    spec: GPUPoolSpec,
    status: GPUPoolStatus,
    generation: int,
    owner: dict[str, Any],
    cfg: OperatorConfig,
    kube: Kube,
) -> BenchStep:
    """The benchmark state machine: Disabled → Running → Succeeded | BackOff → … → Failed."""
    ns = cfg.namespace
    if not spec.benchmark.enabled:
        return BenchStep(
            {"benchmark_phase": BenchmarkPhase.DISABLED, "benchmark_job": "", "next_retry_at": ""}
        )
    phase = status.benchmark_phase
    attempts = status.benchmark_attempts
    if status.benchmark_generation != generation or phase is BenchmarkPhase.DISABLED:
        return await _start(name, spec, generation, 0, owner, cfg, kube)  # measure again
    if phase in (BenchmarkPhase.SUCCEEDED, BenchmarkPhase.FAILED):
        return BenchStep()
    if phase is BenchmarkPhase.BACKOFF:
        if status.next_retry_at and (left := _due_in_s(status.next_retry_at)) > 0:
            return BenchStep(requeue_s=left)
        return await _start(name, spec, generation, attempts, owner, cfg, kube)
    job_name = status.benchmark_job or bench_job_name(name, generation, attempts)
    state, why = _job_state(await kube.get("batch/v1", "Job", ns, job_name))
    if state == "missing":
        return await _start(name, spec, generation, attempts, owner, cfg, kube)
    if state == "running":
        return BenchStep()
    if state == "complete":
        cm = await kube.get("v1", "ConfigMap", ns, coefficients_configmap_name(name))
        try:
            measured = CoefficientsDocument.from_configmap_data(
                (cm or {}).get("data"), f"configmap {ns}"
            )
            if measured.source is not Source.MEASURED:
                raise SpecError(
                    "source", "the benchmark Job finished without publishing measured coefficients"
                )
            if measured.gpu.name.lower() != spec.gpu.name.lower():
                raise SpecError(
                    "gpu", f"the benchmark measured {measured.gpu.name}, not {spec.gpu.name}"
                )
        except SpecError as exc:
            why = f"{Reason.INVALID_COEFFICIENTS}: {exc}"
        else:
            return BenchStep(
                {"benchmark_phase": BenchmarkPhase.SUCCEEDED, "next_retry_at": ""},
                measured,
                f"benchmark Job {ns}/{job_name} succeeded",
            )
    attempts += 1
    message = f"benchmark Job {ns}/{job_name} failed ({why or 'no reason given'})"
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
    delay = cfg.retry_backoff_s * 2 ** (attempts - 1)
    due = (
        (datetime.now(UTC) + timedelta(seconds=delay))
        .replace(microsecond=0)
        .isoformat()
        .replace("+00:00", "Z")
    )
    return BenchStep(
        {
            "benchmark_phase": BenchmarkPhase.BACKOFF,
            "benchmark_attempts": attempts,
            "next_retry_at": due,
        },
        None,
        f"{message}; retry {attempts}/{spec.benchmark.max_retries} at {due}",
        requeue_s=delay,
    )


async def _start(
    name: str,
    spec: GPUPoolSpec,
    generation: int,
    attempt: int,
    owner: dict[str, Any],
    cfg: OperatorConfig,
    kube: Kube,
) -> BenchStep:
    ns = cfg.namespace
    for m in bench_role(name, ns, cfg.bench_service_account, owner):
        await kube.create(m)
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
    await kube.create(service)
    await kube.create(job)
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
    )


def _bench_conditions(
    conditions: list[Condition], step: BenchStep, phase: BenchmarkPhase, generation: int
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
    return set_condition(conditions, Type.BENCHMARK_SUCCEEDED, value, reason, message, generation)
