"""Observing a launched plan's running islands (a step of every launched plan's reconcile):
read rank 0's log of each running island, hold the step times against the predictions,
re-check outer-step blocking, and hand calibration samples to the pools.

* **Never touches training.** Only ``pods`` (list) and ``pods/log`` (get) are read; what the
  observation recommends is advice in the status, until the user relaunches.
* **Bounded.** At most once per ``--observe-interval`` per plan (the reconcile requeues itself
  while islands run); each read is the trainer container's last ``--observe-tail-lines``
  lines and at most ``--observe-limit-bytes``, in a worker thread, a few islands at a time;
  parsing and the model run off the event loop.
* **No wrong numbers.** A missing pod, a pending or restarted container, an unreadable log,
  lines that do not parse, too few steps: the island's ``observed`` says why, with no figure
  (:mod:`~.observe.summary`); a previous read's numbers are not carried over.

Status: ``islands[].observed`` (:class:`~.api.observation.IslandObservation`),
``observed`` (:class:`~.api.observation.PlanObservation`), conditions ``PredictionDrift`` and
— once syncs were observed — ``OuterStepBlocking`` from the observed times; metrics per island
(:mod:`~.metrics`). Samples go to :attr:`PlanResult.samples` for :mod:`~.gpupool.correction`.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Protocol

import structlog

from shardmeter.errors import SpecError
from shardmeter_operator.api import (
    IslandState,
    IslandStatus,
    TrainingPlanStatus,
)
from shardmeter_operator.api.conditions import Reason, Type, set_condition
from shardmeter_operator.api.observation import (
    IslandObservation,
    ObserveReason,
    ObserveSpec,
)
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.decision import PlanResult, Validated
from shardmeter_operator.k8s.client import Kube, LogUnavailableError
from shardmeter_operator.k8s.documents import read_documents
from shardmeter_operator.k8s.pods import (
    island_pods,
    rank0_pod,
    restarts,
    trainer_container,
    waiting_reason,
)
from shardmeter_operator.observe import prometheus
from shardmeter_operator.observe.evaluate import (
    ObservedEvaluation,
    Provenance,
    evaluate_observations,
)
from shardmeter_operator.observe.logparse import parse_log
from shardmeter_operator.observe.record import blocking_condition, forget, record
from shardmeter_operator.observe.summary import IslandFacts, summarize, unavailable
from shardmeter_operator.worker import search_in_worker

log = structlog.get_logger("shardmeter_operator")
READS_AT_ONCE = 4
"""Island logs read concurrently (each in a worker thread)."""


class Reading(Protocol):
    """What observing reads with: the operator's settings and the API (a plan's reconcile
    context has both)."""

    @property
    def cfg(self) -> OperatorConfig: ...

    @property
    def kube(self) -> Kube: ...

    async def cluster_kube(self, cluster: str) -> tuple[Kube | None, str]:
        """The API of a worker cluster ("" this one), or None and why it cannot be read."""
        ...


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def _seconds_since(stamp: str, now: datetime) -> float:
    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return (now - then).total_seconds()


async def observe_plan(
    name: str, namespace: str, uid: str, ok: Validated | None, ctx: Reading, out: PlanResult
) -> None:
    """Read, evaluate and record the running islands' observations (module docstring)."""
    st = out.status
    generation = st.observed_generation
    if ok is None or st.launch is None or not st.launch.complete:
        return  # an invalid spec now: keep what was observed, read nothing
    spec = ok.spec.observe
    interval = ctx.cfg.observe_interval_s
    if not spec.enabled or interval <= 0:
        why = "spec.observe.enabled is false" if not spec.enabled else "--observe-interval is 0"
        forget(st)
        st.conditions = set_condition(
            st.conditions,
            Type.PREDICTION_DRIFT,
            None,
            Reason.NOT_OBSERVED,
            f"observation is off ({why})",
            generation,
        )
        return
    running = [i for i in st.islands if i.state is IslandState.RUNNING]
    if not running:
        if st.observed is None:
            st.conditions = set_condition(
                st.conditions,
                Type.PREDICTION_DRIFT,
                None,
                Reason.NOT_OBSERVED,
                "no island is running yet",
                generation,
            )
        return  # the last observations stay: the record of the run
    now = _now()
    if (
        st.observed is not None
        and (left := interval - _seconds_since(st.observed.read_at, now)) > 0
    ):
        if st.observed.blocking_seconds is not None and st.streaming_di_lo_co is not None:
            blocking_condition(st, generation, out)  # over a re-evaluation's
        out.requeue_within(left)
        return
    read_at = _iso(now)
    gate = asyncio.Semaphore(READS_AT_ONCE)
    seq = ok.request.training.seq_len_tokens
    fragments = st.streaming_di_lo_co.fragments if st.streaming_di_lo_co else 0

    async def one(isl: IslandStatus) -> IslandObservation:
        facts = IslandFacts(
            isl.micro_batch * isl.accumulation * seq,
            isl.nodes * isl.gpus_per_node,
            fragments,
            isl.step_seconds,
        )
        async with gate:
            kube, why = await ctx.cluster_kube(island_cluster(st, isl.name))
            return await observe_island(
                namespace, isl.name, facts, read_at, spec, ctx, kube=kube, unreachable=why
            )

    observed = dict(
        zip(
            [i.name for i in running],
            await asyncio.gather(*(one(i) for i in running)),
            strict=True,
        )
    )
    docs, _ = await read_documents([r.name for r in ok.spec.pools], ctx.cfg, ctx.kube)
    provenance = Provenance(f"{namespace}/{name}", uid, st.launch.revision, now, spec.recalibrate)
    try:
        ev: ObservedEvaluation = await search_in_worker(
            evaluate_observations,
            ok.request,
            docs,
            st.islands,
            observed,
            st.streaming_di_lo_co,
            provenance,
        )
    except (SpecError, ValueError) as exc:  # the model cannot evaluate them: report, no fit
        log.warning("observations not evaluated", plan=f"{namespace}/{name}", error=str(exc))
        ev = ObservedEvaluation(observed)
    st.islands = [
        i.model_copy(update={"observed": ev.observations[i.name]})
        if i.name in ev.observations
        else i
        for i in st.islands
    ]
    record(st, ev, spec, len(running), read_at, generation, out)
    out.samples = ev.samples
    out.requeue_within(interval)


