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
import json
from collections.abc import Mapping, Sequence
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter_operator.errors import TemplateError
from shardmeter_operator.names import (
    INDEXED_JOB_NAME_MAX,
    child_name,
    label_value,
    subdomain_name,
)
from shardmeter_operator.resources import API_VERSION, DiLoCoSettings, GPUPoolSpec, IslandStatus
from shardmeter_operator.runtime_torchtitan import check_trainer_template

Manifest = dict[str, Any]
MANAGED_BY = {
    "app.kubernetes.io/managed-by": "shardmeter-operator",
    "app.kubernetes.io/part-of": "shardmeter",
}
POOL_LABEL = "shardmeter.io/pool"
PLAN_LABEL = "shardmeter.io/trainingplan"
PLAN_UID_LABEL = "shardmeter.io/trainingplan-uid"
"""Selects a plan's children exactly (a plan's name may be too long for a label value)."""
PLAN_REVISION_LABEL = "shardmeter.io/plan-revision"
"""The launch decision a child belongs to: only children of the current revision are adopted."""
ISLAND_LABEL = "shardmeter.io/island"
COMPONENT_LABEL = "shardmeter.io/component"
POOL_ANNOTATION = "shardmeter.io/gpupool"
"""The exact GPUPool name on its children (the label value may be shortened)."""
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
MASTER_PORT = 29500
GPU_RESOURCE = "nvidia.com/gpu"


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
    return subdomain_name("shardmeter-coefficients", pool)


def pool_labels(pool: str, component: str) -> dict[str, str]:
    return {POOL_LABEL: label_value(pool), COMPONENT_LABEL: component}


def coefficients_configmap(
    pool: str, namespace: str, owner: dict[str, Any], doc: CoefficientsDocument
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            **_meta(
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
    """A batch/v1 JobTemplateSpec the operator can rewrite; raises TemplateError naming the field."""
    if not isinstance(template, Mapping) or not template:
        raise TemplateError(
            where, "is required when launch is true: a batch/v1 JobTemplateSpec {metadata, spec}"
        )
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        raise TemplateError(f"{where}.spec", "must be a Job spec (with template.spec.containers)")
    for key in ("completions", "parallelism", "completionMode"):
        if key in spec:
            raise TemplateError(
                f"{where}.spec.{key}", "is set by the operator from the plan; remove it"
            )
    pod = (
        spec.get("template", {}).get("spec") if isinstance(spec.get("template"), Mapping) else None
    )
    if not isinstance(pod, Mapping):
        raise TemplateError(f"{where}.spec.template.spec", "must be a pod spec with containers")
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        raise TemplateError(
            f"{where}.spec.template.spec.containers", "must list at least one container"
        )
    for i, c in enumerate(containers):
        if not isinstance(c, Mapping) or not c.get("name") or not c.get("image"):
            raise TemplateError(
                f"{where}.spec.template.spec.containers[{i}]", "needs a name and an image"
            )
    if pod.get("restartPolicy") not in (None, "Never", "OnFailure"):
        raise TemplateError(
            f"{where}.spec.template.spec.restartPolicy", "must be Never or OnFailure for a Job"
        )
    check_trainer_template(template, where)  # runs torchtitan and can take the plan's flags


def island_job_name(plan: str, index: int) -> str:
    """The island's Indexed Job and its headless Service (a DNS-1035 label ≤ 52)."""
    return child_name("", plan, f"island-{index}", max_len=INDEXED_JOB_NAME_MAX)


def _merge_env(
    existing: Sequence[Mapping[str, Any]] | None, ours: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    names = {e["name"] for e in ours}
    return [dict(e) for e in existing or [] if e.get("name") not in names] + list(ours)


def child_labels(plan: str, uid: str, revision: str) -> dict[str, str]:
    """Labels every child of a launched TrainingPlan carries."""
    return {PLAN_LABEL: label_value(plan), PLAN_UID_LABEL: uid, PLAN_REVISION_LABEL: revision}


def island_manifests(
    plan: str,
    namespace: str,
    owner: dict[str, Any],
    template: Mapping[str, Any],
    islands: Sequence[IslandStatus],
    pools: Mapping[str, GPUPoolSpec],
    settings: DiLoCoSettings | None,
    plan_json: str,
    labels: Mapping[str, str],
) -> list[Manifest]:
    """Jobs and Services for every island (validated before anything is created).
    ``labels`` (:func:`child_labels`) go on every child and its pods."""
    validate_template(template)
    s = settings or DiLoCoSettings(sync_every=1, fragments=1, fragment_sync_delay=0)
    out: list[Manifest] = []
    n = len(islands)
    for i, isl in enumerate(islands):
        name = isl.name
        pool = pools[isl.pool]
        nodes, gpn = isl.nodes, isl.gpus_per_node
        ours = {**labels, ISLAND_LABEL: str(i), POOL_LABEL: label_value(isl.pool)}
        job = copy.deepcopy(dict(template))
        meta = job.setdefault("metadata", {})
        job_meta = {**meta, **_meta(name, namespace, {**meta.get("labels", {}), **ours}, owner)}
        spec = job.setdefault("spec", {})
        spec.update(completionMode="Indexed", completions=nodes, parallelism=nodes)
        spec.setdefault("backoffLimit", 0)
        pod_t = spec.setdefault("template", {})
        pod_t.setdefault("metadata", {}).setdefault("labels", {}).update({**MANAGED_BY, **ours})
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
            {"name": "SHARDMETER_MICRO_BATCH", "value": str(isl.micro_batch)},
            {"name": "SHARDMETER_GRAD_ACCUM", "value": str(isl.accumulation)},
            {"name": "SHARDMETER_LOCAL_BATCH_TOKENS", "value": str(isl.local_batch_tokens)},
            {"name": "SHARDMETER_SYNC_EVERY", "value": str(s.sync_every)},
            {"name": "SHARDMETER_NUM_FRAGMENTS", "value": str(s.fragments)},
            {"name": "SHARDMETER_FRAGMENT_SYNC_DELAY", "value": str(s.fragment_sync_delay)},
            {"name": "SHARDMETER_PLAN", "value": plan_json},
        ]  # torchtitan's flags and torchft's environment: runtime_torchtitan.apply_to_island_job
        for c in pod["containers"]:
            c["env"] = _merge_env(c.get("env"), env)
        first = pod["containers"][0]  # the trainer: GPUs go to the first container only
        first.setdefault("resources", {}).setdefault("limits", {})[GPU_RESOURCE] = str(gpn)
        job["metadata"] = job_meta
        job["apiVersion"], job["kind"] = "batch/v1", "Job"
        out += [job, _headless_service(name, namespace, ours, owner)]
    return out
