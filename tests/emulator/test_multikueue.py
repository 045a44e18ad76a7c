"""The simulated MultiKueue (``support/multikueue.py``, Kueue v0.19.2) across a manager and two
worker emulators (``support/multicluster.py``): a JobSet queued in site-a's LocalQueue in the
manager runs in worker-a only — quota reserved in the manager first, the Workload copied to the
site's worker, admitted there, the JobSet created there, the manager's check Ready and only then
its Workload Admitted —; the worker JobSet's status is mirrored; finishing or deleting it cleans
the worker; a worker without the namespace gets nothing (only a logged error, as the real
controller); a worker whose kubeconfig Secret is missing is not Active, nor is the site's check
and ClusterQueue; a JobSet not managed by MultiKueue is rejected. Most tests step the
controllers by hand (``run=False``) so that every intermediate state is seen."""

from __future__ import annotations

import base64
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from support.kueue import JOB_UID_LABEL, MULTIKUEUE_ORIGIN_LABEL, PREBUILT_WORKLOAD_KEY, QUEUE_LABEL
from support.kueue_status import condition
from support.multicluster import MultiCluster, Site, kubeconfig_secret_name, running_multicluster
from support.multikueue import CONFIG_NAMESPACE, RemoteError

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
NS = "default"


def jobset(name: str, queue: str, *, replicas: int = 2, **spec: Any) -> dict[str, Any]:
    pod = {
        "restartPolicy": "Never",
        "containers": [
            {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
        ],
    }
    job = {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {"spec": pod}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "replicatedJobs": [{"name": "g0", "replicas": replicas, "template": {"spec": job}}],
            **spec,
        },
    }


def types(obj: dict[str, Any] | None) -> dict[str, str]:
    return {
        c["type"]: c["status"] for c in ((obj or {}).get("status") or {}).get("conditions") or []
    }


@pytest_asyncio.fixture
async def multi(tmp_path: pathlib.Path) -> AsyncIterator[MultiCluster]:
    async with running_multicluster(tmp_path=tmp_path, run=False) as multi:
        multi.reconcile(2)  # clusters connected, checks and ClusterQueues Active
        yield multi
        assert multi.manager.emulator.warnings == []
        assert all(w.emulator.warnings == [] for w in multi.workers.values())


async def test_the_per_site_setup_is_active(multi: MultiCluster) -> None:
    m = multi.manager
    assert {c["metadata"]["name"]: condition(c, "Active")["message"] for c in m.list("mkc")} == {
        "worker-a": "Connected",
        "worker-b": "Connected",
    }
    assert [condition(a, "Active")["reason"] for a in m.list("admissionchecks")] == ["Active"] * 2
    for cq in m.list("clusterqueues"):
        assert condition(cq, "Active")["message"] == "Can admit new workloads"
        assert cq["spec"]["admissionChecksStrategy"] == {
            "admissionChecks": [{"name": cq["metadata"]["name"]}]
        }
    assert {c["metadata"]["name"]: c["spec"]["clusters"] for c in m.list("mkconf")} == {
        "site-a": ["worker-a"],
        "site-b": ["worker-b"],
    }
    for name, worker in multi.workers.items():  # the same LocalQueue in the worker, no check
        site = "site-a" if name == "worker-a" else "site-b"
        assert [q["metadata"]["name"] for q in worker.list("localqueues", NS)] == [site]
        assert "admissionChecksStrategy" not in worker.list("clusterqueues")[0]["spec"]


