"""What every ``shardmeter`` subcommand shares: the one-line argument parser, range-checked
argument types, help that shows every default, output paths checked before any work, and
field-to-flag renaming of errors."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import annotated_types
from pydantic import BaseModel

from shardmeter.errors import SpecError

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus a message on errors; this prints one line and exits 2.
    Every subcommand takes ``--all-errors``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if kwargs.get("add_help", True) and self.prog.count(" ") == 1:  # a subcommand
            self.add_argument(
                "--all-errors",
                action="store_true",
                help="on bad input, list every problem found (one per line), not only the first",
            )

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(EXIT_USAGE)


_MARKUP = re.compile(r"``([^`]+)``|(?<![`\w])`([^`\s][^`]*)`(?![`\w])")
"""Docstring markup: ``literal`` and `reference` (shown as their text)."""


def plain(text: str) -> str:
    """``text`` without docstring markup (double and single backquotes)."""
    return _MARKUP.sub(lambda m: m.group(1) or m.group(2), text)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written (less docstring markup: help comes from module
    and field docstrings), and every option's default at the end of its help (unless the
    help already says it or there is none)."""

    def format_help(self) -> str:
        return plain(super().format_help())

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, argparse.SUPPRESS)
            or action.option_strings == []
            or isinstance(default, list)
        ):
            return text
        if text.endswith(")") and not text.endswith("))"):  # "(1–16)" → "(1–16; default: 8)"
            return f"{text[:-1]}; default: %(default)s)"
        return f"{text} (default: %(default)s)"


def field_bounds(model: type[BaseModel], name: str) -> tuple[Any, Any]:
    """(low, high) of a spec field's ``ge``/``gt``/``le``/``lt`` (integers made inclusive)."""
    lo: Any = None
    hi: Any = None
    for m in model.model_fields[name].metadata:
        if isinstance(m, annotated_types.Ge):
            lo = m.ge
        elif isinstance(m, annotated_types.Gt):
            lo = m.gt + 1 if isinstance(m.gt, int) else m.gt
        elif isinstance(m, annotated_types.Le):
            hi = m.le
        elif isinstance(m, annotated_types.Lt):
            hi = m.lt - 1 if isinstance(m.lt, int) else m.lt
    return lo, hi


def _shown(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def int_arg(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a whole number between {_shown(low)} and {_shown(high)} (got {text!r})"
            ) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be between {_shown(low)} and {_shown(high)} (got {text})"
            )
        return value

    parse.__name__ = "int"
    return parse


def int_choice_arg(values: tuple[int, ...]) -> Callable[[str], int]:
    """An argparse type: one of the whole numbers ``values``."""
    shown = " or ".join(str(v) for v in values)

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {shown} (got {text!r})") from None
        if value not in values:
            raise argparse.ArgumentTypeError(f"must be {shown} (got {text})")
        return value

    parse.__name__ = "int"
    return parse


def int_or_auto_arg(low: int, high: int) -> Callable[[str], int | str]:
    """An argparse type: ``auto`` or a whole number in [low, high]."""
    number = int_arg(low, high)

    def parse(text: str) -> int | str:
        if text == "auto":
            return text
        try:
            return number(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(
                str(exc).replace("must be a whole number", "must be 'auto' or a whole number")
            ) from None

    return parse


def float_arg(
    low: float, high: float, low_open: bool = False, unit: str = ""
) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (``(low, high]`` with ``low_open``)."""
    span = f"{'>' if low_open else '≥'} {low:g} and ≤ {high:g}{unit}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number {span} (got {text!r})") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number {span} (got {text})")
        if not (low < value if low_open else low <= value) or value > high:
            raise argparse.ArgumentTypeError(f"must be {span} (got {text})")
        return value

    parse.__name__ = "float"
    return parse


# ---- outputs ------------------------------------------------------------------------------


def _writable_directory(folder: Path, flag: str, shown: str) -> None:
    """``folder`` (or its nearest existing ancestor, where it would be created) accepts new
    files: checked by creating and removing one, which also catches /proc and read-only
    mounts that ``os.access`` reports as writable for root."""
    existing = folder
    while not existing.exists():
        if existing.is_symlink():
            raise SpecError(flag, f"{shown}: {existing} is a dangling symbolic link")
        parent = existing.parent
        if parent == existing:
            break
        existing = parent
    if not existing.is_dir():
        raise SpecError(flag, f"{shown}: {existing} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".shardmeter-", dir=existing)
    except OSError as exc:
        raise SpecError(
            flag, f"{shown}: cannot write in {existing} ({exc.strerror or exc})"
        ) from exc
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str, flag: str) -> Path:
    """Fail now, before any work, when ``path`` could not be written: it is a folder, lies
    under a file, or its folder cannot take files."""
    p = Path(path)
    if p.is_dir():
        raise SpecError(flag, f"{path} is a folder; give a file name")
    if p.exists():
        try:
            with p.open("ab"):
                pass
        except OSError as exc:
            raise SpecError(flag, f"cannot write {path} ({exc.strerror or exc})") from exc
        return p
    _writable_directory(p.parent if str(p.parent) else Path("."), flag, path)
    return p


def check_output_folder(path: str | Path, flag: str, files: tuple[str, ...]) -> Path:
    """Fail now when the folder ``path`` or one of ``files`` in it could not be written."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise SpecError(flag, f"{path} is a file, not a folder")
    _writable_directory(folder, flag, str(path))
    for name in files:
        target = folder / name
        if target.is_dir():
            raise SpecError(flag, f"{target} is a folder; it must be a file (or absent)")
    return folder


def writing(flag: str, path: str | Path, write: Callable[[], Any]) -> Any:
    """Run ``write`` and turn an OSError (disk full, a folder removed meanwhile) into an
    error naming the flag."""
    try:
        return write()
    except OSError as exc:
        raise SpecError(flag, f"cannot write {path} ({exc.strerror or exc})") from exc


# ---- errors from the model, named as flags -----------------------------------------------


def rename_fields(exc: SpecError, flags: Mapping[str, str]) -> SpecError:
    """An error about a spec field the user set with a flag, renamed to that flag (the
    longest matching field prefix wins: ``pool.nodes`` → ``--nodes``)."""
    if exc.source:
        return exc
    field = exc.field
    for name in sorted(flags, key=len, reverse=True):
        if field == name or field.startswith(name + "."):
            return SpecError(flags[name], exc.message, problems=exc.problems)
    return exc
