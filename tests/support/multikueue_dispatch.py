"""The simulated MultiKueue's dispatch of one manager Workload (Kueue v0.19.2,
``pkg/controller/admissionchecks/multikueue/workload.go``: ``wlGroup``/``reconcileGroup``,
the AllAtOnce dispatcher, and the JobSet adapter's ``SyncJob``), split from
:mod:`support.multikueue`, which describes the behaviour."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING

import kmock

from support import kueue_status as st
from support.jobset import JOBSETS
from support.kube_emulator import Body
from support.kueue import (
    JOB_UID_LABEL,
    MULTIKUEUE_ORIGIN_LABEL,
    PREBUILT_WORKLOAD_KEY,
    WORKLOADS,
)

if TYPE_CHECKING:
    from support.multikueue import MultiKueue


def _earliest_true(remotes: Mapping[str, Body | None], type_: str) -> tuple[str, Body] | None:
    """``bestMatchByCondition``: the cluster whose copy has the condition True the longest."""
    best: tuple[str, Body, str] | None = None
    for cluster, wl in sorted(remotes.items()):
        c = st.condition(wl, type_) if wl is not None else None
        if c is not None and (best is None or str(c["lastTransitionTime"]) < best[2]):
            best = (cluster, dict(c), str(c["lastTransitionTime"]))
    return (best[0], best[1]) if best else None


class Group:
    """``wlGroup``: a manager Workload, its check state, and its copies in the Active clusters
    of the check's MultiKueueConfig; :meth:`reconcile` is ``reconcileGroup``."""

    def __init__(
        self, mk: MultiKueue, wl: Body, check: str, local_js: Body, clusters: tuple[str, ...]
    ) -> None:
        self.mk, self.wl, self.check, self.local_js = mk, wl, check, local_js
        self.ns, self.name = wl["metadata"]["namespace"], wl["metadata"]["name"]
        self.owner = local_js["metadata"]["name"]
        self.workers = {c: mk.connected[c] for c in clusters if c in mk.connected}
        self.unavailable = [c for c in clusters if c not in mk.connected]
        self.remotes: dict[str, Body | None] = {
            c: w.get_object(WORKLOADS, self.ns, self.name) for c, w in self.workers.items()
        }

    @property
    def state(self) -> Body:
        return st.check_state(self.wl.get("status") or {}, self.check) or {}

    def remove(self, cluster: str) -> None:
        self.mk.remove_remote(cluster, self.ns, self.name, self.owner)
        self.remotes[cluster] = None

    def reconcile(self) -> None:
        status = self.wl.get("status") or {}
        # 2. finished or without quota: no copies anywhere
        if st.is_true(status, "Finished") or not st.is_true(status, "QuotaReserved"):
            for cluster, remote in self.remotes.items():
                if remote is not None or self.workers[cluster].get_object(
                    JOBSETS, self.ns, self.owner
                ):
                    self.remove(cluster)
            return
        # 3. a copy finished: a last status copy, then the manager's Workload finishes
        if finished := _earliest_true(self.remotes, "Finished"):
            cluster, cond = finished
            if self.sync_job(cluster):
                new = copy.deepcopy(status)
                st.set_condition(new, "Finished", True, cond["reason"], cond["message"])
                self.mk.write_status(WORKLOADS, self.wl, new)
            return
        # 4. evicted in the worker while admitted through it: Retry
        if evicted := _earliest_true(self.remotes, "Evicted"):
            if st.is_true(status, "Evicted"):  # evicted in the manager too
                self.sync_job(evicted[0])
                return
            if self.state.get("state") == st.READY:
                self.mk.set_check(
                    self.wl,
                    self.check,
                    st.RETRY,
                    f'Workload evicted on worker cluster: "{status.get("clusterName", evicted[0])}", '
                    "resetting for re-admission",
                    previously=". Previously",
                )
                return
        # 5. copies whose spec differs from the manager's are deleted
        for cluster, remote in self.remotes.items():
            if remote is not None and remote["spec"] != self.wl["spec"]:
                self.remove(cluster)
        # 6. the copy a worker admitted first wins
        admitted = _earliest_true(self.remotes, "Admitted")
        if admitted is None:
            if self.state.get("state") == st.READY:
                admitting = status.get("clusterName") or ""
                if admitting in self.unavailable:
                    return  # waiting for the admitting worker (workerLostTimeout: not simulated)
                message = (
                    "Admitting remote no longer exists"
                    if admitting
                    else "Admission check is Ready but no admitting cluster is recorded; this "
                    "is unexpected, please report it"
                )
                self.mk.set_check(self.wl, self.check, st.RETRY, message)
                return
        else:
            winner = admitted[0]
            for cluster, remote in self.remotes.items():
                if remote is not None and cluster != winner:
                    self.remove(cluster)
            if self.sync_job(winner):
                self.admitted_on(winner)
            return
        # 8. nominate while Pending and not assigned
        if self.state.get("state") != st.PENDING or status.get("clusterName"):
            return
        others = [c for c in status.get("admissionChecks") or [] if c["name"] != self.check]
        if any(c["state"] != st.READY for c in others):
            return  # allNonMKAdmissionChecksReady: the other checks first
        self.nominate()

    def sync_job(self, cluster: str) -> bool:
        """The JobSet adapter's ``SyncJob``: copy the worker JobSet's status to the manager's,
        or create the worker JobSet. False (and an error recorded) when that fails."""
        worker = self.workers[cluster]
        remote = worker.get_object(JOBSETS, self.ns, self.owner)
        if remote is not None:
            origin = (remote["metadata"].get("labels") or {}).get(MULTIKUEUE_ORIGIN_LABEL)
            if origin != self.mk.origin:
                self.mk.remote_error(
                    cluster,
                    self.wl,
                    f"remote object is not owned by MultiKueue: expected "
                    f'"{MULTIKUEUE_ORIGIN_LABEL}"="{self.mk.origin}" on JobSet "{self.ns}/{self.owner}"',
                )
                return False
            local = self.mk.emu.read(JOBSETS, self.ns, self.owner)
            if remote.get("status") and remote["status"] != local.get("status"):
                self.mk.emu.replace(
                    JOBSETS,
                    self.ns,
                    self.owner,
                    {**local, "status": remote["status"]},
                    subresource="status",
                )
            return True
        local = self.mk.emu.read(JOBSETS, self.ns, self.owner)
        meta = local["metadata"]
        spec = copy.deepcopy(local["spec"])
        spec.pop("managedBy", None)  # the worker's JobSet controller takes over
        body = {
            "apiVersion": local["apiVersion"],
            "kind": "JobSet",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": {**(meta.get("labels") or {}), MULTIKUEUE_ORIGIN_LABEL: self.mk.origin},
                "annotations": {
                    **(meta.get("annotations") or {}),
                    PREBUILT_WORKLOAD_KEY: self.name,
                },
            },
            "spec": spec,
        }
        try:
            self.mk.remote_create(worker, JOBSETS, body)
        except kmock.KubernetesError as exc:
            self.mk.remote_error(cluster, self.wl, exc)
            return False
        return True

    def admitted_on(self, cluster: str) -> None:
        """``syncAdmittingRemoteState``: the check Ready, ``clusterName``, no nominations."""
        if self.state.get("state") in (st.RETRY, st.REJECTED, st.READY):
            return
        status = copy.deepcopy(self.wl["status"])
        st.set_check_state(
            status, self.check, st.READY, f'The workload was admitted on "{cluster}"'
        )
        status["clusterName"] = status.get("clusterName") or cluster
        status.pop("nominatedClusterNames", None)
        self.mk.write_status(WORKLOADS, self.wl, status)

    def nominate(self) -> None:
        """The AllAtOnce dispatcher: every Active cluster nominated and given a copy."""
        nominated = sorted(self.workers)
        status = self.wl.get("status") or {}
        if sorted(status.get("nominatedClusterNames") or []) != nominated:
            new = copy.deepcopy(status)
            if nominated:
                new["nominatedClusterNames"] = nominated
            else:
                new.pop("nominatedClusterNames", None)
            self.wl = self.mk.write_status(WORKLOADS, self.wl, new)
        meta = self.wl["metadata"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != JOB_UID_LABEL}
        labels[MULTIKUEUE_ORIGIN_LABEL] = self.mk.origin
        for cluster in nominated:
            if self.remotes[cluster] is not None:
                continue
            body = {
                "apiVersion": self.wl["apiVersion"],
                "kind": "Workload",
                "metadata": {
                    "name": self.name,
                    "namespace": self.ns,
                    "labels": labels,
                    **({"annotations": meta["annotations"]} if meta.get("annotations") else {}),
                },
                "spec": copy.deepcopy(self.wl["spec"]),
            }
            try:
                self.remotes[cluster] = self.mk.remote_create(
                    self.workers[cluster], WORKLOADS, body
                )
            except kmock.KubernetesError as exc:
                self.mk.remote_error(cluster, self.wl, exc)
