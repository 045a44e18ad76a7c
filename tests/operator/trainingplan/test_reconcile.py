"""The operator in-process against the emulated API server (which admits writes as
kube-apiserver does), with real kopf and kubectl: planning, the launch state machine,
following the children, bad input."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from operator_support import (
    OPERATOR_NS,
    apply,
    condition,
    job_uids,
    manifest,
    operator_cluster,
    status_of,
    variant,
)
from shardmeter_operator import metrics
from shardmeter_operator.render.labels import PLAN_REVISION_LABEL, PLAN_UID_LABEL
from support.cluster import EmulatedCluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

POOL_A, POOL_B = manifest("gpupool-cluster-a.yaml"), manifest("gpupool-cluster-b.yaml")
PLAN = manifest("trainingplan.yaml")
ONE_POOL = [{"name": "cluster-b"}]
"""Launched plans use one pool: torchtitan-FT needs equal local batches on every island, which
the case study over both pools lacks (it is refused: tests/operator/launch/test_launch.py)."""
NAME = "llama-8b-case-study"


def planned(s: dict[str, Any]) -> bool:
    return s.get("phase") == "Planned"


def phase(value: str) -> Any:
    return lambda s: s.get("phase") == value


async def posted(cluster: EmulatedCluster, *reasons: str, name: str = NAME) -> list[str]:
    """Wait until Events with these reasons were posted on the plan (kopf posts them async)."""
    return await cluster.wait_for(
        lambda: (
            (found := [r for r, _ in events(cluster, name)])
            and all(r in found for r in reasons)
            and found
        ),
        timeout=30,
        message=f"Events {reasons} on {name}: {[r for r, _ in events(cluster, name)]}",
    )


def events(cluster: EmulatedCluster, name: str = NAME) -> list[tuple[str, str]]:
    return [
        (e.get("reason", ""), e.get("message", ""))
        for e in cluster.list("events", "default")
        if (e.get("involvedObject") or {}).get("name") == name
    ]


async def test_plan_only_then_launch_and_follow_the_islands(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path) as cluster:
        await apply(cluster, POOL_A, POOL_B, PLAN)
        status = await status_of(cluster, "trainingplans", "default", NAME, planned)
        assert status["plan"] and status["islandCount"] == len(status["islands"]) <= 10
        assert status["predictions"]["tokensPerSecond"] > 0 and status["predictions"]["bottleneck"]
        assert condition(status, "Valid")["status"] == "True"
        assert condition(status, "UsingPriorCoefficients")["status"] == "True"
        assert condition(status, "Launched")["reason"] == "PlanOnly"
        assert condition(status, "OuterStepBlocking")["status"] == "False"
        assert status["observedGeneration"] == 1 and "launch" not in status
        assert cluster.list("jobs") == []
        pool = await status_of(
            cluster, "gpupools", None, "cluster-a", lambda s: s.get("source") == "prior"
        )
        cm = cluster.get("configmaps", OPERATOR_NS, "shardmeter-coefficients-cluster-a")
        assert json.loads(cm["data"]["coefficients.json"])["source"] == "prior"
        owner = cluster.get("gpupools", None, "cluster-a")
        assert cm["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        assert condition(pool, "CoefficientsReady")["reason"] == "DatasheetPriors"
        table = (await cluster.kubectl("get", "trainingplans")).stdout
        assert "Planned" in table and "True" in table
        # no finalizers: deleting the plan or its namespace never waits for the operator
        plan_obj = cluster.get("trainingplans", "default", NAME)
        assert not plan_obj["metadata"].get("finalizers")
        assert not owner["metadata"].get("finalizers")

        await apply(cluster, variant(PLAN, launch=True, pools=ONE_POOL))
        status = await status_of(cluster, "trainingplans", "default", NAME, phase("Launched"))
        uid = plan_obj["metadata"]["uid"]
        revision = status["launch"]["revision"]
        assert status["launch"]["complete"] is True and status["launch"]["generation"] == 2
        jobs = cluster.list("jobs", "default")
        assert sorted(j["metadata"]["name"] for j in jobs) == sorted(status["jobs"])
        services = cluster.list("services", "default")  # one per island, and the lighthouse's
        assert len(jobs) == status["islandCount"] == len(services) - 1
        islands = {i["name"]: i for i in status["islands"]}
        assert {i["state"] for i in islands.values()} == {"pending"}
        for job in jobs:
            labels = job["metadata"]["labels"]
            assert labels[PLAN_UID_LABEL] == uid and labels[PLAN_REVISION_LABEL] == revision
            island = islands[job["metadata"]["name"]]
            spec = job["spec"]
            assert spec["completionMode"] == "Indexed" and spec["completions"] == island["nodes"]
            pod = spec["template"]["spec"]
            pool_doc = POOL_A if island["pool"] == "cluster-a" else POOL_B
            assert pod["nodeSelector"] == pool_doc["spec"]["nodeSelector"]
            assert pod["subdomain"] == job["metadata"]["name"]
            trainer = pod["containers"][0]
            assert trainer["resources"]["limits"]["nvidia.com/gpu"] == str(island["gpusPerNode"])
            env = {e["name"]: e.get("value", e.get("valueFrom")) for e in trainer["env"]}
            assert env["MASTER_ADDR"].startswith(job["metadata"]["name"] + "-0.")
            assert env["SHARDMETER_MICRO_BATCH"] == str(island["microBatch"])
            s = status["streamingDiLoCo"]
            assert (
                f"--fault_tolerance.sync_steps={s['syncEvery']}"
                in env["SHARDMETER_TORCHTITAN_ARGS"]
            )
            assert json.loads(env["SHARDMETER_PLAN"])["revision"] == revision
            assert job["metadata"]["ownerReferences"][0]["uid"] == uid

        # the simulated Job controller drives the islands: running, then succeeded
        names = sorted(islands)
        for n in names:
            cluster.set_job_running("default", n)
        status = await status_of(cluster, "trainingplans", "default", NAME, phase("Running"))
        assert {i["state"] for i in status["islands"]} == {"running"}
        assert condition(status, "Running")["status"] == "True"
        for n in names:
            cluster.set_job_succeeded("default", n)
        status = await status_of(cluster, "trainingplans", "default", NAME, phase("Succeeded"))
        assert {i["state"] for i in status["islands"]} == {"succeeded"}
        await posted(
            cluster,
            "Planned",
            "Launched",
            "IslandPending",
            "IslandRunning",
            "Running",
            "IslandSucceeded",
            "Succeeded",
        )
        await cluster.wait_for(  # gauges follow the stored status, right after its write
            lambda: (
                metrics.plan_islands.labels("default", NAME, "succeeded")._value.get() == len(names)
            )
        )
        assert cluster.count("PATCH", "jobs") == 0 and cluster.count("DELETE", "jobs") == 0


async def test_a_launched_plan_is_frozen_until_relaunch(tmp_path: Path) -> None:
    """Issue #12 §3: pool deleted and recreated smaller, model changed and changed back — the
    running islands stay; only spec.relaunch replaces them."""
    async with operator_cluster(tmp_path) as cluster:
        plan = variant(PLAN, launch=True, pools=ONE_POOL)
        await apply(cluster, POOL_A, POOL_B, plan)
        launched = await status_of(cluster, "trainingplans", "default", NAME, phase("Launched"))
        jobs = sorted(launched["jobs"])
        created = job_uids(cluster)
        await cluster.kubectl("delete", "gpupool", "cluster-b")
        smaller = variant(POOL_B, nodes=2)
        await apply(cluster, smaller)
        await apply(cluster, variant(plan, model="llama-3.2-1b"))
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            NAME,
            lambda s: (
                s.get("observedGeneration") == 2
                and condition(s, "SpecChangedAfterLaunch")["status"] == "True"
            ),
        )
        assert status["launch"]["revision"] == launched["launch"]["revision"]
        assert [i["name"] for i in status["islands"]] == [i["name"] for i in launched["islands"]]
        assert status["plan"] == launched["plan"] and status["phase"] == "Launched"
        assert "spec.relaunch" in condition(status, "SpecChangedAfterLaunch")["message"]
        await posted(cluster, "SpecChangedAfterLaunch")
        assert job_uids(cluster) == created and cluster.count("DELETE", "jobs") == 0
        assert sorted(j["metadata"]["name"] for j in cluster.list("jobs", "default")) == jobs

        # relaunch: the previous revision's children go, the current spec is launched
        await apply(cluster, variant(plan, model="llama-3.2-1b", relaunch=1))
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            NAME,
            lambda s: (s.get("launch") or {}).get("relaunch") == 1 and s.get("phase") == "Launched",
        )
        assert status["launch"]["revision"] != launched["launch"]["revision"]
        assert condition(status, "SpecChangedAfterLaunch")["status"] == "False"
        now = cluster.list("jobs", "default")
        assert {j["metadata"]["labels"][PLAN_REVISION_LABEL] for j in now} == {
            status["launch"]["revision"]
        }
        assert sorted(j["metadata"]["name"] for j in now) == sorted(status["jobs"])
        assert len(cluster.list("services", "default")) == len(now) + 1  # + the lighthouse's


async def test_failed_islands_and_rejected_pods(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path) as cluster:
        await apply(cluster, POOL_A, POOL_B, variant(PLAN, launch=True, pools=ONE_POOL))
        status = await status_of(cluster, "trainingplans", "default", NAME, phase("Launched"))
        first, second, *rest = [i["name"] for i in status["islands"]]
        cluster.reject_job_pods(
            "default",
            first,
            'pods "x" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true',
        )
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            NAME,
            lambda s: s["islands"][0].get("reason") == "PodsRejected",
        )
        assert "violates PodSecurity" in status["islands"][0]["message"]
        assert status["islands"][0]["state"] == "pending"
        assert "PodsRejected" in condition(status, "Running")["message"]
        for name in rest:
            cluster.set_job_running("default", name)
        cluster.set_job_failed("default", second, reason="BackoffLimitExceeded")
        status = await status_of(cluster, "trainingplans", "default", NAME, phase("Failed"))
        assert status["islands"][1]["state"] == "failed"
        assert status["islands"][1]["reason"] == "BackoffLimitExceeded"
        failed = condition(status, "Failed")
        assert failed["status"] == "True" and second in failed["message"]
        await cluster.wait_for(
            lambda: metrics.plan_islands.labels("default", NAME, "failed")._value.get() == 1
        )
        await posted(cluster, "IslandFailed", "Failed")


async def test_resume_creates_only_what_is_missing_and_never_adopts_strangers(
    tmp_path: Path,
) -> None:
    async with operator_cluster(tmp_path) as cluster:
        # a stranger already holds island 1's name: not adopted, the launch stops there
        await apply(cluster, POOL_A, POOL_B, PLAN)
        status = await status_of(cluster, "trainingplans", "default", NAME, planned)
        taken = status["islands"][1]["name"]
        stranger = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": taken, "namespace": "default"},
            "spec": {"ports": [{"port": 80}]},
        }
        cluster.apply(stranger)
        await apply(cluster, variant(PLAN, launch=True, pools=ONE_POOL))
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            NAME,
            lambda s: s.get("conditions") and condition(s, "Launched")["reason"] == "NameConflict",
        )
        assert f"service/{taken}" in condition(status, "Launched")["message"]
        assert status["launch"]["complete"] is False
        await posted(cluster, "NameConflict")
        # the stranger goes: the recorded decision is resumed (same revision, no re-plan)
        revision = status["launch"]["revision"]
        await cluster.kubectl("delete", "service", taken)
        status = await status_of(cluster, "trainingplans", "default", NAME, phase("Launched"))
        assert status["launch"]["revision"] == revision and status["launch"]["complete"]
        # a Job deleted after a complete launch is reported, not re-created
        created, deleted = job_uids(cluster), status["jobs"][0]
        await cluster.kubectl("delete", "job", deleted)
        status = await status_of(cluster, "trainingplans", "default", NAME, phase("Failed"))
        assert status["islands"][0]["reason"] == "JobDeleted"
        del created[f"default/{deleted}"]
        assert job_uids(cluster) == created


async def test_long_and_digit_led_names_are_accepted(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path) as cluster:
        long_pool = variant(POOL_A)
        long_pool["metadata"]["name"] = "7" + "p" * 62  # a 63-character, digit-led GPUPool
        plan = variant(PLAN, launch=True, pools=[{"name": long_pool["metadata"]["name"]}])
        plan["metadata"]["name"] = "8b-" + "r" * 60  # digit-led, 63 characters
        await apply(cluster, variant(long_pool, benchmark={"enabled": True}), plan)
        status = await status_of(
            cluster, "trainingplans", "default", plan["metadata"]["name"], phase("Launched")
        )
        for job in status["jobs"]:  # the emulated API server admitted them (names it accepts)
            assert cluster.get("jobs", "default", job) is not None
            assert cluster.get("services", "default", job) is not None
        pool = await status_of(
            cluster,
            "gpupools",
            None,
            long_pool["metadata"]["name"],
            lambda s: s.get("benchmarkPhase") == "Running",
        )
        assert cluster.get("jobs", OPERATOR_NS, pool["benchmarkJob"]) is not None


async def test_bad_input_is_a_condition_with_an_event_and_recovers(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path) as cluster:
        await apply(cluster, POOL_A)
        one = [{"name": "cluster-a"}]
        await apply(cluster, variant(PLAN, pools=one, model="llama-99t"))
        status = await status_of(cluster, "trainingplans", "default", NAME, phase("Invalid"))
        valid = condition(status, "Valid")
        assert valid["reason"] == "InvalidSpec" and "llama-99t" in valid["message"]
        await posted(cluster, "InvalidSpec")
        assert ("InvalidSpec", valid["message"]) in events(cluster)
        # a pool that does not exist yet: recovers when it appears
        await apply(cluster, variant(PLAN, pools=[*one, {"name": "later"}]))
        status = await status_of(
            cluster, "trainingplans", "default", NAME, lambda s: s.get("observedGeneration") == 2
        )
        assert condition(status, "Valid")["reason"] == "PoolNotFound"
        later = variant(POOL_B)
        later["metadata"]["name"] = "later"
        await apply(cluster, later)
        await status_of(cluster, "trainingplans", "default", NAME, planned)
        # an invalid (existing) pool: PoolInvalid, and quiet until the pool changes
        broken = variant(POOL_B, gpu="h900")
        broken["metadata"]["name"] = "later"
        await apply(cluster, broken)
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            NAME,
            lambda s: condition(s, "Valid")["reason"] == "PoolInvalid",
        )
        assert "GPUPool 'later' is invalid" in condition(status, "Valid")["message"]
        pool = await status_of(
            cluster, "gpupools", None, "later", lambda s: condition(s, "Valid")["status"] == "False"
        )
        assert "h900" in condition(pool, "Valid")["message"]
        writes = cluster.count("PATCH", "trainingplans", subresource="status")
        await asyncio.sleep(1.0)  # the plan stays quiet while the pool stays invalid
        assert cluster.count("PATCH", "trainingplans", subresource="status") == writes
        await apply(cluster, later)
        await status_of(cluster, "trainingplans", "default", NAME, planned)
        # infeasible: names the binding constraint
        big = variant(
            PLAN,
            pools=one,
            model="llama-3.1-70b",
            constraints={"maxIslands": 10, "maxGpusPerIsland": 2},
        )
        await apply(cluster, big)
        status = await status_of(cluster, "trainingplans", "default", NAME, phase("Infeasible"))
        assert "maxGpusPerIsland is 2" in condition(status, "Planned")["message"]
        await cluster.wait_for(
            lambda: metrics.plan_infeasible.labels("default", NAME)._value.get() == 1
        )
        # a broken template is refused before anything is created
        await apply(
            cluster,
            variant(
                PLAN,
                pools=one,
                launch=True,
                template={"spec": {"template": {"spec": {"containers": []}}}},
            ),
        )
        status = await status_of(cluster, "trainingplans", "default", NAME, phase("Invalid"))
        assert condition(status, "Valid")["reason"] == "InvalidTemplate"
        assert cluster.list("jobs", "default") == []


async def test_coefficient_configmap_edits_are_followed(tmp_path: Path) -> None:
    from operator_support import measured_h200_with_slow_fabric

    async with operator_cluster(tmp_path) as cluster:
        await apply(cluster, POOL_A, variant(PLAN, pools=[{"name": "cluster-a"}]))
        before = await status_of(cluster, "trainingplans", "default", NAME, planned)
        pool = await status_of(
            cluster, "gpupools", None, "cluster-a", lambda s: s.get("source") == "prior"
        )
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "shardmeter-coefficients-cluster-a", "namespace": OPERATOR_NS},
                "data": measured_h200_with_slow_fabric(),
            }
        )
        measured = await status_of(
            cluster, "gpupools", None, "cluster-a", lambda s: s.get("source") == "measured"
        )
        assert measured["coefficientsRevision"] != pool["coefficientsRevision"]

        def current() -> str:
            return str(cluster.get("gpupools", None, "cluster-a")["status"]["coefficientsRevision"])

        after = await status_of(
            cluster,
            "trainingplans",
            "default",
            NAME,
            lambda s: (
                s["coefficients"][0]
                == {"pool": "cluster-a", "source": "measured", "revision": current()}
            ),
        )
        assert condition(after, "UsingPriorCoefficients")["status"] == "False"
        assert before["observedGeneration"] == after["observedGeneration"]
