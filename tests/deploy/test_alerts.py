"""The alerting rules the chart ships (deploy/helm/shardmeter/files/alerts.yaml), unit-tested
with promtool on synthetic series (deploy/helm/shardmeter/tests/alerts_test.yaml), and checked
against the metrics the operator exports; those metrics linted by ``promtool check metrics``
(Prometheus' naming conventions: base units, counters, reserved labels) and documented in
docs/operator.md's table.

promtool comes from Debian's `prometheus` package, unpacked into .venv/bin by `make tools` (part
of `make test`). A missing promtool fails the test unless SHARDMETER_ALLOW_MISSING_TOOLS=1.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "shardmeter"
RULES = CHART / "files" / "alerts.yaml"
RULE_TESTS = CHART / "tests" / "alerts_test.yaml"
ALERTS = {
    "ShardMeterOuterStepBlocking",
    "ShardMeterPlanInfeasible",
    "ShardMeterCoefficientsStale",
    "ShardMeterCoefficientFitPoor",
    "ShardMeterOperatorDown",
    "ShardMeterIslandFailed",
    "ShardMeterPredictionDrift",
}


def promtool() -> str:
    found = shutil.which("promtool") or shutil.which(
        "promtool", path=str(Path(sys.executable).parent)
    )
    if found:
        return found
    hint = "`make tools` unpacks it from Debian's prometheus package"
    if os.environ.get("SHARDMETER_ALLOW_MISSING_TOOLS") == "1":
        pytest.skip(f"promtool is not installed ({hint})")
    pytest.fail(f"promtool is not installed: {hint} (or set SHARDMETER_ALLOW_MISSING_TOOLS=1)")


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=CHART, capture_output=True, text=True, check=False, timeout=120
    )


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_rules_file_is_valid() -> None:
    result = run_promtool("check", "rules", str(RULES.relative_to(CHART)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_each_alert_fires_on_a_synthetic_series_and_stays_silent_on_a_healthy_one() -> None:
    result = run_promtool("test", "rules", str(RULE_TESTS.relative_to(CHART)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_rule_tests_use_the_shipped_file_and_cover_every_alert_both_ways() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert [(RULE_TESTS.parent / f).resolve() for f in tests["rule_files"]] == [RULES.resolve()]
    fires: set[str] = set()
    silent: set[str] = set()
    for test in tests["tests"]:
        for case in test.get("alert_rule_test", []):
            (fires if case["exp_alerts"] else silent).add(case["alertname"])
    assert fires == ALERTS, "every alert has a case where it fires"
    assert silent == ALERTS, "every alert has a case where it stays silent"


def test_alerts_are_the_documented_seven_with_severity_and_annotations() -> None:
    alerts = rules()
    assert {r["alert"] for r in alerts} == ALERTS and len(alerts) == len(ALERTS)
    for rule in alerts:
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        assert rule.get("for"), f"{rule['alert']} fires on a single evaluation"
    blocking = next(r for r in alerts if r["alert"] == "ShardMeterOuterStepBlocking")
    assert blocking["for"] == "10m"
    assert "shardmeter_plan_recommended_settings_info" in blocking["expr"]
    description = blocking["annotations"]["description"]
    for label in ("sync_every", "fragments", "fragment_sync_delay"):
        assert f"$labels.{label}" in description


def _exported_labels() -> dict[str, set[str]]:
    """Every series name the operator's registry exports, with its label names."""
    from shardmeter_operator import metrics

    out: dict[str, set[str]] = {}
    for collector, names in metrics.REGISTRY._collector_to_names.items():
        labels = set(getattr(collector, "_labelnames", ()))
        if collector is metrics.pool_age:
            labels = {"gpupool"}
        for name in names:
            out[name] = labels
    return out


def test_alerts_use_only_metrics_and_labels_the_operator_exports() -> None:
    exported = _exported_labels()
    assert "shardmeter_pool_coefficients_age_seconds" in exported
    target_labels = {"job", "instance", "namespace"}  # added by Prometheus (`up`, every scrape)
    for rule in rules():
        expr = rule["expr"]
        names = set(re.findall(r"\b(shardmeter_[a-z0-9_]+|up)\b", expr))
        assert names, rule["alert"]
        unknown = {n for n in names if n != "up" and n not in exported}
        assert not unknown, f"{rule['alert']}: {sorted(unknown)} are not exported"
        allowed = set(target_labels).union(*(exported.get(n, set()) for n in names))
        grouped = {
            label.strip()
            for group in re.findall(r"\b(?:by|on|group_left)\s*\(([^)]*)\)", expr)
            for label in group.split(",")
            if label.strip()
        }
        selected = set(re.findall(r"(\w+)\s*=~?\s*\"", expr))
        annotated = set(re.findall(r"\$labels\.(\w+)", " ".join(rule["annotations"].values())))
        for kind, used in (
            ("grouping", grouped),
            ("selector", selected),
            ("annotation", annotated),
        ):
            assert used <= allowed, f"{rule['alert']}: {kind} labels {sorted(used - allowed)}"


