"""The operator's placement webhook called by the real kube-apiserver over HTTPS, with the
certificate the operator made itself (no cert-manager: it sets the ``caBundle`` of the chart's
webhook configurations): an annotated JobSet and an annotated TrainingJob (Kubeflow Trainer's
own TrainJob CRD) are placed, and pass the real JobSet and Kueue webhooks that run after ours;
what cannot run is denied naming the annotation; a configuration with another CA fails the
call, as the server verifies the certificate."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
from typing import Any

import pytest
from cryptography import x509

from kube_support import Kube, real_operator
from operator_support import manifest
from shardmeter_operator.admission.placement import PLACED_ANNOTATION, WORKLOAD_KIND_LABEL
from support.realkube.pki import CertificateAuthority
from support.realkube.processes import free_port

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]
OPT_IN = {"shardmeter.io/auto-placement": "enabled"}
PLAN = manifest("trainingplan.yaml")
POOL_A = manifest("gpupool-cluster-a.yaml")
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
KINDS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")


def jobset(name: str, namespace: str, **annotations: str) -> dict[str, Any]:
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


def trainjob(name: str, namespace: str, **annotations: str) -> dict[str, Any]:
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
        },
    }


def configurations(name: str, url: str) -> list[dict[str, Any]]:
    """The chart's webhook configurations (templates/webhook.yaml), pointed at ``url``."""

    def hook(step: str, kind: str, group: str, version: str) -> dict[str, Any]:
        return {
            "name": f"{step}-{kind}.shardmeter.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"{url}/{step}-{kind}"},
            "rules": [
                {
                    "apiGroups": [group],
                    "apiVersions": [version],
                    "operations": ["CREATE"] if step == "place" else ["CREATE", "UPDATE"],
                    "resources": [f"{kind}s"],
                    "scope": "Namespaced",
                }
            ],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "timeoutSeconds": 10,
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


async def create(kube: Kube, body: dict[str, Any]) -> Any:
    return await kube.kubectl("create", "-f", "-", input=json.dumps(body), check=False)


async def test_the_real_api_server_calls_the_operators_webhook_with_its_own_certificate(
    kube: Kube,
) -> None:
    ns = kube.ns
    kube.patch("namespaces", None, ns, {"metadata": {"labels": OPT_IN}})
    kube.apply(POOL_A)
    port = free_port()
    name = f"shardmeter-{ns}"  # the configurations are cluster-scoped: one per test
    async with real_operator(kube, namespaces=(ns,), admission_port=port, admission_inject_ca=name):
        for config in configurations(name, f"https://127.0.0.1:{port}"):
            kube.apply(config)

        def bundles() -> set[str]:
            return {
                h["clientConfig"].get("caBundle", "")
                for kind in KINDS
                for h in (kube.get(kind, None, name) or {}).get("webhooks", [{}])
            }

        (ca,) = await kube.wait_for(lambda: (b := bundles()) and "" not in b and b, 60)
        cert = x509.load_pem_x509_certificate(base64.b64decode(ca))
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
        assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        served = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
        assert x509.load_pem_x509_certificate(served.encode()) == cert  # what the server sees
        await kube.wait_for(lambda: kube.get("gpupools", None, "cluster-a"), 30)

        # a JobSet: placed by ours, then defaulted and validated by JobSet's and Kueue's
        async def placed() -> Any:  # until kopf's webhook server answers
            done = await create(kube, jobset("llama", ns))
            return done if done.returncode == 0 or "denied" in done.stderr else None

        done = await kube.wait_for(placed, 60)
        assert done.returncode == 0, done.stderr
        got = kube.get("jobsets", ns, "llama")
        assert got is not None
        assert got["metadata"]["annotations"][PLACED_ANNOTATION] == "8×1×8 H200"
        (group,) = got["spec"]["replicatedJobs"]
        assert (group["name"], group["replicas"]) == ("g0", 8)
        pod = group["template"]["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == POOL_A["spec"]["nodeSelector"]
        # JobSet's own defaulting webhook ran after ours
        assert got["spec"]["successPolicy"]["operator"] == "All"
        plan = await kube.wait_for(lambda: kube.get("trainingplans", ns, "llama"), 30)
        assert plan["metadata"]["ownerReferences"][0]["uid"] == got["metadata"]["uid"]
        # the real JobSet controller makes the islands' Jobs from the placed spec
        await kube.wait_for(lambda: len(kube.list("jobs", ns)) == 8, 60)

        # denied, naming the annotation, as the real server reports a webhook's denial
        done = await create(kube, jobset("bad", ns, **{"shardmeter.io/total-tokens": "lots"}))
        assert done.returncode != 0
        assert 'admission webhook "place-jobset.shardmeter.io" denied the request' in done.stderr
        assert "shardmeter.io/total-tokens" in done.stderr

        # a TrainJob (Kubeflow Trainer's CRD): one island, its shape in the trainer
        done = await create(kube, trainjob("tj", ns))
        assert done.returncode == 0, done.stderr
        got = kube.get("trainjobs", ns, "tj")
        assert got is not None
        assert got["metadata"]["annotations"][PLACED_ANNOTATION] == "1×8×8 H200"
        assert got["spec"]["trainer"]["numNodes"] == 8
        assert got["spec"]["trainer"]["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "8"}}
        (ours,) = [
            p for p in got["spec"]["runtimePatches"] if p["manager"] == "shardmeter.io/placement"
        ]
        (node,) = ours["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        assert (
            node["template"]["spec"]["template"]["spec"]["nodeSelector"]
            == (POOL_A["spec"]["nodeSelector"])
        )
        plan = await kube.wait_for(lambda: kube.get("trainingplans", ns, "tj"), 30)
        assert plan["metadata"]["labels"][WORKLOAD_KIND_LABEL] == "TrainJob"
        done = await create(kube, trainjob("many", ns, **{"shardmeter.io/max-islands": "4"}))
        assert done.returncode != 0 and "shardmeter.io/max-islands" in done.stderr

        # the server verifies the certificate: another CA in the configuration fails the call
        other = base64.b64encode(CertificateAuthority("other").pem).decode()
        assert other != ca
        for kind in KINDS:
            config = kube.get(kind, None, name)
            assert config is not None
            for hook in config["webhooks"]:
                hook["clientConfig"]["caBundle"] = other
            kube.call("PUT", kube.resource(kind).path(None, name), config)
        done = await create(kube, jobset("unverified", ns))
        assert done.returncode != 0 and "failed calling webhook" in done.stderr
        assert "x509" in done.stderr or "certificate" in done.stderr, done.stderr
        assert kube.get("jobsets", ns, "unverified") is None
