"""TrainingPlan reconciliation, the acting half: read what the decision needs, decide
(:func:`~.trainingplan.decide.decide`, pure; in the planning worker thread when it searches),
then act — write the launch decision before any child exists, create the children, follow
them once created, observe the running islands — and return the whole new status as a
:class:`TrainingPlanStatus` plus the Events to post (the controller posts them and writes the
status; the gauges follow from the status). The state machine and its rules are in
:mod:`shardmeter_operator.launch.rules`.

Level-triggered: running it twice changes nothing the second time."""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardmeter_operator.api import TrainingPlanStatus
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.decision import (
    ClusterFacts,
    Event,
    PlanInputs,
    PlanResult,
    PoolView,
    SiteQueue,
    WorkerFacts,
)
from shardmeter_operator.k8s.children import ensure_children, list_children
from shardmeter_operator.k8s.client import ApiError, Kube
from shardmeter_operator.k8s.clusters import WorkerClusters
from shardmeter_operator.k8s.documents import read_documents
from shardmeter_operator.launch.children import ensured
from shardmeter_operator.launch.workload import workload_owners
from shardmeter_operator.observe.read import observe_plan
from shardmeter_operator.render import jobset as jobsets
from shardmeter_operator.render import kueue
from shardmeter_operator.render.lighthouse import ingress_of, lighthouse_name
from shardmeter_operator.trainingplan.decide import PlanReads, decide, lists_children, plan_reads
from shardmeter_operator.trainingplan.launched import follow_launched
from shardmeter_operator.trainingplan.planned import needs_reevaluation
from shardmeter_operator.trainingplan.validate import needs_work, referenced_pools
from shardmeter_operator.worker import search_in_worker

Manifest = dict[str, Any]


@dataclass
class PlanContext:
    """What the acting half of a plan's reconcile holds: the settings, the API, the pools the
    watch knows, and the controller's hooks (a mid-reconcile status write, liveness)."""

    cfg: OperatorConfig
    kube: Kube
    pools: Mapping[str, PoolView]
    rejected: Mapping[str, str] = field(default_factory=dict)
    """Job UID → the latest FailedCreate message of the Job controller."""
    write: Callable[[TrainingPlanStatus, Sequence[Event]], Awaitable[None]] | None = None
    """Writes a status mid-reconcile (the launch decision, before any child exists) with the
    Events decided so far pending in it (:mod:`~.events`); raises GoneError when the plan
    was deleted or replaced since it was read."""
    alive: Callable[[], bool] = lambda: True
    """False once the plan's deletion was seen (no child is created after that)."""
    workers: WorkerClusters | None = None
    """MultiKueue's worker clusters (islands of a launch through MultiKueue run there)."""

    async def cluster_kube(self, cluster: str) -> tuple[Kube | None, str]:
        """The API of ``cluster`` ("": this one), or None and why it cannot be read."""
        if not cluster:
            return self.kube, ""
        if self.workers is None:
            return None, f"worker cluster {cluster}: the operator reads no worker clusters"
        return await self.workers.client(cluster)


CRD_API_VERSION = "apiextensions.k8s.io/v1"


async def reconcile_plan(body: Mapping[str, Any], ctx: PlanContext) -> PlanResult:
    inputs, reads = await read_plan(body, ctx)
    out = await search_in_worker(decide, inputs) if reads.searches else decide(inputs)
    if out.create:
        await _create(inputs, out, ctx)
    if out.followed:
        await observe_plan(inputs.name, inputs.namespace, inputs.uid, out.validated, ctx, out)
    return out


