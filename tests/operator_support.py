"""Shared pieces of the operator tests: the operator embedded against the emulated API."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import yaml

from shardmeter.cost.coefficients import LinkRole, Source
from shardmeter.cost.priors import prior_coefficients
from shardmeter.spec.hardware import GPU_PRESETS, LINK_PRESETS
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.handlers import build_registry
from support.cluster import EmulatedCluster, embedded_operator, running_emulator
from support.jobset import JobSetController
from support.kueue import API_VERSION as KUEUE_API_VERSION
from support.kueue import Kueue

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
OPERATOR_NS = "shardmeter-system"


def manifest(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES / name).read_text()))


def variant(doc: dict[str, Any], **spec: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["spec"].update(spec)
    return out


@contextlib.asynccontextmanager
async def operator_cluster(
    tmp_path: Path,
    namespaces: tuple[str, ...] = (),
    *,
    jobset: bool = False,
    kueue: bool = False,
    jobset_feature_gates: Mapping[str, bool] | None = None,
    **config: Any,
) -> AsyncIterator[EmulatedCluster]:
    """The operator embedded against the emulated API server: every namespace, or (as
    ``--namespace`` does) only ``namespaces``; with ``jobset``/``kueue`` the simulated JobSet
    and Kueue installed (CRDs, webhooks) and their controllers running (JobSet with
    ``jobset_feature_gates``, e.g. ``{"RestartJob": True}``; v0.12.0's defaults otherwise)."""
    async with (
        running_emulator(crds_dir=REPO / "crds", tmp_path=tmp_path) as cluster,
        simulated_controllers(
            cluster, jobset=jobset, kueue=kueue, jobset_feature_gates=jobset_feature_gates
        ),
    ):
        cfg = OperatorConfig(
            namespace=OPERATOR_NS,
            recheck_interval_s=0.3,
            retry_backoff_s=0.2,
            kubeconfig=str(cluster.kubeconfig_path),
            bench_image="bench:test",
            **config,
        )
        for namespace in namespaces:  # kopf serves the watched namespaces that exist
            cluster.apply(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        memo = kopf.Memo(config=cfg, kube=None)
        async with embedded_operator(build_registry(cfg), memo=memo, namespaces=namespaces):
            yield cluster
        # what a real API server would have dropped silently (a status field the CRD lacks)
        assert cluster.emulator.warnings == [], cluster.emulator.warnings


def job_uids(cluster: EmulatedCluster) -> dict[str, str]:
    """The Jobs that exist now, ``namespace/name`` → uid. "No Job was created or replaced" is
    this mapping unchanged, not a count of POST requests: a reconcile that runs again (a retried
    handler, a status patch that conflicted) re-POSTs its children, gets 409 and adopts them —
    no Job is created, yet the request count grows."""
    return {
        f"{j['metadata']['namespace']}/{j['metadata']['name']}": j["metadata"]["uid"]
        for j in cluster.list("jobs")
    }


@contextlib.asynccontextmanager
async def simulated_controllers(
    cluster: EmulatedCluster,
    *,
    jobset: bool = False,
    kueue: bool = False,
    jobset_feature_gates: Mapping[str, bool] | None = None,
) -> AsyncIterator[list[JobSetController | Kueue]]:
    """Install the simulated JobSet (with ``jobset_feature_gates``) and/or Kueue and run their
    controllers in the background (every 50 ms) until exit; fails if a pass of theirs raised."""
    controllers: list[JobSetController | Kueue] = []
    if jobset:
        controllers.append(JobSetController.install(cluster.emulator, jobset_feature_gates))
    if kueue:
        controllers.append(Kueue.install(cluster.emulator))
    tasks = [asyncio.create_task(c.run()) for c in controllers]
    try:
        yield controllers
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    errors = [e for c in controllers for e in c.errors]
    assert not errors, errors


async def apply(cluster: EmulatedCluster, *docs: dict[str, Any]) -> None:
    text = "---\n".join(yaml.safe_dump(d) for d in docs)
    await cluster.kubectl("apply", "-f", "-", input=text)  # strict validation, as by default


async def status_of(
    cluster: EmulatedCluster,
    resource: str,
    namespace: str | None,
    name: str,
    predicate: Any,
    timeout: float = 60,
) -> dict[str, Any]:
    """Wait until ``predicate(status)`` holds; return the status. The timeout only bounds a
    failing test: generous, since planning on a loaded 2-core machine is several times slower."""
    found: dict[str, Any] = {}

    def check() -> bool:
        obj = cluster.get(resource, namespace, name)
        status = (obj or {}).get("status") or {}
        if status and predicate(status):
            found.update(status)
            return True
        return False

    await cluster.wait_for(check, timeout=timeout)
    return found


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == type_)


# ---- Kueue objects (the simulated Kueue of support/kueue.py serves them) ----------------------
def flavor(
    name: str, labels: dict[str, str], taints: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeLabels": labels}
    if taints:
        spec["nodeTaints"] = taints
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": spec,
    }


def cluster_queue(gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": "gpus"},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "h200",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}],
                        }
                    ],
                }
            ],
        },
    }


LOCAL_QUEUE = {
    "apiVersion": KUEUE_API_VERSION,
    "kind": "LocalQueue",
    "metadata": {"name": "team-a", "namespace": "default"},
    "spec": {"clusterQueue": "gpus"},
}


def with_flavor(pool: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(pool)
    out["spec"]["kueue"] = {"flavor": name}
    return out


# ---- coefficients as a benchmark would publish them -----------------------------------------
def measured_h200_with_slow_fabric() -> dict[str, str]:
    """'Measured' coefficients as the bench Job would publish them: compute as the priors,
    but the inter-node all_reduce 200× slower than the InfiniBand datasheet — the outer
    all_reduce between islands at one site runs on that fabric."""
    prior = prior_coefficients(
        GPU_PRESETS["h200-141gb-sxm"],
        LINK_PRESETS["nvlink4"],
        LINK_PRESETS["ib-ndr"],
        pool="cluster-a",
    )
    compute = {
        t: fit.model_copy(update={"cv_mape": 0.04, "n_samples": 50})
        for t, fit in prior.compute.items()
    }
    comm = {role: dict(fits) for role, fits in prior.communication.items()}
    slow = comm[LinkRole.INTER_NODE]["all_reduce"]
    comm[LinkRole.INTER_NODE]["all_reduce"] = slow.model_copy(
        update={"seconds_per_byte": slow.seconds_per_byte * 200, "n_samples": 20, "mape": 0.05}
    )
    doc = prior.model_copy(
        update={
            "source": Source.MEASURED,
            "measured_at": datetime.now(UTC),
            "compute": compute,
            "communication": comm,
        }
    )
    return doc.to_configmap_data()
