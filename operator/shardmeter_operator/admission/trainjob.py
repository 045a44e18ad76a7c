"""Placing a Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``, Trainer
v2.2+) at admission, purely. A TrainJob runs as one JobSet whose trainer replicated Job
(``node`` in Trainer's runtimes) has ``spec.trainer.numNodes`` pods — one island: the plan is
searched with ``constraints.maxIslands: 1`` and FSDP, and a request for more islands or for
DiLoCo is refused, since the runtime cannot express it.

The TrainJob is rendered as the JobSet a launched TrainingPlan of its name would be
(:func:`~.placement.place_jobset`'s decision, the operator's renderer), and the island's
share of it is written where Trainer takes it:

* ``spec.trainer``: ``numNodes`` (the island's nodes), ``resourcesPerNode`` (its GPU
  limits), ``args`` (the trainer's own followed by torchtitan's flags) and ``env`` (the
  ``SHARDMETER_*`` variables; the rendezvous is Trainer's torch plugin's, ``PET_*``);
* ``spec.runtimePatches[]``: one entry, manager :data:`MANAGER`, with the pool's node selector
  and tolerations for the trainer's replicated Job (Trainer merges every manager's entry into
  the JobSet it creates; Kueue's is ``kueue.x-k8s.io/manager``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter_operator.admission.annotations import (
    MAX_ISLANDS,
    STRATEGY,
    PlacementRequest,
)
from shardmeter_operator.admission.placement import (
    ADMITTED_LABEL,
    DECISION_ANNOTATION,
    PLACED_ANNOTATION,
    PLAN_SPEC_ANNOTATION,
    Placement,
    PlacementRefusedError,
    as_json,
    decide_placement,
    plan_manifest,
    recorded_spec,
)
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.decision import PoolView
from shardmeter_operator.render.labels import PLAN_LABEL

Manifest = dict[str, Any]
GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
KIND = "TrainJob"
MANAGER = "shardmeter.io/placement"
"""This webhook's ``runtimePatches[].manager``."""
TRAINER_JOB = "node"
"""The trainer's replicated Job in Trainer's runtimes (``trainjob-ancestor-step: trainer``)."""
RENDEZVOUS_ENV = {
    "NNODES",
    "NPROC_PER_NODE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SHARDMETER_JOB_INDEX",
}
"""The rendered rendezvous variables: Trainer's torch plugin sets its own (``PET_*``)."""


def _template(trainjob: Manifest) -> Manifest:
    """One island's JobTemplateSpec as the TrainJob's trainer describes it."""
    trainer = (trainjob.get("spec") or {}).get("trainer") or {}
    container: dict[str, Any] = {"name": TRAINER_JOB}
    for key in ("image", "command", "args", "env"):
        if trainer.get(key):
            container[key] = copy.deepcopy(trainer[key])
    container.setdefault("image", "trainer")  # the runtime's image (Trainer fills it in)
    return {"spec": {"template": {"spec": {"containers": [container]}}}}


def place_trainjob(
    workload: Manifest,
    request: PlacementRequest,
    model: Any,
    pools: Mapping[str, PoolView],
    documents: Mapping[str, CoefficientsDocument | None],
    cfg: OperatorConfig,
    document_notes: Sequence[str] = (),
) -> Placement:
    """Plan ``workload`` (a TrainJob) as one island and write it into the TrainJob. Raises
    :class:`PlacementRefusedError` naming the annotation or field."""
    if request.max_islands not in (None, 1):
        raise PlacementRefusedError(
            f"{MAX_ISLANDS}: is {request.max_islands}, but a TrainJob runs one island (its "
            "trainer's numNodes pods): use 1, or submit a JobSet for several islands"
        )
    if request.strategy not in ("", "fsdp"):
        raise PlacementRefusedError(
            f"{STRATEGY}: is {request.strategy}, but a TrainJob runs one island, and DiLoCo "
            "needs several: use fsdp, or submit a JobSet"
        )
    meta = workload.get("metadata") or {}
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    d = decide_placement(
        name,
        namespace,
        _template(workload),
        replace(request, strategy="fsdp", max_islands=1),
        model,
        pools,
        documents,
        cfg,
        document_notes,
        "spec.trainer",
    )
    (group,) = d.jobset["spec"]["replicatedJobs"]
    job = group["template"]["spec"]
    pod = job["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == TRAINER_JOB]
    out = copy.deepcopy(workload)
    spec = out.setdefault("spec", {})
    trainer = spec.setdefault("trainer", {})
    trainer["numNodes"] = int(job["parallelism"])
    trainer["resourcesPerNode"] = copy.deepcopy(container.get("resources") or {})
    trainer["args"] = list(container.get("args") or [])
    trainer["env"] = [e for e in container.get("env") or [] if e["name"] not in RENDEZVOUS_ENV]
    pod_patch = {k: copy.deepcopy(pod[k]) for k in ("nodeSelector", "tolerations") if pod.get(k)}
    patch = {
        "manager": MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": TRAINER_JOB,
                            "template": {"spec": {"template": {"spec": pod_patch}}},
                        }
                    ]
                }
            }
        },
    }
    others = [p for p in spec.get("runtimePatches") or [] if p.get("manager") != MANAGER]
    spec["runtimePatches"] = [*others, patch]
    om = out.setdefault("metadata", {})
    om["labels"] = {**(om.get("labels") or {}), PLAN_LABEL: name, ADMITTED_LABEL: "true"}
    om["annotations"] = {
        **(om.get("annotations") or {}),
        PLACED_ANNOTATION: d.status.plan,
        DECISION_ANNOTATION: as_json(d.decision),
        PLAN_SPEC_ANNOTATION: as_json(recorded_spec(d.spec)),
    }
    return Placement(
        workload=out,
        plan=plan_manifest(name, namespace, d.spec, KIND, d.status.plan, d.decision),
        status=d.status,
        extra=d.extra,
    )
