"""The JobSet and Kueue pieces of a launch, without the operator: what is rendered passes the
JobSet CRD and JobSet's webhook (simulated, ``support/jobset.py``) for any plan name and island
layout, JobSet's controller makes exactly the islands' Jobs of it, the island pod selector finds
each island's rank 0 under either workload, and Kueue's conditions and flavors are read right.
The simulated webhook is checked to refuse what JobSet's refuses."""

from __future__ import annotations

import copy
from typing import Any

import kmock
import pytest
import yaml

from launch_local.kubelet import _job_pods, expand_jobsets
from launch_local.plan import REPO, plan
from shardmeter_operator.api import (
    GPUPoolSpec,
    IslandState,
    IslandStatus,
    TrainingPlanPhase,
    TrainingPlanStatus,
    WorkloadKind,
)
from shardmeter_operator.k8s.pods import JOB_NAME_LABEL, rank0_pod
from shardmeter_operator.launch.jobset import follow_jobset
from shardmeter_operator.launch.rules import plan_phase
from shardmeter_operator.launch.workload import launch_islands
from shardmeter_operator.render import kueue
from shardmeter_operator.render.jobset import JOBSET_NAME_MAX, jobset_name, replicated_jobs
from shardmeter_operator.render.launch import launch_manifests
from support.jobset import JOBSETS, JobSetController
from support.kube_emulator import JOBS, KubeEmulator
from support.kube_emulator.selectors import label_selector_matcher

POOL = GPUPoolSpec.model_validate(
    yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())["spec"]
)
NS = "default"


def island(i: int, nodes: int, micro: int = 2, pool: str = "cpu") -> IslandStatus:
    return IslandStatus(
        name=f"x-island-{i}",
        pool=pool,
        nodes=nodes,
        gpus_per_node=1,
        micro_batch=micro,
        accumulation=2,
        local_batch_tokens=256,
        step_seconds=0.05,
    )


def render_jobset(
    name: str, islands: list[IslandStatus]
) -> tuple[dict[str, Any], TrainingPlanStatus]:
    spec, status = plan()
    status = status.model_copy(
        update={"islands": launch_islands(name, islands, WorkloadKind.JOBSET)}
    )
    manifests = launch_manifests(
        name,
        NS,
        "uid",
        spec,
        status,
        {"cpu": POOL},
        plan_json="{}",
        revision="r1",
        bench_image="b",
        check=False,
        workload=WorkloadKind.JOBSET,
        queue="q",
    )
    (js,) = [m for m in manifests if m["kind"] == "JobSet"]
    return js, status


LONGEST = "a." + "b" * 250  # a 253-character, dotted TrainingPlan name


@pytest.mark.parametrize(
    ("name", "islands"),
    [
        ("e2e", [island(i, 1) for i in range(2)]),
        # 64 islands of alternating shapes (64 replicated Jobs), 4096 nodes each: the longest
        # child Job and pod names any plan can have, under the longest plan name
        (LONGEST, [island(i, 4096, micro=1 + i % 2) for i in range(64)]),
        ("9-starts-with-a-digit", [island(0, 3), island(1, 3), island(2, 5)]),
    ],
)
def test_the_jobset_passes_jobsets_crd_and_webhook_and_makes_the_islands(
    name: str, islands: list[IslandStatus]
) -> None:
    js, status = render_jobset(name, islands)
    emu = KubeEmulator()
    controller = JobSetController.install(emu)
    created = emu.create(JOBSETS, NS, js)  # structural schema, CEL, then the webhook
    assert emu.warnings == []  # nothing pruned: every field is JobSet's
    assert len(jobset_name(name)) <= JOBSET_NAME_MAX
    assert created["spec"]["suspend"] is True  # queued
    emu.patch(JOBSETS, NS, created["metadata"]["name"], {"spec": {"suspend": False}})
    controller.reconcile()  # the child Jobs pass Kubernetes' Job schema and name rules
    jobs = emu.select(JOBS, NS)
    assert sorted(j["metadata"]["name"] for j in jobs) == sorted(i.name for i in status.islands)
    for job in jobs:
        index = int(job["metadata"]["labels"]["jobset.sigs.k8s.io/job-global-index"])
        assert job["metadata"]["name"] == status.islands[index].name
        assert job["spec"]["completions"] == status.islands[index].nodes


def test_islands_group_by_runs_of_one_shape() -> None:
    islands = [island(0, 2), island(1, 2), island(2, 4), island(3, 2), island(4, 2, pool="b")]
    groups = replicated_jobs(islands)
    assert [(g.name, g.first, g.count) for g in groups] == [
        ("g0", 0, 2),
        ("g1", 2, 1),
        ("g2", 3, 1),
        ("g3", 4, 1),
    ]
    names = [i.name for i in launch_islands("p", islands, WorkloadKind.JOBSET)]
    assert names == ["p-g0-0", "p-g0-1", "p-g1-0", "p-g2-0", "p-g3-0"]
    assert launch_islands("p", islands, WorkloadKind.JOB) == islands


