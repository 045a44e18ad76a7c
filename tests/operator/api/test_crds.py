"""The CRDs: generated from the models (no drift), accepted by Kubernetes' own CRD schema
(kubernetes-validate, strict, for the oldest and newest Kubernetes minor the chart supports),
structural, and — through the same pipeline the emulated API server runs on every write
(pruning, defaults, OpenAPI validation, CEL rules evaluated by cel-python) — they accept the
examples and reject bad custom resources."""

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
    problems = structural.structural_problems(bad)
    assert any("properties[x].type" in p for p in problems)
    assert any("uniqueItems" in p for p in problems)


def _admit(doc: dict[str, Any], plural: str) -> tuple[list[str], list[str]]:
    """(pruned fields, errors) of a write, as the emulated API server computes them."""
    obj = copy.deepcopy(doc)
    schema = _schema(plural)
    dropped = structural.prune(obj, schema)
    structural.apply_defaults(obj, schema)
    return dropped, structural.schema_errors(obj, schema)


@pytest.mark.parametrize(
    "name", ["gpupool-cluster-a.yaml", "gpupool-cluster-b.yaml", "trainingplan.yaml"]
)
def test_examples_are_admitted_unchanged(name: str) -> None:
    doc = yaml.safe_load((REPO / "examples" / name).read_text())
    plural = "gpupools" if doc["kind"] == "GPUPool" else "trainingplans"
    assert _admit(doc, plural) == ([], [])


def _plan() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "examples" / "trainingplan.yaml").read_text()))


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        (lambda d: d["spec"].update(launch="yes"), "spec.launch"),
        (lambda d: d["spec"]["training"].update(seqLenTokens=-1), "spec.training.seqLenTokens"),
        (lambda d: d["spec"].update(pools=[]), "spec.pools"),
        (lambda d: d["spec"]["strategy"].update(kind="ddp"), "spec.strategy.kind"),
        (lambda d: d["spec"]["strategy"].update(syncEvery=1.5), "spec.strategy.syncEvery"),
        (lambda d: d["spec"]["constraints"].update(maxIslands=0), "spec.constraints.maxIslands"),
        (
            lambda d: d["spec"]["objective"].update(throughputFraction=0),
            "spec.objective.throughputFraction",
        ),
        (
            lambda d: d["spec"]["objective"].update(kind="cost-budget", costBudgetUsd=0),
            "spec.objective.costBudgetUsd",
        ),
        # CEL rules (x-kubernetes-validations), evaluated by cel-python
        (
            lambda d: d["spec"]["strategy"].update(syncEvery=10, fragments=3),
            "syncEvery must be a multiple of fragments",
        ),
        (
            lambda d: d["spec"]["strategy"].update(syncEvery=12, fragments=3, fragmentSyncDelay=4),
            "fragmentSyncDelay must be < syncEvery / fragments",
        ),
        (
            lambda d: d["spec"]["strategy"].update(syncEvery="sometimes"),
            "must be an integer or 'auto'",
        ),
        (
            lambda d: d["spec"]["objective"].update(kind="cost-budget"),
            "kind cost-budget needs costBudgetUsd",
        ),
        (
            lambda d: d["spec"]["training"].update(globalBatchTokens=8193),
            "globalBatchTokens must be a multiple of seqLenTokens",
        ),
    ],
)
def test_invalid_trainingplans_are_rejected(patch: Any, where: str) -> None:
    doc = copy.deepcopy(_plan())
    patch(doc)
    _, errors = _admit(doc, "trainingplans")
    assert any(where in e for e in errors), errors


def test_cel_rules_accept_what_they_should() -> None:
    doc = copy.deepcopy(_plan())
    doc["spec"]["strategy"].update(syncEvery=12, fragments=3, fragmentSyncDelay=3)
    doc["spec"]["objective"].update(kind="cost-budget", costBudgetUsd=1000)
    assert _admit(doc, "trainingplans") == ([], [])


def test_unknown_fields_are_pruned_not_stored() -> None:
    doc = copy.deepcopy(_plan())
    doc["spec"]["colour"] = "red"
    doc["spec"]["strategy"]["colour"] = "blue"
    doc["spec"]["template"]["anything"] = 1  # the template preserves unknown fields
    dropped, errors = _admit(doc, "trainingplans")
    assert sorted(dropped) == ["spec.colour", "spec.strategy.colour"] and errors == []


def test_invalid_gpupool_is_rejected() -> None:
    doc = yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())
    doc["spec"]["gpusPerNode"] = 32
    _, errors = _admit(doc, "gpupools")
    assert any("spec.gpusPerNode" in e and "32" in e for e in errors), errors
