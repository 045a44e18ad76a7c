"""A launch through MultiKueue, purely (Kueue v0.19, ``kueue.x-k8s.io/v1beta2``; JobSet v0.12):
deciding the sites and following them.

* **Deciding** (:func:`decide_sites`, before the decision is recorded): the pools the islands
  use either all name a site queue (``spec.kueue.queueName``) or none does; with queues, the
  workload is a JobSet per site (``spec.workload: Job`` and ``spec.queueName`` are refused,
  naming the field), each site's queue leads through a MultiKueue admission check to one
  worker cluster (:func:`~.render.kueue.multikueue_problem`), and a site takes at most 8
  islands. Anything else is ``Valid=False`` naming the field; nothing is created; it is
  checked again every ``--recheck-interval``.
* **Following** (:func:`follow_sites`): each site's admission from its Workload in the manager
  (``status.sites[]``: Pending, Admitted by a worker — ``status.clusterName`` — Rejected, or
  TimedOut after ``spec.admissionTimeoutSeconds``), the plan's ``Admitted`` over all sites,
  and each island's state from its site's JobSet as MultiKueue mirrors the worker's status
  into it (:func:`site_island_states`: its replicated Job ``i<k>``'s counts, the JobSet's
  conditions, ``jobRestarts`` when the island was recreated alone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from shardmeter_operator.api import (
    GPUPoolSpec,
    IslandState,
    IslandStatus,
    SiteAdmission,
    SiteLaunch,
    SiteStatus,
    TrainingPlanSpec,
    TrainingPlanStatus,
    WorkloadKind,
)
from shardmeter_operator.api.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.api.errors import (
    MultiKueueError,
    QueueNotFoundError,
    WorkloadUnavailableError,
)
from shardmeter_operator.decision import ClusterFacts, PlanResult, SiteQueue
from shardmeter_operator.render import kueue
from shardmeter_operator.render.jobset import ISLAND_PREFIX
from shardmeter_operator.render.sites import (
    island_sites,
    site_jobset_name,
    site_of,
    too_many_islands,
)

Manifest = dict[str, Any]


def remote_pools(
    pools: Mapping[str, GPUPoolSpec], islands: Sequence[IslandStatus]
) -> dict[str, GPUPoolSpec]:
    """The pools of the islands that run in other clusters (a site queue)."""
    used = {i.pool for i in islands}
    return {
        n: p for n, p in pools.items() if n in used and p.kueue is not None and p.kueue.queue_name
    }


def decide_sites(
    name: str,
    spec: TrainingPlanSpec,
    islands: Sequence[IslandStatus],
    pools: Mapping[str, GPUPoolSpec],
    namespace: str,
    cluster: ClusterFacts,
) -> list[SiteLaunch]:
    """The sites of a launch through MultiKueue ([] for a launch in this cluster). Raises a
    SpecError naming the field when the pools' queues cannot carry the islands."""
    remote = remote_pools(pools, islands)
    if not remote:
        return []
    local = sorted({i.pool for i in islands} - set(remote))
    if local:
        raise MultiKueueError(
            "spec.pools",
            f"pools {', '.join(sorted(remote))} run in other clusters (spec.kueue.queueName) "
            f"and {', '.join(local)} in this one: a plan launches all its islands one way; give "
            f"{', '.join(local)} a site queue or plan without the others",
        )
    if spec.workload is WorkloadKind.JOB:
        raise WorkloadUnavailableError(
            "spec.workload",
            "is Job, but the islands run in other clusters through MultiKueue, which dispatches "
            "one JobSet per site: set workload: JobSet (or leave it unset)",
        )
    if not cluster.jobset_served:
        raise WorkloadUnavailableError(
            "spec.workload",
            "the islands run in other clusters as JobSets, but this (the manager) cluster does "
            "not serve jobset.x-k8s.io/v1alpha2: install JobSet's CRD here too",
        )
    if spec.queue_name:
        raise QueueNotFoundError(
            "spec.queueName",
            f"is {spec.queue_name}, but the islands go to their pools' site queues "
            f"({', '.join(sorted({p.kueue.queue_name or '' for p in remote.values() if p.kueue}))}): "
            "remove queueName",
        )
    if not cluster.kueue_served:
        raise QueueNotFoundError(
            "spec.pools",
            f"pools {', '.join(sorted(remote))} name site queues, but this cluster does not "
            f"serve {kueue.API_VERSION} (Kueue v0.15 or later): install Kueue with MultiKueue",
        )
    problem = too_many_islands(islands, pools)
    if problem:
        raise WorkloadUnavailableError(
            "spec.constraints.maxIslands", f"{problem}: lower maxIslands or split the site's pools"
        )
    out: list[SiteLaunch] = []
    for site, indexes in island_sites(islands, pools).items():
        names = sorted({islands[k].pool for k in indexes})
        queues = {remote[n].kueue.queue_name for n in names if remote[n].kueue}  # type: ignore[union-attr]
        if len(queues) != 1:
            raise MultiKueueError(
                "spec.pools",
                f"pools {', '.join(names)} of site {site} name different queues "
                f"{sorted(q or '' for q in queues)}: a site has one queue",
            )
        queue = next(iter(queues)) or ""
        facts = cluster.site_queues.get(queue) or kueue_facts_missing(queue)
        worker = ""
        for n in names:
            problem, worker = kueue.multikueue_problem(n, remote[n], namespace, facts)
            problem = problem or kueue.worker_problem(n, facts, namespace)
            if problem:
                error = QueueNotFoundError if facts.local_queue is None else MultiKueueError
                raise error("spec.pools", problem)
        out.append(
            SiteLaunch(
                site=site,
                queue_name=queue,
                cluster=worker,
                job_set=site_jobset_name(name, site),
                islands=list(indexes),
            )
        )
    return out


