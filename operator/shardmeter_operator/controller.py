"""The reconcile loop around kopf's watches: what the operator knows (pools, plans, the Job
controller's pod-creation failures), one reconcile at a time per object, requeues, and the
only place that writes status and posts Events.

kopf delivers watch events (handlers.py); nothing here uses kopf timers or daemons, because
kopf puts a finalizer on every object that has one, and a finalizer makes deleting a plan (or
its namespace) hang once the operator is uninstalled. Instead:

* a pool, plan, child Job, coefficients ConfigMap or ``FailedCreate`` Event change triggers
  the reconcile of the object it concerns (pool changes fan out to the plans that use it);
* a reconcile reads the object afresh, computes the whole status from the typed models,
  writes it only when it changed, and posts its Events;
* a reconcile that must come back later (a benchmark retry, a relaunch waiting for old
  children, an API error) is requeued in-process; a requeued reconcile runs only while this
  replica leads (kopf peering: the highest priority among live peers).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

import kopf
import structlog

from shardmeter.cost.observed import ObservedStepSample
from shardmeter_operator import metrics
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.gpupool import reconcile_pool
from shardmeter_operator.kube import Kube
from shardmeter_operator.plancontext import PlanContext, PoolView, needs_work, referenced_pools
from shardmeter_operator.recalibrate import reset_requested
from shardmeter_operator.resources import (
    GROUP,
    VERSION,
    GPUPoolSpec,
    GPUPoolStatus,
    TrainingPlanStatus,
)
from shardmeter_operator.trainingplan import reconcile_plan
from shardmeter_operator.workload_jobset import jobset_name

log = structlog.get_logger("shardmeter_operator")
Key = tuple[str, str, str]
"""("plan", namespace, name) or ("pool", "", name)."""
RETRY_FIRST_S, RETRY_MAX_S = 2.0, 300.0
SAMPLES_DELAY_S = 1.0
"""Observed samples reach their pool this long after a plan's reconcile (several plans'
samples are merged in one pool reconcile)."""
STUCK_AFTER_S = 600.0
"""A reconcile running longer than this fails the liveness probe (a hung worker thread)."""


class Controller:
    def __init__(
        self,
        cfg: OperatorConfig,
        kube: Kube,
        *,
        peering: str | None = None,
        priority: int = 0,
    ) -> None:
        self.cfg, self.kube = cfg, kube
        self.peering, self.priority = peering, priority
        self.pools: dict[str, PoolView] = {}
        self.plans: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.plan_uids: dict[str, tuple[str, str]] = {}
        self.rejected: dict[str, str] = {}
        """Job UID → the latest FailedCreate message (pods refused by quota, PodSecurity…)."""
        self.samples: dict[str, dict[tuple[str, str, str], ObservedStepSample]] = {}
        """Pool → observed step samples not yet merged into its coefficients document."""
        self._locks: dict[Key, asyncio.Lock] = {}
        self._queued: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._failures: dict[Key, int] = {}
        self.running: dict[Key, float] = {}
        self._stop = threading.Event()
        self.context = contextvars.copy_context()
        """kopf's context (Events are posted through it), for work that starts outside kopf's
        handlers: requeues and the ConfigMap watch. Refreshed by every handler call."""
        self._watcher: asyncio.Future[None] | None = None

    # ---- what the watches tell us -----------------------------------------------------------
    def in_handler(self) -> None:
        """Called by every kopf handler: remember kopf's context for later work."""
        self.context = contextvars.copy_context()

    def observe_pool(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        name = str(body["metadata"]["name"])
        if deleted:
            self.pools.pop(name, None)
            return
        generation = int(body["metadata"].get("generation") or 0)
        known = self.pools.get(name)
        problem = known.problem if known is not None and known.generation == generation else None
        if problem is None:
            try:
                GPUPoolSpec.model_validate(dict(body.get("spec") or {}))
                problem = ""
            except Exception as exc:  # a pydantic ValidationError: the pool's Valid says it all
                problem = str(exc).splitlines()[0][:200]
        self.pools[name] = PoolView(
            dict(body.get("spec") or {}), dict(body.get("status") or {}), generation, problem
        )

    def observe_plan(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        meta = body["metadata"]
        key = (str(meta.get("namespace") or ""), str(meta["name"]))
        if deleted:
            self.plans.pop(key, None)
            self.plan_uids.pop(str(meta.get("uid")), None)
            return
        self.plans[key] = {
            "metadata": dict(meta),
            "spec": body.get("spec"),
            "status": body.get("status"),
        }
        self.plan_uids[str(meta.get("uid"))] = key

    def pool_needs_work(self, body: Mapping[str, Any]) -> bool:
        """Whether a GPUPool event asks for a reconcile beyond a new spec: a reset of its
        observed correction (the annotation changes no generation)."""
        return reset_requested(body)

    def plans_need_work(self, namespace: str, name: str) -> bool:
        body = self.plans.get((namespace, name))
        return body is not None and needs_work(body, self.pools)

    def plan_for_job(self, namespace: str, job: str) -> tuple[str, str] | None:
        """The launched plan whose island Job this is (from the plans' recorded Jobs)."""
        for (ns, name), body in self.plans.items():
            if ns == namespace and job in ((body.get("status") or {}).get("jobs") or []):
                return ns, name
        return None

    def plan_for_owner(self, namespace: str, kind: str, name: str) -> tuple[str, str] | None:
        """The launched plan that created the Job or JobSet ``name`` (a Kueue Workload's
        owner): an island Job by the plans' recorded Jobs, a JobSet by its name."""
        if kind == "Job":
            return self.plan_for_job(namespace, name)
        if kind == "JobSet":
            return next(
                (k for k in self.plans if k[0] == namespace and jobset_name(k[1]) == name), None
            )
        return None

    def plans_using(self, pool: str) -> list[tuple[str, str]]:
        return [k for k, b in self.plans.items() if pool in referenced_pools(b.get("spec") or {})]

    # ---- reconciling ------------------------------------------------------------------------
    async def plan(self, namespace: str, name: str) -> None:
        await self._run(("plan", namespace, name), self._reconcile_plan)

    async def pool(self, name: str) -> None:
        await self._run(("pool", "", name), self._reconcile_pool)

    async def fan_out(self, pool: str) -> None:
        """Reconcile the plans that use ``pool`` and need it (see ``needs_work``)."""
        for namespace, name in self.plans_using(pool):
            body = self.plans.get((namespace, name))
            if body is not None and needs_work(body, self.pools):
                await self.plan(namespace, name)

    async def _run(self, key: Key, work: Callable[[Key], Awaitable[float | None]]) -> None:
        if key in self._queued:
            return  # a reconcile that has not started yet will see this change too
        self._queued.add(key)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            self._queued.discard(key)
            kind = "trainingplan" if key[0] == "plan" else "gpupool"
            metrics.reconcile_total.labels(kind).inc()
            started = self.running[key] = time.monotonic()
            try:
                requeue = await work(key)
                self._failures.pop(key, None)
            except Exception as exc:
                metrics.reconcile_errors_total.labels(kind).inc()
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                requeue = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (failures - 1))
                log.warning(
                    "reconcile failed",
                    obj=_show(key),
                    error=str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__,
                    retry_s=requeue,
                )
            finally:
                self.running.pop(key, None)
                metrics.reconcile_duration_seconds.labels(kind).observe(time.monotonic() - started)
            if requeue is not None:
                self.requeue(key, requeue)

    def requeue(self, key: Key, delay_s: float) -> None:
        """Reconcile ``key`` again in ``delay_s`` (the earliest of several requests wins)."""
        loop = asyncio.get_running_loop()
        due = loop.time() + delay_s
        current = self._timers.get(key)
        if current is not None and not current.cancelled() and current.when() <= due:
            return
        if current is not None:
            current.cancel()
        self._timers[key] = loop.call_at(
            due, lambda: asyncio.ensure_future(self._requeued(key)), context=self.context
        )

    async def _requeued(self, key: Key) -> None:
        self._timers.pop(key, None)
        if not await self.is_active():
            return  # another replica leads; it reconciles on its own events
        if key[0] == "plan":
            await self.plan(key[1], key[2])
        else:
            await self.pool(key[2])

    def watch_coefficients(self) -> None:
        """Follow edits of the coefficients ConfigMaps (a namespaced watch in a thread): the
        pool's status, and with it every plan that uses the pool, follows."""
        from shardmeter_operator.manifests import COMPONENT_LABEL, POOL_ANNOTATION

        loop = asyncio.get_running_loop()

        def on_event(type_: str, obj: dict[str, Any]) -> None:
            pool = ((obj.get("metadata") or {}).get("annotations") or {}).get(POOL_ANNOTATION)
            if pool and type_ in ("ADDED", "MODIFIED") and pool in self.pools:
                key: Key = ("pool", "", pool)
                loop.call_soon_threadsafe(
                    lambda: asyncio.ensure_future(self._requeued(key)), context=self.context
                )

        self._stop.clear()
        self._watcher = asyncio.ensure_future(
            asyncio.to_thread(
                self.kube.watch_configmaps,
                self.cfg.namespace,
                f"{COMPONENT_LABEL}=coefficients",
                on_event,
                self._stop,
            )
        )

    def stop(self) -> None:
        self._stop.set()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    async def close(self) -> None:
        self.stop()
        self.kube.stop_watches()
        if self._watcher is not None:
            await asyncio.wait({self._watcher}, timeout=5)

    async def _reconcile_plan(self, key: Key) -> float | None:
        _, namespace, name = key
        body = await self.kube.get_custom(GROUP, VERSION, "trainingplans", namespace, name)
        if body is None:
            return None

        async def write(status: TrainingPlanStatus) -> None:
            await self._write(body, "trainingplans", status.model_dump(by_alias=True, mode="json"))

        ctx = PlanContext(self.cfg, self.kube, dict(self.pools), dict(self.rejected), write)
        result = await reconcile_plan(body, ctx)
        new = result.status.model_dump(by_alias=True, mode="json")
        changed = await self._write(body, "trainingplans", new)
        self._post(body, result.events)
        for pool, samples in result.samples.items():  # the pool's reconcile merges them
            self.samples.setdefault(pool, {}).update({s.key: s for s in samples})
            self.requeue(("pool", "", pool), SAMPLES_DELAY_S)
        if changed or result.events:
            log.info(
                "reconciled",
                obj=_show(key),
                phase=result.status.phase.value,
                events=[e[1] for e in result.events][:5],
            )
        return result.requeue_s

    async def _reconcile_pool(self, key: Key) -> float | None:
        body = await self.kube.get_custom(GROUP, VERSION, "gpupools", None, key[2])
        if body is None:
            return None
        pending = dict(self.samples.get(key[2], {}))
        result = await reconcile_pool(body, self.cfg, self.kube, list(pending.values()))
        merged = self.samples.get(key[2], {})
        for k, sample in pending.items():  # newer samples that arrived meanwhile stay
            if merged.get(k) is sample:
                del merged[k]
        changed = await self._write(
            body, "gpupools", result.status.model_dump(by_alias=True, mode="json")
        )
        self._post(body, result.events)
        if changed or result.events:
            log.info(
                "reconciled",
                obj=_show(key),
                source=result.status.source,
                benchmark=result.status.benchmark_phase.value,
                events=[e[1] for e in result.events][:5],
            )
        return result.requeue_s

    async def _write(self, body: Mapping[str, Any], plural: str, status: dict[str, Any]) -> bool:
        """Merge-patch the whole status (``None`` fields are removed) when it changed."""
        model = TrainingPlanStatus if plural == "trainingplans" else GPUPoolStatus
        current = model.model_validate(body.get("status") or {}).model_dump(
            by_alias=True, mode="json"
        )
        if current == status:
            return False
        meta = body["metadata"]
        await self.kube.patch_custom_status(
            GROUP, VERSION, plural, meta.get("namespace"), meta["name"], status
        )
        body["status"] = status  # type: ignore[index]  # a later write in this reconcile compares with it
        return True

    def _post(self, body: Mapping[str, Any], events: list[tuple[str, str, str]]) -> None:
        for type_, reason, message in events:
            kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message[:1024])

    # ---- leadership and health --------------------------------------------------------------
    async def is_active(self) -> bool:
        """Whether this replica leads: no live kopf peer with a higher priority."""
        if self.peering is None:
            return True
        try:
            obj = await self.kube.get_custom(
                "kopf.dev", "v1", "clusterkopfpeerings", None, self.peering
            )
        except Exception:
            return False
        return leads(self.priority, (obj or {}).get("status") or {})

    def health(self) -> dict[str, Any]:
        """For kopf's liveness probe: fails when a reconcile has hung (a stuck worker thread)."""
        now = time.monotonic()
        oldest = max((now - t for t in self.running.values()), default=0.0)
        if oldest > STUCK_AFTER_S:
            raise RuntimeError(f"a reconcile has been running for {oldest:.0f} s")
        return {
            "pools": len(self.pools),
            "plans": len(self.plans),
            "reconciling": len(self.running),
            "oldest_reconcile_s": round(oldest, 1),
        }


def leads(priority: int, peers: Mapping[str, Any], now: datetime | None = None) -> bool:
    """From a kopf peering object's status ({id: {priority, lastseen, lifetime}}): whether no
    live peer has a higher priority than ``priority``."""
    now = now or datetime.now(UTC)
    for info in peers.values():
        if not isinstance(info, Mapping):
            continue
        seen = str(info.get("lastseen") or "")
        try:
            last = datetime.fromisoformat(seen.replace("Z", "+00:00"))
            if last.tzinfo is None:
                last = last.replace(tzinfo=UTC)
        except ValueError:
            continue
        alive = (now - last).total_seconds() <= float(info.get("lifetime") or 60)
        if alive and int(info.get("priority") or 0) > priority:
            return False
    return True


def random_priority() -> int:
    """kopf pauses *every* peer when two share a priority: each replica draws its own."""
    return random.SystemRandom().randint(1, 2**31 - 1)


def _show(key: Key) -> str:
    kind, namespace, name = key
    return f"TrainingPlan {namespace}/{name}" if kind == "plan" else f"GPUPool {name}"
