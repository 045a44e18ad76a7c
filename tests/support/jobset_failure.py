"""The simulated JobSet controller's failure policy (JobSet v0.12.0,
``pkg/controllers/failure_policy.go``), split from :mod:`support.jobset`: what a failed child Job
of the current attempt does to the JobSet's status.

* No ``failurePolicy``: the JobSet fails (``FailedJobs``).
* Otherwise the rules are tried in order; a rule matches the earliest-failed Job whose failure
  reason is in ``onJobFailureReasons``, whose message matches one of
  ``onJobFailureMessagePatterns`` and whose replicated Job is in ``targetReplicatedJobs``
  (each: empty matches all). No rule matches: ``RestartJobSet`` on the earliest-failed Job.
* Actions: ``FailJobSet`` fails it (``FailJobSetFailurePolicyAction``); ``RestartJobSet``
  bumps ``status.restarts`` and ``restartsCountTowardsMax`` (every Job is recreated) while the
  restarts that count are below ``maxRestarts``, else fails it (``ReachedMaxRestarts``);
  ``RestartJobSetAndIgnoreMaxRestarts`` bumps ``restarts`` only; ``RestartJob`` bumps the failed
  Job's ``replicatedJobsStatus[].jobRestarts[jobIndex]`` and ``jobRestartsCountTowardsMax[…]``
  (only that Job is recreated) under the same limit; ``RestartJobAndIgnoreMaxRestarts`` bumps
  ``jobRestarts`` only.
* The limit: with the ``RestartJob`` feature gate (alpha, off by default in v0.12.0) the
  restarts that count are ``restartsCountTowardsMax`` + the sum of every
  ``jobRestartsCountTowardsMax``; without it ``restartsCountTowardsMax`` alone (and the
  ``RestartJob`` actions are refused by the webhook).

Not simulated: the ``RestartingJobSet`` condition and the Events of each action, in-place
restarts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from support.kube_emulator import Body, now_iso

JOB_INDEX_KEY = "jobset.sigs.k8s.io/job-index"
REPLICATED_JOB_NAME_KEY = "jobset.sigs.k8s.io/replicatedjob-name"
RESTART_JOB_ACTIONS = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")


def job_failure(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Job's ``Failed`` condition, if it is True."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def _failed_at(job: Mapping[str, Any]) -> str:
    return str((job_failure(job) or {}).get("lastTransitionTime") or "")


def first_failed(jobs: list[Body]) -> Body:
    return min(jobs, key=_failed_at)


def rule_applies(rule: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    """``ruleIsApplicable``: reason, message pattern (RE2 ≈ Python's ``re``) and target."""
    c = job_failure(job) or {}
    reasons = rule.get("onJobFailureReasons") or []
    patterns = rule.get("onJobFailureMessagePatterns") or []
    targets = rule.get("targetReplicatedJobs") or []
    if reasons and c.get("reason") not in reasons:
        return False
    if patterns and not any(re.search(p, str(c.get("message") or "")) for p in patterns):
        return False
    rjob = (job["metadata"].get("labels") or {}).get(REPLICATED_JOB_NAME_KEY)
    return bool(rjob) and (not targets or rjob in targets)


def matching_rule(rules: list[Body], failed: list[Body]) -> tuple[Body | None, Body]:
    """``findFirstFailedPolicyRuleAndJob``: the first rule matching a failed Job, with the
    earliest-failed Job it matches; else no rule and the earliest-failed Job."""
    for rule in rules:
        matched = [j for j in failed if rule_applies(rule, j)]
        if matched:
            return rule, first_failed(matched)
    return None, first_failed(failed)


def job_restarts(
    js: Mapping[str, Any], status: Mapping[str, Any], rjob: str, key: str
) -> list[int]:
    """``getJobRestarts``/``getJobRestartsCountTowardsMax``: the per-index counters of a
    replicated Job (``key`` = ``jobRestarts`` or ``jobRestartsCountTowardsMax``), zeros when
    unset."""
    replicas = next(
        (int(r.get("replicas", 1)) for r in js["spec"]["replicatedJobs"] if r["name"] == rjob), 0
    )
    for rjs in status.get("replicatedJobsStatus") or []:
        if rjs["name"] == rjob and rjs.get(key):
            return [int(n) for n in rjs[key]]
    return [0] * replicas


def restarts_counting_towards_max(status: Mapping[str, Any], restart_job_gate: bool) -> int:
    """``totalRestartsCountTowardsMax`` with the gate, ``restartsCountTowardsMax`` without."""
    total = int(status.get("restartsCountTowardsMax") or 0)
    if restart_job_gate:
        total += sum(
            int(n)
            for rjs in status.get("replicatedJobsStatus") or []
            for n in rjs.get("jobRestartsCountTowardsMax") or []
        )
    return total


def set_failed(status: Body, reason: str, message: str) -> None:
    """The JobSet's ``Failed`` condition and terminal state."""
    for c in status.setdefault("conditions", []):
        if c["type"] == "Failed":
            if c["status"] != "True":
                c["lastTransitionTime"] = now_iso()
            c.update(status="True", reason=reason, message=message)
            break
    else:
        status["conditions"].append(
            {
                "type": "Failed",
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": now_iso(),
            }
        )
    status["terminalState"] = "Failed"


def _bump_job(js: Body, status: Body, job: Body, count_towards_max: bool) -> None:
    """``failurePolicyRecreateJob``: the failed Job's individual restart counters + 1."""
    labels = job["metadata"]["labels"]
    rjob, index = labels[REPLICATED_JOB_NAME_KEY], int(labels[JOB_INDEX_KEY])
    keys = ["jobRestarts", *(["jobRestartsCountTowardsMax"] if count_towards_max else [])]
    for rjs in status.get("replicatedJobsStatus") or []:
        if rjs["name"] != rjob:
            continue
        for key in keys:
            counters = job_restarts(js, status, rjob, key)
            counters[index] += 1
            rjs[key] = counters


def execute(js: Body, status: Body, failed: list[Body], *, restart_job_gate: bool) -> None:
    """``executeFailurePolicy`` for the failed Jobs of the current attempt (``status`` is the
    JobSet's new status, its ``replicatedJobsStatus`` already counted)."""
    policy = js["spec"].get("failurePolicy")
    if policy is None:
        name = first_failed(failed)["metadata"]["name"]
        set_failed(
            status,
            "FailedJobs",
            f"jobset failed due to one or more job failures (first failed job: {name})",
        )
        return
    rule, job = matching_rule(policy.get("rules") or [], failed)
    action = rule["action"] if rule else "RestartJobSet"
    name = job["metadata"]["name"]
    at_limit = restarts_counting_towards_max(status, restart_job_gate) >= int(
        policy.get("maxRestarts") or 0
    )
    if action in RESTART_JOB_ACTIONS and not restart_job_gate:
        raise RuntimeError(
            f"{action} failure policy action cannot be used when the feature gate RestartJob "
            "is disabled"
        )
    if action == "FailJobSet":
        set_failed(
            status,
            "FailJobSetFailurePolicyAction",
            f"applying FailJobSet failure policy action (first failed job: {name})",
        )
    elif action in ("RestartJobSet", "RestartJob") and at_limit:
        set_failed(
            status,
            "ReachedMaxRestarts",
            f"jobset failed due to reaching max number of restarts (first failed job: {name})",
        )
    elif action == "RestartJobSet":
        status["restarts"] = int(status.get("restarts") or 0) + 1
        status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1
    elif action == "RestartJobSetAndIgnoreMaxRestarts":
        status["restarts"] = int(status.get("restarts") or 0) + 1
    else:
        _bump_job(js, status, job, count_towards_max=action == "RestartJob")
