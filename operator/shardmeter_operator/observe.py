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
  (:mod:`~.observation`); a previous read's numbers are not carried over.

Status: ``islands[].observed`` (:class:`~.observed_status.IslandObservation`),
``observed`` (:class:`~.observed_status.PlanObservation`), conditions ``PredictionDrift`` and
— once syncs were observed — ``OuterStepBlocking`` from the observed times; metrics per island
(:mod:`~.metrics`). Samples go to :attr:`PlanResult.samples` for :mod:`~.recalibrate`.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import structlog

from shardmeter.errors import SpecError
from shardmeter.sim.bottleneck import blocks
from shardmeter_operator import promquery
from shardmeter_operator.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.islandpods import (
    island_pods,
    rank0_pod,
    restarts,
    trainer_container,
    waiting_reason,
)
from shardmeter_operator.kube import LogUnavailableError
from shardmeter_operator.logparse import parse_log
from shardmeter_operator.observation import IslandFacts, summarize, unavailable
from shardmeter_operator.observed_eval import (
    ObservedEvaluation,
    Provenance,
    evaluate_observations,
)
from shardmeter_operator.observed_status import (
    IslandObservation,
    ObserveReason,
    ObserveSpec,
    PlanObservation,
)
from shardmeter_operator.plancontext import (
    PlanContext,
    PlanResult,
    Validated,
    read_documents,
    search_in_worker,
)
from shardmeter_operator.resources import (
    IslandState,
    IslandStatus,
    TrainingPlanSpec,
    TrainingPlanStatus,
)
from shardmeter_operator.revisions import revision

log = structlog.get_logger("shardmeter_operator")
READS_AT_ONCE = 4
"""Island logs read concurrently (each in a worker thread)."""


def launch_digest(spec: TrainingPlanSpec) -> str:
    """What a launch froze: the spec without ``observe`` (see ``LaunchRecord.spec_digest``)."""
    return revision(spec.model_dump(mode="json", exclude={"observe"}))


def observe_only_change(st: TrainingPlanStatus, spec: TrainingPlanSpec | None) -> bool:
    """Whether the spec differs from the launched one only in ``observe``."""
    recorded = st.launch.spec_digest if st.launch is not None else ""
    return bool(recorded) and spec is not None and launch_digest(spec) == recorded


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
    name: str, namespace: str, uid: str, ok: Validated | None, ctx: PlanContext, out: PlanResult
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
        _forget(st)
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
            _blocking_condition(st, generation, out)  # over a re-evaluation's
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
            return await observe_island(namespace, isl.name, facts, read_at, spec, ctx)

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
    _record(st, ev, spec, len(running), read_at, generation, out)
    out.samples = ev.samples
    out.requeue_within(interval)


async def observe_island(
    namespace: str,
    island: str,
    facts: IslandFacts,
    read_at: str,
    spec: ObserveSpec,
    ctx: PlanContext,
) -> IslandObservation:
    """One island's observation from its rank-0 pod's log (never raises for bad input)."""
    cfg = ctx.cfg
    try:
        pod = rank0_pod(await island_pods(ctx.kube, namespace, island))
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
        text = await ctx.kube.pod_log(
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
    ctx: PlanContext,
) -> IslandObservation:
    url = ctx.cfg.prometheus_url
    if not url:
        note = "spec.observe.stepSecondsQuery is set but the operator has no --prometheus-url"
        return obs.model_copy(update={"message": f"{obs.message}; {note}; step from the log"})
    text = promquery.render(query, namespace=namespace, job=island, pod=pod, island=island)
    try:
        value = await asyncio.to_thread(promquery.instant_value, url, text)
    except promquery.QueryError as exc:
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


def _forget(st: TrainingPlanStatus) -> None:
    st.observed = None
    st.islands = [i.model_copy(update={"observed": None}) for i in st.islands]


def _record(
    st: TrainingPlanStatus,
    ev: ObservedEvaluation,
    spec: ObserveSpec,
    running: int,
    read_at: str,
    generation: int,
    out: PlanResult,
) -> None:
    seen = [o for o in ev.observations.values() if o.reason == ObserveReason.OBSERVED]
    errors = [o.error_ratio for o in seen if o.error_ratio is not None]
    worst = max(errors, key=abs) if errors else None
    blockings = [
        o.outer_step_blocking_seconds for o in seen if o.outer_step_blocking_seconds is not None
    ]
    outer = ev.outer
    st.observed = PlanObservation(
        read_at=read_at,
        islands_observed=len(seen),
        islands_running=running,
        drift_threshold=spec.drift_threshold,
        worst_error_ratio=worst,
        step_seconds=max((o.step_seconds_p50 or 0.0 for o in seen), default=None) or None,
        outer_step_blocking_seconds=max(blockings) if blockings else None,
        outer_all_reduce_seconds=outer.all_reduce_s if outer else None,
        outer_all_reduce_bounded=outer.bounded if outer else False,
        blocking_seconds=outer.blocking_s if outer else None,
        recommended=outer.recommended if outer else None,
    )
    _drift_condition(st, ev.observations, spec.drift_threshold, generation, out)
    if outer is not None and st.streaming_di_lo_co is not None:
        _blocking_condition(st, generation, out)


