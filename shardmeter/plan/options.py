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

import json
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
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


class SpaceStore:
    """What building and walking a search space produced, kept across planning requests (a
    long-running planner: the operator): island shapes' tables, dominance verdicts and the
    exhaustive pass's enumeration of layouts (`shardmeter.plan.bnb.Enumeration`).

    What a table depends on is its key (`ShapeCache.space_key`, the pool class `class_key`,
    the shape): the model, the training settings but their total tokens, the strategy, the
    batch grid, the pool's hardware and its coefficients — not the total tokens, the
    objective, the constraints, prices or pool names. An enumeration is keyed by a digest of
    the options and step tables it walked (`shardmeter.plan.bnb.space_digest`). A request that
    differs only in what the keys leave out reuses them, and plans exactly as over freshly
    built ones (they are read-only, and scoring is row by row). A change of a pool's
    coefficients changes its class key and its tables' steps: they are built anew, the old
    entries age out.

    Bounded: the least recently used entries go once the entries together weigh more than
    ``max_cells`` (a table its cells plus 64 per step model, an enumeration its rows'
    values; an entry heavier than that alone is not kept). The case study's space weighs
    about 69,000 and holds 2.8 MiB: the default bound is about 20 MiB, seven such spaces. Thread-safe (two threads may build the
    same entry at once; both get equal ones)."""

    def __init__(self, max_cells: int = 1 << 19) -> None:
        self.max_cells = max_cells
        self._entries: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> tuple[bool, object]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return False, None
            self._entries.move_to_end(key)
            self.hits += 1
            return True, entry[0]

    def put(self, key: Hashable, value: object, weight: int = 1) -> None:
        if weight > self.max_cells:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._entries[key] = (value, weight)
            self._weight += weight
            while self._weight > self.max_cells:
                _, (_, w) = self._entries.popitem(last=False)
                self._weight -= w

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._weight = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def weight(self) -> int:
        return self._weight


