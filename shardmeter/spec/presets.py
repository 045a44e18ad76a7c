"""Preset lookup shared by every spec: case-insensitive names, aliases, and errors that list
the allowed values and suggest the closest one."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

Explain = Callable[[str], str]
"""What to say about a normalised name that is no preset, after ``unknown X preset 'NAME'``
(e.g. `shardmeter.spec.gpu_names.explain_unknown_gpu`); the default names the closest
preset."""


def normalise_name(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def lookup(registry: Mapping[str, T], name: str, what: str, explain: Explain | None = None) -> T:
    """Return ``registry[name]`` ignoring case/underscores, else raise ``ValueError`` that
    says what the name may be (``explain``, else the closest preset) and lists the presets."""
    key = normalise_name(name)
    if key in registry:
        return registry[key]
    allowed = sorted(registry)
    if explain is not None:
        hint = explain(key)
    else:
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown {what} preset {name!r}{hint}; presets: {', '.join(allowed)}")


MAX_NAME_CHARS = 63
"""A spec's display name is at most this long (the specs' ``name`` field)."""


def _value_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def overridden_name(base_name: str, overrides: Mapping[str, Any]) -> str:
    """The preset's name followed by what was overridden, as the user wrote it:
    ``Llama-3.1-8B (numLayers=16)``; cut to `MAX_NAME_CHARS` (ending in ``…)``)."""
    if not overrides:
        return base_name
    name = f"{base_name} ({', '.join(f'{k}={_value_text(v)}' for k, v in overrides.items())})"
    if len(name) > MAX_NAME_CHARS:
        name = name[: MAX_NAME_CHARS - 2] + "…)"
    return name


def resolve(
    value: Any, registry: Mapping[str, Any], what: str, explain: Explain | None = None
) -> Any:
    """Pydantic before-validator body: a string is a preset name; a mapping with a ``preset``
    key is that preset with the other keys overriding its fields — and, unless a ``name`` is
    among them, named after the preset and the overrides (``Llama-3.1-8B (numLayers=16)``),
    so no output passes a variant off as the preset; anything else passes. ``explain`` says
    what an unknown name may be (`lookup`)."""
    if isinstance(value, str):
        return lookup(registry, value, what, explain)
    if isinstance(value, Mapping) and "preset" in value:
        if not isinstance(value["preset"], str):
            raise ValueError(f"preset must be a {what} preset name (got {value['preset']!r})")
        base = lookup(registry, value["preset"], what, explain)
        overrides = {k: v for k, v in value.items() if k != "preset"}
        merged = dict(base.model_dump(by_alias=False))
        # an override replaces the preset's value under the key the user wrote (camelCase or
        # snake_case), so that an error names the field as the user spelled it
        fields = type(base).model_fields
        for key in overrides:
            for name, info in fields.items():
                if key in (name, info.alias) and key != name:
                    merged.pop(name, None)
        if "name" in fields and "name" not in overrides:
            merged["name"] = overridden_name(str(merged.get("name", value["preset"])), overrides)
        return {**merged, **overrides}
    return value
