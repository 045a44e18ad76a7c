"""Tests against real Kubernetes components (``support.realkube``): one control plane per
session with JobSet and Kueue, shared by every test here. They all run in one pytest-xdist
worker (tests/conftest.py's scheduler makes tests/kube/ one unit of ``--dist loadfile``), one
after the other, each in namespaces of its own, so one plane serves them all. A test's
cluster-scoped objects are deleted at its end."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube_support import Kube
from operator_support import OPERATOR_NS
from support.realkube import running_plane
from support.realkube.cluster import Plane, scoped_objects


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.kube)


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """etcd, kube-apiserver, kube-controller-manager, JobSet (RestartJob gate on) and Kueue."""
    with running_plane(
        tmp_path_factory.mktemp("kube"), jobset_feature_gates={"RestartJob": True}
    ) as started:
        started.admin.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NS}}
        )
        yield started


@pytest.fixture
def kube(plane: Plane, request: pytest.FixtureRequest) -> Iterator[Kube]:
    """A fresh namespace on the shared plane; everything the test applied is deleted after."""
    plane.check_running()
    base = request.node.name.split("[")[0].removeprefix("test_")[:40].rstrip("_-").replace("_", "-")
    ns = f"{base}-{secrets.token_hex(2)}"
    with contextlib.ExitStack() as stack:
        created = stack.enter_context(scoped_objects(plane.admin))
        cluster = Kube(plane, ns, created)
        stack.callback(cluster.close)
        cluster.namespace(ns)
        yield cluster
    plane.check_running()
