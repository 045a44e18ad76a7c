"""A GPUPool's objects: the coefficients ConfigMap; the benchmark's Role/RoleBinding (the bench
ServiceAccount may get/patch exactly that ConfigMap); an Indexed benchmark Job and its
headless Service for torchrun's rendezvous. Pure builders of plain dicts."""

from __future__ import annotations

import json
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter_operator.api import GPUPoolSpec
from shardmeter_operator.render.labels import MANAGED_BY, POOL_ANNOTATION, object_meta, pool_labels
from shardmeter_operator.render.names import INDEXED_JOB_NAME_MAX, child_name, subdomain_name
from shardmeter_operator.render.pods import (
    GPU_RESOURCE,
    headless_service,
    pod_placement,
    torchrun_env,
)

Manifest = dict[str, Any]


def coefficients_configmap_name(pool: str) -> str:
    return subdomain_name("shardmeter-coefficients", pool)


def coefficients_configmap(
    pool: str, namespace: str, owner: dict[str, Any], doc: CoefficientsDocument
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            **object_meta(
                coefficients_configmap_name(pool),
                namespace,
                pool_labels(pool, "coefficients"),
                owner,
            ),
            "annotations": {POOL_ANNOTATION: pool},
        },
        "data": doc.to_configmap_data(),
    }


def bench_job_name(pool: str, generation: int, attempt: int) -> str:
    return child_name(
        "shardmeter-bench", pool, f"g{generation}-a{attempt}", max_len=INDEXED_JOB_NAME_MAX
    )


def bench_role(
    pool: str, namespace: str, service_account: str, owner: dict[str, Any]
) -> tuple[Manifest, Manifest]:
    """Role + RoleBinding letting the bench ServiceAccount get/patch only this pool's ConfigMap."""
    name = child_name("shardmeter-bench", pool)
    labels = pool_labels(pool, "bench")
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": object_meta(name, namespace, labels, owner),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [coefficients_configmap_name(pool)],
                "verbs": ["get", "patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": object_meta(name, namespace, labels, owner),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
    return role, binding


def bench_job(
    pool: str,
    spec: GPUPoolSpec,
    *,
    namespace: str,
    image: str,
    service_account: str,
    generation: int,
    attempt: int,
    owner: dict[str, Any],
) -> tuple[Manifest, Manifest]:
    """The Indexed benchmark Job (one pod per node, torchrun inside) and its Service."""
    name = bench_job_name(pool, generation, attempt)
    nodes = min(spec.benchmark.nodes, spec.nodes)
    labels = pool_labels(pool, "bench")
    gpu = spec.gpu.name
    command = [
        "torchrun",
        "--nnodes=$(NNODES)",
        "--nproc-per-node=$(NPROC_PER_NODE)",
        "--node-rank=$(NODE_RANK)",
        "--master-addr=$(MASTER_ADDR)",
        "--master-port=$(MASTER_PORT)",
        "-m",
        "shardmeter_bench",
        # validate: measure and fit, then predict unseen training-sized models from the
        # document and from the priors; the published document carries the verdict, and
        # the pool adopts it only where it wins (gpupool.decide.judged)
        "validate",
        "--report-dir",
        "/tmp/shardmeter-validation",
        "--device",
        "cuda",
        "--configs",
        str(spec.benchmark.configs),
        "--pool",
        pool,
        "--gpu",
        json.dumps(spec.gpu.model_dump(by_alias=False), sort_keys=True),
        "--intra-node-link",
        json.dumps(spec.intra.model_dump(by_alias=False), sort_keys=True),
        "--inter-node-link",
        json.dumps(spec.inter.model_dump(by_alias=False), sort_keys=True),
        "--publish",
        f"configmap/{coefficients_configmap_name(pool)}",
        "--namespace",
        namespace,
    ]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            **object_meta(name, namespace, labels, owner),
            "annotations": {
                "shardmeter.io/gpu": gpu,
                "shardmeter.io/attempt": str(attempt),
                POOL_ANNOTATION: pool,
            },
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 7 * 24 * 3600,
            "template": {
                "metadata": {"labels": {**MANAGED_BY, **labels}},
                "spec": {
                    "restartPolicy": "Never",
                    "subdomain": name,
                    "serviceAccountName": service_account,
                    **pod_placement(spec),
                    "securityContext": {
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "bench",
                            "image": image,
                            "command": command,
                            "env": [
                                *torchrun_env(name, namespace, nodes, spec.gpus_per_node),
                                {
                                    "name": "POD_NAMESPACE",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                                },
                            ],
                            "resources": {"limits": {GPU_RESOURCE: str(spec.gpus_per_node)}},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }
    return job, headless_service(name, namespace, labels, owner)


# ---- TrainingPlan ----------------------------------------------------------------------------
