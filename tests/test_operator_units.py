"""Pure parts of the operator: manifest builders, conditions, planning glue, metrics."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from shardmeter.errors import SpecError
from shardmeter_operator import metrics
from shardmeter_operator.conditions import set_condition
from shardmeter_operator.manifests import (
    bench_job,
    dns_name,
    island_manifests,
    owner_reference,
    torchtitan_args,
    validate_template,
)
from shardmeter_operator.planning import plan_request, plan_status
from shardmeter_operator.resources import GPUPoolSpec, TrainingPlanSpec
from shardmeter_operator.trainingplan import PoolView, needs_work

REPO = Path(__file__).resolve().parents[1]
POOL = GPUPoolSpec.model_validate(
    yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())["spec"]
)
PLAN = yaml.safe_load((REPO / "examples" / "trainingplan.yaml").read_text())["spec"]
OWNER = owner_reference("TrainingPlan", "p", "uid-1")


def test_names_are_dns_labels_and_stable() -> None:
    long = dns_name("a" * 80, "island", 3)
    assert len(long) <= 63 and long == dns_name("a" * 80, "island", 3)
    assert dns_name("My_Plan", "island", 0) == "my-plan-island-0"


def test_conditions_keep_transition_time_until_status_flips() -> None:
    c = set_condition([], "Planned", True, "PlanFound", "ok", 1, now="t1")
    c = set_condition(c, "Planned", True, "PlanFound", "still ok", 2, now="t2")
    assert c == [
        {
            "type": "Planned",
            "status": "True",
            "reason": "PlanFound",
            "message": "still ok",
            "lastTransitionTime": "t1",
            "observedGeneration": 2,
        }
    ]
    c = set_condition(c, "Planned", False, "Infeasible", "no", 3, now="t3")
    assert c[0]["lastTransitionTime"] == "t3" and c[0]["status"] == "False"


def island(i: int, nodes: int = 2) -> dict[str, Any]:
    return {
        "name": f"p-island-{i}",
        "pool": "cluster-a",
        "nodes": nodes,
        "gpusPerNode": 8,
        "microBatch": 2,
        "accumulation": 3,
        "localBatchTokens": 2 * 3 * 16 * 8192,
        "stepSeconds": 3.2,
    }


def test_island_jobs_rewrite_the_template_without_mutating_it() -> None:
    template = copy.deepcopy(PLAN["template"])
    template["spec"]["template"]["spec"]["nodeSelector"] = {"team": "ml"}
    template["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "NNODES", "value": "99"},
        {"name": "KEEP", "value": "1"},
    ]
    before = copy.deepcopy(template)
    out = island_manifests(
        "p",
        "ns",
        OWNER,
        template,
        [island(0), island(1, nodes=1)],
        {"cluster-a": POOL},
        100,
        4,
        3,
        '{"plan": "x"}',
    )
    assert template == before
    assert [m["kind"] for m in out] == ["Job", "Service", "Job", "Service"]
    job = out[0]
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"team": "ml", **POOL.node_selector}
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert (
        env["NNODES"] == "2" and env["KEEP"] == "1"
    )  # ours replace same-named entries, others stay
    assert env["SHARDMETER_NUM_ISLANDS"] == "2" and env["SHARDMETER_ISLAND_ID"] == "0"
    assert env["SHARDMETER_SYNC_EVERY"] == "100" and env["SHARDMETER_NUM_FRAGMENTS"] == "4"
    assert out[2]["spec"]["completions"] == 1
    assert (
        out[1]["spec"]["clusterIP"] == "None"
        and out[1]["metadata"]["name"] == job["metadata"]["name"]
    )
    assert all(m["metadata"]["ownerReferences"] == [OWNER] for m in out)


def test_torchtitan_args_carry_the_streaming_settings() -> None:
    args = torchtitan_args(2, 5, 100, 4, 3)
    for flag in (
        "--fault_tolerance.replica_id=2",
        "--fault_tolerance.group_size=5",
        "--fault_tolerance.sync_steps=100",
        "--fault_tolerance.num_fragments=4",
        "--fault_tolerance.fragment_sync_delay=3",
    ):
        assert flag in args


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({}, "spec.template"),
        (
            {
                "spec": {
                    "completions": 3,
                    "template": {"spec": {"containers": [{"name": "a", "image": "b"}]}},
                }
            },
            "spec.template.spec.completions",
        ),
        ({"spec": {"template": {"spec": {"containers": [{"name": "a"}]}}}}, "containers[0]"),
        (
            {
                "spec": {
                    "template": {
                        "spec": {
                            "restartPolicy": "Always",
                            "containers": [{"name": "a", "image": "b"}],
                        }
                    }
                }
            },
            "restartPolicy",
        ),
    ],
)
def test_bad_templates_name_the_field(template: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        validate_template(template)
    assert field in info.value.field


def test_bench_job_runs_torchrun_on_the_pool_nodes() -> None:
    job, svc = bench_job(
        "cluster-a",
        POOL,
        namespace="sm",
        image="bench:1",
        service_account="bench",
        generation=3,
        attempt=1,
        owner=OWNER,
    )
    assert job["metadata"]["name"] == "shardmeter-bench-cluster-a-g3-a1"
    pod = job["spec"]["template"]["spec"]
    assert pod["tolerations"] == [t.model_dump(exclude_none=True) for t in POOL.tolerations]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert job["spec"]["backoffLimit"] == 0  # the operator retries with backoff, not the Job
    assert svc["spec"]["clusterIP"] == "None"


def test_plan_request_names_missing_pools() -> None:
    spec = TrainingPlanSpec.model_validate(PLAN)
    with pytest.raises(SpecError, match=r"GPUPool 'cluster-b' not found \(GPUPools: cluster-a\)"):
        plan_request(spec, {"cluster-a": POOL})


def test_plan_status_matches_the_cli_answer() -> None:
    from shardmeter.plan.result import build_result
    from shardmeter.plan.schema import load_plan
    from shardmeter.plan.search import search

    spec = TrainingPlanSpec.model_validate(PLAN)
    pool_b = GPUPoolSpec.model_validate(
        yaml.safe_load((REPO / "examples" / "gpupool-cluster-b.yaml").read_text())["spec"]
    )
    outcome = plan_status(
        "p",
        plan_request(spec, {"cluster-a": POOL, "cluster-b": pool_b}),
        {"cluster-a": None, "cluster-b": None},
        {},
    )
    cli_spec, _ = load_plan(REPO / "examples" / "case-study.yaml")
    cli_spec = cli_spec.model_copy(update={"runtime": spec.runtime})  # the study is weighted
    cli = build_result(search(cli_spec)).chosen
    assert outcome.status["plan"] == cli.label
    assert outcome.status["predictions"]["tokensPerSecond"] == pytest.approx(
        cli.tokens_per_s, rel=1e-6
    )


def test_needs_work_follows_generation_and_pool_revisions() -> None:
    status = {
        "observedGeneration": 1,
        "phase": "Planned",
        "conditions": [],
        "coefficients": [{"pool": "cluster-a", "source": "prior", "revision": "r1"}],
    }
    spec = {**PLAN, "pools": [{"name": "cluster-a"}]}
    pools = {"cluster-a": PoolView({}, {"coefficientsRevision": "r1"})}
    assert not needs_work(1, spec, status, pools)
    assert needs_work(2, spec, status, pools)
    assert needs_work(1, spec, status, {"cluster-a": PoolView({}, {"coefficientsRevision": "r2"})})


def test_metrics_series_disappear_with_the_object() -> None:
    metrics.set_plan("ns", "gone", step=1, tokens=2, cost=3, duration=4, blocking=0, mfu=0.5)
    metrics.set_recommendation("ns", "gone", 100, 2, 3)
    text = generate_latest(metrics.REGISTRY).decode()
    assert (
        'shardmeter_plan_predicted_tokens_per_second{namespace="ns",trainingplan="gone"} 2.0'
        in text
    )
    assert 'fragments="2"' in text
    metrics.forget_plan("ns", "gone")
    assert 'trainingplan="gone"' not in generate_latest(metrics.REGISTRY).decode()
    metrics.set_pool("p", "measured", 1.0, 0.1)
    assert (
        'shardmeter_pool_coefficients_age_seconds{gpupool="p"}'
        in generate_latest(metrics.REGISTRY).decode()
    )
    metrics.forget_pool("p")
    assert 'gpupool="p"' not in generate_latest(metrics.REGISTRY).decode()
