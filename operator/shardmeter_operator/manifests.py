"""Pure builders of every object the operator creates. They return plain dicts, never call
the API, and are unit-tested without a cluster.

* per GPUPool: the coefficients ConfigMap; the benchmark's Role/RoleBinding (the bench
  ServiceAccount may get/patch exactly that ConfigMap); an Indexed benchmark Job and its
  headless Service for torchrun's rendezvous;
* per TrainingPlan island: an Indexed Job rewritten from the user's template (pool node
  selector and tolerations merged, GPU limits, torchrun and Streaming DiLoCo environment)
  and its headless Service.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.errors import SpecError
from shardmeter_operator.resources import API_VERSION, GPUPoolSpec
from shardmeter_operator.runtime_torchtitan import check_trainer_template

Manifest = dict[str, Any]
MANAGED_BY = {
    "app.kubernetes.io/managed-by": "shardmeter-operator",
    "app.kubernetes.io/part-of": "shardmeter",
}
POOL_LABEL = "shardmeter.io/pool"
PLAN_LABEL = "shardmeter.io/trainingplan"
ISLAND_LABEL = "shardmeter.io/island"
COMPONENT_LABEL = "shardmeter.io/component"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
MASTER_PORT = 29500
GPU_RESOURCE = "nvidia.com/gpu"


def dns_name(*parts: str | int, max_len: int = 63) -> str:
    """A DNS-1123 label from ``parts``; too long → truncated plus a short hash (stable)."""
    raw = "-".join(str(p) for p in parts).lower()
    name = re.sub(r"[^a-z0-9-]+", "-", raw).strip("-")
    if len(name) <= max_len:
        return name
    digest = hashlib.sha1(raw.encode()).hexdigest()[:8]
    return f"{name[: max_len - 9].rstrip('-')}-{digest}"


def owner_reference(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(
    name: str, namespace: str, labels: Mapping[str, str], owner: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**MANAGED_BY, **labels},
        "ownerReferences": [owner],
    }


# ---- GPUPool ---------------------------------------------------------------------------------
def coefficients_configmap_name(pool: str) -> str:
    return dns_name("shardmeter-coefficients", pool, max_len=253)


def coefficients_configmap(
    pool: str, namespace: str, owner: dict[str, Any], doc: CoefficientsDocument
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(
            coefficients_configmap_name(pool),
            namespace,
            {POOL_LABEL: pool, COMPONENT_LABEL: "coefficients"},
            owner,
        ),
        "data": doc.to_configmap_data(),
    }


def bench_job_name(pool: str, generation: int, attempt: int) -> str:
    return dns_name("shardmeter-bench", pool, f"g{generation}", f"a{attempt}")


def bench_role(
    pool: str, namespace: str, service_account: str, owner: dict[str, Any]
) -> tuple[Manifest, Manifest]:
    """Role + RoleBinding letting the bench ServiceAccount get/patch only this pool's ConfigMap."""
    name = dns_name("shardmeter-bench", pool)
    labels = {POOL_LABEL: pool, COMPONENT_LABEL: "bench"}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(name, namespace, labels, owner),
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
        "metadata": _meta(name, namespace, labels, owner),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
    return role, binding


def _headless_service(
    name: str, namespace: str, labels: Mapping[str, str], owner: dict[str, Any]
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, namespace, labels, owner),
        "spec": {
            "clusterIP": "None",
            "selector": {"job-name": name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": MASTER_PORT, "targetPort": MASTER_PORT}],
        },
    }


