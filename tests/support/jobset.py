"""A simulated JobSet (jobset.x-k8s.io/v1alpha2, as of JobSet v0.7–v0.13) for the emulated API
server: its CRD (``crds/jobset.x-k8s.io.yaml``), its admission webhook and its controller —
the behaviour ShardMeter's launches rely on, reproduced from JobSet's sources
(``pkg/webhooks/jobset_webhook.go``, ``pkg/controllers/{jobset_controller,failure_policy,
success_policy}.go``):

* **Webhook.** Defaults on create: ``successPolicy`` All, ``startupPolicy`` AnyOrder, each Job
  template Indexed with pod ``restartPolicy`` OnFailure, ``network.enableDNSHostnames`` and
  ``publishNotReadyAddresses`` true, failure-policy rule names. Refuses (422): a child Job name
  ``<jobset>-<replicatedJob>-<last index>`` or pod name ``…-<last completion index>-abcde``
  that is not a DNS-1035 label, bad group names or subdomains, unknown replicated Jobs in the
  policies, invalid rule names or failure reasons, and a Job template that fails Kubernetes'
  own JobTemplateSpec schema (strict). On update the replicated Jobs are immutable, except the
  pod templates' labels, annotations, node selector, tolerations and scheduling gates while
  the JobSet is (or becomes) suspended — what Kueue changes.
* **Controller** (:meth:`JobSetController.reconcile`, one pass over every JobSet): the headless
  Service ``<subdomain>`` (selector ``jobset-name``); the child Jobs of the current restart
  attempt, named ``<jobset>-<replicatedJob>-<jobIndex>``, labelled and annotated with JobSet's
  keys (``job-index``, ``job-global-index``, ``restart-attempt``, …), the pod template's
  ``subdomain`` set, suspended with the JobSet and resumed with its (Kueue-updated) pod
  template; previous attempts' Jobs deleted; a failed Job applies the failure policy (no
  policy: Failed ``FailedJobs``; rules matched by reason, message pattern and replicated Job;
  default action RestartJobSet until ``maxRestarts``, then Failed ``ReachedMaxRestarts``);
  the success policy (All / Any over the target replicated Jobs) completes it;
  ``replicatedJobsStatus`` counts ready, succeeded, failed, active and suspended Jobs.

Pods are not created (the emulator has none): the tests drive the child Jobs with the
emulator's simulated Job controller (``set_job_running/succeeded/failed``).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kmock

from support.kube_emulator import JOBS, Body, KubeEmulator, api_error, builtins, now_iso

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
VALID_FAILURE_REASONS = (
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    "PodFailurePolicy",
)
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
KUEUE_MUTABLE = ("nodeSelector", "tolerations", "schedulingGates")
"""Pod-spec fields of a suspended JobSet's templates that may change (besides the template's
labels and annotations): what Kueue sets at admission."""


def _is_jobsets(resource: kmock.resource) -> bool:
    return resource.group == GROUP and resource.plural == "jobsets"


# ---- webhook ----------------------------------------------------------------------------------
def default(js: Body) -> None:
    """JobSet's mutating webhook (create)."""
    spec = js.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rjob in spec.get("replicatedJobs") or []:
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod = job_spec.setdefault("template", {}).setdefault("spec", {})
        if not pod.get("restartPolicy"):
            pod["restartPolicy"] = "OnFailure"
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for i, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        if not rule.get("name"):
            rule["name"] = f"failurePolicyRule{i}"


def job_name(js_name: str, rjob: str, index: int) -> str:
    return f"{js_name}-{rjob}-{index}"


