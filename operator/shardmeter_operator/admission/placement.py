"""Placing a workload at admission, purely: from the workload as submitted, its placement
request and what the operator knows of the pools, the TrainingPlan that records the decision,
the decision itself (:func:`~.trainingplan.decide.decide`, as a launched TrainingPlan of that
name would take it) and the workload as the launch renders it
(:func:`~.render.launch.launch_manifests`, through :func:`~.launch.children.children_to_create`)
— or the reason it is refused, naming the annotation or field. No API calls.

The TrainingPlan is named after the workload and does not exist yet at admission (webhooks
have no side effects): the launch is rendered with a UID derived from the workload's
namespace and name (:func:`admission_uid`), which the TrainingPlan records."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter_operator.admission.annotations import (
    AnnotationError,
    PlacementRequest,
    name_annotation,
    plan_fields,
)
from shardmeter_operator.api import (
    API_VERSION,
    FaultToleranceSpec,
    GPUPoolSpec,
    TrainingPlanPhase,
    TrainingPlanStatus,
    WorkloadKind,
)
from shardmeter_operator.api.conditions import Type, get_condition
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.decision import ClusterFacts, PlanInputs, PoolView
from shardmeter_operator.render import jobset as jobsets
from shardmeter_operator.render.labels import (
    PLAN_LABEL,
    PLAN_REVISION_LABEL,
    PLAN_UID_LABEL,
    child_labels,
)
from shardmeter_operator.render.lighthouse import lighthouse_manifests
from shardmeter_operator.trainingplan.decide import decide

Manifest = dict[str, Any]

ADMITTED_LABEL = "shardmeter.io/admitted"
"""On a workload placed at admission (the operator creates its TrainingPlan once it exists)."""
WORKLOAD_KIND_LABEL = "shardmeter.io/workload-kind"
WORKLOAD_NAME_LABEL = "shardmeter.io/workload-name"
"""On the TrainingPlan of an admitted workload: the workload it records (the workload carries
``shardmeter.io/trainingplan``, the plan's name: linked both ways)."""
PLACED_ANNOTATION = "shardmeter.io/placed"
"""The plan chosen at admission, in the paper's notation."""
DECISION_ANNOTATION = "shardmeter.io/decision"
"""The admission's decision as JSON: plan, islands, settings, the UID the launch was rendered
with."""
PLAN_SPEC_ANNOTATION = "shardmeter.io/plan-spec"
"""On an admitted workload: the spec of the TrainingPlan that records it (JSON, no template)."""


class PlacementRefusedError(Exception):
    """The workload cannot be placed; the message names the annotation or field to change."""


@dataclass(frozen=True)
class Placement:
    """The admission's decision for one workload."""

    workload: Manifest
    """The workload as it is to be stored (mutated)."""
    plan: Manifest
    """The TrainingPlan that records the decision (created once the workload exists)."""
    status: TrainingPlanStatus
    extra: list[Manifest] = field(default_factory=list)
    """What the operator creates beside the workload (the torchft lighthouse), owner unset."""


def admission_uid(namespace: str, name: str) -> str:
    """The UID a workload's launch is rendered with (its TrainingPlan does not exist yet)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"shardmeter.io/admission/{namespace}/{name}"))


def default_pools(pools: Mapping[str, PoolView]) -> list[str]:
    """Every GPUPool whose spec is valid, by name."""
    return sorted(n for n, v in pools.items() if not v.problem)


def _island_template(jobset: Manifest) -> Manifest:
    replicated = (jobset.get("spec") or {}).get("replicatedJobs") or []
    if len(replicated) != 1:
        raise PlacementRefusedError(
            f"spec.replicatedJobs: has {len(replicated)} replicated Jobs; placement rewrites "
            "a JobSet of exactly one (the trainer's), which becomes one replicated Job per "
            "island shape"
        )
    template = copy.deepcopy(replicated[0].get("template") or {})
    # JobSet's own defaulting webhook may have run before ours (kube-apiserver calls the
    # mutating webhooks one after the other, JobSet's configuration first where its name sorts
    # first): it sets completionMode Indexed, which is what the islands get anyway
    spec = template.get("spec")
    if isinstance(spec, dict) and spec.get("completionMode") == "Indexed":
        del spec["completionMode"]
    return template


def plan_spec(
    template: Manifest, request: PlacementRequest, model: Any, pools: Mapping[str, PoolView]
) -> dict[str, Any]:
    """The spec of the TrainingPlan that records the placement (``launch: false``: the
    workload itself runs the islands); ``template``: one island's JobTemplateSpec."""
    names = list(request.pools) or default_pools(pools)
    if not names:
        raise PlacementRefusedError(
            "no GPUPool to place on: create a GPUPool or name some in shardmeter.io/pools"
        )
    spec = plan_fields(request, model, names)
    spec.update(launch=False, workload="JobSet", template=template)
    return spec


@dataclass(frozen=True)
class Decided:
    spec: dict[str, Any]
    status: TrainingPlanStatus
    jobset: Manifest
    """The JobSet a launched TrainingPlan of the workload's name renders."""
    extra: list[Manifest]
    decision: dict[str, Any]


def decide_placement(
    name: str,
    namespace: str,
    template: Manifest,
    request: PlacementRequest,
    model: Any,
    pools: Mapping[str, PoolView],
    documents: Mapping[str, CoefficientsDocument | None],
    cfg: OperatorConfig,
    document_notes: Sequence[str],
    where: str,
) -> Decided:
    """Plan and render as a launched TrainingPlan named ``name`` with ``template`` would be;
    ``where``: the workload's field the TrainingPlan's ``spec.template`` stands for."""
    if not name:
        raise PlacementRefusedError("metadata.name: placement needs a name (not generateName)")
    if jobsets.jobset_name(name) != name:
        raise PlacementRefusedError(
            f"metadata.name: {name!r} is too long for its islands' Job and pod names "
            f"(at most {jobsets.JOBSET_NAME_MAX} characters): shorten it"
        )
    spec = plan_spec(template, request, model, pools)
    uid = admission_uid(namespace, name)
    inputs = PlanInputs(
        name=name,
        namespace=namespace,
        uid=uid,
        generation=1,
        spec={**spec, "launch": True},
        status=TrainingPlanStatus(),
        pools=pools,
        cfg=cfg,
        documents=documents,
        document_notes=document_notes,
        cluster=ClusterFacts(jobset_served=True),
    )
    out = decide(inputs)
    st = out.status
    _refuse_unless_launched(st, out.validated is not None, where)
    assert out.validated is not None
    _refuse_multi_site(st, out.validated.pools)
    (rendered,) = [m for m in out.create if m["kind"] == jobsets.KIND]
    decision = {
        "plan": st.plan,
        "uid": uid,
        "islands": [
            i.model_dump(by_alias=True, include={"name", "pool", "nodes", "gpus_per_node"})
            for i in st.islands
        ],
        "streamingDiLoCo": st.streaming_di_lo_co.model_dump(by_alias=True)
        if st.streaming_di_lo_co
        else None,
    }
    extra = [_unowned(m) for m in out.create if m["kind"] != jobsets.KIND]
    return Decided(spec, st, rendered, extra, decision)


def place_jobset(
    workload: Manifest,
    request: PlacementRequest,
    model: Any,
    pools: Mapping[str, PoolView],
    documents: Mapping[str, CoefficientsDocument | None],
    cfg: OperatorConfig,
    document_notes: Sequence[str] = (),
) -> Placement:
    """Plan ``workload`` (a JobSet) and render it as a launched TrainingPlan of its name would
    be. Raises :class:`PlacementRefusedError` (naming the annotation or field) or
    :class:`AnnotationError` when it cannot run as planned. CPU-heavy: run in a worker."""
    meta = workload.get("metadata") or {}
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    d = decide_placement(
        name,
        namespace,
        _island_template(workload),
        request,
        model,
        pools,
        documents,
        cfg,
        document_notes,
        "spec.replicatedJobs[0].template",
    )
    return Placement(
        workload=mutated(workload, d.jobset, d.status.plan, d.decision, d.spec),
        plan=plan_manifest(name, namespace, d.spec, jobsets.KIND, d.status.plan, d.decision),
        status=d.status,
        extra=d.extra,
    )


def _refuse_unless_launched(st: TrainingPlanStatus, valid: bool, where: str) -> None:
    def message(type_: str) -> str:
        c = get_condition(st.conditions, type_)
        text = name_annotation(c.message) if c is not None else "unknown"
        return text.replace("spec.template", where)

    if not valid:
        raise PlacementRefusedError(message(Type.VALID))
    if st.phase is TrainingPlanPhase.INFEASIBLE:
        raise PlacementRefusedError("no placement fits: " + message(Type.PLANNED))
    if st.launch is None:  # the runtime cannot express it (Valid=False names the field)
        raise PlacementRefusedError(message(Type.VALID))
    if st.launch.workload is not WorkloadKind.JOBSET:
        raise PlacementRefusedError(f"the plan launches as {st.launch.workload}, not a JobSet")


def _refuse_multi_site(st: TrainingPlanStatus, pools: Mapping[str, GPUPoolSpec]) -> None:
    sites = sorted({pools[i.pool].site for i in st.islands if i.pool in pools})
    if len(sites) > 1:
        raise PlacementRefusedError(
            f"the plan {st.plan} needs {len(sites)} sites ({', '.join(sites)}), and one "
            "workload runs in one cluster: restrict shardmeter.io/pools to one site's pools, "
            "or submit a TrainingPlan (multi-site launch) instead"
        )


def _unowned(manifest: Manifest) -> Manifest:
    out = copy.deepcopy(manifest)
    out["metadata"].pop("ownerReferences", None)
    return out


def mutated(
    workload: Manifest,
    rendered: Manifest,
    plan: str,
    decision: Mapping[str, Any],
    spec: Mapping[str, Any],
) -> Manifest:
    """The workload as submitted, its spec replaced by the rendered one's, the rendered labels
    added and the decision annotated. What the submitter set that the render does not own is
    kept: its other labels and annotations, and ``spec.suspend`` when set (e.g. by Kueue)."""
    out = copy.deepcopy(workload)
    meta = out.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **rendered["metadata"]["labels"]}
    meta["labels"][ADMITTED_LABEL] = "true"
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        PLACED_ANNOTATION: plan,
        DECISION_ANNOTATION: as_json(decision),
        PLAN_SPEC_ANNOTATION: as_json(recorded_spec(spec)),
    }
    suspend = bool((workload.get("spec") or {}).get("suspend"))
    out["spec"] = copy.deepcopy(rendered["spec"])
    if suspend:
        out["spec"]["suspend"] = True
    return out


