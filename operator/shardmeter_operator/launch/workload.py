"""What a launch creates for the islands — plain Jobs or one JobSet, optionally queued in Kueue
— and how the plan follows it. The launch state machine (:mod:`shardmeter_operator.launch.rules`)
calls in at three points:

Everything here is pure: the acting layer (:mod:`shardmeter_operator.trainingplan.reconcile`) reads the
:class:`ClusterFacts` and the Kueue Workloads first.

1. **Deciding** (:func:`decide_workload`, before the decision is recorded): ``spec.workload``
   or, unset, JobSet when the cluster serves ``jobset.x-k8s.io/v1alpha2`` (its CRD is
   installed), else Job; ``spec.queueName`` must name a LocalQueue of the namespace; the
   pools' Kueue flavors must be assignable. Anything else is ``Valid=False`` naming the field
   and nothing is created; the check runs again every ``--recheck-interval`` (installing
   JobSet or creating the LocalQueue is a change elsewhere). The choice is recorded in
   ``status.launch`` (``workload``, ``jobSet``, ``queueName``) and never revisited until a
   relaunch.
2. **Creating** (:func:`rendered_pools`): the pools as their islands are rendered (a Kueue
   flavor's node labels in their node selector).
3. **Following** (:func:`follow_workload`, :func:`island_states`): each island's state from
   its Job — for a JobSet, the child Job of the current restart attempt, and the JobSet's
   own ``Completed``/``Failed``; ``status.restarts``; and, when queued, the conditions
   ``QuotaReserved`` and ``Admitted`` from Kueue's Workload(s).

:mod:`shardmeter_operator.k8s.pods` finds an island's pods for either workload: its Job's
name is ``status.islands[].name`` in both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardmeter.errors import SpecError
from shardmeter_operator.api import (
    GPUPoolSpec,
    IslandState,
    IslandStatus,
    RestartScope,
    SiteLaunch,
    TrainingPlanSpec,
    TrainingPlanStatus,
    WorkloadKind,
)
from shardmeter_operator.api.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.api.errors import (
    FlavorError,
    MultiKueueError,
    QueueNotFoundError,
    WorkloadUnavailableError,
)
from shardmeter_operator.decision import ClusterFacts, PlanResult, PoolView
from shardmeter_operator.launch.jobset import follow_jobset, restarts_of
from shardmeter_operator.launch.rules import follow_islands
from shardmeter_operator.launch.sites import decide_sites, site_island_states
from shardmeter_operator.render import jobset as jobsets
from shardmeter_operator.render import kueue
from shardmeter_operator.render.labels import PLAN_REVISION_LABEL
from shardmeter_operator.render.launch import launchable_run, refuse_launch
from shardmeter_operator.render.sites import name_site_islands

Manifest = dict[str, Any]


def decide_workload(
    spec: TrainingPlanSpec,
    islands: Sequence[IslandStatus],
    pools: Mapping[str, GPUPoolSpec],
    namespace: str,
    cluster: ClusterFacts,
    default_workload: str = "auto",
) -> WorkloadKind:
    """The workload the launch of ``islands`` creates: ``spec.workload``, else the operator's
    ``--default-workload`` (``auto``: JobSet where served, else Job). Raises a SpecError naming
    the field (WorkloadUnavailableError, QueueNotFoundError, FlavorError) when it cannot be
    created."""
    served = cluster.jobset_served
    default = (
        WorkloadKind(default_workload)
        if default_workload != "auto"
        else (WorkloadKind.JOBSET if served else WorkloadKind.JOB)
    )
    kind = spec.workload or default
    if kind is WorkloadKind.JOBSET and not served:
        said = (
            "is JobSet"
            if spec.workload
            else "is unset and the operator's default (--default-workload, chart "
            "operator.defaultWorkload) is JobSet"
        )
        raise WorkloadUnavailableError(
            "spec.workload",
            f"{said}, but the cluster does not serve {jobsets.API_VERSION} (the JobSet CRD "
            f"{jobsets.CRD_NAME} is not installed): install JobSet (v0.7 or later) or set "
            "workload: Job",
        )
    if kind is WorkloadKind.JOB and spec.max_restarts:
        why = "is Job" if spec.workload else "defaults to Job (the JobSet CRD is not installed)"
        raise WorkloadUnavailableError(
            "spec.maxRestarts",
            f"is {spec.max_restarts}, but spec.workload {why}, and only a JobSet restarts a "
            "plan's islands: set workload: JobSet (install JobSet) or maxRestarts: 0",
        )
    if spec.queue_name:
        _check_queue(spec.queue_name, namespace, cluster)
        rendered_pools(used_pools(pools, islands), spec.queue_name, cluster.flavors)
        groups = len(jobsets.replicated_jobs(islands))
        if kind is WorkloadKind.JOBSET and groups > kueue.MAX_POD_SETS:
            raise WorkloadUnavailableError(
                "spec.queueName",
                f"Kueue admits a JobSet as one Workload of at most {kueue.MAX_POD_SETS} pod "
                f"sets (one per replicated Job), and this plan's islands come in {groups} "
                "shapes: lower spec.constraints.maxIslands or use fewer pools",
            )
    return kind


def used_pools(
    pools: Mapping[str, GPUPoolSpec], islands: Sequence[IslandStatus]
) -> dict[str, GPUPoolSpec]:
    """The pools some island runs on (only their flavors matter)."""
    return {name: pools[name] for name in sorted({i.pool for i in islands})}


def _check_queue(queue: str, namespace: str, cluster: ClusterFacts) -> None:
    if not cluster.kueue_served:
        raise QueueNotFoundError(
            "spec.queueName",
            f"is {queue}, but the cluster does not serve {kueue.API_VERSION} LocalQueues and "
            "Workloads (Kueue is not installed): install Kueue or remove queueName",
        )
    if not cluster.queue_exists:
        raise QueueNotFoundError(
            "spec.queueName",
            f"names LocalQueue {queue}, which does not exist in namespace {namespace}: create "
            f"it (kubectl get localqueues -n {namespace}) or fix the name",
        )


def rendered_pools(
    pools: Mapping[str, GPUPoolSpec], queue: str, flavors: Mapping[str, Manifest | None]
) -> dict[str, GPUPoolSpec]:
    """The pools as their islands are rendered: with a queue, each Kueue flavor's nodeLabels
    merged into the pool's node selector. Raises FlavorError for a flavor Kueue could never
    assign. ``flavors``: ResourceFlavor name → the object (None or absent: it does not exist)."""
    out = dict(pools)
    if not queue:
        return out
    for name, spec in pools.items():
        if spec.kueue is None or spec.kueue.flavor is None:
            continue
        flavor = flavors.get(spec.kueue.flavor)
        problem = kueue.flavor_problem(name, spec, flavor)
        if problem:
            raise FlavorError("spec.pools", problem)
        assert flavor is not None
        out[name] = kueue.with_flavor(spec, flavor)
    return out


def launch_islands(
    plan: str,
    islands: Sequence[IslandStatus],
    kind: WorkloadKind,
    pools: Mapping[str, GPUPoolSpec] | None = None,
    restart: RestartScope = RestartScope.ALL_ISLANDS,
) -> list[IslandStatus]:
    """The islands named after the Jobs that the workload will run them in (``pools``: a
    launch through MultiKueue, one JobSet per site)."""
    if pools is not None:
        return name_site_islands(plan, islands, pools)
    if kind is WorkloadKind.JOBSET:
        return jobsets.name_islands(plan, islands, restart)
    return list(islands)


def restart_scope(
    spec: TrainingPlanSpec,
    kind: WorkloadKind,
    cluster: ClusterFacts,
    islands: int = 1,
    queued: bool = False,
) -> RestartScope:
    """What a failed island's JobSet recreates: ``spec.restart``, else the island alone where
    the cluster's JobSet accepts ``RestartJob`` (JobSet v0.12+ with its ``RestartJob`` feature
    gate on) and, for a queued JobSet, Kueue can admit one pod set per island. Plain Jobs are
    never recreated."""
    if kind is not WorkloadKind.JOBSET:
        return RestartScope.ALL_ISLANDS
    why = ""
    if not cluster.jobset_restart_job:
        why = (
            cluster.jobset_restart_job_refused
            or "the cluster's JobSet does not accept the failure-policy action RestartJob"
        )
        why += (
            " (a failed island restarts alone with JobSet v0.12 or later, its controller run "
            "with --feature-gates=RestartJob=true)"
        )
    elif queued and islands > kueue.MAX_POD_SETS:
        why = (
            f"{islands} islands would be {islands} pod sets (one replicated Job each), and "
            f"Kueue admits a Workload of at most {kueue.MAX_POD_SETS}"
        )
    if spec.restart is RestartScope.ISLAND and why:
        raise WorkloadUnavailableError(
            "spec.restart", f"is Island, but {why}; fix that, or set restart: AllIslands"
        )
    if spec.restart is not None:
        return spec.restart
    return RestartScope.ALL_ISLANDS if why else RestartScope.ISLAND


# ---- following --------------------------------------------------------------------------------
def _current(st: TrainingPlanStatus, children: Sequence[Manifest]) -> list[Manifest]:
    assert st.launch is not None
    rev = st.launch.revision
    return [
        c for c in children if (c["metadata"].get("labels") or {}).get(PLAN_REVISION_LABEL) == rev
    ]


def _jobset(current: Sequence[Manifest]) -> Manifest | None:
    return next((c for c in current if c.get("kind") == jobsets.KIND), None)


def island_states(
    st: TrainingPlanStatus,
    children: Sequence[Manifest],
    rejected: Mapping[str, str],
    *,
    queued: str = "",
    sites_waiting: Mapping[str, str] | None = None,
) -> list[IslandStatus]:
    """Each island's state from this revision's children (see the module docstring);
    ``queued``: why Kueue has not admitted the workload yet ("" when admitted or not queued);
    ``sites_waiting``: a launch through MultiKueue, why each waiting site waits."""
    sites_waiting = sites_waiting or {}
    assert st.launch is not None
    current = _current(st, children)
    if st.launch.sites:
        by_name = {c["metadata"]["name"]: c for c in current if c.get("kind") == jobsets.KIND}
        return site_island_states(st, by_name, sites_waiting, complete=st.launch.complete)
    jobs = {c["metadata"]["name"]: c for c in current if c.get("kind") == "Job"}
    if st.launch.workload is WorkloadKind.JOBSET:
        return follow_jobset(
            st.islands,
            _jobset(current),
            jobs,
            rejected,
            complete=st.launch.complete,
            queued=queued,
        )
    out = follow_islands(st.islands, jobs, rejected, complete=st.launch.complete)
    if not queued:
        return out
    return [
        i.model_copy(update={"reason": "Queued", "message": queued})
        if i.state is IslandState.PENDING and i.reason == "Suspended"
        else i
        for i in out
    ]


def workload_owners(st: TrainingPlanStatus, children: Sequence[Manifest]) -> list[tuple[str, str]]:
    """(description, UID) of what the launch submitted to Kueue: the JobSet, each site's
    JobSet, or each island Job (none before the launch is complete or without a queue)."""
    if st.launch is None or not st.launch.complete:
        return []
    current = _current(st, children)
    if st.launch.sites:
        names = {s.job_set for s in st.launch.sites}
        return [
            (f"JobSet {c['metadata']['name']}", c["metadata"]["uid"])
            for c in current
            if c.get("kind") == jobsets.KIND and c["metadata"]["name"] in names
        ]
    if not st.launch.queue_name:
        return []
    if st.launch.workload is WorkloadKind.JOBSET:
        js = _jobset(current)
        return [] if js is None else [(f"JobSet {st.launch.job_set}", js["metadata"]["uid"])]
    names = {i.name for i in st.islands}
    return [
        (f"Job {c['metadata']['name']}", c["metadata"]["uid"])
        for c in current
        if c.get("kind") == "Job" and c["metadata"]["name"] in names
    ]


def follow_workload(
    generation: int,
    children: Sequence[Manifest],
    workloads: Sequence[Manifest],
    pools: Mapping[str, PoolView],
    out: PlanResult,
) -> str:
    """JobSet restarts and, with a queue, Kueue's admission of the launch's workload into the
    plan's status; returns why the islands still wait in the queue ("" when they do not).
    ``workloads``: Kueue's Workloads of :func:`workload_owners`."""
    st = out.status
    if st.launch is None or not st.launch.complete:
        return ""
    current = _current(st, children)
    if st.launch.sites:
        return ""  # followed per site (follow_launched_sites)
    if st.launch.workload is WorkloadKind.JOBSET:
        restarts = restarts_of(_jobset(current))
        if restarts > st.restarts:
            out.events.append(
                (
                    "Warning",
                    "JobSetRestarted",
                    f"an island failed: JobSet {st.launch.job_set} recreated every island "
                    f"(restart {restarts})",
                )
            )
        st.restarts = restarts
    queue = st.launch.queue_name
    if not queue:
        return ""
    owners = workload_owners(st, children)
    by_owner = {
        str((wl["metadata"].get("labels") or {}).get(kueue.JOB_UID_LABEL)): wl for wl in workloads
    }
    verdict = kueue.admission(queue, owners or [(f"JobSet {st.launch.job_set}", "")], by_owner)
    before = get_condition(st.conditions, Type.ADMITTED)
    for type_, v in (
        (Type.QUOTA_RESERVED, verdict.quota_reserved),
        (Type.ADMITTED, verdict.admitted),
    ):
        st.conditions = set_condition(
            st.conditions, type_, v.status, v.reason, v.message, generation
        )
    was = before is not None and before.status == "True"
    if verdict.admitted.status and not was:
        out.events.append(
            ("Normal", "Admitted", f"Kueue admitted the islands: {verdict.admitted.message}")
        )
    elif was and not verdict.admitted.status:
        out.events.append(("Warning", verdict.admitted.reason, verdict.admitted.message))
    if verdict.admitted.status and not was:
        out.events += _flavor_mismatches(st, verdict.flavors, pools)
    return verdict.waiting


