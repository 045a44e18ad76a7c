"""An in-memory Kubernetes API server for tests: kmock's emulator, good enough for kopf & kubectl.

``kmock.KubernetesEmulator`` (kmock 0.8) stores objects in memory and serves them over HTTP, but
it is a loose mock: objects have no ``resourceVersion``/``uid``/``generation``, there is no PUT,
no optimistic concurrency, no label/field selectors, no status subresource, watches replay
everything as ``application/octet-stream``, CRDs do not register their resources, the core
discovery reports ``groupVersion: "/v1"``, and ``/api/v1/namespaces`` cannot even be parsed.
:class:`KubeEmulator` keeps kmock's machinery (the request log, ``emu.objects`` with histories,
``emu.resources``, discovery and the ``emu[...] << payload`` reactions) and replaces the object
API with stricter semantics:

* every write goes through one synchronous path (:meth:`KubeEmulator._commit`): a global,
  monotonic ``resourceVersion``; ``uid``/``creationTimestamp``/``generation`` on create;
  ``generation`` bumps only when something other than ``metadata``/``status`` changes;
  no-op writes change nothing; stale ``resourceVersion`` → 409 Conflict, duplicates → 409
  AlreadyExists, misses → 404 NotFound, all as proper ``Status`` bodies;
* PUT, and PATCH as merge-patch, JSON-patch (incl. ``test`` → 422), strategic-merge-patch
  (merge-patch plus merging by ``name`` for ``containers``/``env``/``volumes``/… and the
  ``$patch``/``$retainKeys``/``$deleteFromPrimitiveList`` directives; 415 for custom resources,
  as in Kubernetes), and a simplified server-side apply (create, or merge-patch the intent);
* the ``status`` subresource is separated from the main resource; the objects of a deleted
  owner are garbage-collected (by ``ownerReferences[].uid``, and the content of a deleted
  namespace); finalizers postpone deletion (``deletionTimestamp``) until they are removed;
* lists have ``kind``/``apiVersion``/``metadata.resourceVersion``, label & field selectors,
  ``limit``/``continue``, and ``meta.k8s.io/v1`` Tables (for ``kubectl get``) with the CRDs'
  ``additionalPrinterColumns``;
* watches are newline-delimited ``application/json``, start after ``resourceVersion`` (or with
  ADDED events for the existing objects), honour selectors and ``timeoutSeconds``, support
  ``sendInitialEvents`` and send a final BOOKMARK when ``allowWatchBookmarks=true``;
* a created/updated/deleted CustomResourceDefinition (un)registers its served versions, so they
  appear in discovery and can be used; all served versions share the objects (no conversion);
  the ``default`` values of the CRD schemas are applied; builtins come from kmock's bundled list.

Requests intercepted by user reactions (``emu['patch', kmock.resource('batch/v1/jobs')] << 500``)
are answered by kmock's DSL and change no state — handy for fault injection. Not emulated:
admission, schema validation & pruning, protobuf, field managers, Foreground deletion (treated
as Background), immutable fields, the namespace lifecycle (objects may be created in any
namespace), ``core/v1`` and ``events.k8s.io/v1`` Events as one resource, ``scale``, ``Table``
watches (``kubectl get -w``), authentication (any token is accepted).
All state changes are synchronous (no awaits), so they are atomic in the event loop; call the
Python API (``emu.create()``, ``emu.set_job_succeeded()``…) from the loop's thread only.

Run it standalone (e.g. for black-box tests) from the ``tests`` directory::

    python -m support.kube_emulator --port 0 --kubeconfig /tmp/kubeconfig [--crds ../crds]

It writes the kubeconfig once the server listens, then prints ``READY <url>``; SIGTERM stops it.
"""

import argparse
import asyncio
import bisect
import contextlib
import copy
import datetime
import functools
import gzip
import importlib.resources
import json
import logging
import os
import pathlib
import random
import re
import signal
import string
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import yaml
from kmock._internal import apps, enums, parsing, rendering

logger = logging.getLogger(__name__)

Body = dict[str, Any]
ObjectKey = tuple[kmock.resource, str | None, str]
CRD = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACES = kmock.resource("", "v1", "namespaces")
JOBS = kmock.resource("batch", "v1", "jobs")
CRD_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SKIPPED_GROUPS = {"gateway.networking.k8s.io", "metrics.k8s.io"}  # CRDs/aggregated in k3s
MERGED_BY_NAME = {
    "containers",
    "initContainers",
    "ephemeralContainers",
    "env",
    "volumes",
    "volumeMounts",
    "volumeDevices",
    "imagePullSecrets",
}  # strategic-merge lists
SYSTEM_FIELDS = (
    "uid",
    "creationTimestamp",
    "generation",
    "resourceVersion",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)  # metadata fields managed by the server only
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def api_error(code: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    """An exception rendered as a Kubernetes ``Status`` object (see ``KubeEmulator.__call__``)."""
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details)


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def version_priority(version: str) -> tuple[Any, ...]:
    """Kubernetes' version ordering: GA before beta before alpha, higher numbers first."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if m is None:
        return (3, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m[2]]
    return (stage, -int(m[1]), -int(m[3] or 0))


def parse_api_path(path: str) -> parsing.ParsedPath:
    """Like ``kmock.parsing.parse_path()``, but also right for the ``namespaces`` resource."""
    parts = [part for part in path.split("/") if part]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    elif len(parts) == 2 and parts[0] == "apis":
        return parsing.ParsedPath(group=parts[1])
    else:
        return parsing.ParsedPath()
    namespace = None
    is_ns_subresource = len(rest) == 3 and rest[2] in {"status", "finalize"}
    if len(rest) >= 3 and rest[0] == "namespaces" and not is_ns_subresource:
        namespace, rest = rest[1], rest[2:]
    plural, name, *subs = [*rest, None, None][: max(2, len(rest))]
    return parsing.ParsedPath(group, version, plural, namespace, name, "/".join(subs) or None)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge-patch: dicts merge recursively, ``None`` deletes, the rest replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A practical subset of the strategic merge patch (None means ``$patch: delete``)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "delete":
        return None
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    result = copy.deepcopy(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [item for item in result.get(field, []) if item not in value]
        elif key.startswith("$"):  # $setElementOrder/…, $retainKeys, $patch: ordering/pruning hints
            continue
        elif value is None:
            result.pop(key, None)
        elif (
            key in MERGED_BY_NAME and isinstance(value, list) and isinstance(result.get(key), list)
        ):
            result[key] = _merge_lists_by_name(result[key], value)
        elif (merged := strategic_merge_patch(result.get(key), value)) is None:
            result.pop(key, None)
        else:
            result[key] = merged
    if isinstance(patch.get("$retainKeys"), list):
        result = {k: v for k, v in result.items() if k in patch["$retainKeys"]}
    return result


def _merge_lists_by_name(old: list[Any], new: list[Any]) -> list[Any]:
    if not all(isinstance(item, Mapping) and "name" in item for item in [*old, *new]):
        return copy.deepcopy(new)
    items = {item["name"]: item for item in old}
    for item in new:
        merged = strategic_merge_patch(items.get(item["name"]), item)
        if merged is None:
            items.pop(item["name"], None)
        else:
            items[item["name"]] = merged
    return list(items.values())


def apply_schema_defaults(value: Any, schema: Mapping[str, Any]) -> None:
    """Set the ``default`` values of an OpenAPI v3 schema (as CRDs do), in place."""
    if isinstance(value, dict):
        for key, subschema in (schema.get("properties") or {}).items():
            if key not in value and "default" in subschema:
                value[key] = copy.deepcopy(subschema["default"])
            if key in value and key != "metadata":
                apply_schema_defaults(value[key], subschema)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            apply_schema_defaults(item, schema["items"])


def lookup(obj: Any, dotted: str) -> Any:
    """Get a value by a dotted path (``metadata.name``); None if absent."""
    for key in dotted.split("."):
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj


def split_selector(selector: str) -> list[str]:
    """Split ``a=b,c in (x,y),!d`` by the commas outside of the parentheses."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [part.strip() for part in [*parts, current] if part.strip()]


