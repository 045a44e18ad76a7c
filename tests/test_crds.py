"""The CRDs: generated from the models (no drift), structural, and they accept the examples
and reject bad custom resources (checked with a JSON-schema validator, since the emulated
API server does not validate)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from shardmeter_operator.crdgen import all_crds, render

REPO = Path(__file__).resolve().parents[1]


def test_crds_on_disk_match_the_generator() -> None:
    for name, doc in all_crds().items():
        on_disk = (REPO / "crds" / name).read_text()
        assert on_disk == render(doc), f"crds/{name} drifted: run `make crds`"


def _to_jsonschema(node: Any) -> Any:
    """OpenAPI v3 (structural, with Kubernetes extensions) → JSON Schema for validation."""
    if isinstance(node, list):
        return [_to_jsonschema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: _to_jsonschema(v)
        for k, v in node.items()
        if not k.startswith("x-kubernetes") and k != "nullable"
    }
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = (
            [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
        )
    if (
        node.get("type") == "object"
        and "properties" in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False  # the API server prunes unknown fields; we reject them
    return out


def schema(plural: str) -> dict[str, Any]:
    crd = all_crds()[f"{plural}.yaml"]
    return _to_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])  # type: ignore[no-any-return]


def _walk(node: Any, path: str = "") -> list[str]:
    """Structural-schema rules: every node has a type unless it preserves unknown fields or
    is int-or-string; no anyOf/oneOf/$ref."""
    problems = []
    if isinstance(node, dict):
        if any(k in node for k in ("$ref", "anyOf", "oneOf", "allOf")):
            problems.append(f"{path}: non-structural keyword")
        if ("properties" in node or "items" in node) and "type" not in node:
            problems.append(f"{path}: missing type")
        for k, v in node.items():
            problems += _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            problems += _walk(v, f"{path}[{i}]")
    return problems


@pytest.mark.parametrize("plural", ["gpupools", "trainingplans"])
def test_schemas_are_structural(plural: str) -> None:
    crd = all_crds()[f"{plural}.yaml"]
    assert _walk(crd["spec"]["versions"][0]["schema"]) == []
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    for column in version["additionalPrinterColumns"]:
        assert not column["jsonPath"].startswith(
            ".status.conditions[0]"
        )  # conditions by type, never index


@pytest.mark.parametrize(
    "name", ["gpupool-cluster-a.yaml", "gpupool-cluster-b.yaml", "trainingplan.yaml"]
)
def test_examples_validate(name: str) -> None:
    doc = yaml.safe_load((REPO / "examples" / name).read_text())
    plural = "gpupools" if doc["kind"] == "GPUPool" else "trainingplans"
    jsonschema.validate(doc, schema(plural))


def _plan() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "examples" / "trainingplan.yaml").read_text()))


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        (lambda d: d["spec"].update(launch="yes"), "launch"),
        (lambda d: d["spec"]["training"].update(seqLenTokens=-1), "seqLenTokens"),
        (lambda d: d["spec"].update(pools=[]), "pools"),
        (lambda d: d["spec"]["strategy"].update(kind="ddp"), "kind"),
        (lambda d: d["spec"]["strategy"].update(syncEvery=1.5), "syncEvery"),
        (lambda d: d["spec"]["constraints"].update(maxIslands=0), "maxIslands"),
        (lambda d: d["spec"].update(colour="red"), "colour"),
        (lambda d: d["spec"]["objective"].update(throughputFraction=2), "throughputFraction"),
    ],
)
def test_invalid_trainingplans_are_rejected(patch: Any, where: str) -> None:
    doc = copy.deepcopy(_plan())
    patch(doc)
    with pytest.raises(jsonschema.ValidationError) as info:
        jsonschema.validate(doc, schema("trainingplans"))
    assert where in str(info.value.path) + info.value.message


def test_invalid_gpupool_is_rejected() -> None:
    doc = yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())
    doc["spec"]["gpusPerNode"] = 32
    with pytest.raises(jsonschema.ValidationError, match="32"):
        jsonschema.validate(doc, schema("gpupools"))


def test_cel_rules_cover_the_cross_field_checks() -> None:
    text = (REPO / "crds" / "trainingplans.yaml").read_text()
    for rule in (
        "self.syncEvery % self.fragments == 0",
        "self.fragmentSyncDelay < self.syncEvery / self.fragments",
        "self.globalBatchTokens % self.seqLenTokens == 0",
        "has(self.costBudgetUsd)",
    ):
        assert rule in text
