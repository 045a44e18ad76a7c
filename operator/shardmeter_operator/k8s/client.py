"""A thin asynchronous facade over the blocking ``kubernetes`` client: every call runs in a
worker thread (never on the event loop) with a request timeout. Creates treat 409 as "already
there", deletes treat 404 as done. Every failure surfaces as one type, :class:`ApiError`: the
HTTP status (None: no answer — a reset, a timeout, a refused connection) and the server's
``Retry-After``, which the controller's retry policy follows (:mod:`~.k8s.retry`)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import kopf
import kubernetes
import kubernetes.watch
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

Manifest = dict[str, Any]
T = TypeVar("T")
REQUEST_TIMEOUT_S = (10.0, 60.0)
"""(connect, read) seconds of every API call: a server that stops answering fails the call
instead of holding a worker thread (and the process's exit) forever."""


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
    ("v1", "Secret"): _Kind("CoreV1Api", "secret"),
    ("v1", "Namespace"): _Kind("CoreV1Api", "namespace", namespaced=False),
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
    ("kueue.x-k8s.io/v1beta2", "Workload"): _Custom("kueue.x-k8s.io", "v1beta2", "workloads"),
    ("kueue.x-k8s.io/v1beta2", "LocalQueue"): _Custom("kueue.x-k8s.io", "v1beta2", "localqueues"),
    ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"): _Custom(
        "kueue.x-k8s.io", "v1beta2", "resourceflavors", namespaced=False
    ),
    ("kueue.x-k8s.io/v1beta2", "ClusterQueue"): _Custom(
        "kueue.x-k8s.io", "v1beta2", "clusterqueues", namespaced=False
    ),
    ("kueue.x-k8s.io/v1beta2", "AdmissionCheck"): _Custom(
        "kueue.x-k8s.io", "v1beta2", "admissionchecks", namespaced=False
    ),
    ("kueue.x-k8s.io/v1beta2", "MultiKueueConfig"): _Custom(
        "kueue.x-k8s.io", "v1beta2", "multikueueconfigs", namespaced=False
    ),
    ("kueue.x-k8s.io/v1beta2", "MultiKueueCluster"): _Custom(
        "kueue.x-k8s.io", "v1beta2", "multikueueclusters", namespaced=False
    ),
    ("shardmeter.io/v1alpha1", "TrainingPlan"): _Custom(
        "shardmeter.io", "v1alpha1", "trainingplans"
    ),  # created for a workload placed at admission
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
        self.health = ApiHealth()

    def _api(self, manifest_or_key: Manifest | tuple[str, str]) -> tuple[Any, _Kind]:
        key = (
            manifest_or_key
            if isinstance(manifest_or_key, tuple)
            else (manifest_or_key["apiVersion"], manifest_or_key["kind"])
        )
        kind = _KINDS[key]
        return getattr(kubernetes.client, kind.api)(self.client), kind

    def _custom(self) -> Any:
        return kubernetes.client.CustomObjectsApi(self.client)

    def _plain(self, obj: Any) -> Manifest:
        # the generated ApiClient is unannotated
        return dict(self.client.sanitize_for_serialization(obj))  # type: ignore[no-untyped-call]

    async def _call(
        self, what: str, fn: Callable[..., T], *args: Any, ok: tuple[int, ...] = (), **kwargs: Any
    ) -> T | None:
        """``fn(*args, **kwargs)`` in a worker thread with the request timeout. An HTTP status
        in ``ok`` returns None; every other failure raises :class:`ApiError`."""
        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT_S)
        try:
            result = await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as exc:
            if exc.status in ok:
                self.health.answered()
                return None
            error = ApiError.of(exc, what)
            self.health.failed(error)
            raise error from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # reset, timeout, refused
            error = ApiError(None, f"{what} failed: {type(exc).__name__}: {exc}"[:300])
            self.health.failed(error)
            raise error from exc
        self.health.answered()
        return result

    async def create(self, manifest: Manifest) -> tuple[Manifest, bool]:
        """Create ``manifest``; if it exists, return the existing object. (obj, created)"""
        ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        what = f"create {manifest['kind']} {ns}/{name}"
        custom = _CUSTOM.get((manifest["apiVersion"], manifest["kind"]))
        if custom is not None:
            created = await self._call(
                what,
                self._custom().create_namespaced_custom_object,
                custom.group,
                custom.version,
                ns,
                custom.plural,
                manifest,
                ok=(409,),
            )
            obj = dict(created) if created is not None else None
        else:
            api, kind = self._api(manifest)
            typed = await self._call(
                what, getattr(api, f"create_namespaced_{kind.plural}"), ns, manifest, ok=(409,)
            )
            obj = self._plain(typed) if typed is not None else None
        if obj is not None:
            return obj, True
        existing = await self.get(manifest["apiVersion"], manifest["kind"], ns, name)
        if existing is None:  # deleted between the 409 and the read: try again later
            raise ApiError(409, f"{what}: exists, then vanished")
        return existing, False

    async def dry_run_refusal(self, manifest: Manifest) -> str:
        """Create ``manifest`` as a server-side dry run (``dryRun=All``: validated and passed
        through the admission webhooks, never stored) and return why it is refused ("" when
        it would be created: 2xx, or 409 it exists). Other failures raise :class:`ApiError`."""
        ns = manifest["metadata"]["namespace"]
        what = f"dry-run create {manifest['kind']} {ns}/{manifest['metadata']['name']}"
        custom = _CUSTOM[(manifest["apiVersion"], manifest["kind"])]
        try:
            await self._call(
                what,
                self._custom().create_namespaced_custom_object,
                custom.group,
                custom.version,
                ns,
                custom.plural,
                manifest,
                dry_run="All",
                ok=(409,),
            )
        except ApiError as exc:
            cause = exc.__cause__
            if exc.status in {400, 422} and isinstance(cause, ApiException):
                return _api_message(cause)
            raise
        return ""

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
        if not kind.namespaced:
            obj = await self._call(
                f"get {kind_name} {name}", getattr(api, f"read_{kind.plural}"), name, ok=(404,)
            )
        else:
            obj = await self._call(
                f"get {kind_name} {namespace}/{name}",
                getattr(api, f"read_namespaced_{kind.plural}"),
                name,
                namespace,
                ok=(404,),
            )
        return self._plain(obj) if obj is not None else None

    async def patch(
        self, api_version: str, kind_name: str, namespace: str, name: str, body: Manifest
    ) -> Manifest:
        """A JSON merge patch."""
        api, kind = self._api((api_version, kind_name))
        obj = await self._call(
            f"patch {kind_name} {namespace}/{name}",
            getattr(api, f"patch_namespaced_{kind.plural}"),
            name,
            namespace,
            body,
            _content_type="application/merge-patch+json",
        )
        return self._plain(obj)

    async def list_cluster_custom(self, group: str, version: str, plural: str) -> list[Manifest]:
        """Every object of a cluster-scoped custom resource (none when its CRD is absent)."""
        result = await self._call(
            f"list {plural}.{group}",
            self._custom().list_cluster_custom_object,
            group,
            version,
            plural,
            ok=(404,),
        )
        return list((result or {}).get("items") or [])

    async def set_webhook_ca(self, kind_name: str, name: str, ca_bundle: str) -> bool:
        """Set ``clientConfig.caBundle`` of every webhook of the Mutating- or
        ValidatingWebhookConfiguration ``name`` (False: it does not exist)."""
        api = kubernetes.client.AdmissionregistrationV1Api(self.client)
        plural = {
            "MutatingWebhookConfiguration": "mutating_webhook_configuration",
            "ValidatingWebhookConfiguration": "validating_webhook_configuration",
        }[kind_name]
        obj = await self._call(
            f"get {kind_name} {name}", getattr(api, f"read_{plural}"), name, ok=(404,)
        )
        if obj is None:
            return False
        hooks = self._plain(obj).get("webhooks") or []
        patch = [
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": ca_bundle}
            for i, hook in enumerate(hooks)
            if (hook.get("clientConfig") or {}).get("caBundle") != ca_bundle
        ]
        if patch:
            await self._call(
                f"patch {kind_name} {name}",
                getattr(api, f"patch_{plural}"),
                name,
                patch,
                _content_type="application/json-patch+json",
            )
        return True

    async def list(
        self, api_version: str, kind_name: str, namespace: str, label_selector: str
    ) -> list[Manifest]:
        """Objects of a kind in a namespace matching a label selector (a kind whose CRD is
        not installed has none)."""
        custom = _CUSTOM.get((api_version, kind_name))
        what = f"list {kind_name} in {namespace}"
        if custom is not None:
            c = custom
            result = await self._call(
                what,
                self._custom().list_namespaced_custom_object,
                c.group,
                c.version,
                namespace,
                c.plural,
                label_selector=label_selector,
                ok=(404,),
            )
            items = list((result or {}).get("items") or [])
        else:
            api, kind = self._api((api_version, kind_name))
            listed = await self._call(
                what,
                getattr(api, f"list_namespaced_{kind.plural}"),
                namespace,
                label_selector=label_selector,
            )
            items = self._plain(listed).get("items") or []
        for item in items:  # list items carry no apiVersion/kind
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind_name)
        return list(items)

    async def delete(self, api_version: str, kind_name: str, namespace: str, name: str) -> None:
        """Delete with Foreground propagation (the object goes once its pods are gone); a
        missing object is already deleted."""
        body = kubernetes.client.V1DeleteOptions(propagation_policy="Foreground")
        what = f"delete {kind_name} {namespace}/{name}"
        custom = _CUSTOM.get((api_version, kind_name))
        if custom is not None:
            c = custom
            await self._call(
                what,
                self._custom().delete_namespaced_custom_object,
                c.group,
                c.version,
                namespace,
                c.plural,
                name,
                body=body,
                ok=(404,),
            )
            return
        typed, kind = self._api((api_version, kind_name))
        await self._call(
            what,
            getattr(typed, f"delete_namespaced_{kind.plural}"),
            name,
            namespace,
            body=body,
            ok=(404,),
        )

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
        api, what = self._custom(), f"get {plural} {namespace or ''}/{name}"
        if namespace is None:
            obj = await self._call(
                what, api.get_cluster_custom_object, group, version, plural, name, ok=(404,)
            )
        else:
            obj = await self._call(
                what,
                api.get_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                name,
                ok=(404,),
            )
        return obj if isinstance(obj, dict) else None

    async def patch_custom_status(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None,
        name: str,
        status: Manifest,
        *,
        resource_version: str = "",
    ) -> Manifest | None:
        """Merge-patch a custom object's status subresource: the object as patched, None when
        it is gone.
        With ``resource_version`` the patch is a precondition: it applies only to that version
        of the object (409 otherwise — the object changed, or was deleted and created again)."""
        api, merge = self._custom(), "application/merge-patch+json"
        body: Manifest = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        what = f"patch {plural} {namespace or ''}/{name} status"
        if namespace is None:
            done = await self._call(
                what,
                api.patch_cluster_custom_object_status,
                group,
                version,
                plural,
                name,
                body,
                _content_type=merge,
                ok=(404,),
            )
        else:
            done = await self._call(
                what,
                api.patch_namespaced_custom_object_status,
                group,
                version,
                namespace,
                plural,
                name,
                body,
                _content_type=merge,
                ok=(404,),
            )
        return done if isinstance(done, dict) else None

    async def post_event(self, event: Manifest) -> bool:
        """Create a core/v1 Event under its own (deterministic) name; False when an Event of
        that name exists already — it was posted before, perhaps by a request whose answer
        was lost: posting again changes nothing."""
        api = kubernetes.client.CoreV1Api(self.client)
        meta = event["metadata"]
        created = await self._call(
            f"create Event {meta['namespace']}/{meta['name']}",
            api.create_namespaced_event,
            meta["namespace"],
            event,
            ok=(409,),
        )
        return created is not None

    async def ensure_cluster_peering(self, name: str) -> None:
        """Create kopf's ClusterKopfPeering ``name`` (the replicas elect a leader through it)."""
        body = {
            "apiVersion": "kopf.dev/v1",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "shardmeter"}},
        }
        await self._call(
            f"create clusterkopfpeering {name}",
            self._custom().create_cluster_custom_object,
            "kopf.dev",
            "v1",
            "clusterkopfpeerings",
            body,
            ok=(409,),
        )

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
                    _request_timeout=(REQUEST_TIMEOUT_S[0], 330),
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
            except Exception:  # the API server restarted, a network blip, a cut event…
                version = ""  # a half-read stream may have skipped events: list afresh
                stop.wait(2.0)

    def stop_watches(self) -> None:
        """Interrupt the blocked reads of :meth:`watch_configmaps` (from another thread)."""
        for response in list(self._responses):
            response.shutdown()

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]  # the generated ApiClient is unannotated