def validate_create(js: Body) -> list[str]:
    """JobSet's validating webhook (create)."""
    spec = js.get("spec") or {}
    name = js["metadata"]["name"]
    errors: list[str] = []
    subdomain = (spec.get("network") or {}).get("subdomain")
    if subdomain:
        errors += [f"spec.network.subdomain: {e}" for e in builtins.dns1035_label(subdomain)]
    names = set()
    for i, rjob in enumerate(spec.get("replicatedJobs") or []):
        where = f"spec.replicatedJobs[{i}]"
        names.add(rjob["name"])
        errors += [
            f"{where}.groupName: {e}"
            for e in builtins.dns1035_label(rjob.get("groupName", "default"))
        ]
        replicas = int(rjob.get("replicas", 1))
        longest = job_name(name, rjob["name"], replicas - 1)
        errors += [
            f"{where}.name: Invalid value: {longest!r}: JobSet name is too long, job names "
            f"generated for this JobSet will exceed 63 characters ({e})"
            for e in builtins.dns1035_label(longest)
        ]
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        if job_spec.get("completionMode") == "Indexed" and job_spec.get("completions"):
            pod = f"{longest}-{int(job_spec['completions']) - 1}-abcde"
            errors += [
                f"{where}.name: Invalid value: {pod!r}: JobSet name is too long, pod names "
                f"generated for this JobSet will exceed 63 characters ({e})"
                for e in builtins.dns1035_label(pod)
            ]
        errors += builtins.definition_errors(
            rjob.get("template") or {}, "io.k8s.api.batch.v1.JobTemplateSpec", f"{where}.template"
        )
        for dep in rjob.get("dependsOn") or []:
            if dep["name"] not in names - {rjob["name"]}:
                errors.append(f"replicatedJob: {rjob['name']} cannot depend on {dep['name']}")
    for target in (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []:
        if target not in names:
            errors.append(f"invalid replicatedJob name '{target}' in successPolicy")
    for i, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        where = f"spec.failurePolicy.rules[{i}]"
        if not (1 <= len(rule.get("name", "")) <= 128) or not RULE_NAME.match(rule.get("name", "")):
            errors.append(f"{where}.name: invalid failure policy rule name {rule.get('name')!r}")
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in VALID_FAILURE_REASONS:
                errors.append(f"{where}.onJobFailureReasons: invalid job failure reason {reason!r}")
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in names:
                errors.append(f"{where}.targetReplicatedJobs: unknown replicatedJob {target!r}")
    return errors


def validate_update(old: Body, new: Body) -> list[str]:
    """JobSet's validating webhook (update): replicated Jobs are immutable, except what Kueue
    changes in the pod templates while the JobSet is suspended."""
    suspended = bool(old["spec"].get("suspend")) or bool(new["spec"].get("suspend"))
    munged = copy.deepcopy(new["spec"].get("replicatedJobs") or [])
    before = {r["name"]: r for r in old["spec"].get("replicatedJobs") or []}
    if suspended:
        for rjob in munged:
            was = before.get(rjob["name"])
            if was is None:
                continue
            pod_t, old_t = rjob["template"]["spec"]["template"], was["template"]["spec"]["template"]
            for key in ("labels", "annotations"):
                _copy_key(pod_t.setdefault("metadata", {}), old_t.get("metadata") or {}, key)
            for key in KUEUE_MUTABLE:
                _copy_key(pod_t.setdefault("spec", {}), old_t.get("spec") or {}, key)
    if munged != (old["spec"].get("replicatedJobs") or []):
        return ["spec.replicatedJobs: Invalid value: field is immutable"]
    return []


def _copy_key(dst: dict[str, Any], src: Mapping[str, Any], key: str) -> None:
    if key in src:
        dst[key] = copy.deepcopy(src[key])
    else:
        dst.pop(key, None)


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


def _jobset_keys(js: Body, rjob: Mapping[str, Any], index: int) -> dict[str, str]:
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
    return {
        JOBSET_NAME_KEY: js["metadata"]["name"],
        JOBSET_UID_KEY: js["metadata"]["uid"],
        REPLICATED_JOB_NAME_KEY: rjob["name"],
        RESTART_ATTEMPT_KEY: str(int((js.get("status") or {}).get("restarts") or 0)),
        REPLICATED_JOB_REPLICAS_KEY: str(int(rjob.get("replicas", 1))),
        GLOBAL_REPLICAS_KEY: str(total),
        JOB_INDEX_KEY: str(index),
        JOB_KEY: key,
        JOB_GLOBAL_INDEX_KEY: str(before + index),
        GROUP_NAME_KEY: group,
        GROUP_REPLICAS_KEY: str(sum(int(r.get("replicas", 1)) for r in in_group)),
        JOB_GROUP_INDEX_KEY: str(group_before + index),
    }


def construct_jobs(js: Body) -> list[Body]:
    """The child Jobs of the JobSet's current restart attempt, as JobSet's ``constructJob``
    makes them: the replicated Job's template, JobSet's keys as labels and annotations on the
    Job and its pod template, the pod ``subdomain``, ``suspend`` as the JobSet's."""
    out = []
    dns = bool((js["spec"].get("network") or {}).get("enableDNSHostnames"))
    for rjob in js["spec"]["replicatedJobs"]:
        for index in range(int(rjob.get("replicas", 1))):
            template = copy.deepcopy(rjob["template"])
            keys = _jobset_keys(js, rjob, index)
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

    def __init__(self, emulator: KubeEmulator) -> None:
        self.emu = emulator
        self.errors: list[Exception] = []

    @classmethod
    def install(cls, emulator: KubeEmulator) -> JobSetController:
        """Load the CRD and register the webhook (as installing JobSet would)."""
        emulator.load_crds(CRD_FILE)
        ctl = cls(emulator)
        emulator.mutating_webhooks.append(ctl._mutate)
        emulator.validating_webhooks.append(ctl._validate)
        return ctl

    def _mutate(self, op: str, resource: kmock.resource, obj: Body, old: Body | None) -> None:
        if _is_jobsets(resource) and op == "CREATE":
            default(obj)

    def _validate(self, op: str, resource: kmock.resource, obj: Body, old: Body | None) -> None:
        if not _is_jobsets(resource):
            return
        errors = validate_create(obj) if op == "CREATE" else validate_update(old or {}, obj)
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
            if not js["metadata"].get("deletionTimestamp"):
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

    def _reconcile(self, js: Body) -> None:
        ns, uid = js["metadata"]["namespace"], js["metadata"]["uid"]
        status = copy.deepcopy(js.get("status") or {})
        status.setdefault("restarts", 0)
        if _cond(js, "Completed") or _cond(js, "Failed"):
            return
        restarts = int(status["restarts"])
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
            attempt = int(job["metadata"].get("labels", {}).get(RESTART_ATTEMPT_KEY, "0"))
            if attempt < restarts:
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
        for job in construct_jobs(js):
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
        failed = [j for j in current if _cond(j, "Failed")]
        if failed:
            self._fail(js, status, failed)
        elif self._succeeded(js, current):
            _set_condition(
                status, "Completed", True, "AllJobsCompleted", "jobset completed successfully"
            )
            status["terminalState"] = "Completed"
        status["replicatedJobsStatus"] = self._counts(js, current)
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

    def _fail(self, js: Body, status: Body, failed: list[Body]) -> None:
        """JobSet's failure policy for the first failed Job (by failure time)."""
        policy = js["spec"].get("failurePolicy")
        first = min(failed, key=lambda j: str((_cond(j, "Failed") or {}).get("lastTransitionTime")))
        name = first["metadata"]["name"]
        if policy is None:
            self._failed(
                status,
                "FailedJobs",
                f"jobset failed due to one or more job failures (first failed job: {name})",
            )
            return
        action = "RestartJobSet"
        for rule in policy.get("rules") or []:
            match = self._matching(rule, failed)
            if match is not None:
                action, name = rule["action"], match["metadata"]["name"]
                break
        if action == "FailJobSet":
            self._failed(
                status,
                "FailJobSetFailurePolicyAction",
                f"applying FailJobSet failure policy action (first failed job: {name})",
            )
        elif action == "RestartJobSetAndIgnoreMaxRestarts":
            status["restarts"] += 1
        elif int(status.get("restartsCountTowardsMax") or 0) < int(policy.get("maxRestarts") or 0):
            status["restarts"] += 1
            status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1
        else:
            self._failed(
                status,
                "ReachedMaxRestarts",
                f"jobset failed due to reaching max number of restarts (first failed job: {name})",
            )

    @staticmethod
    def _matching(rule: Mapping[str, Any], failed: list[Body]) -> Body | None:
        for job in failed:
            c = _cond(job, "Failed") or {}
            reasons = rule.get("onJobFailureReasons") or []
            patterns = rule.get("onJobFailureMessagePatterns") or []
            targets = rule.get("targetReplicatedJobs") or []
            if reasons and c.get("reason") not in reasons:
                continue
            if patterns and not any(re.search(p, str(c.get("message") or "")) for p in patterns):
                continue
            if targets and job["metadata"]["labels"].get(REPLICATED_JOB_NAME_KEY) not in targets:
                continue
            return job
        return None

    @staticmethod
    def _failed(status: Body, reason: str, message: str) -> None:
        _set_condition(status, "Failed", True, reason, message)
        status["terminalState"] = "Failed"

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

    @staticmethod
    def _counts(js: Body, jobs: list[Body]) -> list[Body]:
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
            out.append(counts)
        return out
