"""A simulated Kueue (kueue.x-k8s.io/v1beta2, as of Kueue v0.19.2) for the emulated API server:
its CRDs (``crds/kueue.x-k8s.io.yaml``: ResourceFlavor, ClusterQueue, LocalQueue, Workload,
AdmissionCheck, MultiKueueConfig, MultiKueueCluster; only v1beta2 is served — v0.19.2 also
serves the deprecated v1beta1 through a conversion webhook, which the emulator cannot do) and
the part of its behaviour a queued TrainingPlan meets, reproduced from Kueue's sources
(``pkg/controller/jobframework``, ``pkg/controller/jobs/{job,jobset}``,
``pkg/scheduler/flavorassigner``, ``pkg/controller/core/workload_controller.go``,
``pkg/cache/scheduler/clusterqueue.go``, ``pkg/workload``):

* **Webhook.** A batch/v1 Job or a JobSet labelled ``kueue.x-k8s.io/queue-name`` is created
  suspended; the label cannot change while it runs. A JobSet whose queue's ClusterQueue has a
  MultiKueue AdmissionCheck gets ``spec.managedBy: kueue.x-k8s.io/multikueue`` when it has none
  (``ApplyDefaultForManagedBy``).
* **Workloads.** Each queued JobSet gets one Workload — one pod set per replicated Job, named
  after it, ``count`` = parallelism × replicas, its pod template (checked against Kubernetes'
  own PodTemplateSpec schema), ``topologyRequest`` as Kueue sets it with Topology-Aware
  Scheduling on (the default) — and each queued Job (not owned by a JobSet) one with pod set
  ``main``; named ``<kind>-<name>-<hash>``, owned by the object (controller), labelled
  ``kueue.x-k8s.io/job-uid``. An object naming a *prebuilt* Workload (annotation or label
  ``kueue.x-k8s.io/prebuilt-workload-name``, as MultiKueue's copies in a worker do) adopts it
  (controller reference, ``job-uid`` label) instead.
* **ClusterQueues.** ``status.conditions`` ``Active``: False (and nothing admitted) while a
  ResourceFlavor or an AdmissionCheck it names is missing, a check is not Active, it has more
  than one MultiKueue check or one with ``onFlavors``, or it is stopped — Kueue's reasons and
  "Can't admit new workloads: …" messages.
* **Admission checks.** A Workload gets one ``status.admissionChecks[]`` entry per check of its
  ClusterQueue (``spec.admissionChecksStrategy.admissionChecks``), ``Pending``. With checks,
  quota is reserved first (``QuotaReserved`` True) and ``Admitted`` comes only once every check
  is ``Ready`` (the check's controller sets that: :mod:`support.multikueue`). A check in
  ``Retry`` evicts the Workload (``Evicted``, reason ``AdmissionCheck``, quota released, checks
  back to Pending, admitted again later); one in ``Rejected`` deactivates it
  (``spec.active: false``, ``Evicted`` reason ``DeactivatedDueToAdmissionCheck``).
* **Admission.** A Workload whose LocalQueue and (active) ClusterQueue exist is admitted whole
  or not at all: every pod set gets, in the ClusterQueue's order, the first flavor that covers
  its resources, matches its node selector on the flavor's ``nodeLabels``, tolerates the
  flavor's ``nodeTaints`` and has enough unused ``nominalQuota`` (admitted, unfinished
  Workloads use it). Reserved: ``status.admission`` (ClusterQueue, per pod set its flavors,
  resource usage and count) and ``QuotaReserved``; once ``Admitted`` the owner is unsuspended
  with each flavor's ``nodeLabels`` and ``tolerations`` merged into its pod set's template, and
  Kueue's pod labels (``kueue.x-k8s.io/podset``, ``…/local-queue-name``,
  ``…/cluster-queue-name``, ``…/multikueue-worker-workload-pod`` for a MultiKueue copy) and
  annotation ``kueue.x-k8s.io/workload``. An owner running without admission is suspended.
  Not admitted: ``QuotaReserved`` False, reason ``Pending`` and Kueue's message ("couldn't
  assign flavors to pod set g0: insufficient quota for nvidia.com/gpu in flavor h200, request >
  maximum capacity (16 > 8)"), or ``Inadmissible`` for a missing or inactive queue.
* **Finishing and eviction.** A finished owner finishes its Workload (``Finished``) and frees
  its quota; :meth:`Kueue.evict` preempts one (``Evicted``, quota released, owner suspended).

Not simulated: cohorts and borrowing, preemption decisions, fair sharing, topology-aware
placement (the ``topologyRequest`` is recorded, no ``topologyAssignment`` made), partial
admission, priorities, requeue backoff, the ``resource-in-use`` finalizer, ``OutOfSync``
prebuilt Workloads, LocalQueue/ClusterQueue usage counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kmock

from support import kueue_status as st
from support.jobset import GROUP as JOBSET_GROUP
from support.jobset import JOBSET_CONTROLLER_NAME, JOBSETS
from support.kube_emulator import JOBS, Body, KubeEmulator, api_error, builtins
from support.kueue_jobs import (
    CLUSTER_QUEUE_POD_LABEL,
    LOCAL_QUEUE_POD_LABEL,
    MULTIKUEUE_ORIGIN_LABEL,
    MULTIKUEUE_WORKER_POD_LABEL,
    PODSET_LABEL,
    PREBUILT_WORKLOAD_KEY,
    WORKLOAD_ANNOTATION,
    pod_sets,
    prebuilt_workload,
    run_with_pod_sets_info,
    workload_name,
)
from support.kueue_quota import Usage, add_usage, assign

__all__ = [  # the public names, with those of kueue_jobs
    "ADMISSION_CHECKS",
    "API_VERSION",
    "CLUSTER_QUEUES",
    "CLUSTER_QUEUE_POD_LABEL",
    "CRD_FILE",
    "FLAVORS",
    "GROUP",
    "JOB_UID_LABEL",
    "LOCAL_QUEUES",
    "LOCAL_QUEUE_POD_LABEL",
    "MULTIKUEUE_CLUSTERS",
    "MULTIKUEUE_CONFIGS",
    "MULTIKUEUE_CONTROLLER",
    "MULTIKUEUE_ORIGIN_LABEL",
    "MULTIKUEUE_WORKER_POD_LABEL",
    "PODSET_LABEL",
    "PREBUILT_WORKLOAD_KEY",
    "QUEUE_LABEL",
    "VERSION",
    "WORKLOADS",
    "WORKLOAD_ANNOTATION",
    "Kueue",
    "pod_sets",
    "prebuilt_workload",
    "run_with_pod_sets_info",
    "workload_name",
]

CRD_FILE = Path(__file__).resolve().parent / "crds" / "kueue.x-k8s.io.yaml"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
WORKLOADS = kmock.resource(GROUP, VERSION, "workloads")
LOCAL_QUEUES = kmock.resource(GROUP, VERSION, "localqueues")
CLUSTER_QUEUES = kmock.resource(GROUP, VERSION, "clusterqueues")
FLAVORS = kmock.resource(GROUP, VERSION, "resourceflavors")
ADMISSION_CHECKS = kmock.resource(GROUP, VERSION, "admissionchecks")
MULTIKUEUE_CONFIGS = kmock.resource(GROUP, VERSION, "multikueueconfigs")
MULTIKUEUE_CLUSTERS = kmock.resource(GROUP, VERSION, "multikueueclusters")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
"""An AdmissionCheck's ``spec.controllerName`` for MultiKueue, and a JobSet's ``managedBy``."""


class Kueue:
    """The simulated Kueue of one emulator (see the module docstring)."""

    def __init__(self, emulator: KubeEmulator) -> None:
        self.emu = emulator
        self.errors: list[Exception] = []

    @classmethod
    def install(cls, emulator: KubeEmulator) -> Kueue:
        emulator.load_crds(CRD_FILE)
        kueue = cls(emulator)
        emulator.mutating_webhooks.append(kueue._mutate)
        emulator.validating_webhooks.append(kueue._validate)
        return kueue

    # ---- webhook -----------------------------------------------------------------------------
    @staticmethod
    def _managed(resource: kmock.resource) -> bool:
        return (resource.group, resource.plural) in (("batch", "jobs"), (JOBSETS.group, "jobsets"))

    def _mutate(self, op: str, resource: kmock.resource, obj: Body, old: Body | None) -> None:
        labels = obj["metadata"].get("labels") or {}
        if op != "CREATE" or not self._managed(resource) or not labels.get(QUEUE_LABEL):
            return
        obj.setdefault("spec", {})["suspend"] = True
        if resource.plural == "jobsets" and obj["spec"].get("managedBy") in (
            None,
            JOBSET_CONTROLLER_NAME,
        ):
            lq = self.emu.get_object(
                LOCAL_QUEUES, obj["metadata"].get("namespace"), labels[QUEUE_LABEL]
            )
            cq = self._get(CLUSTER_QUEUES, (lq or {}).get("spec", {}).get("clusterQueue", ""))
            if cq is not None and any(
                (self._get(ADMISSION_CHECKS, name) or {}).get("spec", {}).get("controllerName")
                == MULTIKUEUE_CONTROLLER
                for name in self.check_names(cq)
            ):
                obj["spec"]["managedBy"] = MULTIKUEUE_CONTROLLER

    def _validate(self, op: str, resource: kmock.resource, obj: Body, old: Body | None) -> None:
        if op != "UPDATE" or old is None or not self._managed(resource):
            return
        before = (old["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        after = (obj["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        if before != after and not old["spec"].get("suspend"):
            raise api_error(422, "Invalid", f"metadata.labels[{QUEUE_LABEL}]: field is immutable")

    # ---- reading ----------------------------------------------------------------------------
    def _get(self, resource: kmock.resource, name: str) -> Body | None:
        return self.emu.get_object(resource, None, name) if name else None

    @staticmethod
    def check_names(cq: Mapping[str, Any]) -> list[str]:
        """The AdmissionChecks of a ClusterQueue (``spec.admissionChecksStrategy``)."""
        strategy = (cq.get("spec") or {}).get("admissionChecksStrategy") or {}
        return [c["name"] for c in strategy.get("admissionChecks") or []]

    def cluster_queue_of(self, wl: Body) -> tuple[Body | None, str]:
        """The Workload's ClusterQueue, or None and why it is inadmissible."""
        ns, queue = wl["metadata"]["namespace"], wl["spec"].get("queueName", "")
        lq = self.emu.get_object(LOCAL_QUEUES, ns, queue) if queue else None
        if lq is None:
            return None, f"LocalQueue {queue} doesn't exist"
        name = lq["spec"].get("clusterQueue", "")
        cq = self._get(CLUSTER_QUEUES, name)
        if cq is None:
            return None, f"ClusterQueue {name} doesn't exist"
        return cq, ""

    def inactive_reason(self, cq: Body) -> tuple[str, str] | None:
        """``clusterQueue.inactiveReason``: why a ClusterQueue cannot admit, or None."""
        spec = cq.get("spec") or {}
        reasons: list[tuple[str, str]] = []
        if spec.get("stopPolicy", "None") != "None":
            reasons.append(("Stopped", "is stopped"))
        flavors = [f["name"] for g in spec.get("resourceGroups") or [] for f in g["flavors"]]
        missing = [f for f in flavors if self._get(FLAVORS, f) is None]
        if missing:
            reasons.append(
                ("FlavorNotFound", f"references missing ResourceFlavor(s): {','.join(missing)}")
            )
        names = self.check_names(cq)
        checks = {n: self._get(ADMISSION_CHECKS, n) for n in names}
        if absent := sorted(n for n, ac in checks.items() if ac is None):
            reasons.append(
                (
                    "AdmissionCheckNotFound",
                    f"references missing AdmissionCheck(s): {','.join(absent)}",
                )
            )
        inactive = sorted(
            n for n, ac in checks.items() if ac is not None and not st.condition(ac, "Active")
        )
        if inactive:
            reasons.append(
                (
                    "AdmissionCheckInactive",
                    f"references inactive AdmissionCheck(s): {','.join(inactive)}",
                )
            )
        mk = sorted(
            n
            for n, ac in checks.items()
            if ac is not None and ac["spec"].get("controllerName") == MULTIKUEUE_CONTROLLER
        )
        if len(mk) > 1:
            reasons.append(
                (
                    "MultipleMultiKueueAdmissionChecks",
                    "Cannot use multiple MultiKueue AdmissionChecks on the same ClusterQueue, "
                    f"found: {','.join(mk)}",
                )
            )
        strategy = spec.get("admissionChecksStrategy") or {}
        per_flavor = [
            c["name"]
            for c in strategy.get("admissionChecks") or []
            if c["name"] in mk and c.get("onFlavors")
        ]
        if per_flavor:
            reasons.append(
                (
                    "MultiKueueAdmissionCheckAppliedPerFlavor",
                    f"Cannot specify MultiKueue AdmissionCheck per flavor, found: {','.join(per_flavor)}",
                )
            )
        if not reasons:
            return None
        return reasons[0][0], f"Can't admit new workloads: {', '.join(m for _, m in reasons)}."

    # ---- reconciling -------------------------------------------------------------------------
    def reconcile(self) -> None:
        """One pass: ClusterQueues' Active condition, Workloads for queued objects, then the
        Workloads in creation order."""
        with contextlib.suppress(kmock.KubernetesError):  # Kueue's CRDs may have been removed
            for cq in self.emu.select(CLUSTER_QUEUES):
                self._reconcile_cluster_queue(cq)
        with contextlib.suppress(kmock.KubernetesError):  # JobSet may not be installed
            for js in self.emu.select(JOBSETS):
                self._ensure_workload(js, "JobSet", JOBSET_GROUP)
        for job in self.emu.select(JOBS):
            refs = job["metadata"].get("ownerReferences") or []
            if not any(r.get("controller") and r.get("kind") == "JobSet" for r in refs):
                self._ensure_workload(job, "Job", "batch")  # a JobSet's Jobs are its Workload's
        workloads = sorted(
            self.emu.select(WORKLOADS), key=lambda w: int(w["metadata"]["resourceVersion"])
        )
        for wl in workloads:
            self._reconcile(wl)

    async def run(self, interval_s: float = 0.05) -> None:
        """Reconcile until cancelled (a background task, like the real controller); a pass
        that raises is recorded in ``errors`` (a test asserts there are none)."""
        while True:
            try:
                self.reconcile()
            except Exception as exc:
                self.errors.append(exc)
            await asyncio.sleep(interval_s)

    def _reconcile_cluster_queue(self, cq: Body) -> None:
        status = copy.deepcopy(cq.get("status") or {})
        inactive = self.inactive_reason(cq)
        if inactive is None:
            st.set_condition(status, "Active", True, "Ready", "Can admit new workloads")
        else:
            st.set_condition(status, "Active", False, *inactive)
        if status != (cq.get("status") or {}):
            self.emu.replace(
                CLUSTER_QUEUES,
                None,
                cq["metadata"]["name"],
                {**cq, "status": status},
                subresource="status",
            )

    def _ensure_workload(self, obj: Body, kind: str, group: str) -> None:
        meta = obj["metadata"]
        queue = (meta.get("labels") or {}).get(QUEUE_LABEL)
        if not queue or meta.get("deletionTimestamp"):
            return
        if prebuilt := prebuilt_workload(obj):
            self._adopt(obj, prebuilt)
            return
        name = workload_name(kind, group, meta["name"], meta["uid"])
        if self.emu.get_object(WORKLOADS, meta["namespace"], name) is not None:
            return
        sets = pod_sets(obj, kind)
        for i, ps in enumerate(sets):
            errors = builtins.definition_errors(
                ps["template"], "io.k8s.api.core.v1.PodTemplateSpec", f"spec.podSets[{i}].template"
            )
            if errors:
                raise AssertionError(
                    f"Kueue could not create a Workload for {kind} {meta['name']}: {errors}"
                )
        self.emu.create(
            WORKLOADS,
            meta["namespace"],
            {
                "apiVersion": API_VERSION,
                "kind": "Workload",
                "metadata": {
                    "name": name,
                    "namespace": meta["namespace"],
                    "labels": {JOB_UID_LABEL: meta["uid"]},
                    "ownerReferences": [self._owner_reference(obj, kind)],
                },
                "spec": {"queueName": queue, "podSets": sets},
            },
        )

    @staticmethod
    def _owner_reference(obj: Body, kind: str) -> Body:
        return {
            "apiVersion": obj["apiVersion"],
            "kind": kind,
            "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _adopt(self, obj: Body, name: str) -> None:
        """``EnsurePrebuiltWorkloadOwnership``: the named Workload gets the object as its
        controller and the ``job-uid`` label (nothing happens while it does not exist)."""
        meta = obj["metadata"]
        wl = self.emu.get_object(WORKLOADS, meta["namespace"], name)
        if wl is None or any(
            r.get("controller") and r.get("uid") == meta["uid"]
            for r in wl["metadata"].get("ownerReferences") or []
        ):
            return
        body = copy.deepcopy(wl)
        kind = obj["kind"]
        body["metadata"]["ownerReferences"] = [
            *(r for r in wl["metadata"].get("ownerReferences") or [] if not r.get("controller")),
            self._owner_reference(obj, kind),
        ]
        body["metadata"].setdefault("labels", {})[JOB_UID_LABEL] = meta["uid"]
        self.emu.replace(WORKLOADS, meta["namespace"], name, body)

    def _owner(self, wl: Body) -> tuple[kmock.resource, Body | None]:
        ref = next(
            (r for r in wl["metadata"].get("ownerReferences") or [] if r.get("controller")), None
        )
        if ref is None:
            return JOBS, None  # a prebuilt Workload not adopted yet
        resource = JOBSETS if ref["kind"] == "JobSet" else JOBS
        obj = self.emu.get_object(resource, wl["metadata"]["namespace"], ref["name"])
        return resource, obj if obj is not None and obj["metadata"]["uid"] == ref["uid"] else None

    def _write_status(self, wl: Body, status: Body) -> Body:
        meta = wl["metadata"]
        return self.emu.replace(
            WORKLOADS,
            meta["namespace"],
            meta["name"],
            {**wl, "status": status},
            subresource="status",
        )

    def _reconcile(self, wl: Body) -> None:
        if st.condition(wl, "Finished"):
            return
        resource, owner = self._owner(wl)
        status = copy.deepcopy(wl.get("status") or {})
        done = owner is not None and (
            st.condition(owner, "Completed") or st.condition(owner, "Complete")
        )
        failed = owner is not None and st.condition(owner, "Failed")
        if done or failed:
            st.set_condition(
                status,
                "Finished",
                True,
                "Succeeded" if done else "Failed",
                str((done or failed or {}).get("message") or ""),
            )
        else:
            cq, _ = self.cluster_queue_of(wl)
            if cq is not None:
                st.sync_check_states(status, self.check_names(cq))
            if not self._check_based_eviction(wl, status) and wl["spec"].get("active", True):
                if not st.is_true(status, "QuotaReserved"):
                    self._admit(wl, status)
                st.sync_admitted(status)
        if status != (wl.get("status") or {}):
            wl = self._write_status(wl, status)
        if owner is None or st.condition(wl, "Finished"):
            return
        if st.condition(wl, "Admitted") and owner["spec"].get("suspend"):
            self._start(resource, owner, wl)
        elif not st.condition(wl, "Admitted") and not owner["spec"].get("suspend"):
            self.emu.patch(
                resource,
                owner["metadata"]["namespace"],
                owner["metadata"]["name"],
                {"spec": {"suspend": True}},
            )

    def _check_based_eviction(self, wl: Body, status: Body) -> bool:
        """``reconcileCheckBasedEviction`` and the job reconciler's handling of it: a Rejected
        check deactivates the Workload, a Retry check evicts it; either releases the quota."""
        rejected, retry = st.checks_in(status, st.REJECTED), st.checks_in(status, st.RETRY)
        if not (rejected or retry) or st.is_true(status, "Evicted"):
            return False
        if rejected:
            message = "The workload is deactivated due to " + st.checks_message(
                rejected, st.REJECTED
            )
            meta = wl["metadata"]
            wl.update(  # later writes go on from the deactivated Workload
                self.emu.patch(
                    WORKLOADS, meta["namespace"], meta["name"], {"spec": {"active": False}}
                )[1]
            )
            st.evict(status, "DeactivatedDueToAdmissionCheck", message)
        else:
            message = "Evicted due to " + st.checks_message(retry, st.RETRY)
            st.evict(status, "AdmissionCheck", message)
        st.unset_quota(status, "Pending", message)
        return True

    def _admit(self, wl: Body, status: Body) -> None:
        cq, why = self.cluster_queue_of(wl)
        if cq is None:
            st.set_condition(status, "QuotaReserved", False, "Inadmissible", why)
            return
        if self.inactive_reason(cq) is not None:
            name = cq["metadata"]["name"]
            st.set_condition(
                status, "QuotaReserved", False, "Inadmissible", f"ClusterQueue {name} is inactive"
            )
            return
        cq_name = cq["metadata"]["name"]
        used = self._usage(cq_name, wl["metadata"]["uid"])
        assignments, problems = [], []
        for ps in wl["spec"]["podSets"]:
            assigned, why = assign(cq, ps, used, self._flavor_spec)
            if assigned is None:
                problems.append(f"couldn't assign flavors to pod set {ps['name']}: {why}")
            else:
                assignments.append(assigned)
        if problems:
            st.set_condition(status, "QuotaReserved", False, "Pending", "; ".join(problems))
            return
        st.reserve_quota(status, {"clusterQueue": cq_name, "podSetAssignments": assignments})

    def _flavor_spec(self, name: str) -> Mapping[str, Any]:
        return (self._get(FLAVORS, name) or {}).get("spec") or {}

    def _usage(self, cq: str, skip_uid: str) -> Usage:
        """(flavor, resource) → quantity reserved by the ClusterQueue's unfinished Workloads."""
        out: Usage = {}
        for wl in self.emu.select(WORKLOADS):
            admission = (wl.get("status") or {}).get("admission") or {}
            if (
                wl["metadata"]["uid"] != skip_uid
                and admission.get("clusterQueue") == cq
                and not st.condition(wl, "Finished")
            ):
                add_usage(out, admission)
        return out

    def _start(self, resource: kmock.resource, owner: Body, wl: Body) -> None:
        kind = "JobSet" if resource == JOBSETS else "Job"
        body = run_with_pod_sets_info(owner, kind, wl, self._flavor_spec)
        self.emu.replace(resource, owner["metadata"]["namespace"], owner["metadata"]["name"], body)

    def evict(
        self,
        namespace: str,
        name: str,
        reason: str = "Preempted",
        message: str = "Preempted to accommodate a higher priority Workload",
    ) -> None:
        """Evict an admitted Workload (as preemption does): quota released, owner suspended."""
        wl = self.emu.read(WORKLOADS, namespace, name)
        status = copy.deepcopy(wl.get("status") or {})
        st.evict(status, reason, message)
        st.unset_quota(status, reason, message)
        self._write_status(wl, status)
        resource, owner = self._owner(wl)
        if owner is not None:
            self.emu.patch(
                resource, namespace, owner["metadata"]["name"], {"spec": {"suspend": True}}
            )

    def workload_of(self, namespace: str, owner_uid: str) -> Body | None:
        found = self.emu.select(WORKLOADS, namespace, label_selector=f"{JOB_UID_LABEL}={owner_uid}")
        return found[0] if found else None
