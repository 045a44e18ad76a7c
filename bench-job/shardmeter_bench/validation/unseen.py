"""The headline accuracy check of ``validate``: Hugging Face ``LlamaForCausalLM`` models of
architectures the fit never saw — on a CPU eight (hidden 448–2048), on a GPU seven released
training-sized ones (hidden 2048–8192, at 4 k and 16 k tokens); multi-head, grouped-query and
multi-query attention; vocabularies 32 K–152 K, tied and untied — measured in the same
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

GPU_UNSEEN_SPECS: tuple[tuple[TransformerSpec, int], ...] = (
    # Training-sized released architectures (in Llama's architecture, shapes from their
    # config.json), for ``validate`` on a GPU: widths 2048-8192, multi-head, grouped-query and
    # multi-query attention, head dims 64 and 128; none is a catalog or preset shape.
    # Llama-2-7B (meta-llama/Llama-2-7b-hf): multi-head
    (_llama("llama-2-7b", 4096, 32, 32, 11008, 32000), 2),
    # Mistral-7B-v0.1 (mistralai/Mistral-7B-v0.1): grouped-query 32/8
    (_llama("mistral-7b", 4096, 32, 8, 14336, 32000), 2),
    # Qwen2.5-3B (Qwen/Qwen2.5-3B): 2048 wide, grouped-query 16/2, tied, 152k vocabulary
    (_llama("qwen2.5-3b", 2048, 16, 2, 11008, 151936, tie=True), 2),
    # Llama-3.2-3B (meta-llama/Llama-3.2-3B): grouped-query 24/8, tied
    (_llama("llama-3.2-3b", 3072, 24, 8, 8192, 128256, tie=True), 2),
    # Falcon-7B's width and heads (tiiuae/falcon-7b: 4544, 71 heads, multi-query) with a
    # SwiGLU MLP of its 4x width
    (_llama("falcon-7b-shape", 4544, 71, 1, 18176, 65024), 2),
    # Qwen2.5-14B (Qwen/Qwen2.5-14B): grouped-query 40/8, 152k vocabulary
    (_llama("qwen2.5-14b", 5120, 40, 8, 13824, 152064), 1),
    # Llama-3.1-70B's layer (meta-llama/Llama-3.1-70B): 8192 wide, grouped-query 64/8
    (_llama("llama-3.1-70b-layer", 8192, 64, 8, 28672, 128256), 1),
)
"""The unseen architectures of a full run on a GPU (`unseen_cases`)."""

GPU_SIZES = ((1, 4096), (2, 8192))
"""4 k and 16 k tokens per micro-batch: the sizes such models train at."""
FULL_SIZES = ((1, 128), (2, 256))
SMALL_SIZES = ((1, 32), (2, 64))
UNSEEN = "unseen"
"""`ValidationCase.suite` of these models."""


def unseen_cases(scale: str, device_type: str = "cpu") -> list[ValidationCase]:
    """The headline suite for ``--scale`` on ``--device``: CPU-sized widths on a CPU (and for
    ``small``), training-sized released architectures at 4-16 k tokens on a GPU."""
    if scale == "small":
        specs, sizes = SMALL_UNSEEN_SPECS, SMALL_SIZES
    elif device_type == "cuda":
        specs, sizes = GPU_UNSEEN_SPECS, GPU_SIZES
    else:
        specs, sizes = UNSEEN_SPECS, FULL_SIZES
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
