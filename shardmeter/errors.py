"""Errors that reach users: each names the field at fault — as the user spelled it — and what
to change, on one line."""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Sequence
from typing import Annotated, Any, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ValidationError


class ShardMeterError(Exception):
    """Base class for errors a user can fix by changing their input."""


class SpecError(ShardMeterError):
    """An input value is invalid. ``field`` is a dotted path such as ``model.hiddenSize`` (or
    a command-line flag); ``source`` the file it was read from, if any."""

    def __init__(
        self, field: str, message: str, source: str = "", problems: Sequence[str] = ()
    ) -> None:
        self.field = field
        self.message = message
        self.source = source
        self.problems = tuple(problems)
        """Every problem found, one line each, the first the one the message names (for
        ``--all-errors``; empty when there is only the one)."""
        where = ": ".join(p for p in (source, field) if p)
        super().__init__(f"{where}: {message}" if where else message)


class InfeasibleError(ShardMeterError):
    """A request is valid but cannot be satisfied; ``constraint`` names the binding one."""

    def __init__(self, message: str, constraint: str = "") -> None:
        self.constraint = constraint
        super().__init__(message)


# ---- pydantic's errors as one line -----------------------------------------------------------


def _members(annotation: Any) -> list[Any]:
    """The types an annotation admits: unions, ``Optional`` and ``Annotated`` unwrapped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [m for a in get_args(annotation) for m in _members(a)]
    return [annotation]


def _model_field(model: type[BaseModel], key: str) -> Any:
    """The field ``key`` names (by its Python name or its camelCase alias), else None."""
    if key in model.model_fields:
        return model.model_fields[key]
    return next((f for f in model.model_fields.values() if f.alias == key), None)


def _aliases(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


class _Where:
    """Where an error is: the user's path to the field (union branches dropped), the field's
    declaration and the model that holds it."""

    def __init__(self, root: type[BaseModel] | None, loc: Sequence[Any], extra: bool) -> None:
        self.parts: list[str | int] = []
        self.field: Any = None
        self.model: type[BaseModel] | None = None
        current: list[Any] = [root] if root is not None else []
        for i, item in enumerate(loc):
            last = i == len(loc) - 1
            models = [t for t in current if isinstance(t, type) and issubclass(t, BaseModel)]
            if isinstance(item, int):
                seqs = [t for t in current if get_origin(t) in (list, tuple, Sequence)]
                if seqs or root is None:
                    self.parts.append(item)
                    current = [m for t in seqs for a in get_args(t)[:1] for m in _members(a)]
                continue
            field = next((f for m in models if (f := _model_field(m, item)) is not None), None)
            if field is not None:
                self.parts.append(item)
                self.model = next(m for m in models if _model_field(m, item) is field)
                self.field = field
                current = _members(field.annotation)
            elif extra and last:
                self.parts.append(item)  # the unknown key itself
                self.model = models[0] if models else self.model
                self.field = None
            elif any(get_origin(t) is dict for t in current):
                self.parts.append(item)
                current = [
                    m for t in current if get_origin(t) is dict for m in _members(get_args(t)[1])
                ]
            elif root is None and not _is_branch_tag(item):
                self.parts.append(item)

    def path(self) -> str:
        out = ""
        for p in self.parts:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
        return out


_BRANCH_TAG = re.compile(
    r"(function-(after|before|wrap|plain)\[.*\]|tagged-union\[.*\]|is-instance\[.*\]|"
    r"literal\[.*\]|json-or-python\[.*\]|chain\[.*\]|nullable\[.*\]|lax-or-strict\[.*\]|"
    r"int|float|str|bool|none|list\[.*\]|dict\[.*\]|[A-Z][A-Za-z0-9]*)"
)


def _is_branch_tag(item: str) -> bool:
    """pydantic's name for a union branch in an error location (``int``,
    ``literal['auto']``, ``function-after[...]``, a model's class name)."""
    return _BRANCH_TAG.fullmatch(item) is not None


def _bounds(field: Any) -> tuple[Any, Any, bool, bool]:
    """(low, high, low inclusive, high inclusive) of a field's numeric constraints."""
    lo: Any = None
    hi: Any = None
    lo_inc = hi_inc = True
    metadata = list(getattr(field, "metadata", []) or [])
    annotation = getattr(field, "annotation", None)
    for member in (
        get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else []
    ):
        if get_origin(member) is Annotated and get_args(member)[0] in (int, float):
            for extra in get_args(member)[1:]:
                metadata.extend(getattr(extra, "metadata", [extra]))
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            lo, lo_inc = m.ge, True
        elif isinstance(m, annotated_types.Gt):
            lo, lo_inc = m.gt, False
        elif isinstance(m, annotated_types.Le):
            hi, hi_inc = m.le, True
        elif isinstance(m, annotated_types.Lt):
            hi, hi_inc = m.lt, False
    return lo, hi, lo_inc, hi_inc