def _flavor_mismatches(
    st: TrainingPlanStatus, assigned: Mapping[str, str], pools: Mapping[str, PoolView]
) -> list[tuple[str, str, str]]:
    """Warnings for replicated Jobs admitted on another flavor than their pool declares."""
    assert st.launch is not None
    if st.launch.workload is not WorkloadKind.JOBSET:
        return []
    events = []
    for g in jobsets.replicated_jobs(st.islands):
        pool = st.islands[g.first].pool
        view = pools.get(pool)
        declared = ((view.spec if view else {}).get("kueue") or {}).get("flavor")
        got = assigned.get(g.name)
        if declared and got and got != declared:
            events.append(
                (
                    "Warning",
                    "UnexpectedFlavor",
                    f"replicated Job {g.name} (pool {pool}) was admitted on flavor {got}, not "
                    f"the pool's {declared}: list {declared} first in the ClusterQueue, or give "
                    f"{got} nodeLabels that contradict the pool's nodeSelector",
                )
            )
    return events


# ---- the decision -----------------------------------------------------------------------------
def decide_launch(
    name: str,
    namespace: str,
    spec: TrainingPlanSpec,
    pools: Mapping[str, GPUPoolSpec],
    cluster: ClusterFacts,
    recheck_s: float,
    out: PlanResult,
    generation: int,
    default_workload: str = "auto",
) -> WorkloadKind | None:
    """Check that the planned islands can be launched — torchtitan-FT runs them as planned
    (:func:`~.render.launch.launchable_run`), the workload can be created — and name them
    after their Jobs. None (with ``Valid=False`` naming the field, and a recheck in
    ``recheck_s`` when the fix lies in another object) when they cannot: nothing is recorded
    or created."""
    st = out.status
    try:
        sites = decide_sites(name, spec, st.islands, pools, namespace, cluster)
        kind = (
            WorkloadKind.JOBSET
            if sites
            else decide_workload(spec, st.islands, pools, namespace, cluster, default_workload)
        )
        restart = restart_scope(
            spec, kind, cluster, len(st.islands), queued=bool(spec.queue_name) and not sites
        )
        launchable_run(spec, st, namespace, WorkloadKind.JOBSET, restart)  # the plan itself
        launchable_run(spec, st, namespace, kind, restart)  # Jobs: one DNS search per island
    except SpecError as exc:
        event = refuse_launch(st, exc, generation, out.previous)
        out.events += [event] if event else []
        if isinstance(
            exc, WorkloadUnavailableError | QueueNotFoundError | FlavorError | MultiKueueError
        ):
            out.requeue_within(recheck_s)  # installed or created elsewhere
        return None
    st.islands = launch_islands(name, st.islands, kind, pools if sites else None, restart)
    st.restarts = 0  # a new launch: no JobSet has restarted it yet
    out.decided_sites, out.decided_restart = sites, restart
    return kind