async def test_a_jobset_queued_in_site_a_runs_in_worker_a_only(multi: MultiCluster) -> None:
    m, a, b = multi.manager, multi.workers["worker-a"], multi.workers["worker-b"]
    created = m.apply(jobset("train", "site-a"))
    # Kueue's webhook in the manager: suspended, and managed by MultiKueue (a MultiKueue queue)
    assert created["spec"]["suspend"] is True
    assert created["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"

    multi.kueue.reconcile()  # the Workload, its check Pending, quota reserved — not Admitted
    multi.kueue.reconcile()
    wl = multi.workload(m, NS, "train")
    assert wl is not None
    assert types(wl) == {"QuotaReserved": "True"}
    (check,) = wl["status"]["admissionChecks"]
    assert (check["name"], check["state"], check["message"]) == ("site-a", "Pending", "")

    multi.multikueue.reconcile()  # AllAtOnce: the site's only worker nominated, given a copy
    wl = multi.workload(m, NS, "train")
    assert wl is not None and wl["status"]["nominatedClusterNames"] == ["worker-a"]
    (copy_,) = a.list("workloads", NS)
    assert b.list("workloads") == [] and a.list("jobsets") == []
    assert copy_["metadata"]["name"] == wl["metadata"]["name"]
    assert copy_["metadata"]["labels"] == {MULTIKUEUE_ORIGIN_LABEL: "multikueue"}
    assert copy_["spec"] == wl["spec"] and "ownerReferences" not in copy_["metadata"]

    multi.worker_kueues["worker-a"].reconcile()  # worker-a's Kueue admits the copy
    assert types(a.get("workloads", NS, wl["metadata"]["name"]))["Admitted"] == "True"
    multi.multikueue.reconcile()  # the JobSet in worker-a, the manager's check Ready
    (remote,) = a.list("jobsets", NS)
    assert remote["metadata"]["labels"] == {
        QUEUE_LABEL: "site-a",
        MULTIKUEUE_ORIGIN_LABEL: "multikueue",
    }
    assert remote["metadata"]["annotations"][PREBUILT_WORKLOAD_KEY] == wl["metadata"]["name"]
    assert "managedBy" not in remote["spec"] and remote["spec"]["suspend"] is True
    wl = multi.workload(m, NS, "train")
    assert wl is not None
    assert wl["status"]["clusterName"] == "worker-a"
    assert "nominatedClusterNames" not in wl["status"]
    check = multi.check_state(NS, "train")
    assert check is not None and check["state"] == "Ready"
    assert check["message"] == 'The workload was admitted on "worker-a"'
    assert types(wl) == {"QuotaReserved": "True"}  # Admitted only after Kueue sees the check

    multi.reconcile(3)
    wl = multi.workload(m, NS, "train")
    assert types(wl) == {"QuotaReserved": "True", "Admitted": "True"}
    # the manager's JobSet is unsuspended (as jobframework does) but no controller runs it
    assert m.get("jobsets", NS, "train")["spec"]["suspend"] is False  # type: ignore[index]
    assert m.list("jobs") == [] and b.list("jobs") == [] and b.list("jobsets") == []
    # worker-a: its Kueue adopted the copy and started the JobSet, whose Jobs run there
    adopted = a.get("workloads", NS, wl["metadata"]["name"])  # type: ignore[index]
    assert adopted is not None
    assert adopted["metadata"]["labels"][JOB_UID_LABEL] == remote["metadata"]["uid"]
    assert a.get("jobsets", NS, "train")["spec"]["suspend"] is False  # type: ignore[index]
    assert sorted(j["metadata"]["name"] for j in a.list("jobs", NS)) == [
        "train-g0-0",
        "train-g0-1",
    ]
    assert multi.multikueue.remote_errors == []


async def test_status_is_mirrored_and_a_finished_jobset_cleans_the_worker(
    multi: MultiCluster,
) -> None:
    m, a = multi.manager, multi.workers["worker-a"]
    m.apply(jobset("train", "site-a"))
    multi.reconcile(6)
    for job in a.list("jobs", NS):
        a.set_job_running(NS, job["metadata"]["name"])
    multi.reconcile(2)
    mirrored = m.get("jobsets", NS, "train")["status"]  # type: ignore[index]
    assert mirrored == a.get("jobsets", NS, "train")["status"]  # type: ignore[index]
    assert mirrored["replicatedJobsStatus"] == [
        {"name": "g0", "ready": 2, "succeeded": 0, "failed": 0, "active": 2, "suspended": 0}
    ]

    for job in a.list("jobs", NS):
        a.set_job_succeeded(NS, job["metadata"]["name"])
    multi.reconcile(4)
    wl = multi.workload(m, NS, "train")
    assert wl is not None
    finished = condition(wl, "Finished")
    assert finished is not None
    assert (finished["reason"], finished["message"]) == (
        "Succeeded",
        "jobset completed successfully",
    )
    assert types(m.get("jobsets", NS, "train"))["Completed"] == "True"  # the last copy
    assert a.list("jobsets") == [] and a.list("workloads") == [] and a.list("jobs") == []


async def test_deleting_the_manager_jobset_deletes_the_remote_objects(
    tmp_path: pathlib.Path,
) -> None:
    async with running_multicluster(tmp_path=tmp_path) as multi:  # controllers in the background
        m, a = multi.manager, multi.workers["worker-a"]
        await m.kubectl("apply", "-f", "-", input=json.dumps(jobset("train", "site-a")))
        await m.wait_for(lambda: len(a.list("jobs", NS)) == 2)
        for job in a.list("jobs", NS):
            a.set_job_running(NS, job["metadata"]["name"])
        await m.wait_for(
            lambda: (
                ((m.get("jobsets", NS, "train") or {}).get("status") or {})
                .get("replicatedJobsStatus", [{}])[0]
                .get("ready")
                == 2
            )
        )
        out = (await m.kubectl("get", "kwl", "-n", NS)).stdout  # kubectl on the manager
        assert out.split("\n")[1].split()[1:4] == ["site-a", "site-a", "True"]
        await m.kubectl("delete", "jobset", "train", "-n", NS)
        await m.wait_for(
            lambda: a.list("jobsets") == [] and a.list("workloads") == [] and a.list("jobs") == []
        )
        assert m.list("workloads") == []


async def test_a_worker_without_the_namespace_gets_nothing(tmp_path: pathlib.Path) -> None:
    site = Site("site-a", worker="worker-a", namespace="team-a")
    async with running_multicluster([site], tmp_path=tmp_path, run=False) as multi:
        m, a = multi.manager, multi.workers["worker-a"]
        a.emulator.delete("namespaces", None, "team-a")  # its LocalQueue goes with it
        multi.reconcile(2)
        body = jobset("train", "site-a")
        body["metadata"]["namespace"] = "team-a"
        m.apply(body)
        multi.reconcile(4)
        wl = multi.workload(m, "team-a", "train")
        assert wl is not None and types(wl) == {"QuotaReserved": "True"}
        assert wl["status"]["nominatedClusterNames"] == ["worker-a"]
        # the real controller only logs the refused create and retries: the check stays as
        # Kueue added it (Pending, no message)
        check = multi.check_state("team-a", "train")
        assert check is not None and (check["state"], check["message"]) == ("Pending", "")
        assert multi.multikueue.remote_errors == [
            RemoteError(
                "worker-a", f"team-a/{wl['metadata']['name']}", 'namespaces "team-a" not found'
            )
        ]
        assert a.list("workloads") == [] and a.list("jobsets") == []


async def test_a_worker_whose_kubeconfig_secret_is_missing_gets_nothing(
    multi: MultiCluster,
) -> None:
    m, a = multi.manager, multi.workers["worker-a"]
    secret = m.get("secrets", CONFIG_NAMESPACE, kubeconfig_secret_name("worker-a"))
    assert secret is not None
    m.emulator.delete("secrets", CONFIG_NAMESPACE, kubeconfig_secret_name("worker-a"))
    multi.reconcile(2)
    mkc = m.get("mkc", None, "worker-a")
    assert mkc is not None
    (cond,) = mkc["status"]["conditions"]
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False",
        "BadKubeConfig",
        'load client config failed: secrets "worker-a-kubeconfig" not found',
    )
    (ac,) = [c for c in m.list("admissionchecks") if c["metadata"]["name"] == "site-a"]
    (cond,) = ac["status"]["conditions"]
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False",
        "NoUsableClusters",
        "Inactive clusters: [worker-a]",
    )
    cq = m.get("clusterqueues", None, "site-a")
    assert cq is not None
    (cond,) = cq["status"]["conditions"]
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False",
        "AdmissionCheckInactive",
        "Can't admit new workloads: references inactive AdmissionCheck(s): site-a.",
    )
    m.apply(jobset("train", "site-a"))
    multi.reconcile(3)
    wl = multi.workload(m, NS, "train")
    assert wl is not None
    reserved = wl["status"]["conditions"][0]
    assert (reserved["type"], reserved["status"], reserved["reason"], reserved["message"]) == (
        "QuotaReserved",
        "False",
        "Inadmissible",
        "ClusterQueue site-a is inactive",
    )
    assert a.list("workloads") == [] and a.list("jobsets") == []

    # a Secret that is not a kubeconfig: InsecureKubeConfig; the right one again: it runs
    def put(data: str) -> None:
        meta = {"name": kubeconfig_secret_name("worker-a"), "namespace": CONFIG_NAMESPACE}
        m.apply(
            {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {"kubeconfig": data}}
        )

    put(base64.b64encode(b"- [").decode())
    multi.reconcile(1)
    (cond,) = m.get("mkc", None, "worker-a")["status"]["conditions"]  # type: ignore[index]
    assert cond["reason"] == "InsecureKubeConfig"
    assert cond["message"].startswith("load client config failed: failed to parse kubeconfig")
    put(secret["data"]["kubeconfig"])
    multi.reconcile(8)
    assert len(a.list("jobs", NS)) == 2


