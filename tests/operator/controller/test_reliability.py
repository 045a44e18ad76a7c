"""The pieces that keep the operator right under faults, one by one: the retry policy, the
Event outbox, the API facade's errors, kopf's watch guard and endless retries, JSON logs
with tracebacks, and no child created for a plan that is gone."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import random
from typing import Any

import aiohttp.web
import pytest
from kubernetes.client.exceptions import ApiException

from shardmeter_operator import events, log
from shardmeter_operator.api import EventOutbox
from shardmeter_operator.api.errors import GoneError
from shardmeter_operator.k8s import retry, watchguard
from shardmeter_operator.k8s.children import ensure_children
from shardmeter_operator.k8s.client import ApiError, ApiHealth


def _api_exception(status: int, headers: dict[str, str] | None = None, body: Any = None) -> Any:
    exc = ApiException(status=status, reason="x")
    exc.headers = headers or {}
    exc.body = json.dumps(body) if body is not None else None
    return exc


# ---- retry: the cause and the server decide, not the object's count ---------------------------
def test_retry_after_is_honoured_from_the_header_or_the_status_details() -> None:
    rng = random.Random(0)
    header = ApiError.of(_api_exception(429, {"Retry-After": "1"}), "get x")
    details = ApiError.of(_api_exception(429, body={"details": {"retryAfterSeconds": 3}}), "x")
    assert header.retry_after_s == 1.0 and details.retry_after_s == 3.0
    for exc, after in ((header, 1.0), (details, 3.0)):
        r = retry.retry_delay(exc, outage_failures=50, object_errors=9, rng=rng)
        assert r.cause == "throttled" and after <= r.delay_s <= after * 1.2 + 0.1


def test_an_outage_backs_off_by_the_apis_health_within_seconds() -> None:
    rng = random.Random(0)
    down = ApiError(503, "get x failed: HTTP 503")
    delays = [
        retry.retry_delay(down, outage_failures=n, object_errors=1, rng=rng).delay_s
        for n in (1, 2, 4, 8, 1000)
    ]
    assert delays[0] < 1.0 and max(delays) <= retry.OUTAGE_MAX_S * 1.2
    assert delays == sorted(delays) or max(delays) <= retry.OUTAGE_MAX_S * 1.2
    # the object's own failure count does not stretch an outage's delay
    many = retry.retry_delay(down, outage_failures=1, object_errors=40, rng=rng)
    assert many.cause == "unavailable" and many.delay_s < 1.0
    no_answer = ApiError(None, "create x failed: ProtocolError")
    assert retry.retry_delay(no_answer, outage_failures=1, object_errors=1, rng=rng).cause == (
        "unavailable"
    )


def test_conflicts_retry_at_once_and_other_errors_back_off_per_object() -> None:
    rng = random.Random(0)
    conflict = retry.retry_delay(ApiError(409, "x"), outage_failures=0, object_errors=5, rng=rng)
    assert conflict.cause == "conflict" and conflict.delay_s < 0.5
    bug = [
        retry.retry_delay(ValueError("x"), outage_failures=0, object_errors=n, rng=rng).delay_s
        for n in (1, 2, 3, 20)
    ]
    assert bug[0] < bug[1] < bug[2] and bug[3] <= retry.ERROR_MAX_S * 1.2


def test_api_health_counts_unanswered_calls_and_resets_on_any_answer() -> None:
    health = ApiHealth()
    for _ in range(3):
        health.failed(ApiError(None, "reset"))
    health.failed(ApiError(429, "throttled"))
    assert health.failures == 4
    health.failed(ApiError(403, "forbidden"))  # an answer
    assert health.failures == 0
    health.failed(ApiError(500, "x"))
    health.answered()
    assert health.failures == 0


# ---- Events: an outbox with names derived from the transition ---------------------------------
def test_outbox_names_are_stable_for_the_same_transition_and_new_for_the_next() -> None:
    decided = [("Normal", "Planned", "4×2×8 H200"), ("Normal", "Launched", "3 Jobs")]
    first = events.outbox(None, decided, "plan", "uid-1")
    again = events.outbox(None, decided[:1], "plan", "uid-1")  # decided again after a failure
    assert first.sequence == again.sequence == 1
    assert first.pending[0].name == again.pending[0].name  # posting twice: 409, no duplicate
    assert len({p.name for p in first.pending}) == 2
    assert all(
        p.name.startswith("plan.") and len(p.name) == len("plan.") + 16 for p in first.pending
    )
    # the next transition numbers its Events afresh: the same reason again is a new Event
    later = events.outbox(events.posted(first), decided[:1], "plan", "uid-1")
    assert later.sequence == 2 and later.pending[0].name != first.pending[0].name
    # other object, other UID (a plan created again under the same name): other names
    other = events.outbox(None, decided[:1], "plan", "uid-2")
    assert other.pending[0].name != first.pending[0].name


def test_pending_events_stay_until_posted_and_nothing_is_pending_after() -> None:
    stored = events.outbox(None, [("Warning", "Infeasible", "no plan")], "p", "u")
    box = events.outbox(stored, [("Normal", "Planned", "x")], "p", "u")
    assert [p.reason for p in box.pending] == ["Infeasible", "Planned"]
    assert box.sequence == 2
    assert events.posted(box) == EventOutbox(sequence=2, pending=[])
    assert events.posted(EventOutbox()) is None
    long = events.outbox(None, [("Normal", "R", "m" * 5000)], "p", "u")
    assert len(long.pending[0].message) == events.MESSAGE_CHARS


def test_event_manifest_is_a_core_v1_event_about_the_object() -> None:
    body = {
        "apiVersion": "shardmeter.io/v1alpha1",
        "kind": "GPUPool",
        "metadata": {"name": "cluster-a", "uid": "u1"},
    }
    (pending,) = events.outbox(
        None, [("Normal", "CoefficientsMeasured", "ok")], "cluster-a", "u1"
    ).pending
    m = events.manifest(pending, body, "shardmeter-system")
    assert m["metadata"] == {"name": pending.name, "namespace": "shardmeter-system"}
    assert m["involvedObject"] == {
        "apiVersion": "shardmeter.io/v1alpha1",
        "kind": "GPUPool",
        "name": "cluster-a",
        "uid": "u1",
    }
    assert (m["type"], m["reason"], m["count"]) == ("Normal", "CoefficientsMeasured", 1)


# ---- no child for a plan that is gone ----------------------------------------------------------
class _Recorder:
    def __init__(self) -> None:
        self.created: list[str] = []

    async def create(self, manifest: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        self.created.append(manifest["metadata"]["name"])
        return manifest, True


@pytest.mark.asyncio
async def test_no_child_is_created_once_the_plans_deletion_was_seen() -> None:
    kube = _Recorder()
    manifests = [
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"j{i}", "namespace": "d"}}
        for i in range(4)
    ]
    with pytest.raises(GoneError):
        await ensure_children(
            kube,  # type: ignore[arg-type]
            manifests,
            [],
            "uid",
            "rev",
            alive=lambda: len(kube.created) < 2,  # deleted while the second was created
        )
    assert kube.created == ["j0", "j1"]


# ---- kopf: endless retries, and watch streams that fail are watched again ---------------------
def test_endless_backoffs_are_unsized_and_reiterable() -> None:
    first = list(zip(range(12), watchguard.ENDLESS_BACKOFFS, strict=False))
    again = list(zip(range(12), watchguard.ENDLESS_BACKOFFS, strict=False))
    assert first == again and len(first) == 12
    assert not hasattr(watchguard.ENDLESS_BACKOFFS, "__len__")  # kopf would count the attempts
    assert max(b for _, b in first) == 5.0


@pytest.mark.asyncio
async def test_kopf_requests_outlast_a_long_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the default backoffs kopf gives up after 9 attempts (≈ 2 minutes of an outage);
    with ENDLESS_BACKOFFS the 20th attempt, once the API answers, succeeds."""
    import kopf
    from kopf._cogs.clients import api as kopf_api
    from kopf._cogs.clients import auth, errors
    from kopf._cogs.structs import credentials

    real_sleep = asyncio.sleep
    monkeypatch.setattr(kopf_api.asyncio, "sleep", lambda *_: real_sleep(0))
    calls = {"n": 0}

    async def handler(_: aiohttp.web.Request) -> aiohttp.web.Response:
        calls["n"] += 1
        if calls["n"] < 20:
            return aiohttp.web.json_response({"kind": "Status", "code": 503}, status=503)
        return aiohttp.web.json_response({"kind": "Status", "code": 200})

    app = aiohttp.web.Application()
    app.router.add_get("/x", handler)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    vault = credentials.Vault({"x": kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}")})
    settings = kopf.OperatorSettings()
    token = auth.vault_var.set(vault)
    try:
        with pytest.raises(errors.APIServerError):
            await kopf_api.request("GET", "/x", settings=settings, logger=logging.getLogger("t"))
        assert calls["n"] == 9  # the default: 8 backoffs
        settings.networking.error_backoffs = watchguard.ENDLESS_BACKOFFS
        response = await kopf_api.request(
            "GET", "/x", settings=settings, logger=logging.getLogger("t")
        )
        assert response.status == 200 and calls["n"] == 20
    finally:
        await vault.close()
        auth.vault_var.reset(token)
        await runner.cleanup()


def test_watchguard_wraps_kopfs_list_then_watch_loop() -> None:
    from kopf._cogs.clients import watching

    watchguard.install()
    watchguard.install()  # idempotent
    assert watching.continuous_watch is watchguard._guarded
    assert watchguard._ORIGINAL is not watchguard._guarded


@pytest.mark.asyncio
async def test_a_watch_of_a_kind_gone_404_returns_instead_of_raising(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kopf._cogs.clients import errors

    async def gone(**_: Any) -> Any:
        raise errors.APINotFoundError("not served", status=404, headers={})
        yield  # an async generator

    monkeypatch.setattr(watchguard, "_ORIGINAL", gone)
    monkeypatch.setattr(watchguard, "GONE_RETRY_S", 0.0)
    seen = [e async for e in watchguard._guarded(resource="jobsets")]
    assert seen == []


# ---- logs ---------------------------------------------------------------------------------------
def test_json_logs_carry_the_traceback_text() -> None:
    stream = io.StringIO()
    log.configure("INFO", json_logs=True)
    root = logging.getLogger()
    root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        logging.getLogger("kopf.test").exception("boom")
    line = json.loads(stream.getvalue().splitlines()[-1])
    assert "traceback object" not in stream.getvalue()
    assert line["exception"].startswith("Traceback") and "ZeroDivisionError" in line["exception"]


@pytest.mark.asyncio
async def test_a_complete_listing_tells_what_it_held_and_a_cut_one_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf reports no DELETED for what a re-list no longer holds: the listener hears of every
    complete listing (then the controller forgets the rest), never of a listing cut short."""
    from kopf._cogs.clients import watching

    heard: list[tuple[str | None, set[str]]] = []
    watchguard.on_listed(
        "test.io",
        "things",
        lambda ns, listed: heard.append((ns, {o["metadata"]["uid"] for o in listed})),
    )

    class Res:
        group, plural = "test.io", "things"

    def obj(name: str) -> dict[str, Any]:
        return {"type": None, "object": {"metadata": {"namespace": "a", "name": name, "uid": name}}}

    async def complete(**_: Any) -> Any:
        yield obj("x")
        yield obj("y")
        yield watching.Bookmark.LISTED
        yield {"type": "DELETED", "object": {"metadata": {"name": "x", "uid": "x"}}}

    async def cut(**_: Any) -> Any:
        yield obj("x")  # and the connection drops: kopf's list returns without LISTED

    monkeypatch.setattr(watchguard, "_ORIGINAL", complete)
    seen = [e async for e in watchguard._guarded(resource=Res(), namespace=None)]
    assert len(seen) == 4
    assert heard == [(None, {"x", "y"})]
    monkeypatch.setattr(watchguard, "_ORIGINAL", cut)
    _ = [e async for e in watchguard._guarded(resource=Res(), namespace="a")]
    assert len(heard) == 1
