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
import contextlib
import contextvars
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Collection, Mapping
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

_denied: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "shardmeter_admission_denied", default=None
)
"""The message of the denial the current admission request raises (kopf runs an async
handler in the request's own context, and logs its outcome there)."""


def deny(message: str, body: kopf.Body, handler: str) -> kopf.AdmissionError:
    """A denial (code 400): the request is wrong, not the operator. Logged here at INFO with
    its reason, and kopf's ERROR line for it (it logs every AdmissionError as a handler that
    "failed permanently") is dropped by :class:`DenialsAreNotErrors`."""
    meta = body.get("metadata") or {}
    where = "/".join(p for p in (meta.get("namespace"), meta.get("name")) if p)
    log.info(
        "admission denied",
        handler=handler,
        obj=f"{body.get('kind', '')} {where}".strip(),
        reason=message,
    )
    _denied.set(message)
    return kopf.AdmissionError(message, code=DENIED_CODE)


class DenialsAreNotErrors(logging.Filter):
    """On kopf's object logger: drops kopf's ERROR record of the denial :func:`deny` just
    logged (same request, same message). Everything else passes — a placement that failed
    closed (code 500), a timeout, an exception in a handler — at kopf's level."""

    def filter(self, record: logging.LogRecord) -> bool:
        denied = _denied.get()
        if denied is None or record.levelno < logging.ERROR:
            return True
        if record.getMessage().endswith(f" failed permanently: {denied}"):
            _denied.set(None)
            return False
        return True


_DENIALS_FILTER = DenialsAreNotErrors()

_placing = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="admission")
"""Its own worker: an admission never queues behind a TrainingPlan's search."""


async def _in_worker(fn: Callable[..., T], *args: Any) -> T:
    def run() -> T:
        try:
            return fn(*args)
        finally:
            trim()

    return await asyncio.get_running_loop().run_in_executor(_placing, run)


SELF_SIGNED_DAYS = 3650
"""Validity of the self-signed certificate: it is made at every start of the webhook server
and never leaves the pod, and kopf does not renew it while the pod runs."""


def self_signed_certificate(
    hostnames: Collection[str], password: str | None = None
) -> tuple[bytes, bytes]:
    """A self-signed CA certificate and its private key (PEM) for ``hostnames``, as kopf's
    ``WebhookServer.build_certificate`` makes them — IP addresses as IP SANs (``0.0.0.0``
    and ``::`` left out), names as DNS SANs, the first name (else IP) as the common name —
    with PyCA ``cryptography`` instead of kopf's ``certbuilder``: that one needs
    ``oscrypto``, whose last release (1.3.0) cannot read the version of OpenSSL 3.0.10 and
    later ("Error detecting the version of libcrypto"), the OpenSSL of Debian bookworm and
    of the operator image."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ips: dict[str, ipaddress.IPv4Address | ipaddress.IPv6Address] = {}
    for name in hostnames:
        with contextlib.suppress(ValueError):  # not an address: a name
            ips[name] = ipaddress.ip_address(name)
    names = list(dict.fromkeys(n for n in hostnames if n not in ips))
    reachable = list(dict.fromkeys(ip for ip in ips.values() if not ip.is_unspecified))
    if not names and not reachable:
        raise ValueError(f"no host name or reachable address to certify in {list(hostnames)}")
    common = names[0] if names else str(reachable[0])
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans += [x509.IPAddress(ip) for ip in reachable]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little apart
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    pem_key = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    return cert.public_bytes(serialization.Encoding.PEM), pem_key


class WebhookServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server; without certificate files it makes its self-signed
    certificate with :func:`self_signed_certificate`."""

    @staticmethod
    def build_certificate(
        hostnames: Collection[str], password: str | None = None
    ) -> tuple[bytes, bytes]:
        return self_signed_certificate(hostnames, password)


class CAInjectingServer(WebhookServer):
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
    return WebhookServer(**kwargs)


Placer = Callable[..., Placement]


