"""The labels, annotations and owner references on everything the operator creates (the
watches select the operator's own objects by them; children are found by their plan's UID
and launch revision)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardmeter_operator.api import API_VERSION
from shardmeter_operator.render.names import label_value

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


def owner_reference(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(
    name: str, namespace: str, labels: Mapping[str, str], owner: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**MANAGED_BY, **labels},
        "ownerReferences": [owner],
    }


def pool_labels(pool: str, component: str) -> dict[str, str]:
    return {POOL_LABEL: label_value(pool), COMPONENT_LABEL: component}


def child_labels(plan: str, uid: str, revision: str) -> dict[str, str]:
    """Labels every child of a launched TrainingPlan carries."""
    return {PLAN_LABEL: label_value(plan), PLAN_UID_LABEL: uid, PLAN_REVISION_LABEL: revision}
