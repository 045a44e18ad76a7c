"""The simulated Kueue at kueue.x-k8s.io/v1beta2 (Kueue v0.19.2; ``support/kueue.py`` and its CRDs):
only v1beta2 is served and v1beta1's field names are refused by ``kubectl apply``; a ClusterQueue
is Active only with its flavors and (Active) admission checks; with admission checks a Workload
reserves quota first and is Admitted only once every check is Ready, a Retry check evicts it
(checks back to Pending) and a Rejected one deactivates it; a JobSet naming a prebuilt Workload
adopts it; Kueue's pod labels are set at start."""

from __future__ import annotations

import copy
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from support.cluster import EmulatedCluster, KubectlError, running_emulator
from support.jobset import JOBSETS, JobSetController
from support.kueue import (
    ADMISSION_CHECKS,
    API_VERSION,
    CLUSTER_QUEUES,
    JOB_UID_LABEL,
    PREBUILT_WORKLOAD_KEY,
    QUEUE_LABEL,
    WORKLOADS,
    Kueue,
    pod_sets,
)
from support.kueue_status import condition

pytestmark = pytest.mark.asyncio
REPO = pathlib.Path(__file__).resolve().parents[2]
NS = "default"


@pytest_asyncio.fixture
async def cluster(tmp_path: pathlib.Path) -> AsyncIterator[EmulatedCluster]:
    async with running_emulator(tmp_path=tmp_path) as cluster:
        JobSetController.install(cluster.emulator)
        Kueue.install(cluster.emulator)
        yield cluster
        assert cluster.emulator.warnings == []


def kueue(kind: str, name: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {"name": name, **meta},
        "spec": spec,
    }


def queues(checks: list[str] | None = None, gpus: int = 16) -> list[dict[str, Any]]:
    cq: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["nvidia.com/gpu"],
                "flavors": [
                    {
                        "name": "h200",
                        "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}],
                    }
                ],
            }
        ],
    }
    if checks:
        cq["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return [
        kueue("ResourceFlavor", "h200", {"nodeLabels": {"gpu": "h200"}}),
        kueue("ClusterQueue", "gpus", cq),
        kueue("LocalQueue", "team", {"clusterQueue": "gpus"}, namespace=NS),
    ]


def add_check(cluster: EmulatedCluster, name: str, active: bool = True) -> None:
    """An AdmissionCheck of some controller; its Active condition set as that controller would."""
    cluster.apply(kueue("AdmissionCheck", name, {"controllerName": "example.com/provisioning"}))
    status = {
        "conditions": [
            {
                "type": "Active",
                "status": "True" if active else "False",
                "reason": "Active" if active else "Inactive",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }
    cluster.emulator.patch(ADMISSION_CHECKS, None, name, {"status": status}, subresource="status")


def jobset(name: str = "train", **meta: Any) -> dict[str, Any]:
    pod = {
        "restartPolicy": "Never",
        "containers": [
            {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
        ],
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_LABEL: "team"}, **meta},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "g0",
                    "replicas": 2,
                    "template": {"spec": {"backoffLimit": 0, "template": {"spec": pod}}},
                }
            ]
        },
    }


def the_workload(cluster: EmulatedCluster) -> dict[str, Any]:
    (wl,) = cluster.list(WORKLOADS, NS)
    return wl


def set_check(cluster: EmulatedCluster, wl: dict[str, Any], name: str, state: str) -> None:
    """What the check's controller does: its state on the Workload."""
    status = copy.deepcopy(wl["status"])
    for c in status["admissionChecks"]:
        if c["name"] == name:
            c.update(state=state, message=f"{name} is {state}")
    cluster.emulator.replace(
        WORKLOADS, NS, wl["metadata"]["name"], {**wl, "status": status}, subresource="status"
    )


def conditions(wl: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in wl["status"].get("conditions") or []}


