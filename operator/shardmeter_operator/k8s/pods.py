"""An island's pods, and which one runs rank 0 (whose log the operator reads).

An island is an Indexed Job — its own (workload Job), or the child Job its JobSet creates for
it (workload JobSet: ``status.islands[].name`` is that Job's name, see
:mod:`shardmeter_operator.render.jobset`): the Job controller labels its pods
``batch.kubernetes.io/job-name=<job>`` (Kubernetes ≥ 1.27; the chart's oldest) and marks each
with its completion index (annotation, and label from 1.28), which the rendered pod turns into
``NODE_RANK``; torchrun's local rank 0 on node rank 0 is global rank 0. A JobSet restart
recreates the Job under the same name: the previous attempt's pods are being deleted (and are
skipped) or gone (``BlockingRecreate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardmeter_operator.k8s.client import Kube

Manifest = dict[str, Any]
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


async def island_pods(kube: Kube, namespace: str, island: str) -> list[Manifest]:
    """The pods of island ``island`` (its Job's name)."""
    return await kube.list("v1", "Pod", namespace, f"{JOB_NAME_LABEL}={island}")


def completion_index(pod: Manifest) -> str | None:
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(COMPLETION_INDEX)
    return str(value) if value is not None else (meta.get("labels") or {}).get(COMPLETION_INDEX)


def rank0_pod(pods: Sequence[Manifest]) -> Manifest | None:
    """Node rank 0's pod: completion index 0, not being deleted, the newest (a replaced pod's
    successor), a running one before others."""
    candidates = [
        p
        for p in pods
        if completion_index(p) == "0" and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    if not candidates:
        return None

    def rank(p: Manifest) -> tuple[bool, str]:
        running = (p.get("status") or {}).get("phase") == "Running"
        return running, str((p.get("metadata") or {}).get("creationTimestamp") or "")

    return max(candidates, key=rank)


def trainer_container(pod: Manifest) -> str:
    """The trainer: the first container (the one the operator gives torchtitan's flags)."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return str(containers[0].get("name") or "")


def restarts(pod: Manifest, container: str) -> int:
    for s in (pod.get("status") or {}).get("containerStatuses") or []:
        if s.get("name") == container:
            return int(s.get("restartCount") or 0)
    return 0


def waiting_reason(pod: Manifest, container: str) -> str:
    """Why the trainer container is not running (``ContainerCreating``, ``CrashLoopBackOff``…),
    or the pod's phase."""
    for s in (pod.get("status") or {}).get("containerStatuses") or []:
        if s.get("name") == container and (s.get("state") or {}).get("waiting"):
            return str(s["state"]["waiting"].get("reason") or "Waiting")
    return str((pod.get("status") or {}).get("phase") or "Pending")
