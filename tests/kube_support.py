"""Shared pieces of the real-cluster tests (tests/kube/): the test's view of the plane and
the operator embedded against it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kopf
import yaml

from operator_support import OPERATOR_NS
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.handlers import build_registry
from support.cluster import embedded_operator
from support.kueue import API_VERSION as KUEUE_API
from support.realkube.addons import service_account_token
from support.realkube.cluster import Plane, RealCluster

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "shardmeter"
QUEUE = "team-a"
H200 = {"node.kubernetes.io/instance-type": "h200-8x"}
"""The example pool cluster-a's node selector."""


class Kube(RealCluster):
    """The admin's view of the plane, plus what the test made: its namespace ``ns`` (deleted at
    the end) and the cluster-scoped objects it applied through :meth:`apply` (deleted too)."""

    def __init__(self, plane: Plane, ns: str, created: list[Any]) -> None:
        super().__init__(plane.control.admin_kubeconfig, plane.control)
        self.ns, self.created, self.plane_ = ns, created, plane

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        out = super().apply(body)
        info = self._info(body)
        if not info.namespaced:
            key = (f"{info.group_version}/{info.plural}", None, body["metadata"]["name"])
            if key not in self.created:
                self.created.append(key)
        return out

    def namespace(self, name: str) -> str:
        """Create another namespace for this test (deleted at its end)."""
        super().apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self.created.insert(0, ("namespaces", None, name))
        return name


@contextlib.asynccontextmanager
async def real_operator(
    kube: RealCluster,
    *,
    kubeconfig: Path | None = None,
    namespaces: tuple[str, ...] = (),
    **config: Any,
) -> AsyncIterator[OperatorConfig]:
    """The operator embedded in the test's loop against the real API server, with the admin's
    credentials unless ``kubeconfig``; every namespace unless ``namespaces``."""
    cfg = OperatorConfig(
        namespace=OPERATOR_NS,
        recheck_interval_s=0.3,
        retry_backoff_s=0.2,
        kubeconfig=str(kubeconfig or kube.kubeconfig_path),
        bench_image="bench:test",
        **config,
    )
    memo = kopf.Memo(config=cfg, kube=None)
    async with embedded_operator(
        build_registry(cfg), memo=memo, namespaces=namespaces, ready_timeout=30
    ):
        yield cfg


def kueue_objects(ns: str, gpus: int, queue: str = "gpus") -> list[dict[str, Any]]:
    """A ResourceFlavor on the pool's nodes, a ClusterQueue with ``gpus`` of quota for this
    namespace only, and a LocalQueue in it."""
    return [
        {
            "apiVersion": KUEUE_API,
            "kind": "ResourceFlavor",
            "metadata": {"name": f"h200-{ns}"},
            "spec": {"nodeLabels": H200},
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "ClusterQueue",
            "metadata": {"name": f"{queue}-{ns}"},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": f"h200-{ns}",
                                "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": ns},
            "spec": {"clusterQueue": f"{queue}-{ns}"},
        },
    ]


def render_chart(values: dict[str, Any], release: str) -> list[dict[str, Any]]:
    """The chart as Helm renders it into the operator's namespace (helm-python-sdk)."""
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name=release, namespace=OPERATOR_NS)
    return [
        d
        for path, text in sorted(out.items())
        if not path.endswith(".txt")
        for d in yaml.safe_load_all(text)
        if d
    ]


async def install_chart(
    kube: Kube, values: dict[str, Any], release: str, tmp_path: Path
) -> list[dict[str, Any]]:
    """``helm install`` without Helm's release bookkeeping: the rendered chart applied with
    kubectl (strict field validation); everything but the CRDs, which every test shares, is
    deleted at the test's end. No controller runs its Deployment (no kubelet)."""
    docs = render_chart(values, release)
    manifests = tmp_path / f"{release}-chart.yaml"
    manifests.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    result = await kube.kubectl("apply", "-f", str(manifests))
    assert len(result.stdout.strip().splitlines()) == len(docs), result.stdout
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            continue
        info = kube.resource(doc["kind"].lower())
        kube.created.append(
            (
                f"{info.group_version}/{info.plural}",
                doc["metadata"].get("namespace"),
                doc["metadata"]["name"],
            )
        )
    return docs


def operator_kubeconfig(kube: Kube, service_account: str, tmp_path: Path) -> Path:
    """A kubeconfig with the token of the chart's operator ServiceAccount (TokenRequest)."""
    token = service_account_token(kube, OPERATOR_NS, service_account)
    return kube.plane_.control.token_kubeconfig(tmp_path / "operator.kubeconfig", token)