class ShapeCache:
    """Shape tables shared by pools whose islands run at the same speed (`class_key`) within
    one request, and across requests through a `SpaceStore` when given one."""

    def __init__(self, spec: PlanSpec, grid: BatchGrid, store: SpaceStore | None = None) -> None:
        self.spec = spec
        self.grid = grid
        self.store = store
        self.variants: list[ConfigVariant] = config_variants(spec)
        self._tables: dict[tuple[str, int, int], ShapeTable | None] = {}
        self._dominated: dict[tuple[str, int, int, int, int], bool] = {}
        self._variant_models: dict[str, list[tuple[ConfigVariant, CostModel]]] = {}
        self.space_key = space_key(spec, grid) if store is not None else ""

    def table(self, cm: CostModel, key: str, shape: IslandShape) -> ShapeTable | None:
        k = (key, shape.nodes, shape.gpus_per_node)
        if k not in self._tables:
            stored = ("table", self.space_key, *k)
            found, value = self.store.get(stored) if self.store is not None else (False, None)
            if found:
                self._tables[k] = value  # type: ignore[assignment]
            else:
                table = self._build(cm, key, shape)
                if table is not None:
                    table.freeze()
                self._tables[k] = table
                if self.store is not None:
                    weight = 1 if table is None else len(table.step_s) + 64 * len(table.models)
                    self.store.put(stored, table, weight)
        return self._tables[k]

    def _build(self, cm: CostModel, key: str, shape: IslandShape) -> ShapeTable | None:
        spec = self.spec
        streaming = spec.strategy.kind is StrategyKind.STREAMING_DILOCO
        return build_shape_table(
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

    def dominated(self, cm: CostModel, key: str, shape: IslandShape, by: IslandShape) -> bool:
        """``by`` (same GPUs, fewer nodes) is never slower than ``shape`` on this kind of pool."""
        k = (key, shape.nodes, shape.gpus_per_node, by.nodes, by.gpus_per_node)
        if k not in self._dominated:
            stored = ("dominated", self.space_key, *k)
            found, value = self.store.get(stored) if self.store is not None else (False, None)
            if found:
                self._dominated[k] = bool(value)
            else:
                self._dominated[k] = self._dominates(cm, key, shape, by)
                if self.store is not None:
                    self.store.put(stored, self._dominated[k])
        return self._dominated[k]

    def _dominates(self, cm: CostModel, key: str, shape: IslandShape, by: IslandShape) -> bool:
        variants = self._variants(cm, key)
        on_gpu = self.spec.strategy.outer_state_on_gpu and self.spec.strategy.is_diloco
        plans = micro_batch_plan(variants, shape, self.grid, on_gpu)
        mine = micro_batch_plan(variants, by, self.grid, on_gpu)
        fits = all(
            a.b_max >= b.b_max and a.b_acc >= b.b_acc for a, b in zip(mine, plans, strict=True)
        )
        bs = sorted({b for p in plans for b in p.micro_batches})
        return fits and shape_dominates(variants, by, shape, bs)

    def _variants(self, cm: CostModel, key: str) -> list[tuple[ConfigVariant, CostModel]]:
        if key not in self._variant_models:
            self._variant_models[key] = [(v, variant_cost_model(cm, v)) for v in self.variants]
        return self._variant_models[key]


def space_key(spec: PlanSpec, grid: BatchGrid) -> str:
    """What every shape table of a request depends on besides its pool class and shape: the
    model, the training settings but the total tokens (no step time, memory fit or outer
    step depends on how long the run is), the strategy and the batch grid."""
    return json.dumps(
        [
            spec.model.model_dump(mode="json"),
            spec.training.model_dump(mode="json", exclude={"total_tokens"}),
            spec.strategy.model_dump(mode="json"),
            [grid.batch, grid.limit, grid.quantum],
        ],
        sort_keys=True,
    )


class PoolBuilder:
    """Builds one pool's island shapes that can run, one shape at a time, so that a deadline
    can stop the build between two shapes; why others cannot run goes to the notes.

    The shapes are grouped by GPU count; a group's shapes are tried fewest nodes first (one
    another never-slower one with fewer nodes dominates is left out; the first that fits
    nothing ends the group). Groups are independent, so they are built in an order of
    promise: by GPU count up to the first group that runs at all (the pool's utilisation
    comes from its first shape), then coarse to fine over the rest (the median GPU count,
    the quartiles, …) so that a build stopped early has shapes of every size. Whatever the
    order, `context` lists the shapes fewest GPUs then fewest nodes first, as a full build
    in that order would: a complete build is the same whichever order built it."""

    def __init__(
        self,
        spec: PlanSpec,
        pool: PlanPool,
        index: int,
        coefficients: CoefficientsDocument | None,
        cache: ShapeCache,
    ) -> None:
        self.spec, self.pool, self.index, self.cache = spec, pool, index, cache
        self.cm = CostModel(spec.model, spec.training, pool, coefficients)
        self.node_limit = _node_limit(pool)
        self.key = class_key(self.cm)
        c, grid = spec.constraints, cache.grid
        by_ranks = candidate_shapes(
            pool.gpus_per_node,
            self.node_limit,
            c.min_gpus_per_island,
            c.max_gpus,
            spec.training.island_nodes_step,
        )
        self.groups: list[list[IslandShape]] = []
        self.notes: dict[int, list[str]] = {}
        for r, group in by_ranks.items():
            if c.max_gpus_per_island is not None and r > c.max_gpus_per_island:
                continue
            if r > grid.limit:
                self.notes[len(self.groups)] = [
                    f"{group[0]}: one sequence per GPU is {r} sequences, above the global "
                    f"batch limit of {grid.limit}"
                ]
                self.groups.append([])
                continue
            self.groups.append(group)
        self.kept: dict[int, list[ShapeTable]] = {}
        self.queue = [g for g, group in enumerate(self.groups) if group]
        self.position = 0
        """Next shape of the group at the head of the queue."""
        self.ordered = False

    @property
    def done(self) -> bool:
        return not self.queue

    @property
    def first_built(self) -> bool:
        """The pool's first shape that runs is built (it gives the pool's utilisation)."""
        return any(self.kept.values())

    @property
    def shapes_left(self) -> int:
        """Candidate shapes not tried yet (some would be dominated or not fit)."""
        if not self.queue:
            return 0
        return (
            len(self.groups[self.queue[0]])
            - self.position
            + sum(len(self.groups[g]) for g in self.queue[1:])
        )

    def step(self) -> None:
        """Try the next shape."""
        g = self.queue[0]
        group = self.groups[g]
        shape = group[self.position]
        kept = self.kept.setdefault(g, [])
        finished = False
        by_shapes = [t.shape for t in kept]
        if not any(self.cache.dominated(self.cm, self.key, shape, by) for by in by_shapes):
            table = self.cache.table(self.cm, self.key, shape)
            if table is None:
                if self.position == 0:
                    self.notes.setdefault(g, []).append(
                        f"{shape}: {_why_not(self.cm, self.spec, shape)}"
                    )
                finished = True  # the same GPU count on more nodes fits no better
            else:
                kept.append(table)
        self.position += 1
        if finished or self.position >= len(group):
            self.queue.pop(0)
            self.position = 0
            if not self.ordered and kept:
                self.queue = coarse_to_fine(self.queue)
                self.ordered = True

    def context(self) -> PoolContext:
        shapes = [t for g in sorted(self.kept) for t in self.kept[g]]
        notes = [n for g in sorted(self.notes) for n in self.notes[g]]
        utilisation = shapes[0].reference_utilisation() if shapes else 1.0
        return PoolContext(
            self.pool, self.index, self.cm, self.node_limit, shapes, notes, utilisation
        )


def coarse_to_fine(items: Sequence[int]) -> list[int]:
    """``items`` reordered middle first, then the middles of the halves, and so on."""
    out: list[int] = []
    spans = [(0, len(items))]
    while spans:
        nxt = []
        for lo, hi in spans:
            if lo >= hi:
                continue
            mid = (lo + hi) // 2
            out.append(items[mid])
            nxt += [(lo, mid), (mid + 1, hi)]
        spans = nxt
    return out


def build_pool_context(
    spec: PlanSpec,
    pool: PlanPool,
    index: int,
    coefficients: CoefficientsDocument | None,
    cache: ShapeCache,
) -> PoolContext:
    builder = PoolBuilder(spec, pool, index, coefficients, cache)
    while not builder.done:
        builder.step()
    return builder.context()


def pool_utilisation(
    spec: PlanSpec, pool: PlanPool, coefficients: CoefficientsDocument | None
) -> float:
    """`PoolContext.utilisation` without building the pool's other shapes (for evaluating a
    decided plan: `shardmeter.plan.fixed`)."""
    builder = PoolBuilder(spec, pool, 0, coefficients, ShapeCache(spec, BatchGrid.of(spec)))
    while not builder.done and not builder.first_built:
        builder.step()
    first = next((t for g in sorted(builder.kept) for t in builder.kept[g]), None)
    return first.reference_utilisation() if first is not None else 1.0


def _node_limit(pool: PlanPool) -> int:
    return pool.nodes if pool.max_nodes is None else min(pool.nodes, pool.max_nodes)


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
