"""The unseen suite of ``validate`` (`shardmeter_bench.validation.unseen`): eight Llama
architectures covering MHA/GQA/MQA that the catalog never draws, measured spread over the
catalog."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shardmeter_bench.compute.catalog import FULL_CPU, FULL_GPU, architecture_key, generate_catalog
from shardmeter_bench.validation.hf_models import hf_family
from shardmeter_bench.validation.measure import ValidationCase, validation_cases, within_budget
from shardmeter_bench.validation.unseen import UNSEEN, interleave_schedule, unseen_cases


def attention_kinds(cases: list[ValidationCase]) -> set[str]:
    """Multi-head, multi-query or grouped-query attention, from each case's KV heads."""
    return {
        "mha" if c.spec.kv_heads == c.spec.num_attention_heads else
        "mqa" if c.spec.kv_heads == 1 else "gqa"
        for c in cases
    }  # fmt: skip


def test_unseen_suite_is_eight_llama_architectures_the_catalog_never_draws() -> None:
    cases = unseen_cases("full")
    assert len(cases) == 8 and all(c.suite == UNSEEN for c in cases)
    assert all(hf_family(c.spec) == "llama" for c in cases)
    widths = [c.spec.hidden_size for c in cases]
    assert min(widths) == 448 and max(widths) == 2048
    assert attention_kinds(cases) == {"mha", "gqa", "mqa"}
    # the default CPU budget measures every one of them
    kept, left_out = within_budget(cases, FULL_CPU.max_process_bytes, 4)
    assert kept == cases and not left_out
    catalog = generate_catalog(
        FULL_CPU, 200, seed=0, exclude=[c.spec for c in cases + validation_cases("full", "cpu")]
    )
    drawn = {architecture_key(s.spec) for s in catalog}
    assert not drawn & {architecture_key(c.spec) for c in cases}


@given(shapes=st.integers(0, 40), cases=st.integers(0, 12))
def test_interleaving_spreads_every_case_over_the_catalog_once(shapes: int, cases: int) -> None:
    schedule = interleave_schedule(shapes, cases)
    order = [j for k in sorted(schedule) for j in schedule[k]]
    assert order == list(range(cases))  # each once, in order
    if shapes == 0 or cases == 0:
        return
    assert all(0 <= k < shapes for k in schedule)
    assert max(schedule) == shapes - 1  # the last case after the last shape
    after = [k for k in sorted(schedule) for _ in schedule[k]]
    gaps = [b - a for a, b in zip([-1, *after], after, strict=False)]
    if cases <= shapes:
        assert max(gaps) - min(gaps) <= 1  # evenly spread
    else:
        per_shape = [len(schedule.get(k, [])) for k in range(shapes)]
        assert max(per_shape) - min(per_shape) <= 1  # as many after every shape


def test_on_a_gpu_the_unseen_suite_is_training_sized_released_architectures() -> None:
    # hidden 2,048-8,192, multi-head, grouped-query and multi-query, at 4 k and 16 k tokens;
    # none of them a catalog shape (FULL_GPU draws hidden up to 4096)
    cases = unseen_cases("full", "cuda")
    widths = [c.spec.hidden_size for c in cases]
    assert min(widths) == 2048 and max(widths) == 8192
    assert attention_kinds(cases) == {"mha", "gqa", "mqa"}
    tokens = {b * s for c in cases for b, s in c.sizes}
    assert min(tokens) == 4096 and max(tokens) == 16384
    catalog = generate_catalog(
        FULL_GPU, 200, seed=0, exclude=[c.spec for c in cases + validation_cases("full", "cuda")]
    )
    assert not {architecture_key(s.spec) for s in catalog} & {
        architecture_key(c.spec) for c in cases
    }
    assert unseen_cases("full") == unseen_cases("full", "cpu")  # the CPU suite is unchanged
