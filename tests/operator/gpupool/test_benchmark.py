"""GPUPool benchmarking through the operator: the Job, adoption of measured coefficients,
re-evaluation of a launched plan (OuterStepBlocking), and bounded retries with backoff."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from operator_support import (
    OPERATOR_NS,
    apply,
    condition,
    job_uids,
    manifest,
    measured_h200_with_slow_fabric,
    operator_cluster,
    status_of,
    variant,
)
from shardmeter_operator import metrics

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

POOL_A = manifest("gpupool-cluster-a.yaml")
PLAN = manifest("trainingplan.yaml")


async def test_benchmark_adoption_reevaluates_launched_plan(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path) as cluster:
        pool = variant(POOL_A, benchmark={"enabled": True, "nodes": 2, "configs": 20})
        # room for a longer fragmentSyncDelay than Streaming DiLoCo's robust default bound
        # (5 % of syncEvery), so that a re-evaluation can recommend other settings
        strategy = {**PLAN["spec"]["strategy"], "maxFragmentSyncDelayFraction": 0.5}
        plan = variant(PLAN, pools=[{"name": "cluster-a"}], launch=True, strategy=strategy)
        await apply(cluster, pool, plan)
        status = await status_of(
            cluster, "gpupools", None, "cluster-a", lambda s: s.get("benchmarkPhase") == "Running"
        )
        job_name = status["benchmarkJob"]
        job = cluster.get("jobs", OPERATOR_NS, job_name)
        assert job["spec"]["completions"] == 2 and job["spec"]["completionMode"] == "Indexed"
        pod = job["spec"]["template"]["spec"]
        assert (
            pod["serviceAccountName"] == "shardmeter-bench"
            and pod["nodeSelector"] == POOL_A["spec"]["nodeSelector"]
        )
        command = pod["containers"][0]["command"]
        assert command[0] == "torchrun" and "shardmeter_bench" in command
        assert "configmap/shardmeter-coefficients-cluster-a" in command
        role = cluster.get("roles", OPERATOR_NS, "shardmeter-bench-cluster-a")
        assert role["rules"] == [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": ["shardmeter-coefficients-cluster-a"],
                "verbs": ["get", "patch"],
            }
        ]
        launched = await status_of(
            cluster,
            "trainingplans",
            "default",
            "llama-8b-case-study",
            lambda s: s.get("phase") == "Launched",
        )
        assert condition(launched, "OuterStepBlocking")["status"] == "False"
        jobs_before = job_uids(cluster)
        # the bench Job publishes measured coefficients and succeeds
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "shardmeter-coefficients-cluster-a", "namespace": OPERATOR_NS},
                "data": measured_h200_with_slow_fabric(),
            }
        )
        cluster.set_job_succeeded(OPERATOR_NS, job_name)
        pool_status = await status_of(
            cluster, "gpupools", None, "cluster-a", lambda s: s.get("source") == "measured"
        )
        assert pool_status["benchmarkPhase"] == "Succeeded" and pool_status[
            "fitMape"
        ] == pytest.approx(0.05)
        assert condition(pool_status, "CoefficientsReady")["reason"] == "Measured"
        await cluster.wait_for(  # gauges follow the stored status, right after its write
            lambda: (
                metrics.pool_fit_mape_ratio.labels("cluster-a")._value.get() == pytest.approx(0.05)
            )
        )
        # the launched plan is re-evaluated, not re-planned: the slower fabric no longer hides
        # the outer all_reduce behind the chosen delay
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            "llama-8b-case-study",
            lambda s: condition(s, "OuterStepBlocking")["status"] == "True",
        )
        blocking = condition(status, "OuterStepBlocking")
        assert "recommended: fragments" in blocking["message"]
        # the alert's recommendation is the new one, not the settings that block
        in_use = status["streamingDiLoCo"]

        def recommended() -> list[tuple[str, ...]]:
            return [
                labels
                for labels in metrics.plan_recommendation._metrics
                if labels[:2] == ("default", "llama-8b-case-study")
                and labels[2:]
                != tuple(str(in_use[k]) for k in ("syncEvery", "fragments", "fragmentSyncDelay"))
            ]

        series = await cluster.wait_for(recommended)  # published right after the status write
        assert len(series) == 1
        _, _, sync_every, fragments, fragment_sync_delay = series[0]
        assert (
            f"fragments {fragments}, fragmentSyncDelay {fragment_sync_delay} at syncEvery {sync_every}"
            in (blocking["message"])
        )
        assert (int(sync_every), int(fragments), int(fragment_sync_delay)) != (
            in_use["syncEvery"],
            in_use["fragments"],
            in_use["fragmentSyncDelay"],
        )
        assert status["predictions"]["outerStepBlockingSeconds"] > 0
        assert status["predictions"]["bottleneck"] == "outer-step-bound"
        assert condition(status, "UsingPriorCoefficients")["status"] == "False"

        # eventually the plan records the revision of the coefficients it was evaluated with
        def current() -> str:
            return str(cluster.get("gpupools", None, "cluster-a")["status"]["coefficientsRevision"])

        await status_of(
            cluster,
            "trainingplans",
            "default",
            "llama-8b-case-study",
            lambda s: (
                s["coefficients"][0]
                == {"pool": "cluster-a", "source": "measured", "revision": current()}
            ),
        )
        assert job_uids(cluster) == jobs_before and cluster.count("DELETE", "jobs") == 0
        await cluster.wait_for(
            lambda: (
                metrics.plan_blocking_seconds.labels("default", "llama-8b-case-study")._value.get()
                > 0
            )
        )


async def test_failed_benchmark_retries_then_gives_up(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path) as cluster:
        await apply(cluster, variant(POOL_A, benchmark={"enabled": True, "maxRetries": 1}))
        first = (
            await status_of(
                cluster,
                "gpupools",
                None,
                "cluster-a",
                lambda s: s.get("benchmarkPhase") == "Running",
            )
        )["benchmarkJob"]
        cluster.set_job_failed(OPERATOR_NS, first, reason="BackoffLimitExceeded")
        retried = await status_of(
            cluster,
            "gpupools",
            None,
            "cluster-a",
            lambda s: s.get("benchmarkPhase") == "Running" and s.get("benchmarkJob") != first,
        )
        assert retried["benchmarkAttempts"] == 1 and retried["benchmarkJob"].endswith("-a1")
        cluster.set_job_failed(OPERATOR_NS, retried["benchmarkJob"], reason="DeadlineExceeded")
        failed = await status_of(
            cluster, "gpupools", None, "cluster-a", lambda s: s.get("benchmarkPhase") == "Failed"
        )
        cond = condition(failed, "BenchmarkSucceeded")
        assert cond["status"] == "False" and cond["reason"] == "BenchmarkFailed"
        assert (
            retried["benchmarkJob"] in cond["message"]
            and "gave up after 2 attempts" in cond["message"]
        )
        assert failed["source"] == "prior"  # priors stay in use
        cm = cluster.get("configmaps", OPERATOR_NS, "shardmeter-coefficients-cluster-a")
        assert json.loads(cm["data"]["coefficients.json"])["source"] == "prior"
        assert len(cluster.list("jobs", OPERATOR_NS)) == 2  # bounded: no further Jobs
