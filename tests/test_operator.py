"""The operator in-process against the emulated API server, with real kopf and kubectl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from operator_support import (
    OPERATOR_NS,
    apply,
    condition,
    manifest,
    operator_cluster,
    status_of,
    variant,
)
from shardmeter_operator import metrics

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

POOL_A, POOL_B = manifest("gpupool-cluster-a.yaml"), manifest("gpupool-cluster-b.yaml")
PLAN = manifest("trainingplan.yaml")


def planned(s: dict) -> bool:
    return s.get("phase") == "Planned"


async def test_plan_only_then_launch(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path) as cluster:
        await apply(cluster, POOL_A, POOL_B, PLAN)
        status = await status_of(
            cluster, "trainingplans", "default", "llama-8b-case-study", planned
        )
        assert status["plan"] and status["islandCount"] == len(status["islands"]) <= 10
        assert status["predictions"]["tokensPerSecond"] > 0 and status["predictions"]["bottleneck"]
        assert condition(status, "Valid")["status"] == "True"
        assert condition(status, "Planned")["status"] == "True"
        assert condition(status, "UsingPriorCoefficients")["status"] == "True"
        assert condition(status, "Launched")["reason"] == "PlanOnly"
        assert condition(status, "OuterStepBlocking")["status"] == "False"
        assert status["observedGeneration"] == 1
        assert cluster.list("jobs") == []
        # the pools: a ConfigMap of priors each, owned by the GPUPool
        pool = await status_of(
            cluster, "gpupools", None, "cluster-a", lambda s: s.get("source") == "prior"
        )
        cm = cluster.get("configmaps", OPERATOR_NS, "shardmeter-coefficients-cluster-a")
        assert cm is not None and json.loads(cm["data"]["coefficients.json"])["source"] == "prior"
        owner = cluster.get("gpupools", None, "cluster-a")
        assert cm["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        assert condition(pool, "CoefficientsReady")["reason"] == "DatasheetPriors"
        # kubectl shows the printer columns
        table = (await cluster.kubectl("get", "trainingplans")).stdout
        assert "Planned" in table and "True" in table
        # launch: the torchft lighthouse, then one Indexed Job + headless Service per island
        # (one pool: torchtitan-FT needs equal local batches, which the two pools' plan lacks)
        await apply(cluster, variant(PLAN, launch=True, pools=[{"name": "cluster-a"}]))
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            "llama-8b-case-study",
            lambda s: s.get("phase") == "Launched",
        )
        jobs = cluster.list("jobs", "default")
        assert sorted(j["metadata"]["name"] for j in jobs) == sorted(status["jobs"])
        assert (
            len(jobs) == status["islandCount"]
            and len(cluster.list("services", "default")) == len(jobs) + 1
        )
        assert [d["metadata"]["name"] for d in cluster.list("deployments", "default")] == [
            "llama-8b-case-study-lighthouse"
        ]
        islands = {i["name"]: i for i in status["islands"]}
        for job in jobs:
            island = islands[job["metadata"]["name"]]
            spec = job["spec"]
            assert spec["completionMode"] == "Indexed" and spec["completions"] == island["nodes"]
            pod = spec["template"]["spec"]
            pool = POOL_A if island["pool"] == "cluster-a" else POOL_B
            assert pod["nodeSelector"] == pool["spec"]["nodeSelector"]
            assert pod["tolerations"] == pool["spec"]["tolerations"]
            assert pod["subdomain"] == job["metadata"]["name"]
            trainer = pod["containers"][0]
            assert trainer["resources"]["limits"]["nvidia.com/gpu"] == str(island["gpusPerNode"])
            env = {e["name"]: e.get("value", e.get("valueFrom")) for e in trainer["env"]}
            assert env["NNODES"] == str(island["nodes"]) and env["NPROC_PER_NODE"] == str(
                island["gpusPerNode"]
            )
            assert env["MASTER_ADDR"].startswith(job["metadata"]["name"] + "-0.")
            assert env["NODE_RANK"]["fieldRef"]["fieldPath"].endswith("job-completion-index']")
            assert env["SHARDMETER_MICRO_BATCH"] == str(island["microBatch"])
            assert env["SHARDMETER_GRAD_ACCUM"] == str(island["accumulation"])
            s = status["streamingDiLoCo"]
            assert (
                f"--fault_tolerance.sync_steps={s['syncEvery']}"
                in env["SHARDMETER_TORCHTITAN_ARGS"]
            )
            assert json.loads(env["SHARDMETER_PLAN"])["plan"] == status["plan"]
            owner = cluster.get("trainingplans", "default", "llama-8b-case-study")
            assert job["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        created = cluster.count("POST", "jobs")
        await apply(
            cluster,
            variant(
                PLAN, launch=True, pools=[{"name": "cluster-a"}], objective={"kind": "min-cost"}
            ),
        )  # a spec change
        await status_of(
            cluster,
            "trainingplans",
            "default",
            "llama-8b-case-study",
            lambda s: s.get("observedGeneration") == 3,
        )
        assert cluster.count("POST", "jobs") == created  # running Jobs are never touched
        assert cluster.count("DELETE", "jobs") == 0 and cluster.count("PATCH", "jobs") == 0


async def test_bad_input_is_a_condition_and_recovers(tmp_path: Path) -> None:
    async with operator_cluster(tmp_path) as cluster:
        await apply(cluster, POOL_A)
        bad = variant(
            PLAN,
            pools=[{"name": "cluster-a"}],
            strategy={"kind": "streaming-diloco", "syncEvery": 10, "fragments": 3},
        )
        await apply(cluster, bad)
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            "llama-8b-case-study",
            lambda s: s.get("phase") == "Invalid",
        )
        valid = condition(status, "Valid")
        assert (
            valid["status"] == "False"
            and "syncEvery (10) must be a multiple of fragments (3)" in valid["message"]
        )
        # a pool that does not exist yet
        await apply(cluster, variant(PLAN, pools=[{"name": "cluster-a"}, {"name": "later"}]))
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            "llama-8b-case-study",
            lambda s: s.get("observedGeneration") == 2,
        )
        assert condition(status, "Valid")["reason"] == "PoolNotFound"
        assert "GPUPool 'later' not found" in condition(status, "Valid")["message"]
        later = variant(POOL_B)
        later["metadata"]["name"] = "later"
        await apply(cluster, later)  # recovers without restarting the operator
        await status_of(cluster, "trainingplans", "default", "llama-8b-case-study", planned)
        # infeasible: names the binding constraint
        big = variant(
            PLAN,
            pools=[{"name": "cluster-a"}],
            model="llama-3.1-70b",
            constraints={"maxIslands": 10, "maxGpusPerIsland": 2},
        )
        await apply(cluster, big)
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            "llama-8b-case-study",
            lambda s: s.get("phase") == "Infeasible",
        )
        assert "maxGpusPerIsland is 2" in condition(status, "Planned")["message"]
        assert metrics.plan_infeasible.labels("default", "llama-8b-case-study")._value.get() == 1
        # a broken template is refused before anything is created
        await apply(
            cluster,
            variant(
                PLAN,
                pools=[{"name": "cluster-a"}],
                launch=True,
                template={"spec": {"template": {"spec": {"containers": []}}}},
            ),
        )
        status = await status_of(
            cluster,
            "trainingplans",
            "default",
            "llama-8b-case-study",
            lambda s: s.get("phase") == "Invalid",
        )
        assert condition(status, "Valid")["reason"] == "InvalidTemplate"
        assert cluster.list("jobs", "default") == []
