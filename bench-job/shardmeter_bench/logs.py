"""Logging and progress: structlog events on stderr (JSON when stderr is not a terminal,
key=value on one), and a tqdm progress bar only on a terminal and only on rank 0."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import structlog

T = TypeVar("T")

_state = {"rank": 0, "progress": True}


class _StderrLogger:
    """Writes each event line to whatever ``sys.stderr`` is *now* (a logger that captured the
    stream at configure time keeps writing to it after it is replaced or closed)."""

    def msg(self, message: str) -> None:
        stream = sys.stderr
        stream.write(message + "\n")
        stream.flush()

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def _stderr_logger(*_args: Any) -> _StderrLogger:
    return _StderrLogger()


def configure(rank: int = 0, json: bool | None = None, verbose: bool = False) -> None:
    """Configure structlog for this process. Rank 0 logs info; other ranks warnings only, so
    a 16-rank Job does not print everything 16 times."""
    if json is None:
        json = not sys.stderr.isatty()
    level = logging.DEBUG if verbose else (logging.INFO if rank == 0 else logging.WARNING)
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(rank=rank)
    _state["rank"] = rank


def get_logger(name: str = "shardmeter_bench") -> Any:
    return structlog.get_logger(name)


def set_progress(enabled: bool) -> None:
    _state["progress"] = enabled


def progress(items: Iterable[T], total: int | None = None, desc: str = "") -> Iterator[T]:
    """Iterate with a progress bar on a terminal (rank 0 only); plainly otherwise."""
    show = bool(_state["progress"]) and _state["rank"] == 0 and sys.stderr.isatty()
    if not show:
        yield from items
        return
    from tqdm import tqdm

    with tqdm(items, total=total, desc=desc, file=sys.stderr, leave=False) as bar:
        yield from bar