async def test_only_v1beta2_is_served_with_its_field_names(cluster: EmulatedCluster) -> None:
    status, _ = await cluster.api("GET", "/apis/kueue.x-k8s.io/v1beta1")
    assert status == 404
    group = (await cluster.api("GET", "/apis/kueue.x-k8s.io"))[1]
    assert [v["version"] for v in group["versions"]] == ["v1beta2"]
    await cluster.kubectl("apply", "-f", str(REPO / "examples" / "kueue.yaml"))
    assert [q["metadata"]["name"] for q in cluster.list("lq", NS)] == ["team-a"]
    # v1beta1 names: spec.cohort (now cohortName), the admissionChecks list (now only
    # admissionChecksStrategy), a MultiKueueCluster's spec.kubeConfig (now under clusterSource)
    for doc in (
        kueue("ClusterQueue", "old", {"cohort": "c"}),
        kueue("ClusterQueue", "old", {"admissionChecks": ["ac"]}),
        kueue(
            "MultiKueueCluster", "old", {"kubeConfig": {"location": "s", "locationType": "Secret"}}
        ),
        {
            **kueue("LocalQueue", "old", {"clusterQueue": "gpus"}, namespace=NS),
            "apiVersion": "kueue.x-k8s.io/v1beta1",
        },
    ):
        with pytest.raises(KubectlError):
            await cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    await cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            kueue(
                "ClusterQueue",
                "new",
                {
                    "cohortName": "c",
                    "admissionChecksStrategy": {
                        "admissionChecks": [{"name": "ac", "onFlavors": ["h200"]}]
                    },
                },
            )
        ),
    )
    out = (await cluster.kubectl("get", "cq", "new")).stdout.split("\n")[0].split()
    assert out[:2] == ["NAME", "COHORT"]
    status, _ = await cluster.api("GET", f"/apis/{API_VERSION}/namespaces/{NS}/workloads")
    assert status == 200
    assert (await cluster.kubectl("get", "kwl", "-n", NS, check=False)).returncode == 0
    assert (await cluster.kubectl("get", "wl", "-n", NS, check=False)).returncode != 0


async def test_a_cluster_queue_is_active_only_with_its_flavors_and_checks(
    cluster: EmulatedCluster,
) -> None:
    flavor, cq, lq = queues(checks=["prov"])
    for doc in (cq, lq):
        cluster.apply(doc)
    kueue_ = Kueue(cluster.emulator)
    kueue_.reconcile()

    def active() -> tuple[str, str, str]:
        c = cluster.get(CLUSTER_QUEUES, None, "gpus")["status"]["conditions"][0]  # type: ignore[index]
        return c["status"], c["reason"], c["message"]

    assert active() == (
        "False",
        "FlavorNotFound",
        "Can't admit new workloads: references missing ResourceFlavor(s): h200, "
        "references missing AdmissionCheck(s): prov.",
    )
    cluster.apply(flavor)
    add_check(cluster, "prov", active=False)
    kueue_.reconcile()
    assert active() == (
        "False",
        "AdmissionCheckInactive",
        "Can't admit new workloads: references inactive AdmissionCheck(s): prov.",
    )
    cluster.apply(jobset())
    kueue_.reconcile()
    kueue_.reconcile()
    reserved = the_workload(cluster)["status"]["conditions"][0]
    assert (reserved["reason"], reserved["message"]) == (
        "Inadmissible",
        "ClusterQueue gpus is inactive",
    )
    add_check(cluster, "prov")
    kueue_.reconcile()
    assert active() == ("True", "Ready", "Can admit new workloads")
    assert conditions(the_workload(cluster))["QuotaReserved"] == ("True", "QuotaReserved")