def _takes_preset(field: Any) -> bool:
    """A field that also reads a preset name (``GPURef``, ``ModelRef``, …)."""
    for m in getattr(field, "metadata", []) or []:
        accepted = getattr(m, "json_schema_input_type", None)
        if accepted is not None and str in _members(accepted):
            return True
    annotation = getattr(field, "annotation", None)
    for member in [annotation, *get_args(annotation)]:
        for m in get_args(member)[1:] if get_origin(member) is Annotated else []:
            accepted = getattr(m, "json_schema_input_type", None)
            if accepted is not None and str in _members(accepted):
                return True
    return False


def _num(value: Any) -> str:
    """A bound as a reader takes it in: counts with thousands separators (``16,777,216``),
    large measures in exponent form (``1e9``, ``1e18``)."""
    if isinstance(value, float):
        if abs(value) >= 1e5:
            mantissa, _, exponent = f"{value:.4g}".partition("e")
            return f"{mantissa}e{int(exponent)}" if exponent else f"{value:,.0f}"
        if value.is_integer():
            value = int(value)
        else:
            return f"{value:g}"
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


def _range(field: Any, ctx: dict[str, Any]) -> str:
    """ "must be between 1 and 4,096" / "must be ≥ 0" from the field's declared bounds (or
    the error's context)."""
    lo, hi, lo_inc, hi_inc = _bounds(field)
    for key, value in ctx.items():
        if key in ("ge", "gt") and lo is None:
            lo, lo_inc = value, key == "ge"
        elif key in ("le", "lt") and hi is None:
            hi, hi_inc = value, key == "le"
    whole = int in _members(getattr(field, "annotation", None))
    if whole and isinstance(lo, int) and not lo_inc:  # gt=0 on a count: "between 1 and …"
        lo, lo_inc = lo + 1, True
    if whole and isinstance(hi, int) and not hi_inc:
        hi, hi_inc = hi - 1, True
    if lo is not None and hi is not None and lo_inc and hi_inc:
        return f"must be between {_num(lo)} and {_num(hi)}"
    parts = []
    if lo is not None:
        parts.append(f"{'≥' if lo_inc else '>'} {_num(lo)}")
    if hi is not None:
        parts.append(f"{'≤' if hi_inc else '<'} {_num(hi)}")
    return "must be " + " and ".join(parts)


_NUMBERLIKE = re.compile(r"\s*[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")


def _got(value: Any) -> str:
    if isinstance(value, bool):
        return f"got {str(value).lower()}, a boolean"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "…"
        return f"got {shown!r}"
    if isinstance(value, int | float):
        return f"got {value!r}"
    if isinstance(value, dict):
        return "got a mapping"
    if isinstance(value, list):
        return "got a list"
    if value is None:
        return "got nothing (null)"
    return f"got {type(value).__name__}"


