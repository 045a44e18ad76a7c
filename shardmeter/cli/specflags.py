"""Command-line flags derived from a pydantic spec, so that a flag and the plan-file field it
mirrors cannot drift apart: the choices, the range, the default and the help come from the
field, and the values go back through the spec's own validation (`spec_values`)."""

from __future__ import annotations

import argparse
import enum
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

from shardmeter.cli.args import field_bounds, int_arg, int_choice_arg, int_or_auto_arg


@dataclass(frozen=True)
class SpecFlag:
    """A flag for one field of a spec."""

    field: str
    """The spec's field (snake_case)."""
    flag: str
    """The option, e.g. ``--sync-every``."""
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _choices(annotation: Any) -> list[str] | None:
    """The values an enum or a Literal field takes (None for other types)."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
            return [str(m.value) for m in candidate]
    if get_origin(annotation) is Literal:
        return [str(a) for a in get_args(annotation)]
    return None


def _is_int_or_auto(annotation: Any) -> bool:
    args = get_args(annotation)
    return (
        get_origin(annotation) in (typing.Union, types.UnionType)
        and int in args
        and any(_choices(a) == ["auto"] for a in args)
    )


def _shown_default(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def add_spec_flags(
    group: Any,
    model: type[BaseModel],
    flags: Sequence[SpecFlag],
    *,
    defaults: Mapping[str, Any] | None = None,
    bounds: Mapping[str, tuple[int, int]] | None = None,
    overrides: bool = False,
) -> None:
    """Add ``flags`` to ``group`` (an argparse parser or group), each typed, bounded, defaulted
    and described by its field of ``model``: enums and literals list their values (the spec
    validates them, so its aliases are read too), ``int | "auto"`` fields take ``bounds``
    (the spec checks their range in a validator), whole numbers their field's range, booleans
    ``--x/--no-x``. ``defaults`` overrides a field's default for the command line;
    ``overrides=True`` leaves unset flags ``None`` (the spec's default then applies)."""
    for f in flags:
        info = model.model_fields[f.field]
        default = (defaults or {}).get(f.field, info.default)
        text = " ".join((info.description or "").split("\n\n")[0].split()).replace("%", "%%")
        kwargs: dict[str, Any] = {"help": text, "metavar": f.metavar}
        choices = _choices(info.annotation)
        if info.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
            kwargs.pop("metavar")
        elif get_origin(info.annotation) is Literal and all(
            type(a) is int for a in get_args(info.annotation)
        ):  # whole numbers from a short list (gradReduceBytes: 2 | 4)
            kwargs["type"] = int_choice_arg(tuple(get_args(info.annotation)))
            kwargs["metavar"] = f.metavar or "|".join(choices or [])
        elif choices is not None and not _is_int_or_auto(info.annotation):
            kwargs["metavar"] = f.metavar or "|".join(choices)
        elif _is_int_or_auto(info.annotation):
            low, high = (bounds or {})[f.field]
            kwargs["type"] = int_or_auto_arg(low, high)
        elif info.annotation is int:
            low, high = field_bounds(model, f.field)
            kwargs["type"] = int_arg(low, high)
            kwargs["metavar"] = f.metavar or "N"
            kwargs["help"] = f"{text} ({low}–{high:,})"
        else:
            raise TypeError(f"no flag type for {model.__name__}.{f.field}: {info.annotation}")
        if overrides:
            kwargs["default"] = None
            shown = f"default: {_shown_default(default)}"
            help_text = str(kwargs["help"])
            kwargs["help"] = (
                f"{help_text[:-1]}; {shown})"
                if help_text.endswith(")")
                else f"{help_text} ({shown})"
            )
        else:
            kwargs["default"] = default.value if isinstance(default, enum.Enum) else default
        group.add_argument(f.flag, dest=f.dest, **kwargs)


def spec_values(args: argparse.Namespace, flags: Sequence[SpecFlag]) -> dict[str, Any]:
    """The parsed flags as the spec's fields, ready for the spec's validation."""
    return {f.field: getattr(args, f.dest) for f in flags}


def flag_names(model: type[BaseModel], flags: Sequence[SpecFlag], prefix: str) -> dict[str, str]:
    """Error locations (``prefix.field`` as written in a file, camelCase or snake_case) →
    the flag that sets the field, for naming flags in errors."""
    out: dict[str, str] = {}
    for f in flags:
        alias = model.model_fields[f.field].alias or f.field
        out[f"{prefix}.{f.field}"] = f.flag
        out[f"{prefix}.{alias}"] = f.flag
    return out
