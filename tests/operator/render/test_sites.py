"""A plan whose islands run in two other clusters, rendered for MultiKueue: the lighthouse
first (a LoadBalancer Service, or an address every site reaches), then one JobSet per site in
its site's queue — managed by MultiKueue, suspended, one replicated Job per island with the
island's id and rank-0 address as constants, a failed island recreated alone — each passing the
JobSet CRD and JobSet's (simulated) webhook; nothing but the lighthouse while no address is
known."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from launch_local.plan import REPO, plan
from shardmeter_operator.api import GPUPoolSpec, IslandStatus, RestartScope, WorkloadKind
from shardmeter_operator.render import kueue
from shardmeter_operator.render.jobset import accepts_restart_job
from shardmeter_operator.render.launch import launch_manifests
from shardmeter_operator.render.sites import name_site_islands, site_jobset_name
from support.jobset import CRD_FILE, JOBSETS, JobSetController
from support.kube_emulator import KubeEmulator

NS = "default"
BASE = yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())["spec"]


def pool(site: str) -> GPUPoolSpec:
    doc = copy.deepcopy(BASE)
    doc.update(site=site, kueue={"queueName": site, "cluster": f"worker-{site}"})
    return GPUPoolSpec.model_validate(doc)


POOLS = {"east": pool("east"), "west": pool("west")}


def islands() -> list[IslandStatus]:
    _, status = plan()
    base = status.islands[0]
    return [base.model_copy(update={"pool": p}) for p in ("east", "east", "west")]


def render(lighthouse: str | None, restart: RestartScope = RestartScope.ISLAND) -> list[Any]:
    spec, status = plan()
    named = name_site_islands("run", islands(), POOLS)
    status = status.model_copy(update={"islands": named, "islandCount": 3})
    return launch_manifests(
        "run",
        NS,
        "uid",
        spec,
        status,
        POOLS,
        plan_json="{}",
        revision="r1",
        bench_image="b",
        check=False,
        workload=WorkloadKind.JOBSET,
        restart=restart,
        site_queues={"east": "east", "west": "west"},
        lighthouse=lighthouse,
    )


def test_one_jobset_per_site_in_its_queue_managed_by_multikueue() -> None:
    manifests = render("http://lighthouse.example.net:29510")
    kinds = [(m["kind"], m["metadata"]["name"]) for m in manifests]
    assert kinds[:2] == [("Deployment", "run-lighthouse"), ("Service", "run-lighthouse")]
    assert manifests[1]["spec"]["type"] == "LoadBalancer"  # other clusters must reach it
    jobsets = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "JobSet"}
    assert set(jobsets) == {site_jobset_name("run", "east"), site_jobset_name("run", "west")}
    for site, indexes in (("east", [0, 1]), ("west", [2])):
        js = jobsets[site_jobset_name("run", site)]
        assert js["metadata"]["labels"][kueue.QUEUE_LABEL] == site
        assert js["spec"]["suspend"] is True
        assert js["spec"]["managedBy"] == kueue.MULTIKUEUE_CONTROLLER
        assert [r["name"] for r in js["spec"]["replicatedJobs"]] == [f"i{k}" for k in indexes]
        assert js["spec"]["failurePolicy"]["rules"] == [
            {"name": "restartTheIslandAlone", "action": "RestartJob"}
        ]
        for rj, k in zip(js["spec"]["replicatedJobs"], indexes, strict=True):
            assert rj["replicas"] == 1
            pod = rj["template"]["spec"]["template"]["spec"]
            env = {e["name"]: e for e in pod["containers"][0]["env"]}
            assert env["SHARDMETER_ISLAND_ID"] == {"name": "SHARDMETER_ISLAND_ID", "value": str(k)}
            name = js["metadata"]["name"]
            assert env["MASTER_ADDR"]["value"] == f"{name}-i{k}-0-0.{name}.{NS}.svc"
            assert env["TORCHFT_LIGHTHOUSE"]["value"] == "http://lighthouse.example.net:29510"
            command = pod["containers"][0]["command"] + pod["containers"][0].get("args", [])
            assert "--fault_tolerance.replica_id=$(SHARDMETER_ISLAND_ID)" in command
            assert "--fault_tolerance.group_size=3" in command
            # one island fewer makes a quorum: the others train on while one restarts
            assert "--fault_tolerance.min_replica_size=2" in command
    lighthouse_args = manifests[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--min_replicas=2" in lighthouse_args


def test_the_sites_jobsets_pass_the_crd_and_jobsets_webhook() -> None:
    jobsets = [m for m in render("http://10.0.0.9") if m["kind"] == "JobSet"]
    # JobSet v0.12's RestartJob is an alpha feature gate, off by default: its webhook refuses
    # the action (the operator asks by a dry run before it chooses RestartJob)
    with pytest.raises(Exception, match="RestartJob feature gate is disabled"):
        JobSetController.install(plain := KubeEmulator())
        plain.create(JOBSETS, NS, jobsets[0])
    emu = KubeEmulator()
    ctl = JobSetController.install(emu, {"RestartJob": True})
    for js in jobsets:
        emu.create(JOBSETS, NS, js)  # structural schema, CEL, then the webhook
    ctl.reconcile()  # managed by MultiKueue: the JobSet controller leaves them alone
    assert [
        j for j in emu.select(JOBSETS) if (j.get("status") or {}).get("replicatedJobsStatus")
    ] == []


def test_nothing_but_the_lighthouse_while_no_address_is_known() -> None:
    manifests = render("")
    assert [m["kind"] for m in manifests] == ["Deployment", "Service"]


def test_every_island_restarted_when_asked_and_the_quorum_is_every_island() -> None:
    manifests = render("http://10.0.0.9", restart=RestartScope.ALL_ISLANDS)
    js = next(m for m in manifests if m["kind"] == "JobSet")
    assert "rules" not in js["spec"]["failurePolicy"]
    assert "--min_replicas=3" in manifests[0]["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize(("has_it", "expected"), [(True, True), (False, False)])
def test_restart_job_support_is_read_from_the_jobset_crd(has_it: bool, expected: bool) -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    if not has_it:
        for v in crd["spec"]["versions"]:
            rules = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
                "failurePolicy"
            ]["properties"].get("rules")
            if rules:
                enum = rules["items"]["properties"]["action"]["enum"]
                rules["items"]["properties"]["action"]["enum"] = [
                    a
                    for a in enum
                    if not a.startswith("RestartJob") or a.startswith("RestartJobSet")
                ]
    assert accepts_restart_job(crd) is expected
