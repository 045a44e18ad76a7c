"""Why no plan exists: name the binding constraint, with its numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from shardmeter.cost.memory import min_ranks_for_memory
from shardmeter.plan.configs import BatchGrid, candidate_shapes
from shardmeter.plan.options import OptionTable, PoolContext, max_islands
from shardmeter.plan.schema import PlanSpec, Runtime

if TYPE_CHECKING:
    from shardmeter.plan.evaluate import Evaluator


def _no_whole_shard_groups(spec: PlanSpec, ctx: PoolContext) -> str | None:
    """hsdp: why the pool offers no island of a multiple of ``shardGroupNodes`` nodes within
    the constraints (None when it offers one, and for fsdp)."""
    c, step = spec.constraints, spec.training.island_nodes_step
    caps = [v for v in (c.max_gpus, c.max_gpus_per_island) if v is not None]
    shapes = candidate_shapes(
        ctx.pool.gpus_per_node,
        ctx.node_limit,
        c.min_gpus_per_island,
        min(caps, default=None),
        step,
    )
    if step == 1 or shapes:
        return None
    rule = (
        f"pool {ctx.pool.name!r}: an hsdp island's nodes must be a multiple of "
        f"training.shardGroupNodes ({step})"
    )
    if ctx.node_limit < step:
        return (
            f"{rule}, but the pool has {ctx.node_limit} usable node(s); lower "
            f"training.shardGroupNodes to at most {ctx.node_limit} or use a pool with more nodes"
        )
    limits = [f"minGpusPerIsland {c.min_gpus_per_island}"] + [
        f"{name} {v}"
        for name, v in (("maxGpusPerIsland", c.max_gpus_per_island), ("maxGpus", c.max_gpus))
        if v is not None
    ]
    return (
        f"{rule}, and no such island of {step}–{ctx.node_limit} nodes has a GPU count within "
        f"constraints.{', '.join(limits)}; lower training.shardGroupNodes or change those "
        "constraints"
    )


def no_option_reason(spec: PlanSpec, contexts: Sequence[PoolContext], grid: BatchGrid) -> str:
    """When no pool offers a single island."""
    c = spec.constraints
    parts = []
    on_gpu = spec.strategy.outer_state_on_gpu and spec.strategy.is_diloco
    for ctx in contexts:
        groups = _no_whole_shard_groups(spec, ctx)
        if groups is not None:
            parts.append(groups)
            continue
        cm = ctx.cost_model
        gpu = cm.pool.gpu.name
        need = min_ranks_for_memory(
            spec.model,
            spec.training,
            float(cm.pool.gpu.memory_bytes),
            cm.coefficients.memory,
            1,
            on_gpu,
        )
        name = ctx.pool.name
        if need is None:
            parts.append(f"{spec.model.name} does not fit on any number of {gpu}")
        elif c.max_gpus_per_island is not None and need > c.max_gpus_per_island:
            parts.append(
                f"{spec.model.name} needs ≥ {need} {gpu} per island for memory; "
                f"constraints.maxGpusPerIsland is {c.max_gpus_per_island}"
            )
        elif c.max_gpus is not None and need > c.max_gpus:
            parts.append(
                f"{spec.model.name} needs ≥ {need} {gpu} per island for memory; "
                f"constraints.maxGpus is {c.max_gpus}"
            )
        elif need > ctx.node_limit * ctx.pool.gpus_per_node:
            parts.append(
                f"{spec.model.name} needs ≥ {need} {gpu} per island for memory; pool "
                f"{name!r} has {ctx.node_limit * ctx.pool.gpus_per_node}"
            )
        elif need > grid.limit:
            parts.append(
                f"{spec.model.name} needs ≥ {need} {gpu} per island for memory, i.e. ≥ {need} "
                f"sequences per inner step, above the global batch limit of {grid.limit} "
                "(training.globalBatchTokens, constraints.globalBatchTolerance)"
            )
        elif ctx.notes:
            parts.append(f"pool {name!r}: " + "; ".join(ctx.notes[:3]))
        else:
            parts.append(
                f"pool {name!r}: no island shape within constraints.minGpusPerIsland "
                f"{c.min_gpus_per_island}"
                + (
                    f" and maxGpusPerIsland {c.max_gpus_per_island}"
                    if c.max_gpus_per_island is not None
                    else ""
                )
            )
    return "no island fits: " + "; ".join(parts)


def _reachable_totals(
    table: OptionTable, n_pools: int, kmax: int, gmax: int, hi: int, equal: bool
) -> set[int]:
    """Cell totals some layout can process (ignoring time), within islands/GPU limits."""
    if equal:
        out: set[int] = set()
        # every island processes the same c: for each c, the island counts pools can field
        width = table.steps.shape[1]
        for c in range(1, width):
            counts = {0}
            for p in range(n_pools):
                opts = np.flatnonzero((table.pool == p) & np.isfinite(table.steps[table.row, c]))
                ks = {int(table.islands[o]) for o in opts if table.gpus[o] <= gmax}
                counts = counts | {a + k for a in counts for k in ks if a + k <= kmax}
            out |= {k * c for k in counts if k > 0 and k * c <= 2 * hi}
        return out
    limit = 2 * hi
    mask = (1 << (limit + 1)) - 1
    reach = [1] + [0] * kmax  # reach[m]: bitset of totals with m islands
    for p in range(n_pools):
        pairs: set[tuple[int, int]] = set()
        for o in np.flatnonzero(table.pool == p):
            if table.gpus[o] > gmax:
                continue
            k = int(table.islands[o])
            for cell in np.flatnonzero(np.isfinite(table.steps[table.row[o]])):
                if k * int(cell) <= limit:
                    pairs.add((k, k * int(cell)))
        new = list(reach)
        for k, v in pairs:
            for m in range(kmax - k + 1):
                if reach[m]:
                    new[m + k] |= (reach[m] << v) & mask
        reach = new
    total = 0
    for m in range(1, kmax + 1):
        total |= reach[m]
    return {s for s in range(limit + 1) if total >> s & 1}


def no_plan_reason(
    spec: PlanSpec, contexts: Sequence[PoolContext], table: OptionTable, evaluator: Evaluator
) -> str:
    """When islands exist but no layout is feasible."""
    from shardmeter.plan.evaluate import NO_WAN_UPLINK

    grid = evaluator.grid
    c = spec.constraints
    kmax = max_islands(spec)
    # a layout that meets the batch but lacks a WAN uplink?
    singles = []
    for p in range(len(contexts)):
        for o in np.flatnonzero(table.pool == p):
            row = np.full(len(contexts), -1, dtype=np.int64)
            row[p] = o
            singles.append(row)
    pairs = []
    for a in range(len(singles)):
        for b in range(a + 1, min(len(singles), a + 200)):
            row = np.maximum(singles[a], singles[b])
            if (row >= 0).sum() == 2:
                pairs.append(row)
    if pairs:
        ev = evaluator.evaluate(np.asarray(pairs))
        if (ev.status == NO_WAN_UPLINK).any():
            missing = [ctx.pool.name for ctx in contexts if ctx.pool.wan_uplink is None]
            return (
                "no feasible plan: plans that meet the batch span sites, but pool(s) "
                + ", ".join(repr(m) for m in missing)
                + " have no wanUplink — set pools[].wanUplink or put the pools at one site"
            )
    gmax = c.max_gpus or (1 << 62)
    equal = spec.runtime is Runtime.TORCHTITAN_FT
    totals = _reachable_totals(table, len(contexts), kmax, gmax, grid.hi, equal)
    u = grid.quantum
    below = max((s for s in totals if s < grid.lo), default=None)
    above = min((s for s in totals if s > grid.hi), default=None)
    needs = (
        f"exactly {grid.batch:,}" if grid.limit == grid.batch else f"{grid.batch:,}–{grid.limit:,}"
    )
    want = (
        f"the global batch needs {needs} sequences per inner step "
        f"(training.globalBatchTokens {spec.training.global_batch_tokens:,} at "
        f"seqLenTokens {spec.training.seq_len_tokens}, constraints.globalBatchTolerance "
        f"{c.global_batch_tolerance:g})"
    )
    closest = ", ".join(f"{v * u:,}" for v in (below, above) if v is not None) or "none"
    runtime = (
        " with equal batches per island (runtime torchtitan-ft: islands must process the "
        "same number of sequences)"
        if equal
        else ""
    )
    hint = []
    if equal:
        hint.append("runtime: weighted (if the runtime supports token-weighted averaging)")
    step = spec.training.island_nodes_step
    hint += [
        "constraints.globalBatchTolerance",
        f"constraints.maxIslands ({c.max_islands})" if spec.strategy.is_diloco else "",
        "training.globalBatchTokens",
        # hsdp islands are whole shard groups, which coarsens the sequences they can process
        f"training.shardGroupNodes ({step})" if step > 1 else "",
    ]
    return (
        f"no feasible plan: batch granularity — {want}, but the islands can process "
        f"{closest} at the closest{runtime}, within ≤ {kmax} island(s); change "
        + ", ".join(h for h in hint if h)
    )
