"""A simulated MultiKueue (Kueue v0.19.2's MultiKueue admission check controller, which runs in
the *manager* cluster) across several emulated API servers, reproduced from Kueue's sources
(``pkg/controller/admissionchecks/multikueue/{multikueuecluster,admissioncheck,workload}.go``,
``pkg/controller/jobs/jobset/jobset_multikueue_adapter.go``, ``pkg/controller/jobframework``)
and its docs (``site/content/en/docs/concepts/multikueue.md``, ``…/tasks/manage/
setup_multikueue.md``). Each worker is its own :class:`~support.kube_emulator.KubeEmulator`
with its own simulated Kueue and JobSet; the manager's Kueue (:mod:`support.kueue`) reserves
quota and admits once the check is Ready.

* **MultiKueueClusters** (``status.conditions`` ``Active``): the kubeconfig comes from
  ``spec.clusterSource.kubeConfig`` — a Secret in Kueue's namespace (``kueue-system``) under the
  key ``kubeconfig`` (``locationType: Secret``, the default) or a file (``Path``). A missing
  Secret or key is ``BadKubeConfig`` ("load client config failed: secrets \\"w\\" not found"),
  an unparsable or unsafe kubeconfig (``insecure-skip-tls-verify``, CA or token *files*, basic
  auth, exec or auth-provider plugins) ``InsecureKubeConfig``, a server that is none of the
  workers or that does not serve Kueue's Workloads and JobSets (MultiKueue watches both)
  ``ClientConnectionFailed``; else True ``Active``/"Connected". ``clusterProfileRef`` is
  refused (its feature gate is off by default). Only an Active cluster gets anything.
* **AdmissionChecks** with ``spec.controllerName: kueue.x-k8s.io/multikueue``
  (``status.conditions`` ``Active``): ``BadConfig`` when ``spec.parameters`` is not a
  MultiKueueConfig that exists; ``NoUsableClusters`` (False) / ``SomeActiveClusters`` (True)
  listing the missing and inactive clusters; else True ``Active``.
* **Workloads** in the manager whose ClusterQueue has such a check (the check state as Kueue
  added it, Pending): the owner must be a JobSet with ``spec.managedBy:
  kueue.x-k8s.io/multikueue`` (else the check is ``Rejected``: "The owner is not managed by
  Kueue: Expecting spec.managedBy to be …", and Kueue deactivates the Workload). Once quota is
  reserved in the manager the **AllAtOnce dispatcher** (Kueue's default) nominates every Active
  cluster of the check's MultiKueueConfig (``status.nominatedClusterNames``) and creates the
  Workload's copy in each: same namespace and name, its labels without ``job-uid`` plus
  ``kueue.x-k8s.io/multikueue-origin: multikueue``, its spec. The first copy that its worker's
  Kueue admits wins: the other copies are deleted; the JobSet is created in that worker (same
  namespace and name, labels and annotations copied, ``multikueue-origin`` label,
  ``kueue.x-k8s.io/prebuilt-workload-name`` annotation naming the Workload copy, ``managedBy``
  dropped so the worker's JobSet controller runs it); the check becomes ``Ready`` ("The workload
  was admitted on \\"worker-a\\""), ``status.clusterName`` is set and the nominations cleared.
  Kueue then admits the manager's Workload and unsuspends the manager's JobSet — which no
  controller runs there (``managedBy``) — and every pass copies the worker JobSet's
  ``status`` to the manager JobSet's. A worker Workload that finishes finishes the manager's
  (after a last status copy), and the worker's objects are then deleted; one evicted in the
  worker, or an admitted copy that disappeared, puts the check in ``Retry`` (Kueue evicts and
  re-dispatches). Without quota, or once the manager Workload is gone (its JobSet deleted),
  the worker JobSet (if it has this origin's label) and Workload are deleted.
* **Failures** that the real controller only logs and retries (a create the worker refuses — no
  such namespace, a webhook's 422 —, a worker JobSet of another origin) leave the check as it
  is (``Pending``, empty message) and are recorded in :attr:`MultiKueue.remote_errors`; a
  worker refuses objects in a namespace it lacks (``namespaces "x" not found``), as
  kube-apiserver does.

Not simulated: the Incremental and External dispatchers, a worker's loss timeout
(``workerLostTimeout``: an unreachable admitting worker is waited for), elastic and
multi-Workload jobs, the adapters of other kinds (a MultiKueue Workload owned by anything but
a JobSet is recorded in ``errors``: the test fails), preemption gates, delayed topology requests, manager quota
automation, ``ClusterProfile``, Events, the per-cluster garbage collector of orphaned copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Mapping
from typing import Any

import attrs
import kmock

from support import kueue_status as st
from support.jobset import JOBSETS
from support.kube_emulator import NAMESPACES, Body, KubeEmulator, api_error
from support.kueue import (
    ADMISSION_CHECKS,
    MULTIKUEUE_CLUSTERS,
    MULTIKUEUE_CONTROLLER,
    MULTIKUEUE_ORIGIN_LABEL,
    WORKLOADS,
)
from support.multikueue_connect import (
    CONFIG_NAMESPACE,
    CONNECTION_FAILED,
    KUBECONFIG_KEY,
    SECRETS,
    RefusedError,
    config_of,
    connect,
    not_found,
)
from support.multikueue_dispatch import Group

__all__ = [
    "CONFIG_NAMESPACE",
    "DISPATCHER",
    "KUBECONFIG_KEY",
    "ORIGIN",
    "SECRETS",
    "MultiKueue",
    "RemoteError",
]

ORIGIN = "multikueue"
"""Kueue's ``multiKueue.origin`` default: the value of the origin label on the copies."""
DISPATCHER = "AllAtOnce"
"""Kueue's ``multiKueue.dispatcherName`` default, the one simulated."""


