"""The alerting rules the chart ships (deploy/helm/shardmeter/files/alerts.yaml), unit-tested
with promtool on synthetic series (deploy/helm/shardmeter/tests/alerts_test.yaml), and checked
against the metrics the operator exports.

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
        names = set(re.findall(r"\b(shardmeter_[a-z_]+|up)\b", expr))
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
