"""Reading specs from preset names, YAML and JSON files, with one-line errors that name the
field (and the file) at fault."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from shardmeter.errors import SpecError, spec_error_from_validation
from shardmeter.spec.hardware import (
    GPU_LOOKUP,
    LINK_PRESETS,
    NETWORK_PRESETS,
    GPUSpec,
    LinkSpec,
    NetworkSpec,
)
from shardmeter.spec.model import MODEL_PRESETS, TransformerSpec
from shardmeter.spec.presets import lookup

M = TypeVar("M", bound=BaseModel)

MAX_FILE_BYTES = 16 * 2**20
"""Largest spec file read (16 MiB; a plan file is a few KiB)."""
MAX_NESTING = 32
"""Deepest nesting of mappings and lists a spec file may have (a plan file needs 6)."""
MAX_VALUES = 100_000
"""Most values (scalars, mappings and lists) a spec file may hold once YAML aliases are
expanded (a plan file has a few hundred; this stops "billion laughs" alias bombs)."""


def read_text(path: str | Path) -> str:
    """A spec file's text: UTF-8, at most `MAX_FILE_BYTES`; `SpecError` naming the file
    otherwise."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SpecError("", f"cannot read file ({exc.strerror or exc})", str(path)) from exc
    if len(data) > MAX_FILE_BYTES:
        raise SpecError("", f"larger than {MAX_FILE_BYTES // 2**20} MiB", str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SpecError(
            "",
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} on line {line}; save it as UTF-8",
            str(path),
        ) from exc


def check_shape(doc: Any, source: str, field: str = "") -> None:
    """`SpecError` when parsed data nests deeper than `MAX_NESTING` or holds more than
    `MAX_VALUES` values (iterative: a recursive YAML alias cannot overflow the stack)."""
    seen = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise SpecError(field, f"holds more than {MAX_VALUES:,} values", source)
        if isinstance(node, dict | list):
            if depth > MAX_NESTING:
                raise SpecError(field, f"nested deeper than {MAX_NESTING} levels", source)
            children = node.values() if isinstance(node, dict) else node
            stack.extend((c, depth + 1) for c in children)


def parse_text(text: str, source: str, json_only: bool = False, all_documents: bool = False) -> Any:
    """Parse YAML (or JSON) text into Python data; errors name ``source`` and the line.
    ``all_documents`` returns the list of a multi-document YAML stream's documents."""
    try:
        if json_only:
            docs = [json.loads(text)]
        elif all_documents:
            docs = list(yaml.safe_load_all(text))
        else:
            docs = [yaml.safe_load(text)]
    except json.JSONDecodeError as exc:
        raise SpecError("", f"invalid JSON: {exc.msg} at line {exc.lineno}", source) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError("", f"invalid YAML: {problem}{where}", source) from exc
    except RecursionError as exc:
        raise SpecError("", f"nested deeper than {MAX_NESTING} levels", source) from exc
    for doc in docs:
        check_shape(doc, source)
    return docs if all_documents else docs[0]


def read_document(path: str | Path) -> Any:
    """Parse a YAML or JSON file (JSON is YAML, but JSON errors read better)."""
    text = read_text(path)
    return parse_text(text, str(path), json_only=Path(path).suffix.lower() == ".json")


def validate(model: type[M], data: Any, where: str = "", source: str = "") -> M:
    """``model.model_validate(data)`` with the error condensed to one line: the field under
    the prefix ``where``, in the file ``source``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, where, source, model) from exc
    except RecursionError as exc:  # a self-referencing YAML anchor
        raise SpecError(where, "nested too deeply (a recursive YAML alias?)", source) from exc


def _looks_like_file(value: str) -> bool:
    return value.endswith((".yaml", ".yml", ".json")) or "/" in value


def _preset_or_file(value: str, presets: dict[str, M], model: type[M], what: str, flag: str) -> M:
    if _looks_like_file(value):
        return validate(model, read_document(value), source=value)
    try:
        return lookup(presets, value, what)
    except ValueError as exc:
        raise SpecError(flag, str(exc)) from exc


def model_from_arg(value: str, flag: str = "--model") -> TransformerSpec:
    """A model preset name or a YAML/JSON file holding a TransformerSpec."""
    return _preset_or_file(value, MODEL_PRESETS, TransformerSpec, "model", flag)


def gpu_from_arg(value: str, flag: str = "--gpu") -> GPUSpec:
    return _preset_or_file(value, GPU_LOOKUP, GPUSpec, "GPU", flag)


def link_from_arg(value: str, flag: str = "--link") -> LinkSpec:
    return _preset_or_file(value, LINK_PRESETS, LinkSpec, "link", flag)


def network_from_arg(value: str, flag: str = "--network") -> NetworkSpec:
    """A node-network preset, a YAML/JSON file, or an inline JSON object."""
    text = value.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(flag, f"invalid inline JSON: {exc.msg}") from exc
        except RecursionError as exc:
            raise SpecError(flag, f"nested deeper than {MAX_NESTING} levels") from exc
        check_shape(data, "", flag)
        return validate(NetworkSpec, data, flag)
    return _preset_or_file(value, NETWORK_PRESETS, NetworkSpec, "network", flag)
