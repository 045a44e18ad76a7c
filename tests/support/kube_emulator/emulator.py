"""The emulator: :class:`KubeEmulator`'s state, the object API in Python, the single write path.

The HTTP handling, discovery, watches, CRDs and the conveniences for tests are its mixins."""

import asyncio
import contextlib
import copy
import random
import re
import string
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import kmock

from support.kube_emulator import builtins, structural
from support.kube_emulator.conveniences import Conveniences
from support.kube_emulator.crds import CRDRegistry
from support.kube_emulator.discovery import Discovery
from support.kube_emulator.errors import api_error, not_found, object_error
from support.kube_emulator.handlers import HttpHandlers
from support.kube_emulator.openapi import OpenAPI
from support.kube_emulator.patches import apply_patch, merge_patch
from support.kube_emulator.podlogs import PodLogs
from support.kube_emulator.resources import (
    CRD,
    DEFAULT_NAMESPACES,
    NAMESPACES,
    SKIPPED_GROUPS,
    Body,
    ObjectKey,
    bundled_resources,
    now_iso,
    version_priority,
)
from support.kube_emulator.selectors import object_matcher
from support.kube_emulator.watches import Watches, WatchEvent

Webhook = Callable[[str, kmock.resource, Body, Body | None], None]
ExternalAdmission = Callable[[kmock.resource, str | None, Body, bool], Awaitable[Body]]
SYSTEM_FIELDS = (
    "uid",
    "creationTimestamp",
    "generation",
    "resourceVersion",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)  # metadata fields managed by the server only