def _phrase(err: Any, where: _Where) -> str:
    """What the value must be, for one pydantic error (no "got" part)."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be a whole number"
    if kind in ("float_type", "float_parsing"):
        return "must be a number"
    if kind == "finite_number":
        return "must be a finite number"
    if kind in ("bool_type", "bool_parsing"):
        return "must be true or false"
    if kind == "string_type":
        return "must be a string"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return _range(where.field, ctx)
    if kind in ("too_short", "too_long"):
        n_min = ctx.get("min_length")
        n_max = ctx.get("max_length")
        if kind == "too_short":
            return f"must have at least {n_min} item{'s' if n_min != 1 else ''}"
        return f"must have at most {n_max} items"
    if kind == "string_too_short":
        return f"must be at least {ctx.get('min_length')} character(s) long"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters long"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}"
    if kind in ("literal_error", "enum"):
        return f"must be {ctx.get('expected')}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return (
            "must be a preset name or a mapping of fields"
            if _takes_preset(where.field)
            else ("must be a mapping of fields")
        )
    if kind in ("list_type", "tuple_type"):
        return "must be a list"
    if kind == "is_instance_of":
        return f"must be a {ctx.get('class')}"
    msg = str(err["msg"])
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def _yaml_hint(value: Any, kind: str) -> str:
    """YAML 1.1 (PyYAML) reads ``1e9`` — no dot, no exponent sign — as text."""
    if (
        kind in ("int_type", "int_parsing", "float_type", "float_parsing")
        and isinstance(value, str)
        and _NUMBERLIKE.fullmatch(value)
    ):
        try:
            number = float(value)
        except ValueError:
            return ""
        plain = str(int(number)) if number.is_integer() and abs(number) < 1e18 else repr(number)
        return f"; a quoted or exponent-only number is text in YAML — write {plain}"
    return ""


def _describe(errors: list[Any], where: _Where) -> str:
    """One message for the errors of one field (several when it is a union)."""
    first = errors[0]
    kind = first["type"]
    if kind == "extra_forbidden":
        key = str(where.parts[-1]) if where.parts else ""
        allowed = _aliases(where.model) if where.model is not None else []
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        if close:
            return f"unknown field (did you mean {close[0]!r}?)"
        return "unknown field (check the spelling; allowed: " + ", ".join(allowed) + ")"
    if kind == "missing":
        return "required field is missing"
    phrases: list[str] = []
    for e in errors:
        p = _phrase(e, where)
        if p not in phrases:
            phrases.append(p)
    # a union (int | "auto", preset name | mapping): "must be a whole number or 'auto'"
    if len(phrases) > 1:
        parts = [p.removeprefix("must be ") for p in phrases if p.startswith("must be ")]
        others = [p for p in phrases if not p.startswith("must be ")]
        message = "; ".join(others) if others else "must be " + " or ".join(parts)
    else:
        message = phrases[0]
    value = first.get("input")
    if kind in ("value_error", "assertion_error"):
        if isinstance(value, str | int | float) and repr(value) not in message:
            message += f" ({_got(value)})"
        return message
    return f"{message} ({_got(value)}{_yaml_hint(value, kind)})"


def _under(path: str, parent: str) -> bool:
    """``path`` lies strictly inside ``parent`` (``a.b[0].c`` inside ``a.b``)."""
    if not parent:
        return bool(path)
    return path.startswith((parent + ".", parent + "["))


SPEC_ROOTS: list[type[BaseModel]] = []
"""Base classes of the specs whose errors are reworded (``shardmeter.spec.base`` registers
``SpecModel`` here: this module, the lowest layer, does not import the specs)."""


def _model_named(title: str) -> type[BaseModel] | None:
    """The spec class a ValidationError's title names (every spec derives from SpecModel)."""
    pending: list[type[BaseModel]] = list(SPEC_ROOTS)
    while pending:
        cls = pending.pop()
        if cls.__name__ == title:
            return cls
        pending.extend(cls.__subclasses__())
    return None


def spec_error_from_validation(
    exc: ValidationError,
    prefix: str = "",
    source: str = "",
    model: type[BaseModel] | None = None,
) -> SpecError:
    """Condense a pydantic ``ValidationError`` into one line naming the first bad field.

    The field is named as the user spelled it (camelCase or snake_case, whichever the input
    used), under ``prefix`` (e.g. ``spec``) and with the file in ``source``; the message says
    what the value must be — with the field's declared range — and what it was. A union's
    branches (``int | "auto"``) become one message; other fields' problems are counted.
    """
    errors = exc.errors(include_url=False)
    if not errors:
        return SpecError(prefix, str(exc), source)
    root = model or _model_named(exc.title)
    groups: dict[str, tuple[_Where, list[Any]]] = {}
    for err in errors:
        where = _Where(root, err["loc"], err["type"] == "extra_forbidden")
        key = where.path()
        groups.setdefault(key, (where, []))[1].append(err)
    # an unknown key first: a misspelt key (``gpusPerNod``) also makes the field it meant
    # missing, and "did you mean" is the message that explains both
    keys = sorted(groups, key=lambda k: groups[k][1][0]["type"] != "extra_forbidden")
    key = keys[0]
    # a union whose container branch (a list, a mapping) failed deeper: the user wrote that
    # container, so its inner error is the one that helps (``islands[0].stepS``, not
    # "islands must be a whole number")
    deeper = [k for k in keys if _under(k, key)]
    if deeper:
        key = deeper[0]
    where, errs = groups[key]
    message = _describe(errs, where)
    others = [k for k in keys if not (_under(k, key) or _under(key, k) or k == key)]
    full = ".".join(p for p in (prefix, key) if p).replace(".[", "[")
    problems = [f"{full}: {message}"] + [
        ".".join(p for p in (prefix, k) if p).replace(".[", "[")
        + ": "
        + _describe(groups[k][1], groups[k][0])
        for k in others
    ]
    if others:
        n = len(others)
        message += f" (and {n} more problem{'s' if n > 1 else ''})"
    return SpecError(full, message, source, problems if others else ())
