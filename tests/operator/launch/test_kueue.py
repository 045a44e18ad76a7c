"""Plans queued in Kueue, against the emulated API server with the simulated JobSet and Kueue
(``support/jobset.py``, ``support/kueue.py``): an unknown queue is ``Valid=False`` and creates
nothing; a queued JobSet waits suspended (``QuotaReserved=False`` with Kueue's reason, islands
``Queued``) until the quota fits all of its islands, which then start together; an eviction
suspends them again; a pool's ResourceFlavor pins its islands' flavor, and one Kueue could never
assign is refused; plain Jobs are admitted one by one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from operator_support import (
    LOCAL_QUEUE,
    apply,
    cluster_queue,
    condition,
    flavor,
    manifest,
    operator_cluster,
    status_of,
    variant,
    with_flavor,
)
from support.kueue import WORKLOADS, Kueue

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
POOL = manifest("gpupool-cluster-a.yaml")
PLAN = manifest("trainingplan.yaml")
NAME, NS, QUEUE = "llama-8b-case-study", "default", "team-a"  # LOCAL_QUEUE's name
QUEUED = {"launch": True, "pools": [{"name": "cluster-a"}], "queueName": QUEUE}
H200 = {"node.kubernetes.io/instance-type": "h200-8x"}


def phase(value: str) -> Any:
    return lambda s: s.get("phase") == value


def is_(type_: str, value: str, reason: str | None = None) -> Any:
    def check(s: dict[str, Any]) -> bool:
        c = next((c for c in s.get("conditions", []) if c["type"] == type_), None)
        return c is not None and c["status"] == value and reason in (None, c["reason"])

    return check


async def test_a_queued_jobset_starts_all_islands_once_kueue_admits_it(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path, jobset=True, kueue=True) as cluster:
        await apply(cluster, POOL, variant(PLAN, **QUEUED))
        status = await status_of(cluster, "trainingplans", NS, NAME, phase("Invalid"))
        valid = condition(status, "Valid")
        assert (valid["status"], valid["reason"]) == ("False", "QueueNotFound")
        assert valid["message"] == (
            f"spec.queueName: names LocalQueue {QUEUE}, which does not exist in namespace {NS}: "
            f"create it (kubectl get localqueues -n {NS}) or fix the name"
        )
        assert cluster.list("jobsets", NS) == [] and cluster.list("deployments", NS) == []

        # the queue appears, with room for half the plan: launched, suspended, queued
        await apply(cluster, flavor("h200", H200), cluster_queue(gpus=32), LOCAL_QUEUE)
        status = await status_of(
            cluster, "trainingplans", NS, NAME, is_("QuotaReserved", "False", "Pending")
        )
        assert status["phase"] == "Launched" and status["launch"]["queueName"] == QUEUE
        quota = condition(status, "QuotaReserved")["message"]
        assert quota == (
            "couldn't assign flavors to pod set g0: insufficient quota for nvidia.com/gpu in "
            "flavor h200, request > maximum capacity (64 > 32)"
        )
        assert condition(status, "Admitted")["status"] == "False"
        assert {(i["state"], i["reason"]) for i in status["islands"]} == {("pending", "Queued")}
        assert status["islands"][0]["message"] == quota
        (js,) = cluster.list("jobsets", NS)
        assert (
            js["spec"]["suspend"] is True
            and js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
        )
        (wl,) = cluster.list("workloads", NS)  # one Workload for every island: gang admission
        assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [("g0", 8)]
        assert all(j["spec"]["suspend"] for j in cluster.list("jobs", NS))  # nothing runs

        # quota for all 8 islands × 8 GPUs: admitted together, unsuspended on the flavor's nodes
        await apply(cluster, cluster_queue(gpus=64))
        status = await status_of(cluster, "trainingplans", NS, NAME, is_("Admitted", "True"))
        assert condition(status, "QuotaReserved")["message"] == (
            "1 Workload(s) in ClusterQueue gpus; flavors: g0 → h200"
        )
        admitted = await cluster.wait_for(
            lambda: [e for e in cluster.list("events", NS) if e.get("reason") == "Admitted"]
        )
        assert admitted[0]["involvedObject"]["kind"] == "TrainingPlan"
        await cluster.wait_for(
            lambda: (
                (jobs := cluster.list("jobs", NS))
                and len(jobs) == status["islandCount"]
                and not any(j["spec"]["suspend"] for j in jobs)
            )
        )
        jobs = cluster.list("jobs", NS)
        assert len(jobs) == status["islandCount"]
        for job in jobs:
            assert job["spec"]["template"]["spec"]["nodeSelector"] == H200
            cluster.set_job_running(NS, job["metadata"]["name"])
        status = await status_of(cluster, "trainingplans", NS, NAME, phase("Running"))

        # preempted: every island is suspended again and the plan says why
        await apply(cluster, cluster_queue(gpus=32))
        Kueue(cluster.emulator).evict(NS, wl["metadata"]["name"])
        status = await status_of(cluster, "trainingplans", NS, NAME, is_("Admitted", "False"))
        assert condition(status, "Admitted")["reason"] == "NoReservation"
        await status_of(
            cluster,
            "trainingplans",
            NS,
            NAME,
            lambda s: (
                {i["reason"] for i in s["islands"]} == {"Queued"} and s["phase"] == "Launched"
            ),
        )
        warnings = await cluster.wait_for(
            lambda: [e for e in cluster.list("events", NS) if e.get("reason") == "NoReservation"]
        )
        assert warnings[0]["type"] == "Warning"


async def test_a_pools_flavor_pins_its_islands_or_is_refused(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path, jobset=True, kueue=True) as cluster:
        wrong = {"node.kubernetes.io/instance-type": "h100-8x"}
        await apply(cluster, flavor("h200", wrong), cluster_queue(gpus=64), LOCAL_QUEUE)
        await apply(cluster, with_flavor(POOL, "h200"), variant(PLAN, **QUEUED))
        status = await status_of(
            cluster, "trainingplans", NS, NAME, is_("Valid", "False", "FlavorMismatch")
        )
        assert condition(status, "Valid")["message"] == (
            "spec.pools: GPUPool cluster-a: spec.kueue.flavor h200 has nodeLabels "
            "node.kubernetes.io/instance-type=h100-8x (pool: h200-8x) that contradict the pool's "
            "spec.nodeSelector: Kueue would never assign it; fix one of them"
        )
        assert cluster.list("jobsets", NS) == []

        # a taint the pool does not tolerate is refused the same way
        taint = [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]
        await apply(cluster, flavor("h200", {**H200, "cloud.example.com/rack": "r1"}, taint))
        status = await status_of(
            cluster,
            "trainingplans",
            NS,
            NAME,
            lambda s: "dedicated=training:NoSchedule" in condition(s, "Valid")["message"],
        )

        # fixed: the flavor's labels are in the islands' node selector before Kueue sees them;
        # a ClusterQueue that lists a flavor with unrelated labels first gets it assigned,
        # and the plan warns
        spot = flavor("spot", {"cloud.example.com/spot": "true"})
        queue = cluster_queue(gpus=64)
        group = queue["spec"]["resourceGroups"][0]
        group["flavors"].insert(0, {**group["flavors"][0], "name": "spot"})
        await apply(cluster, spot, queue)
        pool = with_flavor(POOL, "h200")
        pool["spec"]["tolerations"].append(
            {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
        )
        await apply(cluster, pool)
        status = await status_of(cluster, "trainingplans", NS, NAME, is_("Admitted", "True"))
        (wl,) = cluster.list("workloads", NS)
        seen = wl["spec"]["podSets"][0]["template"]["spec"]["nodeSelector"]
        assert seen == {**H200, "cloud.example.com/rack": "r1"}  # the pool's and its flavor's
        assert condition(status, "Admitted")["message"].endswith("flavors: g0 → spot")
        (warning,) = await cluster.wait_for(
            lambda: [e for e in cluster.list("events", NS) if e.get("reason") == "UnexpectedFlavor"]
        )
        assert warning["message"].startswith(
            "replicated Job g0 (pool cluster-a) was admitted on flavor spot, not the pool's h200"
        )


async def test_plain_jobs_are_admitted_one_by_one(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path, kueue=True) as cluster:  # no JobSet: workload Job
        await apply(cluster, flavor("h200", H200), cluster_queue(gpus=24), LOCAL_QUEUE)
        await apply(cluster, POOL, variant(PLAN, **QUEUED))
        status = await status_of(
            cluster, "trainingplans", NS, NAME, is_("QuotaReserved", "False", "Pending")
        )
        assert status["launch"]["workload"] == "Job"
        # Kueue admits each Job on its own: 3 of the 8 islands fit, and start
        assert condition(status, "QuotaReserved")["message"].startswith("3/8 island Jobs; Job ")
        workloads = cluster.list("workloads", NS)
        assert len(workloads) == 8 and {len(w["spec"]["podSets"]) for w in workloads} == {1}
        admitted = [w for w in workloads if (w.get("status") or {}).get("admission")]
        assert len(admitted) == 3
        jobs = {j["metadata"]["name"]: j for j in cluster.list("jobs", NS)}
        assert sum(not j["spec"]["suspend"] for j in jobs.values()) == 3
        assert all(
            j["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE for j in jobs.values()
        )
        queued = [i for i in status["islands"] if i["reason"] == "Queued"]
        assert len(queued) == 5 and "insufficient unused quota" in queued[0]["message"]
        assert cluster.emulator.select(WORKLOADS, NS)  # read through the resource, too


async def test_a_queue_without_kueue_is_invalid(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path, jobset=True) as cluster:  # no Kueue CRDs
        await apply(cluster, POOL, variant(PLAN, **QUEUED))
        status = await status_of(cluster, "trainingplans", NS, NAME, phase("Invalid"))
        assert condition(status, "Valid")["message"].startswith(
            f"spec.queueName: is {QUEUE}, but the cluster does not serve kueue.x-k8s.io/v1beta2"
        )
        assert cluster.list("jobsets", NS) == []


async def test_the_examples_queue_and_admit(tmp_path: Path) -> None:
    """examples/kueue.yaml and examples/trainingplan-queued.yaml, as docs/operator.md applies them."""
    examples = Path(__file__).resolve().parents[3] / "examples"
    async with operator_cluster(tmp_path, jobset=True, kueue=True) as cluster:
        await cluster.kubectl("apply", "-f", str(examples / "kueue.yaml"))
        await apply(cluster, with_flavor(POOL, "h200"))
        await cluster.kubectl("apply", "-f", str(examples / "trainingplan-queued.yaml"))
        status = await status_of(
            cluster, "trainingplans", NS, "llama-8b-queued", is_("Admitted", "True")
        )
        assert status["launch"]["workload"] == "JobSet" and status["launch"]["queueName"] == QUEUE
        assert condition(status, "Admitted")["message"].endswith("flavors: g0 → h200")
        (js,) = cluster.list("jobsets", NS)
        assert js["spec"]["failurePolicy"]["maxRestarts"] == 2
        wide = (
            await cluster.kubectl("get", "trainingplan", "llama-8b-queued", "-o", "wide")
        ).stdout
        assert wide.split("\n")[0].split()[-4:] == ["WORKLOAD", "ADMITTED", "RESTARTS", "AGE"]
        assert wide.split("\n")[1].split()[-4:-1] == ["JobSet", "True", "0"]
