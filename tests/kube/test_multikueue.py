"""A two-site plan dispatched by real MultiKueue: three control planes — the session's plane as
the manager (Kueue's MultiKueue admission check controller runs there) and two worker planes,
``worker-east`` and ``worker-west``, each with its own etcd, kube-apiserver, kube-controller-
manager, JobSet (RestartJob on) and Kueue — set up with the shipped examples
(examples/multicluster: manager.yaml, worker.yaml, gpupools.yaml, trainingplan.yaml) and a
kubeconfig Secret per worker. The operator runs against the manager: one JobSet per site in the
site's queue, managed by MultiKueue; real MultiKueue copies each to its worker, whose Kueue
admits it and whose JobSet controller makes the islands' Jobs; the plan follows both sites; an
island that fails in one worker restarts alone."""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_support import REPO, Kube, real_operator
from support.realkube import running_plane
from support.realkube.cluster import Plane, RealCluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]
EXAMPLES = REPO / "examples" / "multicluster"
NS, JOBSETS = "default", "jobsets"
SITES = {"east": "worker-east", "west": "worker-west"}


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def worker_docs(site: str) -> list[dict[str, Any]]:
    """worker.yaml is shown for east; "for west replace east by west and the flavor's name"."""
    if site == "east":
        return docs("worker.yaml")
    text = (EXAMPLES / "worker.yaml").read_text().replace("east-h200", "west-a100")
    return [d for d in yaml.safe_load_all(text.replace("east", "west")) if d]


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Plane]]:
    """Two worker planes (JobSet with RestartJob on, Kueue), each with its site's queue."""
    directory = tmp_path_factory.mktemp("workers")
    with (
        running_plane(directory, SITES["east"], jobset_feature_gates={"RestartJob": True}) as east,
        running_plane(directory, SITES["west"], jobset_feature_gates={"RestartJob": True}) as west,
    ):
        planes = {"east": east, "west": west}
        for site, plane in planes.items():
            for doc in worker_docs(site):
                plane.admin.apply(doc)
        yield planes


def kubeconfig_secret(worker: str, plane: Plane, directory: Path) -> dict[str, Any]:
    """The manager's Secret kueue-system/<worker> (key ``kubeconfig``): a client certificate
    of the worker's CA in system:masters (MultiKueue creates, watches and deletes JobSets and
    Workloads there)."""
    path = plane.control.client_kubeconfig(
        directory / f"{worker}.kubeconfig", "multikueue", ("system:masters",)
    )
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": worker, "namespace": "kueue-system"},
        "data": {"kubeconfig": base64.b64encode(path.read_bytes()).decode()},
    }


def sites_of(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["site"]: s for s in status.get("sites") or []}


async def test_a_two_site_plan_is_dispatched_by_multikueue_and_followed_per_site(
    kube: Kube, workers: dict[str, Plane], tmp_path: Path
) -> None:
    manager = kube
    for site, worker in SITES.items():
        manager.apply(kubeconfig_secret(worker, workers[site], tmp_path))
        manager.created.append(("secrets", "kueue-system", worker))
    for doc in docs("manager.yaml") + docs("gpupools.yaml"):
        manager.apply(doc)
        if doc["metadata"].get("namespace"):
            manager.created.append(
                (doc["kind"].lower(), doc["metadata"]["namespace"], doc["metadata"]["name"])
            )
    # MultiKueue connects to both workers
    for worker in SITES.values():
        await manager.wait_for(
            lambda w=worker: _condition(manager.get("multikueueclusters", None, w), "Active"),
            60,
            f"MultiKueueCluster {worker} never Active: "
            f"{(manager.get('multikueueclusters', None, worker) or {}).get('status')}",
        )
    (plan,) = docs("trainingplan.yaml")
    name = plan["metadata"]["name"]
    manager.created.append(("trainingplans", NS, name))
    remote = {site: RealCluster(plane.control.admin_kubeconfig) for site, plane in workers.items()}
    try:
        async with real_operator(
            manager, read_worker_kubeconfigs=True, kueue_namespace="kueue-system"
        ):
            manager.apply(copy.deepcopy(plan))
            await _give_ingress(manager, f"{name}-lighthouse", "203.0.113.7")
            status = await _status(
                manager,
                name,
                lambda s: (
                    len(sites_of(s)) == 2
                    and {x.get("admission") for x in sites_of(s).values()} == {"Admitted"}
                ),
            )
            sites = sites_of(status)
            assert {s: v["cluster"] for s, v in sites.items()} == SITES
            jobsets = {j["metadata"]["name"]: j for j in manager.list(JOBSETS, NS)}
            for site, v in sites.items():
                js = jobsets[v["jobSet"]]
                assert js["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"
                assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == site
                # MultiKueue's copy runs in the site's worker, and only there
                here, there = remote[site], remote["west" if site == "east" else "east"]
                copied = await here.wait_for(lambda h=here, n=v["jobSet"]: h.get(JOBSETS, NS, n))
                assert there.get(JOBSETS, NS, v["jobSet"]) is None
                assert "managedBy" not in copied["spec"]
            # the islands' Jobs, made by each worker's JobSet controller, run there
            islands = {i["name"]: i for i in status["islands"]}
            for island, isl in islands.items():
                worker = remote[_site_of(isl)]
                await worker.wait_for(lambda w=worker, n=island: w.get("jobs", NS, n), 60)
                worker.set_job_running(NS, island)
            await _status(manager, name, lambda s: s["phase"] == "Running")

            # one island fails in west: west's JobSet recreates its Job alone
            failing = next(n for n, i in islands.items() if _site_of(i) == "west")
            keeping = next(n for n, i in islands.items() if _site_of(i) == "east")
            west, east = remote["west"], remote["east"]
            kept_uid = east.get("jobs", NS, keeping)["metadata"]["uid"]  # type: ignore[index]
            failed_uid = west.get("jobs", NS, failing)["metadata"]["uid"]  # type: ignore[index]
            west.set_job_failed(NS, failing)
            await west.wait_for(
                lambda: (
                    ((west.get("jobs", NS, failing) or {}).get("metadata") or {}).get("uid")
                    not in (None, failed_uid)
                ),
                60,
            )
            status = await _status(manager, name, lambda s: (s.get("restarts") or 0) >= 1)
            assert east.get("jobs", NS, keeping)["metadata"]["uid"] == kept_uid  # type: ignore[index]
            assert status["phase"] != "Failed"
        # deleting the plan: MultiKueue removes the workers' copies with the manager's JobSets
        manager.delete("trainingplans", NS, name)
        for client in remote.values():
            await client.wait_for(lambda c=client: not c.list(JOBSETS, NS), 90)
    finally:
        for client in remote.values():
            client.close()


def _site_of(island: dict[str, Any]) -> str:
    return str(island["pool"])  # the example's pools are named after their sites


def _condition(obj: dict[str, Any] | None, type_: str) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == type_ and c["status"] == "True" for c in conditions)


async def _give_ingress(kube: Kube, service: str, ip: str) -> None:
    """What a cloud's load-balancer controller does for the lighthouse's Service."""
    svc = await kube.wait_for(lambda: kube.get("services", NS, service), 60)
    assert svc["spec"]["type"] == "LoadBalancer"
    kube.patch(
        "services",
        NS,
        service,
        {"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}},
        subresource="status",
    )


async def _status(kube: Kube, name: str, predicate: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def check() -> bool:
        s = (kube.get("trainingplans", NS, name) or {}).get("status") or {}
        if s and predicate(s):
            found.update(s)
            return True
        return False

    await kube.wait_for(check, 120, f"TrainingPlan {name}: {predicate}")
    return found
