"""Run the pods of rendered manifests as local processes, the way a kubelet would start them.

* a Job's pods (one per completion index) and a Deployment's pod (one replica) run their
  first container's ``command`` + ``args`` with its ``env``, after Kubernetes' ``$(VAR)``
  expansion; ``fieldRef`` values (the pod's labels and annotations, namespace, name) are
  filled in the way the Job controller and the kubelet fill them — an Indexed Job's pods get
  ``batch.kubernetes.io/job-completion-index`` (label and annotation) and ``job-name``;
* a JobSet is first expanded as JobSet would: its webhook's defaults, then its controller's
  child Jobs (JobSet's labels and annotations — ``job-index``, ``job-global-index``… — on
  each pod template, the pod ``subdomain``) and its headless Service
  (``support.jobset``: the same code as the simulated JobSet controller);
* the cluster network becomes loopback: every port a Service declares gets a free local
  port, and so does every container port of a JobSet's child Job (a JobSet's Service has no
  ports; each Job's pods own theirs); a Service's DNS names (``svc``, ``svc.ns``,
  ``svc.ns.svc[.cluster.local]``, and ``<pod>.svc.ns.svc…`` under a headless Service) become
  ``127.0.0.1``; inside a pod, a value that is one of its own ports, or a wildcard bind
  (``[::]:P``, ``0.0.0.0:P``) on one, becomes that port's local port, and ``<pod>.svc…:P`` the
  local port of that pod's P — on one host every pod shares the loopback interface, where in a
  cluster each has its own address.

Nothing else of the manifests is changed: what the processes see is what the pods would.
"""

from __future__ import annotations

import contextlib
import copy
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

from support import jobset

Manifest = dict[str, Any]
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME_KEY = jobset.JOBSET_NAME_KEY
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
    """The Services of the manifests, each port mapped to a free port on 127.0.0.1, and the
    container ports of JobSets' child Jobs, per Job."""

    namespace: str
    services: list[Manifest]
    ports: dict[tuple[str, int], int] = field(default_factory=dict)
    job_ports: dict[str, dict[int, int]] = field(default_factory=dict)
    """Job name → container port → local port (a JobSet's child Jobs)."""

    def __post_init__(self) -> None:
        for svc in self.services:
            for p in svc["spec"].get("ports") or []:
                self.ports[(svc["metadata"]["name"], int(p["port"]))] = free_port()

    def add_job(self, job: Manifest) -> None:
        containers = job["spec"]["template"]["spec"]["containers"]
        ports = {int(p["containerPort"]) for c in containers for p in c.get("ports") or []}
        self.job_ports[job["metadata"]["name"]] = {p: free_port() for p in sorted(ports)}

    def job_of_host(self, host: str) -> str | None:
        """The Job whose pod ``host`` names (``<job>-<index>`` under a headless Service)."""
        pod = host.split(".", 1)[0]
        job = re.sub(r"-[0-9]+$", "", pod)
        return job if job != pod and job in self.job_ports else None

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

    def own_ports(self, services: Sequence[str], job: str | None) -> dict[int, int]:
        """The local ports of what a pod listens on: its Services' ports, its Job's ports."""
        own = {port: local for (svc, port), local in self.ports.items() if svc in services}
        return {**own, **(self.job_ports.get(job or "") or {})}

    def rewrite(self, value: str, own_ports: Mapping[int, int]) -> str:
        if value.isdigit() and int(value) in own_ports:
            return str(own_ports[int(value)])
        if self.service_of_host(value) is not None:
            return "127.0.0.1"

        def host_port(m: re.Match[str]) -> str:
            host, port = m.group(1), int(m.group(2))
            if host in ("[::]", "0.0.0.0") and port in own_ports:
                return f"127.0.0.1:{own_ports[port]}"
            job = self.job_of_host(host)
            if job is not None and port in self.job_ports[job]:
                return f"127.0.0.1:{self.job_ports[job][port]}"
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


def _job_pods(job: Manifest) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """(pod name, labels, fieldRef values) of each pod of an Indexed Job, as the Job
    controller creates them and the kubelet fills the downward API."""
    meta, spec = job["metadata"], job["spec"]
    template_meta = spec["template"].get("metadata", {})
    ns = meta["namespace"]
    out = []
    for k in range(int(spec.get("completions", 1))):
        pod = f"{meta['name']}-{k}"  # its hostname (the pod's name has a random suffix)
        index = {COMPLETION_INDEX_LABEL: str(k)}
        labels = {
            **template_meta.get("labels", {}),
            "job-name": meta["name"],
            "batch.kubernetes.io/job-name": meta["name"],
            **index,
        }
        annotations = {**template_meta.get("annotations", {}), **index}
        fields = {"metadata.namespace": ns, "metadata.name": pod}
        fields |= {f"metadata.labels['{key}']": v for key, v in labels.items()}
        fields |= {f"metadata.annotations['{key}']": v for key, v in annotations.items()}
        out.append((pod, labels, fields))
    return out


def _pods_of(m: Manifest) -> list[tuple[str, dict[str, str], dict[str, str], Manifest]]:
    """(pod name, labels, fieldRef values, its pod template) of each pod the controllers
    would create."""
    if m["kind"] == "Job":
        return [(*pod, m["spec"]["template"]) for pod in _job_pods(m)]
    if m["kind"] == "Deployment":
        meta = m["metadata"]
        labels = dict(m["spec"]["template"].get("metadata", {}).get("labels", {}))
        pod = f"{meta['name']}-0"
        fields = {"metadata.namespace": meta["namespace"], "metadata.name": pod}
        return [(pod, labels, fields, m["spec"]["template"])]
    return []


def expand_jobsets(manifests: Sequence[Manifest]) -> list[Manifest]:
    """The manifests with each JobSet replaced by what JobSet makes of it: its child Jobs and
    its headless Service (the webhook's defaults applied, a stand-in UID)."""
    out: list[Manifest] = []
    for m in manifests:
        if m["kind"] != "JobSet":
            out.append(m)
            continue
        js = copy.deepcopy(m)
        js["metadata"]["uid"] = f"uid-{js['metadata']['name']}"
        jobset.default(js)
        out += [*jobset.construct_jobs(js), jobset.headless_service(js)]
    return out


def local_pods(
    manifests: Sequence[Manifest], namespace: str, net: Loopback | None = None
) -> tuple[list[LocalPod], Loopback]:
    """Every pod of the Jobs, Deployments and JobSets in ``manifests``, ready to start
    (``net``: the loopback of an earlier call, for pods of recreated Jobs that must reach
    the same Services and peers)."""
    objects = expand_jobsets(manifests)
    if net is None:
        net = Loopback(namespace, [m for m in objects if m["kind"] == "Service"])
    for m in objects:
        labels = m["metadata"].get("labels", {})
        known = m["metadata"]["name"] in net.job_ports
        if m["kind"] == "Job" and JOBSET_NAME_KEY in labels and not known:
            net.add_job(m)
    pods = []
    for m in objects:
        for name, labels, fields, template in _pods_of(m):
            container = template["spec"]["containers"][0]
            env: dict[str, str] = {}
            for e in container.get("env") or []:
                if "value" in e:
                    env[e["name"]] = expand(str(e["value"]), env)
                else:
                    path = e["valueFrom"]["fieldRef"]["fieldPath"]
                    env[e["name"]] = fields[path]  # KeyError: a fieldRef no kubelet would fill
            own = net.own_ports(net.own_services(labels), m["metadata"]["name"])
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
