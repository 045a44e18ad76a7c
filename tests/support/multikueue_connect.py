"""The simulated MultiKueue's connections (Kueue v0.19.2,
``pkg/controller/admissionchecks/multikueue/{multikueuecluster,admissioncheck}.go``,
``pkg/util/admissioncheck``), split from :mod:`support.multikueue` (which describes the
behaviour): a MultiKueueCluster's kubeconfig, the worker it reaches, and an AdmissionCheck's
MultiKueueConfig — or why not (:class:`RefusedError`, with Kueue's reason and message)."""

from __future__ import annotations

import base64
import binascii
import pathlib
from collections.abc import Mapping

import kmock
import yaml

from support.jobset import JOBSETS
from support.kube_emulator import Body, KubeEmulator
from support.kueue import GROUP, MULTIKUEUE_CONFIGS, WORKLOADS

SECRETS = kmock.resource("", "v1", "secrets")
CONFIG_NAMESPACE = "kueue-system"
"""Where Kueue runs: the Secrets of ``locationType: Secret`` kubeconfigs."""
KUBECONFIG_KEY = "kubeconfig"
CONNECTION_FAILED = "ClientConnectionFailed"


class RefusedError(Exception):
    """A MultiKueueCluster or AdmissionCheck that cannot be used: reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason, message)
        self.reason, self.message = reason, message


def not_found(resource: str, name: str) -> str:
    return f'{resource} "{name}" not found'


def kubeconfig_problem(text: str) -> tuple[str, str | None]:
    """``validateKubeconfig`` (simplified): the server of the current context, or why the
    kubeconfig is refused (``InsecureKubeConfig``)."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return "", f"failed to parse kubeconfig(apiconfig): {exc}"
    if not isinstance(config, dict):
        return "", "failed to parse kubeconfig(apiconfig): not a kubeconfig"
    for user in config.get("users") or []:
        u = user.get("user") or {}
        if u.get("tokenFile"):
            return "", "tokenFile is not allowed"
        if u.get("username") or u.get("password"):
            return "", "basic auth is not allowed"
        if u.get("exec"):
            return "", "exec plugins are not allowed"
        if u.get("auth-provider"):
            return "", "auth providers are not allowed"
    clusters = {c.get("name"): c.get("cluster") or {} for c in config.get("clusters") or []}
    for name, c in clusters.items():
        if c.get("insecure-skip-tls-verify"):
            return "", f"insecure TLS verification is not allowed for cluster {name}"
        if c.get("certificate-authority"):
            return "", (
                "certificate-authority file paths are not allowed, use "
                f"certificate-authority-data for cluster {name}"
            )
        if not c.get("server"):
            return "", f"server URL is required for cluster {name}"
    contexts = {c.get("name"): c.get("context") or {} for c in config.get("contexts") or []}
    context = contexts.get(config.get("current-context")) or {}
    cluster = clusters.get(context.get("cluster"))
    if cluster is None:
        return "", "invalid configuration: no configuration has been provided"
    return str(cluster["server"]).rstrip("/"), None


def load_kubeconfig(emu: KubeEmulator, mkc: Body, config_namespace: str) -> str:
    """``loadClientConfig``'s kubeconfig text, or :class:`RefusedError`. A Secret's
    ``stringData`` is read too: the emulator does not merge it into ``data`` as
    kube-apiserver does."""
    source = mkc["spec"]["clusterSource"]
    ref = source.get("kubeConfig")
    if ref is None:
        raise RefusedError(
            "MultiKueueClusterProfileFeatureDisabled",
            "MultiKueueClusterProfile feature gate is disabled",
        )
    if ref.get("locationType", "Secret") == "Path":
        try:
            return pathlib.Path(ref["location"]).read_text()
        except OSError as exc:
            raise RefusedError("BadKubeConfig", str(exc)) from exc
    secret = emu.get_object(SECRETS, config_namespace, ref["location"])
    if secret is None:
        raise RefusedError("BadKubeConfig", not_found("secrets", ref["location"]))
    data = (secret.get("data") or {}).get(KUBECONFIG_KEY)
    if data is None and KUBECONFIG_KEY in (secret.get("stringData") or {}):
        return str(secret["stringData"][KUBECONFIG_KEY])
    if data is None:
        raise RefusedError(
            "BadKubeConfig",
            f'key "{KUBECONFIG_KEY}" not found in secret "{ref["location"]}"',
        )
    try:
        return base64.b64decode(data, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise RefusedError(
            "InsecureKubeConfig", f"failed to parse kubeconfig(apiconfig): {exc}"
        ) from exc


def connect(
    emu: KubeEmulator, servers: Mapping[str, KubeEmulator], mkc: Body, config_namespace: str
) -> KubeEmulator:
    """The worker the MultiKueueCluster's kubeconfig reaches, or :class:`RefusedError`."""
    server, problem = kubeconfig_problem(load_kubeconfig(emu, mkc, config_namespace))
    if problem is not None:
        raise RefusedError("InsecureKubeConfig", problem)
    worker = servers.get(server)
    if worker is None:
        raise RefusedError(
            CONNECTION_FAILED,
            f'Get "{server}/apis/{GROUP}/v1beta2/workloads": dial tcp: connect: connection refused',
        )
    for resource, kind in ((WORKLOADS, "Workload"), (JOBSETS, "JobSet")):
        try:
            worker.lookup(resource)
        except kmock.KubernetesError:
            raise RefusedError(
                CONNECTION_FAILED,
                f'no matches for kind "{kind}" in version "{resource.group}/{resource.version}"',
            ) from None
    return worker


def config_of(emu: KubeEmulator, ac: Body) -> Body:
    """``ConfigFromRef``: the check's MultiKueueConfig, or :class:`RefusedError` (``BadConfig``)."""
    ref = ac["spec"].get("parameters")
    if ref is None:
        raise RefusedError("BadConfig", "missing parameters reference")
    if not ref.get("name"):
        raise RefusedError("BadConfig", "empty name: bad parameters reference")
    if ref.get("apiGroup") != GROUP:
        raise RefusedError(
            "BadConfig",
            f'wrong group "{ref.get("apiGroup")}", expecting "{GROUP}": bad parameters reference',
        )
    if ref.get("kind") != "MultiKueueConfig":
        raise RefusedError(
            "BadConfig",
            f'wrong kind "{ref.get("kind")}", expecting "MultiKueueConfig": bad parameters reference',
        )
    config = emu.get_object(MULTIKUEUE_CONFIGS, None, ref["name"])
    if config is None:
        raise RefusedError("BadConfig", not_found(f"multikueueconfigs.{GROUP}", ref["name"]))
    return config
