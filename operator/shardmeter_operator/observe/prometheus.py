"""An instant query against Prometheus' HTTP API (``GET /api/v1/query``), for a plan that
names the query giving an island's inner step seconds (``spec.observe.stepSecondsQuery``).

The URL is the operator's (``--prometheus-url``), never the plan's: a plan cannot point the
operator at an arbitrary address. The answer must be one finite sample > 0 (a scalar, or a
vector of one element); anything else is a :class:`QueryError` naming what came back.
Blocking: call it in a worker thread. Bounded: a timeout and a response size cap.
"""

from __future__ import annotations

import json
import math
import string
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

TIMEOUT_S = 10.0
MAX_RESPONSE_BYTES = 1 << 20


class QueryError(Exception):
    pass


def render(query: str, **values: str) -> str:
    """``$namespace``, ``$job``, ``$pod``, ``$island`` substituted (others left as written)."""
    return string.Template(query).safe_substitute(values)


def instant_value(base_url: str, query: str, timeout_s: float = TIMEOUT_S) -> float:
    url = f"{base_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            raw = response.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise QueryError(f"HTTP {exc.code} from {base_url}: {_error_text(exc)}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise QueryError(f"{base_url} unreachable ({exc})") from exc
    if len(raw) > MAX_RESPONSE_BYTES:
        raise QueryError(f"the answer is larger than {MAX_RESPONSE_BYTES} bytes")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise QueryError("the answer is not JSON") from exc
    return value_of(body)


def value_of(body: Any) -> float:
    """The one sample of a Prometheus query response (the API's documented JSON)."""
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise QueryError(f"query failed: {error or 'no success status'}")
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    sample: Any
    if kind == "scalar":
        sample = result
    elif kind == "vector" and isinstance(result, list):
        if len(result) != 1:
            raise QueryError(f"the query returned {len(result)} series, 1 needed")
        sample = (result[0] or {}).get("value")
    else:
        raise QueryError(f"the query returned a {kind}, a scalar or one-element vector needed")
    try:
        value = float(sample[1])
    except (TypeError, ValueError, IndexError) as exc:
        raise QueryError(f"unreadable sample {sample!r}") from exc
    if not math.isfinite(value) or value <= 0:
        raise QueryError(f"the step seconds must be a finite number > 0 (got {value})")
    return value


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read(4096) or b"{}")
        return str(body.get("error") or exc.reason)[:200]
    except (ValueError, OSError):
        return str(exc.reason)[:200]
