"""Black box: `python -m shardmeter_operator` and the emulated API server as subprocesses,
driven with the real kubectl exactly as a user would (strict client validation included)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from support.operator_process import REPO, operator_process

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]
EX = REPO / "examples"


def test_kubectl_apply_to_planned_and_launched(tmp_path: Path) -> None:
    with operator_process(tmp_path) as op:
        op.kubectl(
            "apply",
            "-f",
            str(EX / "gpupool-cluster-a.yaml"),
            "-f",
            str(EX / "gpupool-cluster-b.yaml"),
            "-f",
            str(EX / "trainingplan.yaml"),
        )
        op.kubectl(
            "wait",
            "--for=jsonpath={.status.phase}=Planned",
            "trainingplan/llama-8b-case-study",
            "--timeout=60s",
        )
        op.kubectl(
            "wait", "--for=condition=CoefficientsReady", "gpupool/cluster-a", "--timeout=30s"
        )
        plan = json.loads(
            op.kubectl("get", "trainingplan", "llama-8b-case-study", "-o", "json").stdout
        )
        assert plan["status"]["predictions"]["tokensPerSecond"] > 0
        table = op.kubectl("get", "trainingplans,gpupools").stdout
        assert "llama-8b-case-study" in table and "cluster-a" in table and "prior" in table
        # one pool: torchtitan-FT needs equal local batches, which the two pools' plan lacks
        patch = json.dumps({"spec": {"launch": True, "pools": [{"name": "cluster-a"}]}})
        op.kubectl("patch", "trainingplan", "llama-8b-case-study", "--type=merge", "-p", patch)
        op.kubectl(
            "wait",
            "--for=jsonpath={.status.phase}=Launched",
            "trainingplan/llama-8b-case-study",
            "--timeout=60s",
        )
        launched = json.loads(
            op.kubectl("get", "trainingplan", "llama-8b-case-study", "-o", "json").stdout
        )
        jobs = json.loads(op.kubectl("get", "jobs", "-o", "json").stdout)["items"]
        assert len(jobs) == launched["status"]["islandCount"]
        op.kubectl("get", "deployment", "llama-8b-case-study-lighthouse")
        text = op.fetch(op.metrics_url)
        assert (
            'shardmeter_plan_predicted_tokens_per_second{namespace="default",trainingplan="llama-8b-case-study"}'
            in text
        )
        assert (
            'shardmeter_plan_islands{namespace="default",state="pending",trainingplan="llama-8b-case-study"}'
            in text
        )
        assert 'shardmeter_pool_coefficients_age_seconds{gpupool="cluster-a"}' in text
        health = json.loads(op.fetch(op.liveness_url))
        assert {"plans", "reconciling", "oldest_reconcile_s"} <= set(health["reconciler"])
        assert op.operator.poll() is None  # never crashed
        lines = [line for line in op.log.read_text().splitlines() if line.strip()]
        assert all(line.startswith("{") for line in lines)  # JSON logs off a terminal
        sizes = [len(line.encode()) for line in lines]
        assert statistics.median(sizes) <= 300 and max(sizes) <= 2000, max(sizes)
        assert not any('"settings"' in line for line in lines)  # no kopf settings repr

        # uninstalled operator: deleting the plan (and its Jobs) does not hang on a finalizer
        op.operator.terminate()
        op.operator.wait(15)
        op.kubectl("delete", "-f", str(EX / "trainingplan.yaml"), "--timeout=10s")
        op.kubectl("delete", "gpupool", "cluster-a", "--timeout=10s")
        assert json.loads(op.kubectl("get", "jobs", "-o", "json").stdout)["items"] == []