def test_the_webhook_refuses_what_jobsets_refuses() -> None:
    js, _ = render_jobset("e2e", [island(0, 1), island(1, 1)])
    emu = KubeEmulator()
    JobSetController.install(emu)
    too_long = copy.deepcopy(js)
    too_long["metadata"]["name"] = "x" * 51  # x…x-g0-1-0-abcde: 64 characters
    unknown = copy.deepcopy(js)
    unknown["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["bogus"] = 1
    bad_rule = copy.deepcopy(js)
    bad_rule["spec"]["failurePolicy"]["rules"] = [
        {"name": "1st", "action": "FailJobSet", "onJobFailureReasons": ["OOMKilled"]}
    ]
    for bad, why in [
        (too_long, "pod names generated for this JobSet will exceed 63 characters"),
        (unknown, r"template.spec: Additional properties are not allowed .*bogus"),
        (bad_rule, r"rule name ..1st.*invalid job failure reason ..OOMKilled"),
    ]:
        with pytest.raises(kmock.KubernetesError, match=why):
            emu.create(JOBSETS, NS, bad)
    # while suspended, Kueue may set node selectors; the rest of the Jobs is immutable
    emu.create(JOBSETS, NS, js)
    template = ["spec", "replicatedJobs", 0, "template", "spec", "template", "spec"]

    def patched(key: str, value: Any) -> dict[str, Any]:
        body = emu.read(JOBSETS, NS, "e2e")
        node: Any = body
        for part in template:
            node = node[part]
        node[key] = value
        return body

    emu.replace(JOBSETS, NS, "e2e", patched("nodeSelector", {"a": "b"}))
    with pytest.raises(kmock.KubernetesError, match="field is immutable"):
        emu.replace(JOBSETS, NS, "e2e", patched("hostNetwork", True))


@pytest.mark.parametrize("workload", list(WorkloadKind))
def test_the_island_pods_are_found_by_the_islands_name(workload: WorkloadKind) -> None:
    """``k8s.pods`` selects an island's pods by its Job's name, ``status.islands[].name``:
    under a JobSet that is the child Job JobSet creates, so the same selector finds them, and
    rank 0 is completion index 0."""
    spec, status = plan(workload)
    manifests = launch_manifests(
        "e2e",
        NS,
        "uid",
        spec,
        status,
        {"cpu": POOL},
        plan_json="{}",
        revision="r1",
        bench_image="b",
        workload=workload,
    )
    jobs = [m for m in expand_jobsets(manifests) if m["kind"] == "Job"]
    pods = [
        {"metadata": {"name": name, "labels": labels, "annotations": labels}}
        for job in jobs
        for name, labels, _ in _job_pods(job)
    ]
    for isl in status.islands:
        matches = label_selector_matcher(f"{JOB_NAME_LABEL}={isl.name}")
        mine = [p for p in pods if matches(p["metadata"]["labels"])]
        assert [p["metadata"]["name"] for p in mine] == [
            f"{isl.name}-{k}" for k in range(isl.nodes)
        ]
        rank0 = rank0_pod(mine)
        assert rank0 is not None and rank0["metadata"]["name"] == f"{isl.name}-0"


def test_flavor_problems_are_those_kueue_would_meet() -> None:
    pool = GPUPoolSpec.model_validate({**POOL.model_dump(), "kueue": {"flavor": "h200"}})
    ok = {"spec": {"nodeLabels": {"node.kubernetes.io/instance-type": "h200-8x", "zone": "a"}}}
    assert kueue.flavor_problem("a", pool, ok) == ""
    assert kueue.with_flavor(pool, ok).node_selector == {
        "node.kubernetes.io/instance-type": "h200-8x",
        "zone": "a",
    }
    assert "does not exist" in kueue.flavor_problem("a", pool, None)
    clash = {"spec": {"nodeLabels": {"node.kubernetes.io/instance-type": "a100-8x"}}}
    assert "contradict" in kueue.flavor_problem("a", pool, clash)
    # the pool tolerates nvidia.com/gpu (Exists, NoSchedule): that taint is fine, others not
    gpu = {
        "spec": {"nodeTaints": [{"key": "nvidia.com/gpu", "value": "x", "effect": "NoSchedule"}]}
    }
    assert kueue.flavor_problem("a", pool, gpu) == ""
    other = {"spec": {"nodeTaints": [{"key": "spot", "value": "1", "effect": "NoExecute"}]}}
    assert "spot=1:NoExecute" in kueue.flavor_problem("a", pool, other)
    soft = {"spec": {"nodeTaints": [{"key": "spot", "effect": "PreferNoSchedule"}]}}
    assert kueue.flavor_problem("a", pool, soft) == ""  # never keeps a pod off a node


def _workload(reserved: bool, admitted: bool, message: str = "") -> dict[str, Any]:
    def cond(type_: str, value: bool) -> dict[str, str]:
        return {
            "type": type_,
            "status": str(value),
            "reason": type_ if value else "Pending",
            "message": message,
        }

    status: dict[str, Any] = {
        "conditions": [cond("QuotaReserved", reserved), cond("Admitted", admitted)]
    }
    if admitted:
        status["admission"] = {
            "clusterQueue": "gpus",
            "podSetAssignments": [
                {"name": "g0", "flavors": {"nvidia.com/gpu": "h200", "cpu": "default"}}
            ],
        }
    return {"status": status}


def test_admission_is_all_of_the_plans_workloads() -> None:
    owners = [("Job a", "u1"), ("Job b", "u2")]
    none = kueue.admission("q", owners, {})
    assert (none.admitted.status, none.admitted.reason) == (False, "WorkloadNotCreated")
    half = kueue.admission(
        "q", owners, {"u1": _workload(True, True), "u2": _workload(False, False, "full")}
    )
    assert (half.quota_reserved.status, half.quota_reserved.message) == (
        False,
        "1/2 island Jobs; Job b: full",
    )
    assert half.waiting == "1/2 island Jobs; Job b: full"
    both = kueue.admission("q", owners, {"u1": _workload(True, True), "u2": _workload(True, True)})
    assert both.admitted.status and both.waiting == ""
    assert both.flavors == {"g0": "h200"}  # the GPUs' flavor
    assert both.admitted.message == "2 Workload(s) in ClusterQueue gpus; flavors: g0 → h200"


@pytest.mark.parametrize(
    ("reason", "rechecked"),
    [
        ("QueueNotFound", True),
        ("WorkloadUnavailable", True),
        ("FlavorMismatch", True),
        ("RuntimeCannotExpress", False),  # only a spec edit fixes that
    ],
)
def test_a_refusal_fixed_elsewhere_is_rechecked_on_any_event(reason: str, rechecked: bool) -> None:
    """Also after an operator restart (its in-process recheck timers are gone): installing
    JobSet or Kueue or creating the LocalQueue changes nothing the plan's watch would see."""
    from shardmeter_operator.decision import PoolView
    from shardmeter_operator.trainingplan.validate import needs_work

    valid = {
        "type": "Valid",
        "status": "False",
        "reason": reason,
        "message": "m",
        "lastTransitionTime": "t",
    }
    body = {
        "metadata": {"generation": 1},
        "spec": {"pools": [{"name": "cluster-a"}]},
        "status": {"observedGeneration": 1, "phase": "Invalid", "conditions": [valid]},
    }
    assert needs_work(body, {"cluster-a": PoolView({}, {})}) is rechecked


def test_a_failed_island_job_waits_for_the_jobsets_failure_policy() -> None:
    """A child Job that failed does not fail the plan by itself: JobSet restarts every island
    or fails the JobSet. Once the JobSet failed, the island that failed keeps its own reason,
    even when its Job is gone."""
    islands = [island(0, 1).model_copy(update={"name": f"js-g0-{i}"}) for i in range(2)]
    jobset: dict[str, Any] = {"spec": {"failurePolicy": {"maxRestarts": 1}}, "status": {}}
    running = {"status": {"ready": 1}, "spec": {"parallelism": 1}}
    failed = {"status": {"conditions": [_failed_condition("BackoffLimitExceeded")]}}
    jobs = {"js-g0-0": failed, "js-g0-1": running}
    after = follow_jobset(islands, jobset, jobs, {}, complete=True)
    assert [(i.state, i.reason) for i in after] == [
        (IslandState.PENDING, "BackoffLimitExceeded"),
        (IslandState.RUNNING, "PodsReady"),
    ]
    assert "0 of 1 restarts used" in after[0].message
    assert plan_phase(after) is TrainingPlanPhase.LAUNCHED
    jobset["status"] = {"conditions": [_failed_condition("ReachedMaxRestarts")]}
    final = follow_jobset(after, jobset, {"js-g0-1": running}, {}, complete=True)
    assert [(i.state, i.reason) for i in final] == [
        (IslandState.FAILED, "BackoffLimitExceeded"),
        (IslandState.FAILED, "ReachedMaxRestarts"),
    ]
    assert plan_phase(final) is TrainingPlanPhase.FAILED


def _failed_condition(reason: str) -> dict[str, str]:
    return {"type": "Failed", "status": "True", "reason": reason, "message": reason}
