"""MultiKueue's worker clusters, for reading the pods of islands that run there.

MultiKueue already holds a credential for each worker: a MultiKueueCluster (Kueue v0.19,
``kueue.x-k8s.io/v1beta2``) names a kubeconfig — ``spec.clusterSource.kubeConfig`` (earlier
v1beta2 releases: ``spec.kubeConfig``) with ``locationType: Secret`` and ``location`` the
Secret's name in Kueue's namespace, key ``kubeconfig``. With ``--read-worker-kubeconfigs``
(chart: ``multiCluster.readWorkerKubeconfigs``, which grants ``get`` on Secrets in that
namespace only) the operator builds a client from the same Secret and reads an island's pods
and rank 0's log in its worker, as it does in its own cluster. Without it — or for a kubeconfig
at a ``Path`` inside Kueue's pod — worker islands are observed through Prometheus only
(``spec.observe.stepSecondsQuery``), and their observation says so.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import kubernetes
import yaml

from shardmeter_operator.k8s.client import ApiError, Kube

API_VERSION = "kueue.x-k8s.io/v1beta2"
SECRET_KEY = "kubeconfig"


@dataclass
class _Cached:
    version: str
    kube: Kube


class WorkerClusters:
    """Clients of the worker clusters, built from their MultiKueue kubeconfig Secrets and
    kept while the Secret's resourceVersion stays the same."""

    def __init__(self, kube: Kube, kueue_namespace: str, enabled: bool) -> None:
        self.kube, self.namespace, self.enabled = kube, kueue_namespace, enabled
        self._cache: dict[str, _Cached] = {}

    async def client(self, cluster: str) -> tuple[Kube | None, str]:
        """(the worker's client, "") or (None, why it cannot be read)."""
        if not self.enabled:
            return None, (
                f"the islands run in worker cluster {cluster}, and the operator does not read "
                "worker kubeconfigs (--read-worker-kubeconfigs); set spec.observe."
                "stepSecondsQuery to observe them through Prometheus"
            )
        mkc = await self.kube.get(API_VERSION, "MultiKueueCluster", None, cluster)
        if mkc is None:
            return None, f"MultiKueueCluster {cluster} does not exist"
        spec = mkc.get("spec") or {}
        source = (spec.get("clusterSource") or {}).get("kubeConfig") or spec.get("kubeConfig")
        source = source or {}
        if (source.get("locationType") or "Secret") != "Secret":
            return None, (
                f"MultiKueueCluster {cluster}'s kubeconfig is a path inside Kueue's pod "
                f"({source.get('location')}): only a Secret can be read by the operator"
            )
        name = str(source.get("location") or "")
        try:
            secret = await self.kube.get("v1", "Secret", self.namespace, name)
        except ApiError as exc:
            return None, f"Secret {self.namespace}/{name} of {cluster}: {exc}"
        if secret is None:
            return None, f"Secret {self.namespace}/{name} of MultiKueueCluster {cluster} is missing"
        version = str((secret.get("metadata") or {}).get("resourceVersion") or "")
        cached = self._cache.get(cluster)
        if cached is not None and cached.version == version:
            return cached.kube, ""
        raw = (secret.get("data") or {}).get(SECRET_KEY)
        try:
            config = yaml.safe_load(base64.b64decode(raw or "").decode())
            cfg = kubernetes.client.Configuration()
            kubernetes.config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]  # unannotated
                config, client_configuration=cfg
            )
        except Exception as exc:  # a malformed kubeconfig: say so, observe nothing
            return None, f"Secret {self.namespace}/{name}: unreadable kubeconfig ({exc})"[:300]
        if cached is not None:
            cached.kube.close()
        kube = Kube(cfg)
        self._cache[cluster] = _Cached(version, kube)
        return kube, ""

    def close(self) -> None:
        for cached in self._cache.values():
            cached.kube.close()
        self._cache.clear()
