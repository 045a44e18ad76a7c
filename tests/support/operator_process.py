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
from collections.abc import Iterator
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

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.api.kubectl(*args, input=input, check=check)

    def fetch(self, url: str) -> str:
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())


@contextlib.contextmanager
def operator_process(tmp_path: Path, recheck_s: float = 0.5) -> Iterator[Running]:
    with emulator_subprocess(tmp_path, crds_dir=REPO / "crds") as api:
        metrics_port, live_port = free_port(), free_port()
        log = tmp_path / "operator.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "shardmeter_operator",
                    "--standalone",
                    "--kubeconfig",
                    str(api.kubeconfig_path),
                    "--operator-namespace",
                    "shardmeter-system",
                    "--metrics-port",
                    str(metrics_port),
                    "--liveness",
                    f"http://127.0.0.1:{live_port}/healthz",
                    "--recheck-interval",
                    str(recheck_s),
                    "--log-json",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp_path,
            )
        running = Running(
            api,
            proc,
            f"http://127.0.0.1:{metrics_port}/metrics",
            f"http://127.0.0.1:{live_port}/healthz",
            log,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    running.fetch(running.liveness_url)
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"operator did not start:\n{log.read_text()[-3000:]}"
                        ) from None
                    time.sleep(0.1)
            yield running
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
