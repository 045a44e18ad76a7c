"""Everything a launched TrainingPlan creates, rendered and checked before anything is
created: for a (Streaming) DiLoCo plan the torchft lighthouse (Deployment + Service), then
one Indexed Job + headless Service per island whose trainer runs torchtitan's fault-tolerant
trainer with the plan's flags. Pure: no API calls."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shardmeter.errors import SpecError
from shardmeter_operator.lighthouse import lighthouse_address, lighthouse_manifests
from shardmeter_operator.manifests import (
    ISLAND_LABEL,
    Manifest,
    island_manifests,
    owner_reference,
)
from shardmeter_operator.resources import GPUPoolSpec, TrainingPlanSpec
from shardmeter_operator.runtime_torchtitan import (
    MANAGER_PORT,
    TorchtitanRun,
    apply_to_island_job,
    check_expressible,
    dns_searches,
    torchtitan_run,
)

MAX_DNS_SEARCHES = 32
"""Kubernetes' limit on a pod's DNS search list (``dnsConfig.searches`` plus the cluster's
own three); the list may not exceed 2048 characters either."""
MAX_DNS_SEARCH_CHARS = 2048


def render_launch(
    name: str,
    namespace: str,
    uid: str,
    spec: TrainingPlanSpec,
    status: Mapping[str, Any],
    pools: Mapping[str, GPUPoolSpec],
    *,
    bench_image: str,
) -> list[Manifest]:
    """The manifests to create, lighthouse first. Raises SpecError (naming the field) when
    the template or the chosen plan cannot run as planned on torchtitan + torchft."""
    run = torchtitan_run(spec, status)
    check_expressible(run, spec)
    return render_manifests(name, namespace, uid, spec, status, pools, run, bench_image=bench_image)


def render_manifests(
    name: str,
    namespace: str,
    uid: str,
    spec: TrainingPlanSpec,
    status: Mapping[str, Any],
    pools: Mapping[str, GPUPoolSpec],
    run: TorchtitanRun,
    *,
    bench_image: str,
) -> list[Manifest]:
    """The manifests of ``run`` without ``check_expressible`` (``render_launch`` checks)."""
    owner = owner_reference("TrainingPlan", name, uid)
    searches = dns_searches(run, namespace)
    domain = spec.fault_tolerance.cluster_domain
    cluster = [f"{namespace}.svc.{domain}", f"svc.{domain}", domain]  # the kubelet's own
    if len(searches) + 3 > MAX_DNS_SEARCHES or len(" ".join(searches + cluster)) > (
        MAX_DNS_SEARCH_CHARS
    ):
        raise SpecError(
            "spec.constraints.maxIslands",
            f"{len(searches)} islands need more DNS search domains than a pod may have "
            f"({MAX_DNS_SEARCHES} entries, {MAX_DNS_SEARCH_CHARS} characters); lower maxIslands "
            "or shorten the TrainingPlan's name",
        )
    s = status.get("streamingDiLoCo") or {"syncEvery": 1, "fragments": 1, "fragmentSyncDelay": 0}
    plan_json = json.dumps(
        {k: status.get(k) for k in ("plan", "islands", "streamingDiLoCo", "predictions")},
        sort_keys=True,
        separators=(",", ":"),
    )
    islands = island_manifests(
        name,
        namespace,
        owner,
        spec.template,
        status["islands"],
        pools,
        int(s["syncEvery"]),
        int(s["fragments"]),
        int(s["fragmentSyncDelay"]),
        plan_json,
    )
    lighthouse = lighthouse_address(name, namespace)
    for m in islands:
        if m["kind"] == "Service" and run.diloco is not None:  # what the pods serve, named
            m["spec"]["ports"].append({"name": "torchft-manager", "port": MANAGER_PORT})
        if m["kind"] == "Job":
            index = int(m["metadata"]["labels"][ISLAND_LABEL])
            apply_to_island_job(
                m,
                run,
                index,
                namespace=namespace,
                lighthouse=lighthouse,
                job_id=f"{namespace}/{name}",
            )
    if run.diloco is None:
        return islands
    return [
        *lighthouse_manifests(
            name,
            namespace,
            owner,
            spec.fault_tolerance,
            min_replicas=run.min_replicas,
            image=bench_image,
        ),
        *islands,
    ]
