"""The seeded catalog of transformer shapes to profile (paper §III-A, Table I).

``full`` on a GPU draws inside the paper's Table I ranges (attention heads 16–32, hidden size
960–4096, layers 16–32, intermediate size 2560–24576, 1–16 GPUs), with one departure: the
key/value heads cover what real models use — multi-head (kv = heads: GPT-2, Pythia, Llama-2
7B), grouped-query (kv = heads/2 … heads/8: Llama 3, Qwen, SmolLM) and multi-query (kv = 1:
Gemma-2B, Falcon) — not only Table I's 4–8, because a fit that never saw kv = heads
over-predicted multi-head models by ~15 %. Head widths are the ones real models use (64, 80,
96, 128, 256). ``full`` on a CPU draws the same kinds of shapes at the widths a CPU can
profile (hidden 256–2560), under a memory budget. A quarter of the shapes tie the LM head
to the embedding, as many small models do. ``small`` is a CPU range for tests and
quick runs. The same ``seed`` always gives the same shapes; ``configs`` caps how many (the
paper uses at most 200); ``exclude`` keeps the validation architectures out.

The batch is doubled until out of memory (the caller stops the sweep on the OOM) or until a
scale-specific cap: a token cap bounds the run time on GPUs; on CPUs, where "out of memory"
would mean swapping for minutes or the OOM killer, a cap on an iteration's FLOPs and a
memory budget (`footprint.process_bytes`) bound it too: vocabularies whose embedding and
head would not fit are not drawn for that width, and a CPU shape drawn with a sequence length
over the FLOP cap falls back to a shorter one; micro-batch 1 is always measured.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import numpy as np

from shardmeter.spec.model import TransformerSpec
from shardmeter_bench.compute.footprint import process_bytes

MAX_CONFIGS = 1000
MQA = 0
"""In `ScaleRange.kv_groups`: every query head shares one key/value head."""


@dataclass(frozen=True)
class ScaleRange:
    """Where shapes are drawn from and how far the batch sweep goes."""

    name: str
    heads: tuple[int, int]
    head_dims: tuple[int, ...]
    """Per-head widths drawn from (hidden = heads × head_dim, inside ``hidden``)."""
    kv_groups: tuple[int, ...]
    """Query heads per key/value head drawn from (those dividing the heads): 1 is multi-head
    attention, `MQA` (0) multi-query, the rest grouped-query."""
    hidden: tuple[int, int]
    layers: tuple[int, int]
    intermediate: tuple[int, int]
    intermediate_ratio: tuple[float, float]
    """Intermediate size drawn log-uniformly in this multiple of the hidden size (clipped
    to ``intermediate``), as real models keep i/h between about 2.5 and 8."""
    vocab: tuple[int, ...]
    gpus: tuple[int, int]
    seq_lens: tuple[int, ...]
    intermediate_multiple: int
    max_batch: int
    max_tokens: int
    blocks_per_model: int
    """Transformer blocks instantiated per profiled shape (each one gives a sample)."""
    default_configs: int
    max_iteration_flops: float | None = None
    """CPU only: cap on one profiled iteration's FLOPs (seq fallback and batch doubling)."""
    tied_fraction: float = 0.25
    """Share of shapes whose LM head shares the embedding's matrix (Llama-3.2, Gemma,
    Qwen2.5-0.5B and SmolLM do)."""
    max_process_bytes: float | None = None
    """CPU only: budget for the profiling process's peak memory (`footprint.process_bytes`);
    the compute run's measured peak RSS stays under it (`benchmarks/bench_compute_memory.py`)."""
    batch_factor: int = 2
    """The batch sweep multiplies the micro-batch by this."""
    min_tokens: int = 0
    """The sweep starts at the smallest power-of-two micro-batch with at least this many
    tokens (micro-batch 1 at longer sequences)."""


SMALL = ScaleRange(
    name="small",
    heads=(2, 8),
    head_dims=(16, 32),
    kv_groups=(1, 2, 4, MQA),
    hidden=(64, 256),
    layers=(2, 4),
    intermediate=(128, 1024),
    intermediate_ratio=(2.0, 6.0),
    vocab=(512, 1024, 2048, 4096),
    gpus=(1, 16),
    seq_lens=(32, 64),
    intermediate_multiple=16,
    max_batch=4,
    max_tokens=256,
    blocks_per_model=2,
    default_configs=12,
)

