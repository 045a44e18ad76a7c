"""The operator's CRDs in a real kube-apiserver: they install, and the server enforces their
schemas and CEL rules — pruning, defaults, OpenAPI validation, ``x-kubernetes-validations``.
Every request goes to the real server and to the in-memory emulator (which the fast operator
tests keep using), and the answers are compared: the emulator must refuse what the real server
refuses, for the same field, and store what it stores."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_support import Kube
from shardmeter_operator.api.crdgen import all_crds
from support.cluster import EmulatedCluster, running_emulator

REPO = Path(__file__).resolve().parents[2]
Doc = dict[str, Any]
pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


def example(name: str) -> Doc:
    return dict(yaml.safe_load((REPO / "examples" / name).read_text()))


def plan_with(change: Callable[[Doc], Any]) -> Doc:
    doc = copy.deepcopy(example("trainingplan.yaml"))
    change(doc)
    return doc


REFUSED: list[tuple[str, Doc, str]] = [
    ("launch", plan_with(lambda d: d["spec"].update(launch="yes")), "spec.launch"),
    (
        "seq-len",
        plan_with(lambda d: d["spec"]["training"].update(seqLenTokens=-1)),
        "spec.training.seqLenTokens",
    ),
    ("no-pools", plan_with(lambda d: d["spec"].update(pools=[])), "spec.pools"),
    ("kind", plan_with(lambda d: d["spec"]["strategy"].update(kind="ddp")), "spec.strategy.kind"),
    (
        "sync-every-float",
        plan_with(lambda d: d["spec"]["strategy"].update(syncEvery=1.5)),
        "spec.strategy.syncEvery",
    ),
    (
        "max-islands",
        plan_with(lambda d: d["spec"]["constraints"].update(maxIslands=0)),
        "spec.constraints.maxIslands",
    ),
    (
        "fraction",
        plan_with(lambda d: d["spec"]["objective"].update(throughputFraction=0)),
        "spec.objective.throughputFraction",
    ),
    (
        "budget-zero",
        plan_with(lambda d: d["spec"]["objective"].update(kind="cost-budget", costBudgetUsd=0)),
        "spec.objective.costBudgetUsd",
    ),
    # CEL rules (x-kubernetes-validations)
    (
        "cel-fragments",
        plan_with(lambda d: d["spec"]["strategy"].update(syncEvery=10, fragments=3)),
        "syncEvery must be a multiple of fragments",
    ),
    (
        "cel-delay",
        plan_with(
            lambda d: d["spec"]["strategy"].update(syncEvery=12, fragments=3, fragmentSyncDelay=4)
        ),
        "fragmentSyncDelay must be < syncEvery / fragments",
    ),
    (
        "cel-auto",
        plan_with(lambda d: d["spec"]["strategy"].update(syncEvery="sometimes")),
        "must be an integer or 'auto'",
    ),
    (
        "cel-budget",
        plan_with(lambda d: d["spec"]["objective"].update(kind="cost-budget")),
        "kind cost-budget needs costBudgetUsd",
    ),
    (
        "cel-batch",
        plan_with(lambda d: d["spec"]["training"].update(globalBatchTokens=8193)),
        "globalBatchTokens must be a multiple of seqLenTokens",
    ),
]


def _gpupool_with_32_gpus() -> Doc:
    doc = example("gpupool-cluster-a.yaml")
    doc["spec"]["gpusPerNode"] = 32
    return doc


REFUSED.append(("gpus-per-node", _gpupool_with_32_gpus(), "spec.gpusPerNode"))

ACCEPTED: list[tuple[str, Doc]] = [
    ("gpupool-a", example("gpupool-cluster-a.yaml")),
    ("gpupool-b", example("gpupool-cluster-b.yaml")),
    ("trainingplan", example("trainingplan.yaml")),
    (
        "cel-holds",
        plan_with(
            lambda d: (
                d["spec"]["strategy"].update(syncEvery=12, fragments=3, fragmentSyncDelay=3),
                d["spec"]["objective"].update(kind="cost-budget", costBudgetUsd=1000),
            )
        ),
    ),
]


def _path(doc: Doc, namespace: str) -> str:
    plural = {"TrainingPlan": "trainingplans", "GPUPool": "gpupools"}[doc["kind"]]
    if doc["kind"] == "GPUPool":
        return f"/apis/shardmeter.io/v1alpha1/{plural}"
    return f"/apis/shardmeter.io/v1alpha1/namespaces/{namespace}/{plural}"


async def _both(
    kube: Kube, emulator: EmulatedCluster, doc: Doc, **params: str
) -> tuple[tuple[int, Any], tuple[int, Any]]:
    """(real answer, emulated answer) to the same dry-run create."""
    doc = copy.deepcopy(doc)
    if doc["kind"] == "TrainingPlan":
        doc["metadata"]["namespace"] = kube.ns
    path = _path(doc, kube.ns)
    params = {"dryRun": "All", **params}
    real = kube.request("POST", path, doc, params=params)
    emulated = await emulator.api("POST", path, doc, params=params)
    return real, emulated


def _fields(message: str) -> set[str]:
    """The field paths a Status message names (``spec.training.seqLenTokens: Invalid …``)."""
    return set(re.findall(r"(spec(?:\.[A-Za-z0-9]+)+)(?=: )", message))


async def test_the_crds_install_and_are_established(kube: Kube) -> None:
    for name in ("trainingplans.shardmeter.io", "gpupools.shardmeter.io"):
        crd = kube.get("customresourcedefinitions", None, name)
        assert crd is not None
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
        # served as a structural schema: no NonStructuralSchema condition
        assert "NonStructuralSchema" not in conditions
    table = (await kube.kubectl("get", "trainingplans", "-n", kube.ns)).stderr
    assert "No resources found" in table


async def test_what_the_real_server_refuses_the_emulator_refuses_for_the_same_field(
    kube: Kube, tmp_path: Path
) -> None:
    mismatches = []
    async with running_emulator(crds_dir=REPO / "crds", tmp_path=tmp_path) as emulator:
        for case, doc, where in REFUSED:
            (real_code, real), (emu_code, emu) = await _both(kube, emulator, doc)
            assert real_code == 422 and where in real["message"], (case, real)
            if (emu_code, emu.get("reason")) != (422, real["reason"]) or where not in emu.get(
                "message", ""
            ):
                mismatches.append((case, real["message"], emu_code, emu.get("message")))
            elif not _fields(real["message"]) <= _fields(emu["message"]):
                mismatches.append((case, real["message"], emu_code, emu["message"]))
    assert mismatches == []


async def test_both_store_the_examples_with_the_same_defaults(kube: Kube, tmp_path: Path) -> None:
    async with running_emulator(crds_dir=REPO / "crds", tmp_path=tmp_path) as emulator:
        for case, doc in ACCEPTED:
            (real_code, real), (emu_code, emu) = await _both(kube, emulator, doc)
            assert (real_code, emu_code) == (201, 201), (case, real, emu)
            assert real["spec"] == emu["spec"], case


async def test_unknown_fields_are_pruned_or_refused_alike(kube: Kube, tmp_path: Path) -> None:
    doc = copy.deepcopy(example("trainingplan.yaml"))
    doc["spec"]["colour"] = "red"
    doc["spec"]["strategy"]["colour"] = "blue"
    doc["spec"]["template"]["anything"] = 1  # the template preserves unknown fields
    async with running_emulator(crds_dir=REPO / "crds", tmp_path=tmp_path) as emulator:
        (real_code, real), (emu_code, emu) = await _both(kube, emulator, doc)
        assert (real_code, emu_code) == (201, 201)
        for stored in (real, emu):
            assert "colour" not in stored["spec"] and "colour" not in stored["spec"]["strategy"]
            assert stored["spec"]["template"]["anything"] == 1
        assert real["spec"] == emu["spec"]
        (real_code, real), (emu_code, emu) = await _both(
            kube, emulator, doc, fieldValidation="Strict"
        )
        assert (real_code, emu_code) == (400, 400)
        for answer in (real, emu):
            assert 'unknown field "spec.colour"' in answer["message"]
            assert 'unknown field "spec.strategy.colour"' in answer["message"]


def _spec_schema(crd: Doc) -> Doc:
    return dict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])


def _broken_crds() -> list[tuple[str, Doc, str]]:
    """CRDs kube-apiserver refuses, and what its message names (found by this very test:
    the first two were in the operator's CRDs, which the emulator had accepted)."""
    out = []
    crd = copy.deepcopy(all_crds()["gpupools.yaml"])
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"][
        "x-kubernetes-preserve-unknown-fields"
    ] = False
    out.append(("preserve-false", crd, "x-kubernetes-preserve-unknown-fields: Invalid value"))
    crd = copy.deepcopy(all_crds()["gpupools.yaml"])
    _spec_schema(crd)["x-kubernetes-validations"].append(
        {"rule": "!has(self.network) || !has(self.interNodeLink)", "message": "not both"}
    )
    out.append(("cel-on-a-schemaless-field", crd, "undefined field 'network'"))
    crd = copy.deepcopy(all_crds()["trainingplans.yaml"])
    objective = _spec_schema(crd)["properties"]["objective"]["properties"]
    objective["costBudgetUsd"]["exclusiveMinimum"] = 0  # JSON Schema's, not Kubernetes' OpenAPI
    out.append(("numeric-exclusive-minimum", crd, "exclusiveMinimum"))  # 400: a decoding error
    return out


async def test_crds_the_real_server_refuses_the_emulator_refuses(
    kube: Kube, tmp_path: Path
) -> None:
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    async with running_emulator(tmp_path=tmp_path) as emulator:
        for case, crd, named in _broken_crds():
            code, real = kube.request("POST", path, crd, params={"dryRun": "All"})
            assert code in (400, 422) and named in real.get("message", ""), (case, real)
            emu_code, emu = await emulator.api("POST", path, crd, params={"dryRun": "All"})
            assert (emu_code, named in emu.get("message", "")) == (code, True), (
                case,
                real["message"],
                emu["message"],
            )
