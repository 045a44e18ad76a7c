"""Per-pool island options: the island shapes each pool can offer (with their configuration
tables, `shardmeter.plan.configs`) and the options a plan may take from a pool.

**Search space** (documented once; the brute-force reference in ``tests/`` enumerates it on
its own):

* a plan takes from each pool either nothing or k identical islands of one shape N × G
  (G divides the pool's GPUs per node; islands never share nodes: k·N ≤ the pool's nodes),
  as in the paper's Fig. 8 (e.g. "9×1×8 H200 + 1×9×8 A100"); all islands of a pool run the
  same micro-batch and accumulation;
* with ``sharding: hsdp``, N is a multiple of ``shardGroupNodes`` (an island is whole shard
  groups: torchtitan replicates over N / shardGroupNodes of them); other islands cannot run;
* islands of different pools may run different micro-batches and accumulations; with
  ``runtime: torchtitan-ft`` they process the same number of sequences per inner step, with
  ``runtime: weighted`` any numbers that add up to the global batch (within its tolerance);
* a shape that needs more nodes for the same GPU count than another is left out only when
  the other's every FSDP task is at most as long at every micro-batch (then it is never
  slower, uses fewer nodes and costs the same); otherwise both are searched.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.energy import co2_kg, facility_kwh, islands_facility_watts
from shardmeter.cost.model import CostModel
from shardmeter.plan.configs import (
    BatchGrid,
    ConfigVariant,
    ShapeTable,
    build_shape_table,
    candidate_shapes,
    class_key,
    config_variants,
    micro_batch_plan,
    shape_dominates,
    variant_cost_model,
)
from shardmeter.plan.schema import PlanPool, PlanSpec
from shardmeter.sim.scenario import IslandShape, outer_step_seconds_by_fragments
from shardmeter.spec.training import GradientSync, StrategyKind

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
UNUSED_RANK = 1 << 30
"""Tie-break rank of a pool a layout does not use (after every option)."""


@dataclass
class PoolContext:
    pool: PlanPool
    index: int
    cost_model: CostModel
    node_limit: int
    shapes: list[ShapeTable]
    notes: list[str]
    """Why shapes were left out (memory, batch), for reports and infeasibility messages."""
    utilisation: float = 1.0
    """The pool's GPU utilisation for power (`shardmeter.cost.energy`): the compute stream's
    busy share of its first island shape (the fewest GPUs, then nodes) at that shape's
    reference configuration (`ShapeTable.reference_utilisation`). One per pool, so that an
    option's power — and a plan's energy — is a rate × hours like its price, and the same
    GPUs on more nodes never draw less energy. It is the pool's least communication-bound
    island, so energy errs high for larger ones."""


@dataclass(frozen=True)
class PoolOption:
    """k identical islands of one shape from one pool, with what they cost per hour."""

    pool: int
    shape: int
    """Index into the pool's ``shapes``."""
    islands: int
    nodes_used: int
    gpus: int
    usd_per_hour: float
    """Billed GPUs × the pool's price."""
    billed_gpus: int = 0
    """GPUs paid for: ``gpus``, or every GPU of the nodes used with ``exclusiveNodes``."""
    facility_watts: float = 0.0
    """Power at the site's meter while the islands train: GPUs × their draw
    (`shardmeter.cost.energy`), idle GPUs of exclusive nodes at their static draw, × PUE."""
    co2_kg_per_hour: float = 0.0
    """``facility_watts`` × the site's grid carbon intensity, per hour."""


def option_rates(
    pool: PlanPool, islands: int, nodes: int, ranks: int, utilisation: float
) -> PoolOption:
    """The per-hour figures of ``islands`` islands of ``nodes`` nodes and ``ranks`` GPUs each
    (``pool``/``shape`` left 0 for the caller to fill in): price, billed GPUs, facility power
    and CO₂ rate. One rule, used by the search and by the fixed-plan evaluation."""
    gpus = islands * ranks
    billed = islands * nodes * pool.gpus_per_node if pool.exclusive_nodes else gpus
    watts = islands_facility_watts(pool, islands, nodes, ranks, utilisation)
    return PoolOption(
        0,
        0,
        islands,
        islands * nodes,
        gpus,
        billed * pool.price_per_gpu_hour_usd,
        billed,
        watts,
        co2_kg(facility_kwh(watts, 1.0, 1.0), pool.grid_carbon_intensity_g_per_kwh),
    )


