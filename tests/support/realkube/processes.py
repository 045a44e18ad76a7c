"""The control plane's processes: started with their output in a log file, killed if the test
process dies (``PR_SET_PDEATHSIG``), stopped by PID — SIGTERM, then SIGKILL — at teardown."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, context: ssl.SSLContext | None = None, timeout_s: float = 2) -> str:
    """GET a loopback URL's body; an error status raises (its response closed: no leak)."""
    try:
        with urllib.request.urlopen(
            url, context=context, timeout=timeout_s
        ) as response:  # loopback URLs made here
            return str(response.read().decode())
    except urllib.error.HTTPError as error:
        error.close()
        raise


class StartError(RuntimeError):
    """A process exited or did not become ready; the message ends with its log's tail."""


@dataclass
class Process:
    """One started process. ``stop()`` is idempotent."""

    name: str
    argv: Sequence[str]
    log_path: Path
    popen: subprocess.Popen[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def check_running(self) -> None:
        if self.popen.poll() is not None:
            raise StartError(
                f"{self.name} exited with {self.popen.returncode}; {self.log_path}:\n"
                + self.log_tail()
            )

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``ready()`` (exceptions count as not ready) until it holds or the process dies."""
        deadline = time.monotonic() + timeout_s
        last: BaseException | None = None
        while time.monotonic() < deadline:
            self.check_running()
            try:
                if ready():
                    return
            except Exception as exc:  # not ready yet: connection refused, 5xx, …
                last = exc
            time.sleep(0.1)
        raise StartError(
            f"{self.name} was not {what} within {timeout_s:.0f} s (last: {last!r}); "
            f"{self.log_path}:\n{self.log_tail()}"
        )

    def stop(self, grace_s: float = 10) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


def start(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Process:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            preexec_fn=_die_with_parent,  # noqa: PLW1509  # prctl only, no locks taken
        )
    return Process(name, argv, log_path, popen)


@contextlib.contextmanager
def stopping(processes: list[Process]) -> Iterator[list[Process]]:
    """Stop every process in ``processes`` (as it is at exit), last started first."""
    try:
        yield processes
    finally:
        for process in reversed(processes):
            process.stop()
