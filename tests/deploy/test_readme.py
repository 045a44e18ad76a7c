"""The README's cluster quickstart is short and its ``helm install`` line's values are the
chart's. Running the block as written — the chart installed, every ``kubectl`` line — is
tests/kube/test_readme.py's, against a real control plane."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from operator_support import REPO


def quickstart() -> list[list[str]]:
    """The commands of the README's "On a cluster" block (continuation lines joined)."""
    text = (REPO / "README.md").read_text()
    section = text.split("## On a cluster", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the README has no cluster quickstart block"
    joined = block.group(1).replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def test_the_quickstart_is_short_and_installs_the_chart() -> None:
    commands = quickstart()
    assert len(commands) <= 10
    helm = [c for c in commands if c[0] == "helm"]
    assert len(helm) == 1 and helm[0][1:3] == ["install", "shardmeter"]
    assert Path(REPO / helm[0][3]).is_dir()
    values = yaml.safe_load((REPO / helm[0][3] / "values.yaml").read_text())
    for key, value in (a.split("=", 1) for a in helm[0][helm[0].index("--set") :] if "=" in a):
        node: Any = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"--set {key}: no such chart value"
            node = node[part]
        assert value
    assert len((REPO / "README.md").read_text().splitlines()) <= 250