@dataclass
class OptionTable:
    """Every option of every pool as flat arrays, and the shapes' step tables stacked."""

    options: list[PoolOption]
    pool: IntArray
    row: IntArray
    """Row of the option's shape in ``steps``."""
    islands: IntArray
    nodes: IntArray
    gpus: IntArray
    ranks: IntArray
    usd_per_hour: FloatArray
    billed_gpus: IntArray
    facility_watts: FloatArray
    co2_kg_per_hour: FloatArray
    outer_step_s: FloatArray
    """(options × fragment counts): the shape's outer optimizer steps per outer step with F
    fragments at column F − 1 (`ShapeTable.outer_step_s`)."""
    outer_step_least_s: FloatArray
    """Per option: the least of its row of ``outer_step_s`` (a bound for any settings)."""
    peak_flops: FloatArray
    """Peak FLOP/s of all the option's GPUs together."""
    steps: FloatArray
    """(shape rows × cells): least step seconds of one island for c·u sequences."""
    min_cell: IntArray
    """Per row: the fewest cells one island can process."""
    shape_of_row: list[ShapeTable]
    tie_rank: IntArray
    """Per option: its rank within its pool by (islands, nodes per island, GPUs per node) —
    of two layouts that tie on time, cost, nodes and islands the one whose pools, in order,
    use lower-ranked options (used before unused) is kept."""

    def by_pool(self, n_pools: int) -> list[IntArray]:
        return [np.flatnonzero(self.pool == p) for p in range(n_pools)]


def max_islands(spec: PlanSpec) -> int:
    """The most islands a plan may have: 1 for FSDP; else ``constraints.maxIslands``, capped
    at ``strategy.maxMeasuredIslands`` with ``beyondMeasuredIslands: cap``."""
    if spec.strategy.kind is StrategyKind.FSDP:
        return 1
    return spec.strategy.island_limit(spec.constraints.max_islands)


class ShapeCache:
    """Shape tables shared by pools whose islands run at the same speed (`class_key`)."""

    def __init__(self, spec: PlanSpec, grid: BatchGrid) -> None:
        self.spec = spec
        self.grid = grid
        self.variants: list[ConfigVariant] = config_variants(spec)
        self._tables: dict[tuple[str, int, int], ShapeTable | None] = {}
        self._dominated: dict[tuple[str, int, int, int, int], bool] = {}
        self._variant_models: dict[str, list[tuple[ConfigVariant, CostModel]]] = {}

    def table(self, cm: CostModel, key: str, shape: IslandShape) -> ShapeTable | None:
        k = (key, shape.nodes, shape.gpus_per_node)
        if k not in self._tables:
            spec = self.spec
            streaming = spec.strategy.kind is StrategyKind.STREAMING_DILOCO
            self._tables[k] = build_shape_table(
                cm,
                self._variants(cm, key),
                shape,
                self.grid,
                spec.strategy.outer_state_on_gpu and spec.strategy.is_diloco,
                outer_step_seconds_by_fragments(
                    cm,
                    spec.model,
                    spec.strategy,
                    shape.ranks,
                    spec.model.num_layers if streaming else 1,
                ),
            )
        return self._tables[k]

    def dominated(self, cm: CostModel, key: str, shape: IslandShape, by: IslandShape) -> bool:
        """``by`` (same GPUs, fewer nodes) is never slower than ``shape`` on this kind of pool."""
        k = (key, shape.nodes, shape.gpus_per_node, by.nodes, by.gpus_per_node)
        if k not in self._dominated:
            variants = self._variants(cm, key)
            on_gpu = self.spec.strategy.outer_state_on_gpu and self.spec.strategy.is_diloco
            plans = micro_batch_plan(variants, shape, self.grid, on_gpu)
            mine = micro_batch_plan(variants, by, self.grid, on_gpu)
            fits = all(
                a.b_max >= b.b_max and a.b_acc >= b.b_acc for a, b in zip(mine, plans, strict=True)
            )
            bs = sorted({b for p in plans for b in p.micro_batches})
            self._dominated[k] = fits and shape_dominates(variants, by, shape, bs)
        return self._dominated[k]

    def _variants(self, cm: CostModel, key: str) -> list[tuple[ConfigVariant, CostModel]]:
        if key not in self._variant_models:
            self._variant_models[key] = [(v, variant_cost_model(cm, v)) for v in self.variants]
        return self._variant_models[key]


def build_pool_context(
    spec: PlanSpec,
    pool: PlanPool,
    index: int,
    coefficients: CoefficientsDocument | None,
    cache: ShapeCache,
) -> PoolContext:
    cm = CostModel(spec.model, spec.training, pool, coefficients)
    node_limit = _node_limit(pool)
    notes: list[str] = []
    shapes = list(_shape_tables(spec, cm, node_limit, cache, notes))
    utilisation = shapes[0].reference_utilisation() if shapes else 1.0
    return PoolContext(pool, index, cm, node_limit, shapes, notes, utilisation)


def pool_utilisation(
    spec: PlanSpec, pool: PlanPool, coefficients: CoefficientsDocument | None
) -> float:
    """`PoolContext.utilisation` without building the pool's other shapes (for evaluating a
    decided plan: `shardmeter.plan.fixed`)."""
    cm = CostModel(spec.model, spec.training, pool, coefficients)
    cache = ShapeCache(spec, BatchGrid.of(spec))
    first = next(iter(_shape_tables(spec, cm, _node_limit(pool), cache, [])), None)
    return first.reference_utilisation() if first is not None else 1.0


def _node_limit(pool: PlanPool) -> int:
    return pool.nodes if pool.max_nodes is None else min(pool.nodes, pool.max_nodes)


