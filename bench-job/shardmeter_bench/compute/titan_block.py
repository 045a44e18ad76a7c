"""torchtitan 0.3.0's own Llama 3 block as the profiled block: the module a pool whose
runtime is torchtitan trains, with the attention backend that runtime builds.

Built from torchtitan's config builders exactly as its Llama 3 registry builds a layer
(``torchtitan/models/llama3/__init__.py``: ``Llama3TransformerBlock.Config`` with RMSNorms,
``make_gqa_config`` with fused QKV and complex RoPE, ``make_ffn_config``), the inner attention
from ``get_attention_config``:

* on CUDA, ``flex`` — FlexAttention compiled by torchtitan's own ``FlexAttention`` class
  (its Inductor options, max-autotune included) with a causal ``BlockMask`` built by
  torchtitan's ``create_attention_mask``, what a launched island runs; the coefficients
  document records ``attentionKernel: flex``;
* on a CPU FlexAttention has no backward ("FlexAttention does not support backward on CPU",
  torch 2.13), so a CPU run that asks for this block gets torchtitan's
  ``ScaledDotProductAttention`` (SDPA's own CPU kernel) in the same block, and the document
  records no kernel; the default CPU run profiles the reference block of
  `shardmeter_bench.compute.blocks` (the one the CPU accuracy figures were measured with).

torchtitan's attention compiles a kernel per input shape; each shape of the catalog is a new
compile (seconds to minutes with max-autotune), which is why the GPU catalog is short
(`catalog.FULL_GPU`). Dynamo's recompile limit is raised for the run so that a long catalog
never falls back to eager FlexAttention (which materialises the scores).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from shardmeter.spec.model import MLPKind, NormKind, TransformerSpec
from shardmeter.spec.training import AttentionKernel

RECOMPILE_LIMIT = 256
"""Dynamo's recompile limit while profiling (a shape of the catalog is a recompile)."""


def unavailable() -> str | None:
    """Why torchtitan's block cannot be profiled here (None: it can)."""
    try:
        import torchtitan.models.llama3.model  # noqa: F401
    except Exception as exc:  # any import failure means "not here", with its reason
        return f"torchtitan cannot be imported ({type(exc).__name__}: {exc})"
    return None


def unsupported(spec: TransformerSpec) -> str | None:
    """Why ``spec`` is not a torchtitan Llama 3 block (None: it is)."""
    if spec.mlp_kind is not MLPKind.GATED or spec.norm is not NormKind.RMSNORM:
        return "torchtitan's Llama 3 block is RMSNorm + SwiGLU"
    if spec.parallel_attention_mlp or spec.linear_bias:
        return "torchtitan's Llama 3 block has sequential attention/MLP and no biases"
    return None


def backend(device: torch.device) -> tuple[str, AttentionKernel | None]:
    """(torchtitan attention backend, kernel the document records) on ``device``."""
    if device.type == "cuda":
        return "flex", AttentionKernel.FLEX
    return "sdpa", None


class TitanBlock(nn.Module):
    """One torchtitan Llama 3 block; ``forward(x)`` builds (and caches) the attention mask
    its backend needs for x's batch and sequence length."""

    def __init__(self, spec: TransformerSpec, attention_backend: str, max_seq_len: int) -> None:
        super().__init__()
        from torchtitan.models.common import ComplexRoPE, RMSNorm
        from torchtitan.models.common.attention import ScaledDotProductAttention
        from torchtitan.models.common.config_utils import (
            get_attention_config,
            make_ffn_config,
            make_gqa_config,
        )
        from torchtitan.models.llama3.model import Llama3TransformerBlock

        init = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
        norm = {"weight": nn.init.ones_}
        inner = (
            ScaledDotProductAttention.Config()
            if attention_backend == "sdpa"
            else get_attention_config(attention_backend)
        )
        h = spec.hidden_size
        config = Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=h, param_init=norm),
            ffn_norm=RMSNorm.Config(normalized_shape=h, param_init=norm),
            attention=make_gqa_config(
                dim=h,
                n_heads=spec.num_attention_heads,
                n_kv_heads=spec.kv_heads,
                head_dim=spec.head_width,
                wqkv_param_init=init,
                wo_param_init=init,
                inner_attention=inner,
                fuse_qkv=True,
                rope=ComplexRoPE.Config(
                    dim=spec.head_width, max_seq_len=max_seq_len, theta=500000, scaling="llama"
                ),
            ),
            feed_forward=make_ffn_config(
                dim=h,
                hidden_dim=spec.intermediate_size,
                w1_param_init=init,
                w2w3_param_init=init,
            ),
        )
        self.block = config.build()
        self.attention_backend = attention_backend
        self._masks: dict[tuple[int, int, str], Any] = {}

    def _mask(self, x: torch.Tensor) -> Any:
        if self.attention_backend != "flex":
            return None
        b, s = x.shape[0], x.shape[1]
        key = (b, s, str(x.device))
        if key not in self._masks:
            from torchtitan.models.common.attention import (
                create_attention_mask,
                get_causal_mask_mod,
            )

            self._masks[key] = create_attention_mask(
                get_causal_mask_mod(), b, None, s, s, device=x.device
            )
        return self._masks[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.block(x, self._mask(x))
        return out


def raise_recompile_limit() -> None:
    """Let Dynamo compile FlexAttention for every shape of the catalog (module docstring)."""
    import torch._dynamo

    config: Any = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
