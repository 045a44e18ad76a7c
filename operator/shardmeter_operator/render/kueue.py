"""Kueue (v0.19, ``kueue.x-k8s.io/v1beta2``) for launched plans, as pure functions: submitting a
workload to a LocalQueue, the pools' ResourceFlavors, the plan's ``QuotaReserved`` and
``Admitted`` conditions read from the Workloads Kueue creates, and — for islands in other
clusters — the MultiKueue setup of a site's queue and its admission.

* **Submit.** A plan with ``spec.queueName`` labels its JobSet (or each island Job)
  ``kueue.x-k8s.io/queue-name: <queue>`` and creates it with ``spec.suspend: true``: nothing
  starts until Kueue admits it. Kueue makes one Workload per JobSet, with one pod set per
  replicated Job (``count`` = parallelism × replicas), and admits it whole — every island of
  the plan or none (gang admission). Plain Jobs are one Workload each, admitted one by one.
* **Flavors.** A GPUPool's ``spec.kueue.flavor`` names the ResourceFlavor of its nodes. Kueue
  assigns a pod set only flavors whose ``nodeLabels`` agree with the pods' node selector (and
  whose ``nodeTaints`` the pods tolerate), so the islands of the pool get the flavor's
  ``nodeLabels`` in their node selector; a flavor that contradicts the pool's own
  ``nodeSelector`` or taints nodes the pool does not tolerate could never be assigned and is
  refused before anything is created.
* **Admission.** The Workload's conditions ``QuotaReserved`` and ``Admitted`` become the
  plan's, with Kueue's reason and message (e.g. ``Pending``: "couldn't assign flavors to pod
  set g0: insufficient quota for nvidia.com/gpu in flavor h200 …"); ``status.admission``
  says which ClusterQueue and flavors. Kueue finds the Workload of an object through the
  label ``kueue.x-k8s.io/job-uid`` (the object's UID).
* **MultiKueue.** A site's LocalQueue (a pool's ``spec.kueue.queueName``) must lead to a
  ClusterQueue whose admission checks (``spec.admissionChecksStrategy.admissionChecks``)
  include one with controllerName ``kueue.x-k8s.io/multikueue``, whose parameters name a
  MultiKueueConfig listing the site's worker cluster alone (:func:`multikueue_problem`). In
  the manager, the Workload reserves quota, the check turns ``Ready`` once a worker admitted
  the copy, and ``status.clusterName`` names that worker (:func:`site_admission`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardmeter_operator.api import GPUPoolSpec, Toleration
from shardmeter_operator.decision import SiteQueue

Manifest = dict[str, Any]

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""On a Workload: the UID of the Job or JobSet it was created for."""
LOCAL_QUEUES_CRD = f"localqueues.{GROUP}"
WORKLOADS_CRD = f"workloads.{GROUP}"
CLUSTER_QUEUES_CRD = f"clusterqueues.{GROUP}"
ADMISSION_CHECKS_CRD = f"admissionchecks.{GROUP}"
MULTIKUEUE_CONFIGS_CRD = f"multikueueconfigs.{GROUP}"
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
"""The MultiKueue admission check controller's name (an AdmissionCheck's ``controllerName``),
and the ``spec.managedBy`` of a JobSet MultiKueue dispatches."""
MAX_POD_SETS = 8
"""A Workload's ``spec.podSets`` holds at most 8 (``+kubebuilder:validation:MaxItems=8``)."""
GPU_RESOURCE = "nvidia.com/gpu"


def submit(manifest: Manifest, queue: str) -> None:
    """Queue a Job or JobSet: Kueue's label, created suspended (Kueue unsuspends it)."""
    manifest["metadata"].setdefault("labels", {})[QUEUE_LABEL] = queue
    manifest["spec"]["suspend"] = True


