"""The CRDs: generated from the models (no drift), accepted by Kubernetes' own CRD schema
(kubernetes-validate, strict, for the oldest and newest Kubernetes minor the chart supports)
and structural. That a real kube-apiserver installs them and enforces their schemas and CEL
rules — and that the emulated API server answers every such request as it does — is
tests/kube/test_crds.py's."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardmeter_operator.api.crdgen import all_crds, render
from support.kube_emulator import builtins, structural
from support.kube_versions import SUPPORTED_MINORS

REPO = Path(__file__).resolve().parents[3]


def test_crds_on_disk_match_the_generator() -> None:
    for name, doc in all_crds().items():
        on_disk = (REPO / "crds" / name).read_text()
        assert on_disk == render(doc), f"crds/{name} drifted: run `make crds`"


@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
@pytest.mark.parametrize("name", ["gpupools.yaml", "trainingplans.yaml"])
def test_crds_validate_against_kubernetes_own_schema(name: str, minor: str) -> None:
    crd = yaml.safe_load((REPO / "crds" / name).read_text())
    assert builtins.validate(crd, minor) == []


def test_the_real_crd_schema_rejects_a_numeric_exclusive_minimum() -> None:
    """What helm install hit: JSON Schema's `exclusiveMinimum: 0` is not Kubernetes' OpenAPI."""
    crd = copy.deepcopy(all_crds()["trainingplans.yaml"])
    objective = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["objective"]["properties"]
    assert objective["costBudgetUsd"]["exclusiveMinimum"] is True
    objective["costBudgetUsd"]["exclusiveMinimum"] = 0
    errors = builtins.validate(crd, SUPPORTED_MINORS[-1])
    assert any("exclusiveMinimum" in e for e in errors), errors


def _schema(plural: str) -> dict[str, Any]:
    crd = all_crds()[f"{plural}.yaml"]
    return dict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize("plural", ["gpupools", "trainingplans"])
def test_schemas_are_structural(plural: str) -> None:
    assert structural.structural_problems(_schema(plural)) == []
    version = all_crds()[f"{plural}.yaml"]["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    for column in version["additionalPrinterColumns"]:
        assert "conditions[0]" not in column["jsonPath"]  # conditions by type, never index


def test_the_structural_check_can_fail() -> None:
    bad = {
        "type": "object",
        "properties": {
            "x": {"description": "untyped"},
            "y": {"type": "array", "uniqueItems": True, "items": {"type": "string"}},
        },
    }
    bad["properties"]["z"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": False}
    bad["x-kubernetes-validations"] = [{"rule": "has(self.x) || has(self.z)"}]
    problems = structural.structural_problems(bad)
    assert any("properties[x].type" in p for p in problems)
    assert any("uniqueItems" in p for p in problems)
    assert any("preserve-unknown-fields: Invalid value: false" in p for p in problems)
    assert any("undefined field 'x'" in p for p in problems), problems
    assert not any("undefined field 'z'" in p for p in problems)
