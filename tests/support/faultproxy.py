"""A fault-injecting HTTP proxy in front of an API server, for the operator's fault tests.

It forwards every request to ``upstream`` (the emulated API server) and, while ``active``,
answers a seeded random share of them with the faults a real control plane produces:

* ``500`` — an internal error, nothing applied;
* ``429`` — throttled, with ``Retry-After`` (and the Status's ``retryAfterSeconds``);
* ``reset`` — the connection is reset before anything is forwarded;
* ``lost`` — a write is forwarded and applied, then the connection is reset instead of the
  answer (the client cannot know it succeeded);
* ``delay`` — 0.5–4 s before the request is forwarded;
* ``409`` — a conflict on a status patch (as when another writer got there first);
* ``cut`` — a watch stream is forwarded, then cut in the middle of an event;
* ``503`` — with ``blackout``, every request fails (503 or a reset): the API server is down;
* ``410`` — a watch resumed from a resource version is answered with an ``ERROR`` event of
  code 410 (the version is too old), as kube-apiserver does after compaction.

Faults are drawn from one ``random.Random(seed)``; which request gets which fault still
depends on timing. Every fault is recorded in ``log`` (time, kind, method, path). The proxy
runs its own event loop in a thread, so blocking tests and subprocess operators can use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp
import aiohttp.web

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
    "host",
    "upgrade",
}


@dataclass
class FaultRates:
    """Probability per request of each fault (the rest is forwarded untouched)."""

    error_500: float = 0.05
    throttle_429: float = 0.05
    reset: float = 0.03
    lost: float = 0.04
    """Writes only: applied, then the answer is lost."""
    delay: float = 0.05
    conflict_409: float = 0.15
    """Status patches only."""
    cut: float = 0.3
    """Watch streams only: cut after 0–3 events, in the middle of the next one."""
    gone_410: float = 0.3
    """Watches resumed from a resourceVersion only."""
    retry_after_s: int = 1


@dataclass
class Fault:
    at_s: float
    kind: str
    method: str
    path: str


@dataclass
class FaultProxy:
    upstream: str
    seed: int = 0
    rates: FaultRates = field(default_factory=FaultRates)
    active: bool = False
    blackout: bool = False
    """Every request fails (503 or a reset, in turn): the API server is down."""
    log: list[Fault] = field(default_factory=list)
    url: str = ""
    requests: int = 0
    _random: random.Random = field(init=False)
    _loop: asyncio.AbstractEventLoop | None = None
    _started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    # ---- running it ----------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self) -> Iterator[FaultProxy]:
        ready = threading.Event()
        stop: list[asyncio.Event] = []

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            session = aiohttp.ClientSession(
                auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
            )
            app = aiohttp.web.Application(client_max_size=8 * 1024 * 1024)

            async def handle(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
                return await self._handle(request, session)

            app.router.add_route("*", "/{tail:.*}", handle)
            runner = aiohttp.web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
            stop.append(asyncio.Event())
            ready.set()
            await stop[0].wait()
            await runner.cleanup()
            await session.close()

        thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        try:
            yield self
        finally:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(stop[0].set)
            thread.join(10)

    def faults(self, on: bool) -> None:
        self.active = on

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.log:
            out[f.kind] = out.get(f.kind, 0) + 1
        return out

    # ---- one request ---------------------------------------------------------------------
    def _draw(self, request: aiohttp.web.Request) -> str:
        if self.blackout:
            return "reset" if self.requests % 2 else "503"
        if not self.active:
            return ""
        watch = request.query.get("watch") in ("true", "1")
        write = request.method in ("POST", "PUT", "PATCH", "DELETE")
        status_patch = request.method == "PATCH" and request.path.endswith("/status")
        r, x = self.rates, self._random.random()
        if watch:
            if "resourceVersion" in request.query and x < r.gone_410:
                return "410"
            x = self._random.random()
            if x < r.cut:
                return "cut"
            x = self._random.random()
        if status_patch:
            if x < r.conflict_409:
                return "409"
            x = self._random.random()
        for kind, p in (
            ("500", r.error_500),
            ("429", r.throttle_429),
            ("reset", r.reset),
            ("lost", r.lost if write else 0.0),
            ("delay", r.delay),
        ):
            if x < p:
                return kind
            x -= p
        return ""

    async def _handle(
        self, request: aiohttp.web.Request, session: aiohttp.ClientSession
    ) -> aiohttp.web.StreamResponse:
        self.requests += 1
        kind = self._draw(request)
        if kind:
            self.log.append(
                Fault(time.monotonic() - self._started, kind, request.method, request.path)
            )
        if kind == "500":
            return _status(500, "InternalError", "injected: internal error")
        if kind == "503":
            return _status(503, "ServiceUnavailable", "injected: the API server is down")
        if kind == "429":
            return _status(
                429,
                "TooManyRequests",
                "injected: too many requests",
                retry_after_s=self.rates.retry_after_s,
            )
        if kind == "409":
            return _status(409, "Conflict", "injected: the object has been modified")
        if kind == "reset":
            return _reset(request)
        if kind == "410":
            body = {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "Expired",
                    "code": 410,
                    "message": "injected: too old resource version",
                },
            }
            return aiohttp.web.Response(
                body=json.dumps(body).encode() + b"\n", content_type="application/json"
            )
        if kind == "delay":
            await asyncio.sleep(self._random.uniform(0.5, 4.0))
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            upstream = await session.request(
                request.method,
                self.upstream.rstrip("/") + request.rel_url.path_qs,
                data=body or None,
                headers=headers,
            )
        except aiohttp.ClientError:
            return _reset(request)
        async with upstream:
            if kind == "lost":
                await upstream.read()  # applied upstream; the client never hears of it
                return _reset(request)
            response = aiohttp.web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    response.headers[k] = v
            await response.prepare(request)
            if kind == "cut":
                events = self._random.randint(0, 3)
                with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                    async for line in upstream.content:
                        if events == 0:
                            await response.write(line[: max(1, len(line) // 2)])
                            break
                        await response.write(line)
                        events -= 1
                return _reset(request, response)
            with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response


def _status(
    code: int, reason: str, message: str, *, retry_after_s: int | None = None
) -> aiohttp.web.Response:
    body: dict[str, object] = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }
    headers = {}
    if retry_after_s is not None:
        body["details"] = {"retryAfterSeconds": retry_after_s}
        headers["Retry-After"] = str(retry_after_s)
    return aiohttp.web.Response(
        status=code,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=headers,
    )


def _reset(
    request: aiohttp.web.Request, response: aiohttp.web.StreamResponse | None = None
) -> aiohttp.web.StreamResponse:
    """Abort the client's connection (an RST: no answer, or an answer cut short)."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    return response if response is not None else aiohttp.web.Response(status=500)
