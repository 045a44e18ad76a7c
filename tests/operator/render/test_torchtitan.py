"""The case study's island Jobs, rendered by the operator, parsed by torchtitan 0.3.0's own
``ConfigManager`` (``torchtitan.config.ConfigManager.parse_args``, i.e. tyro over the config
that ``--module``/``--config`` select): every flag must be accepted, and what torchtitan makes
of them must be the plan."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from launch_local import torchtitan_pythonpath
from launch_local.kubelet import local_pods, trainer_argv
from shardmeter.cost.model import CostModel
from shardmeter.errors import SpecError
from shardmeter.spec.training import AttentionKernel, TrainingSpec
from shardmeter_operator.api import (
    GPUPoolSpec,
    TrainingPlanSpec,
    TrainingPlanStatus,
    WorkloadKind,
)
from shardmeter_operator.api.errors import RuntimeCannotExpressError
from shardmeter_operator.launch.workload import launch_islands
from shardmeter_operator.render.launch import launch_manifests
from shardmeter_operator.render.lighthouse import lighthouse_name
from shardmeter_operator.render.torchtitan import ATTENTION_BACKEND, torchtitan_run
from shardmeter_operator.trainingplan.model import plan_outcome, plan_request
from shardmeter_operator.trainingplan.validate import apply_outcome

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
REPO = Path(__file__).resolve().parents[3]
EX = REPO / "examples"
POOLS = {
    n: GPUPoolSpec.model_validate(yaml.safe_load((EX / f"gpupool-{n}.yaml").read_text())["spec"])
    for n in ("cluster-a", "cluster-b")
}
SPEC = yaml.safe_load((EX / "trainingplan.yaml").read_text())["spec"]


@cache
def case_study(
    *pools: str, runtime: str = "torchtitan-ft", max_nodes: int | None = None
) -> tuple[TrainingPlanSpec, TrainingPlanStatus]:
    """The plan the operator makes (datasheet priors), as its status holds it; ``max_nodes``
    caps the first pool (so the planner mixes both pools' shapes)."""
    refs: list[dict[str, Any]] = [{"name": p} for p in pools]
    if max_nodes is not None:
        refs[0]["maxNodes"] = max_nodes
    spec = TrainingPlanSpec.model_validate(
        {**SPEC, "pools": refs, "launch": True, "runtime": runtime}
    )
    request = plan_request(spec, {p: POOLS[p] for p in pools})
    status = TrainingPlanStatus()
    apply_outcome(status, plan_outcome("case", request, dict.fromkeys(pools)))
    return spec, status


def render(
    spec: TrainingPlanSpec,
    st: TrainingPlanStatus,
    check: bool,
    workload: WorkloadKind = WorkloadKind.JOB,
) -> list[dict[str, Any]]:
    return launch_manifests(
        "case",
        "default",
        "u",
        spec,
        st,
        POOLS,
        plan_json="{}",
        revision="r",
        bench_image="b",
        check=check,
        workload=workload,
    )


def parse(argvs: list[list[str]]) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "launch_local.parse_args"],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        cwd=REPO / "tests",
        env={**os.environ, "PYTHONPATH": torchtitan_pythonpath()},
        timeout=200,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return list(json.loads(result.stdout.splitlines()[-1]))


def island_argvs(manifests: list[dict[str, Any]]) -> list[list[str]]:
    """The trainer's arguments in every island pod (a JobSet expanded as JobSet would)."""
    pods, _ = local_pods(manifests, "default")
    return [trainer_argv(p.argv) for p in pods if not p.name.startswith(lighthouse_name("case"))]


