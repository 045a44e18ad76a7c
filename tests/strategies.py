"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from shardmeter.spec.model import MLPKind, TransformerSpec


@st.composite
def transformer_specs(draw: st.DrawFn, max_hidden_heads: int = 64) -> TransformerSpec:
    head_dim = draw(st.sampled_from([32, 64, 128]))
    kv = draw(st.integers(1, 8))
    group = draw(st.integers(1, 4))
    heads = kv * group
    return TransformerSpec(
        name="random",
        hidden_size=heads * head_dim,
        num_layers=draw(st.integers(1, 48)),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=draw(st.integers(64, 32768)),
        vocab_size=draw(st.integers(1000, 200_000)),
        tie_embeddings=draw(st.booleans()),
        mlp_kind=draw(st.sampled_from(list(MLPKind))),
    )
