"""The operator under faults: a storm of API faults through a fault-injecting proxy (nothing
lost, nothing duplicated, converged within seconds of the storm's end), optional CRDs that go
away and come back, and a clean stop."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from operator_support import apply, condition, manifest, operator_cluster, status_of, variant
from support import storm
from support.jobset import CRD_FILE, JobSetController
from support.operator_process import operator_process

POOL = manifest("gpupool-cluster-a.yaml")
PLAN = manifest("trainingplan.yaml")
NAME, NS = "llama-8b-case-study", "default"
ONE_POOL = {"launch": True, "pools": [{"name": "cluster-a"}]}


def phase(value: str) -> Any:
    return lambda s: s.get("phase") == value


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(420)
def test_a_fault_storm_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """8 plans (plan-only, launched as Jobs, invalid; one deleted mid-storm) and 3 pools
    under ~20 s of faults: afterwards every status, child, Event and gauge is what a run
    without faults gives, and the operator never went down. The one-minute storm with 20
    plans and its convergence figures: ``benchmarks/bench_faults.py``."""
    want = storm.reference(tmp_path / "reference", 8)
    result = storm.run(tmp_path / "storm", want, plans_count=8, storm_s=20.0, seed=7)
    assert result.alive, result.log_tail
    assert result.converged_after_s is not None, "\n".join(result.problems) + result.log_tail
    assert sum(result.faults.values()) >= 20, result.faults  # the storm did happen
    # the bound only keeps a failing run short; the goal (≤ 15 s) is measured by the benchmark
    assert result.converged_after_s < 60


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_jobset_crd_removed_and_restored_at_run_time(tmp_path: Path) -> None:
    """Uninstalling JobSet takes its JobSets (and their Jobs) with it, not the operator: a
    plan that needs JobSet is Valid=False naming spec.workload, and launches once the CRD is
    back — whose JobSet events the operator follows again."""
    async with operator_cluster(tmp_path, jobset=True) as cluster:
        await apply(cluster, POOL, variant(PLAN, **ONE_POOL, workload="JobSet"))
        await status_of(cluster, "trainingplans", NS, NAME, phase("Launched"))
        await cluster.kubectl("delete", "crd", "jobsets.jobset.x-k8s.io")
        second = variant(PLAN, **ONE_POOL, workload="JobSet")
        second["metadata"]["name"] = "after"
        await apply(cluster, second)
        status = await status_of(cluster, "trainingplans", NS, "after", phase("Invalid"))
        valid = condition(status, "Valid")
        assert valid["reason"] == "WorkloadUnavailable", valid
        assert valid["message"].startswith("spec.workload:"), valid
        time.sleep(0)  # the operator kept running through the removal (checked at exit too)

        cluster.emulator.load_crds(CRD_FILE)  # JobSet reinstalled
        status = await status_of(cluster, "trainingplans", NS, "after", phase("Launched"))
        assert condition(status, "Valid")["status"] == "True"
        controller = JobSetController(cluster.emulator)
        controller.reconcile()  # the JobSet controller makes the child Jobs
        jobs = [
            j["metadata"]["name"]
            for j in cluster.list("jobs", NS, "jobset.sigs.k8s.io/jobset-name=after")
        ]
        assert len(jobs) == status["islandCount"]
        cluster.set_job_running(NS, jobs[0])  # a JobSet child's change reaches the plan
        await status_of(
            cluster,
            "trainingplans",
            NS,
            "after",
            lambda s: s["islands"][0]["state"] == "running",
        )


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_sigterm_stops_cleanly(tmp_path: Path) -> None:
    """SIGTERM while plans are being reconciled: the process exits 0 within seconds, logs that
    it stopped, starts no reconcile after kopf's cleanup, and every log line is JSON."""
    with operator_process(tmp_path) as op:
        op.kubectl("apply", "-f", str(storm.EX / "gpupool-cluster-a.yaml"))
        docs = storm.plans(6)
        op.kubectl("apply", "-f", "-", input="---\n".join(yaml.safe_dump(d) for d in docs))
        time.sleep(1.5)
        started = time.monotonic()
        op.operator.send_signal(signal.SIGTERM)
        code = op.operator.wait(20)
        took = time.monotonic() - started
    lines = [json.loads(line) for line in op.log.read_text().splitlines() if line.strip()]
    assert code == 0 and took < 15, (code, took)
    events = [line.get("event", "") for line in lines]
    assert "operator stopped" in events
    text = op.log.read_text()
    assert "sys.meta_path is None" not in text and "Traceback" not in text
    cleanup = next(i for i, e in enumerate(events) if "cleanup' succeeded" in e)
    after = events[cleanup + 1 :]
    assert not [e for e in after if e in ("reconciled", "reconcile failed")], after


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_a_restarted_operator_publishes_every_plans_gauges_and_posts_nothing_again(
    tmp_path: Path,
) -> None:
    """Gauges follow from the stored status: after a restart every plan's series are back
    (plan-only ones too, which need no reconcile), and no Event is posted a second time."""
    docs = storm.plans(5)
    names = [d["metadata"]["name"] for d in docs]
    with operator_process(tmp_path, recheck_s=2.0) as op:
        op.kubectl(
            "apply", "-f", "-", input="---\n".join(yaml.safe_dump(d) for d in storm.pools() + docs)
        )
        before: list[storm.State] = []

        def settled() -> bool:
            state = storm.read_state(op, names)
            done = bool(before) and not storm.differences(state, before[-1], names)
            before.append(state)
            return done and all(s.get("phase") for s in state.statuses.values())

        assert storm._wait(settled, 60, poll_s=1.0) is not None
        want = before[-1]
        assert all(want.series.get(n) for n in names if want.statuses[n]["phase"] != "Invalid")
        op.restart()
        after: list[storm.State] = []

        def back() -> bool:
            after.append(storm.read_state(op, names))
            return not storm.differences(after[-1], want, names)

        assert storm._wait(back, 30) is not None, storm.differences(after[-1], want, names)
        time.sleep(2.0)  # whatever the restarted operator reconciles: still nothing new
        problems = storm.differences(storm.read_state(op, names), want, names)
        assert not problems, problems
