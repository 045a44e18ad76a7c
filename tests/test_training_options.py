"""Training options through the cost model and memory: activation-checkpointing modes,
gradient sync, the root unit, torch.compile, float8, HSDP and a power cap."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shardmeter.cost.memory import memory_breakdown
from shardmeter.cost.model import CostModel
from shardmeter.errors import SpecError
from shardmeter.sim.scenario import IslandShape, IslandStepModel, best_gradient_sync
from shardmeter.spec.model import MODEL_PRESETS, TransformerSpec
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import ActivationCheckpointing, GradientSync, TrainingSpec

M8B = MODEL_PRESETS["llama-3.1-8b"]
H100 = PoolSpec(name="h", gpu="h100", nodes=4, gpus_per_node=8)


def cm(
    model: TransformerSpec = M8B, pool: PoolSpec = H100, seq: int = 4096, **options: object
) -> CostModel:
    t = TrainingSpec(seq_len_tokens=seq, global_batch_tokens=seq, **options)  # type: ignore[arg-type]
    return CostModel(model, t, pool)


def test_old_boolean_activation_checkpointing_still_reads() -> None:
    on = TrainingSpec(seq_len_tokens=8, global_batch_tokens=8, activationCheckpointing=True)
    off = TrainingSpec(seq_len_tokens=8, global_batch_tokens=8, activation_checkpointing=False)
    assert on.activation_checkpointing is ActivationCheckpointing.FULL
    assert off.activation_checkpointing is ActivationCheckpointing.NONE
    with pytest.raises(ValidationError, match="activation_checkpointing"):
        TrainingSpec(seq_len_tokens=8, global_batch_tokens=8, activation_checkpointing="most")


def test_recompute_by_mode() -> None:
    none, full = cm().unit_times(1), cm(activation_checkpointing="full").unit_times(1)
    layer = cm(activation_checkpointing="selective-layer").unit_times(1)
    op = cm(activation_checkpointing="selective-op").unit_times(1)
    assert none.block_recompute_s == 0
    # full: the whole forward again
    assert full.block_recompute_s == pytest.approx(full.block_forward_s)
    # every 2nd of 32 blocks: half a forward per block on average
    assert layer.block_recompute_s == pytest.approx(layer.block_forward_s / 2)
    # op-level: no attention, only K, O and the up projection of the matmuls → less than full
    fwd, bwd = cm(activation_checkpointing="selective-op").block_work(1)
    assert 0 < op.block_recompute_s < full.block_recompute_s
    assert op.block_recompute_s < fwd.total_s - fwd.attention_s
    assert op.block_backward_s == pytest.approx(bwd.total_s + op.block_recompute_s)


def test_activation_memory_by_mode_is_ordered() -> None:
    act = {
        mode: cm(activation_checkpointing=mode).memory(32, 1).activation_bytes
        for mode in ActivationCheckpointing
    }
    assert act["none"] > act["selective-layer"] > act["full"]
    assert act["none"] > act["selective-op"] > act["full"]


def test_gradient_sync_modes_memory_and_time_are_consistent() -> None:
    model = cm()
    n = M8B.total_params
    every = model.memory(32, 1, accumulation=4, gradient_sync=GradientSync.EVERY_MICRO_BATCH)
    last = model.memory(32, 1, accumulation=4, gradient_sync=GradientSync.LAST_MICRO_BATCH)
    # FSDP2 keeps every unsharded gradient between micro-batches, in the reduce dtype (FP32)
    assert every.accumulation_bytes == 0 and last.accumulation_bytes == n * 4
    assert (
        model.memory(32, 1, 1, gradient_sync=GradientSync.LAST_MICRO_BATCH).accumulation_bytes == 0
    )
    shape = IslandShape(4, 8)
    t_every = IslandStepModel(model, shape, 1, gradient_sync=GradientSync.EVERY_MICRO_BATCH)
    t_last = IslandStepModel(model, shape, 1, gradient_sync=GradientSync.LAST_MICRO_BATCH)
    assert t_last.step_s(4) <= t_every.step_s(4) and t_last.step_s(1) == t_every.step_s(1)


def test_auto_gradient_sync_picks_the_faster_mode_that_fits() -> None:
    model = cm(gradient_sync="auto")
    shape = IslandShape(4, 8)
    best = best_gradient_sync(model, shape, 1, 8)
    assert best is not None and best.fits(8)
    others = [
        IslandStepModel(model, shape, 1, gradient_sync=m)
        for m in (GradientSync.EVERY_MICRO_BATCH, GradientSync.LAST_MICRO_BATCH)
    ]
    assert best.step_s(8) == min(o.step_s(8) for o in others if o.fits(8))


def test_root_unit_is_gathered_once_and_stays_resident() -> None:
    from shardmeter.sim.fsdp import FSDPDurations

    model = cm()
    d = FSDPDurations.from_cost_model(model, 4, 8, 1)
    assert d.unit_names[0] == "embedding" and d.unit_names[-1] == "head"
    assert d.reshard_after_forward[0] is False and d.reshard_after_forward[-1] is False
    assert d.all_gather_s[-1] == 0 and d.reduce_scatter_s[-1] == 0
    root = M8B.params_embedding + M8B.params_head
    assert d.all_gather_s[0] == pytest.approx(model.gather_seconds(root, 4, 8))
    graph_names = [n for n in model_graph_names(d) if n.startswith("all_gather")]
    assert "all_gather head" not in graph_names and "all_gather embedding (bwd)" not in graph_names
    mem = model.memory(32, 1)
    # root params and its unsharded gradient (BF16) are resident through backward
    assert mem.gathered_units_bytes >= 2 * root * 2


def model_graph_names(d: object) -> list[str]:
    from shardmeter.sim.fsdp import build_fsdp_step

    return list(build_fsdp_step(d).name)  # type: ignore[arg-type]


def test_compile_and_float8_are_never_slower_and_float8_needs_hopper() -> None:
    shape = IslandShape(4, 8)
    eager = IslandStepModel(cm(), shape, 1).step_s(1)
    compiled = IslandStepModel(cm(torch_compile=True), shape, 1).step_s(1)
    fp8 = IslandStepModel(cm(torch_compile=True, precision="fp8"), shape, 1).step_s(1)
    assert fp8 < compiled < eager
    with pytest.raises(SpecError, match=r"training\.precision"):
        cm(pool=PoolSpec(name="a", gpu="a100", nodes=1, gpus_per_node=8), precision="float8")


def test_hsdp_shards_state_over_the_group_only() -> None:
    fsdp, hsdp = cm(), cm(sharding="hsdp", shard_group_nodes=2)
    n = M8B.total_params
    assert fsdp.memory(32, 1).sharded_state_bytes == pytest.approx(n * 16 / 32)
    assert hsdp.memory(32, 1, gpus_per_node=8).sharded_state_bytes == pytest.approx(n * 16 / 16)


def test_power_cap_slows_compute_not_memory_traffic() -> None:
    capped_pool = H100.model_copy(update={"power_cap_watts": 450.0})
    full, capped = cm(), cm(pool=capped_pool)
    assert 0.75 < capped.clock_fraction < 1
    f_full, _ = full.block_work(1)
    f_cap, _ = capped.block_work(1)
    # the cap lowers the clock by its cube-root factor; the duty-cycle ratio of each model
    # (`shardmeter.cost.power.sustained_clock_ratio`) comes on top
    r_full, r_cap = full.unit_times(1).matmul_clock_ratio, capped.unit_times(1).matmul_clock_ratio
    assert f_cap.matmul_s * r_cap == pytest.approx(f_full.matmul_s * r_full / capped.clock_fraction)
    assert f_cap.attention_s == pytest.approx(f_full.attention_s / capped.clock_fraction)
    assert f_cap.elementwise_s == pytest.approx(f_full.elementwise_s)
    with pytest.raises(ValidationError, match="exceeds"):
        PoolSpec(name="p", gpu="h100", nodes=1, gpus_per_node=8, powerCapWatts=800)
    with pytest.raises(ValidationError, match="static power"):
        PoolSpec(name="p", gpu="h100", nodes=1, gpus_per_node=8, powerCapWatts=50)


def test_memory_breakdown_matches_fsdp2_documented_sharding() -> None:
    # FSDP2 (fully_shard): FP32 sharded parameters and gradients, AdamW moments sharded too
    t = TrainingSpec(seq_len_tokens=1024, global_batch_tokens=1024)
    for ranks in (1, 8, 64):
        m = memory_breakdown(M8B, t, ranks, 1, 80e9, cm().coefficients.memory)
        assert m.sharded_state_bytes * ranks == pytest.approx(M8B.total_params * (4 + 4 + 8))
