"""The emulated API server rejects what kube-apiserver rejects: Kubernetes' own schemas and name
rules for built-in objects, structural schemas, pruning, defaults and CEL rules for custom
resources, the annotation and request size limits — and serves /openapi/v3 so that the real
``kubectl apply`` validates (strict) without ``--validate=false``."""

from __future__ import annotations

import copy
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import yaml

from support.cluster import EmulatedCluster, KubectlError, running_emulator

REPO = pathlib.Path(__file__).resolve().parents[2]
JOBS = "/apis/batch/v1/namespaces/default/jobs"
PLANS = "/apis/shardmeter.io/v1alpha1/namespaces/default/trainingplans"
pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def cluster(tmp_path: pathlib.Path) -> AsyncIterator[EmulatedCluster]:
    async with running_emulator(crds_dir=REPO / "crds", tmp_path=tmp_path) as cluster:
        yield cluster
        assert not cluster.emulator.failures


def job(name: str, completions: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}
    if completions is not None:
        spec.update(completionMode="Indexed", completions=completions, parallelism=completions)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def plan() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "examples" / "trainingplan.yaml").read_text()))


async def test_indexed_job_names_leave_room_for_the_pod_index(cluster: EmulatedCluster) -> None:
    # <name>-<completions-1> must be a DNS-1123 label (≤ 63): the pods' hostname
    assert (await cluster.api("POST", JOBS, job("a" * 61, completions=10)))[0] == 201
    status, error = await cluster.api("POST", JOBS, job("b" * 62, completions=10))
    assert (status, error["reason"]) == (422, "Invalid")
    assert "will not able to create pod with invalid DNS label" in error["message"]
    # any Job: its name becomes the pods' job-name label value (≤ 63)
    status, error = await cluster.api("POST", JOBS, job("c" * 64))
    assert status == 422 and "63" in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "accepted"),
    [
        ("/api/v1/namespaces/default/services", {"metadata": {"name": "8b-run-island-0"}}, False),
        ("/api/v1/namespaces/default/services", {"metadata": {"name": "p8b-run-island-0"}}, True),
        ("/api/v1/namespaces/default/services", {"metadata": {"name": "a.b"}}, False),
        ("/api/v1/namespaces/default/configmaps", {"metadata": {"name": "8b.run"}}, True),
        ("/api/v1/namespaces/default/configmaps", {"metadata": {"name": "Upper"}}, False),
        (
            "/api/v1/namespaces/default/configmaps",
            {"metadata": {"name": "l", "labels": {"shardmeter.io/plan": "x" * 64}}},
            False,
        ),
    ],
)
async def test_built_in_names_and_labels(
    cluster: EmulatedCluster, path: str, body: dict[str, Any], accepted: bool
) -> None:
    status, _ = await cluster.api("POST", path, body)
    assert status == (201 if accepted else 422)


async def test_built_in_objects_are_validated_against_kubernetes_schemas(
    cluster: EmulatedCluster,
) -> None:
    bad = job("typo")
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    status, error = await cluster.api("POST", JOBS, bad)
    assert status == 400 and "imagePullPolicy" in error["message"]  # cannot be decoded
    unknown = job("unknown")
    unknown["spec"]["completionsMode"] = "Indexed"  # a misspelled field
    status, error = await cluster.api("POST", JOBS, unknown)
    assert status == 400 and "completionsMode" in error["message"]


@pytest.mark.filterwarnings("ignore:Sending a large body:ResourceWarning")  # aiohttp, the client
async def test_annotation_and_request_size_limits(cluster: EmulatedCluster) -> None:
    cms = "/api/v1/namespaces/default/configmaps"
    big = {"metadata": {"name": "big", "annotations": {"a": "x" * (256 * 1024)}}}
    status, error = await cluster.api("POST", cms, big)
    assert status == 422 and "262144 bytes" in error["message"]
    huge = {"metadata": {"name": "huge"}, "data": {"d": "x" * (3 * 1024 * 1024)}}
    status, error = await cluster.api("POST", cms, huge)
    assert (status, error["reason"]) == (413, "RequestEntityTooLarge")


async def test_custom_resources_are_pruned_defaulted_and_validated(
    cluster: EmulatedCluster,
) -> None:
    doc = plan()
    doc["spec"]["colour"] = "red"
    del doc["spec"]["launch"]
    status, stored = await cluster.api("POST", PLANS, doc)
    assert status == 201
    assert "colour" not in stored["spec"] and stored["spec"]["launch"] is False  # default
    assert any("spec.colour" in w for w in cluster.emulator.warnings)
    # a status with a field the schema lacks: silently pruned, as a real server does
    status, stored = await cluster.api(
        "PATCH",
        f"{PLANS}/{doc['metadata']['name']}/status",
        {"status": {"phase": "Planned", "renamedField": 1}},
        content_type="application/merge-patch+json",
    )
    assert status == 200 and stored["status"]["phase"] == "Planned"
    assert "renamedField" not in stored["status"]
    bad = copy.deepcopy(plan())
    bad["metadata"]["name"] = "cel"
    bad["spec"]["strategy"].update(syncEvery=10, fragments=3)
    status, error = await cluster.api("POST", PLANS, bad)
    assert status == 422 and "syncEvery must be a multiple of fragments" in error["message"]
    strict = copy.deepcopy(plan())
    strict["metadata"]["name"] = "strict"
    strict["spec"]["colour"] = "red"
    status, error = await cluster.api("POST", PLANS, strict, params={"fieldValidation": "Strict"})
    assert status == 400 and 'unknown field "spec.colour"' in error["message"]


async def test_crds_that_kube_apiserver_refuses_are_refused(cluster: EmulatedCluster) -> None:
    crd = yaml.safe_load((REPO / "crds" / "trainingplans.yaml").read_text())
    objective = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["objective"]["properties"]
    objective["costBudgetUsd"]["exclusiveMinimum"] = 0  # JSON Schema 2020, not Kubernetes'
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainingplans.shardmeter.io"
    status, error = await cluster.api("PUT", path, crd)
    assert status in (400, 422) and "exclusiveMinimum" in error["message"]
    crd = yaml.safe_load((REPO / "crds" / "trainingplans.yaml").read_text())
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "untyped"
    ] = {"description": "no type"}
    status, error = await cluster.api("PUT", path, crd)
    assert status == 422 and "untyped" in error["message"]


async def test_kubectl_apply_validates_without_flags(cluster: EmulatedCluster) -> None:
    examples = REPO / "examples"
    out = await cluster.kubectl(
        "apply",
        "-f",
        str(examples / "gpupool-cluster-a.yaml"),
        "-f",
        str(examples / "trainingplan.yaml"),
    )
    assert "created" in out.stdout
    typo = yaml.safe_dump({**plan(), "spec": {**plan()["spec"], "modle": "x"}})
    with pytest.raises(KubectlError) as info:
        await cluster.kubectl("apply", "-f", "-", input=typo)
    assert 'unknown field "spec.modle"' in info.value.stderr
