"""A launch that trains: the manifests the operator renders for a 2-island Streaming DiLoCo
plan (2 fragments, delay 1; one node and one process per island), run on this machine — as
plain Jobs, and as a JobSet.

The lighthouse Deployment's pod runs ``torchft_lighthouse`` with its rendered arguments; each
island's pod runs its rendered ``torchrun`` command line with the pod's environment
(``launch_local.kubelet``: ``$(VAR)`` expansion, completion index, Services on loopback; a
JobSet expanded into its child Jobs and headless Service as JobSet's webhook and controller
would, so the island id, replica id and rank-0 address come from JobSet's own ``job-index``
and ``job-global-index`` annotations).
The trainer is the CPU stand-in ``launch_local.cpu_trainer`` (torchtitan's trainer cannot run
on a CPU: see its docstring), so the template is the example's with ``-m torchtitan.train``
replaced and torchtitan's fault-tolerant debug config instead of the 8B one. Everything the
islands train with comes from the rendered command lines and environment.

The assertions read the processes' own output: the lighthouse's quorum lines, torchft's
``Preparing``/``Syncing fragment`` lines, and the stand-in's ``[island]`` lines — and what
the operator's log parser observes in it (torchtitan's metric lines, printed by torchtitan's
own ``MetricsProcessor``). ``SHARDMETER_CAPTURE_OBSERVE_FIXTURES=1`` saves the islands' output
as ``tests/fixtures/observe/e2e-island-<i>.log``.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from launch_local import torchtitan_pythonpath
from launch_local.kubelet import LocalPod, local_pods, run_pods
from launch_local.plan import (
    ACCUM,
    DELAY,
    FRAGMENTS,
    ISLANDS,
    MICRO,
    NS,
    OUTER_STEPS,
    PLAN,
    REPO,
    SEQ,
    SYNC_EVERY,
    plan,
)
from shardmeter_operator.api import (
    GPUPoolSpec,
    TrainingPlanStatus,
    WorkloadKind,
)
from shardmeter_operator.observe.logparse import parse_log
from shardmeter_operator.observe.summary import IslandFacts, summarize
from shardmeter_operator.render.island import island_job_name
from shardmeter_operator.render.launch import launch_manifests
from shardmeter_operator.render.lighthouse import PORT as LIGHTHOUSE_PORT
from shardmeter_operator.render.lighthouse import lighthouse_name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
OBSERVE_FIXTURES = REPO / "tests" / "fixtures" / "observe"
"""The islands' output of one run, for the observation tests (SHARDMETER_CAPTURE_OBSERVE_FIXTURES=1
rewrites them)."""


def rendered(workload: WorkloadKind) -> tuple[list[dict[str, Any]], TrainingPlanStatus]:
    """What the operator creates for the plan, in order, launched as ``workload``."""
    spec, status = plan(workload)
    pool = yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())["spec"]
    manifests = launch_manifests(
        PLAN,
        NS,
        "uid-e2e",
        spec,
        status,
        {"cpu": GPUPoolSpec.model_validate(pool)},
        plan_json="{}",
        revision="r1",
        bench_image="bench:test",
        workload=workload,
    )
    return manifests, status


KINDS = {
    WorkloadKind.JOB: ["Deployment", "Service"] + ["Job", "Service"] * ISLANDS,
    WorkloadKind.JOBSET: ["Deployment", "Service", "JobSet"],
}


def expected_syncs() -> dict[int, dict[str, list[int]]]:
    """torchft's Streaming DiLoCo schedule (local_sgd.py), worked out by hand from the plan:
    every H/F inner steps one fragment syncs, in order 0, 1, 0, 1, …; it was prepared
    (all_reduce started) ``DELAY`` steps earlier."""
    per = SYNC_EVERY // FRAGMENTS
    steps = OUTER_STEPS * SYNC_EVERY
    out: dict[int, dict[str, list[int]]] = {
        f: {"prepare": [], "sync": []} for f in range(FRAGMENTS)
    }
    for n, step in enumerate(range(per, steps + 1, per)):
        out[n % FRAGMENTS]["sync"].append(step)
        out[n % FRAGMENTS]["prepare"].append(step - DELAY)
    return out


def island_events(text: str) -> dict[str, Any]:
    """The stand-in's ``[island]`` lines and torchft's fragment lines, in order."""
    start: dict[str, str] = {}
    micro: dict[int, list[dict[str, str]]] = {}
    ends: dict[int, dict[str, str]] = {}
    syncs: dict[int, dict[str, list[int]]] = {}
    step = 0
    for line in text.splitlines():
        if line.startswith("[island] "):
            kv = dict(p.split("=", 1) for p in line.split()[1:])
            if kv["event"] == "start":
                start = kv
            elif kv["event"] == "step_begin":
                step = int(kv["step"])
            elif kv["event"] == "micro_batch":
                micro.setdefault(step, []).append(kv)
            elif kv["event"] == "step_end":
                ends[step] = kv
            continue
        m = re.search(r"(Preparing|Syncing) fragment=(\d+) step=\d+", line)
        if m:
            kind = "prepare" if m.group(1) == "Preparing" else "sync"
            syncs.setdefault(int(m.group(2)), {"prepare": [], "sync": []})[kind].append(step)
    return {"start": start, "micro": micro, "ends": ends, "syncs": syncs}


def wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout_s} s")
        time.sleep(0.2)


@pytest.mark.parametrize("workload", list(WorkloadKind))
def test_rendered_islands_train_with_streaming_diloco(
    tmp_path: Path, workload: WorkloadKind
) -> None:
    manifests, status = rendered(workload)  # what the operator creates for this plan, in order
    assert [m["kind"] for m in manifests] == KINDS[workload]
    pods, net = local_pods(manifests, NS)
    lighthouse = next(p for p in pods if p.name.startswith(lighthouse_name(PLAN)))
    islands = [p for p in pods if p is not lighthouse]
    assert [p.name for p in islands] == [f"{i.name}-0" for i in status.islands]
    bin_dir = Path(sys.executable).parent
    base_env = {  # what the image provides; the pod's own environment is added on top
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": torchtitan_pythonpath(),  # the CPU stand-in and triton
        "OMP_NUM_THREADS": "1",
        "LANG": "C.UTF-8",
    }
    started = time.monotonic()
    with run_pods([lighthouse], tmp_path, base_env) as (lh,):
        port = net.ports[(lighthouse_name(PLAN), LIGHTHOUSE_PORT)]
        wait_http(f"http://127.0.0.1:{port}/status", 30)
        with run_pods(islands, tmp_path, base_env) as running:
            for r in running:
                try:
                    r.process.wait(timeout=180)
                except Exception:
                    pytest.fail(f"{r.pod.name} did not finish:\n{r.text()[-3000:]}")
            for r in running:
                assert r.process.returncode == 0, f"{r.pod.name} failed:\n{r.text()[-4000:]}"
        lighthouse_log = lh.text()
    wall_s = time.monotonic() - started
    print(f"e2e wall time ({workload.value}) {wall_s:.1f} s")
    capture = os.environ.get("SHARDMETER_CAPTURE_OBSERVE_FIXTURES") == "1"
    if capture and workload is WorkloadKind.JOB:  # refresh the fixtures
        for i, r in enumerate(running):
            (OBSERVE_FIXTURES / f"e2e-island-{i}.log").write_text(r.text())

    # both replicas joined one quorum: the lighthouse's own line lists both
    quorums = [line for line in lighthouse_log.splitlines() if "Quorum! Quorum {" in line]
    assert quorums, lighthouse_log[-3000:]
    assert any(
        all(f'replica_id: "torchtitan_ft_{i}:' in q for i in range(ISLANDS)) for q in quorums
    ), quorums[0]
    assert "min_replicas 2" in lighthouse_log  # the rendered --min_replicas

    steps = OUTER_STEPS * SYNC_EVERY
    expected = expected_syncs()
    for i, r in enumerate(running):
        ev = island_events(r.text())
        s = ev["start"]
        # what the island parsed (torchtitan's ConfigManager) and derived (torchtitan's formula)
        assert (s["replica_id"], s["group_size"]) == (str(i), str(ISLANDS)), s
        assert s["local_batch_size"] == str(MICRO) and s["gradient_accumulation_steps"] == str(
            ACCUM
        ), s
        assert (s["seq_len"], s["steps"]) == (str(SEQ), str(steps)), s
        assert (s["sync_steps"], s["num_fragments"], s["fragment_sync_delay"]) == (
            str(SYNC_EVERY),
            str(FRAGMENTS),
            str(DELAY),
        ), s
        assert s["process_group"] == "gloo" and s["lighthouse"] == f"http://127.0.0.1:{port}"
        # the planned micro-batch × accumulation, every step
        assert sorted(ev["ends"]) == list(range(1, steps + 1))
        for step in range(1, steps + 1):
            micro = ev["micro"][step]
            assert [m["sequences"] for m in micro] == [str(MICRO)] * ACCUM, (step, micro)
            assert ev["ends"][step]["tokens"] == str(MICRO * ACCUM * SEQ)
        # each fragment prepared and synchronised at the planned inner steps
        assert ev["syncs"] == expected, (r.pod.name, ev["syncs"])
        assert ev["ends"][steps]["manager_step"] == str(steps // (SYNC_EVERY // FRAGMENTS))
        assert {e["participants"] for n, e in ev["ends"].items() if n >= 2} == {str(ISLANDS)}
        assert r.text().count("should_commit=True") == steps // (SYNC_EVERY // FRAGMENTS)
        # it learns: from above ln(vocab) (uniform guessing) to well below it
        first, last = float(ev["ends"][1]["loss"]), float(ev["ends"][steps]["loss"])
        assert last < first and last < math.log(int(s["vocab_size"])) - 1, (first, last)
        # what the operator observes in this log: torchtitan's metric lines (one per step at
        # log_freq 1) agree with the trainer's own timer, torchft's syncs with the schedule
        observation = summarize(
            parse_log(r.text()),
            IslandFacts(MICRO * ACCUM * SEQ, 1, FRAGMENTS, 0.05),
            "2026-12-01T00:00:00Z",
        )
        timed = [float(ev["ends"][n]["step_s"]) for n in range(2, steps + 1)]
        assert observation.reason == "Observed", observation.message
        assert (observation.first_step, observation.last_step) == (1, steps)
        # torchtitan's timer runs from one metric line to the next, so it also covers the
        # trainer's printing between steps: never less than the steps' own time (up to the
        # printed tokens/s rounding), and not much more
        mean_timed = sum(timed) / len(timed)
        assert mean_timed * (1 - 5e-3) <= observation.effective_step_seconds <= mean_timed * 1.1
        assert observation.fragment_syncs == steps // (SYNC_EVERY // FRAGMENTS)
    # nothing left running
    for r in [lh, *running]:
        assert r.process.poll() is not None
        with pytest.raises(ProcessLookupError):
            os.killpg(r.process.pid, 0)


def test_local_pods_see_the_rendered_environment() -> None:
    """The harness changes addresses only: every other value is the manifest's."""
    manifests, _ = rendered(WorkloadKind.JOB)
    pods, net = local_pods(manifests, NS)
    by_name: dict[str, LocalPod] = {p.name: p for p in pods}
    island0 = by_name[f"{island_job_name(PLAN, 0)}-0"]
    job = next(m for m in manifests if m["kind"] == "Job")
    rendered_env = {
        e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    for key in ("SHARDMETER_TORCHTITAN_ARGS", "TORCHFT_QUORUM_TIMEOUT_SEC", "NNODES", "JOB_ID"):
        assert island0.env[key] == rendered_env[key]
    assert island0.env["NODE_RANK"] == "0" and island0.env["MASTER_ADDR"] == "127.0.0.1"
    assert island0.env["MASTER_PORT"] == str(net.ports[(island_job_name(PLAN, 0), 29500)])
    assert rendered_env["TORCHFT_LIGHTHOUSE"].startswith(
        f"http://{lighthouse_name(PLAN)}.{NS}.svc:"
    )
    assert island0.argv[:2] == ["torchrun", "--nnodes=1"]
    assert island0.argv[-1] == "activation-checkpoint:none"
    ports = {net.ports[(island_job_name(PLAN, i), 29500)] for i in range(ISLANDS)}
    assert len(ports) == ISLANDS  # each island its own rendezvous port on loopback


def test_jobset_pods_get_their_island_from_jobsets_annotations() -> None:
    """One replicated Job for both islands: each pod's island id, replica id and rank-0
    address come from the annotations JobSet puts on it, expanded by the kubelet."""
    manifests, status = rendered(WorkloadKind.JOBSET)
    (js,) = [m for m in manifests if m["kind"] == "JobSet"]
    assert [(r["name"], r["replicas"]) for r in js["spec"]["replicatedJobs"]] == [("g0", ISLANDS)]
    pods, net = local_pods(manifests, NS)
    by_name = {p.name: p for p in pods}
    for i, isl in enumerate(status.islands):
        pod = by_name[f"{isl.name}-0"]
        assert isl.name == f"{PLAN}-g0-{i}"  # the child Job JobSet names <jobset>-g0-<index>
        assert pod.env["SHARDMETER_ISLAND_ID"] == str(i) and pod.env["SHARDMETER_JOB_INDEX"] == str(
            i
        )
        assert f"--fault_tolerance.replica_id={i}" in pod.argv
        assert f"--fault_tolerance.replica_id={i}" in pod.env["SHARDMETER_TORCHTITAN_ARGS"].split()
        assert pod.env["MASTER_ADDR"] == "127.0.0.1"  # <jobset>-g0-<i>-0.<jobset>.<ns>.svc
        assert pod.env["MASTER_PORT"] == str(net.job_ports[isl.name][29500])
        assert pod.env["TORCHFT_MANAGER_PORT"] == str(net.job_ports[isl.name][29512])
    template = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in template["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == f"{PLAN}-g0-$(SHARDMETER_JOB_INDEX)-0.{PLAN}.{NS}.svc"
    # one search domain, the JobSet's headless Service: every island pod's bare hostname
    assert template["dnsConfig"]["searches"] == [f"{PLAN}.{NS}.svc.cluster.local"]
    assert "subdomain" not in template  # JobSet sets it
    assert len({net.job_ports[i.name][29500] for i in status.islands}) == ISLANDS
