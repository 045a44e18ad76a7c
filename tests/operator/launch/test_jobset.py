"""The operator launching plans as a JobSet, against the emulated API server with the simulated
JobSet (its CRD, webhook and controller: ``support/jobset.py``): the default workload follows
the CRD, a JobSet asked for where none is served is ``Valid=False`` and creates nothing until
JobSet is installed, islands follow the JobSet's child Jobs, a failed island restarts every
island up to ``spec.maxRestarts`` and then fails the plan, and a relaunch replaces the JobSet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from operator_support import apply, condition, manifest, operator_cluster, status_of, variant
from shardmeter_operator.render.jobset import JOB_GLOBAL_INDEX_KEY, RESTART_ATTEMPT_KEY
from support.jobset import JobSetController

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
POOL = manifest("gpupool-cluster-a.yaml")
PLAN = manifest("trainingplan.yaml")
NAME, NS = "llama-8b-case-study", "default"
ONE_POOL = {"launch": True, "pools": [{"name": "cluster-a"}]}


def phase(value: str) -> Any:
    return lambda s: s.get("phase") == value


def child_jobs(cluster: Any, attempt: int = 0) -> list[dict[str, Any]]:
    jobs = cluster.list("jobs", NS, f"jobset.sigs.k8s.io/jobset-name={NAME}")
    current = [j for j in jobs if j["metadata"]["labels"][RESTART_ATTEMPT_KEY] == str(attempt)]
    return sorted(current, key=lambda j: int(j["metadata"]["labels"][JOB_GLOBAL_INDEX_KEY]))


async def test_default_workload_is_a_jobset_that_restarts_then_fails(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path, jobset=True) as cluster:
        await apply(cluster, POOL, variant(PLAN, **ONE_POOL, maxRestarts=1))
        status = await status_of(cluster, "trainingplans", NS, NAME, phase("Launched"))
        assert status["launch"]["workload"] == "JobSet" and status["launch"]["jobSet"] == NAME
        launched = condition(status, "Launched")
        assert launched["reason"] == "JobSetCreated", launched
        # one JobSet (no island Jobs or Services of the operator's own), the lighthouse apart
        (js,) = cluster.list("jobsets", NS)
        assert js["metadata"]["ownerReferences"][0]["kind"] == "TrainingPlan"
        assert [r["name"] for r in js["spec"]["replicatedJobs"]] == ["g0"]
        assert js["spec"]["failurePolicy"] == {
            "maxRestarts": 1,
            "restartStrategy": "BlockingRecreate",
        }
        assert [d["metadata"]["name"] for d in cluster.list("deployments", NS)] == [
            f"{NAME}-lighthouse"
        ]
        # the JobSet controller's child Jobs are the islands
        await cluster.wait_for(lambda: len(child_jobs(cluster)) == status["islandCount"])
        jobs = child_jobs(cluster)
        services = sorted(s["metadata"]["name"] for s in cluster.list("services", NS))
        assert services == sorted([NAME, f"{NAME}-lighthouse"])  # JobSet's headless Service
        assert [i["name"] for i in status["islands"]] == [j["metadata"]["name"] for j in jobs]
        assert status["jobs"] == [i["name"] for i in status["islands"]]
        for job in jobs:
            cluster.set_job_running(NS, job["metadata"]["name"])
        status = await status_of(cluster, "trainingplans", NS, NAME, phase("Running"))
        assert {i["state"] for i in status["islands"]} == {"running"}

        # an island fails: JobSet recreates every island (restart 1 of 1)
        cluster.set_job_failed(NS, jobs[3]["metadata"]["name"])
        status = await status_of(
            cluster, "trainingplans", NS, NAME, lambda s: s.get("restarts") == 1
        )
        assert status["phase"] in ("Launched", "Running")
        await cluster.wait_for(lambda: len(child_jobs(cluster, 1)) == status["islandCount"])
        assert child_jobs(cluster, 0) == []  # BlockingRecreate: the previous attempt is gone
        events = await cluster.wait_for(
            lambda: [e for e in cluster.list("events", NS) if e.get("reason") == "JobSetRestarted"]
        )
        assert events[0]["type"] == "Warning"
        for job in child_jobs(cluster, 1):
            cluster.set_job_running(NS, job["metadata"]["name"])
        await status_of(cluster, "trainingplans", NS, NAME, phase("Running"))

        # it fails again: no restart left, the plan fails with JobSet's reason
        failed = child_jobs(cluster, 1)[0]["metadata"]["name"]
        cluster.set_job_failed(NS, failed)

        # the JobSet's Failed condition and the failed Job's own status are two watch events
        # that may reach the operator in either order: wait for both to be followed
        def settled(s: dict[str, Any]) -> bool:
            reasons = {i["name"]: i.get("reason") for i in s.get("islands") or []}
            return s.get("phase") == "Failed" and reasons.get(failed) == "BackoffLimitExceeded"

        status = await status_of(cluster, "trainingplans", NS, NAME, settled)
        reasons = {i["name"]: i["reason"] for i in status["islands"]}
        assert reasons[failed] == "BackoffLimitExceeded"
        assert set(reasons.values()) == {"BackoffLimitExceeded", "ReachedMaxRestarts"}
        assert condition(status, "Failed")["status"] == "True"


async def test_jobset_without_the_crd_is_invalid_until_jobset_is_installed(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path) as cluster:  # no JobSet CRD
        await apply(cluster, POOL, variant(PLAN, **ONE_POOL, workload="JobSet"))
        status = await status_of(cluster, "trainingplans", NS, NAME, phase("Invalid"))
        valid = condition(status, "Valid")
        assert (valid["status"], valid["reason"]) == ("False", "WorkloadUnavailable")
        assert valid["message"].startswith(
            "spec.workload: is JobSet, but the cluster does not serve"
        )
        assert condition(status, "Planned")["status"] == "True"
        assert condition(status, "Launched")["status"] == "False"
        for kind in ("jobs", "services", "deployments"):
            assert cluster.list(kind, NS) == [], kind

        # maxRestarts needs a JobSet: with the default workload (Job here) it is refused too
        await apply(cluster, variant(PLAN, **ONE_POOL, maxRestarts=2))
        status = await status_of(
            cluster,
            "trainingplans",
            NS,
            NAME,
            lambda s: condition(s, "Valid")["message"].startswith("spec.maxRestarts"),
        )
        assert "defaults to Job" in condition(status, "Valid")["message"]

        # installing JobSet is enough: the plan is checked again and launches
        controller = JobSetController.install(cluster.emulator)
        status = await status_of(cluster, "trainingplans", NS, NAME, phase("Launched"))
        assert status["launch"]["workload"] == "JobSet"
        assert condition(status, "Valid")["status"] == "True"
        controller.reconcile()
        assert len(cluster.list("jobs", NS)) == status["islandCount"]


async def test_plain_jobs_when_asked_and_a_relaunch_replaces_the_jobset(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path, jobset=True) as cluster:
        await apply(cluster, POOL, variant(PLAN, **ONE_POOL, workload="Job"))
        status = await status_of(cluster, "trainingplans", NS, NAME, phase("Launched"))
        assert status["launch"]["workload"] == "Job" and status["launch"]["jobSet"] == ""
        assert cluster.list("jobsets", NS) == []
        assert status["islands"][0]["name"] == f"{NAME}-island-0"
        assert len(cluster.list("jobs", NS)) == status["islandCount"]

        # relaunch as a JobSet: the island Jobs and Services go, one JobSet comes
        await apply(cluster, variant(PLAN, **ONE_POOL, workload="JobSet", relaunch=1))
        status = await status_of(
            cluster,
            "trainingplans",
            NS,
            NAME,
            lambda s: (s.get("launch") or {}).get("relaunch") == 1 and s.get("phase") == "Launched",
        )
        assert status["launch"]["workload"] == "JobSet"
        (js,) = cluster.list("jobsets", NS)
        revision = js["metadata"]["labels"]["shardmeter.io/plan-revision"]
        assert revision == status["launch"]["revision"]
        await cluster.wait_for(lambda: len(child_jobs(cluster)) == status["islandCount"])
        names = {j["metadata"]["name"] for j in cluster.list("jobs", NS)}
        assert names == {i["name"] for i in status["islands"]}  # the old island Jobs are gone
        assert not [s for s in cluster.list("services", NS) if "-island-" in s["metadata"]["name"]]

        # and relaunching again replaces the JobSet (its child Jobs go with it)
        await apply(cluster, variant(PLAN, **ONE_POOL, workload="JobSet", relaunch=2))
        status = await status_of(
            cluster,
            "trainingplans",
            NS,
            NAME,
            lambda s: (s.get("launch") or {}).get("relaunch") == 2 and s.get("phase") == "Launched",
        )
        (js,) = cluster.list("jobsets", NS)
        assert (
            js["metadata"]["labels"]["shardmeter.io/plan-revision"] == status["launch"]["revision"]
        )
        await cluster.wait_for(
            lambda: (
                {
                    j["metadata"]["labels"]["shardmeter.io/plan-revision"]
                    for j in cluster.list("jobs", NS)
                }
                == {status["launch"]["revision"]}
            )
        )


async def test_restart_island_where_the_gate_is_off_names_it(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path, jobset=True) as cluster:  # v0.12 defaults: gate off
        await apply(cluster, POOL, variant(PLAN, **ONE_POOL, maxRestarts=1, restart="Island"))
        status = await status_of(
            cluster,
            "trainingplans",
            NS,
            NAME,
            lambda s: (
                "spec.restart" in condition(s, "Valid").get("message", "")
                if any(c["type"] == "Valid" for c in s.get("conditions") or [])
                else False
            ),
        )
        message = condition(status, "Valid")["message"]
        assert "RestartJob feature gate is disabled" in message, message
        assert "restart: AllIslands" in message
        assert cluster.list("jobsets", NS) == []


async def test_the_operators_default_workload_is_explicit(tmp_path: Path) -> None:
    # --default-workload Job: plain Jobs even where JobSet is installed, and the condition says so
    async with operator_cluster(tmp_path, jobset=True, default_workload="Job") as cluster:
        await apply(cluster, POOL, variant(PLAN, **ONE_POOL))
        status = await status_of(cluster, "trainingplans", NS, NAME, phase("Launched"))
        assert status["launch"]["workload"] == "Job" and cluster.list("jobsets", NS) == []
        message = condition(status, "Launched")["message"]
        assert "spec.workload unset: Job by the operator's default workload" in message


async def test_a_jobset_default_without_jobset_names_the_default(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path, default_workload="JobSet") as cluster:  # no JobSet
        await apply(cluster, POOL, variant(PLAN, **ONE_POOL))
        status = await status_of(
            cluster,
            "trainingplans",
            NS,
            NAME,
            lambda s: (
                "operator.defaultWorkload" in condition(s, "Valid").get("message", "")
                if any(c["type"] == "Valid" for c in s.get("conditions") or [])
                else False
            ),
        )
        assert condition(status, "Valid")["message"].startswith("spec.workload: is unset")
        assert cluster.list("jobs", NS) == []
