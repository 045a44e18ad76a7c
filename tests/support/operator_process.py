"""Run the real operator as a subprocess against the emulated API server (also a
subprocess), for black-box tests and the operator benchmark."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from support.cluster import EmulatorProcess, emulator_subprocess

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    api: EmulatorProcess
    operator: subprocess.Popen[bytes]
    metrics_url: str
    liveness_url: str
    log: Path
    argv: list[str]

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.api.kubectl(*args, input=input, check=check)

    def fetch(self, url: str) -> str:
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())

    def stop(self, timeout_s: float = 15) -> int:
        """SIGTERM the operator and wait; its exit code."""
        self.operator.terminate()
        try:
            return self.operator.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.operator.kill()
            return self.operator.wait()

    def restart(self) -> None:
        """Stop the operator and start a new one, same flags, same API server; the log goes on."""
        self.stop()
        self.operator = _start(self.argv, self.log)
        self.wait_live()

    def wait_live(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.fetch(self.liveness_url)
                return
            except OSError:
                if self.operator.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"operator did not start:\n{self.log.read_text()[-3000:]}"
                    ) from None
                time.sleep(0.1)


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent)


@contextlib.contextmanager
def operator_process(
    tmp_path: Path,
    recheck_s: float = 0.5,
    *,
    via: Callable[[EmulatorProcess], Path] | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[Running]:
    """The emulated API server and the operator, both subprocesses. ``via(api)`` gives the
    kubeconfig the operator uses (e.g. one pointing at a fault proxy in front of ``api``);
    by default the emulator's own."""
    with emulator_subprocess(tmp_path, crds_dir=REPO / "crds") as api:
        kubeconfig = via(api) if via is not None else api.kubeconfig_path
        metrics_port, live_port = free_port(), free_port()
        log = tmp_path / "operator.log"
        argv = [
            sys.executable,
            "-m",
            "shardmeter_operator",
            "--standalone",
            "--kubeconfig",
            str(kubeconfig),
            "--operator-namespace",
            "shardmeter-system",
            "--metrics-port",
            str(metrics_port),
            "--liveness",
            f"http://127.0.0.1:{live_port}/healthz",
            "--recheck-interval",
            str(recheck_s),
            "--log-json",
            *extra_args,
        ]
        log.write_bytes(b"")
        running = Running(
            api,
            _start(argv, log),
            f"http://127.0.0.1:{metrics_port}/metrics",
            f"http://127.0.0.1:{live_port}/healthz",
            log,
            argv,
        )
        try:
            running.wait_live()
            yield running
        finally:
            running.stop()
