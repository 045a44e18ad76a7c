"""The children of a launched TrainingPlan — every object it creates (island Jobs and their
Services today; a lighthouse Deployment or a JobSet are more kinds in ``CHILD_KINDS``):
listing them by the plan's UID label, and creating them with the adoption rule of
:mod:`shardmeter_operator.launch.rules` (adopt only this plan's current revision; delete and wait
for a previous revision's; refuse anything else)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shardmeter_operator.api.errors import GoneError
from shardmeter_operator.decision import Ensured
from shardmeter_operator.k8s.client import Kube
from shardmeter_operator.render.labels import PLAN_REVISION_LABEL, PLAN_UID_LABEL

Manifest = dict[str, Any]
CHILD_KINDS: list[tuple[str, str]] = [
    ("batch/v1", "Job"),  # island Jobs, and the child Jobs of the plan's JobSet
    ("v1", "Service"),
    ("apps/v1", "Deployment"),  # the torchft lighthouse
    ("jobset.x-k8s.io/v1alpha2", "JobSet"),  # none listed when the JobSet CRD is absent
]
"""(apiVersion, kind) of everything a launch may create; a new child kind registers here.
A JobSet's child Jobs carry the plan's labels too (its Job template's): they are listed, to
follow the islands, but owned by the JobSet, never deleted or adopted by the plan."""


async def list_children(kube: Kube, namespace: str, uid: str) -> list[Manifest]:
    selector = f"{PLAN_UID_LABEL}={uid}"
    out: list[Manifest] = []
    for api_version, kind in CHILD_KINDS:
        out += await kube.list(api_version, kind, namespace, selector)
    return out


def _owned_by(obj: Manifest, uid: str) -> bool:
    return any(
        r.get("uid") == uid for r in (obj.get("metadata") or {}).get("ownerReferences") or []
    )


def _labels(obj: Manifest) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


async def ensure_children(
    kube: Kube,
    manifests: Sequence[Manifest],
    existing: Sequence[Manifest],
    uid: str,
    revision: str,
    alive: Callable[[], bool] = lambda: True,
) -> Ensured:
    """Delete the children of other revisions and wait until they are gone (no new pod
    starts while old ones hold the GPUs); then create what is missing, in order, stopping at
    the first conflict. ``alive()`` is asked before each create: once the plan's deletion was
    seen, nothing more is created (GoneError)."""
    result = Ensured()
    for child in existing:
        if not _owned_by(child, uid):
            continue  # e.g. a JobSet's child Job: goes with its JobSet
        labels = _labels(child)
        if labels.get(PLAN_UID_LABEL) == uid and labels.get(PLAN_REVISION_LABEL) != revision:
            meta = child["metadata"]
            if not meta.get("deletionTimestamp"):
                await kube.delete(
                    child["apiVersion"], child["kind"], meta["namespace"], meta["name"]
                )
            result.waiting.append(f"{child['kind']}/{meta['name']}")
    if result.waiting:
        return result
    for m in manifests:
        kind, name = m["kind"], m["metadata"]["name"]
        if not alive():
            raise GoneError(f"the TrainingPlan was deleted: {kind}/{name} not created")
        obj, created = await kube.create(m)
        if created:
            result.created.append(f"{kind}/{name}")
            continue
        labels = _labels(obj)
        if labels.get(PLAN_UID_LABEL) == uid and labels.get(PLAN_REVISION_LABEL) == revision:
            result.adopted.append(f"{kind}/{name}")
        elif labels.get(PLAN_UID_LABEL) == uid:
            await kube.delete(m["apiVersion"], kind, m["metadata"]["namespace"], name)
            result.waiting.append(f"{kind}/{name}")
        else:
            result.conflict = (
                f"{kind.lower()}/{name} already exists and was not created by this launch of the "
                "TrainingPlan; rename the plan or delete that object"
            )
            return result
    return result