# ---- reading ----------------------------------------------------------------------------------
async def read_plan(body: Mapping[str, Any], ctx: PlanContext) -> tuple[PlanInputs, PlanReads]:
    """What deciding the plan ``body`` reads, and what was read (:func:`plan_reads`)."""
    meta = body.get("metadata") or {}
    namespace, uid = str(meta.get("namespace") or ""), str(meta["uid"])
    spec = dict(body.get("spec") or {})
    status = TrainingPlanStatus.model_validate(body.get("status") or {})
    listed = lists_children(spec, status)
    children = await list_children(ctx.kube, namespace, uid) if listed else []
    reads = plan_reads(spec, status, ctx.pools, children)
    documents, notes = await read_documents(reads.documents, ctx.cfg, ctx.kube)
    inputs = PlanInputs(
        name=str(meta["name"]),
        namespace=namespace,
        uid=uid,
        generation=int(meta.get("generation") or 1),
        spec=spec,
        status=status,
        pools=ctx.pools,
        cfg=ctx.cfg,
        children=children,
        documents=documents,
        document_notes=notes,
        cluster=await read_cluster(reads, namespace, ctx.kube, str(meta["name"]), ctx.cluster_kube),
        workloads=await read_workloads(status, children, namespace, ctx.kube),
        rejected=ctx.rejected,
    )
    return inputs, reads


async def serves(kube: Kube, crd: str, version: str) -> bool:
    """Whether the CRD ``crd`` is installed and serves ``version``."""
    return _served(await kube.get(CRD_API_VERSION, "CustomResourceDefinition", None, crd), version)


ClusterClient = Callable[[str], Awaitable[tuple[Kube | None, str]]]


async def read_cluster(
    reads: PlanReads,
    namespace: str,
    kube: Kube,
    plan: str = "",
    workers: ClusterClient | None = None,
) -> ClusterFacts:
    """JobSet (and whether it restarts an island alone), Kueue and the LocalQueue when a
    launch may be decided; the pools' ResourceFlavors when its islands go to a queue that is
    there; the site queues' MultiKueue setup; the lighthouse Service's ingress while a launch
    is incomplete."""
    jobset, refused = False, ""
    if reads.decides_launch:
        crd = await kube.get(CRD_API_VERSION, "CustomResourceDefinition", None, jobsets.CRD_NAME)
        jobset = _served(crd, jobsets.VERSION)
        if jobset:
            refused = (
                await restart_job_refusal(kube, namespace)
                if jobsets.accepts_restart_job(crd or {})
                else "the JobSet CRD has no failure-policy action RestartJob"
            )
    kueue_served = queue_exists = False
    if (reads.queue or reads.site_queues) and reads.decides_launch:
        kueue_served = await serves(kube, kueue.LOCAL_QUEUES_CRD, kueue.VERSION) and await serves(
            kube, kueue.WORKLOADS_CRD, kueue.VERSION
        )
        queue_exists = (
            kueue_served
            and bool(reads.queue)
            and (
                await kube.get(kueue.API_VERSION, "LocalQueue", namespace, reads.queue) is not None
            )
        )
    flavors: dict[str, Manifest | None] = {}
    if reads.queue and (queue_exists or not reads.decides_launch):
        for flavor in reads.flavors:
            flavors[flavor] = await kube.get(kueue.API_VERSION, "ResourceFlavor", None, flavor)
    sites = {}
    if kueue_served:
        for queue in reads.site_queues:
            site = await read_site_queue(kube, namespace, queue)
            worker = kueue.only_cluster(site.config)
            if worker and workers is not None:
                facts = await read_worker(workers, worker, namespace, queue)
                site = dataclasses.replace(site, worker=facts)
            sites[queue] = site
    ingress = ""
    if reads.lighthouse and plan:
        service = await kube.get("v1", "Service", namespace, lighthouse_name(plan))
        ingress = ingress_of(service)
    return ClusterFacts(
        jobset,
        kueue_served,
        queue_exists,
        flavors,
        jobset and not refused,
        refused,
        sites,
        ingress,
    )


_RESTART_JOB_TTL_S = 300.0
_restart_job_answers: weakref.WeakKeyDictionary[Kube, tuple[float, str]] = (
    weakref.WeakKeyDictionary()
)


async def restart_job_refusal(kube: Kube, namespace: str) -> str:
    """Why the cluster's JobSet webhook refuses a ``RestartJob`` rule ("" when it accepts
    it): a server-side dry run, its answer kept for five minutes per API server (a JobSet
    upgrade or a feature gate turned on is seen within that)."""
    now = time.monotonic()
    kept = _restart_job_answers.get(kube)
    if kept is not None and now - kept[0] < _RESTART_JOB_TTL_S:
        return kept[1]
    answer = await kube.dry_run_refusal(jobsets.restart_job_probe(namespace))
    if answer:
        answer = f"the JobSet webhook refuses RestartJob: {answer}"
    _restart_job_answers[kube] = (now, answer)
    return answer


