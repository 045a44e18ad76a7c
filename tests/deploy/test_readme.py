"""The cluster quickstarts, as written: every ``kubectl`` line of the README's "On a cluster"
block and of docs/install.md's "Step by step" block run with the real kubectl against the
in-memory API server with the operator running (images, Helm and pods are not run there; the
``helm install`` lines' values are checked against the chart's values), and what the launch
docs say the example plans and launches is what it plans and launches."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from operator_support import REPO, condition, operator_cluster, status_of
from support.cluster import KUBECTL, EmulatedCluster

PLAN = "llama-8b-case-study"


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
    return [shlex.split(c, comments=True) for c in block(REPO / "README.md", "## On a cluster")]


def check_helm_values(command: list[str]) -> None:
    assert command[1:3] == ["install", "shardmeter"]
    assert Path(REPO / command[3]).is_dir()
    values = yaml.safe_load((REPO / command[3] / "values.yaml").read_text())
    for key, value in (a.split("=", 1) for a in command[command.index("--set") :] if "=" in a):
        node: Any = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"--set {key}: no such chart value"
            node = node[part]
        assert value


def test_the_quickstart_is_short_and_installs_the_chart() -> None:
    commands = quickstart()
    assert len(commands) <= 10
    helm = [c for c in commands if c[0] == "helm"]
    assert len(helm) == 1
    check_helm_values(helm[0])
    assert len((REPO / "README.md").read_text().splitlines()) <= 250


def test_the_install_guides_helm_line_sets_chart_values() -> None:
    (helm,) = [c for c in block(REPO / "docs" / "install.md", "## Step by step") if "helm" in c]
    check_helm_values(shlex.split(helm.replace("$REGISTRY", "registry.example.com/ml")))


async def planned(cluster: EmulatedCluster) -> dict[str, Any]:
    return await status_of(
        cluster, "trainingplans", "default", PLAN, lambda s: s.get("phase") == "Planned"
    )


async def launched(cluster: EmulatedCluster, relaunch: int = 0) -> dict[str, Any]:
    return await status_of(
        cluster,
        "trainingplans",
        "default",
        PLAN,
        lambda s: (
            s.get("phase") == "Launched" and (s.get("launch") or {}).get("relaunch", 0) == relaunch
        ),
    )


def check_the_launch_docs(status: dict[str, Any]) -> None:
    """docs/launch-local.md names the plan the example plans and launches, and the best plan
    with the pool it leaves out."""
    text = (REPO / "docs" / "launch-local.md").read_text()
    assert f"plans **{status['plan']}**" in text, status["plan"]
    (unused,) = status["unusedPools"]
    assert unused["pool"] == "cluster-b" and f"`{unused['pool']}` is left out" in text
    assert f"**{unused['bestPlan']}**" in text, unused["bestPlan"]
    assert "not used: cluster-b" in condition(status, "Planned")["message"]


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
                status = await planned(cluster)
            if command[1] == "patch":
                status = await launched(cluster)
        names = [i["name"] for i in status["islands"]]
        assert names and all(n in outputs[-1] for n in names), outputs[-1]
        assert "tokensPerSecond" in "".join(outputs)
        assert "cluster-b: the best plan with it, " in "".join(outputs)
        check_the_launch_docs(status)


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_the_install_guide_plans_launches_and_relaunches_as_written(
    tmp_path: Path,
) -> None:
    """docs/install.md's block in bash, line by line (its variables kept), with kubectl on
    the PATH pointed at the in-memory API server; ``kubectl logs`` is left out (no pods run)."""
    lines = block(REPO / "docs" / "install.md", "## Step by step")
    assignments = [line.split("#")[0].strip() for line in lines if re.match(r"^\w+=", line)]
    commands = [
        line for line in lines if "kubectl " in line and not line.startswith("kubectl logs")
    ]
    assert len(commands) >= 8
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(KUBECTL)
    async with operator_cluster(tmp_path) as cluster:
        env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "KUBECONFIG": str(cluster.kubeconfig_path),
        }
        outputs = []
        for command in commands:
            proc = await asyncio.create_subprocess_exec(
                "bash",
                "-euo",
                "pipefail",
                "-c",
                "\n".join([*assignments, command]),
                cwd=REPO,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, f"{command}\n{stderr.decode()}"
            outputs.append(stdout.decode())
            if "examples/trainingplan.yaml" in command:
                status = await planned(cluster)
            elif '"launch":true' in command:
                status = await launched(cluster)
            elif '"relaunch":1' in command:
                status = await launched(cluster, relaunch=1)
        text = "".join(outputs)
        assert f"{status['plan']}\n" in text  # the plan the block prints …
        check_the_launch_docs(status)  # … is the one the launch docs name
        assert "cluster-b: the best plan with it, " in text
        # the example's trainer runs the image the block built, not the placeholder
        jobs = cluster.list("jobs", "default")
        assert jobs and {
            c["image"] for j in jobs for c in j["spec"]["template"]["spec"]["containers"]
        } == {"registry.example.com/ml/shardmeter-bench:0.1.0"}
        assert f"{PLAN}-lighthouse" in text and f"{PLAN}-island-0" in text