async def place(
    body: kopf.Body,
    memo: kopf.Memo,
    warnings: list[str],
    placer: Placer = place_jobset,
    handler: str = "place",
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
        raise deny(f"shardmeter placement: {exc}", body, handler) from None
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


def check_annotations(body: kopf.Body, handler: str = "check") -> None:
    """The validating side: an opted-in workload's annotations parse (else denied, naming
    the annotation)."""
    try:
        if notes.opted_in(body.get("metadata", {}).get("annotations") or {}):
            notes.parse(body["metadata"].get("annotations") or {})
    except SpecError as exc:
        raise deny(f"shardmeter placement: {exc}", body, handler) from None


OWNED_PREFIX = "shardmeter.io/"
"""Labels and annotations of this prefix on an admitted workload are its placement record:
the request (the opt-in annotations), the decision and the links to its TrainingPlan."""


def placement_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What an UPDATE of an admitted workload changes of its placement record: every
    ``shardmeter.io/`` label and annotation (changed, added or removed) and, for a TrainJob,
    its ``shardmeter.io/placement`` runtime patch (the pool's node selector and
    tolerations). The placed spec itself is immutable by the workloads' own APIs (JobSet's
    ``replicatedJobs``, TrainJob's ``trainer``)."""
    out = []
    for part in ("labels", "annotations"):
        before = (old.get("metadata") or {}).get(part) or {}
        after = (new.get("metadata") or {}).get(part) or {}
        for key in sorted({*before, *after}):
            if key.startswith(OWNED_PREFIX) and before.get(key) != after.get(key):
                out.append(f"metadata.{part}[{key}]")

    def ours(body: Mapping[str, Any]) -> list[Any]:
        patches = (body.get("spec") or {}).get("runtimePatches") or []
        return [p for p in patches if p.get("manager") == trainjobs.MANAGER]

    if ours(old) != ours(new):
        out.append(f"spec.runtimePatches[manager={trainjobs.MANAGER}]")
    return out


def check_update(old: Mapping[str, Any], new: kopf.Body, handler: str, warnings: list[str]) -> None:
    """UPDATE of an admitted workload: its placement record may not change, or the
    TrainingPlan recording it would describe another run (denied, naming what changed; to
    place it again, delete and re-create it). A workload stored unplaced that opts in now
    is allowed with a warning: placement happens on create only."""
    admitted = ((old.get("metadata") or {}).get("labels") or {}).get(ADMITTED_LABEL) == "true"
    if admitted:
        changed = placement_changes(old, new)
        if changed:
            raise deny(
                "shardmeter placement: the placement of an admitted workload is fixed "
                f"(recorded by its TrainingPlan); cannot change {', '.join(changed)}: "
                "delete and re-create the workload to place it again",
                new,
                handler,
            )
    elif notes.opted_in((new.get("metadata") or {}).get("annotations") or {}):
        warnings.append(
            "shardmeter: placement happens when a workload is created; this one was stored "
            "unplaced and stays so: delete and re-create it to place it"
        )


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

    kopf_objects = logging.getLogger("kopf.objects")
    if _DENIALS_FILTER not in kopf_objects.filters:
        kopf_objects.addFilter(_DENIALS_FILTER)

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
            kind: str = kind,
            **_: Any,
        ) -> None:
            placement = await place(body, memo, warnings, placer, f"place-{kind}")
            if placement is not None:
                patch.fns.append(_become(placement.workload))

        async def validate(
            body: kopf.Body,
            warnings: list[str],
            operation: str | None = None,
            old: kopf.Body | None = None,
            kind: str = kind,
            **_: Any,
        ) -> None:
            # async: kopf runs it in the request's context, where deny() marks the denial
            if operation == "UPDATE" and old is not None:
                check_update(old, body, f"check-{kind}", warnings)
            else:
                check_annotations(body, f"check-{kind}")

        kopf.on.mutate(*resource, registry=registry, id=f"place-{kind}", operations=["CREATE"])(
            mutate
        )
        kopf.on.validate(
            *resource, registry=registry, id=f"check-{kind}", operations=["CREATE", "UPDATE"]
        )(validate)