async def test_admitted_only_once_every_check_is_ready(cluster: EmulatedCluster) -> None:
    for doc in queues(checks=["prov", "other"]):
        cluster.apply(doc)
    add_check(cluster, "prov")
    add_check(cluster, "other")
    kueue_, jobsets = Kueue(cluster.emulator), JobSetController(cluster.emulator)
    cluster.apply(jobset())
    kueue_.reconcile()
    kueue_.reconcile()
    wl = the_workload(cluster)
    assert conditions(wl) == {"QuotaReserved": ("True", "QuotaReserved")}  # no Admitted yet
    assert [(c["name"], c["state"], c["message"]) for c in wl["status"]["admissionChecks"]] == [
        ("other", "Pending", ""),
        ("prov", "Pending", ""),
    ]
    set_check(cluster, wl, "prov", "Ready")
    kueue_.reconcile()
    assert "Admitted" not in conditions(the_workload(cluster))
    assert cluster.get(JOBSETS, NS, "train")["spec"]["suspend"] is True  # type: ignore[index]
    set_check(cluster, the_workload(cluster), "other", "Ready")
    kueue_.reconcile()
    wl = the_workload(cluster)
    assert conditions(wl)["Admitted"] == ("True", "Admitted")
    js = cluster.get(JOBSETS, NS, "train")
    assert js is not None and js["spec"]["suspend"] is False
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod["metadata"]["labels"] == {
        "kueue.x-k8s.io/podset": "g0",
        "kueue.x-k8s.io/local-queue-name": "team",
        "kueue.x-k8s.io/cluster-queue-name": "gpus",
    }
    assert pod["metadata"]["annotations"] == {"kueue.x-k8s.io/workload": wl["metadata"]["name"]}
    assert pod["spec"]["nodeSelector"] == {"gpu": "h200"}
    assert wl["spec"]["podSets"][0]["topologyRequest"] == {
        "podIndexLabel": "batch.kubernetes.io/job-completion-index",
        "subGroupIndexLabel": "jobset.sigs.k8s.io/job-index",
        "subGroupCount": 2,
    }

    # a check in Retry: evicted, quota released, checks back to Pending, the JobSet suspended
    jobsets.reconcile()
    set_check(cluster, wl, "prov", "Retry")
    kueue_.reconcile()
    wl = the_workload(cluster)
    message = 'Evicted due to AdmissionCheck in Retry state: "prov" (prov is Retry)'
    assert conditions(wl)["Evicted"] == ("True", "AdmissionCheck")
    assert condition(wl, "Evicted")["message"] == message  # type: ignore[index]
    assert conditions(wl)["QuotaReserved"] == ("False", "Pending")
    assert conditions(wl)["Admitted"] == ("False", "NoReservationUnsatisfiedChecks")
    assert "admission" not in wl["status"]
    states = {c["name"]: c for c in wl["status"]["admissionChecks"]}
    assert states["prov"]["state"] == "Pending" and states["prov"]["retryCount"] == 1
    assert states["prov"]["message"] == "Reset to Pending after eviction. Previously: Retry"
    assert states["other"]["message"] == "Reset to Pending after eviction. Previously: Ready"
    assert cluster.get(JOBSETS, NS, "train")["spec"]["suspend"] is True  # type: ignore[index]
    kueue_.reconcile()  # queued again: quota reserved anew, the eviction over
    wl = the_workload(cluster)
    assert conditions(wl)["QuotaReserved"] == ("True", "QuotaReserved")
    assert conditions(wl)["Evicted"] == ("False", "QuotaReserved")

    # a check Rejected: the Workload is deactivated and stays so
    set_check(cluster, wl, "other", "Rejected")
    kueue_.reconcile()
    kueue_.reconcile()
    wl = the_workload(cluster)
    assert wl["spec"]["active"] is False
    assert conditions(wl)["Evicted"] == ("True", "DeactivatedDueToAdmissionCheck")
    assert conditions(wl)["QuotaReserved"][0] == "False"


async def test_a_jobset_naming_a_prebuilt_workload_adopts_it(cluster: EmulatedCluster) -> None:
    for doc in queues():
        cluster.apply(doc)
    kueue_ = Kueue(cluster.emulator)
    kueue_.reconcile()
    prebuilt = {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {"name": "made-before", "namespace": NS},
        "spec": {"queueName": "team", "podSets": pod_sets(jobset(), "JobSet")},
    }
    cluster.apply(prebuilt)
    kueue_.reconcile()  # admitted without an owner, as MultiKueue's copies in a worker are
    assert conditions(the_workload(cluster))["Admitted"] == ("True", "Admitted")
    js = cluster.apply(jobset(annotations={PREBUILT_WORKLOAD_KEY: "made-before"}))
    kueue_.reconcile()
    kueue_.reconcile()
    wl = the_workload(cluster)  # still the only one
    assert wl["metadata"]["labels"][JOB_UID_LABEL] == js["metadata"]["uid"]
    (owner,) = wl["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("JobSet", "train", True)
    assert cluster.get(JOBSETS, NS, "train")["spec"]["suspend"] is False  # type: ignore[index]
