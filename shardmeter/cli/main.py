"""Entry point of the shardmeter command.

One error path for every subcommand: a user's mistake — a flag out of range, a plan file
that is not UTF-8, nests too deeply or holds a bad value, an output path that cannot be
written, a request no plan satisfies — exits with status 2 and **one line** on stderr that
names the flag, or the file and the key as the user wrote them, and what to change. Output
paths are checked before any work. Nothing else is printed on stderr in a normal run except
``plan``'s progress (``--progress``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from shardmeter import __version__
from shardmeter.cli import plan, predict, simulate
from shardmeter.cli.args import EXIT_USAGE, HelpFormatter, OneLineParser, rename_fields
from shardmeter.errors import ShardMeterError, SpecError, spec_error_from_validation

EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a command whose reader went away (``| head``)."""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="shardmeter",
        description="Predict, simulate and plan FSDP / DiLoCo / Streaming DiLoCo training.",
        formatter_class=HelpFormatter,
        epilog="Exit status: 0 success, 1 the configuration does not fit in GPU memory (predict, "
        "simulate; see --ignore-memory), 2 bad input (one line on stderr naming the flag or "
        "the file and key; --all-errors lists every problem), 130 interrupted, 141 the reader "
        "of stdout went away (| head).",
    )
    parser.add_argument("--version", action="version", version=f"shardmeter {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    predict.add_parser(sub)
    simulate.add_parser(sub)
    plan.add_parser(sub)
    return parser


def _error(command: str, exc: Exception, all_errors: bool = False) -> int:
    """One line naming the field (with ``--all-errors`` and several problems, one line
    each), exit 2."""
    problems = getattr(exc, "problems", ())
    if all_errors and problems:
        source = getattr(exc, "source", "")
        for problem in problems:
            line = " ".join(f"{source}: {problem}".split() if source else problem.split())
            sys.stderr.write(f"shardmeter {command}: error: {line}\n")
        return EXIT_USAGE
    message = " ".join(str(exc).split())  # one line, whatever the message held
    if problems and message.endswith(")"):  # "… (and 3 more problems)"
        message = message[:-1] + "; --all-errors lists them)"
    sys.stderr.write(f"shardmeter {command}: error: {message}\n")
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or one line about a bad argument
        return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        code = int(args.run(args))
        sys.stdout.flush()  # a closed pipe is reported here, not at interpreter exit
        return code
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except SpecError as exc:
        return _error(args.command, rename_fields(exc, args.flags), args.all_errors)
    except ShardMeterError as exc:
        return _error(args.command, exc)
    except ValidationError as exc:
        return _error(args.command, spec_error_from_validation(exc), args.all_errors)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


def _discard_stdout() -> None:
    """The reader of stdout is gone: send what is still buffered to /dev/null, so that the
    interpreter's final flush does not print a second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in-process)
        pass


if __name__ == "__main__":
    raise SystemExit(main())
