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
  replica leads (kopf peering: the highest priority among live peers). How soon a failed one
  runs again follows the cause and the server (:mod:`~.k8s.retry`);
* Events go through the status (:mod:`~.events`: none lost, none posted twice) and the
  gauges are derived from the stored status (:func:`~.metrics.publish_plan`), on every
  reconcile and every watch event;
* every status write is conditional on the resourceVersion the reconcile read: a plan
  deleted — or deleted and created again — meanwhile gets no status and no children
  (its deletion, seen on the watch, also stops a reconcile between two creates);
* after :meth:`Controller.close` nothing runs any more: no reconcile, no requeue.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import structlog

from shardmeter.cost.observed import ObservedStepSample
from shardmeter_operator import events, metrics
from shardmeter_operator.api import (
    GROUP,
    VERSION,
    EventOutbox,
    GPUPoolSpec,
    GPUPoolStatus,
    TrainingPlanStatus,
)
from shardmeter_operator.api.errors import GoneError
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.decision import PoolView
from shardmeter_operator.gpupool.correction import reset_requested
from shardmeter_operator.gpupool.reconcile import reconcile_pool
from shardmeter_operator.k8s.children import list_children
from shardmeter_operator.k8s.client import Kube
from shardmeter_operator.k8s.clusters import WorkerClusters
from shardmeter_operator.k8s.retry import retry_delay
from shardmeter_operator.render.jobset import jobset_name
from shardmeter_operator.trainingplan.reconcile import PlanContext, reconcile_plan
from shardmeter_operator.trainingplan.validate import needs_work, referenced_pools

