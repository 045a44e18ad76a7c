"""A thin asynchronous facade over the blocking ``kubernetes`` client: every call runs in a
worker thread (never on the event loop). Creates treat 409 as "already there", deletes treat
404 as done; errors that a retry can fix surface as ``kopf.TemporaryError``."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kopf
import kubernetes
import kubernetes.watch
from kubernetes.client.exceptions import ApiException

Manifest = dict[str, Any]


def load_configuration(kubeconfig: str | None = None) -> kubernetes.client.Configuration:
    """In-cluster service account when running in a pod, else the kubeconfig file
    (``kubeconfig`` argument, then $KUBECONFIG, then ~/.kube/config) — read at call time."""
    cfg = kubernetes.client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]  # kubernetes' config loaders are unannotated
    else:
        path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]  # unannotated
            config_file=path, client_configuration=cfg
        )
    return cfg


def connection_info(cfg: kubernetes.client.Configuration) -> kopf.ConnectionInfo:
    """The same credentials for kopf's own API access."""
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    scheme, _, value = (token or "").partition(" ")
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme or None,
        token=value or None,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


@dataclass(frozen=True)
class _Kind:
    api: str
    plural: str
    namespaced: bool = True


_KINDS: dict[tuple[str, str], _Kind] = {
    ("v1", "ConfigMap"): _Kind("CoreV1Api", "config_map"),
    ("v1", "Service"): _Kind("CoreV1Api", "service"),
    ("v1", "Pod"): _Kind("CoreV1Api", "pod"),
    ("batch/v1", "Job"): _Kind("BatchV1Api", "job"),
    ("apps/v1", "Deployment"): _Kind("AppsV1Api", "deployment"),
    ("rbac.authorization.k8s.io/v1", "Role"): _Kind("RbacAuthorizationV1Api", "role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): _Kind(
        "RbacAuthorizationV1Api", "role_binding"
    ),
}


@dataclass(frozen=True)
class _Custom:
    """A kind served by a CRD (read and written through the CustomObjectsApi)."""

    group: str
    version: str
    plural: str
    namespaced: bool = True


_CUSTOM: dict[tuple[str, str], _Custom] = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): _Custom("jobset.x-k8s.io", "v1alpha2", "jobsets"),
    ("kueue.x-k8s.io/v1beta1", "Workload"): _Custom("kueue.x-k8s.io", "v1beta1", "workloads"),
    ("kueue.x-k8s.io/v1beta1", "LocalQueue"): _Custom("kueue.x-k8s.io", "v1beta1", "localqueues"),
    ("kueue.x-k8s.io/v1beta1", "ResourceFlavor"): _Custom(
        "kueue.x-k8s.io", "v1beta1", "resourceflavors", namespaced=False
    ),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): _Custom(
        "apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False
    ),
}
"""Kinds of other projects' CRDs (JobSet, Kueue) and the CRDs themselves. Reading a kind whose
CRD is not installed answers 404: ``get`` gives None and ``list`` an empty list."""


