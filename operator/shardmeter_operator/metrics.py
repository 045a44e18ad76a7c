"""All Prometheus metrics, in one module. Names carry the ``shardmeter_`` prefix and unit
suffixes; per-object series are removed when the object goes away."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shardmeter_operator.api import (
    DiLoCoSettings,
    IslandState,
    Predictions,
    TrainingPlanPhase,
    TrainingPlanStatus,
)
from shardmeter_operator.api.observation import IslandObservation
from shardmeter_operator.gpupool.decide import PoolGauges

REGISTRY = CollectorRegistry(auto_describe=True)
PLAN_LABELS = ("namespace", "trainingplan")
GRAMS_PER_KG = 1e3
JOULES_PER_KWH = 3.6e6
"""Series are in Prometheus' base units (``promtool check metrics``): CO₂e in grams, energy
in joules; the TrainingPlan status keeps kilograms and kilowatt-hours."""

plan_step_seconds = Gauge(
    "shardmeter_plan_predicted_step_seconds",
    "Predicted inner step of the slowest island.",
    PLAN_LABELS,
    registry=REGISTRY,
)
plan_tokens_per_second = Gauge(
    "shardmeter_plan_predicted_tokens_per_second",
    "Predicted training throughput.",
    PLAN_LABELS,
    registry=REGISTRY,
)
plan_cost_dollars = Gauge(
    "shardmeter_plan_predicted_cost_dollars",
    "Predicted cost of the whole run.",
    PLAN_LABELS,
    registry=REGISTRY,
)
plan_duration_seconds = Gauge(
    "shardmeter_plan_predicted_duration_seconds",
    "Predicted wall-clock of the whole run.",
    PLAN_LABELS,
    registry=REGISTRY,
)
plan_blocking_seconds = Gauge(
    "shardmeter_plan_outer_step_blocking_seconds",
    "Predicted compute stall on the Streaming DiLoCo outer all_reduce per outer step.",
    PLAN_LABELS,
    registry=REGISTRY,
)
plan_mfu_ratio = Gauge(
    "shardmeter_plan_predicted_mfu_ratio",
    "Predicted model FLOPs utilisation.",
    PLAN_LABELS,
    registry=REGISTRY,
)
plan_co2_grams = Gauge(
    "shardmeter_plan_predicted_co2_grams",
    "Predicted CO2-equivalent emissions of the whole run at the pools' grid carbon intensity "
    "(grams: Prometheus' base unit of mass).",
    PLAN_LABELS,
    registry=REGISTRY,
)
plan_energy_joules = Gauge(
    "shardmeter_plan_predicted_energy_joules",
    "Predicted facility energy of the whole run, PUE included (joules; 1 kWh = 3.6e6 J).",
    PLAN_LABELS,
    registry=REGISTRY,
)
plan_loss_penalty_ratio = Gauge(
    "shardmeter_plan_predicted_loss_penalty_ratio",
    "DiLoCo plans: predicted relative eval-loss penalty against data-parallel on the same tokens.",
    PLAN_LABELS,
    registry=REGISTRY,
)
PREDICTION_GAUGES = (
    plan_step_seconds,
    plan_tokens_per_second,
    plan_cost_dollars,
    plan_duration_seconds,
    plan_blocking_seconds,
    plan_mfu_ratio,
    plan_co2_grams,
    plan_energy_joules,
    plan_loss_penalty_ratio,
)
plan_infeasible = Gauge(
    "shardmeter_plan_infeasible",
    "1 when no plan satisfies the request.",
    PLAN_LABELS,
    registry=REGISTRY,
)
plan_recommendation = Gauge(
    "shardmeter_plan_recommended_settings_info",
    "Always 1; labels carry the Streaming DiLoCo settings that avoid blocking.",
    (*PLAN_LABELS, "sync_every", "fragments", "fragment_sync_delay"),
    registry=REGISTRY,
)
ISLAND_STATES = ("pending", "running", "succeeded", "failed")
plan_islands = Gauge(
    "shardmeter_plan_islands",
    "Islands of a launched TrainingPlan by state (pending, running, succeeded, failed).",
    (*PLAN_LABELS, "state"),
    registry=REGISTRY,
)
ISLAND_LABELS = (*PLAN_LABELS, "island")
plan_prediction_error_ratio = Gauge(
    "shardmeter_plan_prediction_error_ratio",
    "Observed median inner step of a running island ÷ its prediction − 1 (positive: slower).",
    ISLAND_LABELS,
    registry=REGISTRY,
)
island_observed_step_seconds = Gauge(
    "shardmeter_island_observed_step_seconds",
    "Observed inner step of a running island (outer-step stalls removed), by percentile "
    "(50, 90) over the log window; a gauge, so not Prometheus' summary `quantile` label.",
    (*ISLAND_LABELS, "percentile"),
    registry=REGISTRY,
)
island_observed_tokens_per_second = Gauge(
    "shardmeter_island_observed_tokens_per_second",
    "Observed training throughput of a running island.",
    ISLAND_LABELS,
    registry=REGISTRY,
)
island_observed_fragment_sync_seconds = Gauge(
    "shardmeter_island_observed_fragment_sync_seconds",
    "Observed median time from a fragment's all_reduce start to its commit.",
    ISLAND_LABELS,
    registry=REGISTRY,
)
island_observed_blocking_seconds = Gauge(
    "shardmeter_island_observed_outer_step_blocking_seconds",
    "Observed stall per outer step at the fragment syncs.",
    ISLAND_LABELS,
    registry=REGISTRY,
)
island_observation_timestamp = Gauge(
    "shardmeter_island_observation_timestamp_seconds",
    "When a running island's log last gave an observation.",
    ISLAND_LABELS,
    registry=REGISTRY,
)
ISLAND_GAUGES = (
    plan_prediction_error_ratio,
    island_observed_step_seconds,
    island_observed_tokens_per_second,
    island_observed_fragment_sync_seconds,
    island_observed_blocking_seconds,
    island_observation_timestamp,
)
pool_observed_compute_scale = Gauge(
    "shardmeter_pool_observed_compute_scale",
    "A pool's observed correction: the factor on its base coefficients' compute times.",
    ("gpupool",),
    registry=REGISTRY,
)
pool_observed_samples = Gauge(
    "shardmeter_pool_observed_samples",
    "Observed islands behind a pool's correction.",
    ("gpupool",),
    registry=REGISTRY,
)
pool_fit_mape_ratio = Gauge(
    "shardmeter_pool_fit_mape_ratio",
    "Worst cross-validated MAPE of a pool's measured coefficients.",
    ("gpupool",),
    registry=REGISTRY,
)
pool_measured_timestamp = Gauge(
    "shardmeter_pool_coefficients_timestamp_seconds",
    "When a pool's coefficients were measured (or created, for priors).",
    ("gpupool", "source"),
    registry=REGISTRY,
)
reconcile_total = Counter(
    "shardmeter_reconcile_total", "Reconciliations.", ("kind",), registry=REGISTRY
)
reconcile_errors_total = Counter(
    "shardmeter_reconcile_errors_total",
    "Reconciliations that raised.",
    ("kind",),
    registry=REGISTRY,
)
reconcile_duration_seconds = Histogram(
    "shardmeter_reconcile_duration_seconds", "Reconciliation time.", ("kind",), registry=REGISTRY
)
plan_search_seconds = Histogram(
    "shardmeter_plan_search_duration_seconds",
    "Plan search time.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)


class _PoolAge(Collector):
    """``shardmeter_pool_coefficients_age_seconds``, computed at scrape time."""

    def __init__(self) -> None:
        self.stamps: dict[str, float] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "shardmeter_pool_coefficients_age_seconds",
            "Seconds since a pool's coefficients were measured (or created).",
            labels=["gpupool"],
        )
        now = time.time()
        for pool, stamp in sorted(self.stamps.items()):
            family.add_metric([pool], max(0.0, now - stamp))
        yield family


pool_age = _PoolAge()
REGISTRY.register(pool_age)


# ---- a plan's series, from its stored status ---------------------------------------------------
def publish_plan(namespace: str, name: str, st: TrainingPlanStatus) -> None:
    """Every series of one TrainingPlan, from its status alone: called after each reconcile
    and for each watch event of the plan (the listing at start included), so a restarted
    operator, or one whose reconcile failed after a status write, publishes what the stored
    state says. Idempotent."""
    if st.phase is TrainingPlanPhase.INVALID and st.launch is None:
        forget_plan(namespace, name)
        return
    if st.phase is TrainingPlanPhase.INFEASIBLE:
        set_infeasible(namespace, name)
        return
    labels = (namespace, name)
    if st.predictions is not None:
        set_predictions(namespace, name, st.predictions)
    else:
        for g in (*PREDICTION_GAUGES, plan_infeasible):
            _drop(g, labels)
    settings = advertised_settings(st)
    if settings is not None:
        set_recommendation(
            namespace, name, settings.sync_every, settings.fragments, settings.fragment_sync_delay
        )
    else:
        _drop(plan_recommendation, labels)
    if st.launch is not None:
        set_islands(namespace, name, [i.state.value for i in st.islands])
    else:
        _drop(plan_islands, labels)
    observed = {
        i.name: i.observed
        for i in st.islands
        if i.state is IslandState.RUNNING and i.observed is not None
    }
    forget_observed_islands(namespace, name, keep=set(observed))
    for island, obs in observed.items():
        set_observed_island(namespace, name, island, obs)


def advertised_settings(st: TrainingPlanStatus) -> DiLoCoSettings | None:
    """The Streaming DiLoCo settings the recommendation series shows: those in use while the
    outer step hides behind them; the observed or predicted recommendation while it blocks."""
    blocking = next((c for c in st.conditions if c.type == "OuterStepBlocking"), None)
    if st.streaming_di_lo_co is None or blocking is None:
        return None
    if blocking.status != "True":
        return st.streaming_di_lo_co
    rec = st.observed.recommended if st.observed is not None else None
    if blocking.reason == "ObservedBlocking" and rec is not None:
        return DiLoCoSettings(
            sync_every=rec.sync_every,
            fragments=rec.fragments,
            fragment_sync_delay=rec.fragment_sync_delay,
        )
    return st.recommended_streaming_di_lo_co


def set_plan(
    namespace: str,
    name: str,
    *,
    step: float,
    tokens: float,
    cost: float,
    duration: float,
    blocking: float,
    mfu: float,
) -> None:
    labels = (namespace, name)
    plan_step_seconds.labels(*labels).set(step)
    plan_tokens_per_second.labels(*labels).set(tokens)
    plan_cost_dollars.labels(*labels).set(cost)
    plan_duration_seconds.labels(*labels).set(duration)
    plan_blocking_seconds.labels(*labels).set(blocking)
    plan_mfu_ratio.labels(*labels).set(mfu)
    plan_infeasible.labels(*labels).set(0)


def set_predictions(namespace: str, name: str, p: Predictions) -> None:
    """The plan gauges from a TrainingPlan's ``status.predictions``."""
    set_plan(
        namespace,
        name,
        step=p.step_seconds,
        tokens=p.tokens_per_second,
        cost=p.cost_usd,
        duration=p.hours * 3600,
        blocking=p.outer_step_blocking_seconds,
        mfu=p.mfu,
    )
    labels = (namespace, name)
    for gauge, value in (
        (plan_co2_grams, None if p.co2_kg is None else p.co2_kg * GRAMS_PER_KG),
        (plan_energy_joules, None if p.energy_kwh is None else p.energy_kwh * JOULES_PER_KWH),
        (plan_loss_penalty_ratio, p.quality.loss_penalty_vs_dp if p.quality else None),
    ):
        if value is None:
            _drop(gauge, labels)
        else:
            gauge.labels(*labels).set(value)


