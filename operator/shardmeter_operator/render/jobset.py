"""The JobSet of a launched plan (``jobset.x-k8s.io/v1alpha2``, JobSet >= v0.7), as pure
functions: its name and its islands' names, and the manifest rendered from the island Jobs (the
islands' state read back from the JobSet and its child Jobs: :mod:`~.launch.rules.jobset`).

**One replicated Job per run of same-shaped islands** (not one per island, not one per pool).
A replicated Job's replicas share one pod template, so islands that differ in shape (nodes,
GPUs per node, micro-batch, accumulation — even within one pool) cannot share one; islands of
the same shape can, and the planner emits them consecutively (one group per island shape).
Kueue admits a JobSet as one Workload with one pod set per replicated Job, and a Workload has
at most 8 pod sets: the case study's ten islands are two replicated Jobs (``g0``: 8 × 1 node of
H200, ``g1``: 2 × 4 nodes of A100), where one per island would be ten and unadmittable.

What differs between the replicas of one replicated Job comes from JobSet's own annotations on
each pod, through the downward API (the names are JobSet's, ``api/jobset/v1alpha2``):

* ``SHARDMETER_ISLAND_ID`` ← ``jobset.sigs.k8s.io/job-global-index`` (the index across the
  whole JobSet, replicated Jobs in order: exactly the island's index in ``status.islands``);
  torchtitan's ``--fault_tolerance.replica_id=$(SHARDMETER_ISLAND_ID)``;
* ``SHARDMETER_JOB_INDEX`` ← ``jobset.sigs.k8s.io/job-index`` (the replica within its
  replicated Job), so ``MASTER_ADDR=<jobset>-g<j>-$(SHARDMETER_JOB_INDEX)-0.<jobset>.<ns>.svc``
  is the island's rank-0 pod;
* ``NODE_RANK`` ← ``batch.kubernetes.io/job-completion-index`` (the Job controller's), as for
  plain Jobs.

**DNS.** With ``network.enableDNSHostnames`` JobSet gives every pod the hostname
``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>`` under one headless Service named after the
JobSet (its ``subdomain``). torchft advertises ``socket.gethostname()``, so each pod searches
that one domain (``dnsConfig.searches``) — one entry however many islands, where plain Jobs
need one per island's Service.

**Failure and success.** ``failurePolicy`` restarts every island (``RestartJobSet``, the
default action) up to ``spec.maxRestarts`` times with ``BlockingRecreate`` — the previous
attempt's pods are gone before new ones start, so they never hold the GPUs or answer on the
reused hostnames — then fails the JobSet (``ReachedMaxRestarts``). ``successPolicy`` is
``All``: the plan has trained when every island ran its steps. ``startupPolicy`` is
``AnyOrder``: a torchft quorum needs every island, none waits for another to be ready.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardmeter_operator.api import ISLAND_SHAPE, IslandStatus, RestartScope
from shardmeter_operator.render.labels import ISLAND_LABEL, MANAGED_BY
from shardmeter_operator.render.names import DNS_LABEL_MAX, child_name, is_valid
from shardmeter_operator.render.pods import MASTER_PORT
from shardmeter_operator.render.torchtitan import (
    MANAGER_PORT,
    TorchtitanRun,
    apply_to_island_job,
)

Manifest = dict[str, Any]
GROUP = "jobset.x-k8s.io"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "JobSet"
CRD_NAME = f"jobsets.{GROUP}"

# JobSet's labels and annotations on its child Jobs and their pods.
JOBSET_NAME_KEY = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_NAME_KEY = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_KEY = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX_KEY = "jobset.sigs.k8s.io/job-global-index"
RESTART_ATTEMPT_KEY = "jobset.sigs.k8s.io/restart-attempt"
RESTART_JOB = "RestartJob"
"""The failure-policy action that recreates only the failed child Job (JobSet v0.12.0)."""

ISLAND_ID_ENV = "SHARDMETER_ISLAND_ID"
JOB_INDEX_ENV = "SHARDMETER_JOB_INDEX"
GROUP_PREFIX = "g"
MAX_ISLANDS = 64
"""``status.islands`` holds at most 64: group names up to ``g63``, job indexes up to 63."""
MAX_NODES = 4096
"""A GPUPool's largest ``nodes``: completion indexes up to 4095."""
POD_SUFFIX = "-abcde"
"""The random suffix of a pod's name, which JobSet's webhook counts in the name's length."""
JOBSET_NAME_MAX = DNS_LABEL_MAX - len(
    f"-{GROUP_PREFIX}{MAX_ISLANDS - 1}-{MAX_ISLANDS - 1}-{MAX_NODES - 1}{POD_SUFFIX}"
)
"""Room for the longest pod name JobSet's webhook checks (a DNS-1035 label ≤ 63):
``<jobset>-g63-63-4095-abcde``."""


