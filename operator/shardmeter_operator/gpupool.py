"""GPUPool reconciliation: keep the pool's coefficients ConfigMap, run (and retry) its
benchmark Job, adopt measured coefficients, and publish a revision plans can follow.

Level-triggered: the same function runs on create/update/resume and on a timer, reads
what exists, and returns the status patch. Running it twice changes nothing the second
time."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
from pydantic import ValidationError

from shardmeter.cost.coefficients import CoefficientsDocument, Source
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
from shardmeter_operator.planning import revision
from shardmeter_operator.resources import BenchmarkPhase, GPUPoolSpec

Status = dict[str, Any]


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
    name: str,
    uid: str,
    generation: int,
    spec_raw: dict[str, Any],
    status: Status,
    cfg: OperatorConfig,
    kube: Kube,
    body: Any = None,
) -> Status:
    """The status patch for GPUPool ``name`` (see the module docstring)."""
    conditions = list(status.get("conditions") or [])
    try:
        spec = GPUPoolSpec.model_validate(spec_raw)
    except ValidationError as exc:
        err = spec_error_from_validation(exc, "spec")
        metrics.forget_pool(name)
        return {
            "observedGeneration": generation,
            "conditions": set_condition(
                conditions, Type.VALID, False, Reason.INVALID_SPEC, str(err), generation
            ),
        }
    conditions = set_condition(
        conditions, Type.VALID, True, Reason.SPEC_VALID, "spec is valid", generation
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
    patch: Status = {"observedGeneration": generation, "coefficientsConfigMap": f"{ns}/{cm_name}"}
    step = await _benchmark(name, spec, status, generation, owner, cfg, kube)
    patch.update(step.patch)
    doc = step.adopted or doc
    conditions = _bench_conditions(conditions, step, status, generation)
    source = doc.source.value
    patch.update(
        source=source,
        measuredAt=doc.measured_at.isoformat() if doc.measured_at else "",
        fitMape=doc.fit_mape(),
        coefficientsRevision=revision(spec.model_dump(), doc.to_json()),
    )
    message = (
        f"measured coefficients from {patch['measuredAt']} in {ns}/{cm_name}"
        if doc.source is Source.MEASURED
        else f"datasheet priors for {spec.gpu.name} in {ns}/{cm_name}; enable spec.benchmark to measure"
    )
    if note:
        message = f"{message} ({note})"
    conditions = set_condition(
        conditions,
        Type.COEFFICIENTS_READY,
        True,
        Reason.MEASURED if doc.source is Source.MEASURED else Reason.PRIORS,
        message,
        generation,
    )
    patch["conditions"] = conditions
    stamp = (doc.measured_at or doc.created_at).timestamp()
    metrics.set_pool(name, source, stamp, doc.fit_mape())
    if body is not None and status.get("source") != source and source == "measured":
        kopf.info(body, reason="CoefficientsMeasured", message=message)
    return patch


@dataclass(frozen=True)
class BenchStep:
    """What one pass of the benchmark state machine decided."""

    patch: Status = field(default_factory=dict)
    adopted: CoefficientsDocument | None = None
    message: str = ""


async def _benchmark(
    name: str,
    spec: GPUPoolSpec,
    status: Status,
    generation: int,
    owner: dict[str, Any],
    cfg: OperatorConfig,
    kube: Kube,
) -> BenchStep:
    """The benchmark state machine: Disabled → Running → Succeeded | BackOff → … → Failed."""
    ns = cfg.namespace
    if not spec.benchmark.enabled:
        return BenchStep(
            {"benchmarkPhase": BenchmarkPhase.DISABLED.value, "benchmarkJob": "", "nextRetryAt": ""}
        )
    phase = status.get("benchmarkPhase", BenchmarkPhase.DISABLED.value)
    attempts = int(status.get("benchmarkAttempts", 0))
    if (
        int(status.get("benchmarkGeneration", 0)) != generation
        or phase == BenchmarkPhase.DISABLED.value
    ):
        return await _start(
            name, spec, generation, 0, owner, cfg, kube
        )  # a new spec: measure again
    if phase in (BenchmarkPhase.SUCCEEDED.value, BenchmarkPhase.FAILED.value):
        return BenchStep()
    if phase == BenchmarkPhase.BACKOFF.value:
        due = status.get("nextRetryAt", "")
        if due and datetime.fromisoformat(due.replace("Z", "+00:00")) > datetime.now(UTC):
            return BenchStep()
        return await _start(name, spec, generation, attempts, owner, cfg, kube)
    job_name = status.get("benchmarkJob") or bench_job_name(name, generation, attempts)
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
                {"benchmarkPhase": BenchmarkPhase.SUCCEEDED.value, "nextRetryAt": ""},
                measured,
                f"benchmark Job {ns}/{job_name} succeeded",
            )
    attempts += 1
    message = f"benchmark Job {ns}/{job_name} failed ({why or 'no reason given'})"
    if attempts > spec.benchmark.max_retries:
        return BenchStep(
            {
                "benchmarkPhase": BenchmarkPhase.FAILED.value,
                "benchmarkAttempts": attempts,
                "nextRetryAt": "",
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
            "benchmarkPhase": BenchmarkPhase.BACKOFF.value,
            "benchmarkAttempts": attempts,
            "nextRetryAt": due,
        },
        None,
        f"{message}; retry {attempts}/{spec.benchmark.max_retries} at {due}",
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
            "benchmarkPhase": BenchmarkPhase.RUNNING.value,
            "benchmarkJob": job["metadata"]["name"],
            "benchmarkAttempts": attempt,
            "benchmarkGeneration": generation,
            "nextRetryAt": "",
        },
        None,
        f"benchmark Job {ns}/{job['metadata']['name']} started",
    )


def _bench_conditions(
    conditions: list[dict[str, Any]], step: BenchStep, status: Status, generation: int
) -> list[dict[str, Any]]:
    message = step.message
    phase = str(
        step.patch.get("benchmarkPhase")
        or status.get("benchmarkPhase")
        or BenchmarkPhase.DISABLED.value
    )
    if phase == BenchmarkPhase.DISABLED.value:
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
        BenchmarkPhase.RUNNING.value: (None, Reason.BENCHMARK_RUNNING),
        BenchmarkPhase.SUCCEEDED.value: (True, Reason.MEASURED),
        BenchmarkPhase.BACKOFF.value: (False, Reason.BENCHMARK_RETRYING),
        BenchmarkPhase.FAILED.value: (False, Reason.BENCHMARK_FAILED),
    }
    value, reason = table[phase]
    return set_condition(conditions, Type.BENCHMARK_SUCCEEDED, value, reason, message, generation)