async def observe_island(
    namespace: str,
    island: str,
    facts: IslandFacts,
    read_at: str,
    spec: ObserveSpec,
    ctx: Reading,
    *,
    kube: Kube | None = None,
    unreachable: str = "",
) -> IslandObservation:
    """One island's observation from its rank-0 pod's log (never raises for bad input);
    ``kube``: the API of the cluster it runs in (default this one); ``unreachable``: why
    that cluster cannot be read."""
    cfg = ctx.cfg
    if unreachable:
        obs = unavailable(read_at, ObserveReason.LOG_UNAVAILABLE, unreachable[:1024])
        if not spec.step_seconds_query:
            return obs
        # an island in a cluster the operator cannot read: its step from Prometheus alone
        got = await _from_prometheus(
            obs.model_copy(update={"message": "its pod log is not readable here"}),
            spec.step_seconds_query,
            namespace,
            island,
            "",
            facts,
            ctx,
        )
        if got.source != "prometheus":
            return obs.model_copy(update={"message": f"{unreachable}; {got.message}"[:1024]})
        return got.model_copy(
            update={
                "reason": ObserveReason.OBSERVED,
                "predicted_step_seconds": facts.predicted_step_s,
            }
        )
    kube = kube or ctx.kube
    try:
        pod = rank0_pod(await island_pods(kube, namespace, island))
    except Exception as exc:  # the API refused (RBAC) or failed: this read has nothing
        return unavailable(
            read_at, ObserveReason.LOG_UNAVAILABLE, f"listing the pods of {island} failed: {exc}"
        )
    if pod is None:
        return unavailable(
            read_at,
            ObserveReason.POD_NOT_FOUND,
            f"no pod of Job {island} with completion index 0",
        )
    pod_name = str(pod["metadata"]["name"])
    container = trainer_container(pod)
    where = {"pod": pod_name, "restarts": restarts(pod, container)}
    phase = (pod.get("status") or {}).get("phase")
    if phase not in ("Running", "Succeeded", "Failed"):
        return unavailable(
            read_at,
            ObserveReason.POD_NOT_RUNNING,
            f"pod {pod_name} is {phase or 'Pending'} ({waiting_reason(pod, container)})",
            **where,
        )
    try:
        text = await kube.pod_log(
            namespace,
            pod_name,
            container,
            tail_lines=cfg.observe_tail_lines,
            limit_bytes=cfg.observe_limit_bytes,
        )
    except LogUnavailableError as exc:
        return unavailable(
            read_at,
            ObserveReason.LOG_UNAVAILABLE,
            f"reading the log of {pod_name}/{container} failed"
            + (f" (HTTP {exc.status})" if exc.status else "")
            + f": {exc}",
            **where,
        )
    if len(text.encode()) >= cfg.observe_limit_bytes and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # the byte limit cut the last line
    parsed = await asyncio.to_thread(parse_log, text)
    obs = summarize(parsed, facts, read_at, cfg.observe_window, **where)  # type: ignore[arg-type]
    if spec.step_seconds_query and obs.reason == ObserveReason.OBSERVED:
        obs = await _from_prometheus(
            obs, spec.step_seconds_query, namespace, island, pod_name, facts, ctx
        )
    return obs


async def _from_prometheus(
    obs: IslandObservation,
    query: str,
    namespace: str,
    island: str,
    pod: str,
    facts: IslandFacts,
    ctx: Reading,
) -> IslandObservation:
    url = ctx.cfg.prometheus_url
    if not url:
        note = "spec.observe.stepSecondsQuery is set but the operator has no --prometheus-url"
        return obs.model_copy(update={"message": f"{obs.message}; {note}; step from the log"})
    text = prometheus.render(query, namespace=namespace, job=island, pod=pod, island=island)
    try:
        value = await asyncio.to_thread(prometheus.instant_value, url, text)
    except prometheus.QueryError as exc:
        return obs.model_copy(
            update={"message": f"{obs.message}; Prometheus: {exc}; step from the log"[:1024]}
        )
    return obs.model_copy(
        update={
            "source": "prometheus",
            "step_seconds_p50": round(value, 6),
            "step_seconds_p90": None,
            "error_ratio": round(value / facts.predicted_step_s - 1, 6)
            if facts.predicted_step_s > 0
            else None,
        }
    )


def island_cluster(st: TrainingPlanStatus, island: str) -> str:
    """The worker cluster an island of a MultiKueue launch runs in ("" this cluster)."""
    if st.launch is None or not st.launch.sites:
        return ""
    index = next((k for k, i in enumerate(st.islands) if i.name == island), -1)
    for site in st.launch.sites:
        if index in site.islands:
            admitted = next((s.cluster for s in st.sites if s.site == site.site and s.cluster), "")
            return admitted or site.cluster
    return ""
