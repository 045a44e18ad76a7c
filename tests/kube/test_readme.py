"""The README's cluster quickstart against the real control plane: its ``helm install`` line
rendered with its own ``--set`` values and applied (the chart's ServiceAccount, RBAC, CRDs,
Deployment), the operator run with that ServiceAccount's token — the pod the Deployment would
start, no kubelet here — and every ``kubectl`` line of the block run as written, with the
real kubectl, in the namespace the examples name."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from kube_support import REPO, Kube, install_chart, operator_kubeconfig, real_operator
from operator_support import OPERATOR_NS

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]
PLAN, NS = "llama-8b-case-study", "default"


def quickstart() -> list[list[str]]:
    """The commands of the README's "On a cluster" block (continuation lines joined)."""
    text = (REPO / "README.md").read_text()
    section = text.split("## On a cluster", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the README has no cluster quickstart block"
    joined = block.group(1).replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def helm_values(command: list[str]) -> tuple[str, dict[str, Any]]:
    """(release, values) of the ``helm install`` line: its ``--set a.b=c`` as a values tree."""
    values: dict[str, Any] = {}
    for i, arg in enumerate(command):
        if arg == "--set":
            key, _, value = command[i + 1].partition("=")
            node = values
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    assert command[command.index("-n") + 1] == OPERATOR_NS
    return command[2], values


async def test_the_quickstart_plans_and_launches_as_written(kube: Kube, tmp_path: Path) -> None:
    commands = quickstart()
    (helm,) = [c for c in commands if c[0] == "helm"]
    release, values = helm_values(helm)
    docs = await install_chart(kube, values, release, tmp_path)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("REGISTRY/shardmeter-operator:")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    kubeconfig = operator_kubeconfig(kube, account, tmp_path)
    kube.created += [("gpupools", None, "cluster-a"), ("gpupools", None, "cluster-b")]
    kube.created.append(("trainingplans", NS, PLAN))
    outputs = []
    async with real_operator(kube, kubeconfig=kubeconfig):
        for command in (c for c in commands if c[0] == "kubectl"):
            args = [str(REPO / a) if a.startswith("examples/") else a for a in command[1:]]
            outputs.append((await kube.kubectl(*args)).stdout)
            if command[1] == "apply" and "examples/trainingplan.yaml" in command:
                await kube.wait_for(
                    lambda: _phase(kube) == "Planned", 120, "the plan was never Planned"
                )
            if command[1] == "patch":
                await kube.wait_for(lambda: _phase(kube) == "Launched", 120, "never Launched")
    islands = (kube.get("trainingplans", NS, PLAN) or {})["status"]["islands"]
    names = [i["name"] for i in islands]
    assert names and all(n in outputs[-1] for n in names), outputs[-1]
    assert "tokensPerSecond" in "".join(outputs)
    # the launched islands are real Jobs the Job controller picked up (pods, Pending: no node)
    jobs = {j["metadata"]["name"] for j in kube.list("jobs", NS)}
    assert set(names) <= jobs
    await kube.wait_for(lambda: kube.job_pods(NS, names[0]), 60, "no pod for the first island")


def _phase(kube: Kube) -> str:
    return str(((kube.get("trainingplans", NS, PLAN) or {}).get("status") or {}).get("phase"))
