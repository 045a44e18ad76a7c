"""Custom resources as kube-apiserver treats them: the structural-schema rules a CRD must obey,
pruning of unknown fields, defaulting, OpenAPI v3 validation and CEL rules
(``x-kubernetes-validations``, evaluated with cel-python).

Kubernetes' OpenAPI v3.0 dialect is turned into JSON Schema 2020-12 for ``jsonschema``
(``nullable``, boolean ``exclusiveMinimum``, ``x-kubernetes-int-or-string``); the rules below
follow "Specifying a structural schema" of the CRD documentation. Not emulated: CEL cost
estimation, ``oldSelf`` transition rules on create (skipped, as the API server does), formats.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any

import celpy
import jsonschema

Body = dict[str, Any]
JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
_FORBIDDEN_IN_JUNCTORS = ("description", "type", "default", "additionalProperties", "nullable")


# ---- the structural-schema rules (checked when a CRD is written) ------------------------------
def structural_problems(schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Why ``schema`` (an ``openAPIV3Schema``) is not structural; empty when it is."""
    problems: list[str] = []
    _check(schema, path or "openAPIV3Schema", problems, root=True)
    meta = (schema.get("properties") or {}).get("metadata")
    if isinstance(meta, Mapping):
        extra = set(meta.get("properties") or {}) - {"name", "generateName"}
        if extra or set(meta) - {"type", "properties", "description"}:
            problems.append("metadata: only restrictions on name and generateName are allowed")
    return problems


def _undefined_fields(node: Mapping[str, Any], rule: str) -> list[str]:
    """The fields ``self.<field>`` of a rule that CEL cannot see: kube-apiserver declares CEL
    types only for typed properties (and int-or-string ones), so a schemaless property — or one
    the schema lacks — fails the rule's compilation as an "undefined field"."""
    properties = node.get("properties")
    if not isinstance(properties, Mapping):
        return []
    out = []
    for field in dict.fromkeys(re.findall(r"\bself\.([A-Za-z_][A-Za-z0-9_]*)", rule)):
        prop = properties.get(field)
        if not isinstance(prop, Mapping) or not (
            prop.get("type") or prop.get("x-kubernetes-int-or-string")
        ):
            out.append(field)
    return out


def _check(node: Any, where: str, problems: list[str], *, root: bool = False) -> None:
    if not isinstance(node, Mapping):
        problems.append(f"{where}: must be a schema object")
        return
    typed = bool(node.get("type"))
    exempt = node.get("x-kubernetes-int-or-string") or node.get(
        "x-kubernetes-preserve-unknown-fields"
    )
    if not typed and not exempt:
        problems.append(f"{where}.type: Required value: must not be empty for specified fields")
    if node.get("x-kubernetes-int-or-string") and typed:
        problems.append(f"{where}.type: Forbidden: must be empty with x-kubernetes-int-or-string")
    if node.get("uniqueItems") is True:
        problems.append(f"{where}.uniqueItems: Forbidden: uniqueItems cannot be set to true")
    if node.get("additionalProperties") is False:
        problems.append(f"{where}.additionalProperties: Forbidden: must not be false")
    if node.get("x-kubernetes-preserve-unknown-fields") is False:  # what kube-apiserver says
        problems.append(
            f"{where}.x-kubernetes-preserve-unknown-fields: Invalid value: false: "
            "must be true or undefined"
        )
    if "additionalProperties" in node and "properties" in node:
        problems.append(f"{where}.additionalProperties: Forbidden: properties is set")
    if root and node.get("type") != "object":
        problems.append(f"{where}.type: Unsupported value: the root must be an object")
    for junctor in JUNCTORS:
        for i, sub in enumerate(_as_list(node.get(junctor))):
            bad = [k for k in _FORBIDDEN_IN_JUNCTORS if k in sub]
            if bad and not _int_or_string_pattern(node, junctor):
                problems.append(f"{where}.{junctor}[{i}]: Forbidden: {', '.join(bad)}")
    for key, sub in (node.get("properties") or {}).items():
        _check(sub, f"{where}.properties[{key}]", problems)
    if isinstance(node.get("additionalProperties"), Mapping):
        _check(node["additionalProperties"], f"{where}.additionalProperties", problems)
    if "items" in node:
        _check(node["items"], f"{where}.items", problems)
    for i, rule in enumerate(node.get("x-kubernetes-validations") or []):
        try:
            _program(rule["rule"])
        except Exception as exc:  # a CEL syntax error
            problems.append(f"{where}.x-kubernetes-validations[{i}].rule: Invalid value: {exc}")
        for field in _undefined_fields(node, rule["rule"]):
            problems.append(
                f"{where}.x-kubernetes-validations[{i}].rule: Invalid value: compilation "
                f"failed: undefined field '{field}'"
            )
    if "default" in node and node.get("type") and not node.get("nullable"):
        try:
            jsonschema.validate(node["default"], to_jsonschema(node))
        except jsonschema.ValidationError as exc:
            problems.append(f"{where}.default: Invalid value: {exc.message}")


