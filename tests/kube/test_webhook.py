"""The operator's placement webhook called by the real kube-apiserver over HTTPS, with the
certificate the operator made itself (no cert-manager: it sets the ``caBundle`` of the chart's
webhook configurations): an annotated JobSet and an annotated TrainJob (Kubeflow Trainer's
own TrainJob CRD) are placed, and pass the real JobSet and Kueue webhooks that run after ours;
what cannot run is denied naming the annotation; a configuration with another CA fails the
call, as the server verifies the certificate."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from typing import Any

import pytest
from cryptography import x509

from kube_support import Kube, real_operator
from operator_support import manifest
from placement_support import OPT_IN, OTHER_MANAGER, jobset, trainjob, webhook_configurations
from shardmeter_operator.admission.placement import PLACED_ANNOTATION, WORKLOAD_KIND_LABEL
from support.realkube.pki import CertificateAuthority
from support.realkube.processes import free_port

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]
POOL_A = manifest("gpupool-cluster-a.yaml")
KINDS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")


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
        for config in webhook_configurations(f"https://127.0.0.1:{port}", name=name):
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

        # a TrainJob (Kubeflow Trainer's CRD): one island, its shape in the trainer; created,
        # so both of its webhooks (place-, then check-trainjob: failurePolicy Fail) allowed it
        done = await create(kube, trainjob("tj", ns))
        assert done.returncode == 0, done.stderr
        got = kube.get("trainjobs", ns, "tj")
        assert got is not None
        trainer = got["spec"]["trainer"]
        assert got["metadata"]["annotations"][PLACED_ANNOTATION] == "1×8×8 H200"
        assert trainer["numNodes"] == 8
        assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "8"}}
        assert "--parallelism.data_parallel_shard_degree=64" in trainer["args"]
        assert trainer["args"][:2] == [
            "--module=shardmeter_torchtitan",
            "--config=llama3_8b_torchft",
        ]
        env = {e["name"] for e in trainer["env"]}
        assert "SHARDMETER_PLAN" in env and "MASTER_ADDR" not in env  # Trainer's PET_* rendezvous
        patches = {p["manager"]: p for p in got["spec"]["runtimePatches"]}
        assert OTHER_MANAGER in patches  # another manager's entry is kept
        assert "kueue.x-k8s.io/manager" in patches  # real Kueue's webhook adds its own
        ours = patches["shardmeter.io/placement"]
        (node,) = ours["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        assert node["name"] == "node"
        assert node["template"]["spec"]["template"]["spec"] == {
            "nodeSelector": POOL_A["spec"]["nodeSelector"],
            "tolerations": POOL_A["spec"]["tolerations"],
        }
        plan = await kube.wait_for(
            lambda: (
                (p := kube.get("trainingplans", ns, "tj"))
                and p.get("status", {}).get("phase") == "Planned"
                and p
            ),
            30,
        )
        assert plan["status"]["plan"] == "1×8×8 H200"
        assert plan["metadata"]["labels"][WORKLOAD_KIND_LABEL] == "TrainJob"
        assert plan["metadata"]["ownerReferences"][0]["uid"] == got["metadata"]["uid"]
        # what one island cannot express is refused, naming the annotation
        done = await create(kube, trainjob("many", ns, **{"shardmeter.io/max-islands": "4"}))
        assert done.returncode != 0 and "shardmeter.io/max-islands" in done.stderr
        done = await create(kube, trainjob("diloco", ns, **{"shardmeter.io/strategy": "diloco"}))
        assert done.returncode != 0 and "shardmeter.io/strategy" in done.stderr

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
