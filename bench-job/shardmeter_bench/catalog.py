"""The seeded catalog of transformer shapes to profile (paper §III-A, Table I).

``full`` draws inside the paper's Table I ranges: attention heads 16–32, hidden size
960–4096, layers 16–32, intermediate size 2560–24576, key/value heads 4–8 and 1–16 GPUs.
``small`` is a CPU range for tests and quick runs. The same ``seed`` always gives the same
shapes; ``configs`` caps how many (the paper uses at most 200).

The batch is doubled until out of memory (the caller stops the sweep on the OOM) or until a
scale-specific cap: a token cap bounds the run time on GPUs; on CPUs, where "out of memory"
would mean swapping for minutes, a cap on an iteration's FLOPs (forward + backward of the
profiled blocks and head) bounds it too. A CPU shape drawn with a sequence length over that cap
falls back to a shorter one; micro-batch 1 is always measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from shardmeter.spec.model import TransformerSpec

MAX_CONFIGS = 1000


@dataclass(frozen=True)
class ScaleRange:
    """Where shapes are drawn from and how far the batch sweep goes."""

    name: str
    heads: tuple[int, int]
    kv_heads: tuple[int, ...]
    hidden: tuple[int, int]
    layers: tuple[int, int]
    intermediate: tuple[int, int]
    intermediate_ratio: tuple[float, float]
    """Intermediate size drawn log-uniformly in this multiple of the hidden size (clipped
    to ``intermediate``), as real models keep i/h between about 2.5 and 8."""
    vocab: tuple[int, ...]
    gpus: tuple[int, int]
    seq_lens: tuple[int, ...]
    head_dim_multiple: int
    intermediate_multiple: int
    max_batch: int
    max_tokens: int
    blocks_per_model: int
    """Transformer blocks instantiated per profiled shape (each one gives a sample)."""
    default_configs: int
    max_iteration_flops: float | None = None
    """CPU only: cap on one profiled iteration's FLOPs (seq fallback and batch doubling)."""


SMALL = ScaleRange(
    name="small",
    heads=(2, 8),
    kv_heads=(1, 2, 4),
    hidden=(64, 256),
    layers=(2, 4),
    intermediate=(128, 1024),
    intermediate_ratio=(2.0, 6.0),
    vocab=(512, 1024, 2048, 4096),
    gpus=(1, 16),
    seq_lens=(32, 64),
    head_dim_multiple=8,
    intermediate_multiple=16,
    max_batch=4,
    max_tokens=256,
    blocks_per_model=2,
    default_configs=12,
)

FULL_GPU = ScaleRange(
    name="full",
    heads=(16, 32),
    kv_heads=(4, 8),
    hidden=(960, 4096),
    layers=(16, 32),
    intermediate=(2560, 24576),
    intermediate_ratio=(2.5, 8.0),
    vocab=(32000, 32768, 49152, 50304, 64000, 100352, 128256, 151936),
    gpus=(1, 16),
    seq_lens=(512, 1024, 2048, 4096),
    head_dim_multiple=8,
    intermediate_multiple=64,
    max_batch=256,
    max_tokens=65536,
    blocks_per_model=2,
    default_configs=200,
)

FULL_CPU = ScaleRange(
    name="full",
    heads=FULL_GPU.heads,
    kv_heads=FULL_GPU.kv_heads,
    hidden=FULL_GPU.hidden,
    layers=FULL_GPU.layers,
    intermediate=FULL_GPU.intermediate,
    intermediate_ratio=FULL_GPU.intermediate_ratio,
    vocab=(32000, 32768, 49152, 50304, 64000, 100352, 128256),
    gpus=FULL_GPU.gpus,
    seq_lens=(128, 256),
    head_dim_multiple=8,
    intermediate_multiple=64,
    max_batch=8,
    max_tokens=1024,
    blocks_per_model=1,
    default_configs=16,
    max_iteration_flops=250e9,
)


