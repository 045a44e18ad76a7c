"""kopf handlers: thin — each parses what kopf hands it, calls a reconcile function, and
patches the status it returns. `build_registry` wires them with the configured intervals."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from shardmeter_operator import metrics
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.gpupool import reconcile_pool
from shardmeter_operator.kube import Kube, connection_info, load_configuration
from shardmeter_operator.resources import GROUP, VERSION
from shardmeter_operator.trainingplan import PoolView, needs_work, reconcile_plan

GPUPOOLS = (GROUP, VERSION, "gpupools")
PLANS = (GROUP, VERSION, "trainingplans")


async def _timed(kind: str, work: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    metrics.reconcile_total.labels(kind).inc()
    started = time.perf_counter()
    try:
        return await work()
    except Exception:
        metrics.reconcile_errors_total.labels(kind).inc()
        raise
    finally:
        metrics.reconcile_duration_seconds.labels(kind).observe(time.perf_counter() - started)


def _apply(patch: kopf.Patch, status: dict[str, Any]) -> None:
    for key, value in status.items():
        patch.status[key] = value


def _pools(index: kopf.Index[str, PoolView]) -> dict[str, PoolView]:
    return {name: next(iter(store)) for name, store in index.items() if store}


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    interval = config.recheck_interval_s

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration"
        )
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        if getattr(memo, "kube", None) is None:
            memo.kube = Kube(load_configuration(memo.config.kubeconfig))

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        kube = getattr(memo, "kube", None)
        if kube is not None:
            kube.close()

    @kopf.on.login(registry=registry)
    def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
        return connection_info(load_configuration(memo.config.kubeconfig))

    @kopf.index(*GPUPOOLS, registry=registry, id="gpupool_index")
    def gpupool_index(
        name: str, spec: kopf.Spec, status: kopf.Status, **_: Any
    ) -> dict[str, PoolView]:
        return {name: PoolView(dict(spec), dict(status))}

    # ---- GPUPool ------------------------------------------------------------------------------
    async def pool(
        name: str,
        meta: kopf.Meta,
        spec: kopf.Spec,
        status: kopf.Status,
        body: kopf.Body,
        patch: kopf.Patch,
        memo: kopf.Memo,
    ) -> None:
        result = await _timed(
            "gpupool",
            lambda: reconcile_pool(
                name,
                str(meta["uid"]),
                int(meta.get("generation") or 1),
                dict(spec),
                dict(status),
                memo.config,
                memo.kube,
                body,
            ),
        )
        _apply(patch, result)

    @kopf.on.create(*GPUPOOLS, registry=registry, id="gpupool")
    @kopf.on.update(*GPUPOOLS, registry=registry, id="gpupool")
    @kopf.on.resume(*GPUPOOLS, registry=registry, id="gpupool")
    async def gpupool_changed(
        name: str,
        meta: kopf.Meta,
        spec: kopf.Spec,
        status: kopf.Status,
        body: kopf.Body,
        patch: kopf.Patch,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        await pool(name, meta, spec, status, body, patch, memo)

    @kopf.timer(*GPUPOOLS, interval=interval, idle=interval, registry=registry, id="gpupool-poll")
    async def gpupool_poll(
        name: str,
        meta: kopf.Meta,
        spec: kopf.Spec,
        status: kopf.Status,
        body: kopf.Body,
        patch: kopf.Patch,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        """Follows the benchmark Job (retries, adoption) without watching Jobs cluster-wide."""
        if (spec.get("benchmark") or {}).get("enabled") and status.get("benchmarkPhase") in (
            "Running",
            "BackOff",
        ):
            await pool(name, meta, spec, status, body, patch, memo)

    @kopf.on.delete(*GPUPOOLS, registry=registry, optional=True, id="gpupool-deleted")
    async def gpupool_deleted(name: str, **_: Any) -> None:
        metrics.forget_pool(name)

    # ---- TrainingPlan -------------------------------------------------------------------------
    async def plan(
        name: str,
        namespace: str,
        meta: kopf.Meta,
        spec: kopf.Spec,
        status: kopf.Status,
        body: kopf.Body,
        patch: kopf.Patch,
        memo: kopf.Memo,
        pools: dict[str, PoolView],
    ) -> None:
        result = await _timed(
            "trainingplan",
            lambda: reconcile_plan(
                name,
                namespace,
                str(meta["uid"]),
                int(meta.get("generation") or 1),
                dict(spec),
                dict(status),
                pools,
                memo.config,
                memo.kube,
                body,
            ),
        )
        _apply(patch, result)

    @kopf.on.create(*PLANS, registry=registry, id="trainingplan")
    @kopf.on.update(*PLANS, registry=registry, id="trainingplan")
    @kopf.on.resume(*PLANS, registry=registry, id="trainingplan")
    async def trainingplan_changed(
        name: str,
        namespace: str | None,
        meta: kopf.Meta,
        spec: kopf.Spec,
        status: kopf.Status,
        body: kopf.Body,
        patch: kopf.Patch,
        memo: kopf.Memo,
        gpupool_index: kopf.Index[str, PoolView],
        **_: Any,
    ) -> None:
        await plan(
            name, namespace or "", meta, spec, status, body, patch, memo, _pools(gpupool_index)
        )

    @kopf.timer(
        *PLANS, interval=interval, idle=interval, registry=registry, id="trainingplan-recheck"
    )
    async def trainingplan_recheck(
        name: str,
        namespace: str | None,
        meta: kopf.Meta,
        spec: kopf.Spec,
        status: kopf.Status,
        body: kopf.Body,
        patch: kopf.Patch,
        memo: kopf.Memo,
        gpupool_index: kopf.Index[str, PoolView],
        **_: Any,
    ) -> None:
        """Re-plans (or, once launched, re-evaluates) when a pool's coefficients changed or a
        missing pool appeared."""
        pools = _pools(gpupool_index)
        if needs_work(int(meta.get("generation") or 1), dict(spec), dict(status), pools):
            await plan(name, namespace or "", meta, spec, status, body, patch, memo, pools)

    @kopf.on.delete(*PLANS, registry=registry, optional=True, id="trainingplan-deleted")
    async def trainingplan_deleted(name: str, namespace: str | None, **_: Any) -> None:
        metrics.forget_plan(namespace or "", name)

    return registry
