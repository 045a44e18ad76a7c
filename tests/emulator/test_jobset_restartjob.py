"""The simulated JobSet's v0.12.0 failure policy and ``managedBy`` (``support/jobset.py``,
``support/jobset_failure.py``): ``RestartJob`` recreates only the failed child Job and counts it
in ``replicatedJobsStatus[].jobRestarts``/``jobRestartsCountTowardsMax``, which count towards
``maxRestarts`` with the global restarts; ``RestartJobAndIgnoreMaxRestarts`` does not count;
rules are matched by reason in order; without the (alpha, off by default) ``RestartJob`` gate the
webhook refuses those actions; ``RestartJobSet`` still recreates every Job; a JobSet managed by
another controller is left alone, and ``managedBy`` is checked and immutable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kmock
import pytest

from support.jobset import (
    JOB_INDEX_KEY,
    JOB_RESTART_ATTEMPT_KEY,
    JOBSETS,
    RESTART_ATTEMPT_KEY,
    JobSetController,
)
from support.kube_emulator import JOBS, KubeEmulator

NS = "default"
GATE = {"RestartJob": True}


@pytest.fixture
def emu() -> Iterator[KubeEmulator]:
    emulator = KubeEmulator()  # used synchronously: no server, no event loop needed
    yield emulator
    assert emulator.warnings == []


def jobset(
    rules: list[dict[str, Any]] | None = None, max_restarts: int = 2, **spec: Any
) -> dict[str, Any]:
    pod = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}
    policy: dict[str, Any] = {"maxRestarts": max_restarts, "restartStrategy": "BlockingRecreate"}
    if rules is not None:
        policy["rules"] = rules
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "train", "namespace": NS},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "g0",
                    "replicas": 3,
                    "template": {"spec": {"backoffLimit": 0, "template": {"spec": pod}}},
                }
            ],
            "failurePolicy": policy,
            **spec,
        },
    }


def jobs(emu: KubeEmulator) -> dict[int, dict[str, Any]]:
    """The child Jobs by job index."""
    return {int(j["metadata"]["labels"][JOB_INDEX_KEY]): j for j in emu.select(JOBS, NS)}


def status(emu: KubeEmulator) -> dict[str, Any]:
    return emu.read(JOBSETS, NS, "train").get("status") or {}


def fail(emu: KubeEmulator, index: int, reason: str = "BackoffLimitExceeded") -> None:
    emu.set_job_failed(NS, jobs(emu)[index]["metadata"]["name"], reason=reason, message=reason)


RESTART_JOB = [{"name": "alone", "action": "RestartJob"}]


def test_restart_job_recreates_only_the_failed_job(emu: KubeEmulator) -> None:
    ctl = JobSetController.install(emu, GATE)
    emu.create(JOBSETS, NS, jobset(RESTART_JOB, max_restarts=2))
    ctl.reconcile()
    before = {i: j["metadata"]["uid"] for i, j in jobs(emu).items()}
    assert {j["metadata"]["labels"][JOB_RESTART_ATTEMPT_KEY] for j in jobs(emu).values()} == {"0"}

    fail(emu, 1)
    ctl.reconcile()  # the failure policy: counters bumped for index 1 only
    (rjs,) = status(emu)["replicatedJobsStatus"]
    assert (rjs["jobRestarts"], rjs["jobRestartsCountTowardsMax"]) == ([0, 1, 0], [0, 1, 0])
    assert status(emu)["restarts"] == 0 and "restartsCountTowardsMax" not in status(emu)
    ctl.reconcile()  # the failed Job is of an earlier individual attempt: recreated
    after = jobs(emu)
    assert {i: j["metadata"]["uid"] for i, j in after.items() if i != 1} == {
        i: u for i, u in before.items() if i != 1
    }
    assert after[1]["metadata"]["uid"] != before[1]
    assert after[1]["metadata"]["labels"][JOB_RESTART_ATTEMPT_KEY] == "1"
    assert after[1]["metadata"]["labels"][RESTART_ATTEMPT_KEY] == "0"  # no global restart
    assert "conditions" not in (after[1].get("status") or {})

    # a second individual restart reaches maxRestarts (2): the next failure fails the JobSet
    fail(emu, 1)
    ctl.reconcile()
    ctl.reconcile()
    assert status(emu)["replicatedJobsStatus"][0]["jobRestarts"] == [0, 2, 0]
    fail(emu, 0)
    ctl.reconcile()
    (failed,) = [c for c in status(emu)["conditions"] if c["type"] == "Failed"]
    assert (failed["reason"], failed["message"]) == (
        "ReachedMaxRestarts",
        "jobset failed due to reaching max number of restarts (first failed job: train-g0-0)",
    )
    assert status(emu)["terminalState"] == "Failed"


def test_ignore_max_restarts_does_not_count_and_rules_match_in_order(emu: KubeEmulator) -> None:
    ctl = JobSetController.install(emu, GATE)
    rules = [
        {"name": "deadline", "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]},
        {"name": "alone", "action": "RestartJobAndIgnoreMaxRestarts"},
    ]
    emu.create(JOBSETS, NS, jobset(rules, max_restarts=0))
    ctl.reconcile()
    fail(emu, 2)
    ctl.reconcile()
    (rjs,) = status(emu)["replicatedJobsStatus"]
    assert rjs["jobRestarts"] == [0, 0, 1] and "jobRestartsCountTowardsMax" not in rjs
    ctl.reconcile()
    assert jobs(emu)[2]["metadata"]["labels"][JOB_RESTART_ATTEMPT_KEY] == "1"
    fail(emu, 0, reason="DeadlineExceeded")  # the first rule matches
    ctl.reconcile()
    (failed,) = [c for c in status(emu)["conditions"] if c["type"] == "Failed"]
    assert failed["reason"] == "FailJobSetFailurePolicyAction"


def test_individual_restarts_count_towards_max_for_restart_jobset(emu: KubeEmulator) -> None:
    ctl = JobSetController.install(emu, GATE)
    rules = [{"name": "alone", "action": "RestartJob", "onJobFailureReasons": ["PodFailurePolicy"]}]
    emu.create(JOBSETS, NS, jobset(rules, max_restarts=1))
    ctl.reconcile()
    fail(emu, 0, reason="PodFailurePolicy")
    ctl.reconcile()
    ctl.reconcile()
    fail(emu, 1)  # no rule matches: RestartJobSet, but 1 restart already counts
    ctl.reconcile()
    assert status(emu)["terminalState"] == "Failed" and status(emu)["restarts"] == 0


def test_without_the_gate_restart_job_is_refused(emu: KubeEmulator) -> None:
    JobSetController.install(emu)  # v0.12.0's default: RestartJob off
    with pytest.raises(kmock.KubernetesError) as refused:
        emu.create(JOBSETS, NS, jobset(RESTART_JOB))
    assert refused.value.status == 422
    assert refused.value.message == (
        'JobSet.jobset.x-k8s.io "train" is invalid: RestartJob and RestartJobAndIgnoreMaxRestarts '
        "failure policy actions are not allowed when RestartJob feature gate is disabled"
    )
    with pytest.raises(ValueError, match="unknown JobSet feature gates"):
        JobSetController(emu, {"RestartJobs": True})


def test_restart_jobset_still_recreates_every_job(emu: KubeEmulator) -> None:
    ctl = JobSetController.install(emu, GATE)
    emu.create(JOBSETS, NS, jobset(max_restarts=1))
    ctl.reconcile()
    before = {j["metadata"]["uid"] for j in jobs(emu).values()}
    fail(emu, 1)
    ctl.reconcile()
    assert (status(emu)["restarts"], status(emu)["restartsCountTowardsMax"]) == (1, 1)
    ctl.reconcile()  # BlockingRecreate: the previous attempt deleted, then all recreated
    after = jobs(emu)
    assert len(after) == 3 and not before & {j["metadata"]["uid"] for j in after.values()}
    assert {j["metadata"]["labels"][RESTART_ATTEMPT_KEY] for j in after.values()} == {"1"}


def test_a_jobset_managed_by_another_controller_is_left_alone(emu: KubeEmulator) -> None:
    ctl = JobSetController.install(emu)
    emu.create(JOBSETS, NS, jobset(managedBy="kueue.x-k8s.io/multikueue"))
    ctl.reconcile()
    assert emu.select(JOBS, NS) == [] and emu.select("services", NS) == []
    assert "status" not in emu.read(JOBSETS, NS, "train")
    with pytest.raises(kmock.KubernetesError) as refused:
        emu.patch(JOBSETS, NS, "train", {"spec": {"managedBy": "example.com/other"}})
    assert "spec.managedBy: Invalid value: field is immutable" in str(refused.value.message)
    emu.delete(JOBSETS, NS, "train")

    emu.create(JOBSETS, NS, jobset(managedBy="jobset.sigs.k8s.io/jobset-controller"))
    ctl.reconcile()  # JobSet's own name: reconciled
    assert len(emu.select(JOBS, NS)) == 3
    emu.delete(JOBSETS, NS, "train")
    for bad, why in [
        ("multikueue", 'must be a domain-prefixed path (such as "acme.io/foo")'),
        ("Example.com/x", "a lowercase RFC 1123 subdomain"),
        ("example.com/" + "x" * 60, "may not be more than 63 bytes"),
    ]:
        with pytest.raises(kmock.KubernetesError) as refused:
            emu.create(JOBSETS, NS, jobset(managedBy=bad))
        assert "spec.managedBy" in str(refused.value.message)
        assert why in str(refused.value.message)
