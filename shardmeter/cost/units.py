"""What the cost model returns per unit pass, and the kinds of work its features belong to:
matmuls, attention, memory-bound element-wise work and launch overhead."""

from __future__ import annotations

from dataclasses import dataclass

MATMUL_FEATURES = frozenset({"t_h_q", "t_h_kv", "t_h_i", "t_h_v"})
ATTENTION_FEATURES = frozenset({"t_s_q"})
ELEMENTWISE_FEATURES = frozenset({"t_h", "t_i", "t_v", "v_h"})
TENSOR_FEATURES = MATMUL_FEATURES | ATTENTION_FEATURES
"""Work that keeps the tensor cores busy (and the board at its power limit)."""


def tensor_seconds(parts: dict[str, float]) -> float:
    return sum(v for f, v in parts.items() if f in TENSOR_FEATURES)


def slow_matmuls(parts: dict[str, float], clock_ratio: float) -> dict[str, float]:
    return {f: v / clock_ratio if f in MATMUL_FEATURES else v for f, v in parts.items()}


@dataclass(frozen=True)
class StepParts:
    """Per-feature seconds of one micro-step's block and head passes, sustained clock applied."""

    block_forward: dict[str, float]
    block_backward: dict[str, float]
    head_forward: dict[str, float]
    head_backward: dict[str, float]
    tensor_duty_cycle: float = 1.0
    matmul_clock_ratio: float = 1.0


@dataclass(frozen=True)
class WorkSplit:
    """Seconds of one unit pass by kind of work."""

    matmul_s: float
    attention_s: float
    elementwise_s: float
    launch_s: float

    @property
    def total_s(self) -> float:
        return self.matmul_s + self.attention_s + self.elementwise_s + self.launch_s


@dataclass(frozen=True)
class UnitTimes:
    """Seconds of each FSDP unit's forward and backward pass for one micro-batch.

    ``block_backward_s`` includes the recomputation activation checkpointing adds
    (``block_recompute_s``, averaged over the blocks). ``roofline_clamped`` names the
    targets whose regression predicted less than executed FLOPs ÷ peak FLOP/s; those were
    raised to that bound (see `CostModel`)."""

    embedding_forward_s: float
    embedding_backward_s: float
    block_forward_s: float
    block_backward_s: float
    head_forward_s: float
    head_backward_s: float
    block_recompute_s: float = 0.0
    roofline_clamped: tuple[str, ...] = ()
    tensor_duty_cycle: float = 1.0
    """Matmul and attention share of the micro-step's compute (before the clock ratio)."""
    matmul_clock_ratio: float = 1.0
    """Sustained matmul clock ÷ the clock the matmul efficiency was measured at (block
    matmuls; the FP8 benchmark's for float8)."""
    host_bound: tuple[str, ...] = ()
    """Targets whose host time (launching their kernels, `shardmeter.cost.host`) exceeds
    their GPU time: they take the host's time."""


@dataclass(frozen=True)
class UnitPayloads:
    """Parameters per FSDP unit (embedding, one block, final norm + head)."""

    embedding_params: int
    block_params: int
    head_params: int
