"""A simulated Kueue (kueue.x-k8s.io/v1beta1, as of Kueue v0.9–v0.15) for the emulated API
server: its CRDs (``crds/kueue.x-k8s.io.yaml``: ResourceFlavor, ClusterQueue, LocalQueue,
Workload) and the part of its behaviour a queued TrainingPlan meets, reproduced from Kueue's
sources (``pkg/controller/jobframework``, ``pkg/controller/jobs/{job,jobset}``,
``pkg/scheduler/flavorassigner``, ``pkg/controller/core/workload_controller.go``):

* **Webhook.** A batch/v1 Job or a JobSet labelled ``kueue.x-k8s.io/queue-name`` is created
  suspended; the label cannot change while it runs.
* **Workloads.** Each queued JobSet gets one Workload — one pod set per replicated Job, named
  after it, ``count`` = parallelism × replicas, its pod template (checked against Kubernetes'
  own PodTemplateSpec schema) — and each queued Job (not owned by a JobSet) one with pod set
  ``main``; named ``<kind>-<name>-<hash>``, owned by the object (controller), labelled
  ``kueue.x-k8s.io/job-uid``.
* **Admission.** A Workload whose LocalQueue and ClusterQueue exist is admitted whole or not
  at all: every pod set gets, in the ClusterQueue's order, the first flavor that covers its
  resources, matches its node selector on the flavor's ``nodeLabels``, tolerates the flavor's
  ``nodeTaints`` and has enough unused ``nominalQuota`` (admitted, unfinished Workloads use
  it). Admitted: ``status.admission`` (ClusterQueue, per pod set its flavors, resource usage
  and count) and ``QuotaReserved``/``Admitted`` True, then the owner is unsuspended with each
  flavor's ``nodeLabels`` and ``tolerations`` merged into its pod set's template. Not
  admitted: ``QuotaReserved`` False, reason ``Pending`` and Kueue's message ("couldn't assign
  flavors to pod set g0: insufficient quota for nvidia.com/gpu in flavor h200, request >
  maximum capacity (16 > 8)"), or ``Inadmissible`` for a missing queue.
* **Finishing and eviction.** A finished owner finishes its Workload (``Finished``) and frees
  its quota; :meth:`Kueue.evict` preempts one (``Evicted``, quota released, owner suspended).

Not simulated: cohorts and borrowing, preemption decisions, fair sharing, admission checks,
topology-aware scheduling, partial admission, priorities.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import kmock

from support.jobset import JOBSETS
from support.kube_emulator import JOBS, Body, KubeEmulator, api_error, builtins, now_iso

CRD_FILE = Path(__file__).resolve().parent / "crds" / "kueue.x-k8s.io.yaml"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
WORKLOADS = kmock.resource(GROUP, VERSION, "workloads")
LOCAL_QUEUES = kmock.resource(GROUP, VERSION, "localqueues")
CLUSTER_QUEUES = kmock.resource(GROUP, VERSION, "clusterqueues")
FLAVORS = kmock.resource(GROUP, VERSION, "resourceflavors")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
_SUFFIX = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SUFFIX |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: Any) -> Decimal:
    """A Kubernetes resource quantity (the suffixes ShardMeter's tests use)."""
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"unsupported quantity {value!r}")
    return Decimal(m.group(1)) * Decimal(_SUFFIX[m.group(2)])


def _show(q: Decimal) -> str:
    return str(int(q)) if q == q.to_integral_value() else str(q.normalize())