_LABEL_REQUIREMENT = re.compile(
    r"(?P<neg>!)?\s*(?P<key>[\w./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<val>[\w.-]*)|\s+(?P<setop>in|notin)\s*\((?P<vals>[^)]*)\))?"
)


def label_selector_matcher(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """Parse a label selector (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``, ``!key``)."""
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for part in split_selector(selector):
        m = _LABEL_REQUIREMENT.fullmatch(part)
        if m is None:
            raise api_error(400, "BadRequest", f"unable to parse requirement: {part!r}")
        key, val = m["key"], m["val"]
        vals = {v.strip() for v in (m["vals"] or "").split(",") if v.strip()}
        if m["neg"]:
            checks.append(lambda labels, k=key: k not in labels)
        elif m["op"] in {"=", "=="}:
            checks.append(lambda labels, k=key, v=val: labels.get(k) == v)
        elif m["op"] == "!=":
            checks.append(lambda labels, k=key, v=val: labels.get(k) != v)
        elif m["setop"] == "in":
            checks.append(lambda labels, k=key, vs=vals: labels.get(k) in vs)
        elif m["setop"] == "notin":
            checks.append(lambda labels, k=key, vs=vals: labels.get(k) not in vs)
        else:
            checks.append(lambda labels, k=key: k in labels)
    return lambda labels: all(check(labels) for check in checks)


def field_selector_matcher(selector: str) -> Callable[[Body], bool]:
    """Parse a field selector: ``path=value``, ``path==value``, ``path!=value`` (dotted paths)."""
    checks: list[Callable[[Body], bool]] = []
    for part in split_selector(selector):
        m = re.fullmatch(r"\s*([\w./-]+)\s*(==|=|!=)\s*(.*?)\s*", part)
        if m is None:
            raise api_error(400, "BadRequest", f"invalid field selector: {part!r}")
        path, negate, value = m[1], m[2] == "!=", m[3]
        checks.append(lambda obj, p=path, n=negate, v=value: (str(lookup(obj, p) or "") == v) != n)
    return lambda obj: all(check(obj) for check in checks)


_JSONPATH_TOKEN = re.compile(
    r"""\.(?P<field>[\w-]+)|\[['"](?P<qfield>[^'"]+)['"]\]|\[(?P<index>-?\d+)\]|(?P<all>\[\*\]|\.\*)"""
    r"""|\[\?\(@\.(?P<fkey>[\w.-]+)\s*(?P<fop>==|!=)\s*['"]?(?P<fval>[^'")]*)['"]?\)\]"""
)


def jsonpath(obj: Any, path: str) -> list[Any]:
    """A tiny JSONPath for printer columns: ``.a.b``, ``[0]``, ``[*]``, ``[?(@.type=="Ready")]``."""
    path = path.strip().removeprefix("{").removesuffix("}").removeprefix("$")
    values, pos = [obj], 0
    while pos < len(path):
        m = _JSONPATH_TOKEN.match(path, pos)
        if m is None:
            raise ValueError(f"unsupported JSONPath: {path!r}")
        pos, found = m.end(), []
        for value in values:
            key = m["field"] or m["qfield"]
            if key is not None and isinstance(value, Mapping) and key in value:
                found.append(value[key])
            elif m["index"] is not None and isinstance(value, list):
                found.extend(value[int(m["index"]) :][:1] if int(m["index"]) >= 0 else [])
            elif m["all"] and isinstance(value, list | Mapping):
                found.extend(value.values() if isinstance(value, Mapping) else value)
            elif m["fkey"] and isinstance(value, list):
                found.extend(
                    item
                    for item in value
                    if (str(lookup(item, m["fkey"])) == m["fval"]) == (m["fop"] == "==")
                )
        values = found
    return values


def human_age(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = max(0, int((datetime.datetime.now(datetime.UTC) - then).total_seconds()))
    for unit, size, limit in [("s", 1, 120), ("m", 60, 3 * 3600), ("h", 3600, 48 * 3600)]:
        if seconds < limit:
            return f"{seconds // size}{unit}"
    return f"{seconds // 86400}d"


@functools.cache
def _bundled_resources() -> bytes:
    """kmock's bundled discovery data of the builtin resources (from a K3s cluster)."""
    data = importlib.resources.files("kmock._internal").joinpath("resources.json.gz").read_bytes()
    return gzip.decompress(data)


@attrs.frozen
class WatchEvent:
    rv: int
    resource: kmock.resource  # the storage resource (any served version maps to it)
    type: str  # ADDED, MODIFIED, DELETED
    object: Body
    previous: Body | None  # to turn MODIFIED into ADDED/DELETED for selector-filtered watches


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator with real API-server semantics; see the module docstring."""

    watch_timeout: float = 1800.0  # for watches without ?timeoutSeconds=
    _rv: int = attrs.field(default=0, init=False)
    _events: list[WatchEvent] = attrs.field(factory=list, init=False)
    _wakeup: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _stopping: bool = attrs.field(default=False, init=False)
    _storage_versions: dict[tuple[str, str], str] = attrs.field(factory=dict, init=False)
    _printer_columns: dict[kmock.resource, list[Body]] = attrs.field(factory=dict, init=False)
    _schemas: dict[kmock.resource, Body] = attrs.field(factory=dict, init=False)
    _custom: set[tuple[str, str]] = attrs.field(factory=set, init=False)  # (group, plural) of CRs
    failures: list[BaseException] = attrs.field(factory=list, init=False)  # emulator bugs (500s)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[re.compile(r"/openapi/.*")] << api_error(  # kubectl needs --validate=false
            404, "NotFound", "OpenAPI is not emulated"
        )
        builtins = kmock.ResourcesArray()
        builtins.load_data(_bundled_resources())  # NB: load_bundled() warns on Python 3.11
        for resource in sorted(builtins, key=lambda r: version_priority(r.version or "")):
            if resource.group not in SKIPPED_GROUPS:
                self._resources[resource] = builtins[resource]
                self._storage_versions.setdefault(
                    (resource.group, resource.plural), resource.version
                )
        for name in DEFAULT_NAMESPACES:
            self.create(NAMESPACES, None, {"metadata": {"name": name}})

    # --- HTTP entry point & routing ---------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """The aiohttp entry point. Like ``RawHandler.__call__``, but with our URL/body parser."""
        request = await self._parse_request(raw_request)
        self._requests.append(request)
        try:
            return await self._handle(request)
        except rendering.StreamingError as e:  # a stream of a user reaction failed mid-way
            raw_response: aiohttp.web.StreamResponse = e.args[0]
            with contextlib.suppress(ConnectionError):
                await self._stream_error(e.__cause__ or e, raw_response)
                await raw_response.write_eof()
            return raw_response
        except kmock.KubernetesError as e:
            return self._status_response(e)
        except Exception as e:
            logger.exception("The emulator failed on %s %s", request.method.value, request.url)
            self.failures.append(e)
            if self._errors:
                self._errors[-1].append(e)  # kmock's strict mode re-raises it at exit
            return self._status_response(api_error(500, "InternalError", repr(e)))

    async def _parse_request(self, raw_request: aiohttp.web.BaseRequest) -> kmock.Request:
        body = await raw_request.read()
        text = body.decode("utf-8", errors="replace")
        data = None
        if body:
            with contextlib.suppress(ValueError, yaml.YAMLError):  # garbage in: data is None
                is_yaml = "yaml" in raw_request.content_type  # server-side apply
                data = yaml.safe_load(text) if is_yaml else json.loads(text)
        k8s = parse_api_path(raw_request.path)
        method = enums.method(raw_request.method)
        resource = (
            None
            if k8s.group is None
            else kmock.resource(group=k8s.group, version=k8s.version, plural=k8s.plural)
        )
        return kmock.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=text,
            data=data,
            action=parsing.guess_k8s(k8s, method, dict(raw_request.query)),
            resource=resource,
            namespace=k8s.namespace,
            name=k8s.name,
            subresource=k8s.subresource,
        )

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # Discovery and anything non-API goes to kmock's DSL (incl. our overridden _serve_* hooks).
        # So do the API requests intercepted by user reactions. The rest is served by us directly;
        # note: the parent's _handle() is skipped deliberately — it mutates objects kmock-style.
        if (
            request.resource is None
            or request.resource.plural is None
            or self._intercepted(request)
        ):
            return await apps.RawHandler._handle(self, request)
        return await self._serve_object_api(request)

    def _intercepted(self, request: kmock.Request) -> bool:
        """Whether a user-defined (non-fallback) reaction matches the request."""
        return any(
            not (payload.priorities and payload.priorities[0] == float("-inf"))
            and not payload._disabled.is_set()
            and request in payload._source
            for payload in self._payloads
        )

    @staticmethod
    def _status_response(error: kmock.KubernetesError) -> aiohttp.web.Response:
        return aiohttp.web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": error.message,
                "reason": error.reason,
                "details": error.details or {},
                "code": error.status,
            },
            status=error.status,
        )

    # --- discovery (overrides of kmock's hooks) -----------------------------------------------

    def _get_resources(self) -> list[kmock.resource]:
        return list(self._resources)  # only what is registered, not guessed from objects/reactions

    def _group_versions(self) -> dict[str, list[str]]:
        groups: dict[str, set[str]] = {}
        for resource in self._resources:
            groups.setdefault(resource.group or "", set()).add(resource.version or "")
        return {group: sorted(versions, key=version_priority) for group, versions in groups.items()}

    @staticmethod
    def _api_group(name: str, versions: list[str]) -> Body:
        entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {"name": name, "versions": entries, "preferredVersion": entries[0]}

    async def _serve_server_version(self, request: kmock.Request) -> Any:
        return {
            "major": "1",
            "minor": "32",
            "gitVersion": "v1.32.0+kube-emulator",
            "platform": "linux/amd64",
        }

    async def _serve_api(self, request: kmock.Request) -> Any:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": request.url.host or "127.0.0.1"}
            ],
        }

    async def _serve_apis(self, request: kmock.Request) -> Any:
        groups = self._group_versions()
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self._api_group(group, groups[group]) for group in sorted(groups) if group],
        }

    async def _serve_group(self, request: kmock.Request) -> Any:
        group = request.resource.group if request.resource is not None else None
        versions = self._group_versions().get(group or "")
        if not group or not versions:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        return {"kind": "APIGroup", "apiVersion": "v1", **self._api_group(group, versions)}

    async def _serve_version(self, request: kmock.Request) -> Any:
        assert request.resource is not None
        group, version = request.resource.group or "", request.resource.version
        entries = []
        for resource, info in self._resources.items():
            if (resource.group or "", resource.version) != (group, version):
                continue
            common = {
                "singularName": info.singular or "",
                "namespaced": bool(info.namespaced),
                "kind": info.kind or resource.plural,
            }
            entries.append(
                {
                    "name": resource.plural,
                    **common,
                    "verbs": sorted(info.verbs),
                    "shortNames": sorted(info.shortnames),
                    "categories": sorted(info.categories),
                }
            )
            entries.extend(
                {
                    "name": f"{resource.plural}/{sub}",
                    **common,
                    "singularName": "",
                    "verbs": ["get", "patch", "update"],
                }
                for sub in sorted(info.subresources)
            )
        if not entries:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": entries,
        }

    # --- the object API over HTTP ---------------------------------------------------------------

    async def _serve_object_api(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        assert request.resource is not None
        resource, info = self.lookup(request.resource)
        namespace, name, sub = request.namespace, request.name, request.subresource
        params = request.params
        if (namespace is not None and not info.namespaced) or sub not in {None, *info.subresources}:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        if info.namespaced and name is not None and namespace is None:
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        if sub not in {None, "status"}:
            raise api_error(405, "MethodNotAllowed", f"subresource {sub!r} is not emulated")
        if request.headers.get("Content-Type", "").startswith(
            "application/vnd.kubernetes.protobuf"
        ):
            raise api_error(
                415,
                "UnsupportedMediaType",
                "protobuf is not emulated; send JSON (e.g. kubectl create --dry-run=client "
                "-o yaml | kubectl apply --validate=false -f -)",
            )
        method, dry_run = request.method.value, "dryRun" in params
        data = request.data if isinstance(request.data, dict) else None
        if method in {"POST", "PUT"} and data is None:
            raise api_error(400, "BadRequest", "the request body must be a JSON/YAML object")

        status, result = 200, None
        if method == "GET" and params.get("watch") in {"true", "1"}:
            return await self._serve_watch_stream(request, resource, info)
        elif method == "GET" and name is None:
            result = self._list_body(resource, info, namespace, params)
        elif method == "GET":
            result = self.read(resource, namespace, name)
        elif method == "POST" and name is None:
            status, result = 201, self.create(resource, namespace, data or {}, dry_run=dry_run)
        elif method == "PUT" and name is not None:
            result = self.replace(
                resource, namespace, name, data or {}, subresource=sub, dry_run=dry_run
            )
        elif method == "PATCH" and name is not None:
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            status, result = self.patch(
                resource,
                namespace,
                name,
                request.data,
                content_type,
                subresource=sub,
                dry_run=dry_run,
            )
        elif method == "DELETE":
            options = {**(data or {}), **{k: v for k, v in params.items() if k != "dryRun"}}
            if name is not None:
                result = self.delete(resource, namespace, name, options, dry_run=dry_run)
            else:
                result = self._list_body(resource, info, namespace, params)
                for obj in result["items"]:
                    meta = obj["metadata"]
                    self.delete(
                        resource, meta.get("namespace"), meta["name"], options, dry_run=dry_run
                    )
        else:
            raise api_error(405, "MethodNotAllowed", f"{method} is not supported here")

        if method == "GET" and "as=Table" in request.headers.get("Accept", ""):
            items = result["items"] if name is None else [result]
            result = self._table(resource, items, params.get("includeObject", "Metadata"))
        return aiohttp.web.json_response(result, status=status)

    def _list_body(
        self,
        resource: kmock.resource,
        info: kmock.ResourceInfo,
        namespace: str | None,
        params: Mapping[str, str],
    ) -> Body:
        objs = self.select(
            resource, namespace, params.get("labelSelector"), params.get("fieldSelector")
        )
        objs.sort(key=lambda obj: (obj["metadata"].get("namespace") or "", obj["metadata"]["name"]))
        rv, offset = self._rv, 0
        if params.get("continue"):
            try:
                rv, offset = (int(x) for x in params["continue"].split(":"))
            except ValueError:
                raise api_error(400, "BadRequest", "invalid continue token") from None
        limit = int(params.get("limit") or 0) or len(objs)
        chunk, rest = objs[offset : offset + limit], objs[offset + limit :]
        metadata: Body = {"resourceVersion": str(rv)}
        if rest:
            metadata.update({"continue": f"{rv}:{offset + limit}", "remainingItemCount": len(rest)})
        return {
            "kind": f"{info.kind}List",
            "apiVersion": self._api_version(resource),
            "metadata": metadata,
            "items": chunk,
        }

    def _table(self, resource: kmock.resource, objs: list[Body], include: str) -> Body:
        """A ``meta.k8s.io/v1`` Table as requested by ``kubectl get`` (NAME + printer columns)."""
        columns = self._printer_columns.get(resource) or [
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
        ]
        definitions = [
            {
                "name": "Name",
                "type": "string",
                "format": "name",
                "priority": 0,
                "description": "The name of the object.",
            }
        ]
        definitions += [
            {
                "name": col["name"],
                "type": col.get("type", "string"),
                "format": col.get("format", ""),
                "priority": col.get("priority", 0),
                "description": col.get("description", ""),
            }
            for col in columns
        ]
        rows = []
        for obj in objs:
            cells: list[Any] = [obj["metadata"]["name"]]
            for col in columns:
                values = jsonpath(obj, col["jsonPath"])
                value = values[0] if values else None
                cells.append(human_age(value) if col.get("type") == "date" and value else value)
            row: Body = {"cells": cells}
            if include == "Object":
                row["object"] = obj
            elif include != "None":
                row["object"] = {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj["metadata"],
                }
            rows.append(row)
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(self._rv)},
            "columnDefinitions": definitions,
            "rows": rows,
        }

    async def _serve_watch_stream(
        self, request: kmock.Request, resource: kmock.resource, info: kmock.ResourceInfo
    ) -> aiohttp.web.StreamResponse:
        params = request.params
        by_name = f"metadata.name={request.name}" if request.name else ""  # …/configmaps/x?watch
        field_selector = ",".join(filter(None, [params.get("fieldSelector"), by_name]))
        matches = self._matcher(request.namespace, params.get("labelSelector"), field_selector)
        storage, api_version = self._storage(resource), self._api_version(resource)
        since, initial = params.get("resourceVersion") or "0", params.get("sendInitialEvents")
        events: list[Body] = []
        if since == "0" or initial == "true":
            objs = self.select(
                resource, request.namespace, params.get("labelSelector"), field_selector
            )
            events = [{"type": "ADDED", "object": obj} for obj in objs]
            position = len(self._events)
        elif since.isdigit():
            position = bisect.bisect_right(self._events, int(since), key=lambda e: e.rv)
        else:
            raise api_error(400, "BadRequest", f"invalid resourceVersion: {since!r}")
        bookmark = {
            "type": "BOOKMARK",
            "object": {
                "kind": info.kind,
                "apiVersion": api_version,
                "metadata": {"resourceVersion": ""},
            },
        }
        if initial == "true":
            bookmark["object"]["metadata"].update(
                resourceVersion=str(self._rv), annotations={"k8s.io/initial-events-end": "true"}
            )
            events.append(copy.deepcopy(bookmark))

        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(params.get("timeoutSeconds") or self.watch_timeout)
        with contextlib.suppress(ConnectionError):
            while True:
                for event in events:
                    await response.write(json.dumps(event).encode() + b"\n")
                events = []
                for event in self._events[position:]:
                    position += 1
                    if event.resource == storage and (kind := self._watch_type(event, matches)):
                        obj = {**event.object, "apiVersion": api_version}
                        events.append({"type": kind, "object": obj})
                if events:
                    continue
                wakeup, timeout = self._wakeup, deadline - loop.time()
                if self._stopping or timeout <= 0 or resource not in self._resources:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), timeout)
            if params.get("allowWatchBookmarks") == "true" and not self._stopping:
                bookmark["object"]["metadata"]["resourceVersion"] = str(self._rv)
                await response.write(json.dumps(bookmark).encode() + b"\n")
            await response.write_eof()
        return response

    @staticmethod
    def _watch_type(event: WatchEvent, matches: Callable[[Body], bool]) -> str | None:
        """As seen through selectors: an object that starts/stops matching is ADDED/DELETED."""
        if event.type != "MODIFIED":
            return event.type if matches(event.object) else None
        now_in = matches(event.object)
        was_in = event.previous is not None and matches(event.previous)
        if now_in:
            return "MODIFIED" if was_in else "ADDED"
        return "DELETED" if was_in else None

    # --- the object API in Python (used by the HTTP layer and by tests) ------------------------

    def resolve(self, resource: str | kmock.resource) -> kmock.resource:
        """Find a served resource by ``group/version/plural``, plural, ``plural.group``, kind…"""
        if isinstance(resource, kmock.resource):
            if resource in self._resources:
                return resource
            name, group = resource.plural or "", resource.group or ""
        elif "/" in resource and (parsed := kmock.resource(resource)) in self._resources:
            return parsed
        else:
            name, _, group = resource.partition(".")
        candidates = [
            res
            for res, info in self._resources.items()
            if name.lower()
            in {res.plural, info.singular, (info.kind or "").lower(), *info.shortnames}
            and (not group or res.group == group)
        ]
        if not candidates:
            raise api_error(404, "NotFound", f"the server does not serve {resource!r}")
        return min(candidates, key=lambda r: (r.group != "", r.group, version_priority(r.version)))

    def lookup(self, resource: kmock.resource) -> tuple[kmock.resource, kmock.ResourceInfo]:
        if resource not in self._resources:  # NB: ResourcesArray[...] would auto-create it
            raise api_error(404, "NotFound", "the server could not find the requested resource")
        return resource, self._resources[resource]

    def _storage(self, resource: kmock.resource) -> kmock.resource:
        """All served versions of a resource share the objects, stored under one version."""
        version = self._storage_versions.get((resource.group, resource.plural), resource.version)
        return kmock.resource(resource.group, version, resource.plural)

    def _api_version(self, resource: kmock.resource) -> str:
        return f"{resource.group}/{resource.version}" if resource.group else str(resource.version)

    def _key(self, resource: kmock.resource, namespace: str | None, name: str) -> ObjectKey:
        return (
            self._storage(resource),
            namespace if self._resources[resource].namespaced else None,
            name,
        )

    def _live(self, key: ObjectKey) -> Body | None:
        """A private copy of the object's current state (never the stored dict), or None."""
        if key in self._objects and not self._objects[key].deleted:
            return copy.deepcopy(self._objects[key].raw)
        return None

    @staticmethod
    def _error(code: int, reason: str, message: str, resource: kmock.resource, name: str) -> Any:
        """An error about an object: the message starts with ``plural.group "name"``."""
        what = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
        message = message.format(what=f'{what} "{name}"')
        return api_error(
            code, reason, message, name=name, group=resource.group, kind=resource.plural
        )

    def _not_found(self, resource: kmock.resource, name: str) -> kmock.KubernetesError:
        return self._error(404, "NotFound", "{what} not found", resource, name)

    def _matcher(
        self, namespace: str | None, label_selector: str | None, field_selector: str | None
    ) -> Callable[[Body], bool]:
        labels_ok = label_selector_matcher(label_selector or "")
        fields_ok = field_selector_matcher(field_selector or "")
        return lambda obj: (
            (namespace is None or obj["metadata"].get("namespace") == namespace)
            and labels_ok(obj["metadata"].get("labels") or {})
            and fields_ok(obj)
        )

    def select(
        self,
        resource: str | kmock.resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Body]:
        """The current objects of a resource (all namespaces if None), filtered by selectors."""
        resource = self.resolve(resource)
        storage = self._storage(resource)
        matches = self._matcher(namespace, label_selector, field_selector)
        return [
            {**copy.deepcopy(obj.raw), "apiVersion": self._api_version(resource)}
            for (res, _, _), obj in self._objects.items()
            if res == storage and not obj.deleted and matches(obj.raw)
        ]

    def read(self, resource: str | kmock.resource, namespace: str | None, name: str) -> Body:
        resource = self.resolve(resource)
        obj = self._live(self._key(resource, namespace, name))
        if obj is None:
            raise self._not_found(resource, name)
        return {**obj, "apiVersion": self._api_version(resource)}

    def create(
        self,
        resource: str | kmock.resource,
        namespace: str | None,
        body: Body,
        *,
        dry_run: bool = False,
    ) -> Body:
        resource = self.resolve(resource)
        info = self._resources[resource]
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            suffix = random.choices(string.digits + "bcdfghjklmnpqrstvwxz", k=5)
            meta["name"] = meta["generateName"] + "".join(suffix)
        if not meta.get("name"):
            raise api_error(422, "Invalid", "metadata.name: Required value: name is required")
        if info.namespaced:
            if namespace and meta.get("namespace") not in {None, namespace}:
                raise api_error(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does "
                    "not match the namespace sent on the request",
                )
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        key = self._key(resource, meta.get("namespace"), meta["name"])
        if self._live(key) is not None:
            message = "{what} already exists"
            raise self._error(409, "AlreadyExists", message, resource, meta["name"])
        for field in SYSTEM_FIELDS:
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
        obj = {"apiVersion": None, "kind": None, **obj}  # just to have these keys first
        obj.update(apiVersion=self._api_version(resource), kind=info.kind)
        if "status" in info.subresources:
            obj.pop("status", None)  # as in Kubernetes: the status cannot be set on creation
        self._default(resource, obj)
        if resource == CRD:
            self._validate_crd(obj)
        return obj if dry_run else self._commit(key, "ADDED", obj, None)

    def replace(
        self,
        resource: str | kmock.resource,
        namespace: str | None,
        name: str,
        body: Body,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Body:
        """PUT: replace the object (or only its status with ``subresource='status'``)."""
        resource = self.resolve(resource)
        info = self._resources[resource]
        key = self._key(resource, namespace, name)
        old = self._live(key)
        if old is None:
            raise self._not_found(resource, name)
        new = copy.deepcopy(dict(body))
        new_meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        if new_meta.get("resourceVersion") not in {None, "", old_meta["resourceVersion"]}:
            message = (
                "Operation cannot be fulfilled on {what}: the object has been modified; "
                "please apply your changes to the latest version and try again"
            )
            raise self._error(409, "Conflict", message, resource, name)
        if subresource == "status":  # only the status changes via the status subresource
            new = {**copy.deepcopy(old), "status": new.get("status")}
        elif "status" in info.subresources:  # and never via the main resource
            new["status"] = copy.deepcopy(old.get("status"))
        if new.get("status") is None:
            new.pop("status", None)
        for field in ["name", "namespace", *SYSTEM_FIELDS]:  # clients cannot change these
            new["metadata"].pop(field, None)
            if field in old_meta:
                new["metadata"][field] = old_meta[field]
        new.update(apiVersion=old["apiVersion"], kind=old["kind"])
        ignored = {"metadata", "status"} if "status" in info.subresources else {"metadata"}
        if {k: v for k, v in new.items() if k not in ignored} != {
            k: v for k, v in old.items() if k not in ignored
        }:
            new["metadata"]["generation"] = old_meta.get("generation", 0) + 1
        self._default(resource, new)
        if new == old:
            return {**old, "apiVersion": self._api_version(resource)}  # a no-op: no rv, no event
        if resource == CRD:
            self._validate_crd(new)
        if dry_run:
            return new
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return self._remove(key, new)
        return {
            **self._commit(key, "MODIFIED", new, old),
            "apiVersion": self._api_version(resource),
        }

    def patch(
        self,
        resource: str | kmock.resource,
        namespace: str | None,
        name: str,
        patch: Any,
        content_type: str = "application/merge-patch+json",
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> tuple[int, Body]:
        """PATCH the object; returns the HTTP status (201 if server-side apply created it)."""
        resource = self.resolve(resource)
        key = self._key(resource, namespace, name)
        old = self._live(key)
        if content_type == "application/apply-patch+yaml":  # server-side apply, simplified
            if not isinstance(patch, dict):
                raise api_error(400, "BadRequest", "the apply patch must be an object")
            if old is None:
                body = merge_patch({"metadata": {"name": name}}, patch)
                return 201, self.create(resource, namespace, body, dry_run=dry_run)
            content_type = "application/merge-patch+json"
        if old is None:
            raise self._not_found(resource, name)
        if content_type == "application/json-patch+json" and isinstance(patch, list):
            try:
                new = jsonpatch.apply_patch(old, patch, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise api_error(422, "Invalid", f"the JSON patch cannot be applied: {e}") from e
        elif content_type == "application/merge-patch+json" and isinstance(patch, dict):
            new = merge_patch(old, patch)
        elif content_type == "application/strategic-merge-patch+json" and isinstance(patch, dict):
            if (resource.group, resource.plural) in self._custom:
                raise api_error(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an "
                    "unknown format - accepted media types include: "
                    "application/json-patch+json, application/merge-patch+json, "
                    "application/apply-patch+yaml",
                )
            new = strategic_merge_patch(old, patch)
        else:
            raise api_error(415, "UnsupportedMediaType", f"unsupported patch: {content_type!r}")
        return 200, self.replace(
            resource, namespace, name, new, subresource=subresource, dry_run=dry_run
        )

    def delete(
        self,
        resource: str | kmock.resource,
        namespace: str | None,
        name: str,
        options: Mapping[str, Any] | None = None,
        *,
        dry_run: bool = False,
    ) -> Body:
        """DELETE: mark for deletion if there are finalizers, otherwise remove (with GC)."""
        resource = self.resolve(resource)
        options = options or {}
        key = self._key(resource, namespace, name)
        old = self._live(key)
        if old is None:
            raise self._not_found(resource, name)
        preconditions = options.get("preconditions") or {}
        for field in ["uid", "resourceVersion"]:
            if preconditions.get(field) not in {None, old["metadata"].get(field)}:
                raise api_error(409, "Conflict", f"Precondition failed: {field} mismatch")
        if dry_run:
            return old
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return old
            new = copy.deepcopy(old)
            new["metadata"].update(
                deletionTimestamp=now_iso(),
                deletionGracePeriodSeconds=0,
                generation=old["metadata"].get("generation", 0) + 1,
            )
            self._default(resource, new)
            return self._commit(key, "MODIFIED", new, old)
        return self._remove(
            key, copy.deepcopy(old), orphan=options.get("propagationPolicy") == "Orphan"
        )

    # --- the single write path -------------------------------------------------------------

    def _commit(self, key: ObjectKey, event_type: str, obj: Body, previous: Body | None) -> Body:
        """Store a new version with a new resourceVersion, log the event, wake up the watchers."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if key in self._objects:
            self._objects[key].history.append(obj)
        else:
            self._objects[key] = obj
        if event_type == "DELETED":
            self._objects[key].delete()
        self._events.append(WatchEvent(self._rv, key[0], event_type, obj, previous))
        self._wakeup.set()
        self._wakeup = asyncio.Event()
        if key[0] == CRD:
            self._sync_crd(previous, None if event_type == "DELETED" else obj)
        return copy.deepcopy(obj)  # the stored dicts are immutable (the history, watch events)

    def _remove(self, key: ObjectKey, obj: Body, *, orphan: bool = False) -> Body:
        removed = self._commit(key, "DELETED", obj, obj)
        if not orphan:
            self._collect_garbage(removed)
        return removed

    def _collect_garbage(self, owner: Body) -> None:
        """Delete the dependents of a removed owner (background propagation), recursively."""
        uid = owner["metadata"].get("uid")
        is_namespace = owner.get("kind") == "Namespace" and owner.get("apiVersion") == "v1"
        live_uids = {
            obj.raw["metadata"].get("uid") for obj in self._objects.values() if not obj.deleted
        }
        for (res, namespace, name), obj in list(self._objects.items()):
            if obj.deleted:
                continue
            refs = obj.raw["metadata"].get("ownerReferences") or []
            orphaned = any(ref.get("uid") == uid for ref in refs) and not any(
                ref.get("uid") in live_uids for ref in refs
            )
            in_namespace = is_namespace and namespace == owner["metadata"]["name"]
            if (orphaned or in_namespace) and self._live((res, namespace, name)) is not None:
                with contextlib.suppress(kmock.KubernetesError):  # e.g. its CRD is gone
                    self.delete(res, namespace, name)

    def _default(self, resource: kmock.resource, obj: Body) -> None:
        """Defaults from CRD schemas, fields that a real cluster would set (namespaces, CRDs)."""
        meta = obj["metadata"]
        if resource in self._schemas:
            apply_schema_defaults(obj, self._schemas[resource])
        if self._storage(resource) == NAMESPACES:
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj["status"] = {"phase": "Terminating" if meta.get("deletionTimestamp") else "Active"}
        elif self._storage(resource) == CRD:
            spec = obj.get("spec") or {}
            stored = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
            obj["status"] = {
                "acceptedNames": spec.get("names") or {},
                "storedVersions": stored,
                "conditions": [
                    {
                        "type": t,
                        "status": "True",
                        "reason": t,
                        "message": "",
                        "lastTransitionTime": meta["creationTimestamp"],
                    }
                    for t in ("NamesAccepted", "Established")
                ],
            }

    # --- CustomResourceDefinitions ------------------------------------------------------------

    @staticmethod
    def _validate_crd(crd: Body) -> None:
        spec = crd.get("spec") or {}
        names, group = spec.get("names") or {}, spec.get("group")
        if (
            not group
            or not names.get("plural")
            or not names.get("kind")
            or not spec.get("versions")
        ):
            raise api_error(
                422, "Invalid", "a CRD needs spec.group, spec.names.plural/kind, and spec.versions"
            )
        if crd["metadata"]["name"] != f"{names['plural']}.{group}":
            raise api_error(
                422, "Invalid", 'metadata.name must be spec.names.plural+"."+spec.group'
            )
        if len([v for v in spec["versions"] if v.get("storage")]) != 1:
            raise api_error(422, "Invalid", "exactly one version must be the storage version")

    def _sync_crd(self, old: Body | None, new: Body | None) -> None:
        """Register the served versions of a CRD as resources; unregister removed ones."""
        old_resources = self._crd_resources(old) if old else {}
        new_resources = self._crd_resources(new) if new else {}
        if new is None and old_resources:  # the CRD is gone: so are its objects
            storage = self._storage(next(iter(old_resources)))
            for (res, namespace, name), obj in list(self._objects.items()):
                if res == storage and not obj.deleted:
                    self._remove((res, namespace, name), copy.deepcopy(obj.raw))
        for resource in old_resources.keys() - new_resources.keys():
            del self._resources[resource]
            self._printer_columns.pop(resource, None)
            self._schemas.pop(resource, None)
        if new is None and old is not None:
            group_plural = (old["spec"]["group"], old["spec"]["names"]["plural"])
            self._custom.discard(group_plural)
            self._storage_versions.pop(group_plural, None)
        # The objects are stored under the first storage version forever: no conversions.
        versions = new["spec"]["versions"] if new is not None else []
        storage = next((v["name"] for v in versions if v.get("storage")), None)
        for resource, (info, version) in new_resources.items():
            self._resources[resource] = info
            self._printer_columns[resource] = version.get("additionalPrinterColumns") or []
            self._schemas[resource] = (version.get("schema") or {}).get("openAPIV3Schema") or {}
            self._custom.add((resource.group, resource.plural))
            self._storage_versions.setdefault((resource.group, resource.plural), storage or "")

    @staticmethod
    def _crd_resources(crd: Body) -> dict[kmock.resource, tuple[kmock.ResourceInfo, Body]]:
        """The served resources of a CRD: their discovery info & the CRD's version entry."""
        spec, names = crd["spec"], crd["spec"]["names"]
        result = {}
        for version in spec["versions"]:
            if version.get("served", True):
                subresources = version.get("subresources") or {}
                info = kmock.ResourceInfo(
                    kind=names["kind"],
                    singular=names.get("singular") or names["kind"].lower(),
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    verbs=CRD_VERBS,
                    shortnames=names.get("shortNames") or [],
                    categories=names.get("categories") or [],
                    subresources=[s for s in ("status", "scale") if s in subresources],
                )
                resource = kmock.resource(spec["group"], version["name"], names["plural"])
                result[resource] = (info, version)
        return result

    def load_crds(self, path: str | os.PathLike[str]) -> list[Body]:
        """Create/update the CRDs from a YAML file, or from all ``*.yaml``/``*.yml`` in a dir."""
        path = pathlib.Path(path)
        files = sorted([*path.glob("*.yaml"), *path.glob("*.yml")]) if path.is_dir() else [path]
        loaded = []
        for file in files:
            for doc in yaml.safe_load_all(file.read_text()):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    loaded.append(self.apply(doc))
        return loaded

    # --- conveniences for tests ---------------------------------------------------------------

    def resource_for(self, api_version: str, kind: str) -> kmock.resource:
        """The served resource for an ``apiVersion`` & ``kind`` (e.g. ``batch/v1``, ``Job``)."""
        group, _, version = api_version.rpartition("/")
        for resource, info in self._resources.items():
            if (resource.group, resource.version, info.kind) == (group, version, kind):
                return resource
        raise api_error(404, "NotFound", f'no matches for kind "{kind}" in version "{api_version}"')

    def apply(self, body: Body, resource: str | kmock.resource | None = None) -> Body:
        """Create the object, or merge-patch it if it exists (like a naive ``kubectl apply``)."""
        resource = (
            self.resolve(resource)
            if resource is not None
            else self.resource_for(body.get("apiVersion", "v1"), body.get("kind", ""))
        )
        meta = body.get("metadata") or {}
        return self.patch(
            resource, meta.get("namespace"), meta["name"], body, "application/apply-patch+yaml"
        )[1]

    def get_object(
        self, resource: str | kmock.resource, namespace: str | None, name: str
    ) -> Body | None:
        """The current state of an object, or None if absent."""
        try:
            return self.read(resource, namespace, name)
        except kmock.KubernetesError:
            return None

    def set_job_succeeded(self, namespace: str, name: str) -> Body:
        """Simulate the Job controller: mark a batch/v1 Job as complete (via /status)."""
        return self._finish_job(namespace, name, {"succeeded": 1}, {"type": "Complete"})

    def set_job_failed(
        self,
        namespace: str,
        name: str,
        reason: str = "BackoffLimitExceeded",
        message: str = "Job has reached the specified backoff limit",
    ) -> Body:
        """Simulate the Job controller: mark a batch/v1 Job as failed (via /status)."""
        condition = {"type": "Failed", "reason": reason, "message": message}
        return self._finish_job(namespace, name, {"failed": 1}, condition)

    def _finish_job(self, namespace: str, name: str, counts: Body, condition: Body) -> Body:
        now = now_iso()
        status = self.read(JOBS, namespace, name).get("status") or {}
        condition = {**condition, "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
        conditions = [c for c in status.get("conditions") or [] if c["type"] != condition["type"]]
        new_status = {"active": 0, "startTime": status.get("startTime", now), **counts}
        new_status["conditions"] = [*conditions, condition]
        if condition["type"] == "Complete":
            new_status["completionTime"] = now
        return self.patch(JOBS, namespace, name, {"status": new_status}, subresource="status")[1]

    def api_requests(
        self,
        method: str | None = None,
        resource: str | kmock.resource | None = None,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> list[kmock.Request]:
        """The logged API requests, filtered (e.g. ``api_requests('PUT', 'jobs')``)."""
        if resource is None:
            plural, group = None, None
        elif isinstance(resource, kmock.resource):
            plural, group = resource.plural, resource.group
        else:
            try:  # also served under other names: shortnames, kinds, other versions
                plural, group = (served := self.resolve(resource)).plural, served.group
            except kmock.KubernetesError:  # e.g. the CRD does not exist (yet)
                plural, _, group = resource.partition(".")
        return [
            req
            for req in self._requests
            if method is None or req.method.value == method.upper()
            if plural is None or (req.resource is not None and req.resource.plural == plural)
            if not group or (req.resource is not None and req.resource.group == group)
            if namespace is None or req.namespace == namespace
            if name is None or req.name == name
            if subresource is None or req.subresource == subresource
        ]

    def stop_watches(self) -> None:
        """End all watch-streams now (call before stopping the server: aiohttp waits for them)."""
        self._stopping = True
        self._wakeup.set()


def write_kubeconfig(path: str | os.PathLike[str], url: str, namespace: str = "default") -> None:
    """Write a kubeconfig for kubectl/kubernetes/kopf atomically (readers never see a half)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": str(url).rstrip("/")}}],
        "users": [{"name": "emulator", "user": {"token": "emulator-token"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
    }
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.replace(path)


async def serve(
    port: int, kubeconfig: str, crds: str | None = None, host: str = "127.0.0.1"
) -> None:
    """Run the emulator until SIGTERM/SIGINT; write the kubeconfig & print READY when serving."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with KubeEmulator() as emulator, kmock.Server(emulator, host=host, port=port) as server:
        if crds:
            emulator.load_crds(crds)
        url = str(server.url).rstrip("/")
        write_kubeconfig(kubeconfig, url)
        print(f"READY {url}", flush=True)
        await stop.wait()
        emulator.stop_watches()
        await asyncio.sleep(0.1)  # let the watch handlers finish before aiohttp's shutdown
    print("STOPPED", flush=True)


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m support.kube_emulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
    parser.add_argument("--crds", help="a directory (or file) with CRD YAMLs to preload")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(None if argv is None else list(argv))
    logging.basicConfig(level=args.log_level, stream=sys.stderr)
    asyncio.run(serve(args.port, args.kubeconfig, args.crds, args.host))


if __name__ == "__main__":
    main()
