"""Sanity properties of the model that a user relies on, over random configurations
(hypothesis): more nodes never speed a step up (beyond the smaller optimizer shard), faster
GPUs are never slower, ``torch.compile`` and float8 are never slower, and memory follows
FSDP2's documented sharding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmeter.cost.model import CostModel
from shardmeter.sim.fsdp import FSDPDurations
from shardmeter.sim.scenario import IslandShape, IslandStepModel
from shardmeter.spec.model import MODEL_PRESETS, MLPKind, TransformerSpec
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import ActivationCheckpointing, GradientSync, TrainingSpec

MODES = list(ActivationCheckpointing)
SYNCS = [GradientSync.EVERY_MICRO_BATCH, GradientSync.LAST_MICRO_BATCH]


@st.composite
def big_models(draw: st.DrawFn) -> TransformerSpec:
    """7B+ decoder shapes: a preset or a random Llama/MPT-like shape of width ≥ 4096."""
    if draw(st.booleans()):
        return MODEL_PRESETS[draw(st.sampled_from(["llama-3.1-8b", "llama-3.1-70b"]))]
    head_dim = 128
    heads = draw(st.sampled_from([32, 40, 48, 64]))
    kv = draw(st.sampled_from([h for h in (1, 4, 8, heads) if heads % h == 0]))
    hidden = heads * head_dim
    return TransformerSpec(
        name="random-7b+",
        hidden_size=hidden,
        num_layers=draw(st.integers(24, 48)),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=draw(st.sampled_from([3, 4])) * hidden,
        vocab_size=draw(st.sampled_from([32000, 50368, 128256])),
        mlp_kind=draw(st.sampled_from(list(MLPKind))),
    )


@st.composite
def trainings(draw: st.DrawFn) -> TrainingSpec:
    seq = draw(st.sampled_from([1024, 2048, 4096, 8192]))
    return TrainingSpec(
        seq_len_tokens=seq,
        global_batch_tokens=seq,
        activation_checkpointing=draw(st.sampled_from(MODES)),
        torch_compile=draw(st.booleans()),
        gradient_sync=draw(st.sampled_from(SYNCS)),
    )


def step_s(
    model: TransformerSpec, training: TrainingSpec, gpu: str, nodes: int, b: int, a: int
) -> float:
    cm = CostModel(model, training, PoolSpec(name="p", gpu=gpu, nodes=16, gpus_per_node=8))
    return IslandStepModel(cm, IslandShape(nodes, 8), b).step_s(a)


@given(
    big_models(),
    trainings(),
    st.sampled_from(["a100", "h100", "h200", "l40s"]),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(1, 2),
    st.integers(1, 4),
)
@settings(max_examples=40, deadline=None)
def test_adding_nodes_never_makes_a_step_faster_at_a_fixed_per_gpu_batch(
    model: TransformerSpec, training: TrainingSpec, gpu: str, nodes: int, b: int, a: int
) -> None:
    # Physically, one thing does shrink with more nodes: each rank's optimizer shard (the
    # AdamW update is 1/P of the parameters). Everything else — collectives, stragglers,
    # contention — only grows, so the step may get faster by at most that saving.
    pool = PoolSpec(name="p", gpu=gpu, nodes=16, gpus_per_node=8)
    cm = CostModel(model, training, pool)
    small = IslandStepModel(cm, IslandShape(nodes, 8), b)
    big = IslandStepModel(cm, IslandShape(2 * nodes, 8), b)
    saving = FSDPDurations.from_cost_model(cm, nodes, 8, b).optimizer_s - (
        FSDPDurations.from_cost_model(cm, 2 * nodes, 8, b).optimizer_s
    )
    assert big.step_s(a) >= small.step_s(a) - saving - 1e-12


@given(big_models(), trainings(), st.sampled_from([1, 2, 8]), st.integers(1, 2), st.integers(1, 3))
@settings(max_examples=40, deadline=None)
def test_h200_h100_a100_l40s_are_ordered_for_7b_plus_models(
    model: TransformerSpec, training: TrainingSpec, nodes: int, b: int, a: int
) -> None:
    h200, h100, a100, l40s = (
        step_s(model, training, g, nodes, b, a) for g in ("h200", "h100", "a100", "l40s")
    )
    assert h200 <= h100 <= a100 <= l40s


@given(big_models(), trainings(), st.sampled_from(["h100", "h200"]), st.sampled_from([1, 4]))
@settings(max_examples=40, deadline=None)
def test_compile_and_float8_are_never_slower(
    model: TransformerSpec, training: TrainingSpec, gpu: str, nodes: int
) -> None:
    eager = training.model_copy(update={"torch_compile": False})
    compiled = training.model_copy(update={"torch_compile": True})
    fp8 = TrainingSpec.model_validate({**compiled.model_dump(), "precision": "fp8"})
    fp8_eager = TrainingSpec.model_validate({**eager.model_dump(), "precision": "fp8"})
    t_eager = step_s(model, eager, gpu, nodes, 1, 2)
    t_compiled = step_s(model, compiled, gpu, nodes, 1, 2)
    assert t_compiled <= t_eager
    assert step_s(model, fp8, gpu, nodes, 1, 2) <= t_compiled
    # eager float8 launches ~16 cast kernels per linear: where that makes the host the slower
    # side (`shardmeter.cost.host`) it may be slower than eager bf16, as torchao warns
    pool = PoolSpec(name="p", gpu=gpu, nodes=16, gpus_per_node=8)
    if not CostModel(model, fp8_eager, pool).unit_times(1).host_bound:
        assert step_s(model, fp8_eager, gpu, nodes, 1, 2) <= t_eager


@given(
    big_models(),
    trainings(),
    st.sampled_from([8, 16, 64, 128]),
    st.integers(1, 4),
    st.sampled_from(["fsdp", "hsdp"]),
)
@settings(max_examples=60, deadline=None)
def test_memory_follows_fsdp2_sharding(
    model: TransformerSpec, training: TrainingSpec, ranks: int, a: int, sharding: str
) -> None:
    t = TrainingSpec.model_validate({**training.model_dump(), "sharding": sharding})
    cm = CostModel(model, t, PoolSpec(name="p", gpu="h200", nodes=16, gpus_per_node=8))
    m = cm.memory(ranks, 1, a, gpus_per_node=8)
    shards = ranks if sharding == "fsdp" else 8  # HSDP: one node per shard group
    # FP32 master parameters, FP32 gradients, two FP32 AdamW moments — sharded
    assert m.sharded_state_bytes * shards == pytest.approx(model.total_params * 16)
    # the unsharded gradient buffer exists exactly when reduce_scatter is deferred
    deferred = t.gradient_sync is GradientSync.LAST_MICRO_BATCH and a > 1
    assert m.accumulation_bytes == (model.total_params * 4 if deferred else 0)
    # FSDP2's root (embedding + norm + head) stays gathered, with its gradient
    root = model.params_embedding + model.params_head
    assert m.gathered_units_bytes >= 2 * root * 2