def _shape_tables(
    spec: PlanSpec, cm: CostModel, node_limit: int, cache: ShapeCache, notes: list[str]
) -> Iterator[ShapeTable]:
    """The pool's island shapes that can run, fewest GPUs then fewest nodes first (a shape
    another never-slower one with fewer nodes dominates is left out); why others cannot is
    appended to ``notes``."""
    c = spec.constraints
    key = class_key(cm)
    grid = cache.grid
    by_ranks = candidate_shapes(
        cm.pool.gpus_per_node,
        node_limit,
        c.min_gpus_per_island,
        c.max_gpus,
        spec.training.island_nodes_step,
    )
    for r, group in by_ranks.items():
        if c.max_gpus_per_island is not None and r > c.max_gpus_per_island:
            continue
        if r > grid.limit:
            notes.append(
                f"{group[0]}: one sequence per GPU is {r} sequences, above the global batch "
                f"limit of {grid.limit}"
            )
            continue
        kept: list[IslandShape] = []
        for shape in group:
            if any(cache.dominated(cm, key, shape, by) for by in kept):
                continue
            table = cache.table(cm, key, shape)
            if table is None:
                if shape is group[0]:
                    notes.append(f"{shape}: {_why_not(cm, spec, shape)}")
                break  # the same GPU count on more nodes fits no better
            kept.append(shape)
            yield table


def _why_not(cm: CostModel, spec: PlanSpec, shape: IslandShape) -> str:
    on_gpu = spec.strategy.outer_state_on_gpu and spec.strategy.is_diloco
    r, g = shape.ranks, shape.gpus_per_node
    if (
        cm.max_micro_batch(r, 1, on_gpu, gpus_per_node=g) < 1
        and cm.max_micro_batch(
            r, 1, on_gpu, gradient_sync=GradientSync.LAST_MICRO_BATCH, gpus_per_node=g
        )
        < 1
    ):
        return "one sequence per GPU does not fit in memory"
    return "no micro-batch fits the global batch quantum"


def pool_options(spec: PlanSpec, ctx: PoolContext, grid: BatchGrid) -> list[PoolOption]:
    c = spec.constraints
    out: list[PoolOption] = []
    cap = max_islands(spec)
    for si, table in enumerate(ctx.shapes):
        first = int(table.cells[0])
        for k in range(1, cap + 1):
            nodes, gpus = k * table.shape.nodes, k * table.ranks
            if nodes > ctx.node_limit or (c.max_gpus is not None and gpus > c.max_gpus):
                break
            if k * first > grid.hi:
                break
            rates = option_rates(ctx.pool, k, table.shape.nodes, table.ranks, ctx.utilisation)
            out.append(replace(rates, pool=ctx.index, shape=si))
    return out


def option_table(contexts: Sequence[PoolContext], options: Sequence[PoolOption]) -> OptionTable:
    rows: dict[int, int] = {}
    tables: list[ShapeTable] = []
    for ctx in contexts:
        for t in ctx.shapes:
            if id(t) not in rows:
                rows[id(t)] = len(tables)
                tables.append(t)
    by_index: Mapping[int, PoolContext] = {ctx.index: ctx for ctx in contexts}
    shape = [by_index[o.pool].shapes[o.shape] for o in options]

    def ints(values: Sequence[int]) -> IntArray:
        return np.asarray(values, dtype=np.int64).reshape(-1)

    def floats(values: Sequence[float]) -> FloatArray:
        return np.asarray(values, dtype=np.float64).reshape(-1)

    width = len(tables[0].step_s) if tables else 1
    counts = len(tables[0].outer_step_s) if tables else 1
    outer = (np.stack([s.outer_step_s for s in shape]) if shape else np.zeros((0, counts))).astype(
        np.float64
    )
    rank = np.zeros(len(options), dtype=np.int64)
    for p in {o.pool for o in options}:
        idx = [i for i, o in enumerate(options) if o.pool == p]
        idx.sort(
            key=lambda i: (options[i].islands, shape[i].shape.nodes, shape[i].shape.gpus_per_node)
        )
        rank[idx] = np.arange(len(idx))
    return OptionTable(
        options=list(options),
        pool=ints([o.pool for o in options]),
        row=ints([rows[id(s)] for s in shape]),
        islands=ints([o.islands for o in options]),
        nodes=ints([o.nodes_used for o in options]),
        gpus=ints([o.gpus for o in options]),
        ranks=ints([s.ranks for s in shape]),
        usd_per_hour=floats([o.usd_per_hour for o in options]),
        billed_gpus=ints([o.billed_gpus for o in options]),
        facility_watts=floats([o.facility_watts for o in options]),
        co2_kg_per_hour=floats([o.co2_kg_per_hour for o in options]),
        outer_step_s=outer,
        outer_step_least_s=outer.min(axis=1, initial=np.inf),
        peak_flops=floats([o.gpus * by_index[o.pool].cost_model.peak_flop_per_s for o in options]),
        steps=np.stack([t.step_s for t in tables]) if tables else np.zeros((0, width)),
        min_cell=ints([int(t.cells[0]) for t in tables]),
        shape_of_row=tables,
        tie_rank=rank,
    )
