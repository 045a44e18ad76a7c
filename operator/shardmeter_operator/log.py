"""structlog configuration: JSON lines when stderr is not a terminal (containers), coloured
key-value lines on a terminal. Standard-library logging (kopf's) goes through it too."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

MAX_EVENT_CHARS = 240


def compact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """One short line per event: kopf's per-object loggers attach the whole operator settings
    (``settings``, ≈2 KB) and an object reference; keep only ``obj=Kind namespace/name``."""
    for key in ("settings", "k8s_skip", "taskName"):
        event.pop(key, None)
    ref = event.pop("k8s_ref", None)
    if isinstance(ref, dict):
        where = "/".join(str(p) for p in (ref.get("namespace"), ref.get("name")) if p)
        event.setdefault("obj", f"{ref.get('kind', '')} {where}".strip())
    text = event.get("event")
    if isinstance(text, str) and len(text) > MAX_EVENT_CHARS:
        event["event"] = text[: MAX_EVENT_CHARS - 1] + "…"
    return event


class QuietHandlers(logging.Filter):
    """kopf logs "Handler 'x' succeeded." at INFO for every watch event it delivers (every
    Job status change, every status patch): demote those to DEBUG. The operator logs one line
    per reconcile that changed something instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and record.name.startswith("kopf"):
            message = record.getMessage()
            if message.startswith("Handler ") and message.endswith(" succeeded."):
                return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def configure(level: str = "INFO", json_logs: bool | None = None) -> None:
    json_logs = not sys.stderr.isatty() if json_logs is None else json_logs
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(QuietHandlers())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                # the traceback as text (JSON otherwise shows "<traceback object at …>")
                *([structlog.processors.format_exc_info] if json_logs else []),
                renderer,
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(), compact],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # one access-log line per kubelet probe of kopf's /healthz: only at DEBUG
    logging.getLogger("aiohttp.access").setLevel(max(root.level, logging.WARNING))
