"""All Prometheus metrics, in one module. Names carry the ``shardmeter_`` prefix and unit
suffixes; per-object series are removed when the object goes away."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from shardmeter_operator.resources import Predictions

REGISTRY = CollectorRegistry(auto_describe=True)
PLAN_LABELS = ("namespace", "trainingplan")

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


def set_islands(namespace: str, name: str, states: Sequence[str]) -> None:
    """How many islands of a launched plan are in each state (every state, zeros included)."""
    for state in ISLAND_STATES:
        plan_islands.labels(namespace, name, state).set(sum(s == state for s in states))


def set_recommendation(
    namespace: str, name: str, sync_every: int, fragments: int, delay: int
) -> None:
    _drop(plan_recommendation, (namespace, name))
    plan_recommendation.labels(namespace, name, str(sync_every), str(fragments), str(delay)).set(1)


def set_infeasible(namespace: str, name: str) -> None:
    forget_plan(namespace, name)
    plan_infeasible.labels(namespace, name).set(1)


def forget_plan(namespace: str, name: str) -> None:
    for g in (
        plan_step_seconds,
        plan_tokens_per_second,
        plan_cost_dollars,
        plan_duration_seconds,
        plan_blocking_seconds,
        plan_mfu_ratio,
        plan_infeasible,
        plan_recommendation,
        plan_islands,
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
    pool_age.stamps.pop(name, None)


def _drop(metric: Gauge, prefix: tuple[str, ...]) -> None:
    """Remove every series whose leading label values equal ``prefix``."""
    for labels in list(metric._metrics):
        if labels[: len(prefix)] == prefix:
            metric.remove(*labels)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr, registry=REGISTRY)
