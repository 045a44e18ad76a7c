"""Per-GPU memory of an FSDP island and the largest micro-batch that fits.

For P ranks, micro-batch b (sequences of s tokens, t = b·s), compute precision c bytes:

* **sharded state** = N_params · (master + gradient + optimizer bytes) / P — FSDP shards
  parameters, gradients and optimizer state (Zhao et al., *PyTorch FSDP*, 2023, §3);
* **gathered units** = k_inflight · max_unit_params · c + max_unit_params · grad_reduce_bytes —
  the unsharded units resident at once (current + prefetched) and one unit's unsharded
  gradient awaiting reduce_scatter;
* **accumulation buffer** (only when gradient accumulation A > 1) = N_params · c — with
  ``set_requires_gradient_sync(False)`` FSDP2 keeps every unit's unsharded gradient between
  micro-steps, which is why reduce_scatter can be skipped (paper §II-B);
* **activations** = α · c · t · L · (a_h·h + 2·q_dim + 2·kv_dim + a_i·i) without activation
  checkpointing, following Korthikanti et al. (*Reducing Activation Recomputation*, 2022, §4)
  adapted to flash attention (no s² term), grouped-query attention and gated MLPs:
  a_h = 4 saved h-wide tensors (3 with parallel attention/MLP), a_i = 4 for gated MLPs
  (gate, up, activation, product) and 2 for plain ones. With full activation checkpointing
  only each block's input (c·t·h) is kept, plus one block's activations during recompute.
  α (``activation_scale``) is calibrated by the bench Job from measured peak memory;
* **logits** = t · V · ``logits_bytes_per_element`` (BF16 logits, FP32 copy, FP32 gradient);
* **DiLoCo outer state** = N_params · 8 / P when kept on the GPU (FP32 copy of the outer
  parameters and outer Nesterov momentum); torchft keeps it on the CPU by default;
* **reserve** = ``reserve_bytes`` + ``reserve_fraction`` · capacity (context, NCCL, fragmentation).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from shardmeter.cost.coefficients import MemoryCoefficients
from shardmeter.spec.model import MLPKind, TransformerSpec
from shardmeter.spec.training import TrainingSpec

OUTER_STATE_BYTES_PER_PARAM = 8.0


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU, by component."""

    sharded_state_bytes: float
    gathered_units_bytes: float
    accumulation_bytes: float
    activation_bytes: float
    logits_bytes: float
    outer_state_bytes: float
    reserve_bytes: float
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return (
            self.sharded_state_bytes
            + self.gathered_units_bytes
            + self.accumulation_bytes
            + self.activation_bytes
            + self.logits_bytes
            + self.outer_state_bytes
            + self.reserve_bytes
        )

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total_bytes": self.total_bytes}


def activation_bytes_per_token_per_block(spec: TransformerSpec, compute_bytes: int) -> float:
    """Saved activations of one block per token, without checkpointing (α = 1)."""
    a_h = 3 if spec.parallel_attention_mlp else 4
    a_i = 4 if spec.mlp_kind is MLPKind.GATED else 2
    width = a_h * spec.hidden_size + 2 * spec.q_dim + 2 * spec.kv_dim + a_i * spec.intermediate_size
    return float(compute_bytes * width)


def activation_bytes_per_token(
    spec: TransformerSpec, training: TrainingSpec, coefficients: MemoryCoefficients
) -> float:
    c = training.compute_bytes
    per_block = activation_bytes_per_token_per_block(spec, c)
    if training.activation_checkpointing:
        raw = spec.num_layers * c * spec.hidden_size + per_block
    else:
        raw = spec.num_layers * per_block
    return coefficients.activation_scale * raw


def max_unit_params(spec: TransformerSpec) -> int:
    return max(spec.params_embedding, spec.params_per_block, spec.params_head)


def memory_breakdown(
    spec: TransformerSpec,
    training: TrainingSpec,
    ranks: int,
    micro_batch: int,
    capacity_bytes: float,
    coefficients: MemoryCoefficients,
    accumulation: int = 1,
    outer_state_on_gpu: bool = False,
) -> MemoryBreakdown:
    """Bytes per GPU for an island of ``ranks`` GPUs at ``micro_batch`` sequences."""
    n = float(spec.total_params)
    c = training.compute_bytes
    per_param = (
        training.master_param_bytes
        + training.grad_reduce_bytes
        + training.optimizer_state_bytes_per_param
    )
    unit = float(max_unit_params(spec))
    tokens = float(micro_batch * training.seq_len_tokens)
    return MemoryBreakdown(
        sharded_state_bytes=n * per_param / ranks,
        gathered_units_bytes=(
            coefficients.gathered_units_in_flight * unit * c + unit * training.grad_reduce_bytes
        )
        if ranks > 1
        else 0.0,
        accumulation_bytes=n * c if (accumulation > 1 and ranks > 1) else 0.0,
        activation_bytes=tokens * activation_bytes_per_token(spec, training, coefficients),
        logits_bytes=tokens * spec.vocab_size * coefficients.logits_bytes_per_element,
        outer_state_bytes=n * OUTER_STATE_BYTES_PER_PARAM / ranks if outer_state_on_gpu else 0.0,
        reserve_bytes=coefficients.reserve_bytes + coefficients.reserve_fraction * capacity_bytes,
        capacity_bytes=capacity_bytes,
    )


def max_micro_batch(
    spec: TransformerSpec,
    training: TrainingSpec,
    ranks: int,
    capacity_bytes: float,
    coefficients: MemoryCoefficients,
    accumulation: int = 1,
    outer_state_on_gpu: bool = False,
) -> int:
    """The largest micro-batch (sequences per GPU) that fits; 0 if even one does not.

    Memory is affine in b, so this is closed form: ⌊(capacity − fixed) / per-sequence⌋.
    """
    zero = memory_breakdown(
        spec, training, ranks, 0, capacity_bytes, coefficients, accumulation, outer_state_on_gpu
    )
    one = memory_breakdown(
        spec, training, ranks, 1, capacity_bytes, coefficients, accumulation, outer_state_on_gpu
    )
    per_sequence = one.total_bytes - zero.total_bytes
    free = capacity_bytes - zero.total_bytes
    if free < per_sequence:
        return 0
    return math.floor(free / per_sequence + 1e-9)


def min_ranks_for_memory(
    spec: TransformerSpec,
    training: TrainingSpec,
    capacity_bytes: float,
    coefficients: MemoryCoefficients,
    accumulation: int = 1,
    outer_state_on_gpu: bool = False,
    limit: int = 1 << 20,
) -> int | None:
    """Smallest island size at which one sequence per GPU fits, or None beyond ``limit``."""
    lo, hi = 1, 1

    def fits(p: int) -> bool:
        return (
            max_micro_batch(
                spec, training, p, capacity_bytes, coefficients, accumulation, outer_state_on_gpu
            )
            >= 1
        )

    while not fits(hi):
        lo, hi = hi + 1, hi * 2
        if hi > limit:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi
