"""A MultiKueue setup of emulated clusters for tests: a manager and N workers, each an in-process
:class:`~support.kube_emulator.KubeEmulator` on its own port with the simulated JobSet and Kueue
installed and running, the manager also the simulated MultiKueue (:mod:`support.multikueue`),
and the objects of a per-site setup — the way the MultiKueue docs pin a workload to a site
(Kueue v0.19.2 has no per-Workload cluster selector): per site one ClusterQueue whose MultiKueue
AdmissionCheck's MultiKueueConfig lists only that site's worker.

Per site (:class:`Site`, e.g. ``Site("site-a", worker="worker-a")``):

* in the manager — a ResourceFlavor ``<site>``; a ClusterQueue ``<site>`` (quota
  :attr:`Site.quota`, ``admissionChecksStrategy`` with the check ``<site>``); an AdmissionCheck
  ``<site>`` (``controllerName: kueue.x-k8s.io/multikueue``, parameters: the MultiKueueConfig
  ``<site>``) and that config (``clusters: [<worker>]``); the namespace and a LocalQueue
  ``<site>`` in it;
* in its worker — the same namespace, ResourceFlavor, ClusterQueue ``<site>`` (same quota, no
  check) and LocalQueue ``<site>``.

Per worker, in the manager: a Secret ``<worker>-kubeconfig`` in ``kueue-system`` (key
``kubeconfig``: a kubeconfig with the worker's URL, :func:`support.kube_emulator.write_kubeconfig`)
and a MultiKueueCluster ``<worker>`` pointing at it.

A test submits a JobSet to the manager with the label ``kueue.x-k8s.io/queue-name: <site>``;
it runs in that site's worker only. The manager is the innermost running emulator, so
:func:`support.cluster.emulator_login` (kopf) and :func:`support.cluster.current_kubeconfig`
give the manager's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import pathlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import attrs

from support.cluster import EmulatedCluster, running_emulator
from support.jobset import JobSetController
from support.kube_emulator import Body, write_kubeconfig
from support.kueue import API_VERSION, JOB_UID_LABEL, MULTIKUEUE_CONTROLLER, WORKLOADS, Kueue
from support.multikueue import CONFIG_NAMESPACE, KUBECONFIG_KEY, MultiKueue

Controller = JobSetController | Kueue | MultiKueue


@attrs.frozen
class Site:
    """A site: the worker cluster it runs in and the queue that pins workloads to it."""

    name: str
    """The LocalQueue, ClusterQueue, ResourceFlavor, AdmissionCheck and MultiKueueConfig."""
    worker: str
    """The MultiKueueCluster (and the worker's name in :attr:`MultiCluster.workers`)."""
    namespace: str = "default"
    """Where the LocalQueue is, in the manager and in the worker."""
    quota: Mapping[str, int | str] = attrs.field(factory=lambda: {"nvidia.com/gpu": 64})
    """``nominalQuota`` per resource of the flavor, in the manager's and the worker's
    ClusterQueue (the docs: the manager's quota should be the workers')."""
    node_labels: Mapping[str, str] = attrs.field(factory=dict)
    """The ResourceFlavor's ``nodeLabels`` (merged into the pods' node selector at start)."""


SITES = (Site("site-a", worker="worker-a"), Site("site-b", worker="worker-b"))


def _namespace(name: str) -> Body:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _kueue(kind: str, name: str, spec: Body, namespace: str | None = None) -> Body:
    meta: Body = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": meta, "spec": spec}


def _cluster_queue(site: Site, checks: Sequence[str]) -> Body:
    spec: Body = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": sorted(site.quota),
                "flavors": [
                    {
                        "name": site.name,
                        "resources": [
                            {"name": r, "nominalQuota": q} for r, q in sorted(site.quota.items())
                        ],
                    }
                ],
            }
        ],
    }
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return _kueue("ClusterQueue", site.name, spec)


def _queue_objects(site: Site, checks: Sequence[str]) -> list[Body]:
    flavor: Body = {"nodeLabels": dict(site.node_labels)} if site.node_labels else {}
    return [
        _namespace(site.namespace),
        _kueue("ResourceFlavor", site.name, flavor),
        _cluster_queue(site, checks),
        _kueue("LocalQueue", site.name, {"clusterQueue": site.name}, site.namespace),
    ]


def site_manager_objects(site: Site) -> list[Body]:
    """The site's objects in the manager (see the module docstring), in apply order."""
    return [
        _kueue("MultiKueueConfig", site.name, {"clusters": [site.worker]}),
        _kueue(
            "AdmissionCheck",
            site.name,
            {
                "controllerName": MULTIKUEUE_CONTROLLER,
                "parameters": {
                    "apiGroup": API_VERSION.split("/")[0],
                    "kind": "MultiKueueConfig",
                    "name": site.name,
                },
            },
        ),
        *_queue_objects(site, [site.name]),
    ]


def site_worker_objects(site: Site) -> list[Body]:
    """The site's objects in its worker: namespace, flavor, ClusterQueue, LocalQueue."""
    return _queue_objects(site, [])


def kubeconfig_secret_name(worker: str) -> str:
    return f"{worker}-kubeconfig"


def worker_connection_objects(worker: str, kubeconfig: str) -> list[Body]:
    """In the manager: the worker's kubeconfig Secret (in ``kueue-system``) and its
    MultiKueueCluster."""
    return [
        _namespace(CONFIG_NAMESPACE),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": kubeconfig_secret_name(worker), "namespace": CONFIG_NAMESPACE},
            "data": {KUBECONFIG_KEY: base64.b64encode(kubeconfig.encode()).decode()},
        },
        _kueue(
            "MultiKueueCluster",
            worker,
            {
                "clusterSource": {
                    "kubeConfig": {
                        "locationType": "Secret",
                        "location": kubeconfig_secret_name(worker),
                    }
                }
            },
        ),
    ]


