"""Dynamic admission as kube-apiserver does it, for the emulated API server: the
``MutatingWebhookConfiguration`` and ``ValidatingWebhookConfiguration`` objects stored in the
emulator (created with kubectl, like any object) are read on every create over HTTP, and each
webhook whose rules, ``namespaceSelector`` and ``objectSelector`` match is sent an
``admission.k8s.io/v1`` ``AdmissionReview`` over HTTPS (``clientConfig.url``, or
``clientConfig.service`` through :attr:`Admission.services`), verified against
``clientConfig.caBundle``, within ``timeoutSeconds``.

What kube-apiserver does, and this module with it (``k8s.io/apiserver``'s
``plugin/webhook/{mutating,validating}`` and ``errors/statuserror.go``):

* mutating webhooks first, one after another (configurations by name, webhooks in order),
  each seeing the object as the previous one patched it; a ``JSONPatch`` response is applied;
* then the validating webhooks, on the object as it would be stored (here: a dry-run create,
  so the schema's defaults and the simulated controllers' own webhooks have run);
* a denial (``allowed: false``) answers the request with the webhook's status code (at least
  400) and ``admission webhook "NAME" denied the request: MESSAGE``;
* a webhook that cannot be called — refused, timed out, a bad certificate, a malformed
  review or the wrong ``uid`` — is skipped under ``failurePolicy: Ignore`` and fails the
  request under ``Fail`` (the default) with 500 ``failed calling webhook "NAME": …``;
* a dry-run request is refused by a matching webhook whose ``sideEffects`` is neither
  ``None`` nor ``NoneOnDryRun``; ``dryRun`` is passed in the review.

Not emulated: UPDATE/DELETE/CONNECT (only creates over HTTP call webhooks), ``matchConditions``
(a configuration with them is refused when read), ``reinvocationPolicy``, ``matchPolicy:
Equivalent`` across versions, authentication of the API server to the webhook; a response's
``warnings`` are recorded in :attr:`Admission.reviews`, not sent to the client as ``Warning``
headers.

Use::

    admission = Admission.install(cluster.emulator)  # before the objects are created
    admission.services["shardmeter-system/shardmeter-webhook"] = "127.0.0.1:9443"
    ...
    admission.reviews  # every (webhook name, AdmissionReview request, response or error)
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import ssl
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kmock

from support.kube_emulator import Body, KubeEmulator
from support.kube_emulator.errors import api_error
from support.kube_emulator.patches import apply_patch

MUTATING = "mutatingwebhookconfigurations"
VALIDATING = "validatingwebhookconfigurations"
GROUP = "admissionregistration.k8s.io"
DEFAULT_TIMEOUT_S = 10
"""kube-apiserver's default ``timeoutSeconds`` (admissionregistration/v1)."""
MAX_TIMEOUT_S = 30


class CallError(Exception):
    """A webhook could not be called or answered wrongly (its failurePolicy decides)."""


@dataclass
class Review:
    """One call: the webhook, the request sent, what came back, how long it took."""

    webhook: str
    request: Body
    response: Body | None = None
    error: str = ""
    seconds: float = 0.0


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A ``metav1.LabelSelector`` (``matchLabels``, ``matchExpressions``); empty matches all."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _matches(items: Sequence[str], value: str) -> bool:
    return "*" in items or value in items


def rule_matches(rule: Mapping[str, Any], resource: kmock.resource, namespaced: bool) -> bool:
    """Whether a ``RuleWithOperations`` covers a CREATE of ``resource``."""
    scope = rule.get("scope", "*")
    if scope != "*" and (scope == "Namespaced") != namespaced:
        return False
    return (
        _matches(rule.get("operations") or [], "CREATE")
        and _matches(rule.get("apiGroups") or [], resource.group or "")
        and _matches(rule.get("apiVersions") or [], resource.version or "")
        and _matches(rule.get("resources") or [], resource.plural or "")
    )


