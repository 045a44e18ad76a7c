"""A plan whose islands run in other clusters, rendered for Kueue's MultiKueue: one JobSet per
site, each in its site's queue (Kueue v0.19, ``kueue.x-k8s.io/v1beta2``; JobSet v0.12).

A pool names its site's LocalQueue in the manager cluster (``spec.kueue.queueName``). That
queue's ClusterQueue has a MultiKueue admission check whose MultiKueueConfig lists the site's
worker cluster alone — Kueue's documented way to pin a workload to a cluster (it has no
per-workload cluster selector). So a plan gets one JobSet per site, in the site's queue:

* **Managed by MultiKueue.** ``spec.managedBy: kueue.x-k8s.io/multikueue``, created suspended
  with the queue label: in the manager it never runs (the JobSet controller leaves it alone);
  MultiKueue copies it to the worker cluster that admits it and mirrors the worker's status
  back into it.
* **One replicated Job per island.** A site's JobSet holds some of the plan's islands, so
  JobSet's global index is not the island's: each island is a replicated Job ``i<k>`` of one
  replica, ``k`` its index in ``status.islands``, its id (``SHARDMETER_ISLAND_ID``, torchtitan's
  replica id) and rank-0 address constants of the template. Kueue admits at most 8 pod sets
  per Workload: a site takes at most 8 islands.
* **The lighthouse outside.** Islands reach the one lighthouse at an address every site can
  route to (:func:`~.lighthouse.lighthouse_address`: a given address or the Service's
  load-balancer ingress).
* **A failed island restarts alone** (``RestartJob``) where the JobSet CRD supports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardmeter_operator.api import GPUPoolSpec, IslandStatus, RestartScope
from shardmeter_operator.render.jobset import (
    JOBSET_NAME_MAX,
    check_names,
    child_job_name,
    island_group,
    jobset_manifest,
)
from shardmeter_operator.render.kueue import MAX_POD_SETS, MULTIKUEUE_CONTROLLER, submit
from shardmeter_operator.render.names import child_name
from shardmeter_operator.render.torchtitan import TorchtitanRun

Manifest = dict[str, Any]


def site_jobset_name(plan: str, site: str) -> str:
    """The JobSet of ``plan``'s islands at ``site`` (and its headless Service in the worker)."""
    return child_name("", plan, site, max_len=JOBSET_NAME_MAX)


def site_of(pool: GPUPoolSpec) -> str:
    return pool.site or "default"


def island_sites(
    islands: Sequence[IslandStatus], pools: Mapping[str, GPUPoolSpec]
) -> dict[str, list[int]]:
    """Site → the indexes of its islands, sites in the order of their first island."""
    out: dict[str, list[int]] = {}
    for k, isl in enumerate(islands):
        out.setdefault(site_of(pools[isl.pool]), []).append(k)
    return out


def name_site_islands(
    plan: str, islands: Sequence[IslandStatus], pools: Mapping[str, GPUPoolSpec]
) -> list[IslandStatus]:
    """The islands named after the child Jobs their site's JobSet creates in the worker."""
    out = list(islands)
    for site, indexes in island_sites(islands, pools).items():
        js = site_jobset_name(plan, site)
        for k in indexes:
            out[k] = islands[k].model_copy(
                update={"name": child_job_name(js, island_group(k).name, 0)}
            )
    return out


def too_many_islands(islands: Sequence[IslandStatus], pools: Mapping[str, GPUPoolSpec]) -> str:
    """Why a site cannot take its islands in one JobSet ("" when every site can)."""
    for site, indexes in island_sites(islands, pools).items():
        if len(indexes) > MAX_POD_SETS:
            return (
                f"site {site} would run {len(indexes)} islands, and Kueue admits a JobSet as "
                f"one Workload of at most {MAX_POD_SETS} pod sets (one per island)"
            )
    return ""


def site_jobsets(
    plan: str,
    namespace: str,
    owner: dict[str, Any],
    labels: Mapping[str, str],
    island_jobs: Sequence[Manifest],
    islands: Sequence[IslandStatus],
    pools: Mapping[str, GPUPoolSpec],
    queues: Mapping[str, str],
    run: TorchtitanRun,
    *,
    max_restarts: int,
    restart: RestartScope,
    lighthouse: str,
    job_id: str,
) -> list[Manifest]:
    """One JobSet per site from the island Jobs ``island_manifests`` rendered (one per
    island, in ``islands``' order, before their runtime), each submitted to ``queues[site]``
    and managed by MultiKueue."""
    out = []
    for site, indexes in island_sites(islands, pools).items():
        name = site_jobset_name(plan, site)
        groups = [island_group(k) for k in indexes]
        check_names(name, groups, [i.nodes for i in islands])
        js = jobset_manifest(
            plan,
            namespace,
            owner,
            labels,
            island_jobs,
            islands,
            run,
            max_restarts=max_restarts,
            lighthouse=lighthouse,
            job_id=job_id,
            restart=restart,
            name=name,
            groups=groups,
            managed_by=MULTIKUEUE_CONTROLLER,
        )
        submit(js, queues[site])
        out.append(js)
    return out
