"""Collective benchmarks (paper §IV-A): all_gather, reduce_scatter and all_reduce over
payloads of 1 KiB–150 MiB, inside a node and across nodes.

``payload_bytes`` is always the full, unsharded tensor D (what the ring model
``T = k·(P−1)·(L + β·D/P)`` takes): all_gather gathers D from shards of D/P, reduce_scatter
reduces D into shards of D/P, all_reduce reduces D. Each timing is a loop of K operations
between barriers (K chosen so the loop lasts at least ``min_loop_s``, agreed by all ranks);
a repeat's time is the maximum over ranks, the sample the median over repeats.

Groups: inside a node, every size P in {2, 4, 8, …, local ranks} that divides the node's
ranks (all nodes' groups run at once); across nodes, one group per local rank index (the
GPU's own NIC rail), all rails at once.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shardmeter.cost.coefficients import COLLECTIVES, CommSample, LinkRole
from shardmeter_bench.collectives.distributed import DistContext, barrier
from shardmeter_bench.device import synchronize, torch_device
from shardmeter_bench.logs import get_logger

log = get_logger(__name__)

KIB, MIB = 1024, 1024 * 1024

FULL_PAYLOADS = (
    1 * KIB,
    8 * KIB,
    64 * KIB,
    512 * KIB,
    2 * MIB,
    8 * MIB,
    32 * MIB,
    64 * MIB,
    150 * MIB,
)
SMALL_PAYLOADS = (1 * KIB, 16 * KIB, 256 * KIB, 1 * MIB, 4 * MIB)
VALIDATION_PAYLOADS = (4 * KIB, 192 * KIB, 3 * MIB, 20 * MIB, 100 * MIB)
"""Payloads the fit never saw (between its sizes), for the accuracy report."""
SMALL_VALIDATION_PAYLOADS = (4 * KIB, 64 * KIB, 512 * KIB, 2 * MIB)


@dataclass(frozen=True)
class CommPlan:
    payloads: tuple[int, ...]
    collectives: tuple[str, ...] = COLLECTIVES
    repeats: int = 5
    min_loop_s: float = 0.02
    max_ops: int = 200
    device_type: str = "cpu"
    intra_node: bool = True
    inter_node: bool = True


def _op(name: str) -> Callable[..., Any]:
    if name == "all_gather":
        return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    if name == "reduce_scatter":
        return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if name == "all_reduce":
        return dist.all_reduce
    raise ValueError(f"unknown collective {name!r}")


def _buffers(
    name: str, payload: int, ranks: int, device: torch.device
) -> tuple[Callable[[Any], Any], int]:
    """A closure running one collective on a group, and the exact payload in bytes."""
    numel = max(1, round(payload / 4 / ranks)) * ranks
    full = torch.ones(numel, device=device)
    op = _op(name)
    if name == "all_reduce":
        return (lambda g: op(full, group=g)), numel * 4
    shard = torch.ones(numel // ranks, device=device)
    if name == "all_gather":
        return (lambda g: op(full, shard, group=g)), numel * 4
    return (lambda g: op(shard, full, group=g)), numel * 4


def time_collective(
    ctx: DistContext,
    name: str,
    payload: int,
    ranks: int,
    group: Any,
    plan: CommPlan,
) -> tuple[float, int]:
    """(median over repeats of the max over ranks of seconds per op, exact payload bytes)."""
    device = torch_device(plan.device_type, ctx.local_rank)
    run, exact = _buffers(name, payload, ranks, device)
    run(group)  # warm-up (connections, buffers)
    synchronize(device)
    start = time.perf_counter()
    run(group)
    synchronize(device)
    one = max(time.perf_counter() - start, 1e-7)
    ops = torch.tensor([min(plan.max_ops, max(1, math.ceil(plan.min_loop_s / one)))])
    dist.all_reduce(ops, op=dist.ReduceOp.MAX)  # every rank must run the same count
    k = int(ops.item())
    local = []
    for _ in range(plan.repeats):
        barrier(plan.device_type, ctx)
        start = time.perf_counter()
        for _ in range(k):
            run(group)
        synchronize(device)
        local.append((time.perf_counter() - start) / k)
    times = torch.tensor(local, dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return statistics.median(times.cpu().tolist()), exact


def group_layout(
    ctx: DistContext, intra_node: bool = True, inter_node: bool = True
) -> list[tuple[LinkRole, int, list[list[int]]]]:
    """(role, ranks per group, every group's members) for each configuration to measure:
    inside a node every P in {2, 4, 8, …} dividing the node's ranks plus all of them; across
    nodes one group per local rank index (its NIC rail)."""
    layout: list[tuple[LinkRole, int, list[list[int]]]] = []
    local, nodes = ctx.local_world_size, ctx.nnodes
    if intra_node and local >= 2:
        sizes = sorted(
            {p for p in (2, 4, 8, 16, 32, 64) if p <= local and local % p == 0} | {local}
        )
        for p in sizes:
            groups = [
                [n * local + c * p + j for j in range(p)]
                for n in range(nodes)
                for c in range(local // p)
            ]
            layout.append((LinkRole.INTRA_NODE, p, groups))
    if inter_node and nodes >= 2:
        groups = [[n * local + j for n in range(nodes)] for j in range(local)]
        layout.append((LinkRole.INTER_NODE, nodes, groups))
    return layout


def build_groups(ctx: DistContext, plan: CommPlan) -> list[tuple[LinkRole, int, Any]]:
    """(role, ranks per group, this rank's process group) per configuration. Every rank
    creates every group in the same order, as torch.distributed requires."""
    configs: list[tuple[LinkRole, int, Any]] = []
    for role, p, groups in group_layout(ctx, plan.intra_node, plan.inter_node):
        mine = None
        for members in groups:
            group = dist.new_group(members) if len(members) < ctx.world_size else None
            if ctx.rank in members:
                mine = group
        configs.append((role, p, mine))
    return configs


def measure(
    ctx: DistContext, plan: CommPlan, payloads: Sequence[int] | None = None
) -> list[CommSample]:
    """Every (group configuration, collective, payload); rank 0 returns the samples."""
    samples: list[CommSample] = []
    for role, ranks, group in build_groups(ctx, plan):
        # inter-node: one ring per local GPU, all at once, each over its own rail
        rings = ctx.world_size // ranks if role is LinkRole.INTER_NODE else 1
        for name in plan.collectives:
            for payload in payloads or plan.payloads:
                seconds, exact = time_collective(ctx, name, payload, ranks, group, plan)
                samples.append(
                    CommSample(
                        collective=name,
                        role=role,
                        payload_bytes=float(exact),
                        ranks=ranks,
                        seconds=seconds,
                        parallel_rings=rings,
                    )
                )
            log.info("collective_done", collective=name, role=role.value, ranks=ranks)
    return samples


def comm_phase(ctx: DistContext, plan: CommPlan) -> list[CommSample] | None:
    """The `distributed.run_phase` entry: measure, rank 0 returns the samples."""
    samples = measure(ctx, plan)
    return samples if ctx.is_main else None
