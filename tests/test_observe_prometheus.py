"""Instant queries against Prometheus' HTTP API (``/api/v1/query``, its documented JSON), for
plans that name a step-seconds query, served here by a local stand-in of the API."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from shardmeter_operator import promquery


@contextlib.contextmanager
def prometheus(answers: dict[str, tuple[int, Any]]) -> Iterator[tuple[str, list[str]]]:
    """A local /api/v1/query answering ``answers[query]`` = (HTTP status, JSON body)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlparse(self.path)
            query = urllib.parse.parse_qs(url.query).get("query", [""])[0]
            seen.append(query)
            status, body = answers.get(query, (400, {"status": "error", "error": "parse error"}))
            data = json.dumps(body).encode() if not isinstance(body, bytes) else body
            self.send_response(status if url.path == "/api/v1/query" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def vector(*values: float) -> dict[str, Any]:
    result = [
        {"metric": {"pod": f"p{i}"}, "value": [1733011200.0, str(v)]} for i, v in enumerate(values)
    ]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def test_one_sample_is_the_step_and_anything_else_says_what_came_back() -> None:
    query = promquery.render(
        'avg(rate(step_seconds_sum{namespace="$namespace",pod="$pod"}[5m])) $unknown',
        namespace="team-a",
        pod="run-island-0-abcde",
        job="run-island-0",
        island="run-island-0",
    )
    assert (
        query
        == 'avg(rate(step_seconds_sum{namespace="team-a",pod="run-island-0-abcde"}[5m])) $unknown'
    )
    answers = {
        "one": (200, vector(1.25)),
        "scalar": (
            200,
            {"status": "success", "data": {"resultType": "scalar", "result": [0, "2.5"]}},
        ),
        "two": (200, vector(1.0, 2.0)),
        "none": (200, vector()),
        "zero": (200, vector(0.0)),
        "nan": (200, vector(float("nan"))),
        "matrix": (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}),
        "broken": (200, b"<html>"),
    }
    with prometheus(answers) as (url, seen):
        assert promquery.instant_value(url, "one") == 1.25
        assert promquery.instant_value(url + "/", "scalar") == 2.5
        for query, message in [
            ("two", "2 series, 1 needed"),
            ("none", "0 series"),
            ("zero", "finite number > 0"),
            ("nan", "finite number > 0"),
            ("matrix", "returned a matrix"),
            ("broken", "not JSON"),
            ("bad(", "HTTP 400 .*parse error"),
        ]:
            with pytest.raises(promquery.QueryError, match=message):
                promquery.instant_value(url, query)
        assert seen[0] == "one"
    with pytest.raises(promquery.QueryError, match="unreachable"):
        promquery.instant_value("http://127.0.0.1:9", "one", timeout_s=2)
