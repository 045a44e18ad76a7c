"""Dynamic admission in the emulated API server (``support/admission.py``), against small
HTTPS webhooks of the test's own: the review kube-apiserver sends, a JSONPatch applied, a
denial's status, ``namespaceSelector``, ``failurePolicy`` for a webhook that is down or too slow
(``timeoutSeconds``), a wrong response ``uid``, dry run and ``sideEffects``."""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp.web
import pytest
import pytest_asyncio

from support.admission import Admission, ca_bundle, self_signed_certificate
from support.cluster import EmulatedCluster, running_emulator

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
Answer = Callable[[dict[str, Any]], Any]


def config_map(name: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"a": "1"},
    }


@pytest_asyncio.fixture
async def cluster(tmp_path: pathlib.Path) -> AsyncIterator[EmulatedCluster]:
    async with running_emulator(tmp_path=tmp_path) as cluster:
        yield cluster
        assert not cluster.emulator.failures


@pytest_asyncio.fixture
async def webhook(tmp_path: pathlib.Path) -> AsyncIterator[Any]:
    """An HTTPS webhook answering with ``server.answer(request)`` (async allowed)."""
    crt, key = self_signed_certificate(tmp_path / "certs", ["127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(crt, key)

    class Server:
        answer: Answer = staticmethod(lambda req: {"allowed": True})
        seen: list[dict[str, Any]] = []  # noqa: RUF012
        ca = ca_bundle(crt)
        url = ""

    async def handle(request: aiohttp.web.Request) -> aiohttp.web.Response:
        review = await request.json()
        Server.seen.append(review)
        response = Server.answer(review["request"])
        if asyncio.iscoroutine(response):
            response = await response
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
        body["response"] = {"uid": review["request"]["uid"], **response}
        return aiohttp.web.json_response(body)

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.post("/hook", handle)])
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    Server.url = f"https://127.0.0.1:{port}/hook"
    yield Server
    await runner.cleanup()


def configuration(
    kind: str, url: str, ca: str, *, failure: str = "Fail", timeout_s: int = 2, **hook: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": "test"},
        "webhooks": [
            {
                "name": "hook.test.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": url, "caBundle": ca},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["configmaps"],
                    }
                ],
                "failurePolicy": failure,
                "sideEffects": "None",
                "timeoutSeconds": timeout_s,
                **hook,
            }
        ],
    }


async def create(cluster: EmulatedCluster, body: dict[str, Any], **params: str) -> Any:
    ns = body["metadata"]["namespace"]
    return await cluster.api("POST", f"/api/v1/namespaces/{ns}/configmaps", body, params=params)


async def test_a_mutating_webhook_patches_what_is_stored(
    cluster: EmulatedCluster, webhook: Any
) -> None:
    admission = Admission.install(cluster.emulator)
    cluster.apply(configuration("MutatingWebhookConfiguration", webhook.url, webhook.ca))
    patch = [{"op": "add", "path": "/data/b", "value": "2"}]
    webhook.answer = lambda req: {
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
    }
    status, body = await create(cluster, config_map("one"))
    assert status == 201 and body["data"] == {"a": "1", "b": "2"}
    (review,) = webhook.seen
    request = review["request"]
    assert review["apiVersion"] == "admission.k8s.io/v1" and request["operation"] == "CREATE"
    assert request["resource"] == {"group": "", "version": "v1", "resource": "configmaps"}
    assert request["object"]["metadata"]["name"] == "one" and request["dryRun"] is False
    assert [r.webhook for r in admission.reviews] == ["hook.test.io"]


async def test_a_denial_answers_with_the_webhooks_message(
    cluster: EmulatedCluster, webhook: Any
) -> None:
    Admission.install(cluster.emulator)
    cluster.apply(configuration("ValidatingWebhookConfiguration", webhook.url, webhook.ca))
    webhook.answer = lambda req: {"allowed": False, "status": {"code": 200, "message": "no a"}}
    status, body = await create(cluster, config_map("one"))
    assert status == 400  # at least 400, whatever the webhook said
    assert body["message"] == 'admission webhook "hook.test.io" denied the request: no a'
    assert cluster.get("configmaps", "default", "one") is None


async def test_the_namespace_selector_picks_the_namespaces(
    cluster: EmulatedCluster, webhook: Any
) -> None:
    Admission.install(cluster.emulator)
    selector = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    cluster.apply(
        configuration(
            "ValidatingWebhookConfiguration",
            webhook.url,
            webhook.ca,
            namespaceSelector=selector,
        )
    )
    webhook.answer = lambda req: {"allowed": False}
    status, _ = await create(cluster, config_map("one", "other"))
    assert status == 201 and webhook.seen == []


@pytest.mark.parametrize("failure", ["Fail", "Ignore"])
async def test_a_webhook_down_or_too_slow_follows_the_failure_policy(
    cluster: EmulatedCluster, webhook: Any, failure: str
) -> None:
    Admission.install(cluster.emulator)

    async def slow(req: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(1.5)
        return {"allowed": False}

    webhook.answer = slow
    down = "https://127.0.0.1:9/hook"  # the discard port: nothing listens
    cases = [
        (down, webhook.ca, 2, "connect"),
        (webhook.url, webhook.ca, 1, "context deadline exceeded"),  # 1.5 s > timeoutSeconds
        (webhook.url, ca_bundle_of_another(), 2, "certificate"),
    ]
    for i, (url, ca, timeout_s, why) in enumerate(cases):
        cluster.apply(
            configuration(
                "MutatingWebhookConfiguration", url, ca, failure=failure, timeout_s=timeout_s
            )
        )
        status, body = await create(cluster, config_map(f"cm{i}"))
        if failure == "Fail":
            assert status == 500, body
            assert 'failed calling webhook "hook.test.io"' in body["message"]
            assert why in body["message"], body["message"]
        else:
            assert status == 201, body


async def test_a_wrong_uid_or_a_dry_run_with_side_effects_is_refused(
    cluster: EmulatedCluster, webhook: Any
) -> None:
    Admission.install(cluster.emulator)
    cluster.apply(configuration("MutatingWebhookConfiguration", webhook.url, webhook.ca))
    webhook.answer = lambda req: {"allowed": True, "uid": "not-it"}
    status, body = await create(cluster, config_map("one"))
    assert status == 500 and "expected response.uid" in body["message"]
    hook = configuration("MutatingWebhookConfiguration", webhook.url, webhook.ca)
    hook["webhooks"][0]["sideEffects"] = "Some"
    cluster.apply(hook)
    status, body = await create(cluster, config_map("two"), dryRun="All")
    assert status == 400 and "does not support dry run" in body["message"]


_OTHER: list[str] = []


def ca_bundle_of_another() -> str:
    """A CA bundle that did not sign the webhook's certificate."""
    if not _OTHER:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            crt, _ = self_signed_certificate(d, ["127.0.0.1"])
            _OTHER.append(ca_bundle(crt))
    return _OTHER[0]
