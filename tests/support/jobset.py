"""A simulated JobSet (jobset.x-k8s.io/v1alpha2, as of JobSet v0.12.0; what ShardMeter uses is
the same since v0.7) for the emulated API server: its CRD (``crds/jobset.x-k8s.io.yaml``), its
admission webhook and its controller — the behaviour ShardMeter's launches rely on, reproduced
from JobSet's sources (``pkg/webhooks/jobset_webhook.go``, ``pkg/controllers/{jobset_controller,
failure_policy,success_policy}.go``, ``pkg/features``):

* **Feature gates.** ``JobSetController.install(emu, feature_gates={"RestartJob": True})``;
  v0.12.0's defaults otherwise (``RestartJob`` is alpha and off: the ``RestartJob`` actions are
  refused and the individual restart counters are not kept).
* **Webhook.** Defaults on create: ``successPolicy`` All, ``startupPolicy`` AnyOrder, each Job
  template Indexed with pod ``restartPolicy`` OnFailure, ``network.enableDNSHostnames`` and
  ``publishNotReadyAddresses`` true, failure-policy rule names. Refuses (422): a child Job name
  ``<jobset>-<replicatedJob>-<last index>`` or pod name ``…-<last completion index>-abcde``
  that is not a DNS-1035 label, bad group names or subdomains, unknown replicated Jobs in the
  policies, invalid rule names or failure reasons, ``RestartJob`` actions without the gate (or
  with more than 1024 replicas), a ``spec.managedBy`` that is not a domain-prefixed path of at
  most 63 characters, and a Job template that fails Kubernetes' own JobTemplateSpec schema
  (strict). On update ``managedBy`` and the replicated Jobs are immutable, except the pod
  templates' labels, annotations, node selector, tolerations and scheduling gates while the
  JobSet is (or becomes) suspended — what Kueue changes.
* **Controller** (:meth:`JobSetController.reconcile`, one pass over every JobSet): a JobSet whose
  ``spec.managedBy`` names another controller (MultiKueue's ``kueue.x-k8s.io/multikueue``) is
  left alone. Otherwise: the headless Service ``<subdomain>`` (selector ``jobset-name``); the
  child Jobs of the current restart attempt, named ``<jobset>-<replicatedJob>-<jobIndex>``,
  labelled and annotated with JobSet's keys (``job-index``, ``job-global-index``,
  ``restart-attempt``, with the gate ``job-restart-attempt``, …), the pod template's
  ``subdomain`` set, suspended with the JobSet and resumed with its (Kueue-updated) pod
  template; Jobs of a previous attempt — ``restart-attempt`` below ``status.restarts``, or
  ``job-restart-attempt`` below their ``jobRestarts[jobIndex]`` — deleted (and so recreated);
  a failed Job applies the failure policy (:mod:`support.jobset_failure`); the success policy
  (All / Any over the target replicated Jobs) completes it; ``replicatedJobsStatus`` counts
  ready, succeeded, failed, active and suspended Jobs and keeps the individual restart
  counters.

Pods are not created (the emulator has none): the tests drive the child Jobs with the
emulator's simulated Job controller (``set_job_running/succeeded/failed``).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kmock

from support import jobset_failure
from support.jobset_webhook import (
    KUEUE_MUTABLE,
    RULE_NAME,
    VALID_FAILURE_REASONS,
    default,
    domain_prefixed_path_errors,
    job_name,
    validate_create,
    validate_update,
)
from support.kube_emulator import JOBS, Body, KubeEmulator, api_error, now_iso

__all__ = [  # the public names, with those of jobset_webhook
    "CRD_FILE",
    "FEATURE_GATES",
    "GLOBAL_REPLICAS_KEY",
    "GROUP",
    "GROUP_NAME_KEY",
    "GROUP_REPLICAS_KEY",
    "JOBSETS",
    "JOBSET_CONTROLLER_NAME",
    "JOBSET_NAME_KEY",
    "JOBSET_UID_KEY",
    "JOB_GLOBAL_INDEX_KEY",
    "JOB_GROUP_INDEX_KEY",
    "JOB_INDEX_KEY",
    "JOB_KEY",
    "JOB_RESTART_ATTEMPT_KEY",
    "KUEUE_MUTABLE",
    "REPLICATED_JOB_NAME_KEY",
    "REPLICATED_JOB_REPLICAS_KEY",
    "RESTART_ATTEMPT_KEY",
    "RULE_NAME",
    "SERVICES",
    "VALID_FAILURE_REASONS",
    "VERSION",
    "JobSetController",
    "construct_jobs",
    "default",
    "domain_prefixed_path_errors",
    "headless_service",
    "job_name",
    "managed_by_external",
    "subdomain",
    "validate_create",
    "validate_update",
]

CRD_FILE = Path(__file__).resolve().parent / "crds" / "jobset.x-k8s.io.yaml"
GROUP, VERSION = "jobset.x-k8s.io", "v1alpha2"
JOBSETS = kmock.resource(GROUP, VERSION, "jobsets")
SERVICES = kmock.resource("", "v1", "services")

JOBSET_NAME_KEY = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_KEY = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB_NAME_KEY = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS_KEY = "jobset.sigs.k8s.io/replicatedjob-replicas"
GLOBAL_REPLICAS_KEY = "jobset.sigs.k8s.io/global-replicas"
JOB_INDEX_KEY = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX_KEY = "jobset.sigs.k8s.io/job-global-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
RESTART_ATTEMPT_KEY = "jobset.sigs.k8s.io/restart-attempt"
GROUP_NAME_KEY = "jobset.sigs.k8s.io/group-name"
GROUP_REPLICAS_KEY = "jobset.sigs.k8s.io/group-replicas"
JOB_GROUP_INDEX_KEY = "jobset.sigs.k8s.io/job-group-index"
JOB_RESTART_ATTEMPT_KEY = "jobset.sigs.k8s.io/job-restart-attempt"
"""On a child Job (with the ``RestartJob`` gate): its ``jobRestarts[jobIndex]`` when made."""
JOBSET_CONTROLLER_NAME = "jobset.sigs.k8s.io/jobset-controller"
"""The ``spec.managedBy`` value (like none) that the JobSet controller reconciles."""
FEATURE_GATES = {"RestartJob": False}
"""JobSet v0.12.0's feature gates that the simulation knows, with their defaults."""


