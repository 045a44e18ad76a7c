"""A TrainingPlan island's Indexed Job, rewritten from the user's template (the pool's node
selector and tolerations merged, GPU limits, torchrun's and Streaming DiLoCo's environment),
and its headless Service; and the check of the template itself. Pure builders of plain dicts
(the runtime's flags are added by :mod:`~.render.launch`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from shardmeter_operator.api import DiLoCoSettings, GPUPoolSpec, IslandStatus
from shardmeter_operator.api.errors import TemplateError
from shardmeter_operator.render.labels import (
    ISLAND_LABEL,
    MANAGED_BY,
    POOL_LABEL,
    object_meta,
)
from shardmeter_operator.render.names import INDEXED_JOB_NAME_MAX, child_name, label_value
from shardmeter_operator.render.pods import (
    GPU_RESOURCE,
    headless_service,
    pod_placement,
    torchrun_env,
)
from shardmeter_operator.render.torchtitan import check_trainer_template

Manifest = dict[str, Any]


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
        job_meta = {
            **meta,
            **object_meta(name, namespace, {**meta.get("labels", {}), **ours}, owner),
        }
        spec = job.setdefault("spec", {})
        spec.update(completionMode="Indexed", completions=nodes, parallelism=nodes)
        spec.setdefault("backoffLimit", 0)
        pod_t = spec.setdefault("template", {})
        pod_t.setdefault("metadata", {}).setdefault("labels", {}).update({**MANAGED_BY, **ours})
        pod = pod_t.setdefault("spec", {})
        pod.setdefault("restartPolicy", "Never")
        pod["subdomain"] = name
        placement = pod_placement(pool)
        if "nodeSelector" in placement:
            pod["nodeSelector"] = {**pod.get("nodeSelector", {}), **placement["nodeSelector"]}
        if "tolerations" in placement:
            pod["tolerations"] = [*pod.get("tolerations", []), *placement["tolerations"]]
        env = [
            *torchrun_env(name, namespace, nodes, gpn),
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
        out += [job, headless_service(name, namespace, ours, owner)]
    return out