async def read_worker(
    workers: ClusterClient, cluster: str, namespace: str, queue: str
) -> WorkerFacts | None:
    """What worker ``cluster`` has of the namespace, the LocalQueue ``queue`` and JobSet
    (None when the operator reads no worker clusters)."""
    kube, why = await workers(cluster)
    if kube is None:
        return WorkerFacts(cluster, unreadable=why) if "does not read" not in why else None

    async def has(read: Awaitable[Any]) -> bool | None:
        try:
            return bool(await read)
        except ApiError as exc:
            if exc.status == 403:  # MultiKueue's worker role need not grant it
                return None
            raise

    try:
        ns = await has(kube.get("v1", "Namespace", None, namespace))
        lq = await has(kube.get(kueue.API_VERSION, "LocalQueue", namespace, queue))
        jobset = await has(serves(kube, jobsets.CRD_NAME, jobsets.VERSION))
    except ApiError as exc:
        return WorkerFacts(cluster, unreadable=str(exc))
    return WorkerFacts(cluster, ns, lq, jobset)


async def read_site_queue(kube: Kube, namespace: str, queue: str) -> SiteQueue:
    """A site queue's MultiKueue setup: LocalQueue → ClusterQueue → its AdmissionChecks →
    the MultiKueue check's MultiKueueConfig (what exists of it)."""
    lq = await kube.get(kueue.API_VERSION, "LocalQueue", namespace, queue)
    if lq is None:
        return SiteQueue(queue)
    cq = await kube.get(kueue.API_VERSION, "ClusterQueue", None, kueue.cluster_queue_of(lq))
    if cq is None:
        return SiteQueue(queue, lq)
    checks = []
    for name in kueue.check_names_of(cq):
        check = await kube.get(kueue.API_VERSION, "AdmissionCheck", None, name)
        if check is not None:
            checks.append(check)
    mk = kueue.multikueue_check(checks)
    config = None
    if mk is not None and kueue.config_name_of(mk):
        config = await kube.get(
            kueue.API_VERSION, "MultiKueueConfig", None, kueue.config_name_of(mk)
        )
    return SiteQueue(queue, lq, cq, tuple(checks), config)


def _served(crd: Mapping[str, Any] | None, version: str) -> bool:
    versions = ((crd or {}).get("spec") or {}).get("versions") or []
    return any(v.get("name") == version and v.get("served", True) for v in versions)


async def read_workloads(
    status: TrainingPlanStatus, children: Sequence[Manifest], namespace: str, kube: Kube
) -> list[Manifest]:
    """Kueue's Workloads of what a complete, queued launch submitted."""
    owners = workload_owners(status, children)
    if not owners:
        return []
    selector = f"{kueue.JOB_UID_LABEL} in ({','.join(uid for _, uid in owners)})"
    return await kube.list(kueue.API_VERSION, "Workload", namespace, selector)


# ---- acting -----------------------------------------------------------------------------------
async def _create(inputs: PlanInputs, out: PlanResult, ctx: PlanContext) -> None:
    """Create the recorded launch's children — after writing the status, so the decision is
    durable before any child exists — and follow them once they all exist."""
    st = out.status
    assert st.launch is not None
    if ctx.write is not None:
        await ctx.write(st, out.events)
    result = await ensure_children(
        ctx.kube, out.create, inputs.children, inputs.uid, st.launch.revision, ctx.alive
    )
    ensured(inputs, result, out)
    if not st.launch.complete:
        return
    children = await list_children(ctx.kube, inputs.namespace, inputs.uid)
    now = dataclasses.replace(
        inputs,
        children=children,
        workloads=await read_workloads(st, children, inputs.namespace, ctx.kube),
    )
    ok = out.validated
    if ok is not None and needs_reevaluation(st, ok, inputs.pools):
        await search_in_worker(follow_launched, now, ok, out)
    else:
        follow_launched(now, ok, out)


__all__ = [
    "PlanContext",
    "PlanResult",
    "PoolView",
    "needs_work",
    "reconcile_plan",
    "referenced_pools",
]
