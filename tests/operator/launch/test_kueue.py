"""Plans queued in Kueue, against the emulated API server with the simulated JobSet and Kueue
(``support/jobset.py``, ``support/kueue.py``): a pool's ResourceFlavor pins its islands' flavor,
and one Kueue could never assign is refused; a queue without Kueue is invalid; the examples
queue and are admitted. Quota, gang admission, eviction and plain Jobs admitted one by one run
against the real Kueue: tests/kube/test_kueue.py."""

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
