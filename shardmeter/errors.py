"""Errors that reach users: each names the field at fault and what to change."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError


class ShardMeterError(Exception):
    """Base class for errors a user can fix by changing their input."""


class SpecError(ShardMeterError):
    """An input value is invalid. ``field`` is a dotted path such as ``model.hidden_size``."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class InfeasibleError(ShardMeterError):
    """A request is valid but cannot be satisfied; ``constraint`` names the binding one."""

    def __init__(self, message: str, constraint: str = "") -> None:
        self.constraint = constraint
        super().__init__(message)


def _loc_to_path(loc: Iterable[Any], prefix: str = "") -> str:
    parts = [prefix] if prefix else []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(str(item))
    return ".".join(p for p in parts if p)


def spec_error_from_validation(exc: ValidationError, prefix: str = "") -> SpecError:
    """Condense a pydantic ``ValidationError`` into one line naming the first bad field.

    Pydantic reports every union branch it tried; the first error whose location is the
    longest is usually the one a human meant, so that one is reported (with a count of others).
    """
    errors = exc.errors(include_url=False)
    if not errors:
        return SpecError(prefix, str(exc))

    # Skip union-branch noise such as "model.str" / "model.function-after[...]".
    def depth(err: Any) -> int:
        return len([x for x in err["loc"] if not str(x).startswith(("function-", "tagged-"))])

    best = max(errors, key=depth)
    loc = [x for x in best["loc"] if not str(x).startswith(("function-", "tagged-"))]
    msg = str(best["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if best["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling; extra fields are not allowed)"
    elif best["type"] == "missing":
        msg = "required field is missing"
    inp = best.get("input")
    if best["type"] not in ("missing", "extra_forbidden") and isinstance(inp, str | int | float):
        msg = f"{msg} (got {inp!r})"
    more = len(errors) - 1
    if more and best["type"] != "value_error":
        msg += f" [and {more} more problem{'s' if more > 1 else ''}]"
    return SpecError(_loc_to_path(loc, prefix), msg)
