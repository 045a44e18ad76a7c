"""What Kueue v0.19.2's job framework (``pkg/controller/jobframework``, ``pkg/controller/jobs/
{job,jobset}``, ``pkg/podset``) makes of the Jobs and JobSets it manages, as pure functions,
split from :mod:`support.kueue`: the Workload's name and pod sets (with the ``topologyRequest``
Topology-Aware Scheduling sets, on by default), the name of a prebuilt Workload, and the pod
templates an admitted owner runs with (``RunWithPodSetsInfo``)."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from support.jobset import JOB_INDEX_KEY
from support.kube_emulator import Body

PREBUILT_WORKLOAD_KEY = "kueue.x-k8s.io/prebuilt-workload-name"
"""On a Job or JobSet: the Workload made for it beforehand (an annotation since v0.18's
``WorkloadIdentifierAnnotations``, a label before; both are read)."""
MULTIKUEUE_ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
MULTIKUEUE_WORKER_POD_LABEL = "kueue.x-k8s.io/multikueue-worker-workload-pod"
PODSET_LABEL = "kueue.x-k8s.io/podset"
LOCAL_QUEUE_POD_LABEL = "kueue.x-k8s.io/local-queue-name"
CLUSTER_QUEUE_POD_LABEL = "kueue.x-k8s.io/cluster-queue-name"
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def workload_name(kind: str, group: str, name: str, uid: str) -> str:
    """Kueue's ``GetWorkloadNameForOwnerWithGVK``."""
    digest = hashlib.sha1(f"{kind}\n{group}\n{name}\n{uid}".encode()).hexdigest()[:5]
    return f"{kind.lower()}-{name}"[: 253 - 1 - 5] + "-" + digest


def prebuilt_workload(obj: Mapping[str, Any]) -> str:
    """``PrebuiltWorkloadNameFor``: the annotation first, then the label."""
    meta = obj["metadata"]
    return str(
        (meta.get("annotations") or {}).get(PREBUILT_WORKLOAD_KEY)
        or (meta.get("labels") or {}).get(PREBUILT_WORKLOAD_KEY)
        or ""
    )


def pod_sets(obj: Body, kind: str) -> list[Body]:
    """The Workload pod sets Kueue makes of a JobSet or a Job (``PodSets()``)."""
    if kind == "JobSet":
        return [
            {
                "name": r["name"],
                "count": int(r["template"]["spec"].get("parallelism") or 1)
                * int(r.get("replicas", 1)),
                "template": copy.deepcopy(r["template"]["spec"]["template"]),
                "topologyRequest": {
                    "podIndexLabel": JOB_COMPLETION_INDEX,
                    "subGroupIndexLabel": JOB_INDEX_KEY,
                    "subGroupCount": int(r.get("replicas", 1)),
                },
            }
            for r in obj["spec"]["replicatedJobs"]
        ]
    return [
        {
            "name": "main",
            "count": int(obj["spec"].get("parallelism") or 1),
            "template": copy.deepcopy(obj["spec"]["template"]),
            "topologyRequest": {"podIndexLabel": JOB_COMPLETION_INDEX},
        }
    ]


def run_with_pod_sets_info(
    owner: Body, kind: str, wl: Body, flavor_spec: Callable[[str], Mapping[str, Any]]
) -> Body:
    """``startJob``/``RunWithPodSetsInfo``: the owner with each pod set's flavors'
    ``nodeLabels`` and ``tolerations`` and Kueue's pod labels and annotation merged into its
    template, unsuspended."""
    body = copy.deepcopy(owner)
    admission = wl["status"]["admission"]
    assigned = {a["name"]: a for a in admission["podSetAssignments"]}
    if kind == "JobSet":
        templates = {
            r["name"]: r["template"]["spec"]["template"] for r in body["spec"]["replicatedJobs"]
        }
    else:
        templates = {"main": body["spec"]["template"]}
    origin = MULTIKUEUE_ORIGIN_LABEL in (wl["metadata"].get("labels") or {})
    for name, tmpl in templates.items():
        pod = tmpl.setdefault("spec", {})
        meta = tmpl.setdefault("metadata", {})
        labels = {
            PODSET_LABEL: name,
            LOCAL_QUEUE_POD_LABEL: wl["spec"]["queueName"],
            CLUSTER_QUEUE_POD_LABEL: admission["clusterQueue"],
        }
        if origin:
            labels[MULTIKUEUE_WORKER_POD_LABEL] = "true"
        meta["labels"] = {**(meta.get("labels") or {}), **labels}
        meta["annotations"] = {
            **(meta.get("annotations") or {}),
            WORKLOAD_ANNOTATION: wl["metadata"]["name"],
        }
        for flavor_name in sorted(set((assigned.get(name) or {}).get("flavors", {}).values())):
            fspec = flavor_spec(flavor_name)
            if fspec.get("nodeLabels"):
                pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **fspec["nodeLabels"]}
            extra = [
                t for t in fspec.get("tolerations") or [] if t not in (pod.get("tolerations") or [])
            ]
            if extra:
                pod["tolerations"] = [*(pod.get("tolerations") or []), *extra]
    body["spec"]["suspend"] = False
    return body
