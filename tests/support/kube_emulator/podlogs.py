"""Pods of a Job as the Job controller creates them, and the ``pods/log`` subresource serving
logs a test sets — with kube-apiserver's parameters (``container``, ``tailLines``,
``limitBytes``, ``previous``) and its refusals (a pod that is gone, a container that does not
exist or has not started, no previous container)."""

import secrets

import aiohttp.web
import kmock

from support.kube_emulator.errors import api_error
from support.kube_emulator.resources import JOBS, Body, now_iso

PODS = kmock.resource("", "v1", "pods")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


class PodLogs:
    """Job pods and their logs for :class:`~support.kube_emulator.KubeEmulator` (a mixin)."""

    __slots__ = ()

    def create_job_pod(
        self,
        namespace: str,
        job: str,
        index: int = 0,
        *,
        phase: str = "Running",
        restarts: int = 0,
        waiting: str = "",
    ) -> Body:
        """A pod of Job ``job`` as the Job controller makes it (labels ``job-name``,
        ``controller-uid`` and the completion index, annotation, owner reference, the template's
        spec; an Indexed Job's hostname and subdomain), then its status as the kubelet reports
        it: ``phase``, the trainer's ``restarts``, and a ``waiting`` reason for a container
        that has not started."""
        owner = self.read(JOBS, namespace, job)
        template = (owner.get("spec") or {}).get("template") or {}
        spec = dict(template.get("spec") or {})
        uid = owner["metadata"]["uid"]
        labels = {
            **((template.get("metadata") or {}).get("labels") or {}),
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": job,
            "controller-uid": uid,
            "job-name": job,
            COMPLETION_INDEX: str(index),
        }
        if (owner.get("spec") or {}).get("completionMode") == "Indexed":
            spec.setdefault("hostname", f"{job}-{index}")
        name = f"{job}-{index}-{secrets.token_hex(3)[:5]}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels,
                "annotations": {COMPLETION_INDEX: str(index)},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job,
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        self.create(PODS, namespace, pod)
        return self.set_pod_status(namespace, name, phase=phase, restarts=restarts, waiting=waiting)

    def set_pod_status(
        self, namespace: str, name: str, *, phase: str, restarts: int = 0, waiting: str = ""
    ) -> Body:
        """The kubelet's report: the pod's phase and its containers' states."""
        pod = self.read(PODS, namespace, name)
        now = now_iso()
        statuses = []
        for container in pod["spec"].get("containers") or []:
            running = phase == "Running" and not waiting
            state = (
                {"running": {"startedAt": now}}
                if running
                else {"waiting": {"reason": waiting or "ContainerCreating"}}
            )
            statuses.append(
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": running,
                    "restartCount": restarts,
                    "started": running,
                    "state": state,
                }
            )
        status = {"phase": phase, "containerStatuses": statuses, "startTime": now}
        return self.patch(PODS, namespace, name, {"status": status}, subresource="status")[1]

    def set_pod_log(self, namespace: str, pod: str, text: str, container: str = "") -> None:
        """The current log of a pod's container (its first container by default)."""
        if not container:
            container = self.read(PODS, namespace, pod)["spec"]["containers"][0]["name"]
        self._pod_logs[(namespace, pod, container)] = text

    async def _serve_pod_log(
        self, namespace: str, name: str, params: dict[str, str]
    ) -> aiohttp.web.StreamResponse:
        pod = self.read(PODS, namespace, name)  # 404 NotFound for a missing pod
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        container = params.get("container") or ""
        if not container:
            if len(names) != 1:
                raise api_error(
                    400,
                    "BadRequest",
                    f"a container name must be specified for pod {name}, choose one of: "
                    f"[{' '.join(names)}]",
                )
            container = names[0]
        if container not in names:
            raise api_error(400, "BadRequest", f"container {container} is not valid for pod {name}")
        if params.get("previous") in ("true", "1"):
            raise api_error(
                400,
                "BadRequest",
                f'previous terminated container "{container}" in pod "{name}" not found',
            )
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting")
            if status.get("name") == container and waiting:
                raise api_error(
                    400,
                    "BadRequest",
                    f'container "{container}" in pod "{name}" is waiting to start: '
                    f"{waiting.get('reason') or 'ContainerCreating'}",
                )
        data = self._pod_logs.get((namespace, name, container), "").encode()
        tail = params.get("tailLines")
        if tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(tail) :] if int(tail) > 0 else [])
        limit = params.get("limitBytes")
        if limit is not None:
            data = data[: int(limit)]
        return aiohttp.web.Response(body=data, content_type="text/plain", charset="utf-8")
