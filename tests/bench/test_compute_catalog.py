"""The benchmark catalog: seeded, inside the paper's Table I ranges (with multi-head,
grouped-query and multi-query attention), never a validation architecture, at most --configs
shapes, inside the CPU memory budget, and a batch sweep that doubles up to the scale's caps."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardmeter_bench.compute.catalog import (
    FULL_CPU,
    FULL_GPU,
    MAX_CONFIGS,
    SMALL,
    ScaleRange,
    Shape,
    architecture_key,
    batch_sweep,
    generate_catalog,
    scale_range,
)
from shardmeter_bench.compute.footprint import process_bytes


def _key(shape: Shape) -> tuple:
    return (shape.spec.model_dump_json(), shape.seq_len, shape.gpus)


def test_same_seed_same_catalog_other_seed_other_catalog() -> None:
    a = generate_catalog(FULL_GPU, 40, seed=7)
    b = generate_catalog(FULL_GPU, 40, seed=7)
    c = generate_catalog(FULL_GPU, 40, seed=8)
    assert [_key(s) for s in a] == [_key(s) for s in b]
    assert [_key(s) for s in a] != [_key(s) for s in c]


@given(seed=st.integers(0, 2**31), configs=st.integers(1, 60))
def test_full_scale_shapes_are_inside_table_one(seed: int, configs: int) -> None:
    shapes = generate_catalog(FULL_GPU, configs, seed)
    assert len(shapes) == configs  # exactly --configs, never more
    assert len({_key(s) for s in shapes}) == configs  # distinct
    for shape in shapes:
        s = shape.spec
        assert 16 <= s.num_attention_heads <= 32
        assert 960 <= s.hidden_size <= 4096
        assert 16 <= s.num_layers <= 32
        assert 2560 <= s.intermediate_size <= 24576
        assert 1 <= shape.gpus <= 16
        assert s.num_attention_heads % s.kv_heads == 0
        assert s.head_width in FULL_GPU.head_dims
        assert s.q_dim == s.hidden_size  # head_dim = hidden / heads
        assert shape.seq_len in FULL_GPU.seq_lens


def test_catalog_covers_the_ranges_not_one_corner() -> None:
    shapes = generate_catalog(FULL_GPU, 200, seed=0)
    hidden = [s.spec.hidden_size for s in shapes]
    inter = [s.spec.intermediate_size for s in shapes]
    assert min(hidden) < 1600 and max(hidden) > 3500
    assert min(inter) < 5000 and max(inter) > 16000
    assert len({s.gpus for s in shapes}) >= 12


@pytest.mark.parametrize("scale", [FULL_GPU, FULL_CPU, SMALL], ids=lambda s: s.name)
def test_catalog_covers_multi_head_grouped_and_multi_query_attention(scale: ScaleRange) -> None:
    """kv = heads (GPT-2, Llama-2 7B), kv = 1 (Gemma-2B) and the grouped-query ratios in
    between, each a fair share: a fit that only saw kv/heads ≤ 1/2 over-predicted MHA."""
    shapes = generate_catalog(scale, 60, seed=0)
    ratio = [s.spec.kv_heads / s.spec.num_attention_heads for s in shapes]
    mha = sum(r == 1 for r in ratio)
    mqa = sum(s.spec.kv_heads == 1 for s in shapes)
    gqa = len(shapes) - mha - mqa
    assert min(mha, mqa, gqa) >= 60 // 12, (mha, gqa, mqa)
    assert {1 / 2, 1 / 4} <= set(ratio)


def test_validation_architectures_are_never_drawn() -> None:
    first = generate_catalog(FULL_CPU, 20, seed=0)
    taken = [s.spec for s in first[:5]]
    again = generate_catalog(FULL_CPU, 20, seed=0, exclude=taken)
    keys = {architecture_key(s.spec) for s in again}
    assert not keys & {architecture_key(t) for t in taken}


def test_cpu_shapes_and_batches_stay_inside_the_memory_budget() -> None:
    budget = FULL_CPU.max_process_bytes
    assert budget is not None
    for shape in generate_catalog(FULL_CPU, 60, seed=3):
        for b in batch_sweep(shape, FULL_CPU):
            assert process_bytes(shape.spec, FULL_CPU.blocks_per_model, b, shape.seq_len) <= budget
    tight = dataclasses.replace(FULL_CPU, max_process_bytes=2.0 * 2**30)
    small = generate_catalog(tight, 30, seed=3)
    assert all(process_bytes(s.spec, 1, 1, min(FULL_CPU.seq_lens)) <= 2.0 * 2**30 for s in small)
    # the budget bites: big widths then come only with small vocabularies
    wide = [s.spec for s in small if s.spec.hidden_size >= 1536]
    assert wide and max(s.vocab_size for s in wide) < max(FULL_CPU.vocab)


def test_small_scale_stays_small() -> None:
    for shape in generate_catalog(SMALL, 12, seed=0):
        assert 64 <= shape.spec.hidden_size <= 256
        assert shape.spec.vocab_size <= 4096
        assert shape.seq_len <= 64


@pytest.mark.parametrize("configs", [0, MAX_CONFIGS + 1])
def test_configs_out_of_bounds_are_rejected(configs: int) -> None:
    with pytest.raises(ValueError, match="configs must be between"):
        generate_catalog(SMALL, configs)


def test_batch_sweep_doubles_up_to_the_caps() -> None:
    shape = generate_catalog(SMALL, 1, seed=0)[0]
    sweep = list(batch_sweep(shape, SMALL))
    assert sweep[0] == 1
    assert all(b2 == 2 * b1 for b1, b2 in itertools.pairwise(sweep))
    assert sweep[-1] <= SMALL.max_batch
    assert all(b == 1 or b * shape.seq_len <= SMALL.max_tokens for b in sweep)
    roomy = dataclasses.replace(SMALL, max_batch=64, max_tokens=10**9)
    assert list(batch_sweep(shape, roomy)) == [1, 2, 4, 8, 16, 32, 64]


def test_cpu_flop_cap_limits_the_sweep_and_shortens_sequences() -> None:
    cap = FULL_CPU.max_iteration_flops
    assert cap is not None
    shapes = generate_catalog(FULL_CPU, 30, seed=1)
    for shape in shapes:
        for b in batch_sweep(shape, FULL_CPU):
            assert b == 1 or shape.iteration_flops(b, FULL_CPU.blocks_per_model) <= cap
        if shape.seq_len > min(FULL_CPU.seq_lens):
            assert shape.iteration_flops(1, FULL_CPU.blocks_per_model) <= cap
    # big shapes were drawn at 256 or 512 and fell back; the sweep still measures batch 1
    assert any(list(batch_sweep(s, FULL_CPU)) == [1] for s in shapes)


def test_scale_range_by_device() -> None:
    assert scale_range("small", "cpu") is SMALL
    assert scale_range("full", "cpu") is FULL_CPU
    assert scale_range("full", "cuda") is FULL_GPU
    with pytest.raises(ValueError):
        scale_range("huge", "cpu")


def test_max_memory_gib_is_the_cpu_budget_only() -> None:
    from shardmeter_bench.runconfig import RunConfig

    cpu = RunConfig(mode="compute", device_type="cpu", scale="full", max_memory_gib=3.0)
    assert cpu.scale_range.max_process_bytes == 3.0 * 2**30
    assert cpu.max_process_bytes == 3.0 * 2**30
    default = RunConfig(mode="compute", device_type="cpu", scale="full")
    assert default.scale_range is FULL_CPU and default.max_process_bytes == 5.0 * 2**30
    gpu = RunConfig(mode="compute", device_type="cuda", scale="full", max_memory_gib=3.0)
    assert gpu.scale_range is FULL_GPU and gpu.max_process_bytes is None


def test_the_gpu_sweep_measures_training_sizes_in_few_steps() -> None:
    # from 2 k tokens, ×4 up to 64 k: 2-3 micro-batches a shape, none host-bound-small
    for shape in generate_catalog(FULL_GPU, FULL_GPU.default_configs, seed=0):
        sweep = list(batch_sweep(shape, FULL_GPU))
        tokens = [b * shape.seq_len for b in sweep]
        assert 2 <= len(sweep) <= 3, (shape.seq_len, sweep)
        assert min(tokens) >= FULL_GPU.min_tokens and max(tokens) <= FULL_GPU.max_tokens
        assert all(b2 == 4 * b1 for b1, b2 in itertools.pairwise(sweep))
