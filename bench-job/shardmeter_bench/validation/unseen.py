"""The headline accuracy check of ``validate``: Hugging Face ``LlamaForCausalLM`` models of
eight architectures the fit never saw (hidden 448–2048; multi-head, grouped-query and
multi-query attention; vocabularies 32 K–152 K, tied and untied), measured in the same
process as the catalog and *interleaved with it* — a model after every few catalog shapes,
each model twice, in the first and in the second half of the catalog, its timed iterations
pooled (`runconfig.VALIDATION_PASSES`) — so a host whose speed drifts over minutes drifts for
the fit and the truth alike.

Each model is built at 2–4 layers and timed at two sizes; the error of each (model, size)
point counts, and the report gives the median and the maximum over the points for forward
and for backward separately (the goal: median ≤ 10 %, max ≤ 20 %, in every run).
"""

from __future__ import annotations

from shardmeter.spec.model import TransformerSpec
from shardmeter_bench.validation.measure import ValidationCase


def _llama(
    key: str,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    tie: bool = False,
) -> TransformerSpec:
    return TransformerSpec(
        name=key,
        hidden_size=hidden,
        num_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tie_embeddings=tie,
    )


UNSEEN_SPECS: tuple[tuple[TransformerSpec, int], ...] = (
    # (architecture, layers built); none is drawn by the catalog (`generate_catalog` excludes
    # them) and three take their shapes from released models.
    (_llama("llama-h448-mha", 448, 7, 7, 1216, 32000), 4),
    # SmolLM-135M (HuggingFaceTB/SmolLM-135M config.json)
    (_llama("smollm-135m", 576, 9, 3, 1536, 49152, tie=True), 4),
    (_llama("llama-h768-mha", 768, 12, 12, 2048, 50304), 4),
    # Qwen2.5-0.5B's shape (Qwen/Qwen2.5-0.5B config.json) in Llama's architecture
    (_llama("qwen2.5-0.5b-shape", 896, 14, 2, 4864, 151936, tie=True), 2),
    (_llama("llama-h1280-mqa", 1280, 10, 1, 3456, 64000), 2),
    (_llama("llama-h1536-gqa", 1536, 12, 4, 4096, 50304), 2),
    (_llama("llama-h1792-mha", 1792, 14, 14, 4864, 32768), 2),
    # TinyLlama-1.1B (TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T config.json)
    (_llama("tinyllama-1.1b", 2048, 32, 4, 5632, 32000), 2),
)
"""The eight unseen Llama architectures of a full run."""

SMALL_UNSEEN_SPECS: tuple[tuple[TransformerSpec, int], ...] = (
    (_llama("tiny-h96-mha", 96, 3, 3, 256, 1000), 2),
    (_llama("tiny-h160-gqa", 160, 5, 1, 448, 3000), 2),
    (_llama("tiny-h192-gqa", 192, 6, 2, 640, 2500, tie=True), 2),
)
"""Small look-alikes (multi-head, multi-query, grouped-query) for quick runs and tests."""

FULL_SIZES = ((1, 128), (2, 256))
SMALL_SIZES = ((1, 32), (2, 64))
UNSEEN = "unseen"
"""`ValidationCase.suite` of these models."""


def unseen_cases(scale: str) -> list[ValidationCase]:
    """The headline suite for ``--scale`` (the same on every device: CPU-sized widths)."""
    specs, sizes = (
        (SMALL_UNSEEN_SPECS, SMALL_SIZES) if scale == "small" else (UNSEEN_SPECS, FULL_SIZES)
    )
    return [ValidationCase(spec.name, spec, layers, sizes, UNSEEN) for spec, layers in specs]


def interleave_schedule(catalog_shapes: int, cases: int) -> dict[int, list[int]]:
    """After which catalog shape (index) each case is measured: spread evenly, the last case
    after the last shape; with no catalog, every case "after" index -1 (straight away)."""
    if catalog_shapes <= 0:
        return {-1: list(range(cases))} if cases else {}
    schedule: dict[int, list[int]] = {}
    for j in range(cases):
        after = -(-(j + 1) * catalog_shapes // cases) - 1  # ⌈(j+1)·shapes/cases⌉ − 1
        schedule.setdefault(after, []).append(j)
    return schedule
