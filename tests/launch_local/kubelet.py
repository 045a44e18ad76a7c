"""Run the pods of rendered manifests as local processes, the way a kubelet would start them.

* a Job's pods (one per completion index) and a Deployment's pod (one replica) run their
  first container's ``command`` + ``args`` with its ``env``, after Kubernetes' ``$(VAR)``
  expansion; ``fieldRef`` values (completion index, namespace, pod name) are filled in the
  way the Job controller and the kubelet fill them;
* the cluster network becomes loopback: every port a Service declares gets a free local
  port; a Service's DNS names (``svc``, ``svc.ns``, ``svc.ns.svc[.cluster.local]``, and
  ``<pod>.svc.ns.svc…`` under a headless Service) become ``127.0.0.1``; inside a pod, a
  value that is one of its own Service's ports, or a wildcard bind (``[::]:P``,
  ``0.0.0.0:P``) on one, becomes that Service port's local port — on one host every pod
  shares the loopback interface, where in a cluster each has its own address.

Nothing else of the manifests is changed: what the processes see is what the pods would.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Manifest = dict[str, Any]
COMPLETION_INDEX_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' dependent-variable expansion: ``$(NAME)`` → its value when NAME is
    defined (left as written otherwise), ``$$`` → ``$``."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Loopback:
    """The Services of the manifests, each port mapped to a free port on 127.0.0.1."""

    namespace: str
    services: list[Manifest]
    ports: dict[tuple[str, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for svc in self.services:
            for p in svc["spec"]["ports"]:
                self.ports[(svc["metadata"]["name"], int(p["port"]))] = free_port()

    def service_of_host(self, host: str) -> str | None:
        for svc in self.services:
            name = svc["metadata"]["name"]
            suffixes = (f"{name}.{self.namespace}.svc", f"{name}.{self.namespace}")
            if host == name or any(
                host in (s, f"{s}.cluster.local") or host.endswith("." + s) for s in suffixes
            ):
                return str(name)
        return None

    def own_services(self, labels: Mapping[str, str]) -> list[str]:
        return [
            s["metadata"]["name"]
            for s in self.services
            if s["spec"].get("selector")
            and all(labels.get(k) == v for k, v in s["spec"]["selector"].items())
        ]

    def rewrite(self, value: str, own: Sequence[str]) -> str:
        own_ports = {port: local for (svc, port), local in self.ports.items() if svc in own}
        if value.isdigit() and int(value) in own_ports:
            return str(own_ports[int(value)])
        if self.service_of_host(value) is not None:
            return "127.0.0.1"

        def host_port(m: re.Match[str]) -> str:
            host, port = m.group(1), int(m.group(2))
            if host in ("[::]", "0.0.0.0") and port in own_ports:
                return f"127.0.0.1:{own_ports[port]}"
            svc = self.service_of_host(host)
            if svc is not None and (svc, port) in self.ports:
                return f"127.0.0.1:{self.ports[(svc, port)]}"
            return m.group(0)

        return re.sub(r"(\[::\]|[A-Za-z0-9.-]+):(\d+)", host_port, value)


@dataclass
class LocalPod:
    name: str
    argv: list[str]
    env: dict[str, str]
    """The container's environment, as resolved and rewritten for loopback."""


def _pods_of(m: Manifest) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """(pod name, labels, fieldRef values) of each pod the controller would create."""
    if m["kind"] not in ("Job", "Deployment"):
        return []
    meta, spec = m["metadata"], m["spec"]
    labels = dict(spec["template"].get("metadata", {}).get("labels", {}))
    ns = meta["namespace"]
    if m["kind"] == "Job":
        out = []
        for k in range(int(spec.get("completions", 1))):
            pod = f"{meta['name']}-{k}"
            pod_labels = {
                **labels,
                "job-name": meta["name"],
                "batch.kubernetes.io/job-completion-index": str(k),
            }
            fields = {COMPLETION_INDEX_PATH: str(k), "metadata.namespace": ns, "metadata.name": pod}
            out.append((pod, pod_labels, fields))
        return out
    pod = f"{meta['name']}-0"
    return [(pod, labels, {"metadata.namespace": ns, "metadata.name": pod})]


def local_pods(manifests: Sequence[Manifest], namespace: str) -> tuple[list[LocalPod], Loopback]:
    """Every pod of the Jobs and Deployments in ``manifests``, ready to start."""
    net = Loopback(namespace, [m for m in manifests if m["kind"] == "Service"])
    pods = []
    for m in manifests:
        for name, labels, fields in _pods_of(m):
            container = m["spec"]["template"]["spec"]["containers"][0]
            env: dict[str, str] = {}
            for e in container.get("env") or []:
                if "value" in e:
                    env[e["name"]] = expand(str(e["value"]), env)
                else:
                    path = e["valueFrom"]["fieldRef"]["fieldPath"]
                    env[e["name"]] = fields[path]  # KeyError: a fieldRef no kubelet would fill
            own = net.own_services(labels)
            env = {k: net.rewrite(v, own) for k, v in env.items()}
            argv = [
                net.rewrite(expand(str(a), env), own)
                for a in [*(container.get("command") or []), *(container.get("args") or [])]
            ]
            pods.append(LocalPod(name, argv, env))
    return pods, net


@dataclass
class Running:
    pod: LocalPod
    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def run_pods(
    pods: Sequence[LocalPod], workdir: Path, base_env: Mapping[str, str]
) -> Iterator[list[Running]]:
    """Start every pod (its own session and process group, output to ``workdir/NAME.log``);
    on exit, terminate each process group, then kill what is left."""
    running: list[Running] = []
    try:
        for pod in pods:
            log = workdir / f"{pod.name}.log"
            cwd = workdir / pod.name
            cwd.mkdir(parents=True, exist_ok=True)
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    pod.argv,
                    env={**base_env, **pod.env},
                    cwd=cwd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            running.append(Running(pod, proc, log))
        yield running
    finally:
        for r in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(r.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for r in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(r.process.pid, signal.SIGKILL)  # stragglers of the group, if any
            r.process.wait()


def trainer_argv(argv: Sequence[str], module: str = "torchtitan.train") -> list[str]:
    """What torchrun hands to ``-m module``: the trainer's own arguments."""
    at = list(argv).index(module)
    if at == 0 or argv[at - 1] != "-m":
        raise ValueError(f"no `-m {module}` in {argv}")
    return list(argv[at + 1 :])
