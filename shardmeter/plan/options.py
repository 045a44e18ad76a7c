"""Per-pool island options: shapes (N nodes × G GPUs per node), the micro-batch/accumulation
configurations each shape can run, and the options (k identical islands of one shape) a plan
may pick from a pool.

**Search space** (documented once, used by the optimizer and by the brute-force tests):

* a plan takes from each pool either nothing or k identical islands of one shape N × G
  (G divides the pool's GPUs per node; islands never share nodes: k·N ≤ the pool's nodes),
  as in the paper's Fig. 8 (e.g. "9×1×8 H200 + 1×9×8 A100");
* each island runs micro-batch b (sequences per GPU) with gradient accumulation A; b is tried
  at powers of two and at the memory maxima (with and without accumulation, which keeps all
  unsharded gradients resident), A from 1 up to what the global batch allows;
* per GPU count only the shape with the fewest nodes is considered (2×4 is never tried beside
  1×8): it uses fewer nodes, its collectives cross no slower link, and memory depends only on
  the GPU count, so the others can only tie or lose.

For each shape the (step seconds, sequences per step) pairs of all configurations are
reduced to their Pareto list: step time ascending, sequences strictly ascending. Step time
at any A comes from two simulations (see `IslandStepModel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.model import CostModel
from shardmeter.plan.schema import ConstraintsSpec, PlanPool, PlanSpec
from shardmeter.sim.scenario import IslandShape, IslandStepModel
from shardmeter.spec.training import StrategyKind


@dataclass(frozen=True)
class Config:
    step_s: float
    sequences: int
    """Sequences one island processes per optimizer step: A·b·N·G."""
    micro_batch: int
    accumulation: int


@dataclass
class ShapeProfile:
    shape: IslandShape
    configs: list[Config]
    """Pareto list: step_s ascending, sequences strictly ascending."""
    outer_step_s: float
    """DiLoCo outer optimizer step of the whole model on one rank of this shape."""
    models: dict[int, IslandStepModel] = field(repr=False, default_factory=dict)


@dataclass(frozen=True)
class PoolOption:
    """k identical islands of one shape from one pool."""

    pool: int
    shape: int
    islands: int
    nodes_used: int
    gpus: int
    usd_per_hour: float


@dataclass
class PoolContext:
    pool: PlanPool
    index: int
    cost_model: CostModel
    shapes: list[ShapeProfile]
    options: list[PoolOption]
    notes: list[str]
    """Why shapes were left out (memory, constraints), for infeasibility messages."""


def micro_batch_candidates(upper: int, maxima: Sequence[int]) -> list[int]:
    """Powers of two up to ``upper`` plus the memory maxima (≤ upper)."""
    out = {1 << i for i in range(upper.bit_length()) if (1 << i) <= upper}
    out.update(m for m in maxima if 1 <= m <= upper)
    return sorted(out)


def pareto(configs: list[Config]) -> list[Config]:
    ordered = sorted(configs, key=lambda c: (c.step_s, -c.sequences, c.micro_batch))
    out: list[Config] = []
    for c in ordered:
        if not out or c.sequences > out[-1].sequences:
            out.append(c)
    return out


def _candidate_shapes(
    cm: CostModel, constraints: ConstraintsSpec, node_limit: int
) -> list[IslandShape]:
    """Shapes allowed by the constraints: per GPU count, the one with the fewest nodes."""
    pool = cm.pool
    best: dict[int, IslandShape] = {}
    for g in range(pool.gpus_per_node, 0, -1):
        if pool.gpus_per_node % g:
            continue
        for n in range(1, node_limit + 1):
            p = n * g
            if p < constraints.min_gpus_per_island or p in best:
                continue
            if constraints.max_gpus_per_island is not None and p > constraints.max_gpus_per_island:
                continue
            if constraints.max_gpus is not None and p > constraints.max_gpus:
                continue
            best[p] = IslandShape(n, g)
    return [best[p] for p in sorted(best)]


def build_pool_context(
    spec: PlanSpec, pool: PlanPool, index: int, coefficients: CoefficientsDocument | None
) -> PoolContext:
    cm = CostModel(spec.model, spec.training, pool, coefficients)
    constraints = spec.constraints
    node_limit = pool.nodes if pool.max_nodes is None else min(pool.nodes, pool.max_nodes)
    seqs = spec.training.global_batch_sequences
    limit = int(np.floor(seqs * (1 + constraints.global_batch_tolerance) + 1e-9))
    on_gpu = spec.strategy.outer_state_on_gpu and spec.strategy.is_diloco
    notes: list[str] = []
    shapes: list[ShapeProfile] = []
    for shape in _candidate_shapes(cm, constraints, node_limit):
        p = shape.ranks
        b1 = cm.max_micro_batch(p, 1, on_gpu)
        if b1 < 1:
            notes.append(f"{shape}: does not fit in memory")
            continue
        if p > limit:
            notes.append(f"{shape}: one sequence per GPU exceeds the global batch")
            continue
        b_acc = cm.max_micro_batch(p, 2, on_gpu)
        upper = min(b1, limit // p)
        configs, models = [], {}
        for b in micro_batch_candidates(upper, (b1, b_acc)):
            model = IslandStepModel(cm, shape, b)
            models[b] = model
            configs.append(Config(model.step_s(1), b * p, b, 1))
            if b <= b_acc and 2 * b * p <= limit:
                configs += [
                    Config(model.step_s(a), a * b * p, b, a) for a in range(2, limit // (b * p) + 1)
                ]
        shapes.append(
            ShapeProfile(
                shape,
                pareto(configs),
                cm.outer_step_seconds(spec.model.total_params, p, on_gpu),
                models,
            )
        )
    options: list[PoolOption] = []
    fsdp = spec.strategy.kind is StrategyKind.FSDP
    max_islands = 1 if fsdp else constraints.max_islands
    for si, prof in enumerate(shapes):
        for k in range(1, max_islands + 1):
            nodes = k * prof.shape.nodes
            gpus = k * prof.shape.ranks
            if nodes > node_limit or (
                constraints.max_gpus is not None and gpus > constraints.max_gpus
            ):
                break
            if k * prof.configs[0].sequences > limit:
                break
            options.append(
                PoolOption(index, si, k, nodes, gpus, gpus * pool.price_per_gpu_hour_usd)
            )
    return PoolContext(pool, index, cm, shapes, options, notes)


@dataclass
class OptionTable:
    """All options of all pools as flat numpy arrays (for vectorised evaluation), plus the
    shapes' Pareto lists concatenated into segments."""

    pool: npt.NDArray[np.int64]
    islands: npt.NDArray[np.int64]
    nodes: npt.NDArray[np.int64]
    gpus: npt.NDArray[np.int64]
    ranks: npt.NDArray[np.int64]
    usd_per_hour: npt.NDArray[np.float64]
    segment: npt.NDArray[np.int64]
    """Index of the option's shape segment in the flat Pareto arrays."""
    outer_step_s: npt.NDArray[np.float64]
    peak_flops: npt.NDArray[np.float64]
    """Peak FLOP/s of all the option's GPUs together."""
    seg_start: npt.NDArray[np.int64]
    seg_len: npt.NDArray[np.int64]
    flat_step_s: npt.NDArray[np.float64]
    flat_sequences: npt.NDArray[np.int64]
    options: list[PoolOption]
    shape_of_segment: list[tuple[int, int]]
    """(pool index, shape index) of each segment."""


