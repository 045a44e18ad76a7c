"""Shared fixtures. ``tests/`` is on sys.path (``pythonpath`` in pyproject.toml), so the test
support imports as ``support.*``, ``launch_local.*``, ``operator_support``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]

settings.register_profile(
    "default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("default")


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op torch thread for the test (the bench's CPU setting), restored after;
    modules that time or profile torch use it with ``pytestmark``."""
    import torch  # here, not at the top: most test modules never import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``make test`` runs pytest-xdist with ``--dist loadgroup``: a test marked ``xdist_group``
    runs in its group's worker (tests/kube/ is one group: one real control plane); every other
    test file is a group of its own, so its tests stay in one worker, in order."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.relative_to(REPO).as_posix()))