@attrs.define
class MultiCluster:
    """What :func:`running_multicluster` yields."""

    manager: EmulatedCluster
    workers: dict[str, EmulatedCluster]
    """Worker name (MultiKueueCluster) → its emulated cluster."""
    sites: dict[str, Site]
    kueue: Kueue
    """The manager's simulated Kueue."""
    multikueue: MultiKueue
    worker_kueues: dict[str, Kueue]
    jobsets: dict[str, JobSetController]
    """``"manager"`` and each worker → its simulated JobSet controller."""

    @property
    def controllers(self) -> list[Controller]:
        """Every simulated controller, in the order of :meth:`reconcile`."""
        return [
            self.kueue,
            self.multikueue,
            *self.worker_kueues.values(),
            *(js for name, js in self.jobsets.items() if name != "manager"),
            self.jobsets["manager"],
        ]

    def reconcile(self, passes: int = 1) -> None:
        """``passes`` passes of every controller, in a fixed order (manager Kueue, MultiKueue,
        the workers' Kueue, the workers' JobSet, the manager's JobSet): for tests that step
        the controllers themselves (``running_multicluster(run=False)``)."""
        for _ in range(passes):
            for controller in self.controllers:
                controller.reconcile()

    def worker_of(self, site: str) -> EmulatedCluster:
        """The worker cluster of a site."""
        return self.workers[self.sites[site].worker]

    def workload(self, cluster: EmulatedCluster, namespace: str, jobset: str) -> Body | None:
        """The Workload of a JobSet in a cluster (by the ``job-uid`` label), or None."""
        js = cluster.get("jobsets", namespace, jobset)
        if js is None:
            return None
        found = cluster.list(
            f"{WORKLOADS.plural}.{WORKLOADS.group}",
            namespace,
            label_selector=f"{JOB_UID_LABEL}={js['metadata']['uid']}",
        )
        return found[0] if found else None

    def check_state(self, namespace: str, jobset: str) -> Body | None:
        """The manager Workload's MultiKueue ``status.admissionChecks[]`` entry, or None."""
        wl = self.workload(self.manager, namespace, jobset)
        found = self.multikueue.multikueue_check(wl) if wl is not None else None
        return found[1] if found else None

    def errors(self) -> list[Exception]:
        """The simulated controllers' failures (a test asserts there are none)."""
        return [e for c in self.controllers for e in c.errors]

    def apply(self, cluster: EmulatedCluster, *docs: Body) -> None:
        for doc in docs:
            cluster.apply(doc)


@contextlib.asynccontextmanager
async def running_multicluster(
    sites: Sequence[Site] = SITES,
    *,
    tmp_path: pathlib.Path,
    crds_dir: str | pathlib.Path | None = None,
    worker_crds_dir: str | pathlib.Path | None = None,
    workers: Sequence[str] = (),
    jobset_feature_gates: Mapping[str, bool] | None = None,
    setup: bool = True,
    run: bool = True,
    interval_s: float = 0.05,
) -> AsyncIterator[MultiCluster]:
    """Start the workers (the sites' and ``workers``), then the manager (``crds_dir``: e.g. the
    project's CRDs; ``worker_crds_dir`` for the workers), each with the simulated JobSet
    (``jobset_feature_gates``) and Kueue installed, the manager with MultiKueue too; with
    ``setup`` the per-site objects applied (module docstring); with ``run`` every controller
    reconciling in the background every ``interval_s`` (else the test calls
    :meth:`MultiCluster.reconcile`). At exit the controllers stop and the test fails if a
    pass of theirs raised."""
    names = list(dict.fromkeys([*(s.worker for s in sites), *workers]))
    async with contextlib.AsyncExitStack() as stack:
        clusters: dict[str, EmulatedCluster] = {}
        for name in names:
            (tmp_path / name).mkdir(parents=True, exist_ok=True)
            clusters[name] = await stack.enter_async_context(
                running_emulator(crds_dir=worker_crds_dir, tmp_path=tmp_path / name)
            )
        (tmp_path / "manager").mkdir(parents=True, exist_ok=True)
        manager = await stack.enter_async_context(
            running_emulator(crds_dir=crds_dir, tmp_path=tmp_path / "manager")
        )
        jobsets = {"manager": JobSetController.install(manager.emulator, jobset_feature_gates)}
        worker_kueues = {}
        for name, worker in clusters.items():
            jobsets[name] = JobSetController.install(worker.emulator, jobset_feature_gates)
            worker_kueues[name] = Kueue.install(worker.emulator)
        kueue = Kueue.install(manager.emulator)
        servers = {w.url: w.emulator for w in clusters.values()}
        multi = MultiCluster(
            manager=manager,
            workers=clusters,
            sites={s.name: s for s in sites},
            kueue=kueue,
            multikueue=MultiKueue.install(manager.emulator, servers),
            worker_kueues=worker_kueues,
            jobsets=jobsets,
        )
        if setup:
            for site in sites:
                multi.apply(clusters[site.worker], *site_worker_objects(site))
            for name, worker in clusters.items():
                path = tmp_path / name / "multikueue-kubeconfig"
                write_kubeconfig(path, worker.url)
                multi.apply(manager, *worker_connection_objects(name, path.read_text()))
            for site in sites:
                multi.apply(manager, *site_manager_objects(site))
        tasks = [asyncio.create_task(c.run(interval_s)) for c in multi.controllers] if run else []
        try:
            yield multi
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        errors: list[Any] = multi.errors()
        assert not errors, errors
