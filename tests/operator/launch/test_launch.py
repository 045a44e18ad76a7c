"""The operator launching on torchtitan-FT, against the emulated API server: a plan it cannot
express and a template that cannot carry the flags are Valid=False naming the field with
nothing created; fixing the spec launches the lighthouse and the islands."""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path
from typing import Any

import pytest

from operator_support import apply, condition, manifest, operator_cluster, status_of, variant

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
POOL_A, POOL_B = manifest("gpupool-cluster-a.yaml"), manifest("gpupool-cluster-b.yaml")
PLAN = manifest("trainingplan.yaml")
NAME = "llama-8b-case-study"


def invalid(s: dict) -> bool:
    return s.get("phase") == "Invalid"


async def test_unexpressible_plan_and_bad_template_create_nothing(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path) as cluster:
        # the paper's weighted case study over both pools: islands of unequal local batch,
        # which torchft's unweighted pseudo-gradient average cannot express
        await apply(cluster, POOL_A, POOL_B, variant(PLAN, launch=True, runtime="weighted"))
        status = await status_of(cluster, "trainingplans", "default", NAME, invalid)
        valid = condition(status, "Valid")
        assert valid["status"] == "False" and valid["reason"] == "RuntimeCannotExpress"
        assert valid["message"].startswith("spec.runtime: is weighted")
        assert len({i["localBatchTokens"] for i in status["islands"]}) == 2
        assert condition(status, "Launched")["status"] == "False"
        assert condition(status, "Planned")["status"] == "True" and status["islands"]
        assert (
            cluster.list("jobs", "default") == [] and cluster.list("deployments", "default") == []
        )
        assert cluster.list("services", "default") == []

        # a trainer without a command line cannot take torchtitan's flags
        template = copy.deepcopy(PLAN["spec"]["template"])
        del template["spec"]["template"]["spec"]["containers"][0]["command"]
        await apply(
            cluster, variant(PLAN, launch=True, pools=[{"name": "cluster-a"}], template=template)
        )
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            NAME,
            lambda s: invalid(s) and condition(s, "Valid")["reason"] == "InvalidTemplate",
        )
        assert condition(status, "Valid")["message"].startswith(
            "spec.template.spec.template.spec.containers[0].command: is empty"
        )
        assert (
            cluster.list("jobs", "default") == [] and cluster.list("deployments", "default") == []
        )

        # fixed: the lighthouse, then the islands, every island pointing at it
        await apply(cluster, variant(PLAN, launch=True, pools=[{"name": "cluster-a"}]))
        status = await status_of(
            cluster, "trainingplans", "default", NAME, lambda s: s.get("phase") == "Launched"
        )
        assert condition(status, "Valid")["status"] == "True"
        (deploy,) = cluster.list("deployments", "default")
        assert deploy["metadata"]["name"] == f"{NAME}-lighthouse"
        args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--min_replicas={status['islandCount']}" in args
        jobs = cluster.list("jobs", "default")
        assert len(jobs) == status["islandCount"]
        for job in jobs:
            env = {
                e["name"]: e.get("value")
                for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
            }
            assert env["TORCHFT_LIGHTHOUSE"] == f"http://{NAME}-lighthouse.default.svc:29510"

        # the operator's Event says so too; end once the operator is idle (a request still in
        # flight when kopf stops leaves an unclosed aiohttp connector behind)
        def launched_event() -> bool:
            return any(e.get("reason") == "Launched" for e in cluster.list("events", "default"))

        await cluster.wait_for(launched_event, timeout=10)
        await settled(cluster)


async def settled(cluster: Any, quiet_s: float = 1.0, timeout_s: float = 15.0) -> None:
    """Wait until the API server has seen no request for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    seen, since = cluster.count(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "the operator kept calling the API"
        await asyncio.sleep(0.1)
        if cluster.count() != seen:
            seen, since = cluster.count(), time.monotonic()