def scale_range(scale: str, device_type: str) -> ScaleRange:
    """The range for ``--scale`` on ``--device``: the table I shapes are the same on CPU and
    GPU; sequence lengths, batch caps and blocks per shape differ."""
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


def _draw(rng: np.random.Generator, scale: ScaleRange, index: int) -> Shape | None:
    kv = int(rng.choice(scale.kv_heads))
    heads_choices = [h for h in range(scale.heads[0], scale.heads[1] + 1) if h % kv == 0]
    if not heads_choices:
        return None
    heads = int(rng.choice(heads_choices))
    m = scale.head_dim_multiple
    lo = math.ceil(scale.hidden[0] / heads / m) * m
    hi = (scale.hidden[1] // heads) // m * m
    if lo > hi:
        return None
    head_dim = int(rng.integers(lo // m, hi // m + 1)) * m
    hidden = heads * head_dim
    i_lo = max(scale.intermediate[0], scale.intermediate_ratio[0] * hidden)
    i_hi = min(scale.intermediate[1], scale.intermediate_ratio[1] * hidden)
    if i_lo > i_hi:
        i_lo, i_hi = scale.intermediate
    im = scale.intermediate_multiple
    inter = float(np.exp(rng.uniform(np.log(i_lo), np.log(i_hi))))
    inter_int = int(min(max(round(inter / im) * im, scale.intermediate[0]), scale.intermediate[1]))
    spec = TransformerSpec(
        name=f"{scale.name}-{index:03d}",
        hidden_size=hidden,
        num_layers=int(rng.integers(scale.layers[0], scale.layers[1] + 1)),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter_int,
        vocab_size=int(rng.choice(scale.vocab)),
        tie_embeddings=False,
    )
    seq_len = int(rng.choice(scale.seq_lens))
    gpus = int(rng.integers(scale.gpus[0], scale.gpus[1] + 1))
    shape = Shape(index=index, spec=spec, seq_len=seq_len, gpus=gpus)
    cap = scale.max_iteration_flops
    for shorter in sorted((s for s in scale.seq_lens if s < seq_len), reverse=True):
        if cap is None or shape.iteration_flops(1, scale.blocks_per_model) <= cap:
            break
        shape = Shape(index=index, spec=spec, seq_len=shorter, gpus=gpus)
    return shape


def generate_catalog(scale: ScaleRange, configs: int, seed: int = 0) -> list[Shape]:
    """``configs`` distinct shapes drawn with ``seed`` (deterministic)."""
    if not 1 <= configs <= MAX_CONFIGS:
        raise ValueError(f"configs must be between 1 and {MAX_CONFIGS} (got {configs})")
    rng = np.random.default_rng(seed)
    shapes: list[Shape] = []
    seen: set[tuple[int, ...]] = set()
    attempts = 0
    while len(shapes) < configs:
        attempts += 1
        if attempts > 100 * configs:
            raise RuntimeError(f"could not draw {configs} distinct shapes from {scale.name}")
        shape = _draw(rng, scale, len(shapes))
        if shape is None:
            continue
        s = shape.spec
        key = (
            s.hidden_size,
            s.num_attention_heads,
            s.kv_heads,
            s.intermediate_size,
            s.vocab_size,
            shape.seq_len,
        )
        if key in seen:
            continue
        seen.add(key)
        shapes.append(shape)
    return shapes


def batch_sweep(shape: Shape, scale: ScaleRange) -> Iterator[int]:
    """Micro-batches 1, 2, 4, … up to the scale's caps; the caller stops at the first OOM."""
    batch = 1
    while batch <= scale.max_batch and (batch == 1 or batch * shape.seq_len <= scale.max_tokens):
        cap = scale.max_iteration_flops
        if (
            batch > 1
            and cap is not None
            and shape.iteration_flops(batch, scale.blocks_per_model) > cap
        ):
            return
        yield batch
        batch *= 2
