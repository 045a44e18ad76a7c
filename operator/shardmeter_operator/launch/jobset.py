"""Following a launched plan's JobSet, purely: the islands' states read back from the JobSet
(its conditions, restarts and failure policy) and its child Jobs (rendered by
:mod:`~.render.jobset`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardmeter_operator.api import IslandState, IslandStatus
from shardmeter_operator.launch.rules import job_state
from shardmeter_operator.render.jobset import RESTART_ATTEMPT_KEY

Manifest = dict[str, Any]


def _true(obj: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def restarts_of(jobset: Mapping[str, Any] | None) -> int:
    """Restarts of the JobSet: of every island (``status.restarts``, RestartJobSet) plus of
    single islands (JobSet v0.12's ``replicatedJobsStatus[].jobRestarts``, RestartJob)."""
    status = (jobset or {}).get("status") or {}
    alone = sum(
        int(n or 0)
        for r in status.get("replicatedJobsStatus") or []
        for n in r.get("jobRestarts") or []
    )
    return int(status.get("restarts") or 0) + alone


AWAITING_POLICY = "; waiting for the JobSet's failure policy"
"""In a failed island Job's message while JobSet has not yet restarted or failed the islands."""


def max_restarts_of(jobset: Mapping[str, Any] | None) -> int:
    policy = ((jobset or {}).get("spec") or {}).get("failurePolicy") or {}
    return int(policy.get("maxRestarts") or 0)


def follow_jobset(
    islands: Sequence[IslandStatus],
    jobset: Mapping[str, Any] | None,
    jobs: Mapping[str, Manifest],
    rejected: Mapping[str, str],
    *,
    complete: bool,
    queued: str = "",
) -> list[IslandStatus]:
    """Each island's state from the JobSet and its current attempt's child Jobs (by name).
    ``queued``: why a suspended JobSet waits (Kueue's message), empty when not queued."""
    restarts = restarts_of(jobset)
    # JobSet-wide restarts: what the child Jobs' job-restart-attempt label counts
    whole = int(((jobset or {}).get("status") or {}).get("restarts") or 0)
    done = _true(jobset, "Completed")
    failed = _true(jobset, "Failed")
    suspended = bool(((jobset or {}).get("spec") or {}).get("suspend"))
    out = []
    for isl in islands:
        job = jobs.get(isl.name)
        attempt = ((job or {}).get("metadata") or {}).get("labels", {}).get(RESTART_ATTEMPT_KEY)
        if job is not None and attempt is not None and attempt != str(whole):
            job = None  # the previous attempt's Job, being deleted by the restart
        state: tuple[IslandState, str, str]
        if jobset is None:
            state = (
                (IslandState.FAILED, "JobSetDeleted", "the plan's JobSet was deleted")
                if complete
                else (IslandState.PENDING, "Creating", "the JobSet is being created")
            )
        elif done is not None:
            state = (IslandState.SUCCEEDED, "Completed", "")
        elif failed is not None:
            own = job_state(job) if job is not None else None
            if own is not None and own[0] is IslandState.FAILED:
                state = own
            elif isl.state is IslandState.PENDING and AWAITING_POLICY in isl.message:
                # its own Job failed it (and is gone now, with the failed JobSet's Jobs)
                state = (IslandState.FAILED, isl.reason, isl.message.split(AWAITING_POLICY)[0])
            else:
                reason = str(failed.get("reason") or "JobSetFailed")
                state = (IslandState.FAILED, reason, str(failed.get("message") or ""))
        elif suspended:
            state = (
                (IslandState.PENDING, "Queued", queued)
                if queued
                else (IslandState.PENDING, "Suspended", "the JobSet is suspended")
            )
        elif job is None:
            state = (
                (
                    IslandState.PENDING,
                    "Restarting",
                    f"JobSet restart {restarts}: Job not created yet",
                )
                if restarts
                else (IslandState.PENDING, "Creating", "the JobSet has not created the Job yet")
            )
        else:
            uid = str((job.get("metadata") or {}).get("uid") or "")
            state = job_state(job, rejected.get(uid, ""))
            if state[0] is IslandState.FAILED:
                # JobSet's failure policy answers a failed child Job: it restarts every island
                # or fails the whole JobSet. Until its status says which, the plan has not failed.
                state = (
                    IslandState.PENDING,
                    state[1],
                    f"{state[2]}{AWAITING_POLICY} "
                    f"({restarts} of {max_restarts_of(jobset)} restarts used)",
                )
        out.append(
            isl.model_copy(update={"state": state[0], "reason": state[1], "message": state[2]})
        )
    return out
