"""The islands' runtime is the one the tests run: the torchtitan the Makefile installs (and the
flag tests parse with) is the one the bench image installs, and so is torchft."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_torchtitan_pin_is_the_same_in_the_makefile_the_image_and_the_venv() -> None:
    make = re.search(r"^TORCHTITAN_VERSION := (\S+)$", (REPO / "Makefile").read_text(), re.M)
    docker = re.search(r"^ARG TORCHTITAN_VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert make and docker and make.group(1) == docker.group(1) == version("torchtitan") == "0.3.0"


def test_the_bench_image_extra_pins_the_installed_torchft() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert f"torchft=={version('torchft')}" in extras["bench"]
    assert version("torchft") == "0.2.0"
