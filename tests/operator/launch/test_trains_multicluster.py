"""A two-site plan that trains across two clusters, and an island that fails restarts alone.

The manifests the operator renders for a 2-island Streaming DiLoCo plan whose islands are in
two sites (one JobSet per site, each in its site's queue, managed by MultiKueue, RestartJob
per island) are applied to the manager of a MultiKueue setup of three in-memory API servers
(``support.multicluster``: Kueue v0.19.2's MultiKueue dispatching each JobSet to its site's
worker, JobSet v0.12.0 with its ``RestartJob`` gate on running them there). The island
processes are started from what the **workers** hold — each worker's child Job and headless
Service, as its JobSet controller created them — and the lighthouse from the manager's
Deployment (``launch_local.kubelet``: the pods' environment and command lines, Services on
loopback; the trainer is the CPU stand-in, see ``test_trains``).

Then island 1's process is killed and its Job marked failed in its worker: that worker's
JobSet recreates island 1's Job alone (island 0's Job keeps its UID), island 0 trains on
with one participant (the rendered ``min_replicas`` is one island fewer), and the island
started from the recreated Job joins the quorum again.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from launch_local import torchtitan_pythonpath
from launch_local.kubelet import LocalPod, Loopback, local_pods, run_pods
from launch_local.plan import NS, REPO, plan
from shardmeter_operator.api import (
    GPUPoolSpec,
    RestartScope,
    TrainingPlanSpec,
    TrainingPlanStatus,
    WorkloadKind,
)
from shardmeter_operator.launch.workload import launch_islands
from shardmeter_operator.render.launch import launch_manifests
from shardmeter_operator.render.lighthouse import PORT as LIGHTHOUSE_PORT
from shardmeter_operator.render.lighthouse import lighthouse_name
from support.multicluster import SITES, running_multicluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.asyncio]
PLAN = "e2e"
STEPS = 2000
"""Enough that island 0 never finishes before the restarted island rejoins (the test stops
once it has; the steps are not run through)."""
JOBSETS = "jobsets.jobset.x-k8s.io"


def site_pool(site: int) -> GPUPoolSpec:
    doc = yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())["spec"]
    s = SITES[site]
    doc.update(
        site=s.name,
        wanUplink={**doc["wanUplink"], "name": f"wan-{s.name}"},
        kueue={"queueName": s.name, "cluster": s.worker},
    )
    return GPUPoolSpec.model_validate(doc)


def two_site_plan() -> tuple[TrainingPlanSpec, TrainingPlanStatus, dict[str, GPUPoolSpec]]:
    """The launch tests' 2-island plan, one island per site, trained for ``STEPS`` steps."""
    spec, status = plan(WorkloadKind.JOBSET)
    raw = spec.model_dump(by_alias=True, exclude_none=True)
    per_step = raw["training"]["globalBatchTokens"]
    raw["training"]["totalTokens"] = STEPS * per_step
    raw["pools"] = [{"name": "east"}, {"name": "west"}]
    raw["restart"] = "Island"
    raw["maxRestarts"] = 2
    raw["faultTolerance"] = {
        **raw["faultTolerance"],
        "joinTimeoutMs": 1000,  # a restarted island is not waited for long
        "heartbeatTimeoutMs": 1000,
        "collectiveTimeoutS": 5,  # island 0 stalls 5 s (torchft's default: 60) when 1 dies
        "lighthouseAddress": f"{lighthouse_name(PLAN)}.{NS}.svc:{LIGHTHOUSE_PORT}",
    }
    spec = TrainingPlanSpec.model_validate(raw)
    islands = [
        isl.model_copy(update={"pool": pool})
        for isl, pool in zip(status.islands, ["east", "west"], strict=True)
    ]
    pools = {"east": site_pool(0), "west": site_pool(1)}
    islands = launch_islands(PLAN, islands, WorkloadKind.JOBSET, pools, RestartScope.ISLAND)
    return spec, status.model_copy(update={"islands": islands}), pools


def rendered() -> tuple[list[dict[str, Any]], TrainingPlanStatus]:
    spec, status, pools = two_site_plan()
    address = f"http://{spec.fault_tolerance.lighthouse_address}"
    manifests = launch_manifests(
        PLAN,
        NS,
        "uid-e2e",
        spec,
        status,
        pools,
        plan_json="{}",
        revision="r1",
        bench_image="bench:test",
        workload=WorkloadKind.JOBSET,
        restart=RestartScope.ISLAND,
        site_queues={s.name: s.name for s in SITES},
        lighthouse=address,
    )
    return manifests, status


