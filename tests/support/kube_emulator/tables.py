"""``meta.k8s.io/v1`` Tables for ``kubectl get``: printer columns, their JSONPaths, ages."""

import datetime
import re
from collections.abc import Mapping
from typing import Any

from support.kube_emulator.resources import Body
from support.kube_emulator.selectors import lookup

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


def table(objs: list[Body], columns: list[Body], include: str, resource_version: int) -> Body:
    """A ``meta.k8s.io/v1`` Table as requested by ``kubectl get`` (NAME + printer columns).

    ``columns``: the CRD's ``additionalPrinterColumns`` (Age if none); ``include``: the
    ``?includeObject=`` (``None``, ``Metadata``, ``Object``).
    """
    columns = columns or [
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
        "metadata": {"resourceVersion": str(resource_version)},
        "columnDefinitions": definitions,
        "rows": rows,
    }
