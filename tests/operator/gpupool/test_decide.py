"""The GPUPool decision, without any API server: its coefficients ConfigMap and the benchmark
state machine (Disabled → Running → Succeeded | BackOff → … → Failed) as `decide_pool` makes
them."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from shardmeter.cost.coefficients import CoefficientsDocument, Source, ValidationVerdict
from shardmeter.cost.priors import pool_priors
from shardmeter.spec.training import Precision
from shardmeter_operator.api import GPUPoolSpec, GPUPoolStatus
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.gpupool.decide import PoolDecision, PoolInputs, decide_pool, pool_reads
from shardmeter_operator.render.benchmark import coefficients_configmap_name

REPO = Path(__file__).resolve().parents[3]
POOL = yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())["spec"]
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
CFG = OperatorConfig(retry_backoff_s=60.0)


def spec(benchmark: bool = False, max_retries: int = 2) -> dict[str, Any]:
    out = copy.deepcopy(POOL)
    out["benchmark"] = {"enabled": benchmark, "maxRetries": max_retries}
    return out


def configmap(
    source: Source = Source.PRIOR,
    gpu: str | None = None,
    verdict: ValidationVerdict | None = None,
) -> dict[str, Any]:
    pool = GPUPoolSpec.model_validate(spec() if gpu is None else {**spec(), "gpu": gpu})
    doc = pool_priors(pool, Precision.BF16, "cluster-a")
    if source is Source.MEASURED:
        doc = doc.model_copy(
            update={"source": Source.MEASURED, "measured_at": NOW, "validation": verdict}
        )
    return {
        "metadata": {"name": coefficients_configmap_name("cluster-a")},
        "data": doc.to_configmap_data(),
    }


def decide(
    s: dict[str, Any],
    status: GPUPoolStatus | None = None,
    *,
    cm: dict[str, Any] | None = None,
    job: dict[str, Any] | None = None,
    now: datetime = NOW,
    generation: int = 1,
) -> PoolDecision:
    return decide_pool(
        PoolInputs("cluster-a", "uid-p", generation, s, status or GPUPoolStatus(), now, cm, job),
        CFG,
    )


def condition(out: PoolDecision, type_: str) -> tuple[str, str, str]:
    c = next(c for c in out.status.conditions if c.type == type_)
    return c.status.value, c.reason, c.message


def job(state: str) -> dict[str, Any]:
    conditions = {
        "failed": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}],
        "complete": [{"type": "Complete", "status": "True"}],
        "running": [],
    }[state]
    return {"metadata": {"name": "bench"}, "status": {"conditions": conditions}}


def running_benchmark() -> tuple[GPUPoolStatus, str]:
    """The status once the first benchmark Job was started, and that Job's name."""
    out = decide(spec(benchmark=True), cm=configmap())
    name = out.status.benchmark_job
    assert pool_reads("cluster-a", spec(benchmark=True), out.status, 1).bench_job == name
    return out.status, name


# ---- the spec and the ConfigMap ---------------------------------------------------------------
def test_an_invalid_spec_names_the_field_and_writes_nothing() -> None:
    s = {**spec(), "nodes": 0}
    out = decide(s)
    status, reason, message = condition(out, "Valid")
    assert (status, reason) == ("False", "InvalidSpec") and message.startswith("spec.nodes:")
    assert out.configmap_create is None and out.configmap_data is None and out.create == []
    assert out.gauges is None  # the pool's series are dropped
    assert pool_reads("cluster-a", s, GPUPoolStatus(), 1).configmap is None
    assert out.events == [("Warning", "InvalidSpec", message)]


def test_a_new_pool_publishes_datasheet_priors() -> None:
    out = decide(spec())
    assert out.configmap_create is not None and out.create == []
    assert out.configmap_create["metadata"]["name"] == coefficients_configmap_name("cluster-a")
    assert out.status.source == "prior" and out.status.coefficients_revision
    assert condition(out, "CoefficientsReady")[:2] == ("True", "DatasheetPriors")
    assert condition(out, "BenchmarkSucceeded")[:2] == ("Unknown", "BenchmarkDisabled")
    # the next pass finds the ConfigMap as written: nothing more to write, same revision
    again = decide(spec(), out.status, cm=out.configmap_create)
    assert again.configmap_create is None and again.configmap_data is None
    assert again.status.coefficients_revision == out.status.coefficients_revision
    assert again.events == []