def as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def recorded_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainingPlan's spec as recorded on the workload: plan only, no template (the
    workload runs the islands; a plan-only TrainingPlan needs none)."""
    return {k: v for k, v in spec.items() if k != "template"}


def admitted_children(workload: Manifest, cfg: OperatorConfig) -> list[Manifest]:
    """What the operator creates for a stored, admitted workload, owned by it: the
    TrainingPlan recording its placement, then (DiLoCo) the torchft lighthouse the workload's
    islands were rendered to join. From the workload's annotations and labels alone (the
    admission's decision), so creating them again changes nothing."""
    meta = workload["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    decision = json.loads(annotations[DECISION_ANNOTATION])
    spec = json.loads(annotations[PLAN_SPEC_ANNOTATION])
    plan = plan_manifest(name, namespace, spec, workload["kind"], decision["plan"], decision)
    out = [owned_by(plan, workload)]
    if decision.get("streamingDiLoCo") is None:
        return out
    ft = FaultToleranceSpec.model_validate(spec.get("faultTolerance") or {})
    owner = out[0]["metadata"]["ownerReferences"][0]
    return out + lighthouse_manifests(
        name,
        namespace,
        owner,
        ft,
        min_replicas=ft.min_replicas or len(decision["islands"]),
        image=cfg.bench_image,
        labels=child_labels(name, labels[PLAN_UID_LABEL], labels[PLAN_REVISION_LABEL]),
    )


def plan_manifest(
    name: str,
    namespace: str,
    spec: Mapping[str, Any],
    kind: str,
    plan: str,
    decision: Mapping[str, Any],
) -> Manifest:
    """The TrainingPlan recording an admitted workload's placement (its owner reference to
    the workload is added once the workload exists)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingPlan",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {WORKLOAD_KIND_LABEL: kind, WORKLOAD_NAME_LABEL: name},
            "annotations": {
                PLACED_ANNOTATION: plan,
                DECISION_ANNOTATION: as_json(decision),
            },
        },
        "spec": dict(spec),
    }


def owned_by(manifest: Manifest, workload: Manifest) -> Manifest:
    """``manifest`` owned by the stored ``workload`` (deleted with it)."""
    meta = workload["metadata"]
    out = copy.deepcopy(manifest)
    out["metadata"]["ownerReferences"] = [
        {
            "apiVersion": workload["apiVersion"],
            "kind": workload["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return out


__all__ = [
    "ADMITTED_LABEL",
    "PLAN_LABEL",
    "AnnotationError",
    "Placement",
    "PlacementRefusedError",
    "admission_uid",
    "owned_by",
    "place_jobset",
]
