"""What kube-apiserver checks on every object, built-in or custom, that this project writes:
the object against Kubernetes' own schema (the JSON schemas that PyPI's ``kubernetes-validate``
ships, strict: unknown fields are errors), metadata (names, labels, the annotation size
limit) and the kind-specific name rules from ``pkg/apis/*/validation`` that matter here.

Kubernetes sources the rules follow (apimachinery ``validation.go``, ``ValidateObjectMeta``,
``batch/validation.ValidateJob``, ``core/validation.ValidateService``):

* most names are DNS-1123 subdomains (≤ 253, ``[a-z0-9]([-a-z0-9.]*[a-z0-9])?``); Namespaces
  are DNS-1123 labels (≤ 63); Services are DNS-1035 labels (must start with a letter);
  RBAC names are path segments;
* a Job's name goes into its pods' ``batch.kubernetes.io/job-name`` label (≤ 63); for an
  Indexed Job ``<name>-<completions-1>`` must be a DNS-1123 label (the pods' hostname);
  the pod template's ``subdomain`` must be a DNS-1123 label;
* label keys are ``[prefix/]name`` (prefix a DNS subdomain, name ≤ 63), values ≤ 63;
  annotations together ≤ 256 KiB (``TotalAnnotationSizeLimitB``);
* request bodies ≤ 3 MiB (``MaxRequestBodyBytes``).
"""

from __future__ import annotations

import functools
import importlib.resources as importlib_resources
import json
import re
from collections.abc import Mapping
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema

Body = dict[str, Any]
MAX_REQUEST_BODY_BYTES = 3 * 1024 * 1024
MAX_ANNOTATIONS_BYTES = 256 * 1024
KUBE_VERSION = "1.32"  # what /version reports; the schemas of this minor validate

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(rf"^{_LABEL}$")
DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def dns1123_label(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not DNS1123_LABEL.match(value):
        errors.append(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
            "'-', and must start and end with an alphanumeric character"
        )
    return errors


def dns1123_subdomain(value: str) -> list[str]:
    errors = []
    if len(value) > 253:
        errors.append("must be no more than 253 characters")
    if not DNS1123_SUBDOMAIN.match(value):
        errors.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
            "'-' or '.', and must start and end with an alphanumeric character"
        )
    return errors