def kueue_facts_missing(queue: str) -> SiteQueue:
    return SiteQueue(queue)


# ---- following --------------------------------------------------------------------------------
def _time(stamp: str) -> datetime | None:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def _iso(at: datetime) -> str:
    return at.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def follow_sites(
    st: TrainingPlanStatus,
    spec: TrainingPlanSpec | None,
    jobsets: Mapping[str, Manifest],
    workloads: Mapping[str, Manifest],
    generation: int,
    out: PlanResult,
    now: datetime | None = None,
) -> dict[str, str]:
    """``status.sites`` and ``Admitted``/``QuotaReserved`` over the sites; returns, per site
    still waiting, why (for its islands' ``Queued`` state). ``jobsets``: the sites' JobSets
    by name; ``workloads``: JobSet UID → its Workload in this (the manager) cluster."""
    assert st.launch is not None
    now = now or datetime.now(UTC)
    timeout = spec.admission_timeout_seconds if spec is not None else 900
    before = {s.site: s for s in st.sites}
    sites: list[SiteStatus] = []
    waiting: dict[str, str] = {}
    for launch in st.launch.sites:
        js = jobsets.get(launch.job_set)
        uid = str(((js or {}).get("metadata") or {}).get("uid") or "")
        created = str(((js or {}).get("metadata") or {}).get("creationTimestamp") or "")
        admission, cluster, reason, message = kueue.site_admission(workloads.get(uid))
        state = SiteAdmission(admission)
        was = before.get(launch.site)
        since = was.since if was is not None and was.admission is state else ""
        if state is SiteAdmission.PENDING:
            since = since or created or _iso(now)
            started = _time(since)
            waited = (now - started).total_seconds() if started is not None else 0.0
            if waited <= timeout:
                out.requeue_within(max(1.0, timeout - waited + 0.5))  # to report the timeout
            else:
                state, reason = SiteAdmission.TIMED_OUT, Reason.ADMISSION_TIMEOUT
                message = (
                    f"not admitted {timeout} s after its JobSet was created "
                    f"(spec.admissionTimeoutSeconds); Kueue: {message}"
                )
        elif not since:
            since = _iso(now)
        status = SiteStatus(
            site=launch.site,
            job_set=launch.job_set,
            queue_name=launch.queue_name,
            admission=state,
            cluster=cluster,
            reason=reason,
            message=message[:1024],
            since=since,
        )
        sites.append(status)
        if state is not SiteAdmission.ADMITTED:
            waiting[launch.site] = f"site {launch.site} ({launch.queue_name}): {message}"
        if was is None or was.admission is not state:
            if state is SiteAdmission.ADMITTED:
                out.events.append(
                    (
                        "Normal",
                        "SiteAdmitted",
                        f"site {launch.site}: JobSet {launch.job_set} admitted by worker "
                        f"cluster {cluster or '(unknown)'}",
                    )
                )
            elif state in (SiteAdmission.TIMED_OUT, SiteAdmission.REJECTED):
                out.events.append(("Warning", reason, f"site {launch.site}: {message}"))
    st.sites = sites
    admitted = [s for s in sites if s.admission is SiteAdmission.ADMITTED]
    pending = [s for s in sites if s.admission is not SiteAdmission.ADMITTED]
    text = "; ".join(
        f"{s.site}: admitted by {s.cluster}"
        if s.admission is SiteAdmission.ADMITTED
        else f"{s.site}: {s.admission.value} ({s.reason}) {s.message}".rstrip()
        for s in sites
    )
    if pending:
        worst = next((s for s in pending if s.admission is not SiteAdmission.PENDING), pending[0])
        reason = (
            worst.reason
            if worst.admission is not SiteAdmission.PENDING
            else Reason.SITE_NOT_ADMITTED
        )
    else:
        reason = Reason.ADMITTED
    message = f"{len(admitted)}/{len(sites)} site(s) admitted: {text}"
    was_admitted = get_condition(st.conditions, Type.ADMITTED)
    st.conditions = set_condition(
        st.conditions, Type.ADMITTED, not pending, reason, message[:32768], generation
    )
    if not pending and (was_admitted is None or was_admitted.status != "True"):
        out.events.append(("Normal", "Admitted", f"every site admitted: {text}"))
    return waiting


