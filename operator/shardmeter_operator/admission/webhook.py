"""kopf's side of placement at admission, thin: the webhook server, the mutating handler
that places an opted-in JobSet on create (:func:`~.placement.place_jobset`, in a worker
thread, bounded by ``--admission-timeout``; out of time it fails open or closed as
configured), the validating handler that refuses bad annotations naming them, and the step
after the workload is stored: its TrainingPlan and lighthouse, owned by it
(:func:`~.placement.admitted_children`).

The webhook configurations (which namespaces, ``failurePolicy``, ``timeoutSeconds``) are the
Helm chart's, not kopf's managed ones: kopf's carry no ``namespaceSelector``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import kopf
import structlog

from shardmeter.errors import SpecError
from shardmeter_operator.admission import annotations as notes
from shardmeter_operator.admission import trainjob as trainjobs
from shardmeter_operator.admission.placement import (
    ADMITTED_LABEL,
    Placement,
    PlacementRefusedError,
    admitted_children,
    default_pools,
    place_jobset,
)
from shardmeter_operator.api import GROUP, VERSION
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.k8s.client import ApiError, Kube
from shardmeter_operator.k8s.documents import read_documents
from shardmeter_operator.render.jobset import GROUP as JOBSET_GROUP
from shardmeter_operator.render.jobset import VERSION as JOBSET_VERSION
from shardmeter_operator.worker import trim

T = TypeVar("T")
JOBSETS = (JOBSET_GROUP, JOBSET_VERSION, "jobsets")
TRAINJOBS = (trainjobs.GROUP, trainjobs.VERSION, "trainjobs")
DENIED_CODE = 400
"""HTTP code of a denial: the request is wrong (kube-apiserver answers it to the client)."""
INJECT_ATTEMPTS, INJECT_INTERVAL_S = 240, 0.5
log = structlog.get_logger("shardmeter_operator")

_placing = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="admission")
"""Its own worker: an admission never queues behind a TrainingPlan's search."""


async def _in_worker(fn: Callable[..., T], *args: Any) -> T:
    def run() -> T:
        try:
            return fn(*args)
        finally:
            trim()

    return await asyncio.get_running_loop().run_in_executor(_placing, run)


class CAInjectingServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server that, each time it (re)starts with a certificate, sets
    that certificate's CA as ``caBundle`` of the chart's webhook configurations — what
    cert-manager's CA injector does on the cert-manager path."""

    def __init__(self, *, kube: Kube, configuration: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kube, self.configuration = kube, configuration
        self._injecting: asyncio.Task[None] | None = None

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for client_config in super().__call__(fn):
            ca = client_config.get("caBundle")
            if ca:
                if self._injecting is not None:
                    self._injecting.cancel()
                self._injecting = asyncio.create_task(self._inject(ca))
            yield client_config

    async def _inject(self, ca: str) -> None:
        """Until both configurations carry ``ca`` (they may be created after the pod starts)."""
        kinds = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
        for _ in range(INJECT_ATTEMPTS):
            try:
                kinds = [
                    k
                    for k in kinds
                    if not await self.kube.set_webhook_ca(k, self.configuration, ca)
                ]
            except ApiError as exc:
                log.warning("cannot set the webhook caBundle", error=str(exc))
            if not kinds:
                return
            await asyncio.sleep(INJECT_INTERVAL_S)
        log.warning("webhook configurations not found", name=self.configuration, kinds=kinds)


def webhook_server(cfg: OperatorConfig, kube: Kube) -> kopf.WebhookServer:
    """HTTPS on ``--admission-port``: cert-manager's certificate from ``--admission-cert-dir``,
    else kopf's self-signed one for ``--admission-host``; with ``--admission-inject-ca`` the
    server sets its CA in the webhook configurations of that name."""
    kwargs: dict[str, Any] = {
        "addr": "0.0.0.0",  # the webhook Service reaches the pod
        "port": cfg.admission_port,
        "host": cfg.admission_host or None,
    }
    if cfg.admission_cert_dir:
        kwargs["certfile"] = os.path.join(cfg.admission_cert_dir, "tls.crt")
        kwargs["pkeyfile"] = os.path.join(cfg.admission_cert_dir, "tls.key")
    if cfg.admission_host:
        kwargs["extra_sans"] = [cfg.admission_host.split(".")[0], cfg.admission_host]
    if cfg.admission_inject_ca:
        return CAInjectingServer(kube=kube, configuration=cfg.admission_inject_ca, **kwargs)
    return kopf.WebhookServer(**kwargs)


Placer = Callable[..., Placement]


async def place(
    body: kopf.Body, memo: kopf.Memo, warnings: list[str], placer: Placer = place_jobset
) -> Placement | None:
    """The placement of an opted-in workload by ``placer`` (None: not opted in, or failed
    open). Raises :class:`kopf.AdmissionError` to deny, with the annotation or field to
    change."""
    cfg: OperatorConfig = memo.config
    try:
        if not notes.opted_in(body.get("metadata", {}).get("annotations") or {}):
            return None
        return await asyncio.wait_for(_place(dict(body), memo, placer), cfg.admission_timeout_s)
    except (PlacementRefusedError, SpecError) as exc:
        raise kopf.AdmissionError(f"shardmeter placement: {exc}", code=DENIED_CODE) from None
    except TimeoutError:
        reason = f"placement did not decide within {cfg.admission_timeout_s:g} s"
    except Exception as exc:  # an API outage, a bug: the configured policy
        reason = f"placement failed: {type(exc).__name__}: {exc}"[:500]
    if cfg.admission_failure == "open":
        warnings.append(f"shardmeter: {reason}; admitted unplaced")
        return None
    raise kopf.AdmissionError(f"shardmeter placement: {reason}", code=500)


async def _place(body: dict[str, Any], memo: kopf.Memo, placer: Placer) -> Placement:
    cfg: OperatorConfig = memo.config
    kube: Kube = memo.kube
    ctl = memo.controller
    meta = body.get("metadata") or {}
    request = notes.parse(meta.get("annotations") or {})
    if not ctl.pools_known.is_set():  # just started, or a replica that does not lead (its
        # watches are paused): the pools the workload names, or every pool, from the API
        if request.pools:
            for name in request.pools:
                if name not in ctl.pools:
                    pool = await kube.get_custom(GROUP, VERSION, "gpupools", None, name)
                    if pool is not None:
                        ctl.observe_pool(pool)
        else:
            for pool in await kube.list_cluster_custom(GROUP, VERSION, "gpupools"):
                ctl.observe_pool(pool)
    model: Any = request.model
    if request.model_configmap is not None:
        cm = await kube.get("v1", "ConfigMap", meta.get("namespace"), request.model_configmap)
        model = notes.model_from_configmap(request.model_configmap, cm)
    pools = dict(ctl.pools)
    names = list(request.pools) or default_pools(pools)
    documents, doc_notes = await read_documents(names, cfg, kube)
    return await _in_worker(
        functools.partial(placer, document_notes=doc_notes),
        body,
        request,
        model,
        pools,
        documents,
        cfg,
    )


def _become(desired: dict[str, Any]) -> Callable[[Any], None]:
    def fn(raw: Any) -> None:
        raw.clear()
        raw.update(desired)

    return fn


def check_annotations(body: kopf.Body) -> None:
    """The validating side: an opted-in workload's annotations parse (else denied, naming
    the annotation)."""
    try:
        if notes.opted_in(body.get("metadata", {}).get("annotations") or {}):
            notes.parse(body["metadata"].get("annotations") or {})
    except SpecError as exc:
        raise kopf.AdmissionError(f"shardmeter placement: {exc}", code=DENIED_CODE) from None


def register(registry: kopf.OperatorRegistry, *, webhooks: bool) -> None:
    """The step after an admitted workload is stored, and — with ``webhooks``
    (``--admission-port``; kopf refuses admission handlers without a server) — the server
    and the admission handlers of JobSets and TrainJobs."""
    admitted = {ADMITTED_LABEL: "true"}

    async def create_children(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        """Once the placed workload is stored: its TrainingPlan and lighthouse (409: there)."""
        if type not in (None, "ADDED"):
            return
        kube: Kube = memo.kube
        for manifest in admitted_children(dict(body), memo.config):
            await kube.create(manifest)

    kopf.on.event(*JOBSETS, registry=registry, id="admitted-jobset", labels=admitted)(
        create_children
    )
    kopf.on.event(*TRAINJOBS, registry=registry, id="admitted-trainjob", labels=admitted)(
        create_children
    )
    if not webhooks:
        return

    @kopf.on.startup(registry=registry, id="admission-server")
    async def serve(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.admission.server = webhook_server(memo.config, memo.kube)

    for resource, kind, placer in [
        (JOBSETS, "jobset", place_jobset),
        (TRAINJOBS, "trainjob", trainjobs.place_trainjob),
    ]:

        async def mutate(
            body: kopf.Body,
            patch: kopf.Patch,
            memo: kopf.Memo,
            warnings: list[str],
            placer: Placer = placer,
            **_: Any,
        ) -> None:
            placement = await place(body, memo, warnings, placer)
            if placement is not None:
                patch.fns.append(_become(placement.workload))

        def validate(body: kopf.Body, **_: Any) -> None:
            check_annotations(body)

        kopf.on.mutate(*resource, registry=registry, id=f"place-{kind}", operations=["CREATE"])(
            mutate
        )
        kopf.on.validate(*resource, registry=registry, id=f"check-{kind}", operations=["CREATE"])(
            validate
        )
