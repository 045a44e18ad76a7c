"""The in-memory emulator (which the fast operator tests use) against the real kube-apiserver:
the same writes of built-in objects — the names, labels and limits the emulator enforces,
a wrongly typed field, an unknown one — sent to both; the answers' status codes and reasons
must agree. (The custom resources' part is test_crds.py's.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kube_support import Kube
from support.cluster import running_emulator

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
Doc = dict[str, Any]


def job(name: str, completions: int | None = None, **spec: Any) -> Doc:
    body: Doc = {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}, **spec}
    body["template"]["spec"]["restartPolicy"] = "Never"
    if completions is not None:
        body.update(completionMode="Indexed", completions=completions, parallelism=completions)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": body}


def configmap(name: str, **meta: Any) -> Doc:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta}}


def service(name: str) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"clusterIP": "None", "ports": [{"port": 80}]},
    }


def gpupool_event(name: str) -> Doc:
    """An Event about a GPUPool (cluster-scoped): kube-apiserver keeps those in default."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {
            "apiVersion": "shardmeter.io/v1alpha1",
            "kind": "GPUPool",
            "name": "cluster-a",
        },
        "reason": "BenchmarkFailed",
        "message": "m",
        "type": "Warning",
    }


def _typo() -> Doc:
    doc = job("typo")
    doc["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    return doc


CASES: list[tuple[str, str, Doc, dict[str, str]]] = [
    # (case, resource path under the namespace, body, query parameters)
    ("indexed-61", "/apis/batch/v1/jobs", job("a" * 61, completions=10), {}),
    ("indexed-62", "/apis/batch/v1/jobs", job("b" * 62, completions=10), {}),
    ("job-64", "/apis/batch/v1/jobs", job("c" * 64), {}),
    ("service-digit", "/api/v1/services", service("8b-run-island-0"), {}),
    ("configmap-dots", "/api/v1/configmaps", configmap("8b.run"), {}),
    ("configmap-upper", "/api/v1/configmaps", configmap("Upper"), {}),
    (
        "label-64",
        "/api/v1/configmaps",
        configmap("l", labels={"shardmeter.io/plan": "x" * 64}),
        {},
    ),
    (
        "annotations-256k",
        "/api/v1/configmaps",
        configmap("big", annotations={"a": "x" * (256 * 1024)}),
        {},
    ),
    ("mistyped", "/apis/batch/v1/jobs", _typo(), {}),
    ("cluster-event-elsewhere", "/api/v1/events", gpupool_event("e1"), {}),
    (
        "unknown-strict",
        "/apis/batch/v1/jobs",
        job("unknown", completionsMode="Indexed"),
        {"fieldValidation": "Strict"},
    ),
]


EXPECTED_DIFFERENCES = {
    "service-digit": (
        "v1.37 accepts a Service name that starts with a digit (relaxed Service name "
        "validation, on by default in recent minors); the chart supports v1.27 and later, "
        "which refuse it as no DNS-1035 label — the emulator keeps the older, stricter rule, "
        "and the operator never makes such a name"
    ),
}
"""Cases where the emulator deliberately answers as an older supported minor does."""


async def test_built_in_writes_are_answered_alike(kube: Kube, tmp_path: Path) -> None:
    answers = []
    async with running_emulator(crds_dir=REPO / "crds", tmp_path=tmp_path) as emulator:
        for case, resource, body, params in CASES:
            root, _, plural = resource.rpartition("/")
            path = f"{root}/namespaces/{kube.ns}/{plural}"
            query = {"dryRun": "All", **params}
            real_code, real = kube.request("POST", path, body, params=query)
            emu_code, emu = await emulator.api("POST", path, body, params=query)
            answers.append((case, (real_code, real.get("reason")), (emu_code, emu.get("reason"))))
    differ = {case: (real, emu) for case, real, emu in answers if real != emu}
    assert set(differ) == set(EXPECTED_DIFFERENCES), differ
    assert differ["service-digit"] == ((201, None), (422, "Invalid"))
    # an Event about a cluster-scoped object is accepted in default only
    path = "/api/v1/namespaces/default/events"
    code, _ = kube.request("POST", path, gpupool_event("e2"), params={"dryRun": "All"})
    assert code == 201
    # and the cases cover every outcome
    assert {real[0] for _, real, _ in answers} == {201, 400, 422}
