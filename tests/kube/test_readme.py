"""The cluster quickstarts against the real control plane: the README's "On a cluster" block
and docs/install.md's "Step by step", each ``helm install`` line rendered with its own ``--set``
values and applied (the chart's ServiceAccount, RBAC, CRDs, Deployment), the operator run with
that ServiceAccount's token — the pod the Deployment would start, no kubelet here — and every
``kubectl`` line run as written, with the real kubectl, in the namespace the examples name; what
the launch docs say the example plans and launches is what it plans and launches."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kube_support import REPO, Kube, install_chart, operator_kubeconfig, real_operator
from operator_support import OPERATOR_NS, condition
from support.cluster import KUBECTL
from support.quickstart import PLAN, check_the_launch_docs, helm_values, install_steps, quickstart

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]
NS = "default"
REGISTRY = "registry.example.com/ml"


async def test_the_quickstart_plans_and_launches_as_written(kube: Kube, tmp_path: Path) -> None:
    commands = quickstart()
    (helm,) = [c for c in commands if c[0] == "helm"]
    async with _chart_and_operator(kube, helm, tmp_path) as container:
        assert container["image"].startswith("REGISTRY/shardmeter-operator:")
        outputs = []
        for command in (c for c in commands if c[0] == "kubectl"):
            args = [str(REPO / a) if a.startswith("examples/") else a for a in command[1:]]
            outputs.append((await kube.kubectl(*args)).stdout)
            if command[1] == "apply" and "examples/trainingplan.yaml" in command:
                await _phase(kube, "Planned")
            if command[1] == "patch":
                await _phase(kube, "Launched")
    status = _status(kube)
    names = [i["name"] for i in status["islands"]]
    assert names and all(n in outputs[-1] for n in names), outputs[-1]
    text = "".join(outputs)
    assert "tokensPerSecond" in text and "cluster-b: the best plan with it, " in text
    check_the_launch_docs(status, condition(status, "Planned")["message"])
    # the launched islands are real Jobs the Job controller picked up (pods, Pending: no node)
    jobs = {j["metadata"]["name"] for j in kube.list("jobs", NS)}
    assert set(names) <= jobs
    await kube.wait_for(lambda: kube.job_pods(NS, names[0]), 60, "no pod for the first island")


async def test_the_install_guide_plans_launches_and_relaunches_as_written(
    kube: Kube, tmp_path: Path
) -> None:
    """docs/install.md's block in bash, line by line with its variables, kubectl on the PATH
    and the user's (admin) kubeconfig; ``docker`` and ``kubectl logs`` are left out (no images
    are built and no pods run here)."""
    lines = install_steps()
    assignments = [  # the block's variables, but the one its log line reads from the plan
        line.split("#")[0].strip()
        for line in lines
        if re.match(r"^\w+=", line) and "kubectl" not in line
    ]
    (helm,) = [line for line in lines if line.startswith("helm ")]
    commands = [line for line in lines if "kubectl " in line and "kubectl logs" not in line]
    assert len(commands) >= 8
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(KUBECTL)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "KUBECONFIG": str(kube.kubeconfig_path),
    }
    outputs = []
    helm_line = shlex.split(helm.replace("$REGISTRY", REGISTRY))
    async with _chart_and_operator(kube, helm_line, tmp_path) as container:
        assert container["image"].startswith(f"{REGISTRY}/shardmeter-operator:")
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
                await _phase(kube, "Planned")
            elif '"launch":true' in command:
                await _phase(kube, "Launched")
            elif '"relaunch":1' in command:
                await kube.wait_for(
                    lambda: (
                        _status(kube).get("phase") == "Launched"
                        and (_status(kube).get("launch") or {}).get("relaunch", 0) == 1
                    ),
                    120,
                    "the plan was never relaunched",
                )
    status = _status(kube)
    text = "".join(outputs)
    assert f"{status['plan']}\n" in text  # the plan the block prints …
    check_the_launch_docs(status, condition(status, "Planned")["message"])  # … the docs name
    assert "cluster-b: the best plan with it, " in text
    # the example's trainer runs the image the block built, not the placeholder
    jobs = kube.list("jobs", NS)
    images = {c["image"] for j in jobs for c in j["spec"]["template"]["spec"]["containers"]}
    assert jobs and images == {f"{REGISTRY}/shardmeter-bench:0.1.0"}, images
    first = status["islands"][0]["name"]  # a Job of the JobSet the plane's JobSet CRD selects
    assert f"{PLAN}-lighthouse" in text and f"job.batch/{first} " in text, text


@contextlib.asynccontextmanager
async def _chart_and_operator(
    kube: Kube, helm: list[str], tmp_path: Path
) -> AsyncIterator[dict[str, Any]]:
    """The chart installed from a ``helm install`` line's values (its namespace the
    operator's) and the operator run with the chart's ServiceAccount token; yields the
    Deployment's container. The examples' pools and plan are deleted at the test's end."""
    assert helm[helm.index("-n") + 1] == OPERATOR_NS
    release, values = helm_values(helm)
    docs = await install_chart(kube, values, release, tmp_path)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    kubeconfig = operator_kubeconfig(kube, account, tmp_path)
    kube.created += [("gpupools", None, "cluster-a"), ("gpupools", None, "cluster-b")]
    kube.created.append(("trainingplans", NS, PLAN))
    async with real_operator(kube, kubeconfig=kubeconfig):
        yield container


async def _phase(kube: Kube, phase: str) -> None:
    await kube.wait_for(lambda: _status(kube).get("phase") == phase, 120, f"never {phase}")


def _status(kube: Kube) -> dict[str, Any]:
    return dict((kube.get("trainingplans", NS, PLAN) or {}).get("status") or {})