def site_island_states(
    st: TrainingPlanStatus,
    jobsets: Mapping[str, Manifest],
    waiting: Mapping[str, str],
    *,
    complete: bool,
) -> list[IslandStatus]:
    """Each island's state from its site's JobSet, as MultiKueue mirrors the worker's status
    into it (the manager's copy stays suspended and has no child Jobs)."""
    assert st.launch is not None
    site_of_island = {k: s for s in st.launch.sites for k in s.islands}
    out = []
    for k, isl in enumerate(st.islands):
        launch = site_of_island.get(k)
        js = jobsets.get(launch.job_set) if launch is not None else None
        jstatus = (js or {}).get("status") or {}
        group = f"{ISLAND_PREFIX}{k}"
        rj: Mapping[str, Any] = next(
            (r for r in jstatus.get("replicatedJobsStatus") or [] if r.get("name") == group), {}
        )
        restarts = sum(int(x) for x in rj.get("jobRestarts") or [])
        failed = _true(js, "Failed")
        state: tuple[IslandState, str, str]
        if launch is None or js is None:
            state = (
                (IslandState.FAILED, "JobSetDeleted", "the site's JobSet was deleted")
                if complete
                else (IslandState.PENDING, "Creating", "the site's JobSet is being created")
            )
        elif failed is not None:
            state = (
                IslandState.FAILED,
                str(failed.get("reason") or "Failed"),
                str(failed.get("message") or ""),
            )
        elif int(rj.get("succeeded") or 0) >= 1:
            state = (IslandState.SUCCEEDED, "Completed", "")
        elif int(rj.get("ready") or 0) >= 1:
            state = (IslandState.RUNNING, "PodsReady", f"in worker cluster {_cluster(st, launch)}")
        elif launch.site in waiting:
            state = (IslandState.PENDING, "Queued", waiting[launch.site])
        elif int(rj.get("failed") or 0) >= 1:
            state = (
                IslandState.PENDING,
                "Restarting",
                "the island's Job failed; JobSet recreates it alone (RestartJob)",
            )
        else:
            state = (
                IslandState.PENDING,
                "WaitingForPods",
                f"in worker cluster {_cluster(st, launch)}",
            )
        out.append(
            isl.model_copy(
                update={
                    "state": state[0],
                    "reason": state[1],
                    "message": state[2][:1024],
                    "restarts": restarts,
                }
            )
        )
    return out


def _cluster(st: TrainingPlanStatus, launch: SiteLaunch) -> str:
    admitted = next((s.cluster for s in st.sites if s.site == launch.site and s.cluster), "")
    return admitted or launch.cluster or "(not admitted yet)"


def _true(obj: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def island_restarts(islands: Sequence[IslandStatus]) -> int:
    return sum(i.restarts for i in islands)


__all__ = [
    "decide_sites",
    "follow_sites",
    "island_restarts",
    "remote_pools",
    "site_island_states",
    "site_of",
]
