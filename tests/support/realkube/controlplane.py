"""A real Kubernetes control plane on loopback, as controller-runtime's envtest and Kueue's
integration tests start one — and a little more: etcd; kube-apiserver with secure serving
(certificates made per run), client-certificate and service-account-token authentication,
RBAC authorization, the admission plugins a cluster enables by default plus
``OwnerReferencesPermissionEnforcement``, service-account token signing and an audit log of
the requests made by service accounts of :data:`AUDITED_NAMESPACE`; kube-controller-manager
with the Job, garbage-collector, namespace, ServiceAccount and root-CA controllers, each with its
own service-account credentials as in a kubeadm cluster. No scheduler, no kubelet: pods stay
``Pending`` unless a test patches their status (:mod:`.cluster`)."""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import binaries
from .kubeconfig import kubeconfig, write
from .pki import CertificateAuthority, KeyPair, signing_key_pair
from .processes import Process, free_port, http_get, start, stopping

AUDITED_NAMESPACE = "shardmeter-system"
"""Requests by this namespace's service accounts (the operator's, with the chart's RBAC) go
to the audit log, so a test can list exactly which permissions the operator used."""

KCM_CONTROLLERS = (
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
)

ADMISSION_PLUGINS = ("OwnerReferencesPermissionEnforcement",)
"""Enabled on top of kube-apiserver's default set (NamespaceLifecycle, LimitRanger,
ServiceAccount, PodSecurity, Priority, DefaultTolerationSeconds, …, MutatingAdmissionWebhook,
ValidatingAdmissionPolicy, ValidatingAdmissionWebhook, ResourceQuota): the one that makes
``blockOwnerDeletion`` need ``update`` on the owner's ``finalizers``."""


@dataclass
class ControlPlane:
    """A started control plane: its URL, CA and kubeconfigs (files under ``directory``)."""

    name: str
    directory: Path
    url: str
    ca: CertificateAuthority
    admin: KeyPair
    admin_kubeconfig: Path
    processes: list[Process]

    @property
    def audit_log(self) -> Path:
        return self.directory / "audit.log"

    def client_kubeconfig(
        self, path: Path, user: str, groups: tuple[str, ...] = (), namespace: str = "default"
    ) -> Path:
        """A kubeconfig with a client certificate for ``user`` in ``groups``."""
        pair = self.ca.issue(user, organizations=groups, client=True)
        return write(
            path,
            kubeconfig(
                self.url,
                self.ca.pem,
                name=self.name,
                cert_pem=pair.cert,
                key_pem=pair.key,
                namespace=namespace,
            ),
        )

    def token_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> Path:
        """A kubeconfig that authenticates with a bearer token (a ServiceAccount's)."""
        return write(
            path,
            kubeconfig(self.url, self.ca.pem, name=self.name, token=token, namespace=namespace),
        )

    def check_running(self) -> None:
        for process in self.processes:
            process.check_running()


def admin_ssl_context(ca: CertificateAuthority, admin: KeyPair, directory: Path) -> ssl.SSLContext:
    crt, key = admin.write(directory / "pki", "admin")
    context = ssl.create_default_context(cadata=ca.pem.decode())
    context.load_cert_chain(crt, key)
    return context


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": [f"system:serviceaccounts:{AUDITED_NAMESPACE}"]},
        {"level": "None"},
    ],
}


@contextlib.contextmanager
def control_plane(
    directory: Path, name: str = "kube", timeout_s: float = 120
) -> Iterator[ControlPlane]:
    """Start etcd, kube-apiserver and kube-controller-manager; stop them (by PID) at exit."""
    kube, etcd = binaries.kubernetes(), binaries.etcd()
    pki = directory / "pki"
    ca = CertificateAuthority(f"{name}-ca")
    ca_file = pki / "ca.crt"
    pki.mkdir(parents=True, exist_ok=True)
    ca_file.write_bytes(ca.pem)
    serving_crt, serving_key = ca.issue(
        "kube-apiserver", hosts=("127.0.0.1", "localhost", "kubernetes.default.svc"), server=True
    ).write(pki, "apiserver")
    sa_private, sa_public = signing_key_pair()
    (pki / "sa.key").write_bytes(sa_private)
    (pki / "sa.pub").write_bytes(sa_public)
    admin = ca.issue("shardmeter-test-admin", organizations=("system:masters",), client=True)
    logs = directory / "logs"
    (directory / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))

    with stopping([]) as processes:
        client_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        processes.append(
            start(
                "etcd",
                [
                    str(etcd.binary("etcd")),
                    f"--name={name}-etcd",
                    f"--data-dir={directory / 'etcd'}",
                    f"--listen-client-urls={etcd_url}",
                    f"--advertise-client-urls={etcd_url}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-cluster={name}-etcd=http://127.0.0.1:{peer_port}",
                    "--unsafe-no-fsync",  # a test cluster: durability is not the point
                    "--log-level=warn",
                ],
                logs,
            )
        )
        processes[-1].wait_ready(
            lambda: json.loads(http_get(f"{etcd_url}/health"))["health"] == "true",
            timeout_s,
            "healthy",
        )

        url = f"https://127.0.0.1:{api_port}"
        processes.append(
            start(
                "kube-apiserver",
                [
                    str(kube.binary("kube-apiserver")),
                    f"--etcd-servers={etcd_url}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    "--endpoint-reconciler-type=none",  # no kubernetes Endpoints: loopback
                    f"--secure-port={api_port}",
                    f"--tls-cert-file={serving_crt}",
                    f"--tls-private-key-file={serving_key}",
                    f"--client-ca-file={ca_file}",
                    f"--cert-dir={pki}",
                    "--authorization-mode=RBAC",
                    f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
                    f"--service-account-issuer={url}",
                    f"--service-account-key-file={pki / 'sa.pub'}",
                    f"--service-account-signing-key-file={pki / 'sa.key'}",
                    "--service-cluster-ip-range=10.96.0.0/16",
                    "--allow-privileged=true",
                    f"--audit-policy-file={directory / 'audit-policy.yaml'}",
                    f"--audit-log-path={directory / 'audit.log'}",
                    "--profiling=false",
                    "--v=1",
                ],
                logs,
            )
        )
        context = admin_ssl_context(ca, admin, directory)
        processes[-1].wait_ready(
            lambda: http_get(f"{url}/readyz", context) == "ok", timeout_s, "ready"
        )

        admin_kubeconfig = write(
            directory / "admin.kubeconfig",
            kubeconfig(url, ca.pem, name=name, cert_pem=admin.cert, key_pem=admin.key),
        )
        plane = ControlPlane(name, directory, url, ca, admin, admin_kubeconfig, processes)
        kcm_kubeconfig = plane.client_kubeconfig(
            directory / "kube-controller-manager.kubeconfig", "system:kube-controller-manager"
        )
        processes.append(
            start(
                "kube-controller-manager",
                [
                    str(kube.binary("kube-controller-manager")),
                    f"--kubeconfig={kcm_kubeconfig}",
                    f"--controllers={','.join(KCM_CONTROLLERS)}",
                    "--use-service-account-credentials=true",
                    f"--root-ca-file={ca_file}",
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    "--leader-elect=false",
                    "--secure-port=0",
                    "--v=1",
                ],
                logs,
            )
        )
        # ready once the ServiceAccount controller made `default` (pods need it to be admitted)
        sa = f"{url}/api/v1/namespaces/default/serviceaccounts/default"
        processes[-1].wait_ready(lambda: bool(http_get(sa, context)), timeout_s, "running")
        yield plane
