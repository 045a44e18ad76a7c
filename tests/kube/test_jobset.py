"""A plan launched as a JobSet under the real JobSet controller (v0.12, its alpha RestartJob
gate on): every island its own replicated Job with a ``RestartJob`` rule; when one island's
pod fails, the real controller recreates that island's Job alone and the others keep running."""

from __future__ import annotations

from typing import Any

import pytest

from kube_support import Kube, real_operator
from operator_support import condition, manifest, variant

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]
NAME = "llama-8b-case-study"


async def _status(kube: Kube, predicate: Any, timeout: float = 90) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def check() -> bool:
        s = (kube.get("trainingplans", kube.ns, NAME) or {}).get("status") or {}
        if s and predicate(s):
            found.update(s)
            return True
        return False

    await kube.wait_for(check, timeout, f"TrainingPlan {NAME}: {predicate}")
    return found


async def test_an_island_fails_and_restarts_alone_under_the_real_jobset_controller(
    kube: Kube,
) -> None:
    ns = kube.ns
    kube.apply(manifest("gpupool-cluster-a.yaml"))
    plan = variant(
        manifest("trainingplan.yaml"), launch=True, pools=[{"name": "cluster-a"}], maxRestarts=2
    )
    plan["metadata"]["namespace"] = ns
    async with real_operator(kube, namespaces=(ns,)):
        kube.apply(plan)
        s = await _status(kube, lambda s: s.get("phase") == "Launched")
        assert s["launch"]["workload"] == "JobSet" and s["launch"]["restart"] == "Island"
        assert "a failed island restarts alone" in condition(s, "Launched")["message"]
        (js,) = kube.list("jobsets", ns)
        n = s["islandCount"]
        assert [r["name"] for r in js["spec"]["replicatedJobs"]] == [f"i{k}" for k in range(n)]
        assert js["spec"]["failurePolicy"]["rules"] == [
            {"name": "restartTheIslandAlone", "action": "RestartJob"}
        ]
        names = [i["name"] for i in s["islands"]]

        def current() -> dict[str, str]:
            return {j["metadata"]["name"]: j["metadata"]["uid"] for j in kube.list("jobs", ns)}

        await kube.wait_for(lambda: set(current()) == set(names), 60)
        uids = current()
        for name in names:
            kube.set_job_running(ns, name)
        await _status(kube, lambda s: s.get("phase") == "Running")

        kube.set_job_failed(ns, names[0])
        s = await _status(kube, lambda s: (s.get("restarts") or 0) >= 1)
        # the real controller deletes the failed island's Job and creates it again
        await kube.wait_for(lambda: current().get(names[0]) not in (None, uids[names[0]]), 60)
        now = current()
        assert all(now[n_] == uids[n_] for n_ in names[1:])  # the others untouched
        assert s["phase"] != "Failed"
        js = kube.get("jobsets", ns, NAME)
        assert js is not None
        statuses = {r["name"]: r for r in js["status"].get("replicatedJobsStatus", [])}
        assert set(statuses) == {f"i{k}" for k in range(n)}
        assert js["status"].get("restarts", 0) == 0  # RestartJob does not restart the JobSet