@dataclass
class Admission:
    """The dynamic admission of one emulator (see the module docstring)."""

    emulator: KubeEmulator
    services: dict[str, str] = field(default_factory=dict)
    """``namespace/name`` of a webhook Service → ``host:port`` it is reached at (the cluster's
    DNS and Service proxy): the certificate is verified for ``name.namespace.svc``."""
    reviews: list[Review] = field(default_factory=list)

    @classmethod
    def install(cls, emulator: KubeEmulator) -> Admission:
        admission = cls(emulator)
        emulator.external_admission.append(admission.admit)
        return admission

    # ---- the API server's side -----------------------------------------------------------
    async def admit(
        self, resource: kmock.resource, namespace: str | None, body: Body, dry_run: bool
    ) -> Body:
        """The body to create after the mutating webhooks; raises what the API answers."""
        resource, info = self.emulator.lookup(self.emulator.resolve(resource))
        obj = copy.deepcopy(body)
        if info.namespaced:
            obj.setdefault("metadata", {}).setdefault("namespace", namespace or "default")
        ns = obj.get("metadata", {}).get("namespace") if info.namespaced else None
        mutating = self._webhooks(MUTATING, resource, info.namespaced, ns, obj)
        validating = self._webhooks(VALIDATING, resource, info.namespaced, ns, obj)
        if not mutating and not validating:
            return body
        for hook in mutating:
            obj = await self._call(hook, resource, info, obj, dry_run, mutating=True)
        if validating:  # on the object as it would be stored
            stored = self.emulator.create(resource, namespace, copy.deepcopy(obj), dry_run=True)
            for hook in validating:
                await self._call(hook, resource, info, stored, dry_run, mutating=False)
        return obj

    def _webhooks(
        self,
        plural: str,
        resource: kmock.resource,
        namespaced: bool,
        namespace: str | None,
        obj: Body,
    ) -> list[Body]:
        configs = sorted(
            self.emulator.select(kmock.resource(GROUP, "v1", plural)),
            key=lambda c: c["metadata"]["name"],
        )
        labels = obj.get("metadata", {}).get("labels") or {}
        found = self.emulator.select("namespaces") if namespace else []
        ns_obj = next((n for n in found if n["metadata"]["name"] == namespace), None)
        ns_labels = {
            **((ns_obj or {}).get("metadata", {}).get("labels") or {}),
            "kubernetes.io/metadata.name": namespace or "",
        }
        out = []
        for config in configs:
            for hook in config.get("webhooks") or []:
                if hook.get("matchConditions"):
                    raise api_error(500, "InternalError", "matchConditions are not emulated")
                if not any(rule_matches(r, resource, namespaced) for r in hook.get("rules") or []):
                    continue
                if namespaced and not selector_matches(hook.get("namespaceSelector"), ns_labels):
                    continue
                if not selector_matches(hook.get("objectSelector"), labels):
                    continue
                out.append(hook)
        return out

    async def _call(
        self,
        hook: Body,
        resource: kmock.resource,
        info: Any,
        obj: Body,
        dry_run: bool,
        *,
        mutating: bool,
    ) -> Body:
        name = hook["name"]
        if dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            raise api_error(
                400,
                "BadRequest",
                f'admission webhook "{name}" does not support dry run',
            )
        meta = obj.get("metadata") or {}
        request = {
            "uid": str(uuid.uuid4()),
            "kind": {"group": resource.group or "", "version": resource.version, "kind": info.kind},
            "resource": {
                "group": resource.group or "",
                "version": resource.version,
                "resource": resource.plural,
            },
            "requestKind": {
                "group": resource.group or "",
                "version": resource.version,
                "kind": info.kind,
            },
            "requestResource": {
                "group": resource.group or "",
                "version": resource.version,
                "resource": resource.plural,
            },
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": obj,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
        review = Review(name, request)
        self.reviews.append(review)
        started = time.perf_counter()
        try:
            response = await self._post(hook, request)
        except CallError as exc:
            review.error = str(exc)
            review.seconds = time.perf_counter() - started
            if hook.get("failurePolicy", "Fail") == "Ignore":
                return obj
            raise api_error(
                500,
                "InternalError",
                f'Internal error occurred: failed calling webhook "{name}": {exc}',
            ) from None
        review.seconds = time.perf_counter() - started
        review.response = response
        if not response.get("allowed"):
            status = response.get("status") or {}
            code = max(int(status.get("code") or 0), 400)
            message = status.get("message") or status.get("reason") or "without explanation"
            raise api_error(
                code,
                status.get("reason") or "",
                f'admission webhook "{name}" denied the request: {message}',
            )
        if not mutating or not response.get("patch"):
            return obj
        if response.get("patchType") != "JSONPatch":
            raise api_error(
                500, "InternalError", f'webhook "{name}" answered patchType other than JSONPatch'
            )
        patch = json.loads(base64.b64decode(response["patch"]))
        return apply_patch(obj, patch, "application/json-patch+json", custom=True)

    async def _post(self, hook: Body, request: Body) -> Body:
        """The review's response, or CallError (as kube-apiserver's webhook client fails)."""
        config = hook.get("clientConfig") or {}
        timeout_s = min(int(hook.get("timeoutSeconds") or DEFAULT_TIMEOUT_S), MAX_TIMEOUT_S)
        hostname = None
        if "url" in config:
            url = str(config["url"])
        elif "service" in config:
            svc = config["service"]
            key = f"{svc['namespace']}/{svc['name']}"
            if key not in self.services:
                raise CallError(f'service "{key}" not found')
            hostname = f"{svc['name']}.{svc['namespace']}.svc"
            url = f"https://{self.services[key]}{svc.get('path') or '/'}"
        else:
            raise CallError("clientConfig has neither url nor service")
        if not url.startswith("https://"):
            raise CallError(f"webhook URL {url} is not https")
        context = _client_context(str(config.get("caBundle") or ""))
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        }
        target = f"{url}?timeout={timeout_s}s"
        connector = aiohttp.TCPConnector(ssl=context, force_close=True)
        try:
            async with (
                aiohttp.ClientSession(
                    connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)
                ) as session,
                session.post(target, json=review, server_hostname=hostname) as resp,
            ):
                if resp.status != 200:
                    raise CallError(f'Post "{target}": HTTP {resp.status}')
                answer = await resp.json()
        except TimeoutError:
            raise CallError(
                f'failed to call webhook: Post "{target}": context deadline exceeded'
            ) from None
        except (aiohttp.ClientError, ssl.SSLError, OSError, ValueError) as exc:
            raise CallError(f'failed to call webhook: Post "{target}": {exc}') from None
        response = (answer or {}).get("response") if isinstance(answer, dict) else None
        if not isinstance(response, dict) or answer.get("kind") != "AdmissionReview":
            raise CallError("the webhook answered no AdmissionReview response")
        if response.get("uid") != request["uid"]:
            raise CallError(
                f"expected response.uid={request['uid']!r}, got {response.get('uid')!r}"
            )
        return response