def steps_of(text: str) -> list[tuple[int, int]]:
    """(step, participants) of each ``step_end`` line."""
    out = []
    for line in text.splitlines():
        if line.startswith("[island] ") and "event=step_end" in line:
            kv = dict(p.split("=", 1) for p in line.split()[1:])
            out.append((int(kv["step"]), int(kv["participants"])))
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants, as a node dying takes the pod's processes."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def wait_until(fn: Any, timeout_s: float, what: Any) -> Any:
    """Poll ``fn`` until truthy; ``what()`` says what did not happen (the logs by then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(what())
        time.sleep(0.1)


async def test_islands_of_two_clusters_train_and_one_restarts_alone(tmp_path: Path) -> None:
    manifests, status = rendered()
    assert [m["kind"] for m in manifests] == ["Deployment", "Service", "JobSet", "JobSet"]
    lighthouse_objs = manifests[:2]
    async with running_multicluster(
        SITES, tmp_path=tmp_path / "clusters", jobset_feature_gates={"RestartJob": True}
    ) as multi:
        for js in manifests[2:]:
            await multi.manager.kubectl("create", "-f", "-", input=yaml.safe_dump(js))
        workers = [multi.worker_of(s.name) for s in SITES]
        names = [i.name for i in status.islands]  # island k's child Job, in its site's worker
        for worker, name in zip(workers, names, strict=True):
            await worker.wait_for(lambda w=worker, n=name: w.get("jobs", NS, n), timeout=20)
        assert workers[0].get("jobs", NS, names[1]) is None  # each island in its own cluster
        assert workers[1].get("jobs", NS, names[0]) is None

        def pods_from_workers(net: Loopback | None = None) -> tuple[list[LocalPod], Loopback]:
            objs = copy.deepcopy(lighthouse_objs)
            for worker in workers:
                objs += worker.list("jobs", NS) + worker.list("services", NS)
            return local_pods(objs, NS, net)

        pods, net = pods_from_workers()
        lighthouse = next(p for p in pods if p.name.startswith(lighthouse_name(PLAN)))
        islands = sorted((p for p in pods if p is not lighthouse), key=lambda p: p.name)
        assert [p.name for p in islands] == [f"{n}-0" for n in names]
        bin_dir = Path(sys.executable).parent
        base_env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "PYTHONPATH": torchtitan_pythonpath(),
            "OMP_NUM_THREADS": "1",
            "LANG": "C.UTF-8",
        }
        with (
            run_pods([lighthouse], tmp_path, base_env) as (lh,),
            run_pods(islands, tmp_path, base_env) as (first, second),
        ):
            # both train together, then island 1 dies
            wait_until(
                lambda: any(p == 2 for _, p in steps_of(second.text())),
                120,
                lambda: f"the islands never trained together:\n{second.text()[-3000:]}",
            )
            killed_at = len(steps_of(first.text()))
            kill_tree(second.process.pid)  # torchrun and its trainer (its own session)
            second.process.wait()
            failed_uid = workers[1].get("jobs", NS, names[1])["metadata"]["uid"]
            kept_uid = workers[0].get("jobs", NS, names[0])["metadata"]["uid"]
            workers[1].set_job_failed(NS, names[1])
            await workers[1].wait_for(
                lambda: (
                    (workers[1].get("jobs", NS, names[1]) or {}).get("metadata", {}).get("uid")
                    not in (None, failed_uid)
                ),
                timeout=20,
            )
            assert workers[0].get("jobs", NS, names[0])["metadata"]["uid"] == kept_uid
            js = workers[1].get(JOBSETS, NS, names[1].rsplit("-i", 1)[0])
            restarts = {
                r["name"]: r.get("jobRestarts")
                for r in js["status"].get("replicatedJobsStatus") or []
            }
            assert restarts, js["status"]
            # island 0 trains on alone meanwhile
            wait_until(
                lambda: any(p == 1 for s, p in steps_of(first.text()) if s > killed_at),
                60,
                lambda: f"island 0 did not train on alone:\n{first.text()[-3000:]}",
            )
            # the recreated Job's pod: the same island, joining the quorum again
            again, _ = pods_from_workers(net)  # the same Services
            (restarted,) = [p for p in again if p.name == f"{names[1]}-0"]
            restarted.name += "-restarted"
            with run_pods([restarted], tmp_path, base_env) as (third,):
                wait_until(
                    lambda: (
                        "Quorum! Quorum {" in lh.text()
                        and re.search(r"torchtitan_ft_1:", third.text() + lh.text())
                    ),
                    60,
                    lambda: "the restarted island never reached the lighthouse",
                )
                wait_until(
                    lambda: any(p == 2 for s, p in steps_of(first.text()) if s > killed_at + 1),
                    90,
                    lambda: (
                        f"the restarted island never rejoined:\n{third.text()[-3000:]}\n"
                        f"{first.text()[-2000:]}"
                    ),
                )
                assert first.process.poll() in (None, 0), first.text()[-3000:]
        quorums = [ln for ln in lh.text().splitlines() if "Quorum! Quorum {" in ln]
        assert any(all(f"torchtitan_ft_{i}:" in q for i in range(2)) for q in quorums)