def test_coefficients_of_another_gpu_are_reset_to_the_priors() -> None:
    out = decide(spec(), cm=configmap(Source.MEASURED, gpu="a100-80gb-sxm"))
    assert out.configmap_data is not None  # rewritten with the priors
    assert out.status.source == "prior"
    assert "reset to datasheet priors" in condition(out, "CoefficientsReady")[2]


# ---- the benchmark state machine --------------------------------------------------------------
def test_enabling_the_benchmark_starts_its_job_with_its_role() -> None:
    out = decide(spec(benchmark=True), cm=configmap())
    assert [m["kind"] for m in out.create] == ["Role", "RoleBinding", "Service", "Job"]
    assert out.status.benchmark_phase.value == "Running"
    assert out.status.benchmark_job == out.create[-1]["metadata"]["name"]
    assert condition(out, "BenchmarkSucceeded")[:2] == ("Unknown", "BenchmarkRunning")


def test_a_running_benchmark_waits_and_a_missing_job_is_started_again() -> None:
    status, _ = running_benchmark()
    waiting = decide(spec(benchmark=True), status, cm=configmap(), job=job("running"))
    assert waiting.create == [] and waiting.status.benchmark_phase.value == "Running"
    missing = decide(spec(benchmark=True), status, cm=configmap(), job=None)
    assert [m["kind"] for m in missing.create][-1] == "Job"


def test_a_failed_benchmark_backs_off_doubling_then_gives_up() -> None:
    status, _ = running_benchmark()
    out = decide(spec(benchmark=True), status, cm=configmap(), job=job("failed"))
    st = out.status
    assert (st.benchmark_phase.value, st.benchmark_attempts) == ("BackOff", 1)
    assert st.next_retry_at == "2026-01-02T03:05:05Z" and out.requeue_s == 60.0
    assert condition(out, "BenchmarkSucceeded")[:2] == ("False", "BenchmarkBackOff")
    assert ("Warning", "BenchmarkFailed") in [e[:2] for e in out.events]
    # not due yet: wait the rest; due: attempt 1 starts
    early = decide(spec(benchmark=True), st, cm=configmap(), now=NOW + timedelta(seconds=20))
    assert early.create == [] and early.requeue_s == 40.0
    due = decide(spec(benchmark=True), st, cm=configmap(), now=NOW + timedelta(seconds=60))
    assert due.status.benchmark_phase.value == "Running" and due.status.benchmark_attempts == 1
    # attempt 2 fails: 120 s; attempt 3 fails: more than maxRetries (2): Failed for good
    second = decide(spec(benchmark=True), due.status, cm=configmap(), job=job("failed"))
    assert second.requeue_s == 120.0 and second.status.benchmark_attempts == 2
    later = NOW + timedelta(seconds=180)
    retried = decide(spec(benchmark=True), second.status, cm=configmap(), now=later)
    assert retried.status.benchmark_phase.value == "Running"
    third = decide(spec(benchmark=True), retried.status, cm=configmap(), job=job("failed"))
    assert third.status.benchmark_phase.value == "Failed" and third.requeue_s is None
    assert condition(third, "BenchmarkSucceeded")[:2] == ("False", "BenchmarkFailed")
    assert "gave up after 3 attempts" in condition(third, "BenchmarkSucceeded")[2]


def test_a_benchmark_that_published_measured_coefficients_succeeds() -> None:
    status, _ = running_benchmark()
    out = decide(spec(benchmark=True), status, cm=configmap(Source.MEASURED), job=job("complete"))
    assert out.status.benchmark_phase.value == "Succeeded"
    assert out.status.source == "measured"
    assert out.status.coefficients_revision != status.coefficients_revision
    assert condition(out, "BenchmarkSucceeded")[:2] == ("True", "Measured")
    assert condition(out, "CoefficientsReady")[:2] == ("True", "Measured")
    assert ("Normal", "CoefficientsMeasured") in [e[:2] for e in out.events]
    assert out.gauges is not None and out.gauges.source == "measured"


