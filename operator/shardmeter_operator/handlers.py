"""kopf wiring, thin: watch events go to the :class:`~shardmeter_operator.controller.Controller`.

Only ``on.event`` handlers: no timers, daemons or mandatory delete
handlers, so kopf never puts a finalizer on a GPUPool or TrainingPlan (deleting one — or its
namespace — never waits for the operator). Server-side selectors keep the watches of Jobs,
and Events to the operator's own; the coefficients ConfigMaps are watched in the operator's
namespace only (``Controller.watch_coefficients``)."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from shardmeter_operator import metrics
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.controller import Controller
from shardmeter_operator.kube import Kube, connection_info, load_configuration
from shardmeter_operator.manifests import (
    COMPONENT_LABEL,
    MANAGED_BY,
    PLAN_UID_LABEL,
    POOL_ANNOTATION,
)
from shardmeter_operator.resources import GROUP, VERSION, TrainingPlanStatus

GPUPOOLS = (GROUP, VERSION, "gpupools")
PLANS = (GROUP, VERSION, "trainingplans")
OURS = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
FAILED_CREATE = "reason=FailedCreate,involvedObject.kind=Job"


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.posting.level = logging.WARNING  # Events are posted explicitly, not per log line
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        settings.watching.label_selectors["batch", "v1", "jobs"] = OURS
        settings.watching.field_selectors["v1", "events"] = FAILED_CREATE
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

    @kopf.on.event(*GPUPOOLS, registry=registry, id="gpupool")
    async def gpupool_event(
        type: str | None, body: kopf.Body, name: str, memo: kopf.Memo, **_: Any
    ) -> None:
        ctl: Controller = memo.controller
        ctl.in_handler()
        if type == "DELETED":
            ctl.observe_pool(body, deleted=True)
            metrics.forget_pool(name)
        else:
            ctl.observe_pool(body)
            status = body.get("status") or {}
            generation = int(body["metadata"].get("generation") or 0)
            if (
                type is None
                or status.get("observedGeneration") != generation
                or ctl.pool_needs_work(body)
            ):
                await ctl.pool(name)  # new spec, (re)start or a reset: re-read ConfigMap, Job
        await ctl.fan_out(name)

    @kopf.on.event(*PLANS, registry=registry, id="trainingplan")
    async def trainingplan_event(
        type: str | None,
        body: kopf.Body,
        name: str,
        namespace: str | None,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        ctl: Controller = memo.controller
        ctl.in_handler()
        if type == "DELETED":
            ctl.observe_plan(body, deleted=True)
            metrics.forget_plan(namespace or "", name)
            return
        ctl.observe_plan(body)
        launched = TrainingPlanStatus.model_validate(body.get("status") or {}).launch is not None
        if (type is None and launched) or ctl.plans_need_work(namespace or "", name):
            await ctl.plan(namespace or "", name)

    @kopf.on.event("batch", "v1", "jobs", registry=registry, id="child-job")
    async def job_event(
        body: kopf.Body,
        labels: kopf.Labels,
        annotations: kopf.Annotations,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        ctl: Controller = memo.controller
        ctl.in_handler()
        if labels.get(COMPONENT_LABEL) == "bench" and POOL_ANNOTATION in annotations:
            await ctl.pool(annotations[POOL_ANNOTATION])
        elif (key := ctl.plan_uids.get(labels.get(PLAN_UID_LABEL, ""))) is not None:
            await ctl.plan(*key)

    @kopf.on.event("v1", "events", registry=registry, id="failed-create")
    async def event_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        ctl: Controller = memo.controller
        ctl.in_handler()
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

    return registry