def _is_jobsets(resource: kmock.resource) -> bool:
    return resource.group == GROUP and resource.plural == "jobsets"


def managed_by_external(js: Mapping[str, Any]) -> str | None:
    """``managedByExternalController``: the other controller that manages the JobSet."""
    manager = (js.get("spec") or {}).get("managedBy")
    return manager if manager and manager != JOBSET_CONTROLLER_NAME else None


# ---- what the controller creates --------------------------------------------------------------
def _owner(js: Body) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "name": js["metadata"]["name"],
        "uid": js["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def subdomain(js: Mapping[str, Any]) -> str:
    return str((js["spec"].get("network") or {}).get("subdomain") or js["metadata"]["name"])


def headless_service(js: Body) -> Body:
    """The Service JobSet creates for its pods' hostnames (no ports, no labels)."""
    network = js["spec"].get("network") or {}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": subdomain(js),
            "namespace": js["metadata"]["namespace"],
            "ownerReferences": [_owner(js)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {JOBSET_NAME_KEY: js["metadata"]["name"]},
            "publishNotReadyAddresses": network.get("publishNotReadyAddresses", True),
        },
    }


def _jobset_keys(
    js: Body, rjob: Mapping[str, Any], index: int, restart_job_gate: bool
) -> dict[str, str]:
    rjobs = js["spec"]["replicatedJobs"]
    total = sum(int(r.get("replicas", 1)) for r in rjobs)
    before = 0
    for r in rjobs:
        if r["name"] == rjob["name"]:
            break
        before += int(r.get("replicas", 1))
    group = rjob.get("groupName", "default")
    in_group = [r for r in rjobs if r.get("groupName", "default") == group]
    group_before = 0
    for r in in_group:
        if r["name"] == rjob["name"]:
            break
        group_before += int(r.get("replicas", 1))
    name = job_name(js["metadata"]["name"], rjob["name"], index)
    key = hashlib.sha1(f"{js['metadata']['namespace']}/{name}".encode()).hexdigest()
    status = js.get("status") or {}
    individual = {}
    if restart_job_gate:
        restarts = jobset_failure.job_restarts(js, status, rjob["name"], "jobRestarts")
        individual = {JOB_RESTART_ATTEMPT_KEY: str(restarts[index])}
    return {
        JOBSET_NAME_KEY: js["metadata"]["name"],
        JOBSET_UID_KEY: js["metadata"]["uid"],
        REPLICATED_JOB_NAME_KEY: rjob["name"],
        RESTART_ATTEMPT_KEY: str(int(status.get("restarts") or 0)),
        **individual,
        REPLICATED_JOB_REPLICAS_KEY: str(int(rjob.get("replicas", 1))),
        GLOBAL_REPLICAS_KEY: str(total),
        JOB_INDEX_KEY: str(index),
        JOB_KEY: key,
        JOB_GLOBAL_INDEX_KEY: str(before + index),
        GROUP_NAME_KEY: group,
        GROUP_REPLICAS_KEY: str(sum(int(r.get("replicas", 1)) for r in in_group)),
        JOB_GROUP_INDEX_KEY: str(group_before + index),
    }


