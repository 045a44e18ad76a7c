"""A TrainingPlan launched through real Kueue and the real JobSet and Job controllers: queued
in a LocalQueue whose ClusterQueue has too little quota it waits, suspended, with Kueue's own
reason; with enough quota Kueue admits every island at once and the JobSet's Jobs run on the
flavor's nodes; deactivating the Workload evicts it (suspended again, the plan says why); deleting the plan lets the real garbage
collector remove every child. As plain Jobs, Kueue admits island by island. (An unknown queue
is Valid=False before anything is created.)"""

from __future__ import annotations

from typing import Any

import pytest

from kube_support import H200, QUEUE, Kube, kueue_objects, real_operator
from operator_support import condition, manifest, variant

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]
NAME = "llama-8b-case-study"
QUEUED = {"launch": True, "pools": [{"name": "cluster-a"}], "queueName": QUEUE}


def plan(ns: str, **spec: Any) -> dict[str, Any]:
    doc = variant(manifest("trainingplan.yaml"), **spec)
    doc["metadata"]["namespace"] = ns
    return doc


async def status(kube: Kube, predicate: Any, timeout: float = 90) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def check() -> bool:
        obj = kube.get("trainingplans", kube.ns, NAME) or {}
        s = obj.get("status") or {}
        if s and predicate(s):
            found.update(s)
            return True
        return False

    await kube.wait_for(check, timeout, f"TrainingPlan {kube.ns}/{NAME}: {predicate}")
    return found


def is_(type_: str, value: str, reason: str | None = None) -> Any:
    def check(s: dict[str, Any]) -> bool:
        c = next((c for c in s.get("conditions", []) if c["type"] == type_), None)
        return c is not None and c["status"] == value and reason in (None, c["reason"])

    return check


async def children_gone(kube: Kube) -> None:
    """Nothing the plan owned (directly or through its JobSet) is left."""

    def left() -> list[str]:
        return [
            f"{kind}/{o['metadata']['name']}"
            for kind in ("jobsets", "jobs", "services", "deployments", "workloads", "pods")
            for o in kube.list(kind, kube.ns)
        ]

    await kube.wait_for(lambda: not left(), 90, "children left after the plan was deleted")


async def test_a_queued_jobset_waits_for_quota_then_real_kueue_admits_it(kube: Kube) -> None:
    ns = kube.ns
    kube.apply(manifest("gpupool-cluster-a.yaml"))
    async with real_operator(kube, namespaces=(ns,)):
        kube.apply(plan(ns, **QUEUED))
        s = await status(kube, lambda s: s.get("phase") == "Invalid")
        valid = condition(s, "Valid")
        assert (valid["status"], valid["reason"]) == ("False", "QueueNotFound")
        assert kube.list("jobsets", ns) == []
        # the queue appears, with room for half the plan: 8 islands x 8 GPUs do not fit 32 —
        # launched, suspended, waiting with Kueue's reason
        for obj in kueue_objects(ns, gpus=32):
            kube.apply(obj)
        s = await status(
            kube,
            lambda s: (
                is_("QuotaReserved", "False", "Pending")(s)
                and "insufficient quota" in condition(s, "QuotaReserved")["message"]
            ),
        )
        assert s["phase"] == "Launched" and s["launch"]["workload"] == "JobSet"
        quota = condition(s, "QuotaReserved")["message"]
        assert "insufficient quota for nvidia.com/gpu in flavor h200-" in quota, quota
        assert {(i["state"], i["reason"]) for i in s["islands"]} == {("pending", "Queued")}
        (js,) = kube.list("jobsets", ns)
        assert js["spec"]["suspend"] is True
        (wl,) = kube.list("workloads", ns)  # one Workload for all islands: gang admission
        # (RestartJob is on: every island is its own replicated Job, so its own pod set)
        pod_sets = [(p["name"], p["count"]) for p in wl["spec"]["podSets"]]
        assert pod_sets == [(f"i{k}", 1) for k in range(s["islandCount"])]
        assert all(j["spec"]["suspend"] for j in kube.list("jobs", ns))

        # enough quota: Kueue admits the Workload, JobSet unsuspends every island on the flavor
        kube.apply(kueue_objects(ns, gpus=64)[1])
        s = await status(kube, is_("Admitted", "True"))
        await kube.wait_for(  # the operator's Event beside Kueue's (on the Workload)
            lambda: [
                e
                for e in kube.events(ns, "Admitted")
                if e["involvedObject"]["kind"] == "TrainingPlan"
            ],
            60,
        )
        jobs = await kube.wait_for(
            lambda: (
                (jobs := kube.list("jobs", ns))
                and len(jobs) == s["islandCount"]
                and not any(j["spec"].get("suspend") for j in jobs)
                and jobs
            ),
            60,
        )
        for job in jobs:
            assert job["spec"]["template"]["spec"]["nodeSelector"] == H200
        for job in jobs:
            kube.set_job_running(ns, job["metadata"]["name"])
        s = await status(kube, lambda s: s.get("phase") == "Running")
        assert {i["state"] for i in s["islands"]} == {"running"}

        # evicted (the Workload deactivated): Kueue suspends the JobSet, its Jobs go, the plan
        # says why and its islands wait in the queue again
        (wl,) = kube.list("workloads", ns)
        kube.patch("workloads", ns, wl["metadata"]["name"], {"spec": {"active": False}})
        s = await status(kube, is_("Admitted", "False", "NoReservation"))
        assert condition(s, "Admitted")["message"] == "The workload has no reservation"
        assert {(i["state"], i["reason"]) for i in s["islands"]} == {("pending", "Queued")}
        assert s["islands"][0]["message"] == "The workload is deactivated"
        await kube.wait_for(lambda: (kube.get("jobsets", ns, NAME) or {})["spec"]["suspend"], 60)
        warnings = await kube.wait_for(
            lambda: [e for e in kube.events(ns, "NoReservation") if e["type"] == "Warning"], 60
        )
        assert warnings[0]["involvedObject"]["kind"] == "TrainingPlan"

        # deleting the plan: the garbage collector removes the JobSet, its Jobs, their pods,
        # the Services, the lighthouse and Kueue's Workload
        kube.delete("trainingplans", ns, NAME)
        await children_gone(kube)


async def test_plain_jobs_are_admitted_one_by_one(kube: Kube) -> None:
    ns = kube.ns
    for obj in kueue_objects(ns, gpus=24):
        kube.apply(obj)
    kube.apply(manifest("gpupool-cluster-a.yaml"))
    async with real_operator(kube, namespaces=(ns,)):
        kube.apply(plan(ns, **QUEUED, workload="Job"))
        s = await status(
            kube,
            lambda s: (
                is_("QuotaReserved", "False", "Pending")(s)
                and condition(s, "QuotaReserved")["message"].startswith("3/8 island Jobs")
            ),
        )
        assert s["launch"]["workload"] == "Job"
        workloads = kube.list("workloads", ns)
        assert len(workloads) == 8 and {len(w["spec"]["podSets"]) for w in workloads} == {1}
        assert sum(bool((w.get("status") or {}).get("admission")) for w in workloads) == 3
        jobs = kube.list("jobs", ns)
        assert sum(not j["spec"]["suspend"] for j in jobs) == 3
        queued = [i for i in s["islands"] if i["reason"] == "Queued"]
        assert len(queued) == 5 and "insufficient unused quota" in queued[0]["message"]
        kube.delete("trainingplans", ns, NAME)
        await children_gone(kube)