async def test_a_jobset_not_managed_by_multikueue_is_rejected(multi: MultiCluster) -> None:
    m = multi.manager
    m.apply(jobset("train", "site-a", managedBy="example.com/other"))
    multi.reconcile(3)
    wl = multi.workload(m, NS, "train")
    assert wl is not None
    assert wl["spec"]["active"] is False  # Kueue deactivates a Workload with a Rejected check
    evicted = condition(wl, "Evicted")
    assert evicted is not None and evicted["reason"] == "DeactivatedDueToAdmissionCheck"
    assert evicted["message"] == (
        'The workload is deactivated due to AdmissionCheck in Rejected state: "site-a" (The '
        'owner is not managed by Kueue: Expecting spec.managedBy to be "kueue.x-k8s.io/multikueue" '
        'not "example.com/other", Previously: "Pending")'
    )
    assert multi.workers["worker-a"].list("workloads") == []


async def test_an_eviction_in_the_worker_retries_and_redispatches(multi: MultiCluster) -> None:
    m, a = multi.manager, multi.workers["worker-a"]
    m.apply(jobset("train", "site-a"))
    multi.reconcile(6)
    wl = multi.workload(m, NS, "train")
    assert wl is not None and types(wl)["Admitted"] == "True"
    first = a.get("jobsets", NS, "train")
    assert first is not None

    multi.worker_kueues["worker-a"].evict(NS, wl["metadata"]["name"])  # preempted in worker-a
    multi.multikueue.reconcile()  # the check goes to Retry...
    check = multi.check_state(NS, "train")
    assert check is not None and check["state"] == "Retry"
    assert check["message"] == (
        'Workload evicted on worker cluster: "worker-a", resetting for re-admission. '
        'Previously: "Ready"'
    )
    multi.kueue.reconcile()  # ...so Kueue evicts the manager's Workload: quota released
    wl = multi.workload(m, NS, "train")
    assert wl is not None
    evicted = condition(wl, "Evicted")
    assert evicted is not None and evicted["reason"] == "AdmissionCheck"
    assert "clusterName" not in wl["status"]
    assert m.get("jobsets", NS, "train")["spec"]["suspend"] is True  # type: ignore[index]
    multi.multikueue.reconcile()  # without quota: the worker's objects go
    assert a.list("jobsets") == [] and a.list("workloads") == []

    multi.reconcile(8)  # reserved again, dispatched again, admitted again
    wl = multi.workload(m, NS, "train")
    assert wl is not None and types(wl)["Admitted"] == "True"
    assert wl["status"]["clusterName"] == "worker-a"
    again = a.get("jobsets", NS, "train")
    assert again is not None and again["metadata"]["uid"] != first["metadata"]["uid"]
    assert len(a.list("jobs", NS)) == 2


async def test_a_preemption_in_the_manager_takes_the_workload_off_the_worker(
    multi: MultiCluster,
) -> None:
    m, a = multi.manager, multi.workers["worker-a"]
    m.apply(jobset("train", "site-a"))
    multi.reconcile(6)
    wl = multi.workload(m, NS, "train")
    assert wl is not None and len(a.list("jobs", NS)) == 2
    smaller = {
        "coveredResources": ["nvidia.com/gpu"],
        "flavors": [
            {"name": "site-a", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}
        ],
    }
    m.emulator.patch("clusterqueues", None, "site-a", {"spec": {"resourceGroups": [smaller]}})
    multi.kueue.evict(NS, wl["metadata"]["name"])
    multi.reconcile(3)
    wl = multi.workload(m, NS, "train")
    assert wl is not None and types(wl)["QuotaReserved"] == "False"  # 16 GPUs > 8: pending
    check = multi.check_state(NS, "train")
    assert check is not None
    assert (check["state"], check["message"]) == (
        "Pending",
        "Reset to Pending after eviction. Previously: Ready",
    )
    assert a.list("jobsets") == [] and a.list("workloads") == [] and a.list("jobs") == []
