"""Hook-driven profiler ranges on a tiny shape: every unit is found with positive times,
block 0's backward is timed like any other block's (the requires_grad pitfall), kernel time
is attributed to the range that launched it, and peak memory grows with the batch. One
intra-op thread, so ranges are timed on the compute clock (this thread's CPU time), which
other processes cannot inflate by taking the core; ratios pair ranges of one iteration."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from shardmeter.cost.features import Target
from shardmeter.spec.model import TransformerSpec
from shardmeter_bench.compute.blocks import UnitModel, init_weights
from shardmeter_bench.compute.profiling import profile_shape, range_seconds
from shardmeter_bench.compute.sweep import shard_sizes, time_optimizer_step
from shardmeter_bench.device import MAX_REPEAT_FACTOR, timed_repeats

SPEC = TransformerSpec(
    name="tiny",
    hidden_size=128,
    num_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=384,
    vocab_size=1024,
)
UNIT_TARGETS = {
    Target.EMBEDDING_FORWARD,
    Target.EMBEDDING_BACKWARD,
    Target.BLOCK_FORWARD,
    Target.BLOCK_BACKWARD,
    Target.HEAD_FORWARD,
    Target.HEAD_BACKWARD,
}


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(freeze_embedding: bool = False) -> UnitModel:
    model = UnitModel(SPEC, blocks=2, freeze_embedding=freeze_embedding)
    init_weights(model, seed=0)
    return model


def _paired_ratio(prof: Any, a: tuple[str, str], b: tuple[str, str]) -> float:
    """Median over iterations of range ``a`` ÷ range ``b`` of the same iteration: the two
    ranges run back to back, so a loaded host's slow spells inflate both alike."""
    iterations = {it for _, _, it in prof.ranges}
    return statistics.median(prof.ranges[(*a, it)] / prof.ranges[(*b, it)] for it in iterations)


def test_every_unit_has_a_positive_time_in_every_profiled_iteration() -> None:
    repeats = 3
    prof = profile_shape(_model(), micro_batch=2, seq_len=32, repeats=repeats)
    assert set(prof.seconds) == UNIT_TARGETS
    assert all(v > 0 for v in prof.seconds.values())
    # only the timed iterations (1..n) are recorded: warm-ups are not counted; a unit this
    # fast gets more than --repeats of them, up to MAX_REPEAT_FACTOR times as many
    timed = max(it for _, _, it in prof.ranges)
    assert repeats < timed <= MAX_REPEAT_FACTOR * repeats
    assert {it for _, _, it in prof.ranges} == set(range(1, timed + 1))
    for unit in ("embedding", "block0", "block1", "head"):
        for phase in ("fwd", "bwd"):
            for it in range(1, timed + 1):
                assert prof.ranges[(unit, phase, it)] > 0, (unit, phase, it)
    assert len(prof.raw[Target.BLOCK_FORWARD]) == 2 * timed  # both blocks, every iteration
    assert len(prof.raw[Target.HEAD_BACKWARD]) == timed
    # a backward pass does about twice a forward pass's work
    assert prof.seconds[Target.BLOCK_BACKWARD] > prof.seconds[Target.BLOCK_FORWARD]


def test_fast_units_get_more_timed_iterations() -> None:
    assert timed_repeats(5, 1.0) == 5  # 5 × 1 s is steady enough
    assert timed_repeats(5, 0.2) == 10  # 2 s of timed iterations
    assert timed_repeats(5, 0.001) == MAX_REPEAT_FACTOR * 5  # but never more than 4×
    assert timed_repeats(5, 0.0) == MAX_REPEAT_FACTOR * 5


def test_block0_backward_is_timed_like_block1() -> None:
    prof = profile_shape(_model(), micro_batch=2, seq_len=32, repeats=5)
    assert 0.5 < _paired_ratio(prof, ("block0", "bwd"), ("block1", "bwd")) < 2.0
    assert _paired_ratio(prof, ("block0", "bwd"), ("block0", "fwd")) > 0.8


def test_frozen_embedding_still_times_block0_backward() -> None:
    prof = profile_shape(_model(freeze_embedding=True), micro_batch=2, seq_len=32, repeats=5)
    assert 0.5 < _paired_ratio(prof, ("block0", "bwd"), ("block1", "bwd")) < 2.0
    assert Target.EMBEDDING_BACKWARD not in prof.seconds  # nothing to differentiate