def _as_list(value: Any) -> list[Mapping[str, Any]]:
    if isinstance(value, Mapping):
        return [value]
    return [v for v in value or [] if isinstance(v, Mapping)]


def _int_or_string_pattern(node: Mapping[str, Any], junctor: str) -> bool:
    return bool(node.get("x-kubernetes-int-or-string")) and junctor in ("anyOf", "allOf")


# ---- OpenAPI v3.0 (Kubernetes) → JSON Schema 2020-12 ---------------------------------------
def to_jsonschema(node: Any) -> Any:
    """The same constraints for the ``jsonschema`` library (unknown fields are pruned, not
    rejected, so objects stay open unless ``closed`` is asked for by the caller)."""
    if isinstance(node, list):
        return [to_jsonschema(v) for v in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes") or key in ("nullable", "description", "default"):
            continue
        if key in ("properties",):
            out[key] = {k: to_jsonschema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = to_jsonschema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_jsonschema(v) for v in value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            continue
        else:
            out[key] = value
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if node.get(exclusive) is True and bound in node:
            out[exclusive] = out.pop(bound)
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


# ---- what the API server does to a custom resource on every write -----------------------------
def prune(value: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Drop the fields ``schema`` does not specify, in place; return their paths. Like the API
    server: ``x-kubernetes-preserve-unknown-fields`` keeps them, ``metadata`` is left alone,
    and a ``null`` in a field that is not ``nullable`` is dropped (its default then applies)."""
    dropped: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep_all = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
        for key in list(value):
            where = f"{path}.{key}" if path else key
            if props is not None and key in props:
                sub = props[key]
            elif isinstance(extra, Mapping):
                sub = extra
            elif keep_all or (not path and key in ("apiVersion", "kind", "metadata")):
                continue
            else:
                del value[key]
                dropped.append(where)
                continue
            if value[key] is None and not sub.get("nullable"):
                del value[key]
            elif not (not path and key == "metadata"):
                dropped += prune(value[key], sub, where)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            dropped += prune(item, schema["items"], f"{path}[{i}]")
    return dropped


def apply_defaults(value: Any, schema: Mapping[str, Any]) -> None:
    """Set the ``default`` values of an OpenAPI v3 schema (as CRDs do), in place."""
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value and key != "metadata":
                apply_defaults(value[key], sub)
        if isinstance(schema.get("additionalProperties"), Mapping):
            for item in value.values():
                apply_defaults(item, schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            apply_defaults(item, schema["items"])


def schema_errors(obj: Body, schema: Mapping[str, Any]) -> list[str]:
    """OpenAPI errors then CEL errors, as ``path: message`` lines like the API server's."""
    validator = _validator_for(schema)
    errors = [
        f"{_path(e.absolute_path)}: Invalid value: {_show(e.instance)}: {e.message}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if errors:
        return errors  # the API server evaluates CEL only on schema-valid objects
    return [f"{where}: Invalid value: {message}" for where, message in cel_errors(obj, schema)]


def cel_errors(
    value: Any, schema: Mapping[str, Any], path: str = "", old: Any = None
) -> Iterator[tuple[str, str]]:
    """(path, message) for every ``x-kubernetes-validations`` rule that fails."""
    for rule in schema.get("x-kubernetes-validations") or []:
        text = rule["rule"]
        if "oldSelf" in text and old is None:
            continue  # a transition rule: only on updates
        activation = {"self": celpy.json_to_cel(value)}
        if old is not None:
            activation["oldSelf"] = celpy.json_to_cel(old)
        try:
            ok = bool(_program(text).evaluate(activation))
            message = rule.get("message") or f"failed rule: {text}"
        except celpy.CELEvalError as exc:
            ok, message = False, f"rule evaluation error: {exc.args[0] if exc.args else exc}"
        if not ok:
            yield (path or "<root>", f"{_show(value)}: {message}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value and key != "metadata":
                old_sub = old.get(key) if isinstance(old, dict) else None
                where = f"{path}.{key}" if path else key
                yield from cel_errors(value[key], sub, where, old_sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            yield from cel_errors(item, schema["items"], f"{path}[{i}]")


@functools.cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


_VALIDATORS: dict[int, tuple[Mapping[str, Any], jsonschema.Draft202012Validator]] = {}


def _validator_for(schema: Mapping[str, Any]) -> jsonschema.Draft202012Validator:
    """One compiled validator per schema object (the emulator keeps each CRD's schema)."""
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = _VALIDATORS[id(schema)] = (
            schema,
            jsonschema.Draft202012Validator(to_jsonschema(schema)),
        )
    return cached[1]


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<root>"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
