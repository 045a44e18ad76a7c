"""The 2-island Streaming DiLoCo plan the launch tests run on this machine (2 fragments, delay
1; one node and one process per island), with the example's template turned into the CPU
stand-in for torchtitan's trainer."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from shardmeter_operator.api import TrainingPlanSpec, TrainingPlanStatus, WorkloadKind
from shardmeter_operator.launch.workload import launch_islands
from shardmeter_operator.render.island import island_job_name

REPO = Path(__file__).resolve().parents[2]
PLAN, NS = "e2e", "default"
SEQ, MICRO, ACCUM, ISLANDS = 64, 2, 2, 2
SYNC_EVERY, FRAGMENTS, DELAY, OUTER_STEPS = 4, 2, 1, 3
LOG_FREQ = 1


def cpu_template() -> dict[str, Any]:
    """The example's template, with the CPU stand-in for torchtitan's trainer and its
    fault-tolerant debug config (the 8B recipe cannot be built on this machine)."""
    doc = yaml.safe_load((REPO / "examples" / "trainingplan.yaml").read_text())
    template = copy.deepcopy(doc["spec"]["template"])
    trainer = template["spec"]["template"]["spec"]["containers"][0]
    swap = {
        "torchtitan.train": "launch_local.cpu_trainer",
        "--module=shardmeter_torchtitan": "--module=torchft.llama3",
        "--config=llama3_8b_torchft": "--config=llama3_torchft_debugmodel",
    }
    assert set(swap) <= set(trainer["command"]), "the example's trainer command changed"
    trainer["command"] = [swap.get(a, a) for a in trainer["command"]]
    trainer["command"].append(f"--metrics.log_freq={LOG_FREQ}")  # a metric line every step
    return dict(template)


def plan(
    workload: WorkloadKind = WorkloadKind.JOB,
) -> tuple[TrainingPlanSpec, TrainingPlanStatus]:
    """A 2-island plan as the planner writes it (checked against the status model), its
    islands named as the launch with ``workload`` names them."""
    spec = TrainingPlanSpec.model_validate(
        {
            "model": "smollm-360m",
            "training": {
                "seqLenTokens": SEQ,
                "globalBatchTokens": ISLANDS * MICRO * ACCUM * SEQ,
                "totalTokens": OUTER_STEPS * SYNC_EVERY * ISLANDS * MICRO * ACCUM * SEQ,
            },
            "strategy": {
                "kind": "streaming-diloco",
                "syncEvery": SYNC_EVERY,
                "fragments": FRAGMENTS,
                "fragmentSyncDelay": DELAY,
                "outerPrecision": "fp32",
            },
            "pools": [{"name": "cpu"}],
            "faultTolerance": {"processGroup": "gloo", "quorumTimeoutS": 60},
            "launch": True,
            "template": cpu_template(),
        }
    )
    islands = [
        {
            "name": island_job_name(PLAN, i),
            "pool": "cpu",
            "nodes": 1,
            "gpusPerNode": 1,
            "microBatch": MICRO,
            "accumulation": ACCUM,
            "localBatchTokens": MICRO * ACCUM * SEQ,
            "stepSeconds": 0.05,
        }
        for i in range(ISLANDS)
    ]
    status = TrainingPlanStatus.model_validate(
        {
            "phase": "Planned",
            "plan": "2×1×1 CPU",
            "islandCount": ISLANDS,
            "gpus": ISLANDS,
            "islands": islands,
            "streamingDiLoCo": {
                "syncEvery": SYNC_EVERY,
                "fragments": FRAGMENTS,
                "fragmentSyncDelay": DELAY,
            },
            "predictions": {
                "stepSeconds": 0.05,
                "tokensPerSecond": 10240.0,
                "hours": 0.0,
                "costUsd": 0.0,
                "mfu": 0.0,
                "bottleneck": "compute-bound",
                "outerStepBlockingSeconds": 0.0,
            },
        }
    )
    islands = launch_islands(PLAN, status.islands, workload)
    return spec, status.model_copy(update={"islands": islands})