class Kube:
    """The API calls the operator makes — every one of them (the Helm chart's ClusterRole
    is checked against this class by a test)."""

    def __init__(self, cfg: kubernetes.client.Configuration) -> None:
        self.client = kubernetes.client.ApiClient(cfg)
        self._responses: set[Any] = set()

    def _api(self, manifest_or_key: Manifest | tuple[str, str]) -> tuple[Any, _Kind]:
        key = (
            manifest_or_key
            if isinstance(manifest_or_key, tuple)
            else (manifest_or_key["apiVersion"], manifest_or_key["kind"])
        )
        kind = _KINDS[key]
        return getattr(kubernetes.client, kind.api)(self.client), kind

    def _plain(self, obj: Any) -> Manifest:
        # the generated ApiClient is unannotated
        return dict(self.client.sanitize_for_serialization(obj))  # type: ignore[no-untyped-call]

    async def create(self, manifest: Manifest) -> tuple[Manifest, bool]:
        """Create ``manifest``; if it exists, return the existing object. (obj, created)"""
        ns = manifest["metadata"]["namespace"]
        try:
            custom = _CUSTOM.get((manifest["apiVersion"], manifest["kind"]))
            if custom is not None:
                api: Any = kubernetes.client.CustomObjectsApi(self.client)
                c = custom
                created = await asyncio.to_thread(
                    lambda: api.create_namespaced_custom_object(
                        c.group, c.version, ns, c.plural, manifest
                    )
                )
                return dict(created), True
            api, kind = self._api(manifest)
            obj = await asyncio.to_thread(
                getattr(api, f"create_namespaced_{kind.plural}"), ns, manifest
            )
            return self._plain(obj), True
        except ApiException as exc:
            if exc.status == 409:
                existing = await self.get(
                    manifest["apiVersion"], manifest["kind"], ns, manifest["metadata"]["name"]
                )
                if existing is not None:
                    return existing, False
            raise _temporary(
                exc, f"create {manifest['kind']} {ns}/{manifest['metadata']['name']}"
            ) from exc

    async def get(
        self, api_version: str, kind_name: str, namespace: str | None, name: str
    ) -> Manifest | None:
        custom = _CUSTOM.get((api_version, kind_name))
        if custom is not None:
            c = custom
            return await self.get_custom(
                c.group, c.version, c.plural, namespace if c.namespaced else None, name
            )
        api, kind = self._api((api_version, kind_name))
        try:
            obj = await asyncio.to_thread(
                getattr(api, f"read_namespaced_{kind.plural}"), name, namespace
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _temporary(exc, f"get {kind_name} {namespace}/{name}") from exc
        return self._plain(obj)

    async def patch(
        self, api_version: str, kind_name: str, namespace: str, name: str, body: Manifest
    ) -> Manifest:
        """A JSON merge patch."""
        api, kind = self._api((api_version, kind_name))
        fn = getattr(api, f"patch_namespaced_{kind.plural}")
        try:
            obj = await asyncio.to_thread(
                lambda: fn(name, namespace, body, _content_type="application/merge-patch+json")
            )
        except ApiException as exc:
            raise _temporary(exc, f"patch {kind_name} {namespace}/{name}") from exc
        return self._plain(obj)

    async def list(
        self, api_version: str, kind_name: str, namespace: str, label_selector: str
    ) -> list[Manifest]:
        """Objects of a kind in a namespace matching a label selector (a kind whose CRD is
        not installed has none)."""
        custom = _CUSTOM.get((api_version, kind_name))
        try:
            if custom is not None:
                api: Any = kubernetes.client.CustomObjectsApi(self.client)
                c = custom
                result = await asyncio.to_thread(
                    lambda: api.list_namespaced_custom_object(
                        c.group, c.version, namespace, c.plural, label_selector=label_selector
                    )
                )
                items = list((result or {}).get("items") or [])
            else:
                api, kind = self._api((api_version, kind_name))
                fn = getattr(api, f"list_namespaced_{kind.plural}")
                listed = await asyncio.to_thread(
                    lambda: fn(namespace, label_selector=label_selector)
                )
                items = self._plain(listed).get("items") or []
        except ApiException as exc:
            if custom is not None and exc.status == 404:
                return []
            raise _temporary(exc, f"list {kind_name} in {namespace}") from exc
        for item in items:  # list items carry no apiVersion/kind
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind_name)
        return list(items)

    async def delete(self, api_version: str, kind_name: str, namespace: str, name: str) -> None:
        """Delete with Foreground propagation (the object goes once its pods are gone); a
        missing object is already deleted."""
        body = kubernetes.client.V1DeleteOptions(propagation_policy="Foreground")
        custom = _CUSTOM.get((api_version, kind_name))
        if custom is not None:
            api: Any = kubernetes.client.CustomObjectsApi(self.client)
            c = custom

            def fn(name: str, namespace: str, body: Any) -> Any:
                return api.delete_namespaced_custom_object(
                    c.group, c.version, namespace, c.plural, name, body=body
                )
        else:
            typed, kind = self._api((api_version, kind_name))
            fn = getattr(typed, f"delete_namespaced_{kind.plural}")
        try:
            await asyncio.to_thread(lambda: fn(name, namespace, body=body))
        except ApiException as exc:
            if exc.status != 404:
                raise _temporary(exc, f"delete {kind_name} {namespace}/{name}") from exc

    async def pod_log(
        self,
        namespace: str,
        name: str,
        container: str,
        *,
        tail_lines: int,
        limit_bytes: int,
        timeout_s: float = 30.0,
    ) -> str:
        """The last ``tail_lines`` lines of a container's current log, at most ``limit_bytes``
        (``pods/log``; undecodable bytes replaced). Raises :class:`LogUnavailableError` with the
        API server's message (pod gone, container not started, …)."""
        api = kubernetes.client.CoreV1Api(self.client)

        def read() -> bytes:
            response: Any = api.read_namespaced_pod_log(
                name,
                namespace,
                container=container,
                tail_lines=tail_lines,
                limit_bytes=limit_bytes,
                _preload_content=False,
                _request_timeout=timeout_s,
            )
            try:
                return bytes(response.read(limit_bytes + 1)[:limit_bytes])
            finally:
                response.release_conn()

        try:
            data = await asyncio.to_thread(read)
        except ApiException as exc:
            raise LogUnavailableError(exc.status, _api_message(exc)) from exc
        except Exception as exc:  # connection reset, read timeout
            raise LogUnavailableError(None, f"{type(exc).__name__}: {exc}"[:300]) from exc
        return data.decode("utf-8", errors="replace")

    async def get_custom(
        self, group: str, version: str, plural: str, namespace: str | None, name: str
    ) -> Manifest | None:
        """A custom object (cluster-scoped when ``namespace`` is None), or None if absent."""
        api = kubernetes.client.CustomObjectsApi(self.client)
        try:
            if namespace is None:
                obj = await asyncio.to_thread(
                    api.get_cluster_custom_object, group, version, plural, name
                )
            else:
                obj = await asyncio.to_thread(
                    api.get_namespaced_custom_object, group, version, namespace, plural, name
                )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _temporary(exc, f"get {plural} {namespace or ''}/{name}") from exc
        return obj if isinstance(obj, dict) else None

    async def patch_custom_status(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None,
        name: str,
        status: Manifest,
    ) -> None:
        """Merge-patch a custom object's status subresource (gone objects are ignored)."""
        api = kubernetes.client.CustomObjectsApi(self.client)
        body = {"status": status}
        merge = "application/merge-patch+json"
        try:
            if namespace is None:
                await asyncio.to_thread(
                    lambda: api.patch_cluster_custom_object_status(
                        group, version, plural, name, body, _content_type=merge
                    )
                )
            else:
                await asyncio.to_thread(
                    lambda: api.patch_namespaced_custom_object_status(
                        group, version, namespace, plural, name, body, _content_type=merge
                    )
                )
        except ApiException as exc:
            if exc.status != 404:
                raise _temporary(exc, f"patch {plural} {namespace or ''}/{name} status") from exc

    async def ensure_cluster_peering(self, name: str) -> None:
        """Create kopf's ClusterKopfPeering ``name`` (the replicas elect a leader through it)."""
        api = kubernetes.client.CustomObjectsApi(self.client)
        body = {
            "apiVersion": "kopf.dev/v1",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "shardmeter"}},
        }
        try:
            await asyncio.to_thread(
                api.create_cluster_custom_object, "kopf.dev", "v1", "clusterkopfpeerings", body
            )
        except ApiException as exc:
            if exc.status != 409:
                raise _temporary(exc, f"create clusterkopfpeering {name}") from exc

    def watch_configmaps(
        self,
        namespace: str,
        label_selector: str,
        on_event: Callable[[str, Manifest], None],
        stop: threading.Event,
    ) -> None:
        """Blocking (run it in a thread): watch ConfigMaps in one namespace — a namespaced
        watch, so the operator needs no cluster-wide permission on ConfigMaps — and call
        ``on_event(type, object)`` for each change until ``stop`` is set (``stop_watches``
        interrupts a blocked read). Reconnects after errors and when the server ends."""
        api = kubernetes.client.CoreV1Api(self.client)
        version = ""
        while not stop.is_set():
            try:
                response: Any = api.list_namespaced_config_map(
                    namespace,
                    label_selector=label_selector,
                    watch=True,
                    resource_version=version or None,
                    timeout_seconds=300,
                    _preload_content=False,
                    _request_timeout=330,
                )
                self._responses.add(response)
                try:
                    for line in response:
                        if stop.is_set():
                            break
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            version = ""  # e.g. 410 Gone: start over with a fresh list
                            break
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                        on_event(str(event.get("type")), obj)
                finally:
                    self._responses.discard(response)
                    response.release_conn()
            except Exception:  # the API server restarted, a network blip…
                stop.wait(2.0)

    def stop_watches(self) -> None:
        """Interrupt the blocked reads of :meth:`watch_configmaps` (from another thread)."""
        for response in list(self._responses):
            response.shutdown()

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]  # the generated ApiClient is unannotated


class LogUnavailableError(Exception):
    """A pod log could not be read: ``status`` is the HTTP status (None: no response)."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status


def _api_message(exc: ApiException) -> str:
    """The ``message`` of a Kubernetes Status body, else the HTTP reason."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or f"HTTP {exc.status} {(exc.reason or '').strip()}")[:500]


def _temporary(exc: ApiException, what: str) -> kopf.TemporaryError:
    delay = 5 if exc.status in (429, 500, 502, 503, 504) or exc.status is None else 30
    reason = (exc.reason or "").strip()
    return kopf.TemporaryError(f"{what} failed: HTTP {exc.status} {reason}", delay=delay)
