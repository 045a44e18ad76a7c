"""What placement at admission is asked with, for the tests against the emulated and the real
API server and for benchmarks/bench_admission.py: the annotations of an annotated JobSet or
TrainJob (the example TrainingPlan's settings on pool cluster-a), the workloads as an ML
engineer submits them, and the chart's webhook configurations pointed at a test's URL."""

from __future__ import annotations

import copy
from typing import Any

from operator_support import manifest

OPT_IN = {"shardmeter.io/auto-placement": "enabled"}
"""The namespace label that opts a namespace in (the configurations' namespaceSelector)."""
PLAN = manifest("trainingplan.yaml")
ANNOTATIONS = {
    "shardmeter.io/placement": "auto",
    "shardmeter.io/model": "llama-3.1-8b",
    "shardmeter.io/total-tokens": "5e10",
    "shardmeter.io/global-batch-tokens": "2097152",
    "shardmeter.io/seq-len-tokens": "8192",
    "shardmeter.io/activation-checkpointing": "full",
    "shardmeter.io/quality-adjusted": "false",
    "shardmeter.io/pools": "cluster-a",
}

OTHER_MANAGER = "platform.example.com/defaults"
"""The manager of the runtime patch a submitted `trainjob` carries already."""


def jobset(name: str, namespace: str = "team-a", **annotations: str) -> dict[str, Any]:
    """A JobSet as an ML engineer submits it: one replicated Job, the trainer's."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"team": "llm"},
            "annotations": {**ANNOTATIONS, **annotations},
        },
        "spec": {
            "replicatedJobs": [
                {
                    "name": "trainer",
                    "replicas": 1,
                    "template": copy.deepcopy(PLAN["spec"]["template"]),
                }
            ]
        },
    }


def trainjob(name: str, namespace: str = "team-a", **annotations: str) -> dict[str, Any]:
    """A Kubeflow Trainer v2 TrainJob as an ML engineer submits it (the torch runtime), with
    another manager's runtime patch already on it (not Kueue's: real Kueue's webhook adds its
    own, and the CRD refuses a second entry of one manager)."""
    (container,) = PLAN["spec"]["template"]["spec"]["template"]["spec"]["containers"]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {**ANNOTATIONS, "shardmeter.io/strategy": "fsdp", **annotations},
        },
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "image": container["image"],
                "command": ["torchrun", "-m", "torchtitan.train"],
                "args": [a for a in container["command"] if a.startswith(("--module", "--config"))],
            },
            "runtimePatches": [{"manager": OTHER_MANAGER, "trainingRuntimeSpec": {}}],
        },
    }


def webhook_configurations(
    url: str, *, name: str = "shardmeter", ca: str = "", failure: str = "Fail", timeout_s: int = 10
) -> list[dict[str, Any]]:
    """What the chart installs (deploy/helm/shardmeter/templates/webhook.yaml), pointed at
    ``url``; without ``caBundle`` when ``ca`` is empty (the operator sets it with
    ``admission_inject_ca``)."""

    def hook(step: str, kind: str, group: str, version: str) -> dict[str, Any]:
        return {
            "name": f"{step}-{kind}.shardmeter.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"{url}/{step}-{kind}", **({"caBundle": ca} if ca else {})},
            "rules": [
                {
                    "apiGroups": [group],
                    "apiVersions": [version],
                    "operations": ["CREATE"] if step == "place" else ["CREATE", "UPDATE"],
                    "resources": [f"{kind}s"],
                    "scope": "Namespaced",
                }
            ],
            "failurePolicy": failure,
            "sideEffects": "None",
            "timeoutSeconds": timeout_s,
            "namespaceSelector": {"matchLabels": OPT_IN},
        }

    def hooks(step: str) -> list[dict[str, Any]]:
        return [
            hook(step, "jobset", "jobset.x-k8s.io", "v1alpha2"),
            hook(step, "trainjob", "trainer.kubeflow.org", "v1alpha1"),
        ]

    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": name},
            "webhooks": hooks(step),
        }
        for kind, step in (
            ("MutatingWebhookConfiguration", "place"),
            ("ValidatingWebhookConfiguration", "check"),
        )
    ]