def check_island(
    parsed: dict[str, Any], i: int, spec: TrainingPlanSpec, st: dict[str, Any]
) -> None:
    assert "exit" not in parsed, parsed.get("output")
    isl, d, n = st["islands"][i], st["streamingDiLoCo"], len(st["islands"])
    assert parsed["config"] == "FaultTolerantTrainer.Config"
    assert parsed["model_spec"] == "FaultTolerantModelSpec" and parsed["flavor"] == "8B"
    assert parsed["fragment_fn"] == "fragment_llm"
    assert parsed["optimizer"] == "TorchFTOptimizersContainer.Config"
    assert parsed["checkpoint"] == "TorchFTCheckpointManager.Config"
    ft = parsed["fault_tolerance"]
    assert ft["enable"] and ft["semi_sync_method"] == "diloco" and ft["process_group"] == "nccl"
    assert (ft["replica_id"], ft["group_size"], ft["min_replica_size"]) == (i, n, n)
    assert (ft["sync_steps"], ft["num_fragments"], ft["fragment_sync_delay"]) == (
        d["syncEvery"],
        d["fragments"],
        d["fragmentSyncDelay"],
    )
    assert ft["process_group_timeout_ms"] >= 60_000
    assert ft["should_quantize"] is False  # fp32 pseudo-gradients
    t = parsed["training"]
    dp = isl["nodes"] * isl["gpusPerNode"]
    assert parsed["parallelism"] == {
        "data_parallel_shard_degree": dp,
        "data_parallel_replicate_degree": 1,
    }
    assert t["local_batch_size"] == isl["microBatch"] and t["seq_len"] == 8192
    # torchtitan's own arithmetic (experiments/torchft/trainer.py, manager.get_dp_info):
    # the data-parallel degree under FT is dp × group_size
    assert t["global_batch_size"] % (t["local_batch_size"] * dp * n) == 0
    assert t["global_batch_size"] // (t["local_batch_size"] * dp * n) == isl["accumulation"]
    assert t["local_batch_size"] * dp * isl["accumulation"] * 8192 == isl["localBatchTokens"]
    batch = sum(x["localBatchTokens"] for x in st["islands"])
    steps = math.ceil(spec.training.total_tokens / batch)
    assert t["steps"] >= steps and t["steps"] % d["syncEvery"] == 0
    assert t["steps"] - steps < d["syncEvery"]
    assert (t["dtype"], t["mixed_precision_param"]) == ("float32", "bfloat16")
    assert parsed["activation_checkpoint"] == "FullAC.Config"
    assert parsed["hf_assets_path"] == "/models/Llama-3.1-8B"  # the template's own flag kept


def test_every_case_study_island_parses_as_planned() -> None:
    # over both pools (the H200 pool capped at 4 nodes) the torchtitan-ft plan mixes island
    # shapes (1×8 H200, 2×8 A100) with equal local batches: launchable, every island's command
    # line parsed; the paper's weighted plan (unequal batches) is refused, naming spec.runtime;
    # the one-pool plan is rendered as it would be launched
    spec2, status2 = case_study("cluster-a", "cluster-b", max_nodes=4)
    spec1, status1 = case_study("cluster-a")
    st2, st1 = (s.model_dump(mode="json", by_alias=True) for s in (status2, status1))
    assert len({(i["nodes"], i["microBatch"], i["accumulation"]) for i in st2["islands"]}) == 2
    assert len({i["localBatchTokens"] for i in st2["islands"]}) == 1
    specw, statusw = case_study("cluster-a", "cluster-b", runtime="weighted")
    assert len({i.local_batch_tokens for i in statusw.islands}) == 2
    with pytest.raises(SpecError, match=r"^spec\.runtime: is weighted"):
        render(specw, statusw, check=True)
    argvs2 = island_argvs(render(spec2, status2, check=True))
    argvs1 = island_argvs(render(spec1, status1, check=True))
    # every pod of an island gets the same flags; one per island is enough to parse
    first_pods = [sum(i["nodes"] for i in st2["islands"][:k]) for k in range(len(st2["islands"]))]
    per_island2 = [argvs2[k] for k in first_pods]
    rejected = [*argvs1[0], "--fault_tolerance.no_such_flag=1"]  # the parser really checks
    training = {
        **spec1.training.model_dump(by_alias=True),
        "torchCompile": True,
        "activationCheckpointing": "selective-op",
    }
    tuned = TrainingPlanSpec.model_validate(
        {**spec1.model_dump(by_alias=True), "training": training}
    )
    (compiled,) = island_argvs(render(tuned, status1, check=True))[:1]
    strategy = {**spec1.strategy.model_dump(by_alias=True), "outerPrecision": "fp8"}
    fp8 = TrainingPlanSpec.model_validate({**spec1.model_dump(by_alias=True), "strategy": strategy})
    (quantized,) = island_argvs(render(fp8, status1, check=True))[:1]
    # the same plan as a JobSet: one replicated Job per run of same-shaped islands (the plan's
    # pools in order); each pod's replica id is JobSet's job-global-index
    jobset_status = status2.model_copy(
        update={"islands": launch_islands("case", status2.islands, WorkloadKind.JOBSET)}
    )
    (js,) = [
        m
        for m in render(spec2, jobset_status, check=False, workload=WorkloadKind.JOBSET)
        if m["kind"] == "JobSet"
    ]
    runs = [
        (k, len(list(g)))
        for k, g in itertools.groupby(
            (i["pool"], i["nodes"], i["gpusPerNode"]) for i in st2["islands"]
        )
    ]
    assert len(runs) == 2  # both pools are used, so the check below covers two replicated Jobs
    assert [(r["name"], r["replicas"]) for r in js["spec"]["replicatedJobs"]] == [
        (f"g{g}", n) for g, (_, n) in enumerate(runs)
    ]
    args = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "--fault_tolerance.replica_id=$(SHARDMETER_ISLAND_ID)" in args["containers"][0]["args"]
    argvs_js = island_argvs(render(spec2, jobset_status, check=False, workload=WorkloadKind.JOBSET))
    # expanded per pod from JobSet's annotations, every island's trainer gets exactly the
    # arguments its plain Job's pods get (and those parse as planned, below)
    assert argvs_js == argvs2  # every pod of every island
    parsed = parse([*per_island2, *argvs1, compiled, quantized, rejected])
    # outerPrecision fp8: torchft's row-wise FP8 all_reduce of the pseudo-gradients
    assert parsed[-2]["fault_tolerance"]["should_quantize"] is True
    del parsed[-2]
    assert (
        parsed[-2]["compile"] is True
        and parsed[-2]["activation_checkpoint"] == "SelectiveAC.Config"
    )
    assert parsed[-2]["training"] == parsed[len(per_island2)]["training"]
    for k in range(len(st2["islands"])):
        check_island(parsed[k], k, spec2, st2)
    for k in range(len(st1["islands"])):
        check_island(parsed[len(per_island2) + k], k, spec1, st1)
    assert parsed[-1]["exit"] == 2 and "no_such_flag" in parsed[-1]["output"]