# ---- ResourceFlavors --------------------------------------------------------------------------
def _tolerates(tolerations: Sequence[Toleration], taint: Mapping[str, Any]) -> bool:
    """core/v1 ``Toleration.ToleratesTaint``: effect (empty matches all), key (empty with
    Exists matches all), then Exists or an equal value."""
    for t in tolerations:
        if t.effect and t.effect != taint.get("effect"):
            continue
        if t.key and t.key != taint.get("key"):
            continue
        if not t.key and t.operator != "Exists":
            continue
        if t.operator == "Exists" or (t.value or "") == str(taint.get("value") or ""):
            return True
    return False


def flavor_problem(pool: str, spec: GPUPoolSpec, flavor: Mapping[str, Any] | None) -> str:
    """Why Kueue could never assign the pool's ResourceFlavor to its islands ("" when it can)."""
    assert spec.kueue is not None
    name = spec.kueue.flavor
    if flavor is None:
        return (
            f"GPUPool {pool}: spec.kueue.flavor names ResourceFlavor {name}, which does not "
            "exist; create it (kubectl get resourceflavors) or fix the pool"
        )
    fspec = flavor.get("spec") or {}
    labels = {str(k): str(v) for k, v in (fspec.get("nodeLabels") or {}).items()}
    clash = {k: (v, spec.node_selector[k]) for k, v in labels.items() if k in spec.node_selector}
    clash = {k: pair for k, pair in clash.items() if pair[0] != pair[1]}
    if clash:
        shown = ", ".join(f"{k}={a} (pool: {b})" for k, (a, b) in sorted(clash.items()))
        return (
            f"GPUPool {pool}: spec.kueue.flavor {name} has nodeLabels {shown} that contradict "
            "the pool's spec.nodeSelector: Kueue would never assign it; fix one of them"
        )
    for taint in fspec.get("nodeTaints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(
            spec.tolerations, taint
        ):
            shown = f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
            return (
                f"GPUPool {pool}: spec.kueue.flavor {name} taints its nodes {shown}, which "
                "spec.tolerations do not tolerate: Kueue would never assign it; add the toleration"
            )
    return ""


def with_flavor(spec: GPUPoolSpec, flavor: Mapping[str, Any]) -> GPUPoolSpec:
    """The pool as its islands are rendered: the flavor's nodeLabels in the node selector."""
    labels = {
        str(k): str(v) for k, v in ((flavor.get("spec") or {}).get("nodeLabels") or {}).items()
    }
    return spec.model_copy(update={"node_selector": {**labels, **spec.node_selector}})


# ---- admission --------------------------------------------------------------------------------
def _condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c  # type: ignore[no-any-return]
    return None


@dataclass(frozen=True)
class Verdict:
    """One of the plan's Kueue conditions."""

    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Admission:
    """What the plan's conditions say about its Workloads."""

    quota_reserved: Verdict
    admitted: Verdict
    waiting: str = ""
    """Why the islands wait (for their ``Queued`` state); empty once admitted."""
    flavors: dict[str, str] = field(default_factory=dict)
    """Pod set → the flavor assigned to its GPUs (or first resource)."""


def flavors_of(workload: Mapping[str, Any]) -> dict[str, str]:
    """Pod set → assigned flavor (of ``nvidia.com/gpu``, else of its first resource)."""
    admission = (workload.get("status") or {}).get("admission") or {}
    out = {}
    for a in admission.get("podSetAssignments") or []:
        flavors = a.get("flavors") or {}
        chosen = flavors.get(GPU_RESOURCE) or next(iter(flavors.values()), "")
        out[str(a.get("name"))] = str(chosen)
    return out


def _verdict(wl: Mapping[str, Any], type_: str, what: str) -> Verdict:
    c = _condition(wl, type_)
    if c is None:
        return Verdict(False, "Pending", f"Kueue has not considered {what} yet")
    return Verdict(
        c.get("status") == "True", str(c.get("reason") or type_), str(c.get("message") or "")
    )


