"""The torchft lighthouse of a launched (Streaming) DiLoCo plan: a Deployment running the
``torchft_lighthouse`` console script of the ``torchft`` 0.2.0 wheel and a Service in front
of it. Every island's torchft manager heartbeats to it and asks it for a quorum at each
fragment sync. Pure builders returning plain dicts.

``torchft_lighthouse`` flags (``torchft_lighthouse --help``): ``--bind`` (default
``[::]:29510``), ``--min_replicas``, ``--join_timeout_ms`` (60000), ``--quorum_tick_ms``
(100), ``--heartbeat_timeout_ms`` (5000). It serves gRPC and an HTTP dashboard on the same
port; ``/status`` answers 200 once it listens.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from shardmeter_operator.api import FaultToleranceSpec
from shardmeter_operator.render.labels import (
    COMPONENT_LABEL,
    MANAGED_BY,
    PLAN_REVISION_LABEL,
    PLAN_UID_LABEL,
)
from shardmeter_operator.render.names import child_name

Manifest = dict[str, Any]

PORT = 29510
COMPONENT = "lighthouse"


def lighthouse_name(plan: str) -> str:
    """The Deployment and its Service (a DNS-1035 label: Service names must be)."""
    return child_name("", plan, COMPONENT)


def lighthouse_address(plan: str, namespace: str) -> str:
    """``TORCHFT_LIGHTHOUSE`` for the islands: the Service's cluster DNS name."""
    return f"http://{lighthouse_name(plan)}.{namespace}.svc:{PORT}"


def service_type(ft: FaultToleranceSpec, remote: bool) -> str:
    """The lighthouse Service's type: as asked, else LoadBalancer when islands run in other
    clusters (``remote``), else ClusterIP."""
    return ft.lighthouse_service_type or ("LoadBalancer" if remote else "ClusterIP")


def islands_address(
    plan: str, namespace: str, ft: FaultToleranceSpec, *, remote: bool, ingress: str = ""
) -> str:
    """``TORCHFT_LIGHTHOUSE`` for islands in this cluster or, ``remote``, in others: a given
    ``lighthouseAddress`` (port 29510 unless it names one), else for remote islands the
    Service's load-balancer ``ingress`` ("" while it has none: nothing can reach it yet), else
    the cluster DNS name."""
    if ft.lighthouse_address:
        host = ft.lighthouse_address
        return f"http://{host}" if ":" in host else f"http://{host}:{PORT}"
    if remote and service_type(ft, remote) != "ClusterIP":
        return f"http://{ingress}:{PORT}" if ingress else ""
    return lighthouse_address(plan, namespace)


def ingress_of(service: Mapping[str, Any] | None) -> str:
    """A Service's load-balancer ingress: its IP, else its hostname ("" while it has none)."""
    for ing in (((service or {}).get("status") or {}).get("loadBalancer") or {}).get(
        "ingress"
    ) or []:
        if ing.get("ip") or ing.get("hostname"):
            return str(ing.get("ip") or ing.get("hostname"))
    return ""


def lighthouse_args(ft: FaultToleranceSpec, min_replicas: int) -> list[str]:
    return [
        f"--bind=[::]:{PORT}",
        f"--min_replicas={min_replicas}",
        f"--join_timeout_ms={ft.join_timeout_ms}",
        f"--quorum_tick_ms={ft.quorum_tick_ms}",
        f"--heartbeat_timeout_ms={ft.heartbeat_timeout_ms}",
    ]


def lighthouse_manifests(
    plan: str,
    namespace: str,
    owner: dict[str, Any],
    ft: FaultToleranceSpec,
    *,
    min_replicas: int,
    image: str,
    labels: Mapping[str, str],
    type_: str = "ClusterIP",
) -> list[Manifest]:
    """The lighthouse Deployment (one replica, never two: a second lighthouse would form its
    own quorums) and its Service, owned by the TrainingPlan; ``labels`` are the launch's
    child labels (plan, UID, revision)."""
    name = lighthouse_name(plan)
    ours = {**labels, COMPONENT_LABEL: COMPONENT}
    selector = {k: ours[k] for k in (PLAN_UID_LABEL, PLAN_REVISION_LABEL, COMPONENT_LABEL)}
    meta = {
        "name": name,
        "namespace": namespace,
        "labels": {**MANAGED_BY, **ours},
        "ownerReferences": [owner],
    }
    probe = {"httpGet": {"path": "/status", "port": "lighthouse"}, "periodSeconds": 10}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**MANAGED_BY, **ours}},
                "spec": {
                    "securityContext": {
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": COMPONENT,
                            "image": ft.lighthouse_image or image,
                            "command": ["torchft_lighthouse"],
                            "args": lighthouse_args(ft, min_replicas),
                            "ports": [{"name": "lighthouse", "containerPort": PORT}],
                            "readinessProbe": {**probe, "initialDelaySeconds": 1},
                            "livenessProbe": {**probe, "initialDelaySeconds": 10},
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "64Mi"},
                                "limits": {"memory": "512Mi"},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }
    service: Manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": copy.deepcopy(meta),  # not shared with the Deployment
        "spec": {
            "selector": selector,
            "ports": [{"name": "lighthouse", "port": PORT, "targetPort": "lighthouse"}],
        },
    }
    if type_ != "ClusterIP":
        service["spec"]["type"] = type_
    return [deployment, service]
