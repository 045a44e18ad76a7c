"""The operator with exactly the chart's RBAC, enforced by the real RBAC authorizer: the chart
(rendered by Helm, watching this test's namespace) applied with kubectl, the operator embedded
with its ServiceAccount's token, and a scenario through every code path that calls the API —
pools with priors (created, a broken ConfigMap reset), a benchmark (its Role, RoleBinding, Job;
a failure and a retry), a plan launched as Jobs, a relaunch, a plan queued in Kueue as a
JobSet on the pool's flavor and admitted. The audit log holds every request the operator made:
none may be refused (a missing permission), and every permission the chart grants must have
been used, but for the few this scenario cannot reach, each named with why (an excessive one).
``OwnerReferencesPermissionEnforcement`` is on: ``blockOwnerDeletion`` needs ``finalizers``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from kube_support import Kube, install_chart, kueue_objects, operator_kubeconfig, real_operator
from operator_support import OPERATOR_NS, condition, manifest, variant
from support.realkube.controlplane import AUDITED_NAMESPACE

RELEASE = "sm"
FULLNAME = f"{RELEASE}-shardmeter"
OPERATOR_SA, BENCH_SA = FULLNAME, f"{FULLNAME}-bench"
Rule = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)
pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

PLACEMENT = "placement at admission (the webhook path; tests/kube/test_webhook.py runs it)"
NOT_REACHED: dict[Rule, str] = {
    **dict.fromkeys(
        [
            ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get"),
            ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch"),
            ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "get"),
            ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch"),
        ],
        "the placement webhook's self-signed path sets its configurations' caBundle",
    ),
    **dict.fromkeys(
        [
            ("shardmeter.io", "trainingplans", "create"),
            ("jobset.x-k8s.io", "jobsets/finalizers", "update"),
            ("trainer.kubeflow.org", "trainjobs", "get"),
            ("trainer.kubeflow.org", "trainjobs/finalizers", "update"),
        ],
        PLACEMENT,
    ),
    **dict.fromkeys(
        [("apps", "deployments", "get"), ("jobset.x-k8s.io", "jobsets", "get")],
        "a create answered 409 reads the existing child to adopt it (a resumed reconcile)",
    ),
    **dict.fromkeys(
        [("kopf.dev", "clusterkopfpeerings", v) for v in ("get", "list", "watch", "patch")]
        + [("kopf.dev", "clusterkopfpeerings", "create")],
        "leader election between replicas (kopf peering); the tests run one, standalone",
    ),
    **dict.fromkeys(
        [
            ("kueue.x-k8s.io", "admissionchecks", "get"),
            ("kueue.x-k8s.io", "clusterqueues", "get"),
            ("kueue.x-k8s.io", "multikueueconfigs", "get"),
            ("kueue.x-k8s.io", "multikueueclusters", "get"),
        ],
        "a multi-site launch checks its sites' MultiKueue setup",
    ),
    **dict.fromkeys(
        [("shardmeter.io", "gpupools", "patch"), ("shardmeter.io", "trainingplans", "patch")],
        "kopf removes the finalizers an older operator (v0.1) left; none here",
    ),
    ("events.k8s.io", "events", "create"): "kopf's own Events (a failed handler)",
}
"""Granted, and not used by this scenario: rule → why the operator needs it."""

IMPLICIT: set[Rule] = {
    ("shardmeter.io", "gpupools/finalizers", "update"),
    ("shardmeter.io", "trainingplans/finalizers", "update"),
}
"""Checked by the authorizer, never requested: OwnerReferencesPermissionEnforcement asks it
whether the creator of a child with ``blockOwnerDeletion`` may update its owner's finalizers
(the test checks that such children were created)."""

assert AUDITED_NAMESPACE == OPERATOR_NS  # the chart's release namespace is the audited one


def grants(docs: list[dict[str, Any]]) -> set[tuple[Rule, str]]:
    """Every (rule, namespace) the chart grants the operator ("*": cluster-wide)."""
    out = set()
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        where = doc["metadata"].get("namespace", "*") if doc["kind"] == "Role" else "*"
        for rule in doc.get("rules", []):
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    for verb in rule.get("verbs", []):
                        out.add(((group, resource, verb), where))
    return out


def used(audit: list[dict[str, Any]], account_uid: str) -> dict[tuple[Rule, str], int]:
    """(rule, namespace) → the HTTP code of the last such request by the ServiceAccount of
    ``account_uid`` (this test's: an earlier test's operator had one of the same name)."""
    out: dict[tuple[Rule, str], int] = {}
    for event in audit:
        ref = event.get("objectRef") or {}
        if not ref.get("resource") or event["user"].get("uid") != account_uid:
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        rule = (ref.get("apiGroup", ""), resource, event["verb"])
        code = (event.get("responseStatus") or {}).get("code", 0)
        out[(rule, ref.get("namespace") or "*")] = code
    return out


def covered(rule: Rule, where: str, granted: set[tuple[Rule, str]]) -> bool:
    return (rule, where) in granted or (rule, "*") in granted


@pytest.mark.parametrize("mode", ["all-namespaces", "namespaced"])
async def test_the_operator_needs_every_permission_of_the_chart_and_no_other(
    kube: Kube, tmp_path: Path, mode: str
) -> None:
    ns = kube.ns
    values = {"operator": {"watchNamespaces": [ns]}} if mode == "namespaced" else {}
    docs = await install_chart(kube, values, RELEASE, tmp_path)
    kubeconfig = operator_kubeconfig(kube, OPERATOR_SA, tmp_path)
    for obj in kueue_objects(ns, gpus=64):
        kube.apply(obj)
    flavor = kueue_objects(ns, gpus=64)[0]["metadata"]["name"]

    pool_a, pool_b = manifest("gpupool-cluster-a.yaml"), manifest("gpupool-cluster-b.yaml")
    broken = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "shardmeter-coefficients-cluster-b", "namespace": OPERATOR_NS},
        "data": {"coefficients.json": "{}"},
    }
    # an earlier test's pools of the same names may have left coefficients the garbage
    # collector has not removed yet: cluster-a's is created afresh, cluster-b's is broken
    kube.delete("configmaps", OPERATOR_NS, "shardmeter-coefficients-cluster-a")
    kube.delete("configmaps", OPERATOR_NS, "shardmeter-coefficients-cluster-b")
    await kube.wait_for(
        lambda: not kube.get("configmaps", OPERATOR_NS, "shardmeter-coefficients-cluster-a"), 30
    )
    kube.apply(broken)
    since = time.time() - 1
    async with real_operator(
        kube,
        kubeconfig=kubeconfig,
        namespaces=(ns, OPERATOR_NS) if mode == "namespaced" else (),
        bench_service_account=BENCH_SA,
    ):
        kube.apply(variant(pool_a, benchmark={"enabled": True, "nodes": 1}))
        kube.apply(pool_b)
        pool = await _pool(kube, "cluster-a", lambda s: s.get("benchmarkPhase") == "Running")
        kube.set_job_failed(OPERATOR_NS, pool["benchmarkJob"])
        await _pool(
            kube,
            "cluster-a",
            lambda s: s.get("benchmarkAttempts") == 1 and s.get("benchmarkPhase") == "Running",
        )
        await _pool(kube, "cluster-b", lambda s: s.get("source") == "prior")

        one_pool = {"launch": True, "pools": [{"name": "cluster-b"}], "workload": "Job"}
        plan = variant(manifest("trainingplan.yaml"), **one_pool)
        plan["metadata"]["namespace"] = ns
        name = plan["metadata"]["name"]
        kube.apply(plan)
        launched = await _plan(kube, name, lambda s: s.get("phase") == "Launched")
        kube.set_job_running(ns, launched["jobs"][0])
        await _plan(kube, name, lambda s: any(i["state"] == "running" for i in s["islands"]))
        kube.apply(variant(plan, relaunch=1))
        await _plan(
            kube,
            name,
            lambda s: (s.get("launch") or {}).get("relaunch") == 1 and s.get("phase") == "Launched",
        )

        queued = variant(
            manifest("trainingplan.yaml"),
            launch=True,
            pools=[{"name": "cluster-a"}],
            queueName="team-a",
        )
        queued["metadata"].update(name="queued", namespace=ns)
        pool_a["spec"]["kueue"] = {"flavor": flavor}
        pool_a["spec"]["benchmark"] = {"enabled": False}
        kube.apply(pool_a)
        kube.apply(queued)
        s = await _plan(
            kube,
            "queued",
            lambda s: any(
                c["type"] == "Admitted" and c["status"] == "True" for c in s.get("conditions", [])
            ),
        )
        assert condition(s, "Valid")["status"] == "True"
        # relaunched: the queued JobSet is replaced
        queued["spec"]["relaunch"] = 1
        kube.apply(queued)
        await _plan(
            kube,
            "queued",
            lambda s: (
                (s.get("launch") or {}).get("relaunch") == 1
                and any(c["type"] == "Admitted" and c["status"] == "True" for c in s["conditions"])
            ),
        )
        await _pool(kube, "cluster-a", lambda s: s.get("benchmarkPhase") == "Disabled")

    account = kube.get("serviceaccounts", OPERATOR_NS, OPERATOR_SA) or {}
    calls = used(kube.plane_.audit(since), account["metadata"]["uid"])
    assert calls, "the audit log holds none of the operator's requests"
    refused = {call: code for call, code in calls.items() if code in (401, 403)}
    assert refused == {}, "the chart's RBAC refused the operator"
    granted = grants(docs)
    for (rule, where), code in calls.items():
        assert covered(rule, where, granted), (rule, where, code)
    # every rule the chart grants was used somewhere, but for those this scenario cannot reach
    unused = {rule for rule, _ in granted} - {rule for rule, _ in calls} - IMPLICIT
    assert unused == set(NOT_REACHED), "\n".join(map(str, sorted(unused)))
    blocking = {
        ref["kind"]
        for resource, where in (
            ("jobs", ns),
            ("services", ns),
            ("configmaps", OPERATOR_NS),
            ("jobs", OPERATOR_NS),
        )
        for obj in kube.list(resource, where)
        for ref in obj["metadata"].get("ownerReferences", [])
        if ref.get("blockOwnerDeletion")
    }
    assert {"GPUPool", "TrainingPlan"} <= blocking, blocking


async def _pool(kube: Kube, name: str, predicate: Any) -> dict[str, Any]:
    return await _status(kube, "gpupools", None, name, predicate)


async def _plan(kube: Kube, name: str, predicate: Any) -> dict[str, Any]:
    return await _status(kube, "trainingplans", kube.ns, name, predicate)


async def _status(
    kube: Kube, resource: str, ns: str | None, name: str, predicate: Any
) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def check() -> bool:
        s = (kube.get(resource, ns, name) or {}).get("status") or {}
        if s and predicate(s):
            found.update(s)
            return True
        return False

    await kube.wait_for(check, 120, f"{resource} {name}: {predicate}")
    return found
