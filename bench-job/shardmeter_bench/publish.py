"""Publishing the coefficients: a file, or ``--publish configmap/NAME`` — a *patch* of an
existing ConfigMap's ``data`` through the Kubernetes API, so the Job's RBAC can be limited to
``patch`` on that one resource name (``create`` cannot be limited by name).

Credentials: the in-cluster ServiceAccount; outside a cluster ``$KUBECONFIG`` (tests use the
emulated API server in ``tests/support``). Namespace: ``--namespace``, else the pod's own
(the ServiceAccount namespace file), else the kubeconfig context's, else ``default``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter_bench.errors import PublishError, UsageError
from shardmeter_bench.fit import CONFIGMAP_LIMIT_BYTES, without_samples
from shardmeter_bench.logs import get_logger

log = get_logger(__name__)

SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def parse_target(value: str) -> str:
    """``configmap/NAME`` → NAME (a DNS-1123 subdomain), else a `UsageError`."""
    kind, sep, name = value.partition("/")
    if not sep or kind.lower() not in ("configmap", "configmaps", "cm"):
        raise UsageError(f"--publish: expected configmap/NAME, got {value!r}")
    if not name or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise UsageError(
            f"--publish: {name!r} is not a valid ConfigMap name "
            "(lower-case letters, digits, '-' and '.', at most 253 characters)"
        )
    return name


def _api_client() -> tuple[Any, str | None]:
    """An API client from the in-cluster ServiceAccount, else from ``$KUBECONFIG`` (or
    ~/.kube/config); also the kubeconfig context's namespace. The kubernetes package's global
    default configuration is left alone."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(  # type: ignore[no-untyped-call]  # unannotated upstream
            client_configuration=configuration
        )
        return client.ApiClient(configuration), None
    except config.ConfigException:
        pass
    path = os.environ.get("KUBECONFIG") or None
    try:
        api = config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
        _, active = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=path
        )
    except (config.ConfigException, OSError, TypeError) as exc:
        raise PublishError(
            f"no Kubernetes credentials: not in a cluster and no usable kubeconfig ({exc})"
        ) from exc
    ns = (active or {}).get("context", {}).get("namespace")
    return api, (str(ns) if ns else None)


def resolve_namespace(explicit: str | None, context_namespace: str | None) -> str:
    if explicit:
        return explicit
    try:
        return SA_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return context_namespace or "default"


def configmap_data(doc: CoefficientsDocument) -> dict[str, str]:
    """The ConfigMap ``data``; raw samples are dropped (and a note says so) when the full
    document would exceed the API server's object size limit."""
    data = doc.to_configmap_data()
    if sum(len(v) for v in data.values()) > CONFIGMAP_LIMIT_BYTES:
        log.warning("configmap_samples_dropped", bytes=sum(len(v) for v in data.values()))
        data = without_samples(doc, "the ConfigMap size limit").to_configmap_data()
    return data


def publish_configmap(doc: CoefficientsDocument, name: str, namespace: str | None) -> str:
    """Patch ConfigMap ``namespace/name``'s data; returns ``namespace/name``."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    api_client, context_ns = _api_client()
    ns = resolve_namespace(namespace, context_ns)
    data = configmap_data(doc)
    try:
        # a JSON merge patch: the listed data keys are replaced, other keys and metadata kept
        client.CoreV1Api(api_client).patch_namespaced_config_map(
            name, ns, {"data": data}, _content_type="application/merge-patch+json"
        )
    except ApiException as exc:
        if exc.status == 404:
            raise PublishError(
                f"configmap {ns}/{name} does not exist; create it first (the Job only patches it)"
            ) from exc
        if exc.status == 403:
            raise PublishError(
                f"forbidden to patch configmap {ns}/{name}: the Job's ServiceAccount needs "
                "'patch' on configmaps with resourceNames: [" + name + "]"
            ) from exc
        raise PublishError(
            f"patching configmap {ns}/{name} failed: HTTP {exc.status} {exc.reason}"
        ) from exc
    except (HTTPError, OSError) as exc:
        raise PublishError(f"Kubernetes API unreachable while patching {ns}/{name}: {exc}") from exc
    finally:
        api_client.close()
    log.info("published", configmap=f"{ns}/{name}", keys=sorted(data))
    return f"{ns}/{name}"
