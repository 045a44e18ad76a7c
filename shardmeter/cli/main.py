"""Entry point of the ``shardmeter`` command. Bad input exits with status 2 and one line
on stderr that names the field at fault; no tracebacks for user errors."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from pydantic import ValidationError

from shardmeter import __version__
from shardmeter.cli import plan, predict, simulate
from shardmeter.errors import ShardMeterError, spec_error_from_validation

EXIT_USAGE = 2


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus a message on errors; we print one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="shardmeter",
        description="Predict, simulate and plan FSDP / DiLoCo / Streaming DiLoCo training.",
    )
    parser.add_argument("--version", action="version", version=f"shardmeter {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    predict.add_parser(sub)
    simulate.add_parser(sub)
    plan.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ShardMeterError as exc:
        sys.stderr.write(f"shardmeter {args.command}: error: {exc}\n")
        return EXIT_USAGE
    except ValidationError as exc:
        sys.stderr.write(f"shardmeter {args.command}: error: {spec_error_from_validation(exc)}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