def launch_record(
    plan: str,
    kind: WorkloadKind,
    spec: TrainingPlanSpec,
    sites: Sequence[SiteLaunch] = (),
    restart: RestartScope = RestartScope.ALL_ISLANDS,
) -> dict[str, Any]:
    """The workload fields of the LaunchRecord."""
    return {
        "workload": kind,
        "workload_defaulted": spec.workload is None and not sites,
        "job_set": jobsets.jobset_name(plan) if kind is WorkloadKind.JOBSET and not sites else "",
        "queue_name": "" if sites else spec.queue_name,
        "sites": list(sites),
        "restart": restart,
    }


def launched_message(st: TrainingPlanStatus) -> tuple[str, str]:
    """(message, reason) of ``Launched=True``: what was created."""
    assert st.launch is not None
    rev, queue = st.launch.revision, st.launch.queue_name
    queued = f", suspended in LocalQueue {queue} until Kueue admits it" if queue else ""
    if st.launch.restart is RestartScope.ISLAND:
        alone = "; a failed island restarts alone"
    elif st.launch.workload is WorkloadKind.JOBSET and len(st.islands) > 1:
        alone = (
            "; a failed island restarts every island (spec.restart AllIslands, or the "
            "cluster's JobSet refuses RestartJob: see docs/operator.md)"
        )
    else:
        alone = ""
    if st.launch.workload_defaulted:
        alone += (
            f" (spec.workload unset: {st.launch.workload.value} by the operator's default "
            "workload, --default-workload / chart operator.defaultWorkload)"
        )
    if st.launch.sites:
        shown = ", ".join(
            f"{s.job_set} ({len(s.islands)} island(s) in {s.queue_name} → {s.cluster})"
            for s in st.launch.sites
        )
        return (
            f"{len(st.launch.sites)} JobSet(s) of revision {rev}, one per site, managed by "
            f"MultiKueue: {shown}{alone}",
            Reason.JOBSET_CREATED,
        )
    if st.launch.workload is WorkloadKind.JOBSET:
        groups = (
            [jobsets.island_group(k) for k in range(len(st.islands))]
            if st.launch.restart is RestartScope.ISLAND
            else jobsets.replicated_jobs(st.islands)
        )
        return (
            f"JobSet {st.launch.job_set} of revision {rev}: {len(st.islands)} island(s) in "
            f"{len(groups)} replicated Job(s) ({', '.join(g.name for g in groups)}){queued}"
            f"{alone}",
            Reason.JOBSET_CREATED,
        )
    return (
        f"{len(st.jobs)} Job(s) of revision {rev}: {', '.join(st.jobs)}{queued}{alone}",
        Reason.JOBS_CREATED,
    )
