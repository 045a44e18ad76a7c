"""Label & field selectors (``?labelSelector=``, ``?fieldSelector=``) as object matchers."""

import re
from collections.abc import Callable, Mapping
from typing import Any

from support.kube_emulator.errors import api_error
from support.kube_emulator.resources import Body


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


def object_matcher(
    namespace: str | None, label_selector: str | None, field_selector: str | None
) -> Callable[[Body], bool]:
    """Whether an object is in the namespace (any if None) and matches both selectors."""
    labels_ok = label_selector_matcher(label_selector or "")
    fields_ok = field_selector_matcher(field_selector or "")
    return lambda obj: (
        (namespace is None or obj["metadata"].get("namespace") == namespace)
        and labels_ok(obj["metadata"].get("labels") or {})
        and fields_ok(obj)
    )