def test_without_the_guard_block0_backward_hook_fires_early() -> None:
    """The pitfall itself: block 0's input does not require grad, so its full backward hook
    fires with the output gradient and its backward reads as ~0."""
    model = _model(freeze_embedding=True)
    model.guard_block0 = False
    with pytest.warns(UserWarning, match="no inputs require gradients"):
        prof = profile_shape(model, micro_batch=2, seq_len=32, repeats=3)
    assert _paired_ratio(prof, ("block0", "bwd"), ("block1", "bwd")) < 0.2


def test_tied_embedding_backward_carries_the_gradient_sum() -> None:
    """A tied LM head shares the embedding's matrix (one parameter, as Hugging Face ties it);
    autograd sums the two V·h gradients inside the embedding's backward range. The matrix is
    48 MiB, over glibc's largest mmap threshold, so both models map fresh gradient pages every
    iteration whatever the allocator did before; the two are timed alternately."""
    wide = SPEC.model_copy(update={"vocab_size": 98304})
    tied_spec = wide.model_copy(update={"tie_embeddings": True})
    untied, tied = UnitModel(wide, blocks=1), UnitModel(tied_spec, blocks=1)
    assert tied.head.lm_head.weight is tied.embedding.weight
    assert (
        sum(p.numel() for p in tied.parameters())
        == sum(p.numel() for p in untied.parameters()) - wide.vocab_size * wide.hidden_size
    )
    seconds: dict[str, list[float]] = {"untied": [], "tied": []}
    for model in (untied, tied):
        init_weights(model, seed=0)
    for _ in range(2):
        for name, model in (("untied", untied), ("tied", tied)):
            prof = profile_shape(model, 1, 32, repeats=5, measure_memory=False)
            timed = max(it for _, _, it in prof.ranges)
            assert len(prof.raw[Target.EMBEDDING_BACKWARD]) == timed  # one range per iteration
            seconds[name].append(prof.seconds[Target.EMBEDDING_BACKWARD])
    assert min(seconds["tied"]) > 1.3 * min(seconds["untied"])


def test_peak_memory_grows_with_the_batch() -> None:
    model = _model()
    small = profile_shape(model, micro_batch=1, seq_len=32, repeats=3).peak_bytes
    large = profile_shape(model, micro_batch=8, seq_len=32, repeats=3).peak_bytes
    logits = 8 * 32 * SPEC.vocab_size * 4
    assert small > 0 and large > small + logits / 2


@dataclass
class _Span:
    start: int
    end: int

    def elapsed_us(self) -> int:
        return self.end - self.start


@dataclass
class _Kernel:
    duration: float


@dataclass
class _Event:
    name: str
    thread: int
    time_range: _Span
    kernels: list[_Kernel] = field(default_factory=list)


def test_device_time_is_the_kernels_launched_inside_each_range() -> None:
    events = [
        _Event("shardmeter|block0|fwd|1", 1, _Span(0, 100)),
        _Event("aten::mm", 1, _Span(10, 20), [_Kernel(50), _Kernel(25)]),
        _Event("aten::add", 1, _Span(150, 160), [_Kernel(7)]),  # outside every range
        _Event("shardmeter|block0|bwd|1", 2, _Span(200, 300)),  # autograd thread
        _Event("aten::mm", 2, _Span(210, 220), [_Kernel(100)]),
        _Event("aten::mm", 1, _Span(210, 220), [_Kernel(1000)]),  # same time, other thread
    ]
    gpu = range_seconds(events, "cuda")
    assert gpu == {
        ("block0", "fwd", 1): pytest.approx(75e-6),
        ("block0", "bwd", 1): pytest.approx(100e-6),
    }
    cpu = range_seconds(events, "cpu")  # on a CPU: the range's own elapsed time
    assert cpu == {
        ("block0", "fwd", 1): pytest.approx(100e-6),
        ("block0", "bwd", 1): pytest.approx(100e-6),
    }


def test_optimizer_step_over_one_ranks_shards() -> None:
    sizes = shard_sizes(SPEC, gpus=4)
    assert sum(sizes) == pytest.approx(SPEC.total_params / 4, rel=0.01)
    params, seconds = time_optimizer_step(SPEC, 4, torch.device("cpu"), 3, budget=10**9)
    assert params == sum(sizes) and seconds > 0
    capped, _ = time_optimizer_step(SPEC, 1, torch.device("cpu"), 3, budget=50_000)
    assert 0 < capped <= 50_000
