"""Per-GPU memory of an FSDP island and the largest micro-batch that fits.

For P ranks, of which S hold one copy of the sharded state (S = P for FSDP, one shard group
for HSDP), micro-batch b (sequences of s tokens, t = b·s), compute precision c bytes:

* **sharded state** = N_params · (master + gradient + optimizer bytes) / S — FSDP shards
  parameters, gradients and optimizer state (Zhao et al., *PyTorch FSDP*, 2023, §3; FSDP2's
  ``fully_shard`` docs: sharded FP32 parameters and gradients);
* **gathered units** = root_params · c · 2 + k_inflight · block_params · c +
  block_params · grad_reduce_bytes — the root unit (embedding, final norm, head) stays
  unsharded from the first forward to the end of backward (FSDP2's ``reshard_after_forward``
  is False for the root "since its parameters would typically be immediately all-gathered
  for backward"), its gradient is held unsharded until the root's reduce_scatter at the end
  of backward, the blocks resident at once (current + prefetched) and one block's gradient
  in the reduce dtype awaiting reduce_scatter;
* **accumulation buffer** (gradient accumulation A > 1 with ``gradientSync:
  last-micro-batch`` only) = N_params · grad_reduce_bytes — with
  ``set_requires_gradient_sync(False)`` FSDP2 keeps every unsharded gradient between
  micro-steps, upcast to the reduce dtype (``FSDPParam.to_accumulated_grad_if_needed``).
  FSDP2's default (``every-micro-batch``) reduce-scatters each micro-batch into the sharded
  gradient and needs no buffer;
* **activations** = α · c · t · L · (a_h·h + 2·q_dim + 2·kv_dim + a_i·i) without activation
  checkpointing, following Korthikanti et al. (*Reducing Activation Recomputation*, 2022, §4)
  adapted to flash attention (no s² term), grouped-query attention and gated MLPs:
  a_h = 4 saved h-wide tensors (3 with parallel attention/MLP), a_i = 4 for gated MLPs
  (gate, up, activation, product) and 2 for plain ones. **full**: only each block's input
  (c·t·h) is kept, plus one block's activations during its recompute. **selective-layer k**:
  every k-th block keeps only its input, the others everything. **selective-op**
  (torchtitan's policy): each block keeps its input and the outputs it saves — Q, V and
  attention output (2·q_dim + kv_dim), the gate (gated) or up (plain) projection (i) and, for
  a gated MLP, the down projection (h) — plus one block's activations during recompute.
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
from shardmeter.spec.training import ActivationCheckpointing, GradientSync, TrainingSpec

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


def selective_op_bytes_per_token_per_block(spec: TransformerSpec, compute_bytes: int) -> float:
    """What torchtitan's op-level policy keeps per block and token: the block input, the
    outputs of attention and of the saved (odd-numbered) matmuls."""
    gated = spec.mlp_kind is MLPKind.GATED
    width = (
        spec.hidden_size
        + 2 * spec.q_dim
        + spec.kv_dim
        + spec.intermediate_size
        + (spec.hidden_size if gated else 0)
    )
    return float(compute_bytes * width)


def activation_bytes_per_token(
    spec: TransformerSpec, training: TrainingSpec, coefficients: MemoryCoefficients
) -> float:
    c = training.compute_bytes
    per_block = activation_bytes_per_token_per_block(spec, c)
    layers = spec.num_layers
    mode = training.activation_checkpointing
    checkpoint_only = c * spec.hidden_size
    if mode is ActivationCheckpointing.FULL:
        raw = layers * checkpoint_only + per_block
    elif mode is ActivationCheckpointing.SELECTIVE_LAYER:
        ckpt = layers // training.activation_checkpointing_every
        raw = ckpt * checkpoint_only + (layers - ckpt) * per_block + (per_block if ckpt else 0)
    elif mode is ActivationCheckpointing.SELECTIVE_OP:
        raw = layers * selective_op_bytes_per_token_per_block(spec, c) + per_block
    else:
        raw = layers * per_block
    return coefficients.activation_scale * raw


def root_params(spec: TransformerSpec) -> int:
    """Parameters of the root FSDP unit: embedding, final norm and LM head (torchtitan and
    llm-foundry wrap each block and leave these to the root)."""
    return spec.params_embedding + spec.params_head


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
    gradient_sync: GradientSync | None = None,
    shard_ranks: int | None = None,
) -> MemoryBreakdown:
    """Bytes per GPU for an island of ``ranks`` GPUs at ``micro_batch`` sequences.

    ``gradient_sync`` defaults to the training spec's (``auto`` counts as FSDP2's default,
    every-micro-batch, until the planner resolves it); ``shard_ranks`` to ``ranks``."""
    n = float(spec.total_params)
    c = training.compute_bytes
    r = training.grad_reduce_bytes
    shards = shard_ranks or ranks
    per_param = training.master_param_bytes + r + training.optimizer_state_bytes_per_param
    block = float(spec.params_per_block)
    root = float(root_params(spec))
    tokens = float(micro_batch * training.seq_len_tokens)
    sync = gradient_sync or training.gradient_sync
    keeps_unsharded = sync is GradientSync.LAST_MICRO_BATCH and accumulation > 1
    sharded = shards > 1
    return MemoryBreakdown(
        sharded_state_bytes=n * per_param / shards,
        gathered_units_bytes=(
            2 * root * training.gather_bytes(block=False)
            + coefficients.gathered_units_in_flight * block * max(c, training.gather_bytes())
            + block * r
        )
        if sharded
        else 0.0,
        accumulation_bytes=n * r if (keeps_unsharded and sharded) else 0.0,
        activation_bytes=tokens * activation_bytes_per_token(spec, training, coefficients),
        logits_bytes=tokens * spec.vocab_size * coefficients.logits_bytes_per_element,
        outer_state_bytes=n * OUTER_STATE_BYTES_PER_PARAM / shards if outer_state_on_gpu else 0.0,
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
    gradient_sync: GradientSync | None = None,
    shard_ranks: int | None = None,
) -> int:
    """The largest micro-batch (sequences per GPU) that fits; 0 if even one does not.

    Memory is affine in b, so this is closed form: ⌊(capacity − fixed) / per-sequence⌋.
    """
    args = (capacity_bytes, coefficients, accumulation, outer_state_on_gpu)
    zero = memory_breakdown(
        spec, training, ranks, 0, *args, gradient_sync=gradient_sync, shard_ranks=shard_ranks
    )
    one = memory_breakdown(
        spec, training, ranks, 1, *args, gradient_sync=gradient_sync, shard_ranks=shard_ranks
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
