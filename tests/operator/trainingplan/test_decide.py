"""The TrainingPlan decision, without any API server: what `decide` makes of a plan, its pools,
their coefficients and its children — the decisions a platform team relies on (the launch
state machine of `shardmeter_operator.launch.rules`)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardmeter.cost.coefficients import CoefficientsDocument, Source
from shardmeter.cost.priors import pool_priors
from shardmeter.spec.training import Precision
from shardmeter_operator.api import GPUPoolSpec, TrainingPlanStatus
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.decision import ClusterFacts, Ensured, PlanInputs, PlanResult, PoolView
from shardmeter_operator.launch.children import ensured
from shardmeter_operator.render.labels import PLAN_REVISION_LABEL, PLAN_UID_LABEL
from shardmeter_operator.trainingplan.decide import decide, plan_reads
from shardmeter_operator.trainingplan.validate import needs_work

REPO = Path(__file__).resolve().parents[3]
POOL = yaml.safe_load((REPO / "examples" / "gpupool-cluster-a.yaml").read_text())["spec"]
SPEC = yaml.safe_load((REPO / "examples" / "trainingplan.yaml").read_text())["spec"]
SPEC["pools"] = [{"name": "cluster-a"}]
SPEC["constraints"] = {"maxIslands": 4}
UID = "uid-1"


def pools(revision: str = "r1") -> dict[str, PoolView]:
    return {"cluster-a": PoolView(POOL, {"coefficientsRevision": revision}, 1)}


def spec(**changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(SPEC)
    out.update(changes)
    return out


def inputs(s: dict[str, Any], status: TrainingPlanStatus | None = None, **kw: Any) -> PlanInputs:
    args: dict[str, Any] = {"pools": pools(), "cfg": OperatorConfig(), **kw}
    generation = args.pop("generation", 1)
    return PlanInputs("p", "ns", UID, generation, s, status or TrainingPlanStatus(), **args)


def condition(out: PlanResult, type_: str) -> tuple[str, str, str]:
    c = next(c for c in out.status.conditions if c.type == type_)
    return c.status.value, c.reason, c.message


def launched(**changes: Any) -> tuple[TrainingPlanStatus, list[dict[str, Any]]]:
    """A launched plan's status (every child created) and its children as the cluster
    holds them (each with a UID)."""
    s = spec(launch=True, **changes)
    first = inputs(s)
    out = decide(first)
    ensured(first, Ensured(created=[m["metadata"]["name"] for m in out.create]), out)
    children = copy.deepcopy(out.create)
    for i, child in enumerate(children):
        child["metadata"]["uid"] = f"child-{i}"
    return out.status, children


def running(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(children)
    for c in out:
        if c["kind"] == "Job":
            c["status"] = {"ready": c["spec"].get("parallelism", 1)}
    return out


# ---- planning ---------------------------------------------------------------------------------
def test_a_valid_plan_is_planned_and_creates_nothing_without_launch() -> None:
    out = decide(inputs(spec()))
    st = out.status
    assert st.phase.value == "Planned"
    assert condition(out, "Valid")[:2] == ("True", "SpecValid")
    assert condition(out, "Planned")[:2] == ("True", "PlanFound")
    assert condition(out, "Launched")[:2] == ("False", "PlanOnly")
    assert st.islands and st.predictions is not None and st.launch is None
    assert out.create == []
    assert [(c.pool, c.source, c.revision) for c in st.coefficients] == [
        ("cluster-a", "prior", "r1")
    ]
    assert ("Normal", "Planned") in [e[:2] for e in out.events]


def test_launch_records_the_decision_and_names_its_children() -> None:
    out = decide(inputs(spec(launch=True)))
    st = out.status
    assert st.launch is not None and not st.launch.complete
    assert st.launch.workload.value == "Job"  # the JobSet CRD is not served
    kinds = [m["kind"] for m in out.create]
    assert kinds[:2] == ["Deployment", "Service"]  # the torchft lighthouse first
    jobs = [m["metadata"]["name"] for m in out.create if m["kind"] == "Job"]
    assert jobs == [i.name for i in st.islands]
    for m in out.create:
        labels = m["metadata"]["labels"]
        assert labels[PLAN_UID_LABEL] == UID
        assert labels[PLAN_REVISION_LABEL] == st.launch.revision
    # what creating them came to: all there → Launched
    ensured(inputs(spec(launch=True)), Ensured(created=jobs), out)
    assert st.launch.complete and st.phase.value == "Launched"
    assert condition(out, "Launched")[:2] == ("True", "JobsCreated")


def test_a_served_jobset_launches_one_jobset() -> None:
    out = decide(inputs(spec(launch=True), cluster=ClusterFacts(jobset_served=True)))
    assert out.status.launch is not None and out.status.launch.workload.value == "JobSet"
    assert [m["kind"] for m in out.create].count("JobSet") == 1
    assert "Job" not in [m["kind"] for m in out.create]


def test_a_launch_the_cluster_cannot_serve_is_refused_and_creates_nothing() -> None:
    out = decide(inputs(spec(launch=True, workload="JobSet")))  # JobSet CRD absent
    assert out.create == [] and out.status.launch is None
    status, reason, message = condition(out, "Valid")
    assert (status, reason) == ("False", "WorkloadUnavailable")
    assert message.startswith("spec.workload:")
    assert out.requeue_s == OperatorConfig().recheck_interval_s  # rechecked: fixed elsewhere


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        (
            {"training": {**SPEC["training"], "seqLenTokens": 0}},
            "spec.training.seqLenTokens",
            "InvalidSpec",
        ),
        ({"pools": [{"name": "cluster-z"}]}, "spec.pools[0].name", "PoolNotFound"),
    ],
)
def test_an_invalid_spec_names_the_field_and_creates_nothing(
    changes: dict[str, Any], field: str, reason: str
) -> None:
    out = decide(inputs(spec(launch=True, **changes)))
    status, got, message = condition(out, "Valid")
    assert (status, got) == ("False", reason)
    assert message.startswith(f"{field}:")
    assert out.status.phase.value == "Invalid" and out.create == []
    assert out.status.launch is None  # (its series are dropped: metrics.publish_plan)
    assert out.events == [("Warning", reason, message)]
    # seen again: the same condition, no second Event
    again = decide(inputs(spec(launch=True, **changes), out.status))
    assert again.events == []


def test_new_coefficients_replan_a_plan_that_is_not_launched() -> None:
    first = decide(inputs(spec()))
    body = {"metadata": {"generation": 1}, "spec": spec(), "status": _dump(first.status)}
    assert not needs_work(body, pools("r1"))
    assert needs_work(body, pools("r2"))  # the pool published new coefficients
    reads = plan_reads(spec(), first.status, pools("r2"), [])
    assert reads.searches and reads.documents == ["cluster-a"]
    out = decide(inputs(spec(), first.status, pools=pools("r2"), documents=_slow_fabric()))
    assert [(c.pool, c.source, c.revision) for c in out.status.coefficients] == [
        ("cluster-a", "measured", "r2")
    ]
    assert condition(out, "UsingPriorCoefficients")[:2] == ("False", "Measured")
    assert out.status.predictions != first.status.predictions


# ---- launched plans ---------------------------------------------------------------------------
def test_a_launched_plan_is_never_replanned_on_a_spec_change() -> None:
    status, children = launched()
    changed = spec(launch=True, constraints={"maxIslands": 2})
    reads = plan_reads(changed, status, pools(), children)
    assert not reads.searches and not reads.decides_launch  # nothing is searched
    out = decide(inputs(changed, status, generation=2, children=running(children)))
    assert out.create == []
    assert [i.name for i in out.status.islands] == [i.name for i in status.islands]
    assert out.status.launch == status.launch
    status_, reason, message = condition(out, "SpecChangedAfterLaunch")
    assert (status_, reason) == ("True", "SpecFrozen") and "spec.relaunch" in message
    assert ("Warning", "SpecChangedAfterLaunch") in [e[:2] for e in out.events]
    assert out.status.phase.value == "Running"


def test_a_relaunch_decides_a_new_revision_and_replaces_the_children() -> None:
    status, children = launched()
    assert status.launch is not None
    out = decide(inputs(spec(launch=True, relaunch=1), status, generation=2, children=children))
    assert out.status.launch is not None and not out.status.launch.complete
    new = out.status.launch.revision
    assert new != status.launch.revision
    assert {m["metadata"]["labels"][PLAN_REVISION_LABEL] for m in out.create} == {new}
    assert ("Normal", "Relaunching") in [e[:2] for e in out.events]


def test_new_coefficients_reevaluate_a_launched_plan_without_touching_its_islands() -> None:
    status, children = launched()
    out = decide(
        inputs(
            spec(launch=True),
            status,
            pools=pools("r2"),
            documents=_slow_fabric(),
            children=running(children),
        )
    )
    assert out.create == [] and out.status.launch == status.launch
    assert [i.model_dump(exclude={"state", "reason", "message"}) for i in out.status.islands] == [
        i.model_dump(exclude={"state", "reason", "message"}) for i in status.islands
    ]
    assert out.status.predictions != status.predictions
    assert [c.revision for c in out.status.coefficients] == ["r2"]


def test_a_failed_island_job_fails_the_plan() -> None:
    status, children = launched()
    children = running(children)
    job = next(c for c in children if c["kind"] == "Job")
    job["status"] = {
        "conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}
        ]
    }
    out = decide(inputs(spec(launch=True), status, children=children))
    assert out.status.phase.value == "Failed"
    failed = {i.name: i.reason for i in out.status.islands if i.state.value == "failed"}
    assert failed == {job["metadata"]["name"]: "BackoffLimitExceeded"}
    assert condition(out, "Failed")[:2] == ("True", "IslandFailed")
    assert ("Warning", "IslandFailed") in [e[:2] for e in out.events]
    assert ("Warning", "Failed", "TrainingPlan is Failed") in out.events


def test_a_deleted_island_job_is_failed_not_recreated() -> None:
    status, children = launched()
    gone = next(c for c in children if c["kind"] == "Job")["metadata"]["name"]
    rest = [c for c in running(children) if c["metadata"]["name"] != gone or c["kind"] != "Job"]
    out = decide(inputs(spec(launch=True), status, children=rest))
    assert out.create == []
    assert {i.name: i.reason for i in out.status.islands}[gone] == "JobDeleted"


def test_children_without_a_launch_record_are_neither_replanned_nor_recreated() -> None:
    _, children = launched()
    out = decide(inputs(spec(launch=True), TrainingPlanStatus(), children=children))
    assert out.create == [] and out.status.launch is None
    assert condition(out, "Launched")[:2] == ("True", "ChildrenMissing")


def test_inputs_are_not_mutated_by_deciding() -> None:
    status, children = launched()
    before = (status.model_copy(deep=True), copy.deepcopy(children))
    i = inputs(spec(launch=True), status, children=running(children))
    decide(i)
    decide(dataclasses.replace(i, generation=2))
    assert (status, children) == before


# ---- helpers ----------------------------------------------------------------------------------
def _dump(status: TrainingPlanStatus) -> dict[str, Any]:
    return status.model_dump(by_alias=True, mode="json")


def _slow_fabric() -> dict[str, CoefficientsDocument | None]:
    """'Measured' coefficients: the priors with an inter-node all_reduce 200× slower."""
    prior = pool_priors(GPUPoolSpec.model_validate(POOL), Precision.BF16, "cluster-a")
    comm = {role: dict(fits) for role, fits in prior.communication.items()}
    for role, fits in comm.items():
        if "all_reduce" in fits:
            slow = fits["all_reduce"]
            comm[role]["all_reduce"] = slow.model_copy(
                update={"seconds_per_byte": slow.seconds_per_byte * 200}
            )
    doc = prior.model_copy(update={"source": Source.MEASURED, "communication": comm})
    return {"cluster-a": doc}