def admission(
    queue: str, owners: Sequence[tuple[str, str]], workloads: Mapping[str, Manifest]
) -> Admission:
    """The plan's Kueue conditions. ``owners``: (description, UID) of each object submitted
    (the JobSet, or each island Job); ``workloads``: owner UID → its Workload."""
    missing = [what for what, uid in owners if uid not in workloads]
    if missing:
        text = (
            f"waiting for Kueue to create a Workload for {missing[0]} in LocalQueue {queue} "
            "(is Kueue running, with its jobset or batch/job integration enabled?)"
        )
        v = Verdict(False, "WorkloadNotCreated", text)
        return Admission(v, v, text)
    verdicts = {
        t: [(w, _verdict(workloads[u], t, w)) for w, u in owners]
        for t in ("QuotaReserved", "Admitted")
    }
    out: dict[str, Verdict] = {}
    for type_, pairs in verdicts.items():
        waiting = [(w, v) for w, v in pairs if not v.status]
        if not waiting:
            cq = {
                str(((workloads[u].get("status") or {}).get("admission") or {}).get("clusterQueue"))
                for _, u in owners
            }
            flavors = {k: v for _, u in owners for k, v in flavors_of(workloads[u]).items()}
            shown = ", ".join(f"{k} → {v}" for k, v in sorted(flavors.items()))
            out[type_] = Verdict(
                True,
                type_,
                f"{len(owners)} Workload(s) in ClusterQueue {', '.join(sorted(cq))}"
                + (f"; flavors: {shown}" if shown else ""),
            )
        else:
            what, v = waiting[0]
            prefix = (
                f"{len(pairs) - len(waiting)}/{len(pairs)} island Jobs; {what}: "
                if len(pairs) > 1
                else ""
            )
            out[type_] = Verdict(False, v.reason, prefix + v.message)
    admitted = out["Admitted"]
    why = "" if admitted.status else (out["QuotaReserved"].message or admitted.message)
    flavors = {k: v for _, u in owners for k, v in flavors_of(workloads[u]).items()}
    return Admission(out["QuotaReserved"], admitted, why, flavors)


# ---- MultiKueue ------------------------------------------------------------------------------
def cluster_queue_of(local_queue: Mapping[str, Any]) -> str:
    return str((local_queue.get("spec") or {}).get("clusterQueue") or "")


def check_names_of(cluster_queue: Mapping[str, Any]) -> list[str]:
    strategy = (cluster_queue.get("spec") or {}).get("admissionChecksStrategy") or {}
    return [str(c.get("name")) for c in strategy.get("admissionChecks") or []]