@dataclass(frozen=True)
class ReplicatedJob:
    """One of the JobSet's replicated Jobs: ``count`` consecutive islands of one shape, from
    ``first`` (the plan's island groups are `shardmeter.plan.groups.IslandGroup`)."""

    name: str
    first: int
    count: int


def jobset_name(plan: str) -> str:
    """The plan's JobSet, and the headless Service JobSet creates for it (DNS-1035)."""
    return child_name("", plan, max_len=JOBSET_NAME_MAX)


def _shape(island: IslandStatus) -> tuple[Any, ...]:
    return tuple(island.model_dump(include=ISLAND_SHAPE - {"name"}).values())


def replicated_jobs(islands: Sequence[IslandStatus]) -> list[ReplicatedJob]:
    """Consecutive islands of the same shape form a group (a replicated Job)."""
    groups: list[ReplicatedJob] = []
    for i, isl in enumerate(islands):
        last = groups[-1] if groups else None
        if last is not None and _shape(islands[last.first]) == _shape(isl):
            groups[-1] = ReplicatedJob(last.name, last.first, last.count + 1)
        else:
            groups.append(ReplicatedJob(f"{GROUP_PREFIX}{len(groups)}", i, 1))
    return groups


ISLAND_PREFIX = "i"


def island_group(index: int) -> ReplicatedJob:
    """Island ``index`` alone as a replicated Job ``i<index>`` of one replica: JobSet's
    ``RestartJob`` needs replicated Jobs of one replica, and a site's JobSet holds only some
    of the plan's islands."""
    return ReplicatedJob(f"{ISLAND_PREFIX}{index}", index, 1)


def child_job_name(jobset: str, group: str, index: int) -> str:
    """``<jobset>-<replicatedJob>-<jobIndex>``: the name JobSet gives a child Job."""
    return f"{jobset}-{group}-{index}"


def name_islands(
    plan: str, islands: Sequence[IslandStatus], restart: RestartScope = RestartScope.ALL_ISLANDS
) -> list[IslandStatus]:
    """The islands named after the child Jobs the plan's JobSet will create for them."""
    js = jobset_name(plan)
    if restart is RestartScope.ISLAND:
        return [
            isl.model_copy(update={"name": child_job_name(js, island_group(k).name, 0)})
            for k, isl in enumerate(islands)
        ]
    out = []
    for g in replicated_jobs(islands):
        for k in range(g.count):
            isl = islands[g.first + k]
            out.append(isl.model_copy(update={"name": child_job_name(js, g.name, k)}))
    return out


