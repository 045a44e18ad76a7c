"""Compute profiling over the catalog: for each shape, the batch sweep (doubling until out
of memory or the scale's cap), per-unit samples, a peak-memory sample, and one AdamW
step sample at the shape's parameters per rank."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from shardmeter.cost.coefficients import ComputeSample, MemorySample
from shardmeter.cost.features import Target
from shardmeter.spec.model import TransformerSpec
from shardmeter_bench.compute import titan_block
from shardmeter_bench.compute.blocks import UnitModel, init_weights
from shardmeter_bench.compute.catalog import ScaleRange, Shape, batch_sweep
from shardmeter_bench.compute.profiling import profile_shape
from shardmeter_bench.device import (
    compute_clock,
    is_oom,
    peak_rss_bytes,
    release_memory,
    synchronize,
)
from shardmeter_bench.isolation import isolated
from shardmeter_bench.logs import get_logger, progress

log = get_logger(__name__)

CPU_OPTIMIZER_PARAM_BUDGET = 1 << 25
GPU_OPTIMIZER_PARAM_BUDGET = 1 << 30


@dataclass
class ComputeResult:
    compute: list[ComputeSample] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    oom_stops: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def extend(self, other: ComputeResult) -> None:
        self.compute += other.compute
        self.memory += other.memory
        self.oom_stops += other.oom_stops
        self.skipped += other.skipped


def shard_sizes(spec: TransformerSpec, gpus: int) -> list[int]:
    """Elements per rank of every parameter tensor of the full model, FSDP-style (each
    tensor split across ``gpus`` ranks), in the order embedding, head, layers."""
    h, q, kv, i, v = (
        spec.hidden_size,
        spec.q_dim,
        spec.kv_dim,
        spec.intermediate_size,
        spec.vocab_size,
    )
    per_layer = [h * q, h * kv, h * kv, q * h, *([h * i] * spec.mlp_matrices), h, h]
    tensors = [v * h, h] + ([] if spec.tie_embeddings else [v * h])
    tensors += per_layer * spec.num_layers
    return [math.ceil(n / gpus) for n in tensors]


def time_optimizer_step(
    spec: TransformerSpec, gpus: int, device: torch.device, repeats: int, budget: int
) -> tuple[float, float]:
    """(parameters stepped, median seconds) of ``torch.optim.AdamW`` over one rank's FP32
    shards, capped at ``budget`` elements (the whole shard set when it fits), with the fused
    implementation torchtitan uses by default (``optimizer.implementation = "fused"``). The
    for-loop default allocates temporaries the size of each tensor, so on a CPU its time per
    parameter depended on the tensors' sizes (1.7 ns with a few hundred tensors, 4.7 ns with
    one 33 M-element tensor that page-faults them): a 33 % fit error no model in parameters
    can remove. Fused: 0.45–0.54 ns per parameter over the same shapes."""
    sizes: list[int] = []
    total = 0
    for n in shard_sizes(spec, gpus):
        if sizes and total + n > budget:
            break
        sizes.append(min(n, budget))
        total += sizes[-1]
    params = [torch.zeros(n, device=device, requires_grad=True) for n in sizes]
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    opt.step()  # allocates the moments
    clock = compute_clock(device)
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = clock()
        opt.step()
        synchronize(device)
        times.append(clock() - start)
    return float(total), statistics.median(times)


def _samples(
    shape: Shape,
    batch: int,
    seconds: dict[Target, float],
    kernel_seconds: dict[Target, float] | None = None,
) -> list[ComputeSample]:
    model = shape.spec.model_dump(by_alias=False)
    kernels = kernel_seconds or {}
    return [
        ComputeSample(
            target=t,
            model=model,
            micro_batch=batch,
            seq_len=shape.seq_len,
            seconds=s,
            group=shape.name,
            kernel_seconds=kernels.get(t) or None,
        )
        for t, s in seconds.items()
        if s > 0
    ]


REFERENCE_BLOCK = "reference"
TORCHTITAN_BLOCK = "torchtitan"


def build_model(
    shape: Shape,
    blocks: int,
    block: str,
    device: torch.device,
    dtype: torch.dtype,
    max_seq_len: int,
) -> UnitModel:
    """The profiled model of ``shape`` on ``device`` in ``dtype``: the reference block, or
    torchtitan's Llama 3 block with the attention backend it runs on ``device``
    (`titan_block`), whose complex RoPE table keeps its dtype."""
    if block != TORCHTITAN_BLOCK:
        return UnitModel(shape.spec, blocks).to(device=device, dtype=dtype)
    titan_block.raise_recompile_limit()
    backend, _ = titan_block.backend(device)

    def factory(spec: TransformerSpec) -> torch.nn.Module:
        return titan_block.TitanBlock(spec, backend, max_seq_len)

    model = UnitModel(shape.spec, blocks, block_factory=factory).to(device=device)
    return model.to_floating(dtype)


def profile_one_shape(
    shape: Shape,
    scale: ScaleRange,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int,
    seed: int,
    block: str = REFERENCE_BLOCK,
) -> ComputeResult:
    """The batch sweep of one shape; an OOM ends the sweep (expected), never the run."""
    out = ComputeResult()
    model: UnitModel | None = None
    blocks = scale.blocks_per_model
    try:
        for k, batch in enumerate(batch_sweep(shape, scale)):
            try:
                if model is None:
                    model = build_model(shape, blocks, block, device, dtype, shape.seq_len)
                    init_weights(model, seed + shape.index)
                prof = profile_shape(
                    model,
                    batch,
                    shape.seq_len,
                    repeats,
                    seed=seed + batch,
                    kernel_diagnostic=k == 0,
                )
            except (torch.OutOfMemoryError, RuntimeError) as exc:
                if not is_oom(exc):
                    raise
                out.oom_stops.append(f"{shape.name}@{batch}")
                log.info("batch_sweep_oom", shape=shape.name, micro_batch=batch)
                model = None
                release_memory(device)
                break
            out.compute += _samples(shape, batch, prof.seconds, prof.kernel_seconds)
            if prof.peak_bytes > 0:
                out.memory.append(
                    MemorySample(
                        model=shape.spec.model_copy(update={"num_layers": blocks}).model_dump(
                            by_alias=False
                        ),
                        micro_batch=batch,
                        seq_len=shape.seq_len,
                        ranks=1,
                        peak_bytes=prof.peak_bytes,
                    )
                )
            log.debug(
                "shape_profiled",
                shape=shape.name,
                micro_batch=batch,
                **{t.value: round(s * 1e3, 3) for t, s in prof.seconds.items()},
            )
    finally:
        del model
        release_memory(device)
    if not out.compute:
        out.skipped.append(shape.name)
        log.warning("shape_skipped", shape=shape.name, reason="out of memory at micro-batch 1")
        return out
    budget = CPU_OPTIMIZER_PARAM_BUDGET if device.type == "cpu" else GPU_OPTIMIZER_PARAM_BUDGET
    try:
        params, seconds = time_optimizer_step(shape.spec, shape.gpus, device, repeats, budget)
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not is_oom(exc):
            raise
        log.info("optimizer_oom", shape=shape.name)
    else:
        out.compute.append(
            ComputeSample(
                target=Target.OPTIMIZER_STEP,
                model=shape.spec.model_dump(by_alias=False),
                micro_batch=1,
                seq_len=1,
                params_local=params,
                seconds=seconds,
                group=shape.name,
            )
        )
    finally:
        release_memory(device)
    return out


def profile_catalog(
    shapes: list[Shape],
    scale: ScaleRange,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int,
    seed: int,
    after_shape: Callable[[int], None] | None = None,
    block: str = REFERENCE_BLOCK,
) -> ComputeResult:
    """Every shape in order, each in a process of its own on a CPU (`isolation`);
    ``after_shape(k)`` runs after shape ``k`` (``validate`` measures its unseen models there,
    interleaved with the catalog)."""
    result = ComputeResult()
    started = time.perf_counter()
    for k, shape in enumerate(progress(shapes, total=len(shapes), desc="compute")):
        one = isolated(
            device,
            shape.name,
            profile_one_shape,
            shape,
            scale,
            device,
            dtype,
            repeats,
            seed,
            block,
        )
        result.extend(one)
        log.info(
            "shape_done",
            shape=shape.name,
            done=k + 1,
            of=len(shapes),
            samples=len(one.compute),
            elapsed_s=round(time.perf_counter() - started, 1),
            peak_rss_gib=round(peak_rss_bytes() / 2**30, 2),
        )
        if after_shape is not None:
            after_shape(k)
    return result