def dns1035_label(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not DNS1035_LABEL.match(value):
        errors.append(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start "
            "with an alphabetic character, and end with an alphanumeric character"
        )
    return errors


def path_segment(value: str) -> list[str]:
    if value in (".", "..") or "/" in value or "%" in value:
        return ["may not be '.' or '..' and may not contain '/' or '%'"]
    return []


def label_value(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not LABEL_VALUE.match(value):
        errors.append(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', "
            "'_' or '.', and must start and end with an alphanumeric character"
        )
    return errors


def qualified_name(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    errors = []
    if prefix:
        errors += [f"prefix part {e}" for e in dns1123_subdomain(prefix)]
    if not name or len(name) > 63 or not QUALIFIED_NAME.match(name):
        errors.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', start and end "
            "with an alphanumeric character, and be at most 63 characters"
        )
    return errors


NAME_RULES = {  # kind → name rule (anything else: DNS-1123 subdomain)
    "Namespace": dns1123_label,
    "Service": dns1035_label,
    "Role": path_segment,
    "RoleBinding": path_segment,
    "ClusterRole": path_segment,
    "ClusterRoleBinding": path_segment,
}


def metadata_errors(obj: Mapping[str, Any]) -> list[str]:
    """``ValidateObjectMeta``: the name rule of the kind, labels, annotation size."""
    meta = obj.get("metadata") or {}
    kind = str(obj.get("kind") or "")
    errors = []
    name = str(meta.get("name") or "")
    rule = NAME_RULES.get(kind, dns1123_subdomain)
    errors += [f"metadata.name: Invalid value: {name!r}: {e}" for e in rule(name)]
    errors += _label_errors(meta.get("labels"), "metadata.labels")
    annotations = meta.get("annotations") or {}
    size = sum(len(k) + len(str(v)) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        errors.append(
            f"metadata.annotations: Too long: may not be more than {MAX_ANNOTATIONS_BYTES} bytes"
        )
    errors += [
        f"metadata.annotations: Invalid value: {k!r}: {e}"
        for k in annotations
        for e in qualified_name(k)
    ]
    return errors + _kind_errors(kind, obj)


def _label_errors(labels: Any, where: str) -> list[str]:
    errors = []
    for key, value in (labels or {}).items():
        errors += [f"{where}: Invalid value: {key!r}: {e}" for e in qualified_name(key)]
        errors += [f"{where}: Invalid value: {value!r}: {e}" for e in label_value(str(value))]
    return errors


def _event_errors(obj: Mapping[str, Any]) -> list[str]:
    """core/v1 ``ValidateEventCreate``: an Event lives in its involved object's namespace, or
    in ``default`` when that object is cluster-scoped."""
    namespace = (obj.get("metadata") or {}).get("namespace") or ""
    involved = (obj.get("involvedObject") or {}).get("namespace") or ""
    if (not involved and namespace not in ("", "default")) or (involved and namespace != involved):
        return [
            f"involvedObject.namespace: Invalid value: {involved!r}: does not match event.namespace"
        ]
    return []


def _kind_errors(kind: str, obj: Mapping[str, Any]) -> list[str]:
    if kind == "Event" and obj.get("apiVersion") == "v1":
        return _event_errors(obj)
    if kind != "Job" or obj.get("apiVersion") != "batch/v1":
        return []
    name = str((obj.get("metadata") or {}).get("name") or "")
    spec = obj.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    errors = [
        f"spec.template.labels: Invalid value: {name!r}: {e} (the job-name label)"
        for e in label_value(name)
    ]
    errors += _label_errors(
        ((spec.get("template") or {}).get("metadata") or {}).get("labels"),
        "spec.template.metadata.labels",
    )
    completions = spec.get("completions")
    if spec.get("completionMode") == "Indexed" and isinstance(completions, int) and completions > 0:
        hostname = f"{name}-{completions - 1}"
        if dns1123_label(hostname):
            errors.append(
                f"metadata.name: Invalid value: {name!r}: will not able to create pod with "
                f"invalid DNS label: {hostname}"
            )
    if pod.get("subdomain"):
        errors += [
            f"spec.template.spec.subdomain: Invalid value: {pod['subdomain']!r}: {e}"
            for e in dns1123_label(str(pod["subdomain"]))
        ]
    return errors


# ---- the Kubernetes JSON schemas (kubernetes-validate) ------------------------------------------
def _schema_dir(version: str, strict: bool) -> Any:
    from kubernetes_validate import utils

    versions = [v for v in utils.all_versions() if utils.major_minor(v) == version]
    if not versions:
        raise LookupError(f"kubernetes-validate has no schemas for Kubernetes {version}")
    folder = f"v{versions[-1]}-local" + ("-strict" if strict else "")
    return importlib_resources.files("kubernetes_validate") / "kubernetes-json-schema" / folder


@functools.cache
def _registry(version: str, strict: bool) -> referencing.Registry[Any]:
    folder = _schema_dir(version, strict)
    definitions = json.loads((folder / "_definitions.json").read_text())
    resource = referencing.Resource.from_contents(
        definitions, default_specification=referencing.jsonschema.DRAFT202012
    )
    return resource @ referencing.Registry()  # type: ignore[no-any-return]


@functools.cache
def _validator(
    api_version: str, kind: str, version: str, strict: bool
) -> jsonschema.Draft202012Validator | None:
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = _schema_dir(version, strict) / f"{kind.lower()}-{group_version}.json"
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    return jsonschema.Draft202012Validator(schema, registry=_registry(version, strict))


def has_schema(api_version: str, kind: str, version: str = KUBE_VERSION) -> bool:
    return _validator(api_version, kind, version, True) is not None


def schema_errors(
    obj: Mapping[str, Any], version: str = KUBE_VERSION, strict: bool = True
) -> list[str]:
    """Errors of ``obj`` against Kubernetes ``version``'s schema of its kind (``strict``: unknown
    fields are errors too, as with ``kubectl --validate=strict``). Unknown kinds: no errors."""
    validator = _validator(str(obj.get("apiVersion")), str(obj.get("kind")), version, strict)
    if validator is None:
        return []
    out = []
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        where = ".".join(str(p) for p in error.absolute_path) or "<root>"
        out.append(f"{where}: {error.message}")
    return out


def validate(obj: Mapping[str, Any], version: str = KUBE_VERSION) -> list[str]:
    """Everything above: schema (strict) and metadata/kind rules."""
    return schema_errors(obj, version) + metadata_errors(obj)


@functools.cache
def _definition_validator(name: str, version: str, strict: bool) -> jsonschema.Draft202012Validator:
    schema = {"$ref": f"https://kubernetes.io/api/_definitions.json#/$defs/{name}"}
    return jsonschema.Draft202012Validator(schema, registry=_registry(version, strict))


def definition_errors(
    value: Any, name: str, where: str, version: str = KUBE_VERSION, strict: bool = True
) -> list[str]:
    """Errors of ``value`` against one of Kubernetes' type definitions (e.g.
    ``io.k8s.api.batch.v1.JobTemplateSpec``, embedded in a custom resource), paths prefixed
    with ``where``."""
    validator = _definition_validator(name, version, strict)
    out = []
    for error in sorted(
        validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path))
    ):
        path = ".".join([where, *(str(p) for p in error.absolute_path)])
        out.append(f"{path}: {error.message}")
    return out