class ApiError(kopf.TemporaryError):
    """An API call that failed: ``status`` is the HTTP status (None: no answer at all),
    ``retry_after_s`` the server's ``Retry-After`` (None: not given)."""

    def __init__(
        self, status: int | None, message: str, *, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message, delay=retry_after_s or 1.0)
        self.status = status
        self.retry_after_s = retry_after_s

    @classmethod
    def of(cls, exc: ApiException, what: str) -> ApiError:
        reason = (exc.reason or "").strip()
        return cls(
            exc.status,
            f"{what} failed: HTTP {exc.status} {reason}".rstrip(),
            retry_after_s=_retry_after(exc),
        )

    @property
    def unavailable(self) -> bool:
        """The API did not answer, or answered that it cannot now (5xx): an outage."""
        return self.status is None or self.status >= 500


class ApiHealth:
    """Whether the API server answers: consecutive unanswered calls (no answer, 5xx, 429)
    since the last answered one, over every call of the facade — the outage, not an object."""

    def __init__(self) -> None:
        self.failures = 0

    def answered(self) -> None:
        self.failures = 0

    def failed(self, error: ApiError) -> None:
        if error.unavailable or error.status == 429:
            self.failures += 1
        else:
            self.failures = 0  # a 4xx is an answer


def _retry_after(exc: ApiException) -> float | None:
    """``Retry-After`` seconds (header, else the Status's ``details.retryAfterSeconds``)."""
    headers = exc.headers or {}
    raw = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        if raw:
            return max(0.0, float(raw))
    except ValueError:
        pass  # an HTTP date: rare from kube-apiserver; use the details or the policy
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return None
    seconds = ((body.get("details") or {}) if isinstance(body, dict) else {}).get(
        "retryAfterSeconds"
    )
    return float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None


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
