"""A plan over two sites, each its own cluster: the operator runs against the manager of a
MultiKueue setup (Kueue v0.19.2, ``kueue.x-k8s.io/v1beta2``; JobSet v0.12.0 with its
``RestartJob`` gate on), two worker clusters behind it (``support.multicluster``: three
in-memory API servers, the simulated Kueue, MultiKueue and JobSet controllers), real kubectl
against the manager.

What it shows: one site admitted and the other not is shown, with the reason, and bounded; the
bad inputs a multi-site launch can have refuse the launch naming the field, with nothing
created; islands in workers are observed (rank 0's log: no kubelet serves one in the real
planes). The launch itself — one JobSet per site, real MultiKueue copying each to its worker,
the plan following both, an island restarting alone — and the shipped examples run against
three real control planes: tests/kube/test_multikueue.py.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import pytest_asyncio
import yaml

from operator_support import OPERATOR_NS, REPO, manifest, status_of, variant
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.handlers import build_registry
from support.cluster import EmulatedCluster, embedded_operator
from support.multicluster import SITES, MultiCluster, Site, running_multicluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
NS = "default"
NAME = "two-sites"
JOBSETS = "jobsets.jobset.x-k8s.io"


def pool(name: str, site: Site) -> dict[str, Any]:
    doc = copy.deepcopy(manifest("gpupool-cluster-a.yaml"))
    doc["metadata"]["name"] = name
    doc["spec"].update(
        nodes=1,
        site=site.name,
        wanUplink={
            "name": f"wan-{name}",
            "kind": "wan",
            "latencyS": 0.03,
            "bandwidthBytesPerS": "100 Gbit/s",
        },
        kueue={"queueName": site.name, "cluster": site.worker},
    )
    return doc


POOLS = [pool("east", SITES[0]), pool("west", SITES[1])]
PLAN = variant(
    manifest("multicluster/trainingplan.yaml"),
    pools=[{"name": "east"}, {"name": "west"}],
    objective={"kind": "min-time"},
    maxRestarts=3,
)
PLAN["metadata"]["name"] = NAME


@pytest_asyncio.fixture
async def multi(tmp_path: Path) -> AsyncIterator[MultiCluster]:
    async with running_multicluster(
        SITES, tmp_path=tmp_path, crds_dir=REPO / "crds", jobset_feature_gates={"RestartJob": True}
    ) as clusters:
        yield clusters


def operator_on(manager: EmulatedCluster, **config: Any) -> Any:
    """The operator embedded against the manager (worker kubeconfigs read unless said)."""
    cfg = OperatorConfig(
        namespace=OPERATOR_NS,
        recheck_interval_s=0.3,
        retry_backoff_s=0.2,
        kubeconfig=str(manager.kubeconfig_path),
        bench_image="bench:test",
        kueue_namespace="kueue-system",
        **{"read_worker_kubeconfigs": True, **config},
    )
    return embedded_operator(build_registry(cfg), memo=kopf.Memo(config=cfg, kube=None))


async def apply(cluster: EmulatedCluster, *docs: dict[str, Any]) -> None:
    for doc in docs:
        cluster.apply(copy.deepcopy(doc))


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def sites_of(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["site"]: s for s in status.get("sites") or []}


async def test_a_site_that_is_not_admitted_is_shown_and_bounded(multi: MultiCluster) -> None:
    manager = multi.manager
    plan = variant(PLAN, admissionTimeoutSeconds=10)
    plan["spec"]["faultTolerance"] = {
        **plan["spec"]["faultTolerance"],
        "lighthouseAddress": "lh.example.net:29510",
    }
    # site-b's worker has no quota left for the islands: its copy is never admitted
    quota = dict(SITES[1].quota)
    wq = multi.worker_of("site-b").get("clusterqueues.kueue.x-k8s.io", None, "site-b")
    assert wq is not None and quota
    wq["spec"]["resourceGroups"][0]["flavors"][0]["resources"] = [
        {"name": "nvidia.com/gpu", "nominalQuota": 0}
    ]
    multi.worker_of("site-b").apply(wq)
    async with operator_on(manager):
        await apply(manager, *POOLS, plan)
        status = await status_of(
            manager,
            "trainingplans",
            NS,
            NAME,
            lambda s: (
                sites_of(s).get("site-a", {}).get("admission") == "Admitted"
                and sites_of(s).get("site-b", {}).get("admission") == "TimedOut"
            ),
        )
        assert status["phase"] != "Running"
        admitted = cond(status, "Admitted")
        assert (admitted["status"], admitted["reason"]) == ("False", "AdmissionTimeout"), admitted
        assert "site-a: admitted by worker-a" in admitted["message"]
        assert "site-b: TimedOut" in admitted["message"]
        assert "spec.admissionTimeoutSeconds" in sites_of(status)["site-b"]["message"]


async def test_bad_multisite_input_is_refused_naming_the_field_and_recovers(
    multi: MultiCluster,
) -> None:
    manager = multi.manager
    # a ClusterQueue without a MultiKueue check (it would run the islands in the manager)
    manager.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "local"},
            "spec": {"namespaceSelector": {}, "resourceGroups": []},
        }
    )
    manager.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "local", "namespace": NS},
            "spec": {"clusterQueue": "local"},
        }
    )
    # a namespace the manager has and worker-b has not
    manager.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-x"}})
    for site in SITES:
        manager.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": site.name, "namespace": "team-x"},
                "spec": {"clusterQueue": site.name},
            }
        )
    async with operator_on(manager):
        cases = [
            (
                [
                    variant(p, kueue={"queueName": "nowhere"})
                    if p["metadata"]["name"] == "west"
                    else p
                    for p in POOLS
                ],
                PLAN,
                "GPUPool west: spec.kueue.queueName nowhere names no LocalQueue",
            ),
            (
                [
                    variant(p, kueue={"queueName": "local"})
                    if p["metadata"]["name"] == "west"
                    else p
                    for p in POOLS
                ],
                PLAN,
                "ClusterQueue local has no MultiKueue admission check",
            ),
            (POOLS, variant(PLAN, workload="Job"), "spec.workload: is Job"),
        ]
        for pools, plan, message in cases:
            await apply(manager, *pools, plan)
            await status_of(
                manager,
                "trainingplans",
                NS,
                NAME,
                lambda s, m=message: (
                    m in cond(s, "Valid").get("message", "")
                    or m in cond(s, "Launched").get("message", "")
                ),
            )
            assert manager.list(JOBSETS, NS) == [], message  # nothing half-created
        team = copy.deepcopy(PLAN)
        team["metadata"]["namespace"] = "team-x"
        await apply(manager, *POOLS, team)
        await status_of(
            manager,
            "trainingplans",
            "team-x",
            NAME,
            lambda s: (
                "has no namespace team-x" in cond(s, "Launched").get("message", "")
                or "has no namespace team-x" in cond(s, "Valid").get("message", "")
            ),
        )
        assert manager.list(JOBSETS, "team-x") == []
        # the fix: the namespace and its LocalQueues in both workers → it launches
        for site in SITES:
            worker = multi.worker_of(site.name)
            if worker.get("namespaces", None, "team-x") is None:
                worker.apply(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-x"}}
                )
            worker.apply(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "LocalQueue",
                    "metadata": {"name": site.name, "namespace": "team-x"},
                    "spec": {"clusterQueue": site.name},
                }
            )
        await status_of(
            manager,
            "trainingplans",
            "team-x",
            NAME,
            lambda s: cond(s, "Launched").get("reason") == "WaitingForLighthouse",
        )


def _yaml(*docs: dict[str, Any]) -> str:
    return yaml.safe_dump_all([copy.deepcopy(d) for d in docs], sort_keys=False)


@pytest.mark.parametrize("kubeconfigs", [True, False], ids=["worker-logs", "prometheus"])
async def test_islands_in_workers_are_observed(multi: MultiCluster, kubeconfigs: bool) -> None:
    """Step times of islands in worker clusters: read from rank 0's log in the worker with
    MultiKueue's kubeconfig — or, where the operator may not read it, from Prometheus."""
    from support.prometheus import fake_prometheus, vector

    fixtures = REPO / "tests" / "fixtures" / "observe"
    logs = [(fixtures / f"e2e-island-{i}.log").read_text() for i in (0, 1)]
    query = 'step_seconds{job="$job"}'
    plan = copy.deepcopy(PLAN)
    plan["spec"]["faultTolerance"]["lighthouseAddress"] = "lh.example.net:29510"
    if not kubeconfigs:
        plan["spec"]["observe"] = {"stepSecondsQuery": query}
    jobs = [f"{NAME}-{site.name}-i{k}-0" for site in SITES for k in (0, 1)]
    answers = {query.replace("$job", job): (200, vector(2.5)) for job in jobs}
    manager = multi.manager
    with fake_prometheus(answers) as (url, seen):
        async with operator_on(
            manager,
            read_worker_kubeconfigs=kubeconfigs,
            prometheus_url=url,
            observe_interval_s=0.3,
        ):
            await apply(manager, *POOLS, plan)
            status = await status_of(
                manager,
                "trainingplans",
                NS,
                NAME,
                lambda s: cond(s, "Admitted").get("status") == "True",
            )
            for isl, text in zip(status["islands"], logs, strict=True):
                worker = multi.worker_of("site-a" if isl["pool"] == "east" else "site-b")
                await worker.wait_for(lambda w=worker, n=isl["name"]: w.get("jobs", NS, n))
                worker.set_job_running(NS, isl["name"])
                pod = worker.create_job_pod(NS, isl["name"], 0)
                worker.set_pod_log(NS, pod["metadata"]["name"], text)
            status = await status_of(
                manager,
                "trainingplans",
                NS,
                NAME,
                lambda s: (
                    bool(s.get("islands"))
                    and all(
                        (i.get("observed") or {}).get("reason") == "Observed" for i in s["islands"]
                    )
                ),
            )
    observations = [i["observed"] for i in status["islands"]]
    if kubeconfigs:  # the worker's own pod log, read with MultiKueue's kubeconfig
        assert all(o["source"] == "log" and o["steps"] > 0 for o in observations), observations
        assert seen == []
    else:  # no credentials for the workers: the query is the only source, and it says so
        assert all(o["source"] == "prometheus" for o in observations), observations
        assert all(o["stepSecondsP50"] == 2.5 for o in observations)
        assert all("not readable" in o["message"] for o in observations)
