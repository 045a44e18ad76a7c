"""The operator observing launched islands, against the emulated API server: the island pods
serve the launch end-to-end run's real logs (``pods/log``), the operator reads them, reports
drift, learns a correction for the pool that later plans use, resets it on request, flags a
synthetic slow island, and says why when there is nothing to observe."""

from __future__ import annotations

import copy
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from operator_support import OPERATOR_NS, apply, condition, manifest, operator_cluster, status_of
from shardmeter.cost.coefficients import CoefficientsDocument, Source
from shardmeter.cost.priors import pool_priors
from shardmeter_operator import metrics
from shardmeter_operator.api import GPUPoolSpec
from support.cluster import EmulatedCluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "observe"
LOGS = [(FIXTURES / f"e2e-island-{i}.log").read_text() for i in (0, 1)]
POOL = {
    "apiVersion": "shardmeter.io/v1alpha1",
    "kind": "GPUPool",
    "metadata": {"name": "lab"},
    "spec": {"gpu": "a100-80gb-sxm", "nodes": 4, "gpusPerNode": 1, "pricePerGpuHourUsd": 1.0},
}
STAND_IN = {  # the model the end-to-end run's CPU stand-in trained (launch_local.cpu_trainer)
    "name": "cpu-stand-in",
    "hiddenSize": 64,
    "numLayers": 6,
    "numAttentionHeads": 4,
    "numKeyValueHeads": 4,
    "intermediateSize": 192,
    "vocabSize": 2048,
}


def plan(name: str, *, launch: bool = True, **observe: Any) -> dict[str, Any]:
    """Two 1-GPU islands of 256 tokens per inner step, Streaming DiLoCo H = 4, F = 2, τ = 1:
    the shape of the end-to-end run (micro-batch × accumulation × sequence = 256)."""
    doc = manifest("trainingplan.yaml")
    doc["metadata"]["name"] = name
    doc["spec"] = {
        "model": STAND_IN,
        "training": {"seqLenTokens": 64, "globalBatchTokens": 512, "totalTokens": 2**31},
        "strategy": {
            "kind": "streaming-diloco",
            "syncEvery": 4,
            "fragments": 2,
            "fragmentSyncDelay": 1,
            "outerPrecision": "fp32",
        },
        "pools": [{"name": "lab", "maxNodes": 2}],
        "constraints": {"maxGpusPerIsland": 1},
        "objective": {"kind": "min-time", "qualityAdjusted": False},  # two islands, as run
        "faultTolerance": {"processGroup": "gloo"},
        "launch": launch,
        "template": copy.deepcopy(doc["spec"]["template"]),
        **({"observe": observe} if observe else {}),
    }
    return doc


def step_ends(text: str) -> list[float]:
    """The stand-in's own timing of each step after the first (``[island]`` lines)."""
    ends = [line for line in text.splitlines() if line.startswith("[island] event=step_end")]
    return [float(re.search(r"step_s=([\d.]+)", line)[1]) for line in ends[1:]]  # type: ignore[index]


def slowed(text: str, factor: float) -> str:
    """The same log with torchtitan's tps divided by ``factor`` (a synthetic slow island)."""

    def tps(m: re.Match[str]) -> str:
        return f"tps: {round(int(m[1].replace(',', '')) / factor):,}"

    return re.sub(r"tps: ([\d,]+)", tps, text)


async def run_islands(cluster: EmulatedCluster, status: dict[str, Any], logs: list[str]) -> None:
    """The Job controller and the kubelet: each island's Job runs, its index-0 pod logs."""
    for job, text in zip(status["jobs"], logs, strict=True):
        cluster.set_job_running("default", job)
        pod = cluster.create_job_pod("default", job, 0)
        cluster.set_pod_log("default", pod["metadata"]["name"], text)


def observed(status: dict[str, Any]) -> bool:
    islands = status.get("islands") or []
    return bool(islands) and all(
        (i.get("observed") or {}).get("reason") == "Observed" for i in islands
    )


def coefficients(cluster: EmulatedCluster) -> CoefficientsDocument:
    cm = cluster.get("configmaps", OPERATOR_NS, "shardmeter-coefficients-lab")
    assert cm is not None
    return CoefficientsDocument.from_configmap_data(cm["data"])


def metric(name: str, **labels: str) -> float | None:
    for family in metrics.REGISTRY.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


