"""The JobSet controller and Kueue's manager, installed from their own modules' manifests and
run out of cluster, as envtest runs a webhook server: ``kubectl kustomize config/default`` of the
module (what its release's manifests are made from) gives the Namespace, CRDs, RBAC, the
manager's ServiceAccount and configuration, and the webhook configurations; the Deployment,
Services and certificate Secret stay out. The webhook configurations (and CRD conversion
webhooks) point at ``https://127.0.0.1:<port><path>`` with the control plane's CA as
``caBundle``; the manager serves them with a certificate that CA signed. It runs as its own
ServiceAccount (a TokenRequest token), so its RBAC is the module's."""

from __future__ import annotations

import base64
import copy
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support.cluster import KUBECTL

from . import binaries
from .client import Body, KubeClient
from .controlplane import ControlPlane
from .pki import KeyPair
from .processes import Process, free_port, http_get, start

DROPPED_KINDS = {"Deployment", "Service", "Secret", "APIService"}
WEBHOOK_KINDS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}


@dataclass(frozen=True)
class Addon:
    """What differs between JobSet and Kueue."""

    name: str
    component: Callable[[], binaries.Component]
    binary: str
    namespace: str
    service_account: str
    config_map: str
    config_key: str = "controller_manager_config.yaml"
    fixed_metrics_certs: str | None = None
    """A certificate directory the manager reads at a fixed path, even with metrics off."""


JOBSET = Addon(
    "jobset",
    binaries.jobset,
    "jobset",
    "jobset-system",
    "jobset-controller-manager",
    "jobset-manager-config",
)
KUEUE = Addon(
    "kueue",
    binaries.kueue,
    "kueue",
    "kueue-system",
    "kueue-controller-manager",
    "kueue-manager-config",
    # cmd/kueue/main.go: without internal certificate management Kueue v0.19 loads its metrics
    # certificate from this path at start — even when metrics are off — and exits without it
    fixed_metrics_certs="/etc/kueue/metrics/certs",
)


def rendered(addon: Addon) -> list[Body]:
    """The module's ``config/default``, rendered as its release is."""
    out = subprocess.run(
        [KUBECTL, "kustomize", str(addon.component().config("default"))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _point_at(client_config: dict[str, Any], base_url: str, ca_pem: bytes) -> None:
    service = client_config.pop("service")
    client_config["url"] = base_url + service.get("path", "/")
    client_config["caBundle"] = base64.b64encode(ca_pem).decode()


def rewritten(docs: list[Body], base_url: str, ca_pem: bytes) -> list[Body]:
    """Webhooks served out of cluster: ``clientConfig.service`` → ``url`` + ``caBundle``."""
    out = []
    for doc in copy.deepcopy(docs):
        if doc["kind"] in WEBHOOK_KINDS:
            for hook in doc.get("webhooks", []):
                _point_at(hook["clientConfig"], base_url, ca_pem)
        if doc["kind"] == "CustomResourceDefinition":
            conversion = doc["spec"].get("conversion") or {}
            if conversion.get("strategy") == "Webhook":
                _point_at(conversion["webhook"]["clientConfig"], base_url, ca_pem)
        out.append(doc)
    return out


def wait_established(client: KubeClient, crds: list[Body], process: Process | None = None) -> None:
    import time

    deadline = time.monotonic() + 60
    for crd in crds:
        while True:
            got = client.get("customresourcedefinitions", None, crd["metadata"]["name"]) or {}
            conditions = (got.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {crd['metadata']['name']} not Established in 60 s")
            time.sleep(0.05)


def service_account_token(client: KubeClient, namespace: str, name: str, hours: int = 24) -> str:
    """A bound ServiceAccount token from the TokenRequest API (what a pod gets mounted)."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": hours * 3600},
    }
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    return str(client.call("POST", path, request)["status"]["token"])


def _with_fixed_certs(argv: list[str], path: str, pair: KeyPair, directory: Path) -> list[str]:
    """Run ``argv`` in a private mount namespace whose /etc is an overlay holding ``pair`` at
    ``path`` (under /etc): the manager finds its certificate, the machine's /etc is untouched."""
    relative = Path(path).relative_to("/etc")
    upper, work = directory / "etc-overlay" / "upper", directory / "etc-overlay" / "work"
    work.mkdir(parents=True, exist_ok=True)
    pair.write(upper / relative, "tls")
    mount = f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
    # unshare and sh exec: the manager keeps the PID started (and the parent-death signal)
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'{mount} && exec "$@"',
        "sh",
        *argv,
    ]


def install(
    plane: ControlPlane,
    client: KubeClient,
    addon: Addon,
    directory: Path,
    configure: Callable[[dict[str, Any]], None] = lambda _: None,
    timeout_s: float = 120,
) -> Process:
    """Install ``addon``'s manifests and start its manager; return the started process (the
    caller stops it). ``configure`` edits the manager's configuration (feature gates, …)."""
    component = addon.component()
    directory.mkdir(parents=True, exist_ok=True)
    webhook_port, health_port = free_port(), free_port()
    docs = rewritten(rendered(addon), f"https://127.0.0.1:{webhook_port}", plane.ca.pem)
    config: dict[str, Any] = {}
    webhooks: list[Body] = []
    crds: list[Body] = []
    for doc in docs:
        kind = doc["kind"]
        if kind in DROPPED_KINDS:
            continue
        if kind == "ConfigMap" and doc["metadata"]["name"] == addon.config_map:
            config = yaml.safe_load(doc["data"][addon.config_key])
        if kind in WEBHOOK_KINDS:
            webhooks.append(doc)  # once the server answers: failurePolicy is Fail
            continue
        if kind == "CustomResourceDefinition":
            crds.append(doc)
        client.apply(doc)
    wait_established(client, crds)

    certs = directory / "certs"
    pair = plane.ca.issue(f"{addon.name}-webhook", hosts=("127.0.0.1", "localhost"), server=True)
    pair.write(certs, "tls")  # tls.crt, tls.key: controller-runtime's names
    config.update(
        webhook={"port": webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
        metrics={"bindAddress": "0"},
        health={"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        leaderElection={"leaderElect": False},
        internalCertManagement={"enable": False},
    )
    configure(config)
    config_file = directory / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    token = service_account_token(client, addon.namespace, addon.service_account)
    kubeconfig = plane.token_kubeconfig(directory / "kubeconfig", token, addon.namespace)
    argv = [
        str(component.binary(addon.binary)),
        f"--config={config_file}",
        f"--kubeconfig={kubeconfig}",
        "--zap-log-level=info",
    ]
    if addon.fixed_metrics_certs:
        argv = _with_fixed_certs(argv, addon.fixed_metrics_certs, pair, directory)
    process = start(
        addon.name,
        argv,
        plane.directory / "logs",
        env={"POD_NAMESPACE": addon.namespace, "HOME": str(directory)},
        cwd=directory,
    )
    try:
        process.wait_ready(
            lambda: http_get(f"http://127.0.0.1:{health_port}/readyz") == "ok", timeout_s, "ready"
        )
        for doc in webhooks:
            client.apply(doc)
    except BaseException:
        process.stop()
        raise
    return process
