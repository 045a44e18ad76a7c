"""``crds.kopfPeering: auto`` against a cluster: Helm's ``lookup`` reads the API server, so the
chart is installed by a real Helm (helm-python-sdk's Go SDK) with ``--dry-run=server`` — and
once for real — against the in-memory API server through a kubeconfig, as ``helm install`` does
against kube-apiserver. The access log of the emulator shows Helm's GET of the CRD, so the
lookup is real, not the empty answer of ``helm template``.

* no peering CRD in the cluster: auto renders it;
* a foreign one (``kubectl apply``, another operator: no Helm ownership) or one of another
  release: auto leaves it out, so the install does not take it over;
* this release's own (installed by it before): auto keeps rendering it, so an upgrade does not
  delete it;
* ``true`` renders it regardless, and Helm then refuses to install over the foreign owner.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import pytest_asyncio
import yaml

from support.cluster import EmulatedCluster, running_emulator

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "shardmeter"
PEERING = "clusterkopfpeerings.kopf.dev"
RELEASE, NAMESPACE = "sm", "shardmeter-system"
pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]


@pytest_asyncio.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EmulatedCluster]:
    async with running_emulator(tmp_path=tmp_path) as c:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        await c.kubectl("apply", "-f", "-", input=yaml.safe_dump(namespace))
        yield c


def foreign_crd(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    doc = yaml.safe_load((CHART / "files" / "kopf-peering.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"].pop("labels", None)
    if annotations:
        doc["metadata"]["annotations"] = annotations
    return doc  # type: ignore[no-any-return]


class Helm:
    """Helm against the emulated API server. The release records live in Helm's memory
    driver: the default one (Secrets) is written by client-go's typed client in protobuf,
    which the emulator does not speak; the chart's objects go through Helm's JSON client
    either way."""

    def __init__(self, cluster: EmulatedCluster) -> None:
        self.config = helm.Config(
            kubeconfig_path=str(cluster.kubeconfig_path),
            namespace=NAMESPACE,
            storage_driver="memory",
        )

    async def crds(
        self, setting: object, *, dry_run: str | None = "server", upgrade: bool = False
    ) -> set[str]:
        """The CRDs the release's manifest holds (Helm runs in a thread: its Go SDK blocks,
        and the API server it talks to runs on this event loop)."""

        def run() -> str:
            action = self.config.upgrade if upgrade else self.config.install
            release = action(
                str(CHART),
                RELEASE,
                {"crds": {"kopfPeering": setting}},
                namespace=NAMESPACE,
                dry_run=dry_run,
            )
            return str(release["manifest"])

        manifest = await asyncio.to_thread(run)
        return {
            d["metadata"]["name"]
            for d in yaml.safe_load_all(manifest)
            if d and d["kind"] == "CustomResourceDefinition"
        }

    def close(self) -> None:
        self.config.close()


async def helm_install(cluster: EmulatedCluster, setting: object, **kwargs: Any) -> set[str]:
    h = Helm(cluster)
    try:
        return await h.crds(setting, **kwargs)
    finally:
        h.close()


async def test_auto_renders_the_peering_crd_when_the_cluster_has_none(
    cluster: EmulatedCluster,
) -> None:
    names = await helm_install(cluster, "auto")
    assert {"gpupools.shardmeter.io", "trainingplans.shardmeter.io", PEERING} <= names


@pytest.mark.parametrize(
    "annotations",
    [
        None,  # kubectl apply by hand, or another kopf operator's installer
        {"meta.helm.sh/release-name": "other", "meta.helm.sh/release-namespace": "ops"},
        {"meta.helm.sh/release-name": RELEASE, "meta.helm.sh/release-namespace": "elsewhere"},
    ],
    ids=["no-helm-owner", "another-release", "same-name-other-namespace"],
)
async def test_auto_leaves_out_a_peering_crd_someone_else_owns(
    cluster: EmulatedCluster, annotations: dict[str, str] | None
) -> None:
    await cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(foreign_crd(annotations)))
    names = await helm_install(cluster, "auto")
    assert {"gpupools.shardmeter.io", "trainingplans.shardmeter.io"} <= names
    assert PEERING not in names
    # the lookup really read the cluster: deleting the CRD brings it back into the render
    await cluster.kubectl("delete", "crd", PEERING)
    assert PEERING in await helm_install(cluster, "auto")


async def test_true_renders_it_over_a_foreign_owner_and_helm_refuses(
    cluster: EmulatedCluster,
) -> None:
    await cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(foreign_crd()))
    with pytest.raises(helm.HelmError, match="invalid ownership metadata"):
        await helm_install(cluster, True, dry_run=None)
    stored = await cluster.kubectl("get", "crd", PEERING, "-o", "yaml")
    assert "meta.helm.sh/release-name" not in stored.stdout  # not taken over


async def test_auto_keeps_the_peering_crd_it_installed_on_upgrade(
    cluster: EmulatedCluster,
) -> None:
    h = Helm(cluster)
    try:
        assert PEERING in await h.crds("auto", dry_run=None)  # a real install
        got = await cluster.kubectl("get", "crd", PEERING, "-o", "yaml")
        stored = yaml.safe_load(got.stdout)
        assert stored["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
        assert PEERING in await h.crds("auto", upgrade=True)
        assert PEERING not in await h.crds(False, upgrade=True)
    finally:
        h.close()