_REGISTRY_PROBE = """
import inspect, json
from torchtitan.models.common.attention import FlexAttention
from torchtitan.models.common.config_utils import get_attention_config
from torchtitan.models.llama3 import model_registry as llama3
from torchtitan.experiments.torchft.llama3 import model_registry as torchft
from shardmeter_torchtitan.config_registry import ATTENTION_BACKEND, llama3_8b_torchft
try:
    get_attention_config("sdpa")
    sdpa = "accepted"
except ValueError:
    sdpa = "refused"
layers = llama3_8b_torchft().model_spec.model.layers
built = {type(layer.attention.inner_attention) for layer in layers}
print(json.dumps({
    "defaults": [inspect.signature(f).parameters["attn_backend"].default for f in (llama3, torchft)],
    "sdpa": sdpa,
    "ours": ATTENTION_BACKEND,
    "ours_builds_flex": type(get_attention_config(ATTENTION_BACKEND)) is FlexAttention.Config,
    "launched_is_flex": built == {FlexAttention.Config},
}))
"""


def test_a_launched_plan_is_priced_with_the_attention_kernel_torchtitan_builds() -> None:
    # torchtitan's own registry, not a copy of it: its Llama 3 model registries (the plain one
    # and the torchft experiment's) default to attn_backend "flex" and refuse "sdpa"; the config
    # the islands launch builds FlexAttention in every block; the renderer maps the planned
    # kernel to that backend, so a launched plan's attention is priced as FlexAttention
    result = subprocess.run(
        [sys.executable, "-c", _REGISTRY_PROBE],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": torchtitan_pythonpath()},
        timeout=200,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts == {
        "defaults": ["flex", "flex"],
        "sdpa": "refused",
        "ours": "flex",
        "ours_builds_flex": True,
        "launched_is_flex": True,
    }
    assert {facts["ours"]} == set(ATTENTION_BACKEND.values())
    spec, status = case_study("cluster-a", "cluster-b")
    planned = spec.training.attention_kernel
    assert ATTENTION_BACKEND[planned] == facts["ours"]  # planned = launched
    assert TrainingSpec.model_fields["attention_kernel"].default is planned
    request = plan_request(spec, POOLS)
    for pool in request.pools:  # the predictions use FlexAttention's rates on each GPU
        cm = CostModel(request.model, request.training, pool)
        gpu = pool.gpu
        assert cm.attention_speed == (gpu.flex_attention_speed, gpu.flex_attention_backward_speed)
    cudnn = spec.model_copy(
        update={
            "training": spec.training.model_copy(update={"attention_kernel": AttentionKernel.CUDNN})
        }
    )
    with pytest.raises(RuntimeCannotExpressError, match="FlexAttention"):
        torchtitan_run(cudnn, status.islands, status.streaming_di_lo_co, None)
