"""The distributed half of ``validate``: real FSDP2 steps and collectives at unseen payloads.

FSDP2 layout, matching the simulator's units: ``fully_shard`` on every decoder layer, on the
input embedding when it is not tied to the LM head, and on the root (final norm + head,
plus the embedding when tied), over ``init_device_mesh(device, (world,))`` — Gloo on CPU,
NCCL on GPUs. BF16 runs use ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``.
A step is forward + backward + AdamW step; its time is the maximum over ranks, the figure
the median over repeats after two warm-up steps.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shardmeter_bench.collectives.distributed import DistContext, barrier
from shardmeter_bench.collectives.timing import CommPlan, measure
from shardmeter_bench.device import release_memory, synchronize, torch_device
from shardmeter_bench.logs import get_logger
from shardmeter_bench.validation.hf_models import build_hf_model, decoder_layers, input_embeddings
from shardmeter_bench.validation.measure import FsdpCase, hf_attention

log = get_logger(__name__)

WARMUP_STEPS = 2


@dataclass(frozen=True)
class DistributedValidation:
    cases: tuple[FsdpCase, ...]
    device_type: str
    bf16: bool
    repeats: int
    seed: int
    comm: CommPlan | None


def _shard(model: torch.nn.Module, mesh: Any, tied: bool, bf16: bool) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh}
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    if not tied:
        fully_shard(input_embeddings(model), **kwargs)
    fully_shard(model, **kwargs)


def measure_fsdp_step(
    ctx: DistContext, case: FsdpCase, job: DistributedValidation, mesh: Any
) -> float:
    """Median over repeats of the slowest rank's FSDP2 step seconds."""
    device = torch_device(job.device_type, ctx.local_rank)
    model = build_hf_model(case.spec, case.layers, device, torch.float32, job.seed)
    _shard(model, mesh, case.spec.tie_embeddings, job.bf16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # torchtitan's default
    gen = torch.Generator(device="cpu").manual_seed(job.seed + ctx.rank)
    ids = torch.randint(0, case.spec.vocab_size, (case.micro_batch, case.seq_len), generator=gen)
    ids = ids.to(device)

    def step() -> None:
        with hf_attention(device):  # the kernel predictions are made for
            model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    local = []
    for k in range(WARMUP_STEPS + job.repeats):
        barrier(job.device_type, ctx)
        start = time.perf_counter()
        step()
        synchronize(device)
        if k >= WARMUP_STEPS:
            local.append(time.perf_counter() - start)
    times = torch.tensor(local, dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return float(statistics.median(times.cpu().tolist()))


def distributed_validation_phase(
    ctx: DistContext, job: DistributedValidation
) -> dict[str, Any] | None:
    """`distributed.run_phase` entry: FSDP2 steps, then collectives; rank 0 returns both."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(job.device_type, (ctx.world_size,))
    steps = []
    for case in job.cases:
        seconds = measure_fsdp_step(ctx, case, job, mesh)
        release_memory(torch_device(job.device_type, ctx.local_rank))
        steps.append({"key": case.key, "seconds": seconds})
        log.info("fsdp_step_measured", model=case.key, step_s=round(seconds, 4))
    collectives = measure(ctx, job.comm) if job.comm is not None else []
    if not ctx.is_main:
        return None
    return {"steps": steps, "collectives": collectives}
