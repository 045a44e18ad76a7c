"""Shared fixtures. ``tests/`` is on sys.path (pytest rootdir conftest), so test-support
modules import as ``support.*``."""

from __future__ import annotations

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