FULL_GPU = ScaleRange(
    name="full",
    heads=(16, 32),
    head_dims=(64, 80, 96, 128, 256),
    kv_groups=(1, 2, 4, 8, MQA),
    hidden=(960, 4096),
    layers=(16, 32),
    intermediate=(2560, 24576),
    intermediate_ratio=(2.5, 8.0),
    vocab=(32000, 32768, 49152, 50304, 64000, 100352, 128256, 151936),
    gpus=(1, 16),
    seq_lens=(1024, 2048, 4096, 8192),
    intermediate_multiple=64,
    max_batch=256,
    max_tokens=65536,
    blocks_per_model=2,
    default_configs=16,
    batch_factor=4,
    min_tokens=2048,
)
"""A pool profile in minutes: 16 architectures, micro-batches ×4 from 2 k tokens up to 64 k
(2-3 per shape: the training sizes, where the GPU rather than the host sets the time). The
first H200 run (8 shapes, micro-batches ×2 from 512 tokens, profiler on every iteration)
took 13 s a shape; its block targets' leave-one-model-out error was 4.5-5 % at 3 repeats,
so 3 repeats (× 2 blocks) stay enough. Estimate for the default on one H200: ~6 s a shape
of measuring, ~2 min in all, plus torchtitan's FlexAttention compiles (4.5-7.5 s each
measured for ``torch.compile(flex_attention)``, more with torchtitan's max-autotune, not
measured yet: ``benchmarks/gpu/bench_job_cuda.sh`` times it)."""

FULL_CPU = ScaleRange(
    name="full",
    heads=(4, 32),
    head_dims=(64, 80, 96, 128),
    kv_groups=FULL_GPU.kv_groups,
    hidden=(256, 2560),
    layers=FULL_GPU.layers,
    intermediate=(640, 12288),
    intermediate_ratio=(2.5, 6.0),
    vocab=(32000, 32768, 49152, 50304, 64000, 100352, 128256),
    gpus=FULL_GPU.gpus,
    seq_lens=(128, 256, 512),
    intermediate_multiple=64,
    max_batch=8,
    max_tokens=1024,
    blocks_per_model=1,
    default_configs=24,
    max_iteration_flops=160e9,
    max_process_bytes=5.0 * 2**30,
)


def scale_range(scale: str, device_type: str) -> ScaleRange:
    """The range for ``--scale`` on ``--device``: the same kinds of architecture on CPU and
    GPU; widths, sequence lengths, batch caps, blocks per shape and budgets differ."""
    if scale == "small":
        return SMALL
    if scale == "full":
        return FULL_CPU if device_type == "cpu" else FULL_GPU
    raise ValueError(f"unknown scale {scale!r}")


@dataclass(frozen=True)
class Shape:
    """One catalog entry: an architecture (its ``num_layers`` is the full model's, used
    for the optimizer-step sample), a sequence length and the GPUs its state is sharded on."""

    index: int
    spec: TransformerSpec
    seq_len: int
    gpus: int

    @property
    def name(self) -> str:
        return self.spec.name

    def iteration_flops(self, micro_batch: int, blocks: int) -> float:
        """Forward + backward FLOPs of one profiled iteration (``blocks`` blocks + head)."""
        tokens = micro_batch * self.seq_len
        forward = blocks * self.spec.block_forward_flops(tokens, self.seq_len)
        forward += self.spec.head_forward_flops(tokens)
        return 3.0 * forward


def architecture_key(spec: TransformerSpec) -> tuple[int, ...]:
    """What makes two shapes the same architecture for the fit (vocabulary included)."""
    return (
        spec.hidden_size,
        spec.num_attention_heads,
        spec.kv_heads,
        spec.head_width,
        spec.intermediate_size,
        spec.vocab_size,
    )


def _fits(scale: ScaleRange, spec: TransformerSpec, micro_batch: int, seq_len: int) -> bool:
    if scale.max_process_bytes is None:
        return True
    used = process_bytes(spec, scale.blocks_per_model, micro_batch, seq_len)
    return used <= scale.max_process_bytes


