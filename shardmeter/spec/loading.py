"""Reading specs from preset names, YAML and JSON files, with one-line errors that name the
field (and the file) at fault."""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from shardmeter.errors import SpecError, spec_error_from_validation
from shardmeter.spec.gpu_names import explain_unknown_gpu
from shardmeter.spec.hardware import (
    GPU_LOOKUP,
    LINK_PRESETS,
    NETWORK_PRESETS,
    GPUSpec,
    LinkSpec,
    NetworkSpec,
)
from shardmeter.spec.model import MODEL_PRESETS, TransformerSpec
from shardmeter.spec.presets import Explain, lookup, resolve

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


# ---- duplicated keys ------------------------------------------------------------------------
# PyYAML and the json module keep the last of two equal keys without a word, so a plan file
# that says ``syncEvery`` twice would be planned with whichever came last. Both parsers below
# refuse it instead, naming the key, where it is and both lines.


def _key_path(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _duplicate(path: str, key: Any, first_line: int, second_line: int) -> SpecError:
    where = (
        f"twice on line {first_line}"
        if first_line == second_line
        else f"on lines {first_line} and {second_line}"
    )
    return SpecError(_key_path(path, key), f"duplicated key {str(key)!r} {where}; keep one")


_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a mapping with a duplicated key (merge keys ``<<``
    may still be overridden, as YAML intends)."""

    def construct_document(self, node: yaml.Node) -> Any:
        self._check_keys(node)
        return super().construct_document(node)

    def _check_keys(self, root: yaml.Node) -> None:
        """Walk the node graph once per node (an alias is a shared node, so alias bombs and
        recursive aliases cost nothing) and compare each mapping's keys as constructed."""
        seen: set[int] = set()
        stack: list[tuple[yaml.Node, str]] = [(root, "")]
        while stack:
            node, path = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            children: list[tuple[yaml.Node, str]] = []
            if isinstance(node, yaml.SequenceNode):
                children = [(n, f"{path}[{i}]") for i, n in enumerate(node.value)]
            elif isinstance(node, yaml.MappingNode):
                lines: dict[Any, int] = {}
                for key_node, value_node in node.value:
                    if key_node.tag == _MERGE_TAG:
                        children.append((value_node, path))
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        first = lines.get(key)
                    except TypeError:  # an unhashable key: the constructor refuses it later
                        continue
                    if first is not None:
                        raise _duplicate(path, key, first, line)
                    lines[key] = line
                    children.append((value_node, _key_path(path, key)))
            stack.extend(reversed(children))  # popped in document order


class _JSONPairs(list[tuple[str, Any, int]]):
    """One JSON object as parsed: (key, value, offset of the value) in order."""


def _key_line(text: str, value_at: int) -> int:
    """The line of the key whose value starts at ``value_at``: back over the whitespace and
    the colon to the key's closing quote (a JSON string holds no raw line break)."""
    i = value_at - 1
    while i > 0 and text[i] in " \t\r\n":
        i -= 1
    i -= 1  # the colon
    while i > 0 and text[i] in " \t\r\n":
        i -= 1
    return text.count("\n", 0, max(i, 0)) + 1


def _json_object(
    s_and_end: tuple[str, int],
    strict: bool,
    scan_once: Any,
    object_hook: Any,
    object_pairs_hook: Any,
    memo: Any = None,
) -> tuple[Any, int]:
    """The json module's own object parser, told to keep where each value began."""
    starts: list[int] = []

    def scan(text: str, at: int) -> Any:
        starts.append(at)
        return scan_once(text, at)

    pairs, end = json.decoder.JSONObject(  # type: ignore[attr-defined]
        s_and_end, strict, scan, object_hook, lambda p: p, memo
    )
    return _JSONPairs((k, v, at) for (k, v), at in zip(pairs, starts, strict=True)), end


class _StrictDecoder(json.JSONDecoder):
    """The json module's decoder with `_json_object` for objects: its pure-Python scanner
    (the one the module falls back to without its C accelerator) calls ``parse_object``,
    the C scanner does not. Plan, what-if and coefficient files are a few KiB."""

    def __init__(self) -> None:
        super().__init__()
        self.parse_object = _json_object
        self.scan_once = json.scanner.py_make_scanner(self)  # type: ignore[attr-defined]


def _json_value(value: Any, text: str, path: str) -> Any:
    """Parsed JSON with its objects as dicts; `SpecError` at the first duplicated key."""
    if isinstance(value, _JSONPairs):
        out: dict[str, Any] = {}
        lines: dict[str, int] = {}
        for key, item, at in value:
            line = _key_line(text, at)
            if key in lines:
                raise _duplicate(path, key, lines[key], line)
            lines[key] = line
            out[key] = _json_value(item, text, _key_path(path, key))
        return out
    if isinstance(value, list):
        return [_json_value(v, text, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def parse_json(text: str, source: str = "", field: str = "") -> Any:
    """Parse JSON text; `SpecError` (naming ``source``, and ``field`` for text that is a
    field's value) for invalid JSON or a duplicated key."""
    try:
        raw = _StrictDecoder().decode(text)
        data = _json_value(raw, text, "")
    except json.JSONDecodeError as exc:
        raise SpecError(field, f"not valid JSON ({exc.msg} at line {exc.lineno})", source) from exc
    except RecursionError as exc:
        raise SpecError(field, f"nested deeper than {MAX_NESTING} levels", source) from exc
    except SpecError as exc:  # a duplicated key
        raise SpecError(".".join(p for p in (field, exc.field) if p), exc.message, source) from exc
    check_shape(data, source, field)
    return data


def parse_text(text: str, source: str, json_only: bool = False, all_documents: bool = False) -> Any:
    """Parse YAML (or JSON) text into Python data; errors name ``source`` and the line, and a
    duplicated key is an error naming the key and both lines, in YAML and JSON alike.
    ``all_documents`` returns the list of a multi-document YAML stream's documents."""
    if json_only:
        data = parse_json(text, source)
        return [data] if all_documents else data
    try:
        if all_documents:
            docs = list(yaml.load_all(text, Loader=_StrictLoader))
        else:
            docs = [yaml.load(text, Loader=_StrictLoader)]
    except SpecError as exc:  # a duplicated key
        raise SpecError(exc.field, exc.message, source) from exc
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


def _inline(text: str, flag: str) -> Any:
    """An inline JSON or YAML flow mapping given as a flag's value (``{preset: h100, ...}``):
    JSON first (its numbers include ``Infinity``, which the spec then refuses by name), else
    YAML, whose flow style needs no quotes."""
    try:
        data = parse_json(text, field=flag)
    except SpecError as exc:
        if not exc.message.startswith("not valid JSON"):
            raise  # a duplicated key
        data = parse_text(text, flag)
    if not isinstance(data, dict):
        raise SpecError(flag, "an inline spec must be a mapping, e.g. '{preset: NAME, ...}'")
    return data


def _preset_or_file(
    value: str,
    presets: dict[str, M],
    model: type[M],
    what: str,
    flag: str,
    explain: Explain | None = None,
) -> M:
    """A preset name, an inline mapping or a YAML/JSON file; a mapping (inline or in the file)
    may be ``{preset: NAME, <overrides>}`` — the preset with only the named fields changed.
    ``explain`` says what an unknown preset name may be (`shardmeter.spec.presets.lookup`)."""
    text = value.strip()
    if text.startswith("{"):
        return _from_mapping(_inline(text, flag), presets, model, what, flag, "", explain)
    if _looks_like_file(value):
        return _from_mapping(read_document(value), presets, model, what, "", value, explain)
    try:
        return lookup(presets, value, what, explain)
    except ValueError as exc:
        raise SpecError(flag, str(exc)) from exc


def _from_mapping(
    data: Any,
    presets: dict[str, M],
    model: type[M],
    what: str,
    where: str,
    source: str,
    explain: Explain | None = None,
) -> M:
    try:
        data = resolve(data, presets, what, explain)
    except ValueError as exc:
        raise SpecError(f"{where}.preset" if where else "preset", str(exc), source) from exc
    return validate(model, data, where, source)


def model_from_arg(value: str, flag: str = "--model") -> TransformerSpec:
    """A model preset name, an inline ``{preset: NAME, <overrides>}`` mapping, or a YAML/JSON
    file holding a TransformerSpec (or a preset with overrides)."""
    return _preset_or_file(value, MODEL_PRESETS, TransformerSpec, "model", flag)


def gpu_from_arg(value: str, flag: str = "--gpu") -> GPUSpec:
    return _preset_or_file(value, GPU_LOOKUP, GPUSpec, "GPU", flag, explain_unknown_gpu)


def link_from_arg(value: str, flag: str = "--link") -> LinkSpec:
    return _preset_or_file(value, LINK_PRESETS, LinkSpec, "link", flag)


def network_from_arg(value: str, flag: str = "--network") -> NetworkSpec:
    """A node-network preset, a YAML/JSON file, or an inline JSON object."""
    return _preset_or_file(value, NETWORK_PRESETS, NetworkSpec, "network", flag)
