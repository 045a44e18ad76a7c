"""Bytes that the memory-bound (element-wise) work of one training step moves through HBM.

Matmuls and flash attention are compute-bound; everything between them — norms, rotary
embedding, the MLP activation, residual adds, the gradient sums autograd inserts where a
tensor fans out, the cross-entropy over the vocabulary, the optimizer step — streams its
operands through HBM and costs ``bytes ÷ achieved HBM bandwidth``. This module counts those
bytes per token (per parameter for the optimizer) by walking the ops of a Llama-style block
as PyTorch executes them, once **eager** (one kernel per op, each reading and writing HBM)
and once **compiled** (``torch.compile`` / Inductor fuses each chain of element-wise ops
between two matmuls into one kernel: one read of the inputs, one write of the outputs).

The op lists follow the reference implementations the published runs used: torchtitan's
Llama (``torchtitan/models/llama/model.py``: RMSNorm, complex-number rotary embedding,
``repeat_kv`` for grouped-query attention, ``transpose(1, 2).contiguous()`` after SDPA, SwiGLU)
and llm-foundry's MPT (fused LayerNorm, GELU MLP). Counts are bytes per element of the
tensor named, for BF16 activations (``C`` = 2 bytes) with the FP32 upcasts those codes do.

**RMSNorm** in eager mode is PyTorch's composite op chain (``x.float()``, ``pow``, ``mean``,
``rsqrt``, ``mul``, ``type_as``, ``mul(weight)``: 36 bytes per element forward, about twice that
backward through autograd); **LayerNorm** is one fused native kernel (read + write forward,
two reads + one write backward).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardmeter.spec.model import MLPKind, NormKind, TransformerSpec

C = 2
"""Bytes of a BF16 activation element."""
F32 = 4

# ---- per element of the tensor named, forward / backward -----------------------------------
RMSNORM_EAGER_FWD = (C + F32) + (F32 + F32) + F32 + (F32 + F32) + (F32 + C) + (C + C) + C
"""x.float() r2w4, pow r4w4, mean r4, x·rsqrt r4w4, type_as r4w2, ·weight r2w2 (+r2 weight
broadcast) = 36 bytes."""
RMSNORM_EAGER_BWD = 2 * RMSNORM_EAGER_FWD - 2
"""Autograd runs each op's backward (grad in, saved input, grad out) plus the sum of the two
gradient paths into ``x``: about twice the forward traffic (70 bytes)."""
LAYERNORM_FWD = C + C
"""F.layer_norm, one fused kernel: read x, write y."""
LAYERNORM_BWD = C + C + C + C
"""Read x, read dy, write dx, plus the weight-gradient partial sums."""
NORM_COMPILED_FWD = C + C
NORM_COMPILED_BWD = C + C + C + C

ROTARY_EAGER_FWD = (C + F32) + (F32 + F32) + (F32 + C)
"""torchtitan's complex rotary: ``x.float()`` r2w4, complex multiply r4w4 (frequencies are
tiny), ``type_as`` r4w2 = 20 bytes per q/k element."""
ROTARY_EAGER_BWD = ROTARY_EAGER_FWD
ROTARY_COMPILED = C + C
"""Fused: read the projection, write the rotated copy."""

COPY = C + C
"""A materialising copy (``repeat_kv`` expand→reshape, ``transpose().contiguous()``)."""
ADD = C + C + C
"""Residual add, or the gradient sum autograd inserts where a tensor fans out."""

SWIGLU_EAGER_FWD_PER_I = (C + C) + (C + C + C)
"""``silu(w1 x)`` r2w2, ``· w3 x`` r2r2w2 = 10 bytes per intermediate element."""
SWIGLU_EAGER_BWD_PER_I = 3 * ADD
"""Two multiply backwards (r2r2w2 each), silu backward (r2r2w2) = 18 bytes."""
SWIGLU_COMPILED_FWD_PER_I = C + C + C
SWIGLU_COMPILED_BWD_PER_I = C + C + C + C + C
GELU_EAGER_FWD_PER_I = C + C
GELU_EAGER_BWD_PER_I = C + C + C
GELU_COMPILED_FWD_PER_I = C + C
GELU_COMPILED_BWD_PER_I = C + C + C

CROSS_ENTROPY_EAGER_PER_V = (C + F32) + (F32 + F32 + F32) + F32 + (F32 + F32 + F32) + (F32 + C)
"""torchtitan/Composer ``cross_entropy(logits.float())``: upcast r2w4, log_softmax (two reads,
one write) r4r4w4, nll backward w4 (zero + scatter), log_softmax backward r4r4w4, upcast
backward r4w2 = 44 bytes per logit."""
CROSS_ENTROPY_COMPILED_PER_V = C + C + C + C
"""Fused loss: two reads of the BF16 logits forward, read + write of the gradient."""

OPTIMIZER_BYTES_PER_PARAM = 80.0 + 12.0
"""PyTorch's foreach AdamW on FP32 sharded state (weight decay r4w4, ``lerp_`` r4r4w4,
``mul_``/``addcmul_`` r4w4 + r4r4w4, sqrt, bias-correction divide and eps add r4w4 each,
``addcdiv_`` r4r4r4w4 = 80 bytes) plus gradient-norm clipping (norm r4, scale r4w4)."""

FLOAT8_CAST_PER_INPUT = C + C + 1
"""torchao dynamic tensorwise float8, eager: one pass for the absolute maximum (r2), one to
scale and cast (r2w1) per element of every matmul operand cast to float8."""
FLOAT8_CAST_PER_INPUT_COMPILED = C + 1
"""Compiled, the absolute maximum is reduced inside the kernel that produces the operand
(the norm, the activation), leaving the scale-and-cast pass (r2w1)."""
FLOAT8_TRANSPOSED_COPY = 1 + 1
"""The column-major float8 copy of an operand that the weight-gradient matmul needs."""


@dataclass(frozen=True)
class BlockBytes:
    """Bytes per token of one unit's element-wise work, split by what they scale with:
    ``*_width`` bytes belong to tensors of the model width and the attention widths
    (h, q_dim, kv_dim; the ``t_h`` feature), ``*_intermediate`` to MLP-intermediate tensors
    (``t_i``)."""

    forward_width: float
    forward_intermediate: float
    backward_width: float
    backward_intermediate: float

    @property
    def forward(self) -> float:
        return self.forward_width + self.forward_intermediate

    @property
    def backward(self) -> float:
        return self.backward_width + self.backward_intermediate

    @property
    def total(self) -> float:
        return self.forward + self.backward


def _norm_bytes(spec: TransformerSpec, compiled: bool) -> tuple[float, float]:
    if compiled:
        return NORM_COMPILED_FWD, NORM_COMPILED_BWD
    if spec.norm is NormKind.RMSNORM:
        return RMSNORM_EAGER_FWD, RMSNORM_EAGER_BWD
    return LAYERNORM_FWD, LAYERNORM_BWD


def block_bytes(spec: TransformerSpec, compiled: bool = False) -> BlockBytes:
    """Element-wise bytes of one block per token, forward and backward."""
    h, q, kv, i = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.intermediate_size
    norms = 1 if spec.parallel_attention_mlp else 2
    nf, nb = _norm_bytes(spec, compiled)
    gqa = kv < q
    gated = spec.mlp_kind is MLPKind.GATED
    if compiled:
        rot_f = rot_b = ROTARY_COMPILED * (q + kv)
        # residual add fused into the next norm; the block's last add stays (graph boundary)
        res_f, res_b = ADD * h, 0.0
        fan_b = 0.0  # gradient sums fused into the norm backward
        mlp_f = (SWIGLU_COMPILED_FWD_PER_I if gated else GELU_COMPILED_FWD_PER_I) * i
        mlp_b = (SWIGLU_COMPILED_BWD_PER_I if gated else GELU_COMPILED_BWD_PER_I) * i
    else:
        rot_f, rot_b = ROTARY_EAGER_FWD * (q + kv), ROTARY_EAGER_BWD * (q + kv)
        res_f = res_b = 2 * ADD * h
        # x_norm feeds q, k and v (two sums); h_norm feeds gate and up (one sum, gated only)
        fan_b = ADD * h * (2 + (1 if gated else 0))
        mlp_f = (SWIGLU_EAGER_FWD_PER_I if gated else GELU_EAGER_FWD_PER_I) * i
        mlp_b = (SWIGLU_EAGER_BWD_PER_I if gated else GELU_EAGER_BWD_PER_I) * i
    # repeat_kv materialises K and V at query width (read kv, write q, twice); its backward
    # sums them back
    rep = 2 * C * (kv + q) if gqa else 0.0
    # attention output (b, heads, s, d) → (b, s, heads·d) contiguous copy, and its backward
    out_copy = COPY * q
    return BlockBytes(
        forward_width=float(norms * nf * h + rot_f + rep + out_copy + res_f),
        forward_intermediate=float(mlp_f),
        backward_width=float(norms * nb * h + rot_b + rep + out_copy + res_b + fan_b),
        backward_intermediate=float(mlp_b),
    )


def head_bytes(spec: TransformerSpec, compiled: bool = False) -> tuple[float, float, float, float]:
    """Final norm and the FP32 cross-entropy per token: (norm forward, loss forward,
    norm backward, loss backward) — the norm scales with h (``t_h``), the loss with V
    (``t_v``)."""
    nf, nb = _norm_bytes(spec, compiled)
    ce = (CROSS_ENTROPY_COMPILED_PER_V if compiled else CROSS_ENTROPY_EAGER_PER_V) * spec.vocab_size
    # the loss's forward passes are 40 % of its traffic (upcast + log_softmax, see above)
    return (nf * spec.hidden_size, 0.4 * ce, nb * spec.hidden_size, 0.6 * ce)


def float8_cast_bytes(spec: TransformerSpec, compiled: bool = False) -> BlockBytes:
    """Extra bytes per token of float8 matmuls in one block: every linear casts its input
    (forward) and its output gradient (backward) to float8 and keeps a transposed float8
    copy of the input for the weight gradient (torchao ``Float8Linear``)."""
    h, q, kv, i = spec.hidden_size, spec.q_dim, spec.kv_dim, spec.intermediate_size
    gated = spec.mlp_kind is MLPKind.GATED
    # inputs: x_norm to q, k, v; attention output to o; h_norm to gate/up (or up); MLP to down
    in_width = 3 * h + q + (2 if gated else 1) * h
    in_inter = i
    # output gradients: q, k, v, o, down (width) and gate/up (intermediate)
    out_width = q + 2 * kv + h + h
    out_inter = (2 if gated else 1) * i
    cast = FLOAT8_CAST_PER_INPUT_COMPILED if compiled else FLOAT8_CAST_PER_INPUT
    tcopy = FLOAT8_TRANSPOSED_COPY
    return BlockBytes(
        forward_width=float(cast * in_width),
        forward_intermediate=float(cast * in_inter),
        backward_width=float(cast * out_width + tcopy * (in_width + out_width)),
        backward_intermediate=float(cast * out_inter + tcopy * (in_inter + out_inter)),
    )
