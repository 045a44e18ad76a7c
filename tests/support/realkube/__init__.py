"""Real Kubernetes components for the tests: etcd, kube-apiserver and kube-controller-manager
(:mod:`.controlplane`), the JobSet controller and Kueue's manager (:mod:`.addons`), built from
their published Go modules by ``tools/kube/build.sh`` (``make kube``) into a cache outside the
repository (:mod:`.binaries`). :func:`running_plane` starts one plane with the operator's CRDs,
Kubeflow Trainer's TrainJob CRD, JobSet and Kueue; :class:`~.cluster.RealCluster` is what a
test drives it with. ``python -m support.realkube`` (``make cluster``) starts one by hand."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from . import binaries
from .addons import JOBSET, KUEUE, install, wait_established
from .cluster import Plane, RealCluster
from .controlplane import control_plane
from .processes import stopping

REPO = binaries.REPO


def crd_files() -> list[Path]:
    """The operator's CRDs and Kubeflow Trainer's (TrainJob & runtimes, its module's)."""
    trainer = binaries.Component("trainer", binaries.versions()["TRAINER_VERSION"])
    return sorted((REPO / "crds").glob("*.yaml")) + sorted(
        trainer.config("crds").glob("trainer.kubeflow.org_*.yaml")
    )


def install_crds(cluster: RealCluster, files: list[Path]) -> None:
    crds = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    for crd in crds:
        cluster.apply(crd)
    wait_established(cluster, crds)


def trainer_runtimes() -> list[dict[str, Any]]:
    """The ClusterTrainingRuntimes Kubeflow Trainer installs (``torch-distributed``, …): Kueue's
    TrainJob webhook refuses a TrainJob whose runtime does not exist."""
    trainer = binaries.Component("trainer", binaries.versions()["TRAINER_VERSION"])
    return [
        d
        for f in sorted(trainer.config("runtimes").glob("*.yaml"))
        if f.name != "kustomization.yaml"
        for d in yaml.safe_load_all(f.read_text())
        if d
    ]


def jobset_gates(gates: Mapping[str, bool]) -> Callable[[dict[str, Any]], None]:
    def configure(config: dict[str, Any]) -> None:
        config["featureGates"] = dict(gates)

    return configure


SERVED_INTEGRATIONS = (
    "batch/job",
    "pod",
    "deployment",
    "statefulset",
    "jobset.x-k8s.io/jobset",
    "trainer.kubeflow.org/trainjob",
)
"""The Kueue integrations whose kinds a plane serves (built in, or a CRD installed here)."""


def kueue_configuration() -> Callable[[dict[str, Any]], None]:
    """Kueue's shipped configuration, with
    * its integrations cut to the kinds this plane serves: a MultiKueue manager watches every
      enabled integration's kind in each worker, and marks a worker that lacks one inactive
      (``no matches for kind "MPIJob"``: ClientConnectionFailed) — the shipped list names
      MPIJob, Ray, AppWrapper, LeaderWorkerSet;
    * no on-demand visibility API server: no APIService points at it out of cluster, and v0.19
      reads its certificate from the fixed path /visibility (pkg/visibility/server.go)."""

    def configure(config: dict[str, Any]) -> None:
        frameworks = config["integrations"]["frameworks"]
        config["integrations"]["frameworks"] = [f for f in frameworks if f in SERVED_INTEGRATIONS]
        config.setdefault("featureGates", {})["VisibilityOnDemand"] = False

    return configure


@contextlib.contextmanager
def running_plane(
    directory: Path,
    name: str = "kube",
    *,
    jobset: bool = True,
    kueue: bool = True,
    jobset_feature_gates: Mapping[str, bool] | None = None,
) -> Iterator[Plane]:
    """A control plane with the CRDs, JobSet (``jobset_feature_gates``) and Kueue running;
    every process stopped by PID at exit."""
    with control_plane(directory / name, name) as control:
        admin = RealCluster(control.admin_kubeconfig, control)
        try:
            install_crds(admin, crd_files())
            for runtime in trainer_runtimes():
                admin.apply(runtime)
            with stopping([]) as started:
                plane = Plane(control, admin)
                if jobset:
                    gates = jobset_gates(jobset_feature_gates or {})
                    process = install(control, admin, JOBSET, directory / name / "jobset", gates)
                    started.append(process)
                    plane.controllers["jobset"] = process
                if kueue:
                    configure = kueue_configuration()
                    process = install(control, admin, KUEUE, directory / name / "kueue", configure)
                    started.append(process)
                    plane.controllers["kueue"] = process
                yield plane
        finally:
            admin.close()
