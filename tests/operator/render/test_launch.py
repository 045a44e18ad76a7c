"""What a launched plan renders (pure builders, no cluster, no torch): the torchft lighthouse,
each island's torchtitan flags and torchft environment, and the refusals (naming the field)
of templates and plans torchtitan's fault-tolerant trainer cannot run as planned."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardmeter.errors import SpecError
from shardmeter_operator.api import GPUPoolSpec, TrainingPlanSpec, TrainingPlanStatus
from shardmeter_operator.render.island import island_job_name, validate_template
from shardmeter_operator.render.launch import launch_manifests
from shardmeter_operator.render.lighthouse import PORT, lighthouse_address
from shardmeter_operator.render.torchtitan import ARGS_ENV, MANAGER_PORT, trainer_command

REPO = Path(__file__).resolve().parents[3]

POOL = GPUPoolSpec.model_validate(
    yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())["spec"]
)
EXAMPLE = yaml.safe_load((REPO / "examples" / "trainingplan.yaml").read_text())["spec"]


def island(i: int, *, micro: int = 2, accumulation: int = 2, nodes: int = 1) -> dict[str, Any]:
    return {
        "name": island_job_name("p", i),
        "pool": "cluster-a",
        "nodes": nodes,
        "gpusPerNode": 8,
        "microBatch": micro,
        "accumulation": accumulation,
        "localBatchTokens": micro * accumulation * nodes * 8 * 8192,
        "stepSeconds": 3.0,
    }


def status(
    *islands: dict[str, Any], sync: int = 10, fragments: int = 2, fragment_sync_delay: int = 1
) -> Any:
    return {
        "plan": "test",
        "islands": list(islands),
        "streamingDiLoCo": {
            "syncEvery": sync,
            "fragments": fragments,
            "fragmentSyncDelay": fragment_sync_delay,
        },
        "predictions": {
            "stepSeconds": 3.0,
            "tokensPerSecond": 1.0,
            "hours": 1.0,
            "costUsd": 1.0,
            "mfu": 0.4,
            "bottleneck": "compute-bound",
            "outerStepBlockingSeconds": 0.0,
        },
    }


def spec(**changes: Any) -> TrainingPlanSpec:
    doc = copy.deepcopy(EXAMPLE)
    doc["launch"] = True
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return TrainingPlanSpec.model_validate(doc)


def render(s: TrainingPlanSpec, st: Any) -> list[dict[str, Any]]:
    return launch_manifests(
        "p",
        "ns",
        "uid",
        s,
        TrainingPlanStatus.model_validate(st),
        {"cluster-a": POOL},
        plan_json="{}",
        revision="r1",
        bench_image="bench:1",
    )


def trainer(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["template"]["spec"]["containers"][0])


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_lighthouse_first_then_islands_with_torchft_env_and_flags() -> None:
    s = spec(training={"totalTokens": 10**9})
    st = status(island(0), island(1, micro=4, accumulation=1), island(2, nodes=2, accumulation=1))
    out = render(s, st)
    assert [(m["kind"], m["metadata"]["name"]) for m in out[:2]] == [
        ("Deployment", "p-lighthouse"),
        ("Service", "p-lighthouse"),
    ]
    deploy, svc = out[0], out[1]
    lh = deploy["spec"]["template"]["spec"]["containers"][0]
    assert lh["command"] == ["torchft_lighthouse"] and lh["image"] == "bench:1"
    assert lh["args"] == [
        f"--bind=[::]:{PORT}",
        "--min_replicas=3",
        "--join_timeout_ms=60000",
        "--quorum_tick_ms=100",
        "--heartbeat_timeout_ms=5000",
    ]
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["port"] == PORT
    assert all(m["metadata"]["ownerReferences"][0]["uid"] == "uid" for m in out)
    jobs = [m for m in out if m["kind"] == "Job"]
    assert len(jobs) == 3
    total_batch = sum(i["localBatchTokens"] for i in st["islands"])
    for i, job in enumerate(jobs):
        c = trainer(job)
        e = env(c)
        assert (
            e["TORCHFT_LIGHTHOUSE"]
            == lighthouse_address("p", "ns")
            == "http://p-lighthouse.ns.svc:29510"
        )
        assert e["TORCHFT_MANAGER_PORT"] == str(MANAGER_PORT) and e["JOB_ID"] == "ns/p"
        flags = c["command"][c["command"].index("torchtitan.train") + 1 :] + c.get("args", [])
        rendered = [
            f
            for f in flags
            if f.startswith(("--fault", "--training", "--parallelism", "--compile", "activation"))
        ]
        assert shlex.split(e[ARGS_ENV]) == rendered  # the same flags, for shell templates
        assert rendered[-1] == "activation-checkpoint:full"  # tyro: the subcommand goes last
        assert f"--fault_tolerance.replica_id={i}" in rendered
        assert "--fault_tolerance.group_size=3" in rendered
        isl = st["islands"][i]
        dp = isl["nodes"] * 8
        assert f"--training.local_batch_size={isl['microBatch']}" in rendered
        glob = isl["microBatch"] * dp * isl["accumulation"] * 3
        assert f"--training.global_batch_size={glob}" in rendered
        steps = -(-(10**9) // total_batch)
        steps = -(-steps // 10) * 10  # whole outer steps of syncEvery = 10
        assert f"--training.steps={steps}" in rendered
        assert f"--parallelism.data_parallel_shard_degree={dp}" in rendered
        pod = job["spec"]["template"]["spec"]
        assert pod["dnsConfig"]["searches"] == [
            f"{island_job_name('p', k)}.ns.svc.cluster.local" for k in range(3)
        ]
    island_svc = next(
        m
        for m in out
        if m["kind"] == "Service" and m["metadata"]["name"] == jobs[0]["metadata"]["name"]
    )
    assert {"name": "torchft-manager", "port": MANAGER_PORT} in island_svc["spec"]["ports"]


def test_fsdp_plan_has_no_lighthouse_and_no_fault_tolerance() -> None:
    s = spec(
        strategy={
            "kind": "fsdp",
            "syncEvery": "auto",
            "fragments": "auto",
            "fragmentSyncDelay": "auto",
        }
    )
    st = status(island(0))
    st["streamingDiLoCo"] = None
    out = render(s, st)
    assert [m["kind"] for m in out] == ["Job", "Service"]
    e = env(trainer(out[0]))
    assert "TORCHFT_LIGHTHOUSE" not in e and "--fault_tolerance" not in e[ARGS_ENV]
    assert "--training.global_batch_size=32" in e[ARGS_ENV]  # 2 × 8 GPUs × 2
    assert "dnsConfig" not in out[0]["spec"]["template"]["spec"]


def test_a_one_island_diloco_plan_runs_torchfts_outer_step() -> None:
    """What the quality model prices a one-island DiLoCo plan as (DiLoCo with M = 1,
    `shardmeter.cost.quality_outer`) is what launches: torchft's DiLoCo (whose outer Nesterov
    step torchtitan builds for any group size) in a group of one, syncing every H steps."""
    out = render(spec(), status(island(0), sync=10, fragments=1, fragment_sync_delay=0))
    assert [m["kind"] for m in out][:2] == ["Deployment", "Service"]  # the lighthouse
    flags = shlex.split(env(trainer(next(m for m in out if m["kind"] == "Job")))[ARGS_ENV])
    for flag in (
        "--fault_tolerance.enable",
        "--fault_tolerance.semi_sync_method=diloco",
        "--fault_tolerance.group_size=1",
        "--fault_tolerance.min_replica_size=1",
        "--fault_tolerance.sync_steps=10",
    ):
        assert flag in flags, flag


def test_min_replicas_and_lighthouse_settings_come_from_the_spec() -> None:
    s = spec(
        faultTolerance={
            "minReplicas": 1,
            "joinTimeoutMs": 5000,
            "quorumTickMs": 50,
            "lighthouseImage": "lh:2",
        }
    )
    out = render(s, status(island(0), island(1)))
    lh = out[0]["spec"]["template"]["spec"]["containers"][0]
    assert "--min_replicas=1" in lh["args"] and "--join_timeout_ms=5000" in lh["args"]
    assert "--quorum_tick_ms=50" in lh["args"] and lh["image"] == "lh:2"
    assert "--fault_tolerance.min_replica_size=1" in env(trainer(out[2]))[ARGS_ENV]


def test_a_shell_template_gets_the_flags_through_the_environment() -> None:
    script = (
        "torchrun --nnodes=$NNODES --nproc-per-node=$NPROC_PER_NODE -m torchtitan.train "
        "--module=shardmeter_torchtitan --config=llama3_8b_torchft $SHARDMETER_TORCHTITAN_ARGS"
    )
    template = copy.deepcopy(EXAMPLE["template"])
    template["spec"]["template"]["spec"]["containers"][0]["command"] = ["/bin/sh", "-c"]
    template["spec"]["template"]["spec"]["containers"][0]["args"] = [script]
    out = render(spec(template=template), status(island(0), island(1)))
    c = trainer(out[2])
    assert c["args"] == [script]  # unchanged: sh expands $SHARDMETER_TORCHTITAN_ARGS
    assert "--fault_tolerance.replica_id=0" in env(c)[ARGS_ENV]
    assert trainer_command(template).shell


def containers(**container: Any) -> dict[str, Any]:
    return {
        "spec": {"template": {"spec": {"containers": [{"name": "t", "image": "i", **container}]}}}
    }


TRAINER = ["torchrun", "-m", "torchtitan.train", "--module=m", "--config=c"]
C0 = "spec.template.spec.template.spec.containers[0]"


@pytest.mark.parametrize(
    ("template", "field", "words"),
    [
        (containers(), f"{C0}.command", "is empty"),
        (
            containers(command=["sh", "-c", "torchrun -m torchtitan.train --module m --config c"]),
            f"{C0}.command[2]",
            "must end with $SHARDMETER_TORCHTITAN_ARGS",
        ),
        (
            containers(command=["bash", "-c"], args=["torchrun 'unclosed"]),
            f"{C0}.args[0]",
            "not a valid shell",
        ),
        (
            containers(command=["torchrun", "-m", "torchtitan.train", "--job.config_file=x.toml"]),
            f"{C0}.args",
            "--job.config_file",
        ),
        (
            containers(command=["torchrun", "-m", "torchtitan.train", "--config", "c"]),
            f"{C0}.args",
            "has no --module",
        ),
        (
            containers(
                command=TRAINER,
                args=["--training.local-batch-size=4", "--fault_tolerance.replica_id=1"],
            ),
            f"{C0}.args",
            "--fault_tolerance.replica_id, --training.local_batch_size",
        ),
        (
            containers(command=[*TRAINER, "activation-checkpoint:selective"]),
            f"{C0}.args",
            "activation-checkpoint:selective",
        ),
    ],
)
def test_templates_that_cannot_carry_the_flags_name_the_field(
    template: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as err:
        validate_template(template)
    assert err.value.field == field and words in err.value.message


@pytest.mark.parametrize(
    ("changes", "islands", "field"),
    [
        ({}, [island(0), island(1, micro=4)], "status.islands[1].localBatchTokens"),
        (
            {"faultTolerance": {"minReplicas": 3}},
            [island(0), island(1)],
            "spec.faultTolerance.minReplicas",
        ),
        (
            {"strategy": {"fragmentLayout": "strided"}},
            [island(0), island(1)],
            "spec.strategy.fragmentLayout",
        ),
        (
            {"strategy": {"outerPrecision": "bf16"}},
            [island(0), island(1)],
            "spec.strategy.outerPrecision",
        ),
        (
            {"training": {"gradReduceBytes": 2}},
            [island(0), island(1)],
            "spec.training.gradReduceBytes",
        ),
        ({"training": {"precision": "fp8"}}, [island(0), island(1)], "spec.training.precision"),
        (
            {"training": {"paramAllGather": "fp32"}},
            [island(0), island(1)],
            "spec.training.paramAllGather",
        ),
        (
            {"training": {"activationCheckpointing": "selective-layer"}},
            [island(0), island(1)],
            "spec.training.activationCheckpointing",
        ),
        (
            {"training": {"attentionKernel": "flash2"}},
            [island(0), island(1)],
            "spec.training.attentionKernel",
        ),
        (
            {"training": {"gradientSync": "last-micro-batch"}},
            [island(0), island(1)],
            "spec.training.gradientSync",
        ),
    ],
)
def test_plans_the_runtime_cannot_express_name_the_field(
    changes: dict[str, Any], islands: list[dict[str, Any]], field: str
) -> None:
    with pytest.raises(SpecError) as err:
        render(spec(**changes), status(*islands))
    assert err.value.field == field


def test_equal_local_batches_from_different_shapes_are_fine() -> None:
    # 1 node × micro 4 × 1 and 2 nodes × micro 2 × 1: the same tokens per island
    out = render(
        spec(),
        status(island(0, micro=4, accumulation=1), island(1, micro=2, accumulation=1, nodes=2)),
    )
    assert len([m for m in out if m["kind"] == "Job"]) == 2


def test_too_many_islands_for_a_pods_dns_search_list() -> None:
    many = [island(i) for i in range(30)]
    with pytest.raises(SpecError) as err:
        render(spec(constraints={"maxIslands": 30}), status(*many))
    assert err.value.field == "spec.constraints.maxIslands"


def test_hsdp_compile_and_selective_op_have_their_flags() -> None:
    s = spec(
        training={
            "sharding": "hsdp",
            "shardGroupNodes": 1,
            "torchCompile": True,
            "activationCheckpointing": "selective-op",
        }
    )
    out = render(s, status(island(0, nodes=2, accumulation=1), island(1, nodes=2, accumulation=1)))
    flags = shlex.split(env(trainer(out[2]))[ARGS_ENV])
    assert "--parallelism.data_parallel_shard_degree=8" in flags  # one node's 8 GPUs
    assert "--parallelism.data_parallel_replicate_degree=2" in flags  # across its 2 nodes
    assert "--compile.enable" in flags and flags[-1] == "activation-checkpoint:selective"


def test_hsdp_renders_whole_shard_groups_and_refuses_the_rest() -> None:
    """A 4-node island in 2-node groups: shard over 16 GPUs, replicate twice. A 3-node island
    would render shard 16 × replicate 1 (16 of its 24 GPUs; a 1-node island replicate 0),
    which torchtitan cannot run: refused, naming the field."""
    s = spec(training={"sharding": "hsdp", "shardGroupNodes": 2})
    out = render(s, status(island(0, nodes=4, accumulation=1), island(1, nodes=4, accumulation=1)))
    flags = shlex.split(env(trainer(out[2]))[ARGS_ENV])
    assert "--parallelism.data_parallel_shard_degree=16" in flags
    assert "--parallelism.data_parallel_replicate_degree=2" in flags
    for nodes in (3, 1):
        with pytest.raises(SpecError) as err:
            render(s, status(*(island(i, nodes=nodes, accumulation=1) for i in range(2))))
        assert err.value.field == "spec.training.shardGroupNodes"
        assert f"the island's {nodes} node" in err.value.message
