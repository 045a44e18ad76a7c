"""The launch state machine of a TrainingPlan, as pure functions (the reconciler in
:mod:`shardmeter_operator.trainingplan.reconcile` acts on them).

::

    Pending ─┬─ spec or pool invalid ─────────► Invalid      (Valid=False; fix the spec)
             ├─ no deployment fits ───────────► Infeasible   (Planned=False)
             └─ plan found ──► Planned ──(spec.launch)──► Launched ──► Running ──► Succeeded
                  ▲  re-planned on spec and                   │           │
                  │  coefficient changes                      └───────────┴──► Failed
                  │
                  └── spec.relaunch bumped: old children deleted, then planned and launched anew

Rules (what a platform team can rely on):

1. **Decide, record, then create.** A launch first writes its decision — islands, Streaming
   DiLoCo settings and a *revision* (hash of the plan's UID, ``spec.relaunch``, islands,
   settings and template) — into ``status.launch`` and ``status.islands``; only then are the
   children created, each labelled ``shardmeter.io/plan-revision: <revision>`` and
   ``shardmeter.io/trainingplan-uid``. A crash in between resumes the recorded decision.
2. **Frozen once launched.** Once ``status.launch`` is set, or any child with the plan's UID
   label exists, the islands and settings never change: spec edits set
   ``SpecChangedAfterLaunch=True`` and post an Event, and are not acted on; new coefficients
   only re-evaluate the predictions (``OuterStepBlocking`` then recommends settings).
   Running training is never touched.
3. **Adopt only your own revision.** An existing object with a child's name is adopted only
   if it carries this plan's UID and the current revision; a previous revision's child is
   waited for (it is being deleted by a relaunch); anything else is a ``NameConflict``.
4. **Relaunch on request.** Changing ``spec.relaunch`` plans the current spec, records the
   new decision, deletes the previous revision's children (Foreground), waits until they are
   gone and creates the new ones.
5. **Follow the children.** Each island's Job gives its state: ``succeeded`` (Complete),
   ``failed`` (Failed, with the Job's reason), ``running`` (all pods ready), or ``pending``
   (with the reason: pods rejected — quota, PodSecurity — from the Job controller's
   ``FailedCreate`` events, suspended, or waiting for pods). A child deleted after a complete
   launch is ``failed``/``JobDeleted`` and is not re-created. The plan is ``Succeeded`` when
   every island succeeded, ``Failed`` when any failed, ``Running`` when every island runs (or
   has finished), else ``Launched``. Every island and phase transition posts an Event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardmeter_operator.api import (
    ISLAND_SHAPE,
    DiLoCoSettings,
    IslandState,
    IslandStatus,
    TrainingPlanPhase,
    TrainingPlanSpec,
    TrainingPlanStatus,
)
from shardmeter_operator.render.revisions import revision

Manifest = dict[str, Any]


def decision_revision(
    uid: str,
    relaunch: int,
    islands: Sequence[IslandStatus],
    settings: DiLoCoSettings | None,
    template: Mapping[str, Any],
) -> str:
    """The revision children of this launch decision are labelled with."""
    shape = [i.model_dump(include=ISLAND_SHAPE) for i in islands]
    return revision(uid, relaunch, shape, settings.model_dump() if settings else None, template)


def _condition(job: Manifest, type_: str) -> Mapping[str, Any] | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def job_state(job: Manifest | None, rejected: str = "") -> tuple[IslandState, str, str]:
    """(state, reason, message) of one island Job; ``rejected`` is the latest FailedCreate
    message the Job controller posted for it (pods refused by quota, PodSecurity, …)."""
    if job is None:
        return IslandState.FAILED, "JobDeleted", "the island's Job was deleted"
    for done in ("Complete", "SuccessCriteriaMet"):
        if _condition(job, done) is not None:
            return IslandState.SUCCEEDED, "Completed", ""
    for failed in ("Failed", "FailureTarget"):
        c = _condition(job, failed)
        if c is not None:
            return IslandState.FAILED, str(c.get("reason") or "Failed"), str(c.get("message") or "")
    status = job.get("status") or {}
    want = int((job.get("spec") or {}).get("parallelism") or 1)
    ready = status.get("ready")
    running = int(ready if ready is not None else status.get("active") or 0)
    if _condition(job, "Suspended") is not None or (job.get("spec") or {}).get("suspend"):
        return IslandState.PENDING, "Suspended", "the Job is suspended (e.g. queued by Kueue)"
    if running >= want:
        return IslandState.RUNNING, "PodsReady", f"{running}/{want} pods ready"
    if rejected:
        return IslandState.PENDING, "PodsRejected", rejected[:1024]
    return IslandState.PENDING, "WaitingForPods", f"{running}/{want} pods ready"


def follow_islands(
    islands: Sequence[IslandStatus],
    jobs: Mapping[str, Manifest],
    rejected: Mapping[str, str],
    *,
    complete: bool,
) -> list[IslandStatus]:
    """The islands with their current state. ``jobs``: this revision's Jobs by name;
    ``rejected``: Job UID → latest FailedCreate message. Before the launch is complete a
    missing Job is still being created (pending)."""
    out = []
    for isl in islands:
        job = jobs.get(isl.name)
        if job is None and not complete:
            state, reason, message = IslandState.PENDING, "Creating", "the Job is being created"
        else:
            uid = str(((job or {}).get("metadata") or {}).get("uid") or "")
            state, reason, message = job_state(job, rejected.get(uid, ""))
        out.append(isl.model_copy(update={"state": state, "reason": reason, "message": message}))
    return out


def plan_phase(islands: Sequence[IslandStatus]) -> TrainingPlanPhase:
    states = [i.state for i in islands]
    if states and all(s is IslandState.SUCCEEDED for s in states):
        return TrainingPlanPhase.SUCCEEDED
    if any(s is IslandState.FAILED for s in states):
        return TrainingPlanPhase.FAILED
    if states and all(s in (IslandState.RUNNING, IslandState.SUCCEEDED) for s in states):
        return TrainingPlanPhase.RUNNING
    return TrainingPlanPhase.LAUNCHED


def transitions(
    before: Sequence[IslandStatus], after: Sequence[IslandStatus]
) -> list[IslandStatus]:
    """Islands whose state or reason changed (each gets an Event)."""
    old = {i.name: (i.state, i.reason) for i in before}
    return [i for i in after if old.get(i.name) != (i.state, i.reason)]


def launch_digest(spec: TrainingPlanSpec) -> str:
    """What a launch froze: the spec without ``observe`` (see ``LaunchRecord.spec_digest``)."""
    return revision(spec.model_dump(mode="json", exclude={"observe"}))


def observe_only_change(st: TrainingPlanStatus, spec: TrainingPlanSpec | None) -> bool:
    """Whether the spec differs from the launched one only in ``observe``."""
    recorded = st.launch.spec_digest if st.launch is not None else ""
    return bool(recorded) and spec is not None and launch_digest(spec) == recorded
