"""Shared fixtures. ``tests/`` is on sys.path (``pythonpath`` in pyproject.toml), so the test
support imports as ``support.*``, ``launch_local.*``, ``operator_support``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


REAL_KUBE_TESTS = "tests/kube/"
"""Tests that share one real control plane per pytest process (tests/kube/conftest.py)."""


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown with -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs pytest-xdist with ``--dist loadfile`` (a file's tests stay in one
    worker, in order); tests/kube/ is one unit too, so one worker starts one real control plane
    for all of them. (``--dist loadgroup`` with ``xdist_group`` marks would say the same, but
    pytest-xdist 3.8 cannot rename pytest 9's node ids: the marks are silently ignored.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(REAL_KUBE_TESTS):
                return REAL_KUBE_TESTS
            return str(super()._split_scope(nodeid))

    return Scheduling(config, log)
