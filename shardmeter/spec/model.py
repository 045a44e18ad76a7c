"""Transformer architectures: `TransformerSpec`, its derived parameter and FLOP counts, and
presets taken from the models' public Hugging Face configs."""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator

from shardmeter.spec.base import SpecEnum, SpecModel
from shardmeter.spec.presets import resolve


class MLPKind(SpecEnum):
    """``gated``: SwiGLU/GeGLU, three matrices (gate, up, down) as in Llama, Gemma, Yi.
    ``plain``: two matrices with a GELU between them, as in Phi-1.5 and GPT-2."""

    GATED = "gated"
    PLAIN = "plain"


class NormKind(SpecEnum):
    RMSNORM = "rmsnorm"
    LAYERNORM = "layernorm"


class TransformerSpec(SpecModel):
    """A decoder-only transformer. Units: counts (no unit suffix) unless named otherwise."""

    name: str = Field(default="custom", max_length=63)
    """Display name (free text)."""
    hidden_size: int = Field(gt=0, le=65536)
    """Model width h."""
    num_layers: int = Field(gt=0, le=1024)
    """Number of transformer blocks."""
    num_attention_heads: int = Field(gt=0, le=1024)
    """Query heads."""
    num_key_value_heads: int | None = Field(default=None, gt=0, le=1024)
    """Key/value heads (grouped-query attention); defaults to ``num_attention_heads``."""
    head_dim: int | None = Field(default=None, gt=0, le=4096)
    """Per-head width; defaults to hidden_size / num_attention_heads (Gemma's differs)."""
    intermediate_size: int = Field(gt=0, le=1048576)
    """MLP width i."""
    vocab_size: int = Field(gt=0, le=4194304)
    """Vocabulary size V."""
    tie_embeddings: bool = False
    """Input embedding and LM head share one matrix."""
    mlp_kind: MLPKind = MLPKind.GATED
    """Gated (SwiGLU/GeGLU, 3 matrices) or plain (GELU, 2 matrices)."""
    parallel_attention_mlp: bool = False
    """Attention and MLP read the same normed input (Phi-1.5, GPT-J): one norm per block."""
    linear_bias: bool = False
    """Linear layers (and the LM head) carry biases (Phi-1.5)."""
    norm: NormKind = NormKind.RMSNORM
    """RMSNorm (weight only) or LayerNorm (weight and bias)."""

    @model_validator(mode="after")
    def _check_heads(self) -> TransformerSpec:
        kv = self.kv_heads
        if self.num_attention_heads % kv != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({kv}) for grouped-query attention"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                f"({self.num_attention_heads}); set head_dim explicitly"
            )
        return self

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_width(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        """Width of the query (and attention output) projection: heads × head_dim."""
        return self.num_attention_heads * self.head_width

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections: kv_heads × head_dim."""
        return self.kv_heads * self.head_width

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp_kind is MLPKind.GATED else 2

    # ---- parameter counts -----------------------------------------------------------------
    @cached_property
    def matmul_params_per_block(self) -> int:
        """Weights that take part in a matrix multiply (2 FLOPs each per token)."""
        h = self.hidden_size
        return (
            h * self.q_dim * 2
            + h * self.kv_dim * 2
            + self.mlp_matrices * h * self.intermediate_size
        )

    @cached_property
    def params_per_block(self) -> int:
        h = self.hidden_size
        bias = 0
        if self.linear_bias:
            bias = self.q_dim + 2 * self.kv_dim + h  # q, k, v, o
            bias += (
                2 * self.intermediate_size
                if self.mlp_kind is MLPKind.GATED
                else self.intermediate_size
            ) + h
        norms = (1 if self.parallel_attention_mlp else 2) * self._norm_params
        return self.matmul_params_per_block + bias + norms

    @property
    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm is NormKind.LAYERNORM else 1)

    @cached_property
    def params_embedding(self) -> int:
        return self.vocab_size * self.hidden_size

    @cached_property
    def params_head(self) -> int:
        """Final norm plus the LM head matrix (zero extra if tied) and its bias."""
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        bias = self.vocab_size if self.linear_bias else 0
        return self._norm_params + head + bias

    @cached_property
    def total_params(self) -> int:
        return self.params_embedding + self.num_layers * self.params_per_block + self.params_head

    # ---- FLOPs ----------------------------------------------------------------------------
    def block_forward_flops(self, tokens: int, seq_len: int) -> float:
        """Model FLOPs of one block's forward pass over ``tokens`` tokens in sequences of
        ``seq_len``: 2 per matmul weight per token plus 4·s·q_dim per token for QKᵀ and AV
        (the PaLM / Megatron convention: attention not halved for the causal mask)."""
        return 2.0 * tokens * self.matmul_params_per_block + 4.0 * tokens * seq_len * self.q_dim

    def block_forward_flops_executed(self, tokens: int, seq_len: int) -> float:
        """FLOPs a causal flash-attention kernel actually executes (attention halved); the
        roofline guard uses this lower bound."""
        return 2.0 * tokens * self.matmul_params_per_block + 2.0 * tokens * seq_len * self.q_dim

    def head_forward_flops(self, tokens: int) -> float:
        return 2.0 * tokens * self.vocab_size * self.hidden_size

    def forward_flops_per_token(self, seq_len: int) -> float:
        """Forward model FLOPs per token (embedding lookup excluded)."""
        return self.num_layers * self.block_forward_flops(1, seq_len) + self.head_forward_flops(1)

    def training_flops_per_token(self, seq_len: int) -> float:
        """Forward + backward model FLOPs per token (backward = 2 × forward). Activation
        recomputation is *not* counted: MFU is model FLOPs utilisation."""
        return 3.0 * self.forward_flops_per_token(seq_len)


def _llama(
    name: str,
    h: int,
    layers: int,
    heads: int,
    kv: int,
    inter: int,
    vocab: int,
    tie: bool,
    head_dim: int | None = None,
) -> TransformerSpec:
    return TransformerSpec(
        name=name,
        hidden_size=h,
        num_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_embeddings=tie,
    )


MODEL_PRESETS: dict[str, TransformerSpec] = {
    # HuggingFaceTB/SmolLM-360M config.json
    "smollm-360m": _llama("SmolLM-360M", 960, 32, 15, 5, 2560, 49152, tie=True),
    # meta-llama/Llama-3.2-1B
    "llama-3.2-1b": _llama("Llama-3.2-1B", 2048, 16, 32, 8, 8192, 128256, tie=True),
    # microsoft/phi-1_5: parallel attention+MLP, GELU MLP, LayerNorm, biases, untied head
    "phi-1.5": TransformerSpec(
        name="Phi-1.5",
        hidden_size=2048,
        num_layers=24,
        num_attention_heads=32,
        num_key_value_heads=32,
        intermediate_size=8192,
        vocab_size=51200,
        tie_embeddings=False,
        mlp_kind=MLPKind.PLAIN,
        parallel_attention_mlp=True,
        linear_bias=True,
        norm=NormKind.LAYERNORM,
    ),
    # google/gemma-2b: head_dim 256 ≠ 2048/8, multi-query attention, GeGLU, tied
    "gemma-2b": _llama("Gemma-2B", 2048, 18, 8, 1, 16384, 256000, tie=True, head_dim=256),
    # 01-ai/Yi-1.5-6B
    "yi-1.5-6b": _llama("Yi-1.5-6B", 4096, 32, 32, 4, 11008, 64000, tie=False),
    # meta-llama/Llama-3.1-8B
    "llama-3.1-8b": _llama("Llama-3.1-8B", 4096, 32, 32, 8, 14336, 128256, tie=False),
    # meta-llama/Llama-3.1-70B
    "llama-3.1-70b": _llama("Llama-3.1-70B", 8192, 80, 64, 8, 28672, 128256, tie=False),
}


def _resolve_model(value: Any) -> Any:
    return resolve(value, MODEL_PRESETS, "model")


ModelRef = Annotated[
    TransformerSpec, BeforeValidator(_resolve_model, json_schema_input_type=str | TransformerSpec)
]
"""A model field that accepts a preset name, ``{preset: NAME, <overrides>}`` or a full spec."""