def set_islands(namespace: str, name: str, states: Sequence[str]) -> None:
    """How many islands of a launched plan are in each state (every state, zeros included)."""
    for state in ISLAND_STATES:
        plan_islands.labels(namespace, name, state).set(sum(s == state for s in states))


def set_recommendation(
    namespace: str, name: str, sync_every: int, fragments: int, fragment_sync_delay: int
) -> None:
    _drop(plan_recommendation, (namespace, name))
    plan_recommendation.labels(
        namespace, name, str(sync_every), str(fragments), str(fragment_sync_delay)
    ).set(1)


def set_observed_island(namespace: str, name: str, island: str, obs: IslandObservation) -> None:
    """An island's observation; an island without one has no observed series (no stale
    figure keeps an alert firing). The timestamp is when the log was read."""
    labels = (namespace, name, island)
    for g in ISLAND_GAUGES:
        _drop(g, labels)
    if obs.step_seconds_p50 is None:
        return
    if obs.error_ratio is not None:
        plan_prediction_error_ratio.labels(*labels).set(obs.error_ratio)
    island_observed_step_seconds.labels(*labels, "50").set(obs.step_seconds_p50)
    if obs.step_seconds_p90 is not None:
        island_observed_step_seconds.labels(*labels, "90").set(obs.step_seconds_p90)
    if obs.tokens_per_second is not None:
        island_observed_tokens_per_second.labels(*labels).set(obs.tokens_per_second)
    if obs.fragment_sync_seconds is not None:
        island_observed_fragment_sync_seconds.labels(*labels).set(obs.fragment_sync_seconds)
    if obs.outer_step_blocking_seconds is not None:
        island_observed_blocking_seconds.labels(*labels).set(obs.outer_step_blocking_seconds)
    island_observation_timestamp.labels(*labels).set(_epoch(obs.read_at))


