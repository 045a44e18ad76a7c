"""kopf's ClusterKopfPeering CRD is cluster-wide and shared by every kopf operator of a
cluster: ``crds.kopfPeering`` installs it with the release (true), never (false: install it
apart from ``files/kopf-peering.yaml``), or unless another owner already has it (auto, the
default; Helm's lookup finds nothing without a cluster, so a plain render includes it). The
lookup against a cluster — a foreign CRD left out, the release's own kept — is
test_chart_peering_lookup.py, with Helm installing against the in-memory API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "shardmeter"
PEERING = "clusterkopfpeerings.kopf.dev"


def crds(values: dict[str, Any] | None) -> set[str]:
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name="sm", namespace="shardmeter-system")
    return {
        d["metadata"]["name"]
        for path, text in out.items()
        if not path.endswith(".txt")
        for d in yaml.safe_load_all(text)
        if d and d["kind"] == "CustomResourceDefinition"
    }


@pytest.mark.parametrize(
    ("setting", "installed"), [(None, True), ("auto", True), (True, True), (False, False)]
)
def test_the_peering_crd_follows_its_value(setting: object, installed: bool) -> None:
    values = None if setting is None else {"crds": {"kopfPeering": setting}}
    names = crds(values)
    assert {"gpupools.shardmeter.io", "trainingplans.shardmeter.io"} <= names
    assert (PEERING in names) is installed


def test_the_peering_crd_file_applies_on_its_own() -> None:
    doc = yaml.safe_load((CHART / "files" / "kopf-peering.yaml").read_text())
    assert doc["kind"] == "CustomResourceDefinition" and doc["metadata"]["name"] == PEERING


def test_the_schema_refuses_other_peering_settings() -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"crds": {"kopfPeering": "sometimes"}})
