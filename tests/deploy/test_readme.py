"""The README's cluster quickstart, as written: every ``kubectl`` line of its "On a cluster"
block run with the real kubectl against the in-memory API server with the operator running,
and the ``helm install`` line's values checked against the chart's values."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from operator_support import REPO, operator_cluster, status_of


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


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_the_quickstart_plans_and_launches_as_written(tmp_path: Path) -> None:
    commands = [c for c in quickstart() if c[0] == "kubectl"]
    async with operator_cluster(tmp_path) as cluster:
        outputs = []
        for command in commands:
            result = await cluster.kubectl(*command[1:])
            outputs.append(result.stdout)
            if command[1] == "apply" and "examples/trainingplan.yaml" in command:
                await status_of(
                    cluster,
                    "trainingplans",
                    "default",
                    "llama-8b-case-study",
                    lambda s: s.get("phase") == "Planned",
                )
            if command[1] == "patch":
                launched = await status_of(
                    cluster,
                    "trainingplans",
                    "default",
                    "llama-8b-case-study",
                    lambda s: s.get("phase") == "Launched",
                )
        names = [i["name"] for i in launched["islands"]]
        assert names and all(n in outputs[-1] for n in names), outputs[-1]
        assert "tokensPerSecond" in "".join(outputs)
