"""What to train and how: `TrainingSpec` (sequence, batch, budget, precision, memory knobs)
and `StrategySpec` (FSDP, DiLoCo, Streaming DiLoCo and their knobs)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from shardmeter.spec.base import SpecModel


class Precision(StrEnum):
    BF16 = "bf16"
    FP32 = "fp32"

    @property
    def bytes(self) -> int:
        return 2 if self is Precision.BF16 else 4


class TrainingSpec(SpecModel):
    """The training job's shape and budget. Defaults follow TorchTitan's FSDP2 recipe:
    BF16 compute, FP32 sharded master parameters, FP32 gradient reduction, AdamW."""

    model_config = SpecModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.globalBatchTokens % self.seqLenTokens == 0",
                    "message": "globalBatchTokens must be a multiple of seqLenTokens",
                }
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
    """Compute precision (bf16 with FP32 master weights, or pure fp32)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass (full AC)."""
    master_param_bytes: int = Field(default=4, ge=1, le=8)
    """Bytes per sharded parameter kept between steps."""
    grad_reduce_bytes: int = Field(default=4, ge=1, le=8)
    """Bytes per gradient element in reduce_scatter (FSDP2 reduce_dtype)."""
    optimizer_state_bytes_per_param: float = Field(default=8.0, ge=0, le=64)
    """Optimizer state per parameter (AdamW: two FP32 moments = 8)."""

    @model_validator(mode="after")
    def _whole_sequences(self) -> TrainingSpec:
        if self.global_batch_tokens % self.seq_len_tokens:
            nearest = max(1, round(self.global_batch_tokens / self.seq_len_tokens))
            raise ValueError(
                f"globalBatchTokens ({self.global_batch_tokens}) must be a multiple of "
                f"seqLenTokens ({self.seq_len_tokens}); e.g. {nearest * self.seq_len_tokens}"
            )
        return self

    @property
    def global_batch_sequences(self) -> int:
        return self.global_batch_tokens // self.seq_len_tokens

    @property
    def compute_bytes(self) -> int:
        return self.precision.bytes


class StrategyKind(StrEnum):
    FSDP = "fsdp"
    DILOCO = "diloco"
    STREAMING_DILOCO = "streaming-diloco"


Auto = Literal["auto"]


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
    """Inner steps per outer step H, or auto (smallest candidate with zero blocking)."""
    fragments: int | Auto = "auto"
    """Streaming DiLoCo fragments P, or auto (fewest with zero blocking)."""
    fragment_sync_delay: int | Auto = "auto"
    """Steps τ between starting a fragment's all_reduce and needing it, or auto."""
    fragment_layout: Literal["contiguous", "strided"] = "contiguous"
    """contiguous: fragment j holds blocks [j·L/P, (j+1)·L/P); strided: blocks j, j+P, …"""
    outer_precision: Precision = Precision.FP32
    """Precision of the pseudo-gradient all_reduce (torchft sends FP32 unless quantising)."""
    outer_state_on_gpu: bool = False
    """Keep DiLoCo's outer parameter copy and momentum on the GPU (torchft keeps them on CPU)."""
    max_sync_every: int = Field(default=500, ge=1, le=100_000)
    """Convergence guard-rail: the largest syncEvery H that auto may choose (a value set
    explicitly is used as given). Default 500, the DiLoCo paper's setting (Douillard et al.
    2023, arXiv:2311.08105), whose quality drops as H grows. When blocking cannot be hidden
    within the guard-rails the plan reports the blocking instead of exceeding them."""
    max_fragment_sync_delay: int = Field(default=5, ge=0, le=10_000)
    """Convergence guard-rail: the largest fragmentSyncDelay τ that auto may choose (a value set
    explicitly is used as given). Default 5: Streaming DiLoCo (Douillard et al. 2025,
    arXiv:2501.18512) overlaps each fragment's communication with only a few inner steps
    (τ ≤ 5 in its experiments)."""

    @model_validator(mode="after")
    def _torchft_rules(self) -> StrategySpec:
        for field in ("sync_every", "fragments"):
            value = getattr(self, field)
            if isinstance(value, int) and value < 1:
                raise ValueError(f"{_camel(field)} must be ≥ 1 or 'auto' (got {value})")
        delay = self.fragment_sync_delay
        if isinstance(delay, int) and delay < 0:
            raise ValueError(f"fragmentSyncDelay must be ≥ 0 or 'auto' (got {delay})")
        if self.kind is StrategyKind.DILOCO:
            if isinstance(self.fragments, int) and self.fragments != 1:
                raise ValueError(
                    "fragments must be 1 for blocking diloco; use kind: streaming-diloco"
                )
            if isinstance(delay, int) and delay != 0:
                raise ValueError(
                    "fragmentSyncDelay must be 0 for blocking diloco; use kind: streaming-diloco"
                )
        h, p = self.sync_every, self.fragments
        if isinstance(h, int) and isinstance(p, int):
            if h % p:
                raise ValueError(
                    f"syncEvery ({h}) must be a multiple of fragments ({p}) (torchft rule); "
                    f"try syncEvery {h + (p - h % p)} or fragments that divide {h}"
                )
            if isinstance(delay, int) and delay >= h // p:
                raise ValueError(
                    f"fragmentSyncDelay ({delay}) must be < syncEvery / fragments = {h // p} "
                    "(torchft rule); lower the delay or the fragment count"
                )
        return self

    @property
    def is_diloco(self) -> bool:
        return self.kind is not StrategyKind.FSDP


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)
