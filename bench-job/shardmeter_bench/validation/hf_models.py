"""Whole models for validation, built from the real Hugging Face ``transformers``
implementations of the preset architectures (random init, reduced depth, no hub download):
what users train, not the benchmark's own block.

* Llama family (``LlamaConfig`` + ``LlamaForCausalLM``): SmolLM, Llama 3.x, Yi;
* ``PhiConfig`` + ``PhiForCausalLM``: parallel attention/MLP, GELU MLP, LayerNorm, biases;
* ``GemmaConfig`` + ``GemmaForCausalLM``: head_dim 256, multi-query attention, GeGLU.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from shardmeter.spec.model import MLPKind, TransformerSpec


def hf_family(spec: TransformerSpec) -> str:
    if spec.mlp_kind is MLPKind.PLAIN and spec.parallel_attention_mlp:
        return "phi"
    if "gemma" in spec.name.lower():
        return "gemma"
    return "llama"


def hf_config(spec: TransformerSpec, layers: int, max_positions: int = 4096) -> Any:
    from transformers import GemmaConfig, LlamaConfig, PhiConfig

    common: dict[str, Any] = {
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.kv_heads,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tie_embeddings,
        "max_position_embeddings": max_positions,
        "attn_implementation": "sdpa",
    }
    family = hf_family(spec)
    if family == "phi":
        return PhiConfig(**common)
    if family == "gemma":
        return GemmaConfig(**common, head_dim=spec.head_width)
    return LlamaConfig(**common, head_dim=spec.head_width)


def build_hf_model(
    spec: TransformerSpec,
    layers: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    max_positions: int = 4096,
) -> nn.Module:
    """A randomly initialised ``*ForCausalLM`` of ``layers`` layers, in training mode."""
    from transformers import GemmaForCausalLM, LlamaForCausalLM, PhiForCausalLM

    classes = {"llama": LlamaForCausalLM, "phi": PhiForCausalLM, "gemma": GemmaForCausalLM}
    torch.manual_seed(seed)
    model: nn.Module = classes[hf_family(spec)](hf_config(spec, layers, max(4096, max_positions)))
    model.to(device=device, dtype=dtype)
    model.train()
    return model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a Hugging Face causal LM (``model.model.layers``)."""
    layers: list[nn.Module] = list(cast(Any, model).model.layers)
    return layers


def input_embeddings(model: nn.Module) -> nn.Module:
    """The token embedding of a Hugging Face causal LM (``model.model.embed_tokens``)."""
    embedding: nn.Module = cast(Any, model).model.embed_tokens
    return embedding
