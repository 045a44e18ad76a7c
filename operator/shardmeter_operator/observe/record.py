"""What an observation round records, purely: ``status.observed`` (the plan's summary of its
islands' observations), the ``PredictionDrift`` condition, and — once syncs were observed —
``OuterStepBlocking`` from the observed times (:func:`record`); and dropping everything
observed when observation is switched off (:func:`forget`)."""

from __future__ import annotations

from shardmeter.sim.bottleneck import blocks
from shardmeter_operator.api import IslandObservation, PlanObservation, TrainingPlanStatus
from shardmeter_operator.api.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.api.observation import ObserveReason, ObserveSpec
from shardmeter_operator.decision import PlanResult
from shardmeter_operator.observe.evaluate import ObservedEvaluation


def forget(st: TrainingPlanStatus) -> None:
    st.observed = None
    st.islands = [i.model_copy(update={"observed": None}) for i in st.islands]


def record(
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
        blocking_condition(st, generation, out)


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


def blocking_condition(st: TrainingPlanStatus, generation: int, out: PlanResult) -> None:
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
