"""kopf wiring, thin: watch events go to the :class:`~shardmeter_operator.controller.Controller`.

Only ``on.event`` handlers: no timers, daemons or mandatory delete
handlers, so kopf never puts a finalizer on a GPUPool or TrainingPlan (deleting one — or its
namespace — never waits for the operator). Server-side selectors keep the watches of Jobs,
JobSets and Events to the operator's own; Kueue's Workloads go to the plan that owns their
JobSet or Job; the coefficients ConfigMaps are watched in the operator's namespace only
(``Controller.watch_coefficients``). Kinds whose CRD is not installed (JobSet, Kueue) are
watched once it is (kopf follows the CRDs)."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from shardmeter_operator import metrics
from shardmeter_operator.admission import webhook as admission
from shardmeter_operator.api import GROUP, VERSION, GPUPoolStatus, TrainingPlanStatus
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.controller import Controller
from shardmeter_operator.k8s import watchguard
from shardmeter_operator.k8s.client import Kube, connection_info, load_configuration
from shardmeter_operator.render.jobset import GROUP as JOBSET_GROUP
from shardmeter_operator.render.jobset import VERSION as JOBSET_VERSION
from shardmeter_operator.render.kueue import GROUP as KUEUE_GROUP
from shardmeter_operator.render.kueue import VERSION as KUEUE_VERSION
from shardmeter_operator.render.labels import (
    COMPONENT_LABEL,
    MANAGED_BY,
    PLAN_UID_LABEL,
    POOL_ANNOTATION,
)

GPUPOOLS = (GROUP, VERSION, "gpupools")
PLANS = (GROUP, VERSION, "trainingplans")
OURS = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
FAILED_CREATE = "reason=FailedCreate,involvedObject.kind=Job"


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """The operator's handlers: its lifecycle, the two kinds it reconciles, their children."""
    watchguard.install()  # a failing watch stream is watched again, never the operator's end
    registry = kopf.OperatorRegistry()
    _lifecycle(registry)
    _gpupools(registry)
    _trainingplans(registry)
    _children(registry)
    admission.register(registry, webhooks=bool(config.admission_port))
    return registry


def _lifecycle(registry: kopf.OperatorRegistry) -> None:
    """Startup (settings, the API client, peering, the controller), cleanup, login, probe."""

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        _configure(settings)
        if getattr(memo, "kube", None) is None:
            memo.kube = Kube(load_configuration(memo.config.kubeconfig))
        peering = None if settings.peering.standalone else settings.peering.name
        if peering is not None:
            # One cluster-wide peering for every mode: GPUPools are cluster-scoped anyway.
            settings.peering.clusterwide = True
            await memo.kube.ensure_cluster_peering(peering)
        memo.controller = Controller(
            memo.config, memo.kube, peering=peering, priority=settings.peering.priority
        )
        memo.controller.watch_coefficients()
        watchguard.on_listed(GROUP, "trainingplans", memo.controller.plans_listed)
        watchguard.on_listed(GROUP, "gpupools", memo.controller.pools_listed)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        controller = getattr(memo, "controller", None)
        if controller is not None:
            await controller.close()
        kube = getattr(memo, "kube", None)
        if kube is not None:
            kube.close()

    @kopf.on.login(registry=registry)
    def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
        return connection_info(load_configuration(memo.config.kubeconfig))

    @kopf.on.probe(registry=registry, id="reconciler")
    def probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
        controller = getattr(memo, "controller", None)
        return controller.health() if controller is not None else {"starting": True}


def _configure(settings: kopf.OperatorSettings) -> None:
    settings.posting.level = logging.WARNING  # Events are posted explicitly, not per log line
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # kopf's own requests (lists, watches, peering) retry for as long as the API is away —
    # by default they give up after about two minutes, and the operator exits — and follow
    # the server's Retry-After (see watchguard for the watch streams themselves)
    settings.networking.error_backoffs = watchguard.ENDLESS_BACKOFFS
    settings.networking.enforce_retry_after = True
    settings.watching.label_selectors["batch", "v1", "jobs"] = OURS
    settings.watching.label_selectors[JOBSET_GROUP, JOBSET_VERSION, "jobsets"] = OURS
    settings.watching.field_selectors["v1", "events"] = FAILED_CREATE