async def published(cluster: Any, value: float | None, name: str, **labels: str) -> None:
    """Wait until the gauge shows ``value`` (None: no such series). Gauges follow the stored
    status: they are published right after the status write the test has just seen."""

    def shown() -> bool:
        got = metric(name, **labels)
        return (
            got is None
            if value is None
            else got is not None and math.isclose(got, value, rel_tol=1e-6)
        )

    await cluster.wait_for(shown, timeout=10, message=f"{name}{labels} = {value}")


async def test_real_logs_drive_drift_and_recalibration(tmp_path: Path) -> None:
    async with operator_cluster(
        tmp_path, observe_interval_s=0.3, observed_min_samples=2
    ) as cluster:
        await apply(cluster, POOL, plan("run"))
        launched = await status_of(
            cluster, "trainingplans", "default", "run", lambda s: s.get("phase") == "Launched"
        )
        predicted = launched["islands"][0]["stepSeconds"]
        assert condition(launched, "PredictionDrift")["status"] == "Unknown"
        await run_islands(cluster, launched, LOGS)
        status = await status_of(cluster, "trainingplans", "default", "run", observed)

        # what the operator read is what the stand-in timed (its own lines in the same log)
        for isl, text in zip(status["islands"], LOGS, strict=True):
            obs = isl["observed"]
            assert obs["pod"].startswith(isl["name"]) and obs["restarts"] == 0
            assert (obs["firstStep"], obs["lastStep"], obs["windows"]) == (1, 12, 11)
            assert obs["effectiveStepSeconds"] == pytest.approx(
                statistics.fmean(step_ends(text)), rel=3e-3
            )
            assert obs["fragmentSyncs"] == 6 and obs["predictedStepSeconds"] == predicted
            # a CPU core against an A100's prediction: far slower than predicted
            assert obs["errorRatio"] == pytest.approx(
                obs["stepSecondsP50"] / predicted - 1, rel=1e-4
            )
            assert obs["errorRatio"] > 1 and obs["computeScale"] > 1
            await published(
                cluster,
                obs["errorRatio"],
                "shardmeter_plan_prediction_error_ratio",
                trainingplan="run",
                island=isl["name"],
            )
        drift = condition(status, "PredictionDrift")
        assert drift["status"] == "True" and drift["reason"] == "StepTimeDrift"
        assert all(i["name"] in drift["message"] for i in status["islands"])
        assert status["observed"]["islandsObserved"] == 2
        blocking = condition(status, "OuterStepBlocking")
        assert blocking["reason"] in ("ObservedBlocking", "ObservedHidden"), blocking
        events = await cluster.wait_for(
            lambda: [
                e for e in cluster.list("events", "default") if e.get("reason") == "PredictionDrift"
            ]
        )
        assert events[0]["type"] == "Warning"
        # running training is never touched
        assert cluster.count("PATCH", "jobs") == cluster.count("PUT", "jobs") == 0

        # the pool learns: a separate, visible correction on top of its priors
        pool = await status_of(
            cluster,
            "gpupools",
            None,
            "lab",
            lambda s: (s.get("observed") or {}).get("computeScale"),
        )
        scales = sorted(i["observed"]["computeScale"] for i in status["islands"])
        assert pool["source"] == "prior" and pool["observed"]["source"] == "observed"
        assert pool["observed"]["samples"] == 2 and pool["observed"]["plans"] == 1
        assert pool["observed"]["computeScale"] == pytest.approx(
            statistics.median(scales), rel=1e-3
        )
        assert "observed correction" in condition(pool, "CoefficientsReady")["message"]
        doc = coefficients(cluster)
        assert doc.source is Source.PRIOR and doc.observed is not None
        assert {s.island for s in doc.observed.samples} == {i["name"] for i in status["islands"]}
        prior = pool_priors(GPUPoolSpec.model_validate(POOL["spec"]), name="lab")
        assert doc.compute == prior.compute  # the base coefficients are unchanged
        await published(
            cluster,
            pool["observed"]["computeScale"],
            "shardmeter_pool_observed_compute_scale",
            gpupool="lab",
        )

        # a later plan on the pool predicts with it: the same shape lands between the islands
        await apply(cluster, plan("next", launch=False))
        later = await status_of(
            cluster,
            "trainingplans",
            "default",
            "next",
            lambda s: (
                s.get("phase") == "Planned" and s["coefficients"][0].get("observedComputeScale")
            ),
        )
        p50s = sorted(i["observed"]["stepSecondsP50"] for i in status["islands"])
        assert p50s[0] <= later["islands"][0]["stepSeconds"] <= p50s[1]
        assert later["coefficients"][0]["source"] == "prior"

        # the run ends: its last observations stay in the status, its series go
        for job in status["jobs"]:
            cluster.set_job_succeeded("default", job)
        done = await status_of(
            cluster, "trainingplans", "default", "run", lambda s: s.get("phase") == "Succeeded"
        )
        assert observed(done) and done["observed"]["readAt"]
        await published(cluster, None, "shardmeter_plan_prediction_error_ratio", trainingplan="run")

        # reset: the samples go, plans are back on the priors
        await apply(
            cluster,
            {
                **POOL,
                "metadata": {"name": "lab", "annotations": {"shardmeter.io/reset-observed": "1"}},
            },
        )
        pool = await status_of(
            cluster,
            "gpupools",
            None,
            "lab",
            lambda s: (s.get("observed") or {}).get("resetToken") == "1",
        )
        assert pool["observed"].get("computeScale") is None and pool["observed"]["resetAt"]
        later = await status_of(
            cluster,
            "trainingplans",
            "default",
            "next",
            lambda s: not s["coefficients"][0].get("observedComputeScale"),
        )
        assert later["islands"][0]["stepSeconds"] == pytest.approx(predicted, rel=1e-3)
        await cluster.wait_for(
            lambda: (
                {"ObservedCorrection", "ObservedCorrectionReset"}
                <= {e.get("reason") for e in cluster.list("events", None)}
            )
        )