def construct_jobs(js: Body, *, restart_job_gate: bool = False) -> list[Body]:
    """The child Jobs of the JobSet's current restart attempt, as JobSet's ``constructJob``
    makes them: the replicated Job's template, JobSet's keys as labels and annotations on the
    Job and its pod template (``job-restart-attempt`` too with the ``RestartJob`` gate), the
    pod ``subdomain``, ``suspend`` as the JobSet's."""
    out = []
    dns = bool((js["spec"].get("network") or {}).get("enableDNSHostnames"))
    for rjob in js["spec"]["replicatedJobs"]:
        for index in range(int(rjob.get("replicas", 1))):
            template = copy.deepcopy(rjob["template"])
            keys = _jobset_keys(js, rjob, index, restart_job_gate)
            meta = template.get("metadata") or {}
            spec = template["spec"]
            pod_meta = spec["template"].setdefault("metadata", {})
            for obj_meta in (meta, pod_meta):
                obj_meta["labels"] = {**(obj_meta.get("labels") or {}), **keys}
                obj_meta["annotations"] = {**(obj_meta.get("annotations") or {}), **keys}
            if dns:
                spec["template"]["spec"]["subdomain"] = subdomain(js)
            spec["suspend"] = bool(js["spec"].get("suspend"))
            out.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": job_name(js["metadata"]["name"], rjob["name"], index),
                        "namespace": js["metadata"]["namespace"],
                        "labels": meta["labels"],
                        "annotations": meta["annotations"],
                        "ownerReferences": [_owner(js)],
                    },
                    "spec": spec,
                }
            )
    return out