def test_drift_alert_uses_the_plans_default_threshold() -> None:
    from shardmeter_operator.api.observation import ObserveSpec

    drift = next(r for r in rules() if r["alert"] == "ShardMeterPredictionDrift")
    threshold = ObserveSpec.model_fields["drift_threshold"].default
    assert re.findall(r"[<>] (-?[\d.]+)", drift["expr"]) == [str(threshold), str(-threshold)]
    assert drift["for"] == "15m"


def test_the_operators_metrics_pass_promtool_check_metrics() -> None:
    """Every metric the operator exports, each with a series (a plan with predictions and
    quality, islands and their observations, a pool, reconciles and a search), linted by
    promtool the way Prometheus' conventions read them: base units (seconds, bytes, joules,
    grams, ratios), counters ending in _total, help on every metric."""
    from prometheus_client import generate_latest

    from shardmeter_operator import metrics
    from shardmeter_operator.api import Predictions
    from shardmeter_operator.api.observation import IslandObservation
    from shardmeter_operator.api.trainingplan import PredictedQuality

    ns, plan, island = "promtool", "lint", "island-0"
    predictions = Predictions(
        step_seconds=3.3,
        tokens_per_second=632_550.0,
        hours=22.0,
        cost_usd=6717.0,
        mfu=0.44,
        bottleneck="compute-bound",
        outer_step_blocking_seconds=0.5,
        energy_kwh=2388.0,
        co2_kg=1146.0,
        quality=PredictedQuality(
            loss_penalty_vs_dp=-0.0007,
            loss_penalty_uncertainty=0.001,
            equivalent_token_factor=0.986,
            dp_equivalent_hours=21.6,
            dp_equivalent_cost_usd=6621.0,
        ),
    )
    observation = IslandObservation(
        read_at="2026-12-04T10:00:00Z",
        reason="Observed",
        step_seconds_p50=3.4,
        step_seconds_p90=3.6,
        tokens_per_second=470_000.0,
        fragment_sync_seconds=0.4,
        outer_step_blocking_seconds=0.1,
        error_ratio=0.03,
    )
    try:
        metrics.set_predictions(ns, plan, predictions)
        metrics.set_recommendation(ns, plan, 20, 10, 1)
        metrics.set_islands(ns, plan, ["running", "pending"])
        metrics.set_observed_island(ns, plan, island, observation)
        metrics.set_pool("promtool-pool", "measured", 1.7e9, 0.08)
        metrics.set_pool_observed("promtool-pool", 1.05, 2)
        metrics.reconcile_total.labels("TrainingPlan").inc()
        metrics.reconcile_errors_total.labels("TrainingPlan").inc()
        metrics.reconcile_duration_seconds.labels("TrainingPlan").observe(0.2)
        metrics.plan_search_seconds.observe(0.9)
        metrics.plan_infeasible.labels(ns, "other").set(1)
        exposition = generate_latest(metrics.REGISTRY).decode()
        unset = {family.name for family in metrics.REGISTRY.collect() if not family.samples}
    finally:
        metrics.forget_plan(ns, plan)
        metrics.forget_plan(ns, "other")
        metrics.forget_pool("promtool-pool")
    assert not unset, f"give these a series so promtool lints them: {sorted(unset)}"
    assert "shardmeter_plan_predicted_energy_joules" in exposition
    result = subprocess.run(
        [promtool(), "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_exported_metric_is_in_the_operator_docs_table() -> None:
    from shardmeter_operator import metrics

    text = (REPO / "docs" / "operator.md").read_text(encoding="utf-8")
    table = text[text.index("## Metrics and alerts") :]
    table = table[: table.index("\n\n", table.index("| metric |"))]
    documented = set(re.findall(r"`(shardmeter_[a-z0-9_]+)`", table))
    # `shardmeter_reconcile_total`, `_errors_total`, `_duration_seconds` share a row
    documented |= {f"shardmeter_reconcile{s}" for s in re.findall(r"`(_[a-z_]+)`", table)}
    families = {family.name for family in metrics.REGISTRY.collect()}
    # a counter's family name drops its _total suffix
    missing = {n for n in families if n not in documented and f"{n}_total" not in documented}
    assert not missing, f"docs/operator.md's metrics table lacks {sorted(missing)}"