def option_table(contexts: Sequence[PoolContext]) -> OptionTable:
    seg_of: dict[tuple[int, int], int] = {}
    starts: list[int] = []
    lens: list[int] = []
    steps: list[float] = []
    seqs: list[int] = []
    shape_of: list[tuple[int, int]] = []
    for ctx in contexts:
        for si, prof in enumerate(ctx.shapes):
            seg_of[(ctx.index, si)] = len(starts)
            shape_of.append((ctx.index, si))
            starts.append(len(steps))
            lens.append(len(prof.configs))
            steps.extend(c.step_s for c in prof.configs)
            seqs.extend(c.sequences for c in prof.configs)
    opts = [o for ctx in contexts for o in ctx.options]
    by_index = {ctx.index: ctx for ctx in contexts}

    def ints(values: list[int]) -> npt.NDArray[np.int64]:
        return np.asarray(values, dtype=np.int64)

    def floats(values: list[float]) -> npt.NDArray[np.float64]:
        return np.asarray(values, dtype=np.float64)

    shapes = [by_index[o.pool].shapes[o.shape] for o in opts]
    return OptionTable(
        pool=ints([o.pool for o in opts]),
        islands=ints([o.islands for o in opts]),
        nodes=ints([o.nodes_used for o in opts]),
        gpus=ints([o.gpus for o in opts]),
        ranks=ints([s.shape.ranks for s in shapes]),
        usd_per_hour=floats([o.usd_per_hour for o in opts]),
        segment=ints([seg_of[(o.pool, o.shape)] for o in opts]),
        outer_step_s=floats([s.outer_step_s for s in shapes]),
        peak_flops=floats([o.gpus * by_index[o.pool].cost_model.peak_flop_per_s for o in opts]),
        seg_start=ints(starts),
        seg_len=ints(lens),
        flat_step_s=floats(steps),
        flat_sequences=ints(seqs),
        options=opts,
        shape_of_segment=shape_of,
    )
