"""The simulated JobSet's admission webhook (JobSet v0.12.0, ``pkg/webhooks/jobset_webhook.go``),
split from :mod:`support.jobset` (which describes what it does and re-exports it): the defaults
on create and the checks on create and update, as pure functions on JobSet bodies."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from support import jobset_failure
from support.kube_emulator import Body, builtins

MAX_MANAGED_BY_LENGTH = 63
MAX_REPLICAS_WITH_RESTART_JOB = 1024
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


_HTTP_PATH = re.compile(r"^[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")


def domain_prefixed_path_errors(where: str, value: str) -> list[str]:
    """apimachinery's ``IsDomainPrefixedPath``: ``<DNS-1123 subdomain>/<HTTP path>``."""
    host, slash, path = value.partition("/")
    if not slash or not path:
        return [
            f'{where}: Invalid value: "{value}": must be a domain-prefixed path (such as "acme.io/foo")'
        ]
    errors = [f'{where}: Invalid value: "{host}": {e}' for e in builtins.dns1123_subdomain(host)]
    if not _HTTP_PATH.match(path):
        errors.append(
            f'{where}: Invalid value: "{path}": Invalid path: must contain only valid HTTP path characters'
        )
    return errors


def validate_create(js: Body, *, restart_job_gate: bool = False) -> list[str]:
    """JobSet's validating webhook (create); ``restart_job_gate``: the ``RestartJob`` gate."""
    spec = js.get("spec") or {}
    name = js["metadata"]["name"]
    errors: list[str] = []
    manager = spec.get("managedBy")
    if manager is not None:
        errors += domain_prefixed_path_errors("spec.managedBy", manager)
        if len(manager) > MAX_MANAGED_BY_LENGTH:
            errors.append(
                f"spec.managedBy: Too long: may not be more than {MAX_MANAGED_BY_LENGTH} bytes"
            )
    rules = (spec.get("failurePolicy") or {}).get("rules") or []
    if any(r.get("action") in jobset_failure.RESTART_JOB_ACTIONS for r in rules):
        if not restart_job_gate:
            return [
                *errors,
                "RestartJob and RestartJobAndIgnoreMaxRestarts failure policy actions are not "
                "allowed when RestartJob feature gate is disabled",
            ]
        if any(
            int(r.get("replicas", 1)) > MAX_REPLICAS_WITH_RESTART_JOB
            for r in spec.get("replicatedJobs") or []
        ):
            errors.append(
                "JobSet cannot have a failure policy rule with RestartJob or "
                "RestartJobAndIgnoreMaxRestarts action and a replicated job with replicas > "
                f"{MAX_REPLICAS_WITH_RESTART_JOB}"
            )
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
    """JobSet's validating webhook (update): ``managedBy`` and the replicated Jobs are
    immutable, except what Kueue changes in the pod templates while the JobSet is suspended."""
    errors: list[str] = []
    if new["spec"].get("managedBy") != old["spec"].get("managedBy"):
        errors.append("spec.managedBy: Invalid value: field is immutable")
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
            if not pod_t["metadata"] and "metadata" not in old_t:
                del pod_t["metadata"]  # an empty ObjectMeta is no ObjectMeta (Go compares structs)
    if munged != (old["spec"].get("replicatedJobs") or []):
        errors.append("spec.replicatedJobs: Invalid value: field is immutable")
    return errors


def _copy_key(dst: dict[str, Any], src: Mapping[str, Any], key: str) -> None:
    if key in src:
        dst[key] = copy.deepcopy(src[key])
    else:
        dst.pop(key, None)
