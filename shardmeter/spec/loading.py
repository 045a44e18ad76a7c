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


def read_document(path: str | Path) -> Any:
    """Parse a YAML or JSON file (JSON is YAML, but JSON errors read better)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(str(path), f"cannot read file ({exc.strerror})") from exc
    try:
        if p.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SpecError(str(path), f"invalid JSON: {exc.msg} at line {exc.lineno}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(str(path), f"invalid YAML: {problem}{where}") from exc


def validate(model: type[M], data: Any, where: str) -> M:
    """``model.model_validate(data)`` with the error condensed to one line under ``where``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, where) from exc


def _looks_like_file(value: str) -> bool:
    return value.endswith((".yaml", ".yml", ".json")) or "/" in value


def _preset_or_file(value: str, presets: dict[str, M], model: type[M], what: str, flag: str) -> M:
    if _looks_like_file(value):
        return validate(model, read_document(value), value)
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
        return validate(NetworkSpec, data, flag)
    return _preset_or_file(value, NETWORK_PRESETS, NetworkSpec, "network", flag)
