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
from shardmeter_operator.api import (
    DiLoCoSettings,
    GPUPoolSpec,
    IslandStatus,
    TrainingPlanSpec,
)
from shardmeter_operator.api.conditions import set_condition
from shardmeter_operator.api.errors import (
    PoolInvalidError,
    PoolNotFoundError,
    TemplateError,
    reason_for,
)
from shardmeter_operator.render.benchmark import bench_job, bench_role, coefficients_configmap
from shardmeter_operator.render.island import island_job_name, island_manifests, validate_template
from shardmeter_operator.render.labels import child_labels, owner_reference
from shardmeter_operator.trainingplan.model import plan_outcome, plan_request
from shardmeter_operator.trainingplan.reconcile import PoolView, needs_work
from support.kube_emulator import builtins
from support.kube_versions import SUPPORTED_MINORS

REPO = Path(__file__).resolve().parents[2]
POOL = GPUPoolSpec.model_validate(
    yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())["spec"]
)
PLAN = yaml.safe_load((REPO / "examples" / "trainingplan.yaml").read_text())["spec"]
OWNER = owner_reference("TrainingPlan", "p", "uid-1")


def test_conditions_keep_transition_time_until_status_flips() -> None:
    c = set_condition([], "Planned", True, "PlanFound", "ok", 1, now="t1")
    c = set_condition(c, "Planned", True, "PlanFound", "still ok", 2, now="t2")
    assert [x.model_dump(by_alias=True, mode="json") for x in c] == [
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
    assert c[0].last_transition_time == "t3" and c[0].status == "False"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (PoolNotFoundError("f", "m"), "PoolNotFound"),
        (PoolInvalidError("f", "not found in the message"), "PoolInvalid"),
        (TemplateError("spec.pools", "m"), "InvalidTemplate"),
        (SpecError("spec.template.x", "GPUPool 'x' not found"), "InvalidSpec"),
    ],
)
def test_reasons_come_from_the_exception_type_not_its_text(error: SpecError, reason: str) -> None:
    assert reason_for(error) == reason


def island(i: int, nodes: int = 2) -> IslandStatus:
    return IslandStatus(
        name=f"p-island-{i}",
        pool="cluster-a",
        nodes=nodes,
        gpus_per_node=8,
        micro_batch=2,
        accumulation=3,
        local_batch_tokens=2 * 3 * 16 * 8192,
        step_seconds=3.2,
    )


SETTINGS = DiLoCoSettings(sync_every=100, fragments=4, fragment_sync_delay=3)


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
        SETTINGS,
        '{"plan": "x"}',
        child_labels("p", "uid-1", "rev1"),
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


def test_plan_request_names_missing_and_invalid_pools() -> None:
    spec = TrainingPlanSpec.model_validate(PLAN)
    with pytest.raises(
        PoolNotFoundError, match=r"GPUPool 'cluster-b' not found \(GPUPools: cluster-a\)"
    ):
        plan_request(spec, {"cluster-a": POOL})
    with pytest.raises(PoolInvalidError, match=r"GPUPool 'cluster-b' is invalid \(bad gpu\)"):
        plan_request(spec, {"cluster-a": POOL}, {"cluster-b": "bad gpu"})


def test_plan_status_matches_the_cli_answer() -> None:
    from shardmeter.plan.result import build_result
    from shardmeter.plan.schema import load_plan
    from shardmeter.plan.search import search

    spec = TrainingPlanSpec.model_validate(PLAN)
    pool_b = GPUPoolSpec.model_validate(
        yaml.safe_load((REPO / "examples" / "gpupool-cluster-b.yaml").read_text())["spec"]
    )
    outcome = plan_outcome(
        "p",
        plan_request(spec, {"cluster-a": POOL, "cluster-b": pool_b}),
        {"cluster-a": None, "cluster-b": None},
    )
    cli_spec, _ = load_plan(REPO / "examples" / "case-study.yaml")
    # the same question: the study is weighted, ranks by quality and sends bf16 outer traffic;
    # the TrainingPlan example runs torchtitan-FT, ranks as the paper does and sends fp32
    cli_spec = cli_spec.model_copy(
        update={"runtime": spec.runtime, "objective": spec.objective, "strategy": spec.strategy}
    )
    cli = build_result(search(cli_spec)).chosen
    assert outcome.plan == cli.label
    assert outcome.predictions.tokens_per_second == pytest.approx(cli.tokens_per_s, rel=1e-6)