def forget_observed_islands(namespace: str, name: str, keep: set[str]) -> None:
    """Drop the observed series of a plan's islands not in ``keep`` (no longer running)."""
    for g in ISLAND_GAUGES:
        for labels in list(g._metrics):
            if labels[:2] == (namespace, name) and labels[2] not in keep:
                g.remove(*labels)


def set_pool_observed(name: str, compute_scale: float | None, samples: int) -> None:
    _drop(pool_observed_compute_scale, (name,))
    _drop(pool_observed_samples, (name,))
    if compute_scale is not None:
        pool_observed_compute_scale.labels(name).set(compute_scale)
    pool_observed_samples.labels(name).set(samples)


def set_infeasible(namespace: str, name: str) -> None:
    forget_plan(namespace, name)
    plan_infeasible.labels(namespace, name).set(1)


def forget_plan(namespace: str, name: str) -> None:
    for g in (
        *PREDICTION_GAUGES,
        plan_infeasible,
        plan_recommendation,
        plan_islands,
        *ISLAND_GAUGES,
    ):
        _drop(g, (namespace, name))


def set_pool(name: str, source: str, stamp: float, fit_mape: float | None) -> None:
    forget_pool(name)
    pool_measured_timestamp.labels(name, source).set(stamp)
    pool_age.stamps[name] = stamp
    if fit_mape is not None:
        pool_fit_mape_ratio.labels(name).set(fit_mape)


def forget_pool(name: str) -> None:
    _drop(pool_measured_timestamp, (name,))
    _drop(pool_fit_mape_ratio, (name,))
    _drop(pool_observed_compute_scale, (name,))
    _drop(pool_observed_samples, (name,))
    pool_age.stamps.pop(name, None)


def publish_pool(name: str, g: PoolGauges | None) -> None:
    """A pool's series as its reconcile decided them (None: it has no coefficients: none)."""
    if g is None:
        forget_pool(name)
        return
    set_pool(name, g.source, g.coefficients_timestamp_s, g.fit_mape)
    set_pool_observed(name, g.observed_compute_scale, g.observed_samples)


def _epoch(stamp: str) -> float:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def _drop(metric: Gauge, prefix: tuple[str, ...]) -> None:
    """Remove every series whose leading label values equal ``prefix``."""
    for labels in list(metric._metrics):
        if labels[: len(prefix)] == prefix:
            metric.remove(*labels)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr, registry=REGISTRY)