def _drift_condition(
    st: TrainingPlanStatus,
    observations: dict[str, IslandObservation],
    threshold: float,
    generation: int,
    out: PlanResult,
) -> None:
    seen = {n: o for n, o in observations.items() if o.reason == ObserveReason.OBSERVED}
    before = get_condition(st.conditions, Type.PREDICTION_DRIFT)
    if not seen:
        reasons = "; ".join(
            f"{n}: {o.reason} ({o.message})" for n, o in list(observations.items())[:4]
        )
        st.conditions = set_condition(
            st.conditions, Type.PREDICTION_DRIFT, None, Reason.NOT_OBSERVED, reasons, generation
        )
        return
    drifting = {
        n: o
        for n, o in seen.items()
        if o.error_ratio is not None and abs(o.error_ratio) > threshold
    }
    within = len(seen) - len(drifting)
    if drifting:
        message = "; ".join(_island_text(n, o) for n, o in list(drifting.items())[:6])
        if within:
            message += f"; {within} other observed island(s) within ±{threshold:.0%}"
        message += (
            " — the running islands are not changed; the pools' observed correction improves "
            "the next plans (relaunch to use it)"
        )
        st.conditions = set_condition(
            st.conditions, Type.PREDICTION_DRIFT, True, Reason.STEP_TIME_DRIFT, message, generation
        )
        if before is None or before.status != "True":
            out.events.append(("Warning", Type.PREDICTION_DRIFT, message))
        return
    worst_name, worst = max(seen.items(), key=lambda kv: abs(kv[1].error_ratio or 0.0))
    message = (
        f"{len(seen)} observed island(s) within ±{threshold:.0%} of the predicted inner step "
        f"(largest: {_island_text(worst_name, worst)})"
    )
    st.conditions = set_condition(
        st.conditions, Type.PREDICTION_DRIFT, False, Reason.WITHIN_THRESHOLD, message, generation
    )
    if before is not None and before.status == "True":
        out.events.append(("Normal", Reason.WITHIN_THRESHOLD, message))


def _island_text(name: str, o: IslandObservation) -> str:
    p90 = f", p90 {o.step_seconds_p90:.4g} s" if o.step_seconds_p90 is not None else ""
    text = f"{name}: inner step {o.step_seconds_p50 or 0:.4g} s{p90} observed"
    if o.predicted_step_seconds and o.error_ratio is not None:
        text += f" vs {o.predicted_step_seconds:.4g} s predicted ({o.error_ratio:+.1%})"
    return text


def _blocking_condition(st: TrainingPlanStatus, generation: int, out: PlanResult) -> None:
    obs, s = st.observed, st.streaming_di_lo_co
    assert obs is not None and s is not None
    a = obs.outer_all_reduce_seconds or 0.0
    how = "at most (it hid behind the delay)" if obs.outer_all_reduce_bounded else "observed"
    facts = (
        f"at the observed inner step {obs.step_seconds:.4g} s and fragment all_reduce "
        f"{a:.4g} s ({how}; observed stall {obs.outer_step_blocking_seconds or 0:.3g} s per "
        f"outer step)"
    )
    before = get_condition(st.conditions, Type.OUTER_STEP_BLOCKING)
    if obs.blocking_seconds is not None and blocks(obs.blocking_seconds):
        rec = obs.recommended
        text = f"{facts}, compute blocks {obs.blocking_seconds:.3g} s per outer step"
        if rec is not None:
            text += (
                f"; recommended: {rec.text} — advice only: the running islands keep "
                f"syncEvery {s.sync_every}, fragments {s.fragments}, fragmentSyncDelay "
                f"{s.fragment_sync_delay}; relaunch to apply"
            )
        st.conditions = set_condition(
            st.conditions,
            Type.OUTER_STEP_BLOCKING,
            True,
            Reason.OBSERVED_BLOCKING,
            text,
            generation,
        )
        if before is None or before.status != "True":
            out.events.append(("Warning", Type.OUTER_STEP_BLOCKING, text))
        return
    st.conditions = set_condition(
        st.conditions,
        Type.OUTER_STEP_BLOCKING,
        False,
        Reason.OBSERVED_HIDDEN,
        f"{facts}, the outer all_reduce hides behind {s.fragment_sync_delay} inner step(s)",
        generation,
    )