def test_a_launched_plans_reevaluation_keeps_its_predictions() -> None:
    """The planner's predictions (status at planning) and the re-evaluation of the same
    islands and settings (status once launched) agree to the digits status keeps: here auto
    picks 10 fragments, each with its own outer optimizer step, which the planner used to
    charge as one call over the whole model (so the prediction moved after the launch)."""
    from shardmeter_operator.trainingplan.model import reevaluate

    raw = copy.deepcopy(PLAN)
    raw["training"]["totalTokens"] = 20_000_000_000
    raw.update(launch=True, pools=[{"name": "cluster-a"}])
    req = plan_request(TrainingPlanSpec.model_validate(raw), {"cluster-a": POOL})
    out = plan_outcome("storm-01", req, {"cluster-a": None})
    assert out.settings is not None and out.settings.fragments > 1
    ev = reevaluate(req, {"cluster-a": None}, out.islands, out.settings, out.predictions)
    assert ev.predictions == out.predictions


def test_needs_work_follows_generation_and_pool_revisions() -> None:
    body = {
        "metadata": {"generation": 1},
        "spec": {**PLAN, "pools": [{"name": "cluster-a"}]},
        "status": {
            "observedGeneration": 1,
            "phase": "Planned",
            "conditions": [],
            "coefficients": [{"pool": "cluster-a", "source": "prior", "revision": "r1"}],
        },
    }
    same = {"cluster-a": PoolView({}, {"coefficientsRevision": "r1"})}
    assert not needs_work(body, same)
    assert needs_work({**body, "metadata": {"generation": 2}}, same)
    assert needs_work(body, {"cluster-a": PoolView({}, {"coefficientsRevision": "r2"})})
    assert needs_work(body, {})  # the pool went away
    # an invalid pool: quiet until it is valid again
    invalid = {
        **body,
        "status": {
            **body["status"],
            "phase": "Invalid",
            "conditions": [
                {
                    "type": "Valid",
                    "status": "False",
                    "reason": "PoolInvalid",
                    "message": "m",
                    "lastTransitionTime": "t",
                }
            ],
        },
    }
    assert not needs_work(invalid, {"cluster-a": PoolView({}, {}, 2, "bad gpu")})
    assert needs_work(invalid, same)


def _every_object_the_operator_creates() -> list[dict[str, Any]]:
    long_plan, long_pool = "8b-" + "x" * 250, "7" + "p" * 62
    out = island_manifests(
        long_plan,
        "team-a",
        owner_reference("TrainingPlan", long_plan, "uid-1"),
        PLAN["template"],
        [island(i).model_copy(update={"name": island_job_name(long_plan, i)}) for i in range(2)],
        {"cluster-a": POOL},
        SETTINGS,
        "{}",
        child_labels(long_plan, "uid-1", "0123456789abcdef"),
    )
    owner = owner_reference("GPUPool", long_pool, "uid-2")
    out += bench_job(
        long_pool,
        POOL,
        namespace="sm",
        image="bench:1",
        service_account="bench",
        generation=12,
        attempt=3,
        owner=owner,
    )
    out += bench_role(long_pool, "sm", "bench", owner)
    from shardmeter.cost.priors import prior_coefficients

    doc = prior_coefficients(POOL.gpu, POOL.intra, POOL.inter, pool=long_pool)
    out.append(coefficients_configmap(long_pool, "sm", owner, doc))
    return out


@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
def test_every_object_the_operator_creates_validates_against_kubernetes(minor: str) -> None:
    for obj in _every_object_the_operator_creates():
        assert builtins.validate(obj, minor) == [], (obj["kind"], obj["metadata"]["name"])


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


def test_only_the_live_peer_with_the_highest_priority_leads() -> None:
    from datetime import UTC, datetime, timedelta

    from shardmeter_operator.controller import leads

    now = datetime(2026, 1, 1, tzinfo=UTC)
    fresh = (now - timedelta(seconds=5)).isoformat()
    stale = (now - timedelta(seconds=120)).isoformat()
    peers = {
        "a": {"priority": 10, "lastseen": fresh, "lifetime": 60},
        "b": {"priority": 99, "lastseen": stale, "lifetime": 60},  # dead: ignored
    }
    assert leads(10, peers, now) and leads(50, peers, now)
    assert not leads(5, peers, now)
    assert not leads(10, {**peers, "b": {**peers["b"], "lastseen": fresh}}, now)


def test_a_one_island_diloco_plans_status_says_what_it_runs() -> None:
    """status.predictions.quality.runs: a one-island DiLoCo plan runs torchft's outer step on
    its own pseudo-gradient, priced as the paper's M = 1."""
    raw = copy.deepcopy(PLAN)
    raw["training"]["totalTokens"] = 20_000_000_000
    raw.update(pools=[{"name": "cluster-a"}], constraints={"maxIslands": 1})
    req = plan_request(TrainingPlanSpec.model_validate(raw), {"cluster-a": POOL})
    out = plan_outcome("one", req, {"cluster-a": None})
    q = out.predictions.quality
    assert out.island_count == 1 and q is not None
    assert q.runs.startswith("one island running torchft's DiLoCo outer step")
    assert "DiLoCo with M = 1" in q.runs and q.loss_penalty_vs_dp < 0