def multikueue_check(checks: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return next(
        (c for c in checks if (c.get("spec") or {}).get("controllerName") == MULTIKUEUE_CONTROLLER),
        None,
    )


def config_name_of(check: Mapping[str, Any]) -> str:
    params = (check.get("spec") or {}).get("parameters") or {}
    return str(params.get("name") or "") if params.get("kind") == "MultiKueueConfig" else ""


def multikueue_problem(
    pool: str, spec: GPUPoolSpec, namespace: str, queue: SiteQueue
) -> tuple[str, str]:
    """(what is wrong, the worker cluster): why the pool's site queue would not send its
    islands to one worker cluster ("" when it does), and that cluster."""
    assert spec.kueue is not None and spec.kueue.queue_name
    field = f"GPUPool {pool}: spec.kueue.queueName {queue.name}"
    if queue.local_queue is None:
        return (
            f"{field} names no LocalQueue in namespace {namespace}: create it there (the "
            "same name in every namespace that launches on the pool) or fix the pool",
            "",
        )
    cq = cluster_queue_of(queue.local_queue)
    if queue.cluster_queue is None:
        return f"{field} points at ClusterQueue {cq}, which does not exist: create it", ""
    check = multikueue_check(queue.checks)
    if check is None:
        return (
            f"{field}: ClusterQueue {cq} has no MultiKueue admission check (an AdmissionCheck "
            f"with controllerName {MULTIKUEUE_CONTROLLER} in spec.admissionChecksStrategy): "
            "without one Kueue runs the islands in this cluster; add it, or drop queueName",
            "",
        )
    config = config_name_of(check)
    if queue.config is None:
        return (
            f"{field}: AdmissionCheck {check['metadata']['name']} names MultiKueueConfig "
            f"{config or '(none)'}, which does not exist: create it",
            "",
        )
    clusters = [str(c) for c in (queue.config.get("spec") or {}).get("clusters") or []]
    wanted = spec.kueue.cluster
    if wanted and clusters != [wanted]:
        return (
            f"{field}: MultiKueueConfig {config} lists {clusters}, not the pool's cluster "
            f"{wanted} alone — a queue pins its workloads to a site only when its config lists "
            "that site's cluster only; give the site a ClusterQueue and MultiKueueConfig of its "
            "own, or fix spec.kueue.cluster",
            "",
        )
    if not wanted and len(clusters) != 1:
        return (
            f"{field}: MultiKueueConfig {config} lists {len(clusters)} clusters {clusters}: "
            "MultiKueue could run the islands in any of them; list the site's cluster alone, "
            "or name it in spec.kueue.cluster",
            "",
        )
    return "", clusters[0]


def only_cluster(config: Mapping[str, Any] | None) -> str:
    """The one cluster a MultiKueueConfig lists ("" when none or several)."""
    clusters = (config or {}).get("spec", {}).get("clusters") or []
    return str(clusters[0]) if len(clusters) == 1 else ""


def worker_problem(pool: str, queue: SiteQueue, namespace: str) -> str:
    """Why the site's worker cluster cannot run what MultiKueue copies to it ("" when it can,
    or when the operator does not read it): MultiKueue creates the JobSet and its Workload
    in the same namespace, queued in a LocalQueue of the same name, and the worker's JobSet
    controller runs it."""
    w = queue.worker
    if w is None:
        return ""
    where = f"GPUPool {pool}: spec.kueue.queueName {queue.name} dispatches to worker cluster {w.cluster}"
    if w.unreadable:
        return f"{where}, which cannot be read ({w.unreadable}): fix its MultiKueueCluster"
    if w.namespace is False:
        return f"{where}, which has no namespace {namespace}: create it there"
    if w.local_queue is False:
        return (
            f"{where}, which has no LocalQueue {queue.name} in namespace {namespace}: create "
            "it there (MultiKueue queues the copy under the same name)"
        )
    if w.jobset is False:
        return f"{where}, which does not serve jobset.x-k8s.io/v1alpha2: install JobSet there"
    return ""


def check_state(workload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Workload's MultiKueue admission check state (``status.admissionChecks[]``)."""
    states = (workload.get("status") or {}).get("admissionChecks") or []
    return next(iter(states), None) if len(states) == 1 else None


def site_admission(workload: Mapping[str, Any] | None) -> tuple[str, str, str, str]:
    """(admission, cluster, reason, message) of a site's Workload in the manager:
    Admitted once Kueue admitted it (the MultiKueue check Ready, a worker admitted its
    copy), Rejected when the check rejected it, else Pending with Kueue's reason."""
    if workload is None:
        return "Pending", "", "WorkloadNotCreated", "Kueue has not created its Workload yet"
    st = workload.get("status") or {}
    cluster = str(st.get("clusterName") or "")
    states = st.get("admissionChecks") or []
    rejected = next((c for c in states if c.get("state") == "Rejected"), None)
    if rejected is not None:
        return "Rejected", cluster, "AdmissionCheckRejected", str(rejected.get("message") or "")
    admitted = _condition(workload, "Admitted")
    if admitted is not None and admitted.get("status") == "True":
        return "Admitted", cluster, "Admitted", str(admitted.get("message") or "")
    reserved = _condition(workload, "QuotaReserved")
    if reserved is None or reserved.get("status") != "True":
        reason = str((reserved or {}).get("reason") or "Pending")
        message = str((reserved or {}).get("message") or "waiting for quota in the manager")
        return "Pending", cluster, reason, message
    pending = next((c for c in states if c.get("state") != "Ready"), None)
    text = str((pending or {}).get("message") or "waiting for a worker cluster to admit it")
    return "Pending", cluster, "AdmissionCheckPending", text
