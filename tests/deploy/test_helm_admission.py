"""The chart's placement webhook (``admission.enabled``): the webhook Service, the Mutating- and
ValidatingWebhookConfiguration (failurePolicy, namespaceSelector, timeoutSeconds, sideEffects
None), certificates through cert-manager or the operator's self-signed path, the operator's
flags — rendered by a real Helm (helm-python-sdk), validated with Kubernetes' own schemas and
applied to the emulated API server with kubectl."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from shardmeter_operator.__main__ import parse as parse_operator_args
from support.kube_emulator import builtins
from support.kube_versions import SUPPORTED_MINORS

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "shardmeter"
RELEASE, NAMESPACE = "sm", "shardmeter-system"
FULLNAME = f"{RELEASE}-shardmeter"
Doc = dict[str, Any]


def render(admission: Doc) -> list[Doc]:
    with helm.Chart.load(CHART) as chart:
        out = chart.render({"admission": admission}, name=RELEASE, namespace=NAMESPACE)
    return [
        d
        for path, text in sorted(out.items())
        if not path.endswith(".txt")
        for d in yaml.safe_load_all(text)
        if d
    ]


def of(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def args_of(docs: list[Doc]) -> Any:
    (deployment,) = of(docs, "Deployment")
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return parse_operator_args(c["args"]), c, deployment["spec"]["template"]["spec"]


CERT_MANAGER = {"enabled": True, "certificates": "cert-manager"}
SELF_SIGNED = {"enabled": True, "certificates": "self-signed", "failurePolicy": "Ignore"}


def test_disabled_by_default() -> None:
    docs = render({"enabled": False})
    assert not [d for d in docs if "Webhook" in d["kind"] or d["kind"] == "Certificate"]
    args, _, _ = args_of(docs)
    assert args.admission_port is None


def test_webhook_configurations_select_the_opted_in_namespaces() -> None:
    docs = render(CERT_MANAGER)
    (service,) = [s for s in of(docs, "Service") if s["metadata"]["name"] == f"{FULLNAME}-webhook"]
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    for kind, path in [
        ("MutatingWebhookConfiguration", "/place-jobset"),
        ("ValidatingWebhookConfiguration", "/check-jobset"),
    ]:
        (config,) = of(docs, kind)
        hook, trainjob = config["webhooks"]
        assert trainjob["rules"][0]["resources"] == ["trainjobs"]
        assert trainjob["clientConfig"]["service"]["path"] == path.replace("jobset", "trainjob")
        assert hook["clientConfig"]["service"] == {
            "name": f"{FULLNAME}-webhook",
            "namespace": NAMESPACE,
            "path": path,
            "port": 443,
        }
        assert (hook["failurePolicy"], hook["sideEffects"], hook["timeoutSeconds"]) == (
            "Fail",
            "None",
            10,
        )
        assert hook["namespaceSelector"] == {
            "matchLabels": {"shardmeter.io/auto-placement": "enabled"}
        }
        assert hook["rules"][0]["resources"] == ["jobsets"]
        assert config["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{FULLNAME}-webhook"
        }
    named = render({**CERT_MANAGER, "namespaces": ["team-a", "team-b"]})
    (config,) = of(named, "MutatingWebhookConfiguration")
    assert config["webhooks"][0]["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]
    }


def test_cert_manager_signs_the_certificate_the_operator_serves() -> None:
    docs = render(CERT_MANAGER)
    (cert,) = of(docs, "Certificate")
    assert cert["spec"]["dnsNames"][0] == f"{FULLNAME}-webhook.{NAMESPACE}.svc"
    assert cert["spec"]["issuerRef"] == {"name": f"{FULLNAME}-webhook", "kind": "Issuer"}
    assert len(of(docs, "Issuer")) == 1
    args, c, pod = args_of(docs)
    assert args.admission_port == 9443 and args.admission_cert_dir == "/etc/shardmeter/webhook"
    assert args.admission_inject_ca is None
    assert args.admission_host == f"{FULLNAME}-webhook.{NAMESPACE}.svc"
    assert (args.admission_timeout, args.admission_failure) == (5, "closed")
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in c["ports"]
    (secret,) = [v for v in pod["volumes"] if v["name"] == "webhook-tls"]
    assert secret["secret"]["secretName"] == cert["spec"]["secretName"]
    issued = render({**CERT_MANAGER, "issuer": {"name": "corp-ca", "kind": "ClusterIssuer"}})
    assert of(issued, "Issuer") == []
    assert of(issued, "Certificate")[0]["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


def test_self_signed_the_operator_sets_the_ca_bundle() -> None:
    docs = render(SELF_SIGNED)
    assert of(docs, "Certificate") == [] and of(docs, "Issuer") == []
    args, _, pod = args_of(docs)
    assert args.admission_inject_ca == FULLNAME and args.admission_cert_dir is None
    assert not [v for v in pod["volumes"] if v["name"] == "webhook-tls"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (config,) = of(docs, kind)
        assert config["metadata"]["name"] == FULLNAME  # what --admission-inject-ca names
        assert "annotations" not in config["metadata"]
        assert config["webhooks"][0]["failurePolicy"] == "Ignore"
    # auto without cert-manager's API (a client-side render): self-signed
    assert args_of(render({"enabled": True}))[0].admission_inject_ca == FULLNAME


@pytest.mark.parametrize("minor", [SUPPORTED_MINORS[0], SUPPORTED_MINORS[-1]])
def test_rendered_webhook_objects_validate_against_kubernetes(minor: str) -> None:
    for doc in render(CERT_MANAGER) + render(SELF_SIGNED):
        if doc["apiVersion"].startswith(("cert-manager.io/", "apiextensions.k8s.io/")):
            continue  # cert-manager's kinds: no upstream schema; CRDs: test_helm.py
        assert builtins.validate(doc, minor) == [], (doc["kind"], doc["metadata"]["name"])


@pytest.mark.asyncio
async def test_the_self_signed_render_applies_to_the_emulated_api_server(tmp_path: Path) -> None:
    from support.cluster import running_emulator

    docs = render(SELF_SIGNED)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    async with running_emulator(tmp_path=tmp_path) as cluster:
        await cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(namespace))
        await cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))  # strict
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            assert cluster.get(kind, None, FULLNAME) is not None


def test_the_validating_webhook_sees_updates_and_the_mutating_one_creates_only() -> None:
    """Placement happens on create; an admitted workload's placement record is checked on
    every update (docs/admission.md)."""
    docs = render(CERT_MANAGER)
    for kind, operations in [
        ("MutatingWebhookConfiguration", ["CREATE"]),
        ("ValidatingWebhookConfiguration", ["CREATE", "UPDATE"]),
    ]:
        (config,) = of(docs, kind)
        assert [h["rules"][0]["operations"] for h in config["webhooks"]] == [operations] * 2