def _controller(memo: kopf.Memo) -> Controller:
    """The controller, told that a handler runs (it keeps kopf's context for later work)."""
    ctl: Controller = memo.controller
    ctl.in_handler()
    return ctl


def _gpupools(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(*GPUPOOLS, registry=registry, id="gpupool")
    async def gpupool_event(
        type: str | None, body: kopf.Body, name: str, memo: kopf.Memo, **_: Any
    ) -> None:
        ctl = _controller(memo)
        if type == "DELETED":
            ctl.observe_pool(body, deleted=True)
            metrics.forget_pool(name)
        else:
            ctl.observe_pool(body)
            if _pool_needs_reconcile(type, body, ctl):
                await ctl.pool(name)  # new spec, (re)start or a reset: re-read ConfigMap, Job
        await ctl.fan_out(name)


def _pool_needs_reconcile(type_: str | None, body: kopf.Body, ctl: Controller) -> bool:
    """Whether a GPUPool event calls for its reconcile: the listing at (re)start, a spec its
    status has not answered, or a reset of its observed correction."""
    status = GPUPoolStatus.model_validate(body.get("status") or {})
    generation = int(body["metadata"].get("generation") or 0)
    return type_ is None or status.observed_generation != generation or ctl.pool_needs_work(body)


def _trainingplans(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(*PLANS, registry=registry, id="trainingplan")
    async def trainingplan_event(
        type: str | None,
        body: kopf.Body,
        name: str,
        namespace: str | None,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        ctl = _controller(memo)
        if type == "DELETED":
            ctl.observe_plan(body, deleted=True)
            await ctl.plan_deleted(namespace or "", name, str(body["metadata"].get("uid")))
            return
        ctl.observe_plan(body)
        launched = TrainingPlanStatus.model_validate(body.get("status") or {}).launch is not None
        if (type is None and launched) or ctl.plans_need_work(namespace or "", name):
            await ctl.plan(namespace or "", name)


def _children(registry: kopf.OperatorRegistry) -> None:
    """What the operator created or asked for: Jobs (benchmarks, islands), JobSets, Kueue
    Workloads and the Job controller's FailedCreate Events; each goes to its owner."""

    @kopf.on.event("batch", "v1", "jobs", registry=registry, id="child-job")
    async def job_event(
        labels: kopf.Labels, annotations: kopf.Annotations, memo: kopf.Memo, **_: Any
    ) -> None:
        ctl = _controller(memo)
        if labels.get(COMPONENT_LABEL) == "bench" and POOL_ANNOTATION in annotations:
            await ctl.pool(annotations[POOL_ANNOTATION])
        elif (key := ctl.plan_uids.get(labels.get(PLAN_UID_LABEL, ""))) is not None:
            await ctl.plan(*key)

    @kopf.on.event(JOBSET_GROUP, JOBSET_VERSION, "jobsets", registry=registry, id="child-jobset")
    async def jobset_event(labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
        ctl = _controller(memo)
        if (key := ctl.plan_uids.get(labels.get(PLAN_UID_LABEL, ""))) is not None:
            await ctl.plan(*key)

    @kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, "workloads", registry=registry, id="kueue-workload")
    async def workload_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        """Kueue admitted, preempted or finished the Workload of a plan's JobSet or Job."""
        ctl = _controller(memo)
        namespace = str(body.get("metadata", {}).get("namespace") or "")
        for ref in body.get("metadata", {}).get("ownerReferences") or []:
            key = ctl.plan_for_owner(namespace, str(ref.get("kind")), str(ref.get("name")))
            if key is not None:
                await ctl.plan(*key)
                return

    @kopf.on.event("v1", "events", registry=registry, id="failed-create")
    async def event_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        ctl = _controller(memo)
        involved = body.get("involvedObject") or {}
        uid = str(involved.get("uid") or "")
        if type == "DELETED" or not uid:
            return
        ctl.rejected[uid] = str(body.get("message") or "")
        key = ctl.plan_for_job(
            str(involved.get("namespace") or ""), str(involved.get("name") or "")
        )
        if key is not None:
            await ctl.plan(*key)
