"""What a real-cluster test holds: :class:`RealCluster`, the emulated cluster's helpers
(``get``, ``list``, ``apply``, ``kubectl``, ``wait_for``, ``set_job_running`` …) over a real API
server, and :class:`Plane`, one started control plane with JobSet and Kueue.

There is no kubelet: the Job controller makes a Job's pods, and a test says what became of them
by patching their status, as a kubelet would (``set_job_running`` / ``_succeeded`` /
``_failed``); the real Job controller then updates the Job."""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from support.cluster import akubectl, wait_for

from .client import ApiError, Body, KubeClient
from .controlplane import ControlPlane
from .processes import Process

T = TypeVar("T")
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RealCluster(KubeClient):
    """A real API server through the same helpers as ``support.cluster.EmulatedCluster``."""

    def __init__(self, kubeconfig_path: Path, plane: ControlPlane | None = None) -> None:
        super().__init__(kubeconfig_path)
        self.plane = plane

    async def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> Any:
        return await akubectl(
            *args, kubeconfig=self.kubeconfig_path, input=input, check=check, timeout=timeout
        )

    async def wait_for(
        self, fn: Callable[[], T | Awaitable[T]], timeout: float = 30, message: str = ""
    ) -> T:
        return await wait_for(fn, timeout=timeout, interval=0.1, message=message)

    # ---- what a kubelet would do -----------------------------------------------------------
    def job_pods(self, namespace: str, job: str) -> list[Body]:
        pods = self.list("pods", namespace, label_selector=f"{JOB_NAME_LABEL}={job}")
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def _wait_pods(self, namespace: str, job: str, timeout_s: float = 30) -> list[Body]:
        """The pods the Job controller made for every index it runs now."""
        deadline = time.monotonic() + timeout_s
        while True:
            obj = self.get("jobs", namespace, job)
            if obj is None:
                raise LookupError(f"Job {namespace}/{job} does not exist")
            spec = obj["spec"]
            want = min(spec.get("parallelism", 1), spec.get("completions") or 1)
            pods = [p for p in self.job_pods(namespace, job) if _phase(p) in ("Pending", "Running")]
            if not spec.get("suspend") and len(pods) >= want:
                return pods
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Job {namespace}/{job}: {len(pods)}/{want} pods after {timeout_s} s "
                    f"(suspend={spec.get('suspend')})"
                )
            time.sleep(0.1)

    def set_pod_phase(self, pod: Body, phase: str, exit_code: int = 0, reason: str = "") -> Body:
        containers = pod["spec"]["containers"]
        now = _now()
        if phase == "Running":
            state: Body = {"running": {"startedAt": now}}
        else:
            state = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                    "startedAt": now,
                    "finishedAt": now,
                }
            }
        ready = phase == "Running"
        status = {
            "phase": phase,
            "startTime": now,
            "conditions": [
                {"type": t, "status": str(ready), "lastTransitionTime": now}
                for t in ("Ready", "ContainersReady")
            ]
            + [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": "",
                    "ready": ready,
                    "restartCount": 0,
                    "started": ready,
                    "state": state,
                }
                for c in containers
            ],
        }
        return self.patch(
            "pods",
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            {"status": status},
            subresource="status",
        )

    def set_job_running(self, namespace: str, name: str) -> list[Body]:
        """Every pod of the Job running and ready (the Job controller counts them)."""
        return [self.set_pod_phase(p, "Running") for p in self._wait_pods(namespace, name)]

    def set_job_succeeded(self, namespace: str, name: str) -> list[Body]:
        """Every pod of the Job exited 0: the Job controller completes it."""
        return [self.set_pod_phase(p, "Succeeded") for p in self._wait_pods(namespace, name)]

    def set_job_failed(self, namespace: str, name: str, exit_code: int = 1) -> Body:
        """One pod of the Job failed (rank 0's): with backoffLimit 0 the Job fails."""
        pods = sorted(
            self._wait_pods(namespace, name),
            key=lambda p: int(p["metadata"].get("annotations", {}).get(COMPLETION_INDEX, 0)),
        )
        return self.set_pod_phase(pods[0], "Failed", exit_code=exit_code)

    async def job_condition(
        self, namespace: str, name: str, type_: str, timeout: float = 30
    ) -> Body:
        """Wait until the Job controller set condition ``type_`` to True on the Job."""

        def check() -> Body | None:
            job = self.get("jobs", namespace, name) or {}
            conditions = (job.get("status") or {}).get("conditions") or []
            return next(
                (c for c in conditions if c["type"] == type_ and c["status"] == "True"), None
            )

        return await self.wait_for(check, timeout, f"Job {namespace}/{name} never {type_}")

    def events(self, namespace: str, reason: str | None = None) -> list[Body]:
        return [e for e in self.list("events", namespace) if reason in (None, e.get("reason"))]


def _phase(pod: Body) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


@dataclass
class Plane:
    """A started control plane with the JobSet controller and Kueue (session-scoped)."""

    control: ControlPlane
    admin: RealCluster
    controllers: dict[str, Process] = field(default_factory=dict)

    def check_running(self) -> None:
        self.control.check_running()
        for process in self.controllers.values():
            process.check_running()

    def audit(self, since: float = 0.0) -> list[Body]:
        """The requests of :data:`~.controlplane.AUDITED_NAMESPACE`'s service accounts received
        after ``since`` (a UNIX time), one audit event each: the last stage logged (a watch
        still open has only its ResponseStarted)."""
        events: dict[str, Body] = {}
        path = self.control.audit_log
        if not path.exists():
            return []
        for line in path.read_text().splitlines():
            event = json.loads(line)
            when = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"])
            if when.timestamp() >= since:
                events[event["auditID"]] = event
        return list(events.values())


@contextlib.contextmanager
def scoped_objects(cluster: RealCluster) -> Iterator[list[tuple[str, str | None, str]]]:
    """Objects a test registers (``(resource, namespace, name)``) are deleted at exit."""
    created: list[tuple[str, str | None, str]] = []
    try:
        yield created
    finally:
        for resource, namespace, name in reversed(created):
            with contextlib.suppress(ApiError, KeyError):
                cluster.delete(resource, namespace, name)


async def gone(cluster: RealCluster, resource: str, namespace: str | None, name: str) -> None:
    await cluster.wait_for(lambda: cluster.get(resource, namespace, name) is None, 60)
