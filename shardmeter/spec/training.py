"""What to train and how: `TrainingSpec` (sequence, batch, budget, precision, FSDP2 and
torchtitan options, memory knobs) and `StrategySpec` (FSDP, DiLoCo, Streaming DiLoCo and
their knobs)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from shardmeter.errors import SpecError
from shardmeter.spec import precision as _precision
from shardmeter.spec.base import SpecEnum, SpecModel

Precision = _precision.Precision
"""The number formats live in `shardmeter.spec.precision` (named here too: training and
strategy fields are typed with it)."""
COMPUTE_PRECISIONS = _precision.COMPUTE_PRECISIONS


class ActivationCheckpointing(SpecEnum):
    """torchtitan's activation-checkpointing modes. ``none``: keep every activation;
    ``full``: keep each block's input and recompute the block in backward;
    ``selective-layer``: full checkpointing of every k-th block
    (``activationCheckpointingEvery``, torchtitan's ``selective_ac_option = "k"``);
    ``selective-op``: torchtitan's op-level policy — save the outputs of attention and of every
    other matmul of a block, recompute the remaining matmuls and all element-wise ops."""

    NONE = "none"
    FULL = "full"
    SELECTIVE_LAYER = "selective-layer"
    SELECTIVE_OP = "selective-op"


def _ac_from_bool(value: Any) -> Any:
    """Plan files and custom resources written before the modes existed say
    ``activationCheckpointing: true`` (= full) or ``false`` (= none); they are still read.
    The CRD schema lists only the mode names (a string-or-boolean field is not structural),
    so new manifests use the names; objects already stored keep working."""
    if isinstance(value, bool):
        return ActivationCheckpointing.FULL if value else ActivationCheckpointing.NONE
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return _ac_from_bool(value.strip().lower() == "true")
    return value


ACMode = Annotated[
    ActivationCheckpointing,
    BeforeValidator(_ac_from_bool, json_schema_input_type=ActivationCheckpointing),
]


class GradientSync(SpecEnum):
    """When FSDP reduce-scatters gradients during gradient accumulation.
    ``every-micro-batch``: after every micro-batch (FSDP2's default, torchtitan, Composer);
    sharded gradients accumulate, no unsharded buffer. ``last-micro-batch``:
    ``set_requires_gradient_sync(False)`` on all but the last micro-batch — one
    reduce-scatter per step, but every unsharded gradient stays resident (in the reduce dtype)
    between micro-batches. ``auto``: let the planner pick the faster one that fits."""

    EVERY_MICRO_BATCH = "every-micro-batch"
    LAST_MICRO_BATCH = "last-micro-batch"
    AUTO = "auto"


class Sharding(SpecEnum):
    """``fsdp``: shard parameters, gradients and optimizer state over the whole island.
    ``hsdp``: shard inside groups of ``shardGroupNodes`` nodes and replicate across the
    groups (all-reduce of the sharded gradients between replicas)."""

    FSDP = "fsdp"
    HSDP = "hsdp"

    @classmethod
    def _missing_(cls, value: object) -> Sharding | None:
        if isinstance(value, str):
            key = value.strip().lower()
            if key in ("fsdp", "fsdp2", "full_shard", "full-shard"):
                return cls.FSDP
            if key in ("hsdp", "hybrid_shard", "hybrid-shard"):
                return cls.HSDP
        return None


class ParamAllGather(SpecEnum):
    """Format of the parameters FSDP all-gathers (see ``TrainingSpec.param_all_gather``)."""

    BF16 = "bf16"
    FP8 = "fp8"
    FP32 = "fp32"


FP8_GATHER_BYTES = 1
"""float8 (e4m3) weights: one byte per parameter on the wire."""


class AttentionKernel(SpecEnum):
    """The fused attention kernel the job runs (see ``TrainingSpec.attention_kernel``; the
    rates are in `shardmeter.cost.attention`)."""

    FLEX = "flex"
    CUDNN = "cudnn"
    FLASH2 = "flash2"
    TRITON_FLASH = "triton-flash"


class TrainingSpec(SpecModel):
    """The training job's shape and budget. Defaults follow TorchTitan's FSDP2 recipe:
    BF16 compute, FP32 sharded master parameters, FP32 gradient reduction, AdamW."""

    model_config = SpecModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.globalBatchTokens % self.seqLenTokens == 0",
                    "message": "globalBatchTokens must be a multiple of seqLenTokens",
                },
                {
                    "rule": "!has(self.precision) || self.precision in ['bf16', 'fp32', 'fp8']",
                    "message": "precision must be bf16, fp32 or fp8 (int8 and fp4 are outer "
                    "precisions: strategy.outerPrecision)",
                },
            ]
        }
    }

    seq_len_tokens: int = Field(ge=1, le=1_048_576)
    """Tokens per sequence s."""
    global_batch_tokens: int = Field(ge=1, le=10**12)
    """Tokens per optimizer step summed over all islands (a multiple of seq_len_tokens)."""
    total_tokens: int = Field(default=10**9, ge=1, le=10**16)
    """Tokens to train on; sets wall-clock time and cost."""
    precision: Precision = Precision.BF16
    """Compute precision: bf16 (FP32 master weights), fp8 (bf16 with float8 matmuls,
    H100/H200) or fp32."""
    activation_checkpointing: ACMode = ActivationCheckpointing.NONE
    """none, full, selective-layer or selective-op (``true``/``false`` still read as
    full/none)."""
    activation_checkpointing_every: int = Field(default=2, ge=1, le=1024)
    """k of selective-layer checkpointing: every k-th block is checkpointed (torchtitan's
    default is 2)."""
    gradient_sync: GradientSync = GradientSync.EVERY_MICRO_BATCH
    """every-micro-batch (FSDP2 default), last-micro-batch, or auto (the planner picks)."""
    torch_compile: bool = False
    """The model's blocks are compiled with ``torch.compile`` (fuses element-wise work)."""
    torch_compile_loss: bool = True
    """With ``torchCompile``, the loss (FP32 cross-entropy over the vocabulary) is compiled
    too, as torchtitan does since April 2025 (``build_cross_entropy_loss``); false: only the
    blocks, as torchtitan did until then and as training loops that call the loss outside
    the compiled model do."""
    sharding: Sharding = Sharding.FSDP
    """fsdp (shard over the island) or hsdp (shard inside node groups, replicate across)."""
    shard_group_nodes: int = Field(default=1, ge=1, le=4096)
    """hsdp only: nodes per shard group (it must divide the island's nodes: the planner
    proposes only islands of a multiple of it)."""
    param_all_gather: ParamAllGather | None = None
    """Format of the parameters FSDP all-gathers. Unset: the compute format (bf16; fp32
    when training in fp32). ``fp8``: torchao's float8 all-gather
    (``enable_fsdp_float8_all_gather``; needs ``precision: fp8``): the float8 linears'
    weights are cast on the shard and gathered as 1 byte each, half bf16's bytes; the
    embedding and LM head are not float8 linears (torchtitan leaves the output layer in
    bf16) and gather bf16. ``fp32``: the FP32 master weights are gathered (4 bytes each)
    and cast to the compute format after the gather (FSDP1 with autocast, Composer's FSDP
    ``mixed_precision: DEFAULT``); with ``precision: fp32`` it is what fp32 training gathers
    anyway (torchtitan ``--training.mixed_precision_param float32``)."""
    attention_kernel: AttentionKernel = AttentionKernel.FLEX
    """The fused attention kernel the job runs: ``flex`` (FlexAttention, compiled: what
    torchtitan 0.3.0's Llama 3 runs — its model registry defaults to ``attn_backend="flex"``
    and refuses ``sdpa``; on H100/H200 1.18x FlashAttention-2 forward, 1.28x backward at head
    dim 128, measured), ``cudnn`` (cuDNN's fused attention through SDPA, for runtimes that
    call SDPA with cuDNN first; ~1.6x FlashAttention-2 on H100, 1.8x on H200, 0.82x on A100),
    ``flash2`` (FlashAttention-2, SDPA's flash backend: most stacks before 2025; the GPU
    presets' attention efficiencies are its rates) or ``triton-flash`` (FlashAttention in
    Triton, llm-foundry's ``attn_impl: triton``: 1.4x slower forward, 2x slower backward than
    FlashAttention-2). Sources in `shardmeter.cost.attention` and the GPU presets."""
    master_param_bytes: int = Field(default=4, ge=1, le=8)
    """Bytes per sharded parameter kept between steps."""
    grad_reduce_bytes: Literal[2, 4] = 4
    """Bytes per gradient element in reduce_scatter (FSDP2 reduce_dtype): 4 fp32, 2 bf16."""
    optimizer_state_bytes_per_param: float = Field(default=8.0, ge=0, le=64)
    """Optimizer state per parameter (AdamW: two FP32 moments = 8)."""

    @field_validator("precision", mode="before")
    @classmethod
    def _compute_format(cls, value: Any) -> Any:
        """Only the compute formats (the enum's error would list the outer ones too)."""
        try:
            precision = Precision(value)
        except ValueError:
            raise ValueError("must be 'bf16', 'fp32' or 'fp8'") from None
        if not precision.is_compute:
            raise ValueError(
                f"must be 'bf16', 'fp32' or 'fp8': {precision.value} is an outer precision, "
                "not a compute one (strategy.outerPrecision sets the pseudo-gradients' format)"
            )
        return value

    @model_validator(mode="after")
    def _whole_sequences(self) -> TrainingSpec:
        if self.global_batch_tokens % self.seq_len_tokens:
            nearest = max(1, round(self.global_batch_tokens / self.seq_len_tokens))
            raise ValueError(
                f"globalBatchTokens ({self.global_batch_tokens}) must be a multiple of "
                f"seqLenTokens ({self.seq_len_tokens}); e.g. {nearest * self.seq_len_tokens}"
            )
        return self

    @model_validator(mode="after")
    def _fp8_gather_needs_fp8(self) -> TrainingSpec:
        if self.param_all_gather is ParamAllGather.FP8 and self.precision is not Precision.FP8:
            raise ValueError(
                "paramAllGather fp8 (float8 all-gather) needs precision fp8: only float8 "
                "linears' weights can be gathered in float8; use bf16 or set precision: fp8"
            )
        return self

    def gather_bytes(self, block: bool = True) -> int:
        """Bytes per parameter of a unit's all-gather (``block``: a transformer block, whose
        linears are float8 under fp8 gathers; else the embedding or the LM head)."""
        choice = self.param_all_gather
        if choice is ParamAllGather.FP8:
            return FP8_GATHER_BYTES if block else self.compute_bytes
        if choice is ParamAllGather.FP32:
            return 4
        if choice is ParamAllGather.BF16:
            return 2
        return self.compute_bytes

    @property
    def global_batch_sequences(self) -> int:
        return self.global_batch_tokens // self.seq_len_tokens

    @property
    def compute_bytes(self) -> int:
        """Bytes of an activation or gathered parameter (bf16 for fp8 training too)."""
        return self.precision.base.bytes

    @property
    def island_nodes_step(self) -> int:
        """An island's nodes must be a multiple of this: ``shardGroupNodes`` for hsdp (whole
        shard groups, torchtitan's ``data_parallel_replicate_degree`` = nodes / group), 1 for
        fsdp."""
        return self.shard_group_nodes if self.sharding is Sharding.HSDP else 1

    def shard_group_problem(self, nodes: int) -> str | None:
        """Why an island of ``nodes`` nodes cannot be cut into hsdp shard groups of
        ``shardGroupNodes`` nodes, and what to change; None when it can (always for fsdp). A
        group is never clamped to the island: such a plan cannot run."""
        group = self.island_nodes_step
        if nodes % group == 0:
            return None
        divisors = [d for d in range(1, nodes + 1) if nodes % d == 0]
        shown = ", ".join(str(d) for d in divisors[:8]) + (", …" if len(divisors) > 8 else "")
        fault = (
            f"{group} exceeds the island's {nodes} node(s)"
            if group > nodes
            else f"{group} does not divide the island's {nodes} nodes"
        )
        return (
            f"{fault}: hsdp shards inside groups of whole nodes and replicates across whole "
            f"groups; use a divisor of {nodes} ({shown}) or an island of a multiple of "
            f"{group} nodes"
        )

    def nodes_per_shard_group(self, nodes: int) -> int:
        """Nodes one copy of the sharded state spans on an island of ``nodes`` nodes: the
        island (fsdp) or ``shardGroupNodes`` (hsdp). `SpecError` naming
        ``training.shardGroupNodes`` when the group does not divide the island."""
        problem = self.shard_group_problem(nodes)
        if problem is not None:
            raise SpecError("training.shardGroupNodes", problem)
        return self.shard_group_nodes if self.sharding is Sharding.HSDP else nodes

    def shard_group_ranks(self, nodes: int, gpus_per_node: int) -> int:
        """Ranks one copy of the sharded state is spread over: the island (fsdp) or a group
        of ``shardGroupNodes`` nodes (hsdp; see `nodes_per_shard_group`)."""
        return self.nodes_per_shard_group(nodes) * gpus_per_node


class StrategyKind(SpecEnum):
    FSDP = "fsdp"
    DILOCO = "diloco"
    STREAMING_DILOCO = "streaming-diloco"


Auto = Literal["auto"]

MAX_SYNC_EVERY = 10_000
"""Largest ``syncEvery`` H (inner steps per outer step) a strategy may set or allow: 20× the
DiLoCo paper's H = 500, and the bound that keeps a simulation of three outer rounds of 64
islands under two million inner steps (`shardmeter.sim.diloco.MAX_SIMULATED_INNER_STEPS`)."""
MAX_ISLANDS = 64
"""Most islands a plan or a simulation may have (DiLoCo trains with ≤ 10 for stability)."""
MAX_FRAGMENTS = 1024
"""Largest ``fragments`` P (a fragment holds at least one block; models have ≤ 1024)."""


DEFAULT_MAX_FRAGMENT_SYNC_DELAY_FRACTION = 0.05
"""τ ≤ 5 % of H: Streaming DiLoCo (Douillard et al. 2025, arXiv:2501.18512) reports training
robust to overlaps of up to τ = 5 inner steps at H = 100."""
DEFAULT_LAYERS_PER_FRAGMENT = 3
"""About 3 transformer blocks per fragment, the fragment size the Streaming DiLoCo papers
train with (arXiv:2501.18512)."""
DEFAULT_MAX_MEASURED_ISLANDS = 8
"""The most replicas in *Scaling Laws for DiLoCo* (arXiv:2503.09799, Table 4: M ≤ 8)."""


class BeyondMeasured(SpecEnum):
    """What the planner does with more islands than any published DiLoCo run had."""

    WARN = "warn"
    """Search them; their quality is extrapolated, warned and given a wider uncertainty."""
    CAP = "cap"
    """Propose at most ``maxMeasuredIslands`` islands."""


AUTO_FIELD_BOUNDS: dict[str, tuple[int, int]] = {
    "sync_every": (1, MAX_SYNC_EVERY),
    "fragments": (1, MAX_FRAGMENTS),
    "fragment_sync_delay": (0, MAX_SYNC_EVERY - 1),
}
"""The range of each ``int | "auto"`` field of `StrategySpec` (the spec and its CLI flags)."""


CAMEL_CASE = {
    "sync_every": "syncEvery",
    "fragments": "fragments",
    "fragment_sync_delay": "fragmentSyncDelay",
}
"""The settings' names as a plan file and the CRDs write them."""


def torchft_violation(
    sync_every: int,
    fragments: int,
    fragment_sync_delay: int = 0,
    *,
    names: dict[str, str] = CAMEL_CASE,
) -> tuple[str, str] | None:
    """torchft's rule for Streaming DiLoCo settings, checked here only: ``syncEvery`` H is a
    multiple of ``fragments`` P and ``fragmentSyncDelay`` τ < H / P. Returns the field that
    breaks it and why (named as ``names`` spells them: camelCase as users write plan files, or
    the what-if file's snake_case), or None when the settings hold. (The CRD's CEL rules state
    the same rule for the API server; the optimizer's vectorised search,
    `shardmeter.plan.overhead`, enumerates only settings that keep it.)"""
    h, p, d = sync_every, fragments, fragment_sync_delay
    n_h, n_p, n_d = names["sync_every"], names["fragments"], names["fragment_sync_delay"]
    if h % p:
        return (
            n_h,
            f"{n_h} ({h}) must be a multiple of {n_p} ({p}) (torchft rule); "
            f"try {n_h} {h + (p - h % p)} or {n_p} that divide {h}",
        )
    if d >= h // p:
        return (
            n_d,
            f"{n_d} ({d}) must be < {n_h} / {n_p} = {h // p} "
            "(torchft rule); lower the delay or the fragment count",
        )
    return None


@dataclass(frozen=True)
class StreamingSettings:
    """torchft's knobs: H, F and τ (validated: H % F == 0 and τ < H/F)."""

    sync_every: int
    fragments: int = 1
    fragment_sync_delay: int = 0

    def __post_init__(self) -> None:
        if self.sync_every < 1 or self.fragments < 1 or self.fragment_sync_delay < 0:
            raise SpecError("strategy", f"invalid settings {self}")
        violation = torchft_violation(self.sync_every, self.fragments, self.fragment_sync_delay)
        if violation is not None:
            raise SpecError(f"strategy.{violation[0]}", violation[1])

    @property
    def window(self) -> int:
        return self.sync_every // self.fragments


class StrategySpec(SpecModel):
    """Parallelisation strategy. FSDP inside each island; DiLoCo / Streaming DiLoCo across
    islands with torchft's knobs: ``syncEvery`` (H), ``fragments`` (P) and
    ``fragmentSyncDelay`` (τ). torchft requires H % P == 0 and τ < H / P."""

    model_config = SpecModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.syncEvery) || !has(self.fragments) || type(self.syncEvery) != int"
                    " || type(self.fragments) != int || self.syncEvery % self.fragments == 0",
                    "message": "syncEvery must be a multiple of fragments (torchft rule)",
                },
                {
                    "rule": "!has(self.syncEvery) || type(self.syncEvery) != int"
                    f" || (self.syncEvery >= 1 && self.syncEvery <= {MAX_SYNC_EVERY})",
                    "message": f"syncEvery must be between 1 and {MAX_SYNC_EVERY} or 'auto'",
                },
                {
                    "rule": "!has(self.fragments) || type(self.fragments) != int"
                    f" || (self.fragments >= 1 && self.fragments <= {MAX_FRAGMENTS})",
                    "message": f"fragments must be between 1 and {MAX_FRAGMENTS} or 'auto'",
                },
                {
                    "rule": "!has(self.fragmentSyncDelay) || type(self.fragmentSyncDelay) != int"
                    f" || (self.fragmentSyncDelay >= {AUTO_FIELD_BOUNDS['fragment_sync_delay'][0]}"
                    f" && self.fragmentSyncDelay <= {AUTO_FIELD_BOUNDS['fragment_sync_delay'][1]})",
                    "message": "fragmentSyncDelay must be between "
                    f"{AUTO_FIELD_BOUNDS['fragment_sync_delay'][0]} and "
                    f"{AUTO_FIELD_BOUNDS['fragment_sync_delay'][1]} or 'auto'",
                },
                {
                    "rule": "!has(self.syncEvery) || !has(self.fragments) || !has(self.fragmentSyncDelay)"
                    " || type(self.syncEvery) != int || type(self.fragments) != int"
                    " || type(self.fragmentSyncDelay) != int"
                    " || self.fragmentSyncDelay < self.syncEvery / self.fragments",
                    "message": "fragmentSyncDelay must be < syncEvery / fragments (torchft rule)",
                },
            ]
        }
    }

    kind: StrategyKind = StrategyKind.STREAMING_DILOCO
    """fsdp (one island), diloco (blocking outer step) or streaming-diloco."""
    sync_every: int | Auto = "auto"
    """Inner steps per outer step H (1–10,000), or auto (smallest one with zero blocking)."""
    fragments: int | Auto = "auto"
    """Streaming DiLoCo fragments P (1 to the model's blocks), or auto (the count nearest
    blocks ÷ ``layersPerFragment`` that leaves no blocking)."""
    fragment_sync_delay: int | Auto = "auto"
    """Steps τ between starting a fragment's all_reduce and needing it, or auto. torchft drops
    the fragment's progress over those τ steps (``fragment_update_alpha`` 0): the quality model
    prices τ/H of the tokens as lost."""
    fragment_layout: Literal["contiguous", "strided"] = "contiguous"
    """contiguous: fragment j holds blocks [j·L/P, (j+1)·L/P); strided: blocks j, j+P, …"""
    outer_precision: Precision = Precision.FP32
    """Format of the pseudo-gradients on the wire: fp32 (torchft's default: the parameters'
    dtype), bf16, or quantised with one FP32 scale per row — fp8 (E4M3), int8, fp4. Fewer
    bits mean fewer WAN bytes, a quantise/dequantise pass on each island's GPUs
    (`shardmeter.cost.outer_precision`) and rounding noise in the quality model (fp4 ≈ 0.13
    percentage points of loss, the others under 0.01). torchtitan 0.3.0 + torchft 0.2.0 send either the
    parameters' dtype or, with ``--fault_tolerance.should_quantize``, FP8 E4M3 on compute
    capability ≥ 9.0 (H100/H200) and int8 below (A100, L40S); bf16 and fp4 have no flag."""
    outer_state_on_gpu: bool = False
    """Keep DiLoCo's outer parameter copy and momentum on the GPU (torchft keeps them on CPU)."""
    max_sync_every: int = Field(default=500, ge=1, le=MAX_SYNC_EVERY)
    """Convergence guard-rail: the largest syncEvery H that auto may choose (a value set
    explicitly is used as given). Default 500, the DiLoCo paper's setting (Douillard et al.
    2023, arXiv:2311.08105), whose quality drops as H grows. When blocking cannot be hidden
    within the guard-rails the plan reports the blocking instead of exceeding them."""
    max_fragment_sync_delay: int = Field(default=5, ge=0, le=10_000)
    """Convergence guard-rail: the largest fragmentSyncDelay τ that auto may choose (a value set
    explicitly is used as given). Default 5: Streaming DiLoCo (Douillard et al. 2025,
    arXiv:2501.18512) overlaps each fragment's communication with only a few inner steps
    (τ ≤ 5 in its experiments)."""
    max_fragment_sync_delay_fraction: float = Field(
        default=DEFAULT_MAX_FRAGMENT_SYNC_DELAY_FRACTION, ge=0, le=1
    )
    """Convergence guard-rail relative to H: auto chooses τ ≤ ⌊this × syncEvery⌋ (and ≤
    ``maxFragmentSyncDelay``). Default 0.05: Streaming DiLoCo reports training robust to
    τ ≤ 5 at H = 100; beyond that share of an outer round the fragments' updates arrive
    stale. A value set explicitly is used as given and warned about in the plan's quality."""
    layers_per_fragment: int = Field(default=DEFAULT_LAYERS_PER_FRAGMENT, ge=1, le=MAX_FRAGMENTS)
    """Convergence guard-rail for ``fragments: auto``: the fragment size the Streaming DiLoCo
    papers train with (about 3 transformer blocks per fragment). Among the settings that hide
    the outer all_reduce, auto takes the fragment count nearest to blocks ÷ this (ties: fewer),
    not the fewest fragments for its own sake."""
    max_measured_islands: int = Field(default=DEFAULT_MAX_MEASURED_ISLANDS, ge=1, le=MAX_ISLANDS)
    """Convergence guard-rail: the most DiLoCo replicas any published run trained with —
    8 (Scaling Laws for DiLoCo, arXiv:2503.09799, Table 4: M ∈ {1, 2, 4, 8}). Plans with more
    islands are extrapolations of the quality model; see ``beyondMeasuredIslands``."""
    beyond_measured_islands: BeyondMeasured = BeyondMeasured.WARN
    """What a plan with more than ``maxMeasuredIslands`` islands gets: warn (default: it is
    searched and its quality carries a warning and a wider uncertainty — the paper's own case
    study allows 10) or cap (the planner proposes at most ``maxMeasuredIslands`` islands)."""

    @field_validator("sync_every", "fragments", "fragment_sync_delay")
    @classmethod
    def _bounded(cls, value: int | str, info: ValidationInfo) -> int | str:
        low, high = AUTO_FIELD_BOUNDS[str(info.field_name)]
        if isinstance(value, int) and not low <= value <= high:
            raise ValueError(f"must be between {low} and {high:,} or 'auto' (got {value})")
        return value

    @model_validator(mode="after")
    def _torchft_rules(self) -> StrategySpec:
        fragment_sync_delay = self.fragment_sync_delay
        if self.kind is StrategyKind.DILOCO:
            if isinstance(self.fragments, int) and self.fragments != 1:
                raise ValueError(
                    "fragments must be 1 for blocking diloco; use kind: streaming-diloco"
                )
            if isinstance(fragment_sync_delay, int) and fragment_sync_delay != 0:
                raise ValueError(
                    "fragmentSyncDelay must be 0 for blocking diloco; use kind: streaming-diloco"
                )
        h, p = self.sync_every, self.fragments
        if isinstance(h, int) and isinstance(p, int):
            delay = fragment_sync_delay if isinstance(fragment_sync_delay, int) else 0
            violation = torchft_violation(h, p, delay)
            if violation is not None:
                raise ValueError(violation[1])
        return self

    @property
    def is_diloco(self) -> bool:
        return self.kind is not StrategyKind.FSDP

    def fragment_sync_delay_limit(self, sync_every: int) -> int:
        """The largest τ auto may choose at ``sync_every``: ``maxFragmentSyncDelay`` and
        ⌊``maxFragmentSyncDelayFraction`` × H⌋, whichever is smaller."""
        fraction = math.floor(self.max_fragment_sync_delay_fraction * sync_every + 1e-9)
        return min(self.max_fragment_sync_delay, fraction)

    def island_limit(self, max_islands: int) -> int:
        """The most islands a plan may have under ``constraints.maxIslands`` = ``max_islands``
        and the measured-islands guard-rail (capped only with ``beyondMeasuredIslands: cap``)."""
        if self.beyond_measured_islands is BeyondMeasured.CAP:
            return min(max_islands, self.max_measured_islands)
        return max_islands


def fragment_sync_delay_limit(
    sync_every: int, max_fragment_sync_delay: int | None, fraction: float | None
) -> int | None:
    """τ auto may choose at H = ``sync_every``: at most ``max_fragment_sync_delay`` and at most
    ⌊``fraction`` × H⌋ (None for either: no such bound; None back when neither bounds it)."""
    limits = [v for v in (max_fragment_sync_delay,) if v is not None]
    if fraction is not None:
        limits.append(math.floor(fraction * sync_every + 1e-9))
    return min(limits) if limits else None
