"""Child names and label values over adversarial owner names, checked with the API server's
own rules (tests/support/kube_emulator/builtins.py follows apimachinery's validation)."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardmeter_operator.render.benchmark import bench_job_name, coefficients_configmap_name
from shardmeter_operator.render.island import island_job_name
from shardmeter_operator.render.names import INDEXED_JOB_NAME_MAX, child_name, label_value
from support.kube_emulator import builtins

_LABEL = st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=63).filter(
    lambda s: s[0] != "-" and s[-1] != "-"
)
# what kube-apiserver accepts as a TrainingPlan or GPUPool name: a DNS-1123 subdomain
subdomains = st.lists(_LABEL, min_size=1, max_size=5).map(".".join).filter(lambda s: len(s) <= 253)


@given(subdomains, st.integers(0, 63), st.integers(1, 10**6))
def test_island_names_are_services_and_indexed_jobs_the_api_server_accepts(
    plan: str, index: int, nodes: int
) -> None:
    name = island_job_name(plan, index)
    assert builtins.dns1035_label(name) == []  # the headless Service
    assert len(name) <= INDEXED_JOB_NAME_MAX
    assert builtins.dns1123_label(f"{name}-{nodes - 1}") == []  # the pods' hostname
    assert name == island_job_name(plan, index)  # deterministic


@given(subdomains, st.integers(1, 10**4), st.integers(0, 10))
def test_pool_children_fit(pool: str, generation: int, attempt: int) -> None:
    job = bench_job_name(pool, generation, attempt)
    assert builtins.dns1035_label(job) == [] and len(job) <= INDEXED_JOB_NAME_MAX
    assert builtins.dns1123_subdomain(coefficients_configmap_name(pool)) == []
    assert builtins.label_value(label_value(pool)) == []


@given(st.lists(subdomains, min_size=2, max_size=2, unique=True))
def test_distinct_owners_never_share_a_child_name(pair: list[str]) -> None:
    a, b = pair
    assert island_job_name(a, 0) != island_job_name(b, 0)
    assert bench_job_name(a, 1, 0) != bench_job_name(b, 1, 0)
    assert coefficients_configmap_name(a) != coefficients_configmap_name(b)


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        ("llama", "llama-island-3"),  # valid names stay readable
        ("8b-run", None),  # digit-led: a Service must start with a letter
        ("a" * 47, None),  # the issue's 47 characters: 56 with the suffix
        ("team.llama-8b", None),  # dots are fine in a plan, not in a Service
    ],
)
def test_examples_from_the_issue(plan: str, expected: str | None) -> None:
    name = island_job_name(plan, 3)
    if expected is not None:
        assert name == expected
    else:
        assert name != f"{plan}-island-3" and name.endswith("-island-3")
        assert builtins.dns1035_label(name) == [] and len(name) <= INDEXED_JOB_NAME_MAX


def test_no_room_is_an_error_not_a_bad_name() -> None:
    with pytest.raises(ValueError, match="no room"):
        child_name("p" * 40, "x", "s" * 40, max_len=52)