def _field_ref(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": path}}


def _annotation(key: str) -> str:
    return f"metadata.annotations['{key}']"


def _group_env(
    env: Sequence[Mapping[str, Any]],
    jobset: str,
    group: str,
    namespace: str,
    island: int | None = None,
) -> list[dict[str, Any]]:
    """The island's environment with the per-replica values read from JobSet's annotations;
    ``island``: a replicated Job of this one island (its id a constant: a site's JobSet holds
    only some of the plan's islands, so JobSet's global index is not the island's)."""
    out: list[dict[str, Any]] = []
    for e in env:
        name = e.get("name")
        if island is not None and name == ISLAND_ID_ENV:
            out.append({"name": name, "value": str(island)})
        elif island is not None and name == "MASTER_ADDR":
            rank0 = f"{child_job_name(jobset, group, 0)}-0"
            out.append({"name": name, "value": f"{rank0}.{jobset}.{namespace}.svc"})
        elif name == ISLAND_ID_ENV:
            out.append({"name": name, "valueFrom": _field_ref(_annotation(JOB_GLOBAL_INDEX_KEY))})
        elif name == "MASTER_ADDR":
            out.append({"name": JOB_INDEX_ENV, "valueFrom": _field_ref(_annotation(JOB_INDEX_KEY))})
            rank0 = f"{jobset}-{group}-$({JOB_INDEX_ENV})-0"  # the Job's completion index 0
            out.append({"name": name, "value": f"{rank0}.{jobset}.{namespace}.svc"})
        else:
            out.append(dict(e))
    return out


def _container_ports(container: dict[str, Any], diloco: bool) -> None:
    """Declare what the trainer listens on (torchrun's rendezvous; torchft's manager):
    plain Jobs name them on each island's Service, a JobSet's Service has no ports."""
    ports = list(container.get("ports") or [])
    taken = {p.get("name") for p in ports} | {p.get("containerPort") for p in ports}
    wanted = [("rendezvous", MASTER_PORT)] + ([("torchft-manager", MANAGER_PORT)] if diloco else [])
    for name, port in wanted:
        if name not in taken and port not in taken:
            ports.append({"name": name, "containerPort": port})
    container["ports"] = ports


def _group_template(
    rendered: Mapping[str, Any],
    group: ReplicatedJob,
    jobset: str,
    namespace: str,
    run: TorchtitanRun,
    *,
    lighthouse: str,
    job_id: str,
    one_island: bool = False,
) -> dict[str, Any]:
    """A replicated Job's JobTemplateSpec from the island Job rendered for its first island
    (``one_island``: the replicated Job is that island alone)."""
    job: dict[str, Any] = copy.deepcopy(dict(rendered))
    searches = (
        [f"{jobset}.{namespace}.svc.{run.fault_tolerance.cluster_domain}"]
        if run.diloco is not None
        else []
    )
    apply_to_island_job(
        job,
        run,
        group.first,
        namespace=namespace,
        lighthouse=lighthouse,
        job_id=job_id,
        replica_id=f"$({ISLAND_ID_ENV})",
        searches=searches,
    )
    meta = job["metadata"]
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != ISLAND_LABEL}
    spec = job["spec"]
    pod_t = spec["template"]
    pod_t["metadata"]["labels"] = {
        k: v for k, v in pod_t["metadata"].get("labels", {}).items() if k != ISLAND_LABEL
    }
    pod = pod_t["spec"]
    pod.pop("subdomain", None)  # JobSet sets it to its headless Service
    for c in pod["containers"]:
        c["env"] = _group_env(
            c.get("env") or [],
            jobset,
            group.name,
            namespace,
            island=group.first if one_island else None,
        )
    _container_ports(pod["containers"][0], run.diloco is not None)
    template: dict[str, Any] = {"metadata": {"labels": labels}, "spec": spec}
    if meta.get("annotations"):
        template["metadata"]["annotations"] = dict(meta["annotations"])
    return template


def check_names(jobset: str, groups: Sequence[ReplicatedJob], nodes: Sequence[int]) -> None:
    """What JobSet's webhook checks: every child Job's and pod's name is a DNS-1035 label
    (pods with their 5-character suffix). Holds for any plan by construction."""
    for g in groups:
        job = child_job_name(jobset, g.name, g.count - 1)
        pod = f"{job}-{nodes[g.first] - 1}{POD_SUFFIX}"
        if not is_valid(job) or not is_valid(pod):
            raise ValueError(f"JobSet {jobset}: {pod} is not a valid pod name")