log = structlog.get_logger("shardmeter_operator")
Key = tuple[str, str, str]
"""("plan", namespace, name) or ("pool", "", name)."""
Status = TrainingPlanStatus | GPUPoolStatus
SAMPLES_DELAY_S = 1.0
"""Observed samples reach their pool this long after a plan's reconcile (several plans'
samples are merged in one pool reconcile)."""
STUCK_AFTER_S = 600.0
"""A reconcile running longer than this fails the liveness probe (a hung worker thread)."""
POOLS_KNOWN_TIMEOUT_S = 30.0
"""How long a plan's reconcile waits at start for the first listing of GPUPools."""
TOMBSTONE_S = 600.0
"""How long the UID of a deleted plan is remembered (a reconcile that read it before its
deletion runs no longer than this: ``STUCK_AFTER_S``)."""


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
        self._errors: dict[Key, int] = {}
        """Failures of the ``error`` cause per object (:mod:`~.k8s.retry`), of requeued runs."""
        self._rng = random.Random()
        self.deleted: dict[str, float] = {}
        """UID of a plan whose deletion was seen → when (monotonic)."""
        self.closed = False
        self.pools_known = asyncio.Event()
        """Set once GPUPools were listed: plans wait for it (``POOLS_KNOWN_TIMEOUT_S``)."""
        self._background: set[asyncio.Future[None]] = set()
        self.running: dict[Key, float] = {}
        self._stop = threading.Event()
        self.context = contextvars.copy_context()
        """kopf's context (Events are posted through it), for work that starts outside kopf's
        handlers: requeues and the ConfigMap watch. Refreshed by every handler call."""
        self._watcher: asyncio.Future[None] | None = None
        self.workers = WorkerClusters(kube, cfg.kueue_namespace, cfg.read_worker_kubeconfigs)
        """MultiKueue's worker clusters, for observing islands that run there."""

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
        uid = str(meta.get("uid"))
        if deleted:
            self.plans.pop(key, None)
            self.plan_uids.pop(uid, None)
            self._bury(uid)
            return
        if uid in self.deleted:
            return  # a late event of the deleted plan
        metrics.publish_plan(*key, TrainingPlanStatus.model_validate(body.get("status") or {}))
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
            for key, body in self.plans.items():
                if key[0] != namespace:
                    continue
                launch = ((body.get("status") or {}).get("launch")) or {}
                sites = {str(s.get("jobSet")) for s in launch.get("sites") or []}
                if jobset_name(key[1]) == name or name in sites:
                    return key
        return None

    def plans_using(self, pool: str) -> list[tuple[str, str]]:
        return [k for k, b in self.plans.items() if pool in referenced_pools(b.get("spec") or {})]

    def plans_listed(self, namespace: str | None, listed: list[dict[str, Any]]) -> None:
        """A complete listing of TrainingPlans (``namespace`` None: all): the known plans it
        does not hold were deleted while the watch was away (their DELETED events are lost
        for good: :mod:`~.k8s.watchguard`)."""
        uids = {(o.get("metadata") or {}).get("uid") for o in listed}
        for (ns, name), body in list(self.plans.items()):
            if (namespace is None or ns == namespace) and body["metadata"].get("uid") not in uids:
                log.info("deleted while unwatched", obj=_show(("plan", ns, name)))
                self.observe_plan(body, deleted=True)
                self._spawn(self.plan_deleted(ns, name, str(body["metadata"].get("uid"))))

    def pools_listed(self, _: str | None, listed: list[dict[str, Any]]) -> None:
        """A complete listing of GPUPools: the pools it holds are known at once (their
        handlers may run later), those it does not hold are forgotten. The first one lets
        plans be reconciled (at a start, kopf may list the plans before the pools: a plan
        decided then would find its pools missing)."""
        for body in listed:
            self.observe_pool(body)
        names = {str((o.get("metadata") or {}).get("name")) for o in listed}
        self.pools_known.set()
        for name in [n for n in self.pools if n not in names]:
            log.info("deleted while unwatched", obj=_show(("pool", "", name)))
            self.observe_pool({"metadata": {"name": name}}, deleted=True)
            metrics.forget_pool(name)
            self._spawn(self.fan_out(name))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background (in kopf's context), holding it until it is done."""
        task = asyncio.get_running_loop().create_task(work, context=self.context)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _bury(self, uid: str) -> None:
        now = time.monotonic()
        self.deleted[uid] = now
        for old in [u for u, t in self.deleted.items() if now - t > TOMBSTONE_S]:
            del self.deleted[old]

    async def plan_deleted(self, namespace: str, name: str, uid: str) -> None:
        """Once no reconcile of the deleted plan runs: drop its series, and delete any child
        a reconcile that read the plan before its deletion created after it (the watch's
        DELETED can arrive late: its children went with the plan, these came after). Its
        UID is buried, so no later reconcile creates or writes anything for it."""
        key: Key = ("plan", namespace, name)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        async with self._locks.setdefault(key, asyncio.Lock()):
            if (namespace, name) not in self.plans:  # not created again meanwhile
                metrics.forget_plan(namespace, name)
                self._errors.pop(key, None)
            await self._sweep(namespace, uid)

    async def _sweep(self, namespace: str, uid: str, attempts: int = 8) -> None:
        """Delete the children a deleted plan (``uid``) still owns, retrying API faults."""
        for attempt in range(1, attempts + 1):
            try:
                for child in await list_children(self.kube, namespace, uid):
                    meta = child["metadata"]
                    owned = any(r.get("uid") == uid for r in meta.get("ownerReferences") or [])
                    if owned and not meta.get("deletionTimestamp"):
                        log.info("deleting a late child", child=f"{child['kind']}/{meta['name']}")
                        await self.kube.delete(
                            child["apiVersion"], child["kind"], namespace, meta["name"]
                        )
                return
            except Exception as exc:
                if self.closed or attempt == attempts:
                    log.warning("late children not swept", uid=uid, error=str(exc)[:200])
                    return
                delay = retry_delay(
                    exc,
                    outage_failures=self.kube.health.failures,
                    object_errors=attempt,
                    rng=self._rng,
                )
                await asyncio.sleep(delay.delay_s)

    # ---- reconciling ------------------------------------------------------------------------
    async def plan(self, namespace: str, name: str, *, retry: bool = False) -> None:
        if not self.pools_known.is_set():  # (re)start: a plan is decided against every pool
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.pools_known.wait(), POOLS_KNOWN_TIMEOUT_S)
        await self._run(("plan", namespace, name), self._reconcile_plan, retry)

    async def pool(self, name: str, *, retry: bool = False) -> None:
        await self._run(("pool", "", name), self._reconcile_pool, retry)

    async def fan_out(self, pool: str) -> None:
        """Reconcile the plans that use ``pool`` and need it (see ``needs_work``)."""
        for namespace, name in self.plans_using(pool):
            body = self.plans.get((namespace, name))
            if body is not None and needs_work(body, self.pools):
                await self.plan(namespace, name)

    async def _run(
        self, key: Key, work: Callable[[Key], Awaitable[float | None]], retry: bool = False
    ) -> None:
        """One reconcile of ``key`` at a time; a failure comes back after the delay its cause
        calls for (:mod:`~.k8s.retry`). ``retry``: this run is a requeued one (only those count
        towards the object's own backoff)."""
        if key in self._queued or self.closed:
            return  # a reconcile that has not started yet will see this change too
        self._queued.add(key)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            self._queued.discard(key)
            if self.closed:
                return
            kind = "trainingplan" if key[0] == "plan" else "gpupool"
            metrics.reconcile_total.labels(kind).inc()
            started = self.running[key] = time.monotonic()
            try:
                requeue = await work(key)
                self._errors.pop(key, None)
            except GoneError as exc:
                log.info("reconcile stopped", obj=_show(key), reason=str(exc)[:200])
                requeue = None
            except Exception as exc:
                metrics.reconcile_errors_total.labels(kind).inc()
                errors = self._errors.get(key, 0) + (1 if retry else 0)
                decided = retry_delay(
                    exc,
                    outage_failures=self.kube.health.failures,
                    object_errors=max(1, errors),
                    rng=self._rng,
                )
                if decided.cause == "error":
                    self._errors[key] = max(1, errors)
                requeue = decided.delay_s
                log.warning(
                    "reconcile failed",
                    obj=_show(key),
                    error=str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__,
                    cause=decided.cause,
                    retry_s=round(requeue, 2),
                )
            finally:
                self.running.pop(key, None)
                metrics.reconcile_duration_seconds.labels(kind).observe(time.monotonic() - started)
            if requeue is not None:
                self.requeue(key, requeue)

    def requeue(self, key: Key, delay_s: float) -> None:
        """Reconcile ``key`` again in ``delay_s`` (the earliest of several requests wins)."""
        if self.closed:
            return
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
        if self.closed or not await self.is_active():
            return  # stopping, or another replica leads: it reconciles on its own events
        if key[0] == "plan":
            await self.plan(key[1], key[2], retry=True)
        else:
            await self.pool(key[2], retry=True)

    def watch_coefficients(self) -> None:
        """Follow edits of the coefficients ConfigMaps (a namespaced watch in a thread): the
        pool's status, and with it every plan that uses the pool, follows."""
        from shardmeter_operator.render.labels import COMPONENT_LABEL, POOL_ANNOTATION

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
        self.closed = True
        self._stop.set()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop: no new reconcile or requeue from now on; wait (bounded) for those running."""
        self.stop()
        self.kube.stop_watches()
        self.workers.close()
        pending = [t for t in [self._watcher] if t is not None]
        deadline = time.monotonic() + timeout_s
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if pending:
            await asyncio.wait(pending, timeout=max(0.1, deadline - time.monotonic()))
        if self.running:
            log.warning("stopping with reconciles still running", running=len(self.running))

    async def _reconcile_plan(self, key: Key) -> float | None:
        _, namespace, name = key
        body = await self.kube.get_custom(GROUP, VERSION, "trainingplans", namespace, name)
        uid = str(((body or {}).get("metadata") or {}).get("uid") or "")
        if body is None or uid in self.deleted:
            return None
        stored = TrainingPlanStatus.model_validate(body.get("status") or {}).events
        await self._catch_up_pools(referenced_pools(body.get("spec") or {}))

        written: list[tuple[EventOutbox, int]] = []

        async def write(status: TrainingPlanStatus, decided: Sequence[events.Event]) -> None:
            # the launch decision, before any child exists: its Events pending in it
            box = events.outbox(stored, decided, name, uid)
            status.events = box
            await self._write(body, "trainingplans", status)
            written.append((box, len(decided)))

        ctx = PlanContext(
            self.cfg,
            self.kube,
            dict(self.pools),
            dict(self.rejected),
            write,
            alive=lambda: uid not in self.deleted,
            workers=self.workers,
        )
        result = await reconcile_plan(body, ctx)
        if result.search_s is not None:
            metrics.plan_search_seconds.observe(result.search_s)
        # Events decided after a mid-reconcile write belong to the transition from the state
        # it stored: a reconcile that starts from that state decides them again, by the same
        # names (events.py)
        start, done = written[-1] if written else (stored, 0)
        changed = await self._settle(
            body, "trainingplans", result.status, start, result.events[done:]
        )
        if uid not in self.deleted:
            metrics.publish_plan(namespace, name, result.status)
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

    async def _catch_up_pools(self, names: set[str]) -> None:
        """The pools a plan names that the GPUPool watch has not delivered yet, read from the
        API: a plan is found to lack a pool only when the API server lacks it (the watch may
        lag behind, e.g. when pools and plans are applied together)."""
        for name in sorted(n for n in names if n not in self.pools):
            pool = await self.kube.get_custom(GROUP, VERSION, "gpupools", None, name)
            if pool is not None:
                self.observe_pool(pool)

    async def _reconcile_pool(self, key: Key) -> float | None:
        body = await self.kube.get_custom(GROUP, VERSION, "gpupools", None, key[2])
        if body is None:
            return None
        stored = GPUPoolStatus.model_validate(body.get("status") or {}).events
        pending = dict(self.samples.get(key[2], {}))
        result = await reconcile_pool(body, self.cfg, self.kube, list(pending.values()))
        merged = self.samples.get(key[2], {})
        for k, sample in pending.items():  # newer samples that arrived meanwhile stay
            if merged.get(k) is sample:
                del merged[k]
        changed = await self._settle(body, "gpupools", result.status, stored, result.events)
        metrics.publish_pool(key[2], result.gauges)
        if changed or result.events:
            log.info(
                "reconciled",
                obj=_show(key),
                source=result.status.source,
                benchmark=result.status.benchmark_phase.value,
                events=[e[1] for e in result.events][:5],
            )
        return result.requeue_s

    async def _settle(
        self,
        body: dict[str, Any],
        plural: str,
        status: Status,
        stored: EventOutbox | None,
        decided: Sequence[events.Event],
    ) -> bool:
        """The end of a reconcile: post every pending Event (those the stored status holds,
        and this reconcile's), then write the final status with none pending."""
        meta = body["metadata"]
        box = events.outbox(stored, decided, str(meta["name"]), str(meta["uid"]))
        namespace = str(meta.get("namespace") or events.CLUSTER_SCOPED_NAMESPACE)
        for pending in box.pending:
            await self.kube.post_event(events.manifest(pending, body, namespace))
        status.events = events.posted(box)
        return await self._write(body, plural, status)

    async def _write(self, body: dict[str, Any], plural: str, status: Status) -> bool:
        """Merge-patch the whole status (``None`` fields are removed) when it changed, on the
        condition that the object is still the version the reconcile read (GoneError when it
        was deleted; a 409 when it changed — the retry reads it afresh)."""
        model = TrainingPlanStatus if plural == "trainingplans" else GPUPoolStatus
        current = model.model_validate(body.get("status") or {}).model_dump(
            by_alias=True, mode="json"
        )
        new = status.model_dump(by_alias=True, mode="json")
        if current == new:
            return False
        meta = body["metadata"]
        patched = await self.kube.patch_custom_status(
            GROUP,
            VERSION,
            plural,
            meta.get("namespace"),
            meta["name"],
            new,
            resource_version=str(meta.get("resourceVersion") or ""),
        )
        if patched is None:
            raise GoneError(f"{plural} {meta.get('namespace') or ''}/{meta['name']} is gone")
        meta["resourceVersion"] = (patched.get("metadata") or {}).get("resourceVersion")
        body["status"] = new  # a later write in this reconcile compares with it
        return True

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