@attrs.define(kw_only=True)
class KubeEmulator(
    HttpHandlers,
    Discovery,
    OpenAPI,
    Watches,
    CRDRegistry,
    Conveniences,
    PodLogs,
    kmock.KubernetesEmulator,
):
    """kmock's Kubernetes emulator with real API-server semantics; see the package docstring."""

    watch_timeout: float = 1800.0  # for watches without ?timeoutSeconds=
    _rv: int = attrs.field(default=0, init=False)
    _events: list[WatchEvent] = attrs.field(factory=list, init=False)
    _wakeup: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _stopping: bool = attrs.field(default=False, init=False)
    _storage_versions: dict[tuple[str, str], str] = attrs.field(factory=dict, init=False)
    _printer_columns: dict[kmock.resource, list[Body]] = attrs.field(factory=dict, init=False)
    _schemas: dict[kmock.resource, Body] = attrs.field(factory=dict, init=False)
    _custom: set[tuple[str, str]] = attrs.field(factory=set, init=False)  # (group, plural) of CRs
    warnings: list[str] = attrs.field(factory=list, init=False)  # unknown fields pruned
    # Admission webhooks of simulated controllers (JobSet, Kueue): called with
    # (operation "CREATE" | "UPDATE", resource, the object, the old object or None) on writes
    # of the main resource (not /status). Mutating ones may change the object before schema
    # validation; validating ones run after it; either raises api_error() to refuse.
    mutating_webhooks: list[Webhook] = attrs.field(factory=list, init=False)
    validating_webhooks: list[Webhook] = attrs.field(factory=list, init=False)
    # Dynamic admission over HTTP (support/admission.py): awaited with (resource, namespace,
    # the body, dry_run) before a create over HTTP; returns the body to create, or raises.
    external_admission: list[ExternalAdmission] = attrs.field(factory=list, init=False)
    failures: list[BaseException] = attrs.field(factory=list, init=False)  # emulator bugs (500s)
    _pod_logs: dict[tuple[str, str, str], str] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[re.compile(r"/openapi/.*")] << api_error(  # /openapi/v2 (v3: openapi.py)
            404, "NotFound", "OpenAPI is not emulated"
        )
        builtins = kmock.ResourcesArray()
        builtins.load_data(bundled_resources())  # NB: load_bundled() warns on Python 3.11
        for resource in sorted(builtins, key=lambda r: version_priority(r.version or "")):
            if resource.group not in SKIPPED_GROUPS:
                self._resources[resource] = builtins[resource]
                self._storage_versions.setdefault(
                    (resource.group, resource.plural), resource.version
                )
        for name in DEFAULT_NAMESPACES:
            self.create(NAMESPACES, None, {"metadata": {"name": name}})

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
        matches = object_matcher(namespace, label_selector, field_selector)
        return [
            {**copy.deepcopy(obj.raw), "apiVersion": self._api_version(resource)}
            for (res, _, _), obj in self._objects.items()
            if res == storage and not obj.deleted and matches(obj.raw)
        ]

    def read(self, resource: str | kmock.resource, namespace: str | None, name: str) -> Body:
        resource = self.resolve(resource)
        obj = self._live(self._key(resource, namespace, name))
        if obj is None:
            raise not_found(resource, name)
        return {**obj, "apiVersion": self._api_version(resource)}

    def create(
        self,
        resource: str | kmock.resource,
        namespace: str | None,
        body: Body,
        *,
        dry_run: bool = False,
        field_validation: str | None = None,
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
            raise object_error(409, "AlreadyExists", message, resource, meta["name"])
        for field in SYSTEM_FIELDS:
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
        obj = {"apiVersion": None, "kind": None, **obj}  # just to have these keys first
        obj.update(apiVersion=self._api_version(resource), kind=info.kind)
        if "status" in info.subresources:
            obj.pop("status", None)  # as in Kubernetes: the status cannot be set on creation
        for hook in self.mutating_webhooks:
            hook("CREATE", resource, obj, None)
        self._admit(resource, obj, field_validation)
        for hook in self.validating_webhooks:
            hook("CREATE", resource, obj, None)
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
        field_validation: str | None = None,
    ) -> Body:
        """PUT: replace the object (or only its status with ``subresource='status'``)."""
        resource = self.resolve(resource)
        info = self._resources[resource]
        key = self._key(resource, namespace, name)
        old = self._live(key)
        if old is None:
            raise not_found(resource, name)
        new = copy.deepcopy(dict(body))
        new_meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        if new_meta.get("resourceVersion") not in {None, "", old_meta["resourceVersion"]}:
            message = (
                "Operation cannot be fulfilled on {what}: the object has been modified; "
                "please apply your changes to the latest version and try again"
            )
            raise object_error(409, "Conflict", message, resource, name)
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
        webhooks = subresource != "status"
        for hook in self.mutating_webhooks if webhooks else []:
            hook("UPDATE", resource, new, old)
        self._admit(resource, new, field_validation)
        for hook in self.validating_webhooks if webhooks else []:
            hook("UPDATE", resource, new, old)
        ignored = {"metadata", "status"} if "status" in info.subresources else {"metadata"}
        if {k: v for k, v in new.items() if k not in ignored} != {
            k: v for k, v in old.items() if k not in ignored
        }:
            new["metadata"]["generation"] = old_meta.get("generation", 0) + 1
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
        field_validation: str | None = None,
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
                return 201, self.create(
                    resource, namespace, body, dry_run=dry_run, field_validation=field_validation
                )
            content_type = "application/merge-patch+json"
        if old is None:
            raise not_found(resource, name)
        custom = (resource.group, resource.plural) in self._custom
        new = apply_patch(old, patch, content_type, custom=custom)
        return 200, self.replace(
            resource,
            namespace,
            name,
            new,
            subresource=subresource,
            dry_run=dry_run,
            field_validation=field_validation,
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
            raise not_found(resource, name)
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

    def _admit(
        self, resource: kmock.resource, obj: Body, field_validation: str | None = None
    ) -> None:
        """What kube-apiserver does to every write before storing it: custom resources are
        pruned of unknown fields (an error with ``fieldValidation=Strict``, else a warning kept
        in ``self.warnings``), defaulted, and validated against their CRD's schema and CEL
        rules; built-in objects against Kubernetes' own schema of their kind (strict: an
        unknown field is an error unless ``fieldValidation=Ignore`` — stricter than the real
        default, which drops it silently); names, labels and annotations of both by the
        kind's rules (:mod:`support.kube_emulator.builtins`). Raises 400/422."""
        schema = self._schemas.get(resource)
        if schema is not None:
            dropped = structural.prune(obj, schema)
            if dropped and field_validation == "Strict":
                fields = ", ".join(f'unknown field "{d}"' for d in dropped)
                raise api_error(400, "BadRequest", f"strict decoding error: {fields}")
            self.warnings += [
                f"{obj.get('kind')} {obj['metadata'].get('name')}: unknown field {d!r} pruned"
                for d in dropped
            ]
        self._default(resource, obj)
        if schema is not None:
            errors = builtins.metadata_errors(obj) + structural.schema_errors(obj, schema)
        else:
            errors = builtins.metadata_errors(obj)
            if field_validation != "Ignore":
                unknown = [e for e in builtins.schema_errors(obj) if "Additional properties" in e]
                if unknown:
                    raise api_error(
                        400, "BadRequest", "strict decoding error: " + "; ".join(unknown)
                    )
            errors += builtins.schema_errors(obj, strict=False)
            mistyped = [e for e in errors if "is not of type" in e]
            if mistyped:  # kube-apiserver cannot decode it into its Go types: 400, not 422
                kind, version = obj.get("kind"), str(obj.get("apiVersion")).rpartition("/")[2]
                raise api_error(
                    400,
                    "BadRequest",
                    f'{kind} in version "{version}" cannot be handled as a {kind}: '
                    + "; ".join(mistyped),
                )
        if errors:
            what = f"{obj.get('kind')}.{resource.group}" if resource.group else str(obj.get("kind"))
            shown = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
            raise api_error(
                422, "Invalid", f'{what} "{obj["metadata"].get("name")}" is invalid: {shown}'
            )

    def _default(self, resource: kmock.resource, obj: Body) -> None:
        """Defaults from CRD schemas, fields that a real cluster would set (namespaces, CRDs)."""
        meta = obj["metadata"]
        if resource in self._schemas:
            structural.apply_defaults(obj, self._schemas[resource])
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