def jobset_manifest(
    plan: str,
    namespace: str,
    owner: dict[str, Any],
    labels: Mapping[str, str],
    island_jobs: Sequence[Manifest],
    islands: Sequence[IslandStatus],
    run: TorchtitanRun,
    *,
    max_restarts: int,
    lighthouse: str,
    job_id: str,
    restart: RestartScope = RestartScope.ALL_ISLANDS,
    name: str = "",
    groups: Sequence[ReplicatedJob] | None = None,
    managed_by: str = "",
) -> Manifest:
    """The plan's JobSet from the island Jobs ``island_manifests`` rendered (one per island,
    before their runtime): one replicated Job per group of same-shaped islands — or, for a
    site's JobSet (``name``, ``groups`` of one island each, ``managed_by`` MultiKueue), the
    site's islands one replicated Job each. ``restart`` Island: every island its own
    replicated Job (``RestartJob`` recreates a replicated Job's failed child, and JobSet
    v0.12's webhook allows it only on replicated Jobs of one replica)."""
    name = name or jobset_name(plan)
    if groups is None and restart is RestartScope.ISLAND:
        groups = [island_group(k) for k in range(len(islands))]
    one_island = groups is not None
    groups = list(groups) if groups is not None else replicated_jobs(islands)
    check_names(name, groups, [i.nodes for i in islands])
    replicated = [
        {
            "name": g.name,
            "replicas": g.count,
            "template": _group_template(
                island_jobs[g.first],
                g,
                name,
                namespace,
                run,
                lighthouse=lighthouse,
                job_id=job_id,
                one_island=one_island,
            ),
        }
        for g in groups
    ]
    failure: dict[str, Any] = {"maxRestarts": max_restarts, "restartStrategy": "BlockingRecreate"}
    if restart is RestartScope.ISLAND:  # JobSet v0.12: recreate only the failed island's Job
        failure["rules"] = [{"name": "restartTheIslandAlone", "action": RESTART_JOB}]
    spec: dict[str, Any] = {
        "replicatedJobs": replicated,
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "successPolicy": {"operator": "All"},
        "failurePolicy": failure,
        "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
        "suspend": False,
    }
    if managed_by:
        spec["managedBy"] = managed_by
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**MANAGED_BY, **labels},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


def restart_job_probe(namespace: str) -> Manifest:
    """A JobSet with a ``RestartJob`` rule, to create as a server-side dry run: JobSet v0.12's
    webhook refuses the action while its alpha feature gate ``RestartJob`` is off, and a CRD
    cannot tell."""
    pod = {
        "restartPolicy": "Never",
        "containers": [{"name": "probe", "image": "registry.k8s.io/pause:3.10"}],
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "shardmeter-restartjob-probe", "namespace": namespace},
        "spec": {
            "suspend": True,
            "replicatedJobs": [
                {"name": "i0", "replicas": 1, "template": {"spec": {"template": {"spec": pod}}}}
            ],
            "failurePolicy": {
                "maxRestarts": 1,
                "rules": [{"name": "restartTheIslandAlone", "action": RESTART_JOB}],
            },
        },
    }


# ---- following a JobSet -----------------------------------------------------------------------
__all__ = [
    "API_VERSION",
    "CRD_NAME",
    "ReplicatedJob",
    "child_job_name",
    "jobset_manifest",
    "jobset_name",
    "name_islands",
    "replicated_jobs",
    "restart_job_probe",
]


def accepts_restart_job(crd: Mapping[str, Any]) -> bool:
    """Whether a JobSet CRD's schema has the failure-policy action ``RestartJob`` (JobSet
    v0.12.0 added it): its served ``v1alpha2`` version's enum of
    ``spec.failurePolicy.rules[].action``."""
    for v in (crd.get("spec") or {}).get("versions") or []:
        if v.get("name") != VERSION:
            continue
        schema = (v.get("schema") or {}).get("openAPIV3Schema") or {}
        path = ["spec", "failurePolicy", "rules"]
        node: Mapping[str, Any] = schema
        for key in path:
            node = (node.get("properties") or {}).get(key) or {}
        action = ((node.get("items") or {}).get("properties") or {}).get("action") or {}
        return RESTART_JOB in (action.get("enum") or [])
    return False