@attrs.frozen
class RemoteError:
    """What the real controller would log ("Reconciler error") and retry."""

    cluster: str
    workload: str
    """``namespace/name`` of the manager's Workload."""
    message: str


class MultiKueue:
    """The simulated MultiKueue controller of a manager emulator (see the module docstring).

    ``servers``: the worker API servers a kubeconfig may point at, by URL (``EmulatedCluster
    .url``) — the simulated network."""

    def __init__(
        self,
        manager: KubeEmulator,
        servers: Mapping[str, KubeEmulator],
        *,
        origin: str = ORIGIN,
        config_namespace: str = CONFIG_NAMESPACE,
    ) -> None:
        self.emu = manager
        self.servers = {url.rstrip("/"): emu for url, emu in servers.items()}
        self.origin = origin
        self.config_namespace = config_namespace
        self.errors: list[Exception] = []
        self.remote_errors: list[RemoteError] = []
        self.connected: dict[str, KubeEmulator] = {}
        """MultiKueueCluster name → its worker, for the Active ones."""
        self._dispatched: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {}
        """(namespace, name) of manager Workloads → (JobSet name, clusters it may have copies
        in): what the real controller's cache of deleted Workloads gives it."""
        self._unsupported: set[str] = set()

    @classmethod
    def install(
        cls, manager: KubeEmulator, servers: Mapping[str, KubeEmulator], **kwargs: Any
    ) -> MultiKueue:
        """MultiKueue for a manager whose Kueue (and its CRDs, which have MultiKueue's kinds)
        is installed: :meth:`support.kueue.Kueue.install`."""
        manager.resolve(MULTIKUEUE_CLUSTERS)  # 404 without Kueue's CRDs
        return cls(manager, servers, **kwargs)

    # ---- the loop -----------------------------------------------------------------------------
    def reconcile(self) -> None:
        """One pass: clusters, admission checks, then the manager's Workloads."""
        for mkc in self.emu.select(MULTIKUEUE_CLUSTERS):
            self._reconcile_cluster(mkc)
        gone = set(self.connected) - {
            m["metadata"]["name"] for m in self.emu.select(MULTIKUEUE_CLUSTERS)
        }
        for name in gone:
            del self.connected[name]
        for ac in self.emu.select(ADMISSION_CHECKS):
            if ac["spec"].get("controllerName") == MULTIKUEUE_CONTROLLER:
                self._reconcile_check(ac)
        workloads = sorted(
            self.emu.select(WORKLOADS), key=lambda w: int(w["metadata"]["resourceVersion"])
        )
        live = {(w["metadata"]["namespace"], w["metadata"]["name"]) for w in workloads}
        for key in sorted(set(self._dispatched) - live):
            self._forget(key)
        for wl in workloads:
            self._reconcile_workload(wl)

    async def run(self, interval_s: float = 0.05) -> None:
        """Reconcile until cancelled; a pass that raises is recorded in ``errors``."""
        while True:
            try:
                self.reconcile()
            except Exception as exc:
                self.errors.append(exc)
            await asyncio.sleep(interval_s)

    def write_status(self, resource: kmock.resource, obj: Body, status: Body) -> Body:
        if status == (obj.get("status") or {}):
            return obj
        meta = obj["metadata"]
        return self.emu.replace(
            resource,
            meta.get("namespace"),
            meta["name"],
            {**obj, "status": status},
            subresource="status",
        )

    # ---- MultiKueueClusters -------------------------------------------------------------------
    def _reconcile_cluster(self, mkc: Body) -> None:
        name = mkc["metadata"]["name"]
        status = copy.deepcopy(mkc.get("status") or {})
        try:
            worker = connect(self.emu, self.servers, mkc, self.config_namespace)
        except RefusedError as refused:
            self.connected.pop(name, None)
            message = refused.message
            if refused.reason != CONNECTION_FAILED:
                message = f"load client config failed: {message}"
            st.set_condition(status, "Active", False, refused.reason, message)
        else:
            self.connected[name] = worker
            st.set_condition(status, "Active", True, "Active", "Connected")
        self.write_status(MULTIKUEUE_CLUSTERS, mkc, status)

    # ---- AdmissionChecks ----------------------------------------------------------------------
    def _reconcile_check(self, ac: Body) -> None:
        status = copy.deepcopy(ac.get("status") or {})
        try:
            config = config_of(self.emu, ac)
        except RefusedError as refused:
            message = f"Cannot load the AdmissionChecks parameters: {refused.message}"
            st.set_condition(status, "Active", False, "BadConfig", message)
        else:
            clusters = config["spec"]["clusters"]
            missing, inactive = [], []
            for name in clusters:
                mkc = self.emu.get_object(MULTIKUEUE_CLUSTERS, None, name)
                if mkc is None:
                    missing.append(name)
                elif not st.condition(mkc, "Active"):
                    inactive.append(name)
            parts = []
            if missing:
                parts.append(f"Missing clusters: [{' '.join(missing)}]")
            if inactive:
                parts.append(f"Inactive clusters: [{' '.join(inactive)}]")
            if not parts:
                st.set_condition(status, "Active", True, "Active", "The admission check is active")
            elif len(missing) + len(inactive) < len(clusters):
                st.set_condition(status, "Active", True, "SomeActiveClusters", ", ".join(parts))
            else:
                st.set_condition(status, "Active", False, "NoUsableClusters", ", ".join(parts))
        self.write_status(ADMISSION_CHECKS, ac, status)

    # ---- Workloads ----------------------------------------------------------------------------
    def multikueue_check(self, wl: Body) -> tuple[Body, Body] | None:
        """``GetMultiKueueAdmissionCheck``: the AdmissionCheck and the Workload's state of it."""
        for state in (wl.get("status") or {}).get("admissionChecks") or []:
            ac = self.emu.get_object(ADMISSION_CHECKS, None, state["name"])
            if ac is not None and ac["spec"].get("controllerName") == MULTIKUEUE_CONTROLLER:
                return ac, state
        return None

    def set_check(
        self, wl: Body, name: str, state: str, message: str, previously: str = ", Previously"
    ) -> Body:
        """``updateACS``: the state, its message and ``<previously>: "<the old state>"``."""
        status = copy.deepcopy(wl["status"])
        old = st.check_state(status, name) or {}
        text = f'{message}{previously}: "{old.get("state", "")}"'
        st.set_check_state(status, name, state, text)
        return self.write_status(WORKLOADS, wl, status)

    def remote_error(self, cluster: str, wl: Body, exc: Exception | str) -> None:
        message = exc.message if isinstance(exc, kmock.KubernetesError) else str(exc)
        meta = wl["metadata"]
        error = RemoteError(cluster, f"{meta['namespace']}/{meta['name']}", str(message))
        if error not in self.remote_errors:
            self.remote_errors.append(error)

    def remote_create(self, worker: KubeEmulator, resource: kmock.resource, body: Body) -> Body:
        """Create in a worker as its API server would: not in a namespace it lacks."""
        ns = body["metadata"]["namespace"]
        if worker.get_object(NAMESPACES, None, ns) is None:
            raise api_error(404, "NotFound", not_found("namespaces", ns))
        return worker.create(resource, ns, body)

    def remove_remote(self, cluster: str, ns: str, name: str, owner: str) -> None:
        """``RemoveRemoteObjects``: the worker's JobSet if this origin made it, then the
        Workload copy."""
        worker = self.connected.get(cluster)
        if worker is None:
            return
        js = worker.get_object(JOBSETS, ns, owner)
        if (
            js is not None
            and (js["metadata"].get("labels") or {}).get(MULTIKUEUE_ORIGIN_LABEL) == self.origin
        ):
            with contextlib.suppress(kmock.KubernetesError):
                worker.delete(JOBSETS, ns, owner)
        with contextlib.suppress(kmock.KubernetesError):
            worker.delete(WORKLOADS, ns, name)

    def _forget(self, key: tuple[str, str]) -> None:
        """A manager Workload that is gone: its copies and worker JobSets go too."""
        owner, clusters = self._dispatched.pop(key)
        for cluster in clusters:
            self.remove_remote(cluster, key[0], key[1], owner)

    def _reconcile_workload(self, wl: Body) -> None:
        found = self.multikueue_check(wl)
        if found is None:
            return
        ac, state = found
        if state["state"] == st.REJECTED:
            return
        meta = wl["metadata"]
        ns, name = meta["namespace"], meta["name"]
        owner_ref = next(
            (r for r in meta.get("ownerReferences") or [] if r.get("controller")), None
        )
        if owner_ref is None:
            self.set_check(wl, ac["metadata"]["name"], st.REJECTED, "No multikueue adapter found")
            return
        group = owner_ref["apiVersion"].rpartition("/")[0]
        if (group, owner_ref["kind"]) != (JOBSETS.group, "JobSet"):  # Kueue has more adapters
            if f"{ns}/{name}" not in self._unsupported:
                self._unsupported.add(f"{ns}/{name}")
                self.errors.append(
                    NotImplementedError(
                        f"Workload {ns}/{name} of a {owner_ref['kind']}: the simulated "
                        "MultiKueue dispatches JobSets only"
                    )
                )
            return
        local_js = self.emu.get_object(JOBSETS, ns, owner_ref["name"])
        if local_js is None or local_js["metadata"]["uid"] != owner_ref.get("uid"):
            return  # the owner is being deleted: the Workload goes with it (see _forget)
        managed_by = local_js["spec"].get("managedBy") or ""
        if managed_by != MULTIKUEUE_CONTROLLER:
            self.set_check(
                wl,
                ac["metadata"]["name"],
                st.REJECTED,
                "The owner is not managed by Kueue: Expecting spec.managedBy to be "
                f'"{MULTIKUEUE_CONTROLLER}" not "{managed_by}"',
            )
            return
        try:
            clusters = tuple(config_of(self.emu, ac)["spec"]["clusters"])
        except RefusedError as refused:
            self.remote_error(
                "", wl, f'admission check "{ac["metadata"]["name"]}": {refused.message}'
            )
            return
        previous = self._dispatched.get((ns, name), ("", ()))[1]
        self._dispatched[(ns, name)] = (
            owner_ref["name"],
            tuple(dict.fromkeys((*previous, *clusters))),
        )
        Group(self, wl, ac["metadata"]["name"], local_js, clusters).reconcile()
