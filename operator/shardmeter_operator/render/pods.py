"""What every Indexed Job the operator renders shares: placement on a pool's nodes, torchrun's
environment (one node per completion index, rank 0 at index 0) and the headless Service that
gives the pods their DNS names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardmeter_operator.api import GPUPoolSpec
from shardmeter_operator.render.labels import object_meta

Manifest = dict[str, Any]
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
MASTER_PORT = 29500
GPU_RESOURCE = "nvidia.com/gpu"


def headless_service(
    name: str, namespace: str, labels: Mapping[str, str], owner: dict[str, Any]
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(name, namespace, labels, owner),
        "spec": {
            "clusterIP": "None",
            "selector": {"job-name": name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": MASTER_PORT, "targetPort": MASTER_PORT}],
        },
    }


def torchrun_env(job: str, namespace: str, nodes: int, gpus_per_node: int) -> list[dict[str, Any]]:
    return [
        {"name": "NNODES", "value": str(nodes)},
        {"name": "NPROC_PER_NODE", "value": str(gpus_per_node)},
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
        {"name": "MASTER_ADDR", "value": f"{job}-0.{job}.{namespace}.svc"},
        {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
    ]


def pod_placement(spec: GPUPoolSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = [t.model_dump(exclude_none=True) for t in spec.tolerations]
    return out