def _draw(rng: np.random.Generator, scale: ScaleRange, index: int) -> Shape | None:
    head_dim = int(rng.choice(scale.head_dims))
    group = int(rng.choice(scale.kv_groups))
    step = max(group, 1)  # grouped-query: heads a multiple of the group
    target = float(np.exp(rng.uniform(np.log(scale.hidden[0]), np.log(scale.hidden[1]))))
    fewest = max(scale.heads[0], 2 * group)  # grouped-query keeps ≥ 2 key/value heads
    heads = round(target / head_dim / step) * step
    heads = min(max(heads, math.ceil(fewest / step) * step), scale.heads[1] // step * step)
    if not (scale.heads[0] <= heads and scale.hidden[0] <= heads * head_dim <= scale.hidden[1]):
        return None
    kv = 1 if group == MQA else heads // group
    hidden = heads * head_dim
    i_lo = max(scale.intermediate[0], scale.intermediate_ratio[0] * hidden)
    i_hi = min(scale.intermediate[1], scale.intermediate_ratio[1] * hidden)
    if i_lo > i_hi:
        i_lo, i_hi = scale.intermediate
    im = scale.intermediate_multiple
    inter = float(np.exp(rng.uniform(np.log(i_lo), np.log(i_hi))))
    inter_int = int(min(max(round(inter / im) * im, scale.intermediate[0]), scale.intermediate[1]))
    layers = int(rng.integers(scale.layers[0], scale.layers[1] + 1))
    seq_len = int(rng.choice(scale.seq_lens))
    gpus = int(rng.integers(scale.gpus[0], scale.gpus[1] + 1))
    tied = bool(rng.random() < scale.tied_fraction)
    vocab_draw = rng.permutation(len(scale.vocab))
    spec = None
    for k in vocab_draw:  # the first vocabulary (in drawn order) that fits the budget
        candidate = TransformerSpec(
            name=f"{scale.name}-{index:03d}",
            hidden_size=hidden,
            num_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            intermediate_size=inter_int,
            vocab_size=int(scale.vocab[k]),
            tie_embeddings=tied,
        )
        if _fits(scale, candidate, 1, min(scale.seq_lens)):
            spec = candidate
            break
    if spec is None:
        return None
    shape = Shape(index=index, spec=spec, seq_len=seq_len, gpus=gpus)
    cap = scale.max_iteration_flops
    for shorter in sorted((s for s in scale.seq_lens if s < seq_len), reverse=True):
        too_many_flops = cap is not None and shape.iteration_flops(1, scale.blocks_per_model) > cap
        if not too_many_flops and _fits(scale, spec, 1, shape.seq_len):
            break
        shape = Shape(index=index, spec=spec, seq_len=shorter, gpus=gpus)
    return shape


def generate_catalog(
    scale: ScaleRange, configs: int, seed: int = 0, exclude: Collection[TransformerSpec] = ()
) -> list[Shape]:
    """``configs`` distinct shapes drawn with ``seed`` (deterministic), none of them the
    architecture of a spec in ``exclude`` (the models validation measures)."""
    if not 1 <= configs <= MAX_CONFIGS:
        raise ValueError(f"configs must be between 1 and {MAX_CONFIGS} (got {configs})")
    rng = np.random.default_rng(seed)
    shapes: list[Shape] = []
    seen = {architecture_key(s) for s in exclude}
    attempts = 0
    while len(shapes) < configs:
        attempts += 1
        if attempts > 100 * configs:
            raise RuntimeError(f"could not draw {configs} distinct shapes from {scale.name}")
        shape = _draw(rng, scale, len(shapes))
        if shape is None:
            continue
        key = architecture_key(shape.spec)
        if key in seen:
            continue
        seen.add(key)
        shapes.append(shape)
    return shapes


def batch_sweep(shape: Shape, scale: ScaleRange) -> Iterator[int]:
    """Micro-batches from the first with ``min_tokens`` tokens (1 for most scales), times
    ``batch_factor`` each (2: 1, 2, 4, …), up to the scale's caps (tokens, FLOPs, memory);
    the caller stops at the first OOM."""
    batch = 1
    while (
        batch * shape.seq_len < scale.min_tokens and 2 * batch * shape.seq_len <= scale.max_tokens
    ):
        batch *= 2
    first = batch
    while batch <= scale.max_batch and (
        batch == first or batch * shape.seq_len <= scale.max_tokens
    ):
        cap = scale.max_iteration_flops
        if batch > first and (
            (cap is not None and shape.iteration_flops(batch, scale.blocks_per_model) > cap)
            or not _fits(scale, shape.spec, batch, shape.seq_len)
        ):
            return
        yield batch
        batch *= scale.batch_factor