async def test_a_slow_island_drifts_alone(tmp_path: Path) -> None:
    async with operator_cluster(
        tmp_path, observe_interval_s=0.3, observed_min_samples=2
    ) as cluster:
        await apply(cluster, POOL, plan("learn"))
        first = await status_of(
            cluster, "trainingplans", "default", "learn", lambda s: s.get("phase") == "Launched"
        )
        await run_islands(cluster, first, [LOGS[0], LOGS[0]])  # one island's log twice
        await status_of(
            cluster,
            "gpupools",
            None,
            "lab",
            lambda s: (s.get("observed") or {}).get("computeScale"),
        )
        # a second plan, predicted with the correction; its island 1 runs 1.6× slower
        await apply(cluster, plan("slow", driftThreshold=0.25, recalibrate=False))
        second = await status_of(
            cluster, "trainingplans", "default", "slow", lambda s: s.get("phase") == "Launched"
        )
        await run_islands(cluster, second, [LOGS[0], slowed(LOGS[0], 1.6)])
        status = await status_of(cluster, "trainingplans", "default", "slow", observed)
        normal, slow = (i["observed"] for i in status["islands"])
        assert abs(normal["errorRatio"]) < 0.05  # the learned correction predicts it
        assert slow["errorRatio"] > 0.5
        drift = condition(status, "PredictionDrift")
        assert drift["status"] == "True" and status["islands"][1]["name"] in drift["message"]
        assert status["islands"][0]["name"] not in drift["message"].split(";")[0]
        await published(
            cluster,
            slow["errorRatio"],
            "shardmeter_plan_prediction_error_ratio",
            trainingplan="slow",
            island=status["islands"][1]["name"],
        )
        # recalibrate: false — the slow run did not become a sample of the pool
        pool = cluster.get("gpupools", None, "lab")
        assert pool is not None and pool["status"]["observed"]["plans"] == 1


