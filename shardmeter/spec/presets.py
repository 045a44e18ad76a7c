"""Preset lookup shared by every spec: case-insensitive names, aliases, and errors that list
the allowed values and suggest the closest one."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def normalise_name(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def lookup(registry: Mapping[str, T], name: str, what: str) -> T:
    """Return ``registry[name]`` ignoring case/underscores, else raise ``ValueError`` that
    names the allowed values (and the closest match)."""
    key = normalise_name(name)
    if key in registry:
        return registry[key]
    allowed = sorted(registry)
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown {what} preset {name!r}{hint} Allowed: {', '.join(allowed)}")


def resolve(value: Any, registry: Mapping[str, Any], what: str) -> Any:
    """Pydantic before-validator body: a string is a preset name; a mapping with a ``preset``
    key is that preset with the other keys overriding its fields; anything else passes."""
    if isinstance(value, str):
        return lookup(registry, value, what)
    if isinstance(value, Mapping) and "preset" in value:
        base = lookup(registry, str(value["preset"]), what)
        overrides = {k: v for k, v in value.items() if k != "preset"}
        dumped = base.model_dump(by_alias=False)
        merged = {**dumped, **overrides}
        # an override given in camelCase replaces the snake_case key of the preset
        from pydantic.alias_generators import to_snake

        for key in list(overrides):
            snake = to_snake(key)
            if snake != key and snake in merged:
                merged[snake] = merged.pop(key)
        return merged
    return value