@functools.lru_cache(maxsize=32)
def _client_context(ca_bundle: str) -> ssl.SSLContext:
    """The TLS context verifying a webhook: its ``caBundle`` only, else the system's roots (as
    kube-apiserver). Cached: loading the system's roots takes tens of milliseconds."""
    if ca_bundle:
        return ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
    return ssl.create_default_context()


def self_signed_certificate(directory: Any, hosts: Sequence[str]) -> tuple[str, str]:
    """A self-signed certificate (``tls.crt``, ``tls.key`` in ``directory``) for ``hosts``
    (IP addresses or DNS names), made with the ``openssl`` command line; the certificate is
    its own CA bundle. Returns the two paths."""
    import ipaddress
    import subprocess
    from pathlib import Path

    def san(host: str) -> str:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return f"DNS:{host}"
        return f"IP:{host}"

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    crt, key = d / "tls.crt", d / "tls.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-subj", f"/CN={hosts[0]}",
            "-addext", "subjectAltName=" + ",".join(san(h) for h in hosts),
            "-keyout", str(key), "-out", str(crt),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return str(crt), str(key)


def ca_bundle(certfile: str) -> str:
    """``clientConfig.caBundle`` for a self-signed certificate."""
    with open(certfile, "rb") as f:
        return base64.b64encode(f.read()).decode()
