"""Placement at admission, the pure half without an API server: the annotations parsed (errors
name the annotation), the decision and the mutated JobSet — the same renderer as a launched
TrainingPlan, the TrainingPlan and lighthouse recorded from the workload alone — and what a
TrainJob cannot express."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from operator_support import manifest
from shardmeter.errors import SpecError
from shardmeter_operator.admission import annotations as notes
from shardmeter_operator.admission.placement import (
    PLAN_SPEC_ANNOTATION,
    PlacementRefusedError,
    admission_uid,
    admitted_children,
    place_jobset,
)
from shardmeter_operator.admission.trainjob import place_trainjob
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.decision import PoolView

POOLS = {
    p["metadata"]["name"]: PoolView(spec=p["spec"], status={})
    for p in (manifest("gpupool-cluster-a.yaml"), manifest("gpupool-cluster-b.yaml"))
}
TEMPLATE = manifest("trainingplan.yaml")["spec"]["template"]
ANNOTATIONS = {
    notes.PLACEMENT: "auto",
    notes.MODEL: "llama-3.1-8b",
    notes.TOTAL_TOKENS: "5e10",
    notes.GLOBAL_BATCH_TOKENS: "2097152",
    notes.SEQ_LEN_TOKENS: "8192",
    notes.ACTIVATION_CHECKPOINTING: "full",
    notes.QUALITY_ADJUSTED: "false",
    notes.POOLS: "cluster-a",
}


def jobset(**annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "llama",
            "namespace": "team-a",
            "annotations": {**ANNOTATIONS, **annotations},
        },
        "spec": {
            "replicatedJobs": [{"name": "t", "replicas": 1, "template": copy.deepcopy(TEMPLATE)}]
        },
    }


def place(body: dict[str, Any]) -> Any:
    request = notes.parse(body["metadata"]["annotations"])
    return place_jobset(body, request, request.model, POOLS, {}, OperatorConfig())


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({notes.TOTAL_TOKENS: "lots"}, notes.TOTAL_TOKENS),
        ({notes.TOTAL_TOKENS: "1.5"}, notes.TOTAL_TOKENS),
        ({notes.SEQ_LEN_TOKENS: ""}, notes.SEQ_LEN_TOKENS),
        ({notes.MODEL_CONFIGMAP: "arch"}, notes.MODEL),  # both a preset and a ConfigMap
        ({notes.QUALITY_ADJUSTED: "maybe"}, notes.QUALITY_ADJUSTED),
        ({notes.PLACEMENT: "yes"}, notes.PLACEMENT),
    ],
)
def test_bad_annotations_name_the_annotation(annotations: dict[str, str], named: str) -> None:
    with pytest.raises(SpecError) as err:
        all_ = {**ANNOTATIONS, **annotations}
        notes.opted_in(all_)
        notes.parse(all_)
    assert err.value.field == named


def test_opting_in_and_out() -> None:
    assert notes.opted_in({notes.PLACEMENT: "auto"})
    assert not notes.opted_in({notes.PLACEMENT: "off"}) and not notes.opted_in({})


def test_the_model_from_a_configmap() -> None:
    cm = {"data": {notes.MODEL_KEY: "preset: llama-3.1-8b\nnumLayers: 16\n"}}
    assert notes.model_from_configmap("arch", cm) == {"preset": "llama-3.1-8b", "numLayers": 16}
    for missing in (None, {"data": {}}):
        with pytest.raises(SpecError) as err:
            notes.model_from_configmap("arch", missing)
        assert err.value.field == notes.MODEL_CONFIGMAP


def test_a_placed_jobset_and_what_the_operator_records_for_it() -> None:
    placed = place(jobset())
    body = placed.workload
    assert placed.status.plan == "8×1×8 H200" and len(placed.status.islands) == 8
    assert [r["name"] for r in body["spec"]["replicatedJobs"]] == ["g0"]
    assert body["metadata"]["labels"]["shardmeter.io/trainingplan-uid"] == admission_uid(
        "team-a", "llama"
    )
    assert PLAN_SPEC_ANNOTATION in body["metadata"]["annotations"]
    assert place(jobset()).workload == body  # deterministic
    # the stored workload alone gives the TrainingPlan and the same lighthouse the render made
    stored = {**copy.deepcopy(body), "metadata": {**body["metadata"], "uid": "u-1"}}
    plan, *lighthouse = admitted_children(stored, OperatorConfig())
    assert plan["kind"] == "TrainingPlan" and plan["spec"]["launch"] is False
    assert "template" not in plan["spec"]
    assert [m["kind"] for m in lighthouse] == ["Deployment", "Service"]
    for rendered, recorded in zip(
        placed.extra, [copy.deepcopy(m) for m in lighthouse], strict=True
    ):
        (owner,) = recorded["metadata"].pop("ownerReferences")
        assert (owner["kind"], owner["uid"]) == ("JobSet", "u-1")
        assert recorded == rendered


def test_what_a_runtime_or_shape_cannot_express_is_refused() -> None:
    two = jobset()
    two["spec"]["replicatedJobs"].append(copy.deepcopy(two["spec"]["replicatedJobs"][0]))
    with pytest.raises(PlacementRefusedError, match=r"spec\.replicatedJobs: has 2"):
        place(two)
    old = jobset()
    (c,) = old["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    c["command"] = [*c["command"], "--job.config_file=x.toml"]
    with pytest.raises(PlacementRefusedError, match=r"spec\.replicatedJobs\[0\]\.template"):
        place(old)
    long = jobset()
    long["metadata"]["name"] = "x" * 60
    with pytest.raises(PlacementRefusedError, match=r"metadata\.name"):
        place(long)


def test_a_trainjob_is_one_island() -> None:
    body = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "llama", "namespace": "team-a", "annotations": dict(ANNOTATIONS)},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"args": ["--module=shardmeter_torchtitan", "--config=llama3_8b_torchft"]},
        },
    }
    for extra, named in [
        ({notes.MAX_ISLANDS: "2"}, notes.MAX_ISLANDS),
        ({notes.STRATEGY: "diloco"}, notes.STRATEGY),
    ]:
        request = notes.parse({**ANNOTATIONS, **extra})
        with pytest.raises(PlacementRefusedError, match=named):
            place_trainjob(body, request, request.model, POOLS, {}, OperatorConfig())
    request = notes.parse(ANNOTATIONS)
    placed = place_trainjob(body, request, request.model, POOLS, {}, OperatorConfig())
    trainer = placed.workload["spec"]["trainer"]
    assert placed.status.plan == "1×8×8 H200" and trainer["numNodes"] == 8
    assert placed.extra == []  # FSDP: no lighthouse