# ---- the controller ---------------------------------------------------------------------------
def _cond(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def _set_condition(status: Body, type_: str, value: bool, reason: str, message: str) -> None:
    conditions = status.setdefault("conditions", [])
    want = "True" if value else "False"
    for c in conditions:
        if c["type"] == type_:
            if c["status"] != want:
                c["lastTransitionTime"] = now_iso()
            c.update(status=want, reason=reason, message=message)
            return
    if value:  # JobSet adds a condition only when it becomes true
        conditions.append(
            {
                "type": type_,
                "status": want,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now_iso(),
            }
        )


class JobSetController:
    """The simulated JobSet controller and webhook of one emulator (see the module docstring)."""

    def __init__(
        self, emulator: KubeEmulator, feature_gates: Mapping[str, bool] | None = None
    ) -> None:
        unknown = set(feature_gates or {}) - set(FEATURE_GATES)
        if unknown:
            raise ValueError(f"unknown JobSet feature gates {sorted(unknown)}: {FEATURE_GATES}")
        self.emu = emulator
        self.feature_gates = {**FEATURE_GATES, **(feature_gates or {})}
        self.errors: list[Exception] = []

    @property
    def restart_job_gate(self) -> bool:
        return self.feature_gates["RestartJob"]

    @classmethod
    def install(
        cls, emulator: KubeEmulator, feature_gates: Mapping[str, bool] | None = None
    ) -> JobSetController:
        """Load the CRD and register the webhook (as installing JobSet would), with JobSet's
        feature gates (``{"RestartJob": True}``; v0.12.0's defaults for the others)."""
        emulator.load_crds(CRD_FILE)
        ctl = cls(emulator, feature_gates)
        emulator.mutating_webhooks.append(ctl._mutate)
        emulator.validating_webhooks.append(ctl._validate)
        return ctl

    def _mutate(self, op: str, resource: kmock.resource, obj: Body, old: Body | None) -> None:
        if _is_jobsets(resource) and op == "CREATE":
            default(obj)

    def _validate(self, op: str, resource: kmock.resource, obj: Body, old: Body | None) -> None:
        if not _is_jobsets(resource):
            return
        if op == "CREATE":
            errors = validate_create(obj, restart_job_gate=self.restart_job_gate)
        else:
            errors = validate_update(old or {}, obj)
        if errors:
            name = obj["metadata"].get("name")
            raise api_error(
                422, "Invalid", f'JobSet.jobset.x-k8s.io "{name}" is invalid: ' + "; ".join(errors)
            )

    def reconcile(self) -> None:
        """One pass of the controller over every JobSet (none while JobSet's CRD is not
        installed: the real controller is uninstalled with it)."""
        try:
            jobsets = self.emu.select(JOBSETS)
        except kmock.KubernetesError as exc:
            if exc.status == 404:
                return
            raise
        for js in jobsets:
            if not js["metadata"].get("deletionTimestamp") and not managed_by_external(js):
                self._reconcile(js)

    async def run(self, interval_s: float = 0.05) -> None:
        """Reconcile until cancelled (a background task, like the real controller); a pass
        that raises is recorded in ``errors`` (a test asserts there are none)."""
        while True:
            try:
                self.reconcile()
            except Exception as exc:
                self.errors.append(exc)
            await asyncio.sleep(interval_s)

    def _previous_attempt(self, js: Body, job: Body) -> bool:
        """A Job of an earlier global restart, or (with the gate) of an earlier individual
        restart of its index."""
        labels = job["metadata"].get("labels") or {}
        status = js.get("status") or {}
        if int(labels.get(RESTART_ATTEMPT_KEY, "0")) < int(status.get("restarts") or 0):
            return True
        if not self.restart_job_gate or JOB_RESTART_ATTEMPT_KEY not in labels:
            return False  # JobSet keeps a Job without the label (made before the gate)
        target = jobset_failure.job_restarts(
            js, status, labels[REPLICATED_JOB_NAME_KEY], "jobRestarts"
        )
        return int(labels[JOB_RESTART_ATTEMPT_KEY]) < target[int(labels[JOB_INDEX_KEY])]

    def _reconcile(self, js: Body) -> None:
        ns, uid = js["metadata"]["namespace"], js["metadata"]["uid"]
        status = copy.deepcopy(js.get("status") or {})
        status.setdefault("restarts", 0)
        if _cond(js, "Completed") or _cond(js, "Failed"):
            return
        owned = [
            j
            for j in self.emu.select(JOBS, ns)
            if any(
                r.get("uid") == uid and r.get("controller")
                for r in j["metadata"].get("ownerReferences") or []
            )
        ]
        current = []
        for job in owned:  # a restart deletes the previous attempt's Jobs first
            if self._previous_attempt(js, job):
                self.emu.delete(JOBS, ns, job["metadata"]["name"])
            else:
                current.append(job)
        network = js["spec"].get("network") or {}
        if (
            network.get("enableDNSHostnames")
            and self.emu.get_object(SERVICES, ns, subdomain(js)) is None
        ):
            self.emu.create(SERVICES, ns, headless_service(js))
        have = {j["metadata"]["name"] for j in current}
        for job in construct_jobs(js, restart_job_gate=self.restart_job_gate):
            if job["metadata"]["name"] not in have:
                current.append(self.emu.create(JOBS, ns, job))
        suspended = bool(js["spec"].get("suspend"))
        templates = {
            r["name"]: r["template"]["spec"]["template"] for r in js["spec"]["replicatedJobs"]
        }
        for job in current:
            if suspended and not job["spec"].get("suspend"):
                self.emu.patch(JOBS, ns, job["metadata"]["name"], {"spec": {"suspend": True}})
            elif not suspended and job["spec"].get("suspend"):
                self._resume(job, templates)
        current = [self.emu.read(JOBS, ns, j["metadata"]["name"]) for j in current]
        if suspended:
            _set_condition(status, "Suspended", True, "SuspendedJobs", "jobset is suspended")
        elif any(c["type"] == "Suspended" for c in status.get("conditions") or []):
            _set_condition(status, "Suspended", False, "ResumeJobs", "jobset is resumed")
        status["replicatedJobsStatus"] = self._counts(js, current)
        failed = [j for j in current if _cond(j, "Failed")]
        if failed:
            jobset_failure.execute(js, status, failed, restart_job_gate=self.restart_job_gate)
        elif self._succeeded(js, current):
            _set_condition(
                status, "Completed", True, "AllJobsCompleted", "jobset completed successfully"
            )
            status["terminalState"] = "Completed"
        if status != (js.get("status") or {}):
            self.emu.patch(
                JOBSETS, ns, js["metadata"]["name"], {"status": status}, subresource="status"
            )

    def _resume(self, job: Body, templates: Mapping[str, Any]) -> None:
        """JobSet's ``resumeJob``: the (Kueue-updated) pod template's labels, annotations,
        node selector, tolerations and scheduling gates, merged, then unsuspended."""
        rjob = job["metadata"]["labels"][REPLICATED_JOB_NAME_KEY]
        tmpl = templates[rjob]
        pod_t = copy.deepcopy(job["spec"]["template"])
        meta = pod_t.setdefault("metadata", {})
        for key in ("labels", "annotations"):
            meta[key] = {**(meta.get(key) or {}), **((tmpl.get("metadata") or {}).get(key) or {})}
        pod = pod_t["spec"]
        pod["nodeSelector"] = {
            **(pod.get("nodeSelector") or {}),
            **((tmpl.get("spec") or {}).get("nodeSelector") or {}),
        }
        if not pod["nodeSelector"]:
            del pod["nodeSelector"]
        for key in ("tolerations", "schedulingGates"):
            extra = [
                t for t in (tmpl.get("spec") or {}).get(key) or [] if t not in (pod.get(key) or [])
            ]
            if extra:
                pod[key] = [*(pod.get(key) or []), *extra]
        body = copy.deepcopy(job)
        body["spec"]["template"] = pod_t
        body["spec"]["suspend"] = False
        self.emu.replace(JOBS, job["metadata"]["namespace"], job["metadata"]["name"], body)

    @staticmethod
    def _succeeded(js: Body, jobs: list[Body]) -> bool:
        policy = js["spec"].get("successPolicy") or {"operator": "All"}
        targets = policy.get("targetReplicatedJobs") or [
            r["name"] for r in js["spec"]["replicatedJobs"]
        ]
        wanted = sum(
            int(r.get("replicas", 1)) for r in js["spec"]["replicatedJobs"] if r["name"] in targets
        )
        done = [
            j
            for j in jobs
            if _cond(j, "Complete") and j["metadata"]["labels"][REPLICATED_JOB_NAME_KEY] in targets
        ]
        return len(done) >= wanted if policy["operator"] == "All" else bool(done)

    def _counts(self, js: Body, jobs: list[Body]) -> list[Body]:
        """``calculateReplicatedJobStatuses``; with the gate the individual restart counters
        are kept (the failure policy then bumps them)."""
        previous = {
            r["name"]: r for r in (js.get("status") or {}).get("replicatedJobsStatus") or []
        }
        out = []
        for rjob in js["spec"]["replicatedJobs"]:
            mine = [
                j for j in jobs if j["metadata"]["labels"][REPLICATED_JOB_NAME_KEY] == rjob["name"]
            ]
            counts = {
                "name": rjob["name"],
                "ready": 0,
                "succeeded": 0,
                "failed": 0,
                "active": 0,
                "suspended": 0,
            }
            for j in mine:
                st, spec = j.get("status") or {}, j["spec"]
                want = min(int(spec.get("parallelism") or 1), int(spec.get("completions") or 1))
                if _cond(j, "Complete"):
                    counts["succeeded"] += 1
                elif _cond(j, "Failed"):
                    counts["failed"] += 1
                elif spec.get("suspend"):
                    counts["suspended"] += 1
                else:
                    if int(st.get("active") or 0) > 0:
                        counts["active"] += 1
                    if int(st.get("ready") or 0) + int(st.get("succeeded") or 0) >= want:
                        counts["ready"] += 1
            if self.restart_job_gate:
                for key in ("jobRestarts", "jobRestartsCountTowardsMax"):
                    if (previous.get(rjob["name"]) or {}).get(key):
                        counts[key] = previous[rjob["name"]][key]
            out.append(counts)
        return out
