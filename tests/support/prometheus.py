"""A local stand-in of Prometheus' HTTP API (``/api/v1/query``, its documented JSON), for the
operator's observation tests."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextlib.contextmanager
def fake_prometheus(answers: dict[str, tuple[int, Any]]) -> Iterator[tuple[str, list[str]]]:
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
