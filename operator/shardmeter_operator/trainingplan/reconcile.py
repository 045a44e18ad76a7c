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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardmeter_operator.api import TrainingPlanStatus
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.decision import ClusterFacts, Event, PlanInputs, PlanResult, PoolView
from shardmeter_operator.k8s.children import ensure_children, list_children
from shardmeter_operator.k8s.client import Kube
from shardmeter_operator.k8s.documents import read_documents
from shardmeter_operator.launch.children import ensured
from shardmeter_operator.launch.workload import workload_owners
from shardmeter_operator.observe.read import observe_plan
from shardmeter_operator.render import jobset as jobsets
from shardmeter_operator.render import kueue
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
        cluster=await read_cluster(reads, namespace, ctx.kube),
        workloads=await read_workloads(status, children, namespace, ctx.kube),
        rejected=ctx.rejected,
    )
    return inputs, reads


async def serves(kube: Kube, crd: str, version: str) -> bool:
    """Whether the CRD ``crd`` is installed and serves ``version``."""
    obj = await kube.get(CRD_API_VERSION, "CustomResourceDefinition", None, crd)
    versions = ((obj or {}).get("spec") or {}).get("versions") or []
    return any(v.get("name") == version and v.get("served", True) for v in versions)


async def read_cluster(reads: PlanReads, namespace: str, kube: Kube) -> ClusterFacts:
    """JobSet, Kueue and the LocalQueue when a launch may be decided; the pools'
    ResourceFlavors when its islands go to a queue that is there."""
    jobset = reads.decides_launch and await serves(kube, jobsets.CRD_NAME, jobsets.VERSION)
    kueue_served = queue_exists = False
    if reads.queue and reads.decides_launch:
        kueue_served = await serves(kube, kueue.LOCAL_QUEUES_CRD, kueue.VERSION) and await serves(
            kube, kueue.WORKLOADS_CRD, kueue.VERSION
        )
        queue_exists = kueue_served and (
            await kube.get(kueue.API_VERSION, "LocalQueue", namespace, reads.queue) is not None
        )
    flavors: dict[str, Manifest | None] = {}
    if reads.queue and (queue_exists or not reads.decides_launch):
        for flavor in reads.flavors:
            flavors[flavor] = await kube.get(kueue.API_VERSION, "ResourceFlavor", None, flavor)
    return ClusterFacts(jobset, kueue_served, queue_exists, flavors)


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
