"""The cluster quickstarts as the docs write them: the ``sh`` blocks of the README's "On a
cluster" and docs/install.md's "Step by step", their ``helm install`` values checked against the
chart, and what the launch docs say the example plans (tests/deploy/test_readme.py checks them
statically, tests/kube/test_readme.py runs them against the real control plane)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
INSTALL = REPO / "docs" / "install.md"
PLAN = "llama-8b-case-study"
"""The example TrainingPlan (examples/trainingplan.yaml), in ``default``."""


def block(path: Path, heading: str) -> list[str]:
    """The commands of the first ``sh`` block after ``heading`` (continuation lines joined,
    comment lines dropped)."""
    section = path.read_text().split(heading, 1)[1]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found is not None, f"{path.name} has no sh block after {heading!r}"
    joined = found.group(1).replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def quickstart() -> list[list[str]]:
    """The commands of the README's "On a cluster" block, split as the shell would."""
    return [shlex.split(c, comments=True) for c in block(README, "## On a cluster")]


def install_steps() -> list[str]:
    """docs/install.md's "Step by step" block, a shell line each."""
    return block(INSTALL, "## Step by step")


def helm_values(command: list[str]) -> tuple[str, dict[str, Any]]:
    """(release, values) of a ``helm install`` line: its ``--set a.b=c`` as a values tree;
    each key must be a value of the chart's values.yaml."""
    assert command[1] == "install"
    chart_values = yaml.safe_load((REPO / command[3] / "values.yaml").read_text())
    values: dict[str, Any] = {}
    for i, arg in enumerate(command):
        if arg != "--set":
            continue
        key, _, value = command[i + 1].partition("=")
        assert value, f"--set {key}: no value"
        node, known = values, chart_values
        *parents, leaf = key.split(".")
        for part in key.split("."):
            assert isinstance(known, dict) and part in known, f"--set {key}: no such chart value"
            known = known[part]
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return command[2], values


def check_the_launch_docs(status: dict[str, Any], planned_message: str) -> None:
    """docs/launch-local.md names the plan the example plans and launches, and the best plan
    with the pool it leaves out; the Planned condition says which pool is not used."""
    text = (REPO / "docs" / "launch-local.md").read_text()
    assert f"plans **{status['plan']}**" in text, status["plan"]
    (unused,) = status["unusedPools"]
    assert unused["pool"] == "cluster-b" and f"`{unused['pool']}` is left out" in text
    assert f"**{unused['bestPlan']}**" in text, unused["bestPlan"]
    assert "not used: cluster-b" in planned_message
