"""Cost model predictions: monotone in shape, never faster than the roofline, sane MFU."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardmeter.cost.coefficients import LinearFit, Source
from shardmeter.cost.features import Target
from shardmeter.cost.model import CostModel
from shardmeter.cost.priors import prior_coefficients
from shardmeter.errors import SpecError
from shardmeter.spec.hardware import GPU_PRESETS
from shardmeter.spec.model import MODEL_PRESETS, TransformerSpec
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import Precision, TrainingSpec
from strategies import transformer_specs

POOL = PoolSpec(name="p", gpu="h100-80gb-sxm", nodes=4, gpus_per_node=8)


def cost_model(
    spec: TransformerSpec, seq: int = 2048, ac: bool = False, pool: PoolSpec = POOL
) -> CostModel:
    return CostModel(
        spec,
        TrainingSpec(seq_len_tokens=seq, global_batch_tokens=seq, activation_checkpointing=ac),
        pool,
    )


def total(cm: CostModel, b: int) -> list[float]:
    u = cm.unit_times(b)
    return [
        u.embedding_forward_s,
        u.embedding_backward_s,
        u.block_forward_s,
        u.block_backward_s,
        u.head_forward_s,
        u.head_backward_s,
    ]


@given(transformer_specs(), st.integers(1, 16), st.sampled_from([256, 1024, 4096]))
def test_monotone_in_micro_batch_and_seq(spec: TransformerSpec, b: int, seq: int) -> None:
    cm = cost_model(spec, seq)
    for lo, hi in zip(total(cm, b), total(cm, b + 1), strict=True):
        assert hi >= lo
    longer = cost_model(spec, seq * 2)
    for lo, hi in zip(total(cm, b), total(longer, b), strict=True):
        assert hi >= lo


@given(transformer_specs(), st.integers(1, 8))
def test_monotone_in_hidden_size(spec: TransformerSpec, b: int) -> None:
    wider = spec.model_copy(
        update={"hidden_size": spec.hidden_size * 2, "head_dim": spec.head_width * 2}
    )
    for lo, hi in zip(total(cost_model(spec), b), total(cost_model(wider), b), strict=True):
        assert hi >= lo


@given(transformer_specs(), st.integers(1, 8), st.sampled_from(sorted(GPU_PRESETS)))
def test_roofline_never_beaten_and_mfu_in_unit_interval(
    spec: TransformerSpec, b: int, gpu: str
) -> None:
    pool = PoolSpec(name="p", gpu=gpu, nodes=1, gpus_per_node=8)
    cm = cost_model(spec, 2048, pool=pool)
    u = cm.unit_times(b)
    tokens = b * 2048
    floor = spec.block_forward_flops_executed(tokens, 2048) / cm.peak_flop_per_s
    assert u.block_forward_s >= floor
    assert u.head_forward_s >= spec.head_forward_flops(tokens) / cm.peak_flop_per_s
    compute = (
        u.embedding_forward_s
        + u.embedding_backward_s
        + u.head_forward_s
        + u.head_backward_s
        + spec.num_layers * (u.block_forward_s + u.block_backward_s)
    )
    mfu = cm.model_flops_per_micro_step(b) / (compute * cm.peak_flop_per_s)
    assert 0 < mfu < 1


def test_too_fast_fit_is_clamped_and_flagged() -> None:
    spec = MODEL_PRESETS["llama-3.1-8b"]
    doc = prior_coefficients(POOL.gpu, POOL.intra, POOL.inter)
    compute = dict(doc.compute)
    compute[Target.BLOCK_FORWARD] = LinearFit(coefficients={"one": 1e-6})  # absurdly fast
    fitted = doc.model_copy(
        update={"compute": compute, "source": Source.MEASURED, "measured_at": doc.created_at}
    )
    cm = CostModel(spec, TrainingSpec(seq_len_tokens=4096, global_batch_tokens=4096), POOL, fitted)
    u = cm.unit_times(1)
    assert u.roofline_clamped == ("block.forward",)
    assert u.block_forward_s == pytest.approx(
        spec.block_forward_flops_executed(4096, 4096) / cm.peak_flop_per_s
    )


def test_activation_checkpointing_adds_recompute_to_backward() -> None:
    spec = MODEL_PRESETS["llama-3.2-1b"]
    plain, ac = cost_model(spec).unit_times(2), cost_model(spec, ac=True).unit_times(2)
    assert ac.block_recompute_s == pytest.approx(ac.block_forward_s)
    _, ac_bwd = cost_model(spec, ac=True).block_work(2)
    assert ac.block_backward_s == pytest.approx(ac_bwd.total_s + ac.block_forward_s)
    # the recomputed forward shifts the step's tensor duty cycle, so the sustained clock of
    # the two models differs a little; the backward's own work is otherwise the same
    assert ac_bwd.total_s == pytest.approx(plain.block_backward_s, rel=0.01)


def test_collectives_use_slowest_link_across_nodes() -> None:
    cm = cost_model(MODEL_PRESETS["llama-3.2-1b"])
    payload = 100e6
    one_node = cm.collective_seconds("all_gather", payload, 1, 8)
    two_nodes = cm.collective_seconds("all_gather", payload, 2, 4)
    assert two_nodes > one_node  # same 8 ranks, but the ring now crosses InfiniBand
    assert cm.collective_seconds("all_reduce", payload, 1, 8) == pytest.approx(2 * one_node)
    assert cm.collective_seconds("all_gather", payload, 1, 1) == 0.0


def test_coefficients_must_match_gpu_and_precision() -> None:
    spec = MODEL_PRESETS["llama-3.2-1b"]
    t = TrainingSpec(seq_len_tokens=1024, global_batch_tokens=1024)
    a100 = PoolSpec(name="a", gpu="a100", nodes=1, gpus_per_node=8)
    with pytest.raises(SpecError, match="measured on 'H100-80GB-SXM'"):
        CostModel(spec, t, a100, prior_coefficients(POOL.gpu, POOL.intra, POOL.inter))
    fp32 = prior_coefficients(POOL.gpu, POOL.intra, POOL.inter, Precision.FP32)
    with pytest.raises(SpecError, match="set precision: fp32"):
        CostModel(spec, t, POOL, fp32)