def _torchrun_env(job: str, namespace: str, nodes: int, gpus_per_node: int) -> list[dict[str, Any]]:
    return [
        {"name": "NNODES", "value": str(nodes)},
        {"name": "NPROC_PER_NODE", "value": str(gpus_per_node)},
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
        {"name": "MASTER_ADDR", "value": f"{job}-0.{job}.{namespace}.svc"},
        {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
    ]


def _pod_placement(spec: GPUPoolSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = [t.model_dump(exclude_none=True) for t in spec.tolerations]
    return out


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
    labels = {POOL_LABEL: pool, COMPONENT_LABEL: "bench"}
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
        "all",
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
            **_meta(name, namespace, labels, owner),
            "annotations": {"shardmeter.io/gpu": gpu, "shardmeter.io/attempt": str(attempt)},
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
                    **_pod_placement(spec),
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
                                *_torchrun_env(name, namespace, nodes, spec.gpus_per_node),
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
    return job, _headless_service(name, namespace, labels, owner)


# ---- TrainingPlan ----------------------------------------------------------------------------
def validate_template(template: Mapping[str, Any], where: str = "spec.template") -> None:
    """A batch/v1 JobTemplateSpec the operator can rewrite; raises SpecError naming the field."""
    if not isinstance(template, Mapping) or not template:
        raise SpecError(
            where, "is required when launch is true: a batch/v1 JobTemplateSpec {metadata, spec}"
        )
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where}.spec", "must be a Job spec (with template.spec.containers)")
    for key in ("completions", "parallelism", "completionMode"):
        if key in spec:
            raise SpecError(
                f"{where}.spec.{key}", "is set by the operator from the plan; remove it"
            )
    pod = (
        spec.get("template", {}).get("spec") if isinstance(spec.get("template"), Mapping) else None
    )
    if not isinstance(pod, Mapping):
        raise SpecError(f"{where}.spec.template.spec", "must be a pod spec with containers")
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        raise SpecError(
            f"{where}.spec.template.spec.containers", "must list at least one container"
        )
    for i, c in enumerate(containers):
        if not isinstance(c, Mapping) or not c.get("name") or not c.get("image"):
            raise SpecError(
                f"{where}.spec.template.spec.containers[{i}]", "needs a name and an image"
            )
    if pod.get("restartPolicy") not in (None, "Never", "OnFailure"):
        raise SpecError(
            f"{where}.spec.template.spec.restartPolicy", "must be Never or OnFailure for a Job"
        )
    check_trainer_template(template, where)  # runs torchtitan and can take the plan's flags


def island_job_name(plan: str, index: int) -> str:
    return dns_name(plan, "island", index)


def _merge_env(
    existing: Sequence[Mapping[str, Any]] | None, ours: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    names = {e["name"] for e in ours}
    return [dict(e) for e in existing or [] if e.get("name") not in names] + list(ours)


def island_manifests(
    plan: str,
    namespace: str,
    owner: dict[str, Any],
    template: Mapping[str, Any],
    islands: Sequence[Mapping[str, Any]],
    pools: Mapping[str, GPUPoolSpec],
    sync_every: int,
    fragments: int,
    delay: int,
    plan_json: str,
) -> list[Manifest]:
    """Jobs and Services for every island (validated before anything is created)."""
    validate_template(template)
    out: list[Manifest] = []
    n = len(islands)
    for i, isl in enumerate(islands):
        name = str(isl["name"])
        pool = pools[str(isl["pool"])]
        nodes, gpn = int(isl["nodes"]), int(isl["gpusPerNode"])
        labels = {PLAN_LABEL: plan, ISLAND_LABEL: str(i), POOL_LABEL: str(isl["pool"])}
        job = copy.deepcopy(dict(template))
        meta = job.setdefault("metadata", {})
        job_meta = {**meta, **_meta(name, namespace, {**meta.get("labels", {}), **labels}, owner)}
        spec = job.setdefault("spec", {})
        spec.update(completionMode="Indexed", completions=nodes, parallelism=nodes)
        spec.setdefault("backoffLimit", 0)
        pod_t = spec.setdefault("template", {})
        pod_t.setdefault("metadata", {}).setdefault("labels", {}).update({**MANAGED_BY, **labels})
        pod = pod_t.setdefault("spec", {})
        pod.setdefault("restartPolicy", "Never")
        pod["subdomain"] = name
        placement = _pod_placement(pool)
        if "nodeSelector" in placement:
            pod["nodeSelector"] = {**pod.get("nodeSelector", {}), **placement["nodeSelector"]}
        if "tolerations" in placement:
            pod["tolerations"] = [*pod.get("tolerations", []), *placement["tolerations"]]
        env = [
            *_torchrun_env(name, namespace, nodes, gpn),
            {"name": "SHARDMETER_ISLAND_ID", "value": str(i)},
            {"name": "SHARDMETER_NUM_ISLANDS", "value": str(n)},
            {"name": "SHARDMETER_MICRO_BATCH", "value": str(isl["microBatch"])},
            {"name": "SHARDMETER_GRAD_ACCUM", "value": str(isl["accumulation"])},
            {"name": "SHARDMETER_LOCAL_BATCH_TOKENS", "value": str(isl["localBatchTokens"])},
            {"name": "SHARDMETER_SYNC_EVERY", "value": str(sync_every)},
            {"name": "SHARDMETER_NUM_FRAGMENTS", "value": str(fragments)},
            {"name": "SHARDMETER_FRAGMENT_SYNC_DELAY", "value": str(delay)},
            {"name": "SHARDMETER_PLAN", "value": plan_json},
        ]  # torchtitan's flags and torchft's environment: runtime_torchtitan.apply_to_island_job
        for c in pod["containers"]:
            c["env"] = _merge_env(c.get("env"), env)
        first = pod["containers"][0]  # the trainer: GPUs go to the first container only
        first.setdefault("resources", {}).setdefault("limits", {})[GPU_RESOURCE] = str(gpn)
        job["metadata"] = job_meta
        job["apiVersion"], job["kind"] = "batch/v1", "Job"
        out += [job, _headless_service(name, namespace, labels, owner)]
    return out
