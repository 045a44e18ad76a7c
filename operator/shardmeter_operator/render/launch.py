"""What a launched plan needs beyond its island Jobs, for torchtitan's fault-tolerant trainer:
the check that the plan can run as planned, and — given the island manifests that
:func:`shardmeter_operator.render.island.island_manifests` rendered — the torchft lighthouse in
front of them and each island's runtime (torchtitan's flags, torchft's environment, DNS).
Pure: no API calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardmeter.errors import SpecError
from shardmeter_operator.api import (
    Condition,
    GPUPoolSpec,
    RestartScope,
    TrainingPlanPhase,
    TrainingPlanSpec,
    TrainingPlanStatus,
    WorkloadKind,
)
from shardmeter_operator.api.conditions import Type, get_condition, set_condition
from shardmeter_operator.api.errors import RuntimeCannotExpressError, reason_for
from shardmeter_operator.render.island import island_manifests
from shardmeter_operator.render.jobset import KIND as JOBSET_KIND
from shardmeter_operator.render.jobset import jobset_manifest
from shardmeter_operator.render.kueue import submit
from shardmeter_operator.render.labels import ISLAND_LABEL, child_labels, owner_reference
from shardmeter_operator.render.lighthouse import (
    lighthouse_address,
    lighthouse_manifests,
    service_type,
)
from shardmeter_operator.render.sites import site_jobsets
from shardmeter_operator.render.torchtitan import (
    MANAGER_PORT,
    TorchtitanRun,
    apply_to_island_job,
    check_expressible,
    dns_searches,
    torchtitan_run,
)

Manifest = dict[str, Any]

MAX_DNS_SEARCHES = 32
"""Kubernetes' limit on a pod's DNS search list (``dnsConfig.searches`` plus the cluster's
own three); the list may not exceed 2048 characters either."""
MAX_DNS_SEARCH_CHARS = 2048


def launchable_run(
    spec: TrainingPlanSpec,
    status: TrainingPlanStatus,
    namespace: str,
    workload: WorkloadKind = WorkloadKind.JOB,
    restart: RestartScope = RestartScope.ALL_ISLANDS,
) -> TorchtitanRun:
    """The torchtitan run of the chosen plan; raises RuntimeCannotExpressError (naming the
    field) when torchtitan-FT would not run it as planned. Called before the launch decision
    is recorded, so a refused plan creates nothing."""
    run = torchtitan_run(
        spec,
        status.islands,
        status.streaming_di_lo_co,
        status.predictions,
        restart_alone=restart is RestartScope.ISLAND and workload is WorkloadKind.JOBSET,
    )
    check_expressible(run, spec)
    if workload is WorkloadKind.JOBSET:
        return run  # one search domain: the JobSet's headless Service
    searches = dns_searches(run, namespace)
    domain = spec.fault_tolerance.cluster_domain
    cluster = [f"{namespace}.svc.{domain}", f"svc.{domain}", domain]  # the kubelet's own
    if len(searches) + len(cluster) > MAX_DNS_SEARCHES or (
        len(" ".join(searches + cluster)) > MAX_DNS_SEARCH_CHARS
    ):
        raise RuntimeCannotExpressError(
            "spec.constraints.maxIslands",
            f"{len(searches)} islands need more DNS search domains than a pod may have "
            f"({MAX_DNS_SEARCHES} entries, {MAX_DNS_SEARCH_CHARS} characters); lower maxIslands "
            "or shorten the TrainingPlan's name",
        )
    return run


def launch_manifests(
    name: str,
    namespace: str,
    uid: str,
    spec: TrainingPlanSpec,
    status: TrainingPlanStatus,
    pools: Mapping[str, GPUPoolSpec],
    *,
    plan_json: str,
    revision: str,
    bench_image: str,
    check: bool = True,
    workload: WorkloadKind = WorkloadKind.JOB,
    queue: str = "",
    restart: RestartScope = RestartScope.ALL_ISLANDS,
    site_queues: Mapping[str, str] | None = None,
    lighthouse: str | None = None,
) -> list[Manifest]:
    """Everything the launch of ``status``'s plan creates, in order: the lighthouse (DiLoCo),
    then each island's Job and Service — or, for ``workload`` JobSet, the plan's JobSet
    (``status.islands`` named by :func:`workload.launch_islands`) — or, with ``site_queues``
    (site → its queue), one JobSet per site for MultiKueue (:mod:`~.render.sites`).
    ``queue``: a Kueue LocalQueue the Jobs or the JobSet are submitted to. ``restart``: what a
    JobSet recreates when an island fails. ``lighthouse``: the islands' ``TORCHFT_LIGHTHOUSE``
    (default: the Service's cluster DNS name); "" while it is not known (a load balancer
    still without an ingress): then only the lighthouse is rendered. ``check=False``
    renders a plan torchtitan-FT would run differently from planned (for inspection; the
    operator never creates it)."""
    restart_alone = restart is RestartScope.ISLAND and workload is WorkloadKind.JOBSET
    if check:
        run = launchable_run(spec, status, namespace, workload, restart)
    else:
        run = torchtitan_run(
            spec,
            status.islands,
            status.streaming_di_lo_co,
            status.predictions,
            restart_alone=restart_alone,
        )
    address = lighthouse_address(name, namespace) if lighthouse is None else lighthouse
    owner = owner_reference("TrainingPlan", name, uid)
    labels = child_labels(name, uid, revision)
    islands = island_manifests(
        name,
        namespace,
        owner,
        spec.template,
        status.islands,
        pools,
        status.streaming_di_lo_co,
        plan_json,
        labels,
    )
    island_jobs = [m for m in islands if m["kind"] == "Job"]
    workloads: Sequence[Manifest]
    if site_queues:
        jobsets = site_jobsets(
            name,
            namespace,
            owner,
            labels,
            island_jobs,
            status.islands,
            pools,
            site_queues,
            run,
            max_restarts=spec.max_restarts,
            restart=restart,
            lighthouse=address,
            job_id=f"{namespace}/{name}",
        )
        workloads = jobsets if address or run.diloco is None else []
    elif workload is WorkloadKind.JOBSET:
        workloads = [
            jobset_manifest(
                name,
                namespace,
                owner,
                labels,
                island_jobs,
                status.islands,
                run,
                max_restarts=spec.max_restarts,
                lighthouse=address,
                job_id=f"{namespace}/{name}",
                restart=restart,
            )
        ]
    else:
        workloads = islands
    out = with_runtime(
        workloads,
        run,
        plan=name,
        namespace=namespace,
        owner=owner,
        labels=labels,
        bench_image=bench_image,
        lighthouse=address,
        service_type=service_type(spec.fault_tolerance, remote=bool(site_queues)),
    )
    if queue and not site_queues:  # a site's JobSet is already in its site's queue
        for m in out:
            if m["kind"] in ("Job", JOBSET_KIND):
                submit(m, queue)
    return out


def with_runtime(
    islands: Sequence[Manifest],
    run: TorchtitanRun,
    *,
    plan: str,
    namespace: str,
    owner: dict[str, Any],
    labels: Mapping[str, str],
    bench_image: str,
    lighthouse: str = "",
    service_type: str = "ClusterIP",
) -> list[Manifest]:
    """The lighthouse (for DiLoCo) followed by the island manifests, each Job given its
    runtime (``lighthouse``: the islands' ``TORCHFT_LIGHTHOUSE``, default the Service's
    cluster DNS name) and each island Service its torchft manager port."""
    lighthouse = lighthouse or lighthouse_address(plan, namespace)
    out = [dict(m) for m in islands]
    for m in out:
        if m["kind"] == "Service" and run.diloco is not None:  # what the pods serve, named
            m["spec"]["ports"] = [
                *m["spec"]["ports"],
                {"name": "torchft-manager", "port": MANAGER_PORT},
            ]
        if m["kind"] == "Job":
            index = int(m["metadata"]["labels"][ISLAND_LABEL])
            apply_to_island_job(
                m,
                run,
                index,
                namespace=namespace,
                lighthouse=lighthouse,
                job_id=f"{namespace}/{plan}",
            )
    if run.diloco is None:
        return out
    return [
        *lighthouse_manifests(
            plan,
            namespace,
            owner,
            run.fault_tolerance,
            min_replicas=run.min_replicas,
            image=bench_image,
            labels=labels,
            type_=service_type,
        ),
        *out,
    ]


def refuse_launch(
    status: TrainingPlanStatus,
    exc: SpecError,
    generation: int,
    previous: Sequence[Condition] | None = None,
) -> tuple[str, str, str] | None:
    """Mark a planned TrainingPlan that cannot be launched as planned — torchtitan-FT would
    run it differently (``RuntimeCannotExpress``), or its workload cannot be created
    (``WorkloadUnavailable``, ``QueueNotFound``, ``FlavorMismatch``): ``Valid=False`` naming
    the field, ``Launched=False``, phase Invalid; the plan stays in the status, nothing is
    recorded or created. Returns the Warning Event to post when the problem is new.
    ``previous``: the conditions before this reconcile (a refusal seen again keeps its
    ``lastTransitionTime``)."""
    reason = reason_for(exc)
    before = get_condition(status.conditions if previous is None else previous, Type.VALID)
    since = before.last_transition_time if before is not None and before.status == "False" else None
    status.conditions = set_condition(
        status.conditions, Type.VALID, False, reason, str(exc), generation, now=since
    )
    status.conditions = set_condition(
        status.conditions,
        Type.LAUNCHED,
        False,
        reason,
        "nothing created: " + str(exc),
        generation,
    )
    status.phase = TrainingPlanPhase.INVALID
    if before is not None and before.reason == reason and before.message == str(exc):
        return None
    return ("Warning", reason, str(exc))
