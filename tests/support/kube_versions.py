"""The Kubernetes minors the chart supports, for schema validation in tests: the oldest is
the chart's ``kubeVersion`` lower bound, the newest the newest that ``kubernetes-validate``
ships schemas for."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from kubernetes_validate import utils

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "shardmeter"


def _oldest() -> str:
    constraint = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    found = re.search(r">=\s*v?(\d+)\.(\d+)", constraint)
    if found is None:
        raise ValueError(f"Chart.yaml kubeVersion {constraint!r} has no lower bound")
    return f"{found[1]}.{found[2]}"


SUPPORTED_MINORS = (_oldest(), utils.major_minor(utils.latest_version()))