async def test_nothing_to_observe_says_why(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path, observe_interval_s=0.3) as cluster:
        await apply(cluster, POOL, plan("bad"))
        status = await status_of(
            cluster, "trainingplans", "default", "bad", lambda s: s.get("phase") == "Launched"
        )
        jobs = status["jobs"]
        for job in jobs:
            cluster.set_job_running("default", job)
        # island 0: a pod still creating its container; island 1: no pod at all
        cluster.create_job_pod("default", jobs[0], 0, phase="Pending")

        def reasons(s: dict[str, Any]) -> list[str]:
            return [(i.get("observed") or {}).get("reason", "") for i in s.get("islands") or []]

        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            "bad",
            lambda s: reasons(s) == ["PodNotRunning", "PodNotFound"],
        )
        assert condition(status, "PredictionDrift")["status"] == "Unknown"
        assert all(i["observed"].get("stepSecondsP50") is None for i in status["islands"])
        # a running pod whose log is garbage, one restarted with too few lines since
        pods = cluster.list("pods", "default")
        cluster.emulator.set_pod_status("default", pods[0]["metadata"]["name"], phase="Running")
        cluster.set_pod_log("default", pods[0]["metadata"]["name"], "\x00\xff garbage\n" * 50)
        restarted = cluster.create_job_pod("default", jobs[1], 0, restarts=2)
        head = "\n".join(LOGS[0].splitlines()[:60])
        cluster.set_pod_log("default", restarted["metadata"]["name"], head)
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            "bad",
            lambda s: reasons(s) == ["NoMetricLines", "PodRestarted"],
        )
        assert "restarted 2 time" in status["islands"][1]["observed"]["message"]
        await published(cluster, None, "shardmeter_plan_prediction_error_ratio", trainingplan="bad")
        pool = cluster.get("gpupools", None, "lab")
        assert pool is not None and not (pool.get("status") or {}).get("observed")
        json.dumps(status)  # the status stays plain JSON


async def test_a_prometheus_query_gives_the_step_and_observe_edits_are_no_spec_change(
    tmp_path: Path,
) -> None:
    from support.prometheus import fake_prometheus, vector

    query = 'shardmeter_test_step_seconds{island="$island"}'
    answers = {
        'shardmeter_test_step_seconds{island="prom-island-0"}': (200, vector(0.0421)),
        'shardmeter_test_step_seconds{island="prom-island-1"}': (200, vector(1.0, 2.0)),
    }
    with fake_prometheus(answers) as (url, seen):
        async with operator_cluster(
            tmp_path, observe_interval_s=0.3, prometheus_url=url
        ) as cluster:
            await apply(cluster, POOL, plan("prom", stepSecondsQuery=query))
            launched = await status_of(
                cluster, "trainingplans", "default", "prom", lambda s: s.get("phase") == "Launched"
            )
            await run_islands(cluster, launched, LOGS)
            status = await status_of(cluster, "trainingplans", "default", "prom", observed)
            first, second = (i["observed"] for i in status["islands"])
            assert first["source"] == "prometheus" and first["stepSecondsP50"] == 0.0421
            assert first["stepSecondsP90"] is None and first["tokensPerSecond"]  # the rest: log
            assert second["source"] == "log" and "2 series, 1 needed" in second["message"]
            assert set(seen) == set(answers)

            # observation settings may change after launch: not a change of the running islands
            edited = plan("prom", stepSecondsQuery=query, driftThreshold=5.0)
            await apply(cluster, edited)
            status = await status_of(
                cluster,
                "trainingplans",
                "default",
                "prom",
                lambda s: (s.get("observed") or {}).get("driftThreshold") == 5.0,
            )
            assert condition(status, "SpecChangedAfterLaunch")["status"] == "False"
            edited["spec"]["training"]["totalTokens"] = 2**32  # a real change is reported
            await apply(cluster, edited)
            await status_of(
                cluster,
                "trainingplans",
                "default",
                "prom",
                lambda s: condition(s, "SpecChangedAfterLaunch")["status"] == "True",
            )


async def test_an_api_refusal_is_a_reason_not_a_failed_reconcile() -> None:
    import kopf

    from shardmeter_operator.api.observation import ObserveSpec
    from shardmeter_operator.config import OperatorConfig
    from shardmeter_operator.observe.read import observe_island
    from shardmeter_operator.observe.summary import IslandFacts
    from shardmeter_operator.trainingplan.reconcile import PlanContext

    class Refusing:
        async def list(self, *_: Any) -> list[Any]:
            raise kopf.TemporaryError("list Pod in default failed: HTTP 403 Forbidden", delay=30)

    ctx = PlanContext(OperatorConfig(), Refusing(), {})  # type: ignore[arg-type]
    obs = await observe_island(
        "default", "run-island-0", IslandFacts(256, 1, 2, 0.05), "t", ObserveSpec(), ctx
    )
    assert obs.reason == "LogUnavailable" and "HTTP 403" in obs.message
    assert obs.step_seconds_p50 is None