def test_a_benchmark_that_published_nothing_counts_as_failed() -> None:
    status, _ = running_benchmark()
    out = decide(spec(benchmark=True), status, cm=configmap(Source.PRIOR), job=job("complete"))
    assert out.status.benchmark_phase.value == "BackOff"
    assert "without publishing measured coefficients" in condition(out, "BenchmarkSucceeded")[2]
    assert out.status.source == "prior"


def test_a_new_spec_generation_measures_again() -> None:
    status, _ = running_benchmark()
    done = decide(spec(benchmark=True), status, cm=configmap(Source.MEASURED), job=job("complete"))
    assert decide(spec(benchmark=True), done.status, cm=configmap(Source.MEASURED)).create == []
    again = decide(spec(benchmark=True), done.status, cm=configmap(Source.MEASURED), generation=2)
    assert [m["kind"] for m in again.create][-1] == "Job"
    assert again.status.benchmark_generation == 2 and again.status.benchmark_attempts == 0


def _verdict(document: tuple[float, float], priors: tuple[float, float]) -> ValidationVerdict:
    return ValidationVerdict(
        points=14,
        suite="7 unseen architectures, hidden 2048–8192, 4096–16384 tokens",
        document_median_error=document[0],
        document_max_error=document[1],
        priors_median_error=priors[0],
        priors_max_error=priors[1],
    )


def test_a_measured_document_that_beats_the_priors_is_adopted_and_says_so() -> None:
    status, _ = running_benchmark()
    better = _verdict((0.04, 0.09), (0.06, 0.22))
    cm = configmap(Source.MEASURED, verdict=better)
    out = decide(spec(benchmark=True), status, cm=cm, job=job("complete"))
    assert out.status.source == "measured" and out.configmap_data is None
    value, reason, message = condition(out, "CoefficientsReady")
    assert (value, reason) == ("True", "Measured")
    assert "document 4.0 % median / 9.0 % max vs priors 6.0 % / 22.0 %" in message


def test_a_measured_document_that_loses_to_the_priors_is_not_adopted() -> None:
    # worse in either figure (here the maximum) and the priors stay: the ConfigMap is
    # rewritten with them, carrying the verdict, and the status says why
    status, _ = running_benchmark()
    worse = _verdict((0.05, 0.33), (0.06, 0.22))
    cm = configmap(Source.MEASURED, verdict=worse)
    out = decide(spec(benchmark=True), status, cm=cm, job=job("complete"))
    assert out.status.benchmark_phase.value == "Succeeded"  # the benchmark itself succeeded
    assert out.status.source == "prior"
    value, reason, message = condition(out, "CoefficientsReady")
    assert (value, reason) == ("True", "PriorsKept")
    assert "did not predict unseen models better" in message and "33.0 % max" in message
    assert ("Warning", "PriorsKept") in [e[:2] for e in out.events]
    assert out.configmap_data is not None
    kept = CoefficientsDocument.from_configmap_data(out.configmap_data)
    assert kept.source is Source.PRIOR and kept.validation == worse
    # the next pass reads the priors it wrote: nothing to rewrite, the reason stays
    again = decide(
        spec(benchmark=True), out.status, cm={"data": out.configmap_data}, job=job("complete")
    )
    assert again.configmap_data is None and again.events == []
    assert condition(again, "CoefficientsReady")[1] == "PriorsKept"


def test_a_measured_document_without_a_verdict_is_adopted_as_unchecked() -> None:
    status, _ = running_benchmark()
    out = decide(spec(benchmark=True), status, cm=configmap(Source.MEASURED), job=job("complete"))
    assert out.status.source == "measured"
    assert "not checked against the priors" in condition(out, "CoefficientsReady")[2]