def _cond(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def _set(status: Body, type_: str, value: bool, reason: str, message: str) -> None:
    want = "True" if value else "False"
    conditions = status.setdefault("conditions", [])
    for c in conditions:
        if c["type"] == type_:
            if c["status"] != want:
                c["lastTransitionTime"] = now_iso()
            c.update(status=want, reason=reason, message=message)
            return
    conditions.append(
        {
            "type": type_,
            "status": want,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_iso(),
        }
    )


def workload_name(kind: str, group: str, name: str, uid: str) -> str:
    """Kueue's ``GetWorkloadNameForOwnerWithGVK``."""
    digest = hashlib.sha1(f"{kind}\n{group}\n{name}\n{uid}".encode()).hexdigest()[:5]
    return f"{kind.lower()}-{name}"[: 252 - 5] + "-" + digest


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """Per-pod requests: each container's requests, limits where requests are unset."""
    out: dict[str, Decimal] = {}
    for c in pod_spec.get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, value in merged.items():
            out[name] = out.get(name, Decimal(0)) + quantity(value)
    return out


def _tolerated(taint: Mapping[str, Any], tolerations: list[Mapping[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("key") and t.get("key") != taint.get("key"):
            continue
        if not t.get("key") and t.get("operator") != "Exists":
            continue
        if t.get("operator") == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


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
        if op == "CREATE" and self._managed(resource) and labels.get(QUEUE_LABEL):
            obj.setdefault("spec", {})["suspend"] = True

    def _validate(self, op: str, resource: kmock.resource, obj: Body, old: Body | None) -> None:
        if op != "UPDATE" or old is None or not self._managed(resource):
            return
        before = (old["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        after = (obj["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        if before != after and not old["spec"].get("suspend"):
            raise api_error(422, "Invalid", f"metadata.labels[{QUEUE_LABEL}]: field is immutable")

    # ---- reconciling -------------------------------------------------------------------------
    def reconcile(self) -> None:
        """One pass: Workloads for queued objects, then admission in creation order."""
        with contextlib.suppress(kmock.KubernetesError):  # JobSet may not be installed
            for js in self.emu.select(JOBSETS):
                self._ensure_workload(js, "JobSet", JOBSETS.group)
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

    def _ensure_workload(self, obj: Body, kind: str, group: str) -> None:
        meta = obj["metadata"]
        queue = (meta.get("labels") or {}).get(QUEUE_LABEL)
        if not queue or meta.get("deletionTimestamp"):
            return
        name = workload_name(kind, group, meta["name"], meta["uid"])
        if self.emu.get_object(WORKLOADS, meta["namespace"], name) is not None:
            return
        if kind == "JobSet":
            pod_sets = [
                {
                    "name": r["name"],
                    "count": int(r["template"]["spec"].get("parallelism") or 1)
                    * int(r.get("replicas", 1)),
                    "template": copy.deepcopy(r["template"]["spec"]["template"]),
                }
                for r in obj["spec"]["replicatedJobs"]
            ]
        else:
            pod_sets = [
                {
                    "name": "main",
                    "count": int(obj["spec"].get("parallelism") or 1),
                    "template": copy.deepcopy(obj["spec"]["template"]),
                }
            ]
        for i, ps in enumerate(pod_sets):
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
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Workload",
                "metadata": {
                    "name": name,
                    "namespace": meta["namespace"],
                    "labels": {JOB_UID_LABEL: meta["uid"]},
                    "ownerReferences": [
                        {
                            "apiVersion": obj["apiVersion"],
                            "kind": kind,
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {"queueName": queue, "podSets": pod_sets},
            },
        )

    def _owner(self, wl: Body) -> tuple[kmock.resource, Body | None]:
        ref = wl["metadata"]["ownerReferences"][0]
        resource = JOBSETS if ref["kind"] == "JobSet" else JOBS
        obj = self.emu.get_object(resource, wl["metadata"]["namespace"], ref["name"])
        return resource, obj if obj is not None and obj["metadata"]["uid"] == ref["uid"] else None

    def _reconcile(self, wl: Body) -> None:
        if _cond(wl, "Finished"):
            return
        resource, owner = self._owner(wl)
        if owner is None:
            return
        status = copy.deepcopy(wl.get("status") or {})
        done = _cond(owner, "Completed") or _cond(owner, "Complete")
        failed = _cond(owner, "Failed")
        if done or failed:
            _set(
                status,
                "Finished",
                True,
                "Succeeded" if done else "Failed",
                str((done or failed or {}).get("message") or ""),
            )
        elif not _cond(wl, "QuotaReserved"):
            self._admit(wl, status)
        if status != (wl.get("status") or {}):
            wl = self.emu.patch(
                WORKLOADS,
                wl["metadata"]["namespace"],
                wl["metadata"]["name"],
                {"status": status},
                subresource="status",
            )[1]
        if _cond(wl, "Admitted") and owner["spec"].get("suspend"):
            self._start(resource, owner, wl)

    def _admit(self, wl: Body, status: Body) -> None:
        ns, queue = wl["metadata"]["namespace"], wl["spec"]["queueName"]
        lq = self.emu.get_object(LOCAL_QUEUES, ns, queue)
        if lq is None:
            _set(
                status, "QuotaReserved", False, "Inadmissible", f"LocalQueue {queue} doesn't exist"
            )
            return
        cq_name = lq["spec"].get("clusterQueue", "")
        cq = self.emu.get_object(CLUSTER_QUEUES, None, cq_name)
        if cq is None:
            _set(
                status,
                "QuotaReserved",
                False,
                "Inadmissible",
                f"ClusterQueue {cq_name} doesn't exist",
            )
            return
        used = self._usage(cq_name, wl["metadata"]["uid"])
        assignments, problems = [], []
        for ps in wl["spec"]["podSets"]:
            assigned, why = self._assign(cq, ps, used)
            if assigned is None:
                problems.append(f"couldn't assign flavors to pod set {ps['name']}: {why}")
            else:
                assignments.append(assigned)
        if problems:
            _set(status, "QuotaReserved", False, "Pending", "; ".join(problems))
            return
        status["admission"] = {"clusterQueue": cq_name, "podSetAssignments": assignments}
        _set(
            status,
            "QuotaReserved",
            True,
            "QuotaReserved",
            f"Quota reserved in ClusterQueue {cq_name}",
        )
        _set(status, "Admitted", True, "Admitted", "The workload is admitted")

    def _usage(self, cq: str, skip_uid: str) -> dict[tuple[str, str], Decimal]:
        """(flavor, resource) → quantity reserved by the ClusterQueue's unfinished Workloads."""
        out: dict[tuple[str, str], Decimal] = {}
        for wl in self.emu.select(WORKLOADS):
            admission = (wl.get("status") or {}).get("admission") or {}
            if (
                wl["metadata"]["uid"] == skip_uid
                or admission.get("clusterQueue") != cq
                or _cond(wl, "Finished")
            ):
                continue
            for a in admission.get("podSetAssignments") or []:
                for res, flavor in (a.get("flavors") or {}).items():
                    q = quantity((a.get("resourceUsage") or {}).get(res, 0))
                    out[(flavor, res)] = out.get((flavor, res), Decimal(0)) + q
        return out

    def _assign(
        self, cq: Body, ps: Body, used: dict[tuple[str, str], Decimal]
    ) -> tuple[Body | None, str]:
        pod = ps["template"].get("spec") or {}
        per_pod = pod_requests(pod)
        need = {r: q * int(ps["count"]) for r, q in per_pod.items() if q}
        selector = pod.get("nodeSelector") or {}
        reasons: list[str] = []
        flavors: dict[str, str] = {}
        for res in sorted(need):
            group = next(
                (g for g in cq["spec"].get("resourceGroups") or [] if res in g["coveredResources"]),
                None,
            )
            if group is None:
                return None, f"resource {res} unavailable in ClusterQueue"
            chosen = None
            for fq in group["flavors"]:
                flavor = self.emu.get_object(FLAVORS, None, fq["name"])
                fspec = (flavor or {}).get("spec") or {}
                labels = fspec.get("nodeLabels") or {}
                if any(k in selector and selector[k] != v for k, v in labels.items()):
                    reasons.append(f"flavor {fq['name']} doesn't match node affinity")
                    continue
                tolerations = [*(pod.get("tolerations") or []), *(fspec.get("tolerations") or [])]
                untolerated = [
                    t
                    for t in fspec.get("nodeTaints") or []
                    if t.get("effect") in ("NoSchedule", "NoExecute")
                    and not _tolerated(t, tolerations)
                ]
                if untolerated:
                    t = untolerated[0]
                    reasons.append(
                        f"untolerated taint {{{t['key']}: {t.get('value', '')}}} in flavor {fq['name']}"
                    )
                    continue
                quota = next((r for r in fq["resources"] if r["name"] == res), None)
                nominal = quantity(quota["nominalQuota"]) if quota else Decimal(0)
                free = nominal - used.get((fq["name"], res), Decimal(0))
                if need[res] > nominal:
                    reasons.append(
                        f"insufficient quota for {res} in flavor {fq['name']}, request > maximum capacity ({_show(need[res])} > {_show(nominal)})"
                    )
                elif need[res] > free:
                    reasons.append(
                        f"insufficient unused quota for {res} in flavor {fq['name']}, {_show(need[res] - free)} more needed"
                    )
                else:
                    chosen = fq["name"]
                    break
            if chosen is None:
                return None, ", ".join(reasons)
            flavors[res] = chosen
            used[(chosen, res)] = used.get((chosen, res), Decimal(0)) + need[res]
        return {
            "name": ps["name"],
            "flavors": flavors,
            "resourceUsage": {r: _show(q) for r, q in need.items()},
            "count": int(ps["count"]),
        }, ""

    def _start(self, resource: kmock.resource, owner: Body, wl: Body) -> None:
        """``RunWithPodSetsInfo``: each pod set's flavors' nodeLabels and tolerations merged
        into its template, then unsuspended."""
        body = copy.deepcopy(owner)
        assigned = {a["name"]: a for a in wl["status"]["admission"]["podSetAssignments"]}
        if resource == JOBSETS:
            templates = {
                r["name"]: r["template"]["spec"]["template"] for r in body["spec"]["replicatedJobs"]
            }
        else:
            templates = {"main": body["spec"]["template"]}
        for name, tmpl in templates.items():
            for flavor_name in set((assigned.get(name) or {}).get("flavors", {}).values()):
                fspec = (self.emu.get_object(FLAVORS, None, flavor_name) or {}).get("spec") or {}
                pod = tmpl.setdefault("spec", {})
                if fspec.get("nodeLabels"):
                    pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **fspec["nodeLabels"]}
                extra = [
                    t
                    for t in fspec.get("tolerations") or []
                    if t not in (pod.get("tolerations") or [])
                ]
                if extra:
                    pod["tolerations"] = [*(pod.get("tolerations") or []), *extra]
        body["spec"]["suspend"] = False
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
        status.pop("admission", None)
        _set(status, "Evicted", True, reason, message)
        _set(status, "QuotaReserved", False, reason, message)
        _set(status, "Admitted", False, "NoReservation", "The workload has no reservation")
        self.emu.patch(WORKLOADS, namespace, name, {"status": status}, subresource="status")
        resource, owner = self._owner(wl)
        if owner is not None:
            self.emu.patch(
                resource, namespace, owner["metadata"]["name"], {"spec": {"suspend": True}}
            )

    def workload_of(self, namespace: str, owner_uid: str) -> Body | None:
        found = self.emu.select(WORKLOADS, namespace, label_selector=f"{JOB_UID_LABEL}={owner_uid}")
        return found[0] if found else None
