"""Shared pieces of the operator tests: the operator embedded against the emulated API."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import yaml

from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.handlers import build_registry
from support.cluster import EmulatedCluster, embedded_operator, running_emulator

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
    tmp_path: Path, namespaces: tuple[str, ...] = (), **config: Any
) -> AsyncIterator[EmulatedCluster]:
    """The operator embedded against the emulated API server: every namespace, or (as
    ``--namespace`` does) only ``namespaces``."""
    async with running_emulator(crds_dir=REPO / "crds", tmp_path=tmp_path) as cluster:
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


async def apply(cluster: EmulatedCluster, *docs: dict[str, Any]) -> None:
    text = "---\n".join(yaml.safe_dump(d) for d in docs)
    await cluster.kubectl("apply", "-f", "-", input=text)  # strict validation, as by default


async def status_of(
    cluster: EmulatedCluster,
    resource: str,
    namespace: str | None,
    name: str,
    predicate: Any,
    timeout: float = 20,
) -> dict[str, Any]:
    """Wait until ``predicate(status)`` holds; return the status."""
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
