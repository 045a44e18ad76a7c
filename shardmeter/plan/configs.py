"""What one island can do per inner step: every configuration (micro-batch × accumulation ×
variant) of an island shape, reduced to the fastest one for every number of sequences.

**Configurations.** An island of shape N × G (r = N·G GPUs) runs micro-batch b (sequences per
GPU) with gradient accumulation A, and processes q = A·b·r sequences per inner step. Every b
from 1 to the memory maximum is tried (A = 1 up to the maximum without accumulation, A ≥ 2 up
to the maximum with accumulation, which keeps unsharded gradients resident), and every A up
to the point where one island alone exceeds the global batch limit. The step time at any A
comes from three simulations (`IslandStepModel`).

**Variants** are the further per-configuration knobs (for example a gradient-sync mode):
`config_variants` lists them, each a set of `TrainingSpec` overrides with its own cost model,
and the table keeps the fastest variant for every q. Today there is one (the request's own
training settings); adding a dimension means returning more variants there.

**The table.** For the search only (q, fastest step) matters: two configurations with the
same q are interchangeable in any plan, and the faster one is never worse. So each shape is
summarised as ``step_s[c]`` — the least step seconds to process c·u sequences per island
(u the `BatchGrid` quantum, 1 unless the batch is huge) — with the configuration achieving it.
Nothing else is dropped: in particular configurations that are slower than one with *more*
sequences stay, because an exact batch may need them.

**Limits.** Exactness holds for every micro-batch when a shape has at most
`MICRO_BATCH_BUDGET` candidates and for every sequence count when the global batch limit is at
most `MAX_CELLS` sequences. Beyond (e.g. ``seqLenTokens: 1``), micro-batches are sampled
(all small ones, then geometrically) and sequence counts are restricted to multiples of a
power-of-two quantum; the search is exact over that restricted space and says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from shardmeter.cost.model import CostModel
from shardmeter.plan.schema import PlanSpec
from shardmeter.sim.fsdp import FSDPDurations, fsdp_step_seconds
from shardmeter.sim.scenario import IslandShape, IslandStepModel
from shardmeter.spec.training import GradientSync

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MAX_CELLS = 8192
"""Global batch limits up to this many sequences are searched at single-sequence resolution."""

MICRO_BATCH_BUDGET = 256
"""Shapes with at most this many micro-batch candidates try every one."""

SAMPLED_MICRO_BATCHES = 48
"""Beyond the budget, this many micro-batches are tried per shape …"""

SMALL_MICRO_BATCHES = 16
"""… every one up to this many quanta, then geometrically spaced up to the maximum."""


@dataclass(frozen=True)
class BatchGrid:
    """The global batch in sequences and the cells the search counts in."""

    batch: int
    """B: requested sequences per inner step (all islands together)."""
    limit: int
    """L = ⌊B·(1 + tolerance)⌋: the most the islands may process together."""
    quantum: int
    """u: sequence counts are multiples of this (1 unless L > MAX_CELLS)."""

    @classmethod
    def of(cls, spec: PlanSpec) -> BatchGrid:
        batch = spec.training.global_batch_sequences
        limit = math.floor(batch * (1 + spec.constraints.global_batch_tolerance) + 1e-9)
        quantum = 1
        while limit // quantum > MAX_CELLS:
            quantum *= 2
        return cls(batch, limit, quantum)

    @property
    def lo(self) -> int:
        """The fewest cells that reach B."""
        return -(-self.batch // self.quantum)

    @property
    def hi(self) -> int:
        """The most cells within L."""
        return self.limit // self.quantum

    @property
    def exact(self) -> bool:
        return self.quantum == 1


@dataclass(frozen=True)
class ConfigVariant:
    """One value of every per-configuration knob besides micro-batch and accumulation."""

    name: str = ""
    """Shown in plans when non-empty (e.g. ``gradientSync=last-micro-batch``)."""
    gradient_sync: GradientSync | None = None
    """The FSDP gradient-accumulation mode (None: the training spec's)."""
    training_overrides: tuple[tuple[str, Any], ...] = ()
    """Further `TrainingSpec` fields this variant sets."""


def config_variants(spec: PlanSpec) -> list[ConfigVariant]:
    """The variants the optimizer tries: both gradient-sync modes when the request says
    ``gradientSync: auto``, else the request's own training settings."""
    if spec.training.gradient_sync is GradientSync.AUTO:
        return [
            ConfigVariant(f"gradientSync={mode.value}", mode)
            for mode in (GradientSync.EVERY_MICRO_BATCH, GradientSync.LAST_MICRO_BATCH)
        ]
    return [ConfigVariant()]


def variant_cost_model(base: CostModel, variant: ConfigVariant) -> CostModel:
    if not variant.training_overrides:
        return base
    training = base.training.model_copy(update=dict(variant.training_overrides))
    return CostModel(base.model, training, base.pool, base.coefficients)


def first_steps(model: IslandStepModel, count: int) -> list[float]:
    """Step seconds at accumulation 1…``count`` (≤ 3). With three, the model's own (it needs
    all three for its extrapolation); with fewer, only those micro-steps are simulated, with
    the very call the model makes (`fsdp_step_seconds` on its durations, prefetch bound and
    gradient-sync mode — a test holds the two equal), which spares a sixth of the simulations
    of the case study."""
    if count >= 3:
        return [model.step_s(a) for a in (1, 2, 3)]
    return [
        fsdp_step_seconds(model.durations, a, model.max_inflight, model.gradient_sync)
        for a in range(1, count + 1)
    ]


def micro_batch_candidates(
    upper: int, step: int = 1, budget: int = MICRO_BATCH_BUDGET
) -> list[int]:
    """Multiples of ``step`` up to ``upper``: all of them when at most ``budget``, else
    `SAMPLED_MICRO_BATCHES` of them — the first `SMALL_MICRO_BATCHES`, then geometrically
    spaced up to ``upper`` (always included)."""
    count = upper // step
    if count <= budget:
        return [step * i for i in range(1, count + 1)]
    small = list(range(1, SMALL_MICRO_BATCHES + 1))
    rest = np.geomspace(SMALL_MICRO_BATCHES + 1, count, SAMPLED_MICRO_BATCHES - SMALL_MICRO_BATCHES)
    picks = sorted({*small, *(round(float(x)) for x in rest), count})
    return [step * i for i in picks]


@dataclass
class ShapeTable:
    """Everything the search needs about one island shape on one kind of pool."""

    shape: IslandShape
    step_s: FloatArray
    """Least step seconds to process c·u sequences per island (index c); inf if impossible."""
    micro_batch: IntArray
    accumulation: IntArray
    variant: IntArray
    """The configuration achieving ``step_s[c]`` (index into the variants)."""
    outer_step_s: FloatArray
    """Index F − 1: DiLoCo outer optimizer steps of one outer step on one rank of this shape
    with the model cut into F fragments (one call per fragment, as the simulator charges
    them: `shardmeter.sim.scenario.outer_step_seconds_by_fragments`); one entry (F = 1)
    unless the strategy is Streaming DiLoCo."""
    micro_batch_max: int
    """The memory maximum without accumulation (before the batch limit)."""
    micro_batches_tried: int
    sampled: bool
    """True when micro-batches were sampled (more than `MICRO_BATCH_BUDGET` candidates)."""
    models: dict[tuple[int, int], IslandStepModel] = field(repr=False, default_factory=dict)
    """(variant, micro-batch) → the step model (kept for simulating the chosen plan)."""
    _utilisation: float | None = field(default=None, repr=False, compare=False)

    def freeze(self) -> None:
        """Make the arrays read-only: a table may be shared by pools and requests
        (`shardmeter.plan.options.SpaceStore`)."""
        for a in (self.step_s, self.micro_batch, self.accumulation, self.variant):
            a.flags.writeable = False
        self.outer_step_s.flags.writeable = False

    @property
    def ranks(self) -> int:
        return self.shape.ranks

    @property
    def cells(self) -> IntArray:
        """The cells this shape can process at all."""
        return np.flatnonzero(np.isfinite(self.step_s))

    def reference_utilisation(self) -> float:
        """Compute-stream busy share of one island's step at the shape's *reference
        configuration*: the first variant that fits a micro-batch, at the largest
        micro-batch it tries, without accumulation (`StepResult.compute_busy_s` ÷
        ``step_s``); simulated once per table."""
        if self._utilisation is None:
            self._utilisation = self._reference_utilisation()
        return self._utilisation

    def _reference_utilisation(self) -> float:
        for vi in sorted({v for v, _ in self.models}):
            b = max(m for v, m in self.models if v == vi)
            step = self.models[(vi, b)].simulate(1)
            return step.compute_busy_s / step.step_s if step.step_s > 0 else 1.0
        return 1.0


def _durations_dominate(a: FSDPDurations, b: FSDPDurations) -> bool:
    """Every task of ``a`` is at most as long as ``b``'s (same units): then ``a``'s step is
    never slower, since a fixed-order task graph's makespan is monotone in its durations."""
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, int | float) and isinstance(y, int | float):
            if x > y:
                return False
        elif isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y):
            if all(isinstance(v, int | float) for v in x):
                if any(p > q for p, q in zip(x, y, strict=True)):
                    return False
            elif x != y:
                return False
        elif x != y:
            return False
    return True


@dataclass(frozen=True)
class MicroBatchPlan:
    """The micro-batches one variant of a shape tries."""

    micro_batches: tuple[int, ...]
    b_max: int
    """Memory maximum without accumulation."""
    b_acc: int
    """Memory maximum with accumulation."""
    sampled: bool


def micro_batch_plan(
    variants: Sequence[tuple[ConfigVariant, CostModel]],
    shape: IslandShape,
    grid: BatchGrid,
    outer_state_on_gpu: bool,
) -> list[MicroBatchPlan]:
    """Per variant: every micro-batch up to the memory maximum and the batch limit (b·r must
    be a multiple of the quantum), sampled beyond `MICRO_BATCH_BUDGET`."""
    r = shape.ranks
    b_step = grid.quantum // math.gcd(grid.quantum, r)
    out = []
    for variant, vcm in variants:
        sync, g = variant.gradient_sync, shape.gpus_per_node
        b1 = vcm.max_micro_batch(r, 1, outer_state_on_gpu, gradient_sync=sync, gpus_per_node=g)
        b_acc = vcm.max_micro_batch(r, 2, outer_state_on_gpu, gradient_sync=sync, gpus_per_node=g)
        upper = min(b1, grid.limit // r)
        candidates = micro_batch_candidates(upper, b_step)
        out.append(MicroBatchPlan(tuple(candidates), b1, b_acc, len(candidates) < upper // b_step))
    return out


def shape_dominates(
    variants: Sequence[tuple[ConfigVariant, CostModel]],
    better: IslandShape,
    shape: IslandShape,
    micro_batches: Sequence[int],
) -> bool:
    """``better`` (same GPUs, fewer nodes) is never slower than ``shape``: at every micro-batch
    and variant each of its FSDP tasks is at most as long (see `_durations_dominate`). The
    caller checks that ``better`` fits at least the same micro-batches."""
    return all(
        _durations_dominate(
            FSDPDurations.from_cost_model(vcm, better.nodes, better.gpus_per_node, b),
            FSDPDurations.from_cost_model(vcm, shape.nodes, shape.gpus_per_node, b),
        )
        for _, vcm in variants
        for b in micro_batches
    )


def build_shape_table(
    cm: CostModel,
    variants: Sequence[tuple[ConfigVariant, CostModel]],
    shape: IslandShape,
    grid: BatchGrid,
    outer_state_on_gpu: bool,
    outer_step_s: Sequence[float],
) -> ShapeTable | None:
    """The table of ``shape`` (None when it cannot process a single cell); ``outer_step_s``
    its outer optimizer steps by fragment count (`ShapeTable.outer_step_s`)."""
    r = shape.ranks
    cells = grid.hi
    u = grid.quantum
    step_s = np.full(cells + 1, np.inf)
    mb = np.zeros(cells + 1, dtype=np.int64)
    acc = np.zeros(cells + 1, dtype=np.int64)
    var = np.zeros(cells + 1, dtype=np.int64)
    models: dict[tuple[int, int], IslandStepModel] = {}
    plans = micro_batch_plan(variants, shape, grid, outer_state_on_gpu)
    sampled = any(p.sampled for p in plans)
    b_max_seen = max((p.b_max for p in plans), default=0)
    tried = 0
    for vi, plan in enumerate(plans):
        vcm, b_acc = variants[vi][1], plan.b_acc
        for b in plan.micro_batches:
            model = IslandStepModel(vcm, shape, b, gradient_sync=variants[vi][0].gradient_sync)
            tried += 1
            models[(vi, b)] = model
            unit = b * r // u  # cells per micro-step
            a_max = cells // unit if b <= b_acc else 1
            a = np.arange(1, a_max + 1)
            t = np.array(first_steps(model, min(a_max, 3)))
            if a_max > 3:
                t = np.concatenate([t, model.step_s(2) + (a[3:] - 2) * model.increment_s])
            idx = a * unit
            better = t < step_s[idx]
            step_s[idx[better]] = t[better]
            mb[idx[better]] = b
            acc[idx[better]] = a[better]
            var[idx[better]] = vi
    if not np.isfinite(step_s).any():
        return None
    return ShapeTable(
        shape=shape,
        step_s=step_s,
        micro_batch=mb,
        accumulation=acc,
        variant=var,
        outer_step_s=np.asarray(outer_step_s, dtype=np.float64),
        micro_batch_max=b_max_seen,
        micro_batches_tried=tried,
        sampled=sampled,
        models=models,
    )


def candidate_shapes(
    gpus_per_node: int,
    node_limit: int,
    min_gpus: int,
    max_gpus: int | None,
    nodes_step: int = 1,
) -> dict[int, list[IslandShape]]:
    """Island shapes by GPU count, fewest nodes first (G divides the GPUs per node; N is a
    multiple of ``nodes_step``, `TrainingSpec.island_nodes_step`: whole hsdp shard groups)."""
    out: dict[int, list[IslandShape]] = {}
    for g in range(gpus_per_node, 0, -1):
        if gpus_per_node % g:
            continue
        for n in range(nodes_step, node_limit + 1, nodes_step):
            r = n * g
            if r < min_gpus or (max_gpus is not None and r > max_gpus):
                continue
            out.setdefault(r, []).append(IslandShape(n, g))
    return {r: sorted(v, key=lambda s: (s.nodes, -s.gpus_per_node)) for r, v in sorted(out.items())}


def class_key(cm: CostModel) -> str:
    """Pools whose islands run at the same speed share their tables: the same hardware (GPU,
    GPUs per node, links, network, power cap) and the same predictive coefficients (with the
    attention kernel they were timed with), the observed compute correction included
    (`CostModel.compute_scale`) — names, node counts, prices, sites, WAN uplinks, PUE, carbon
    intensity, egress prices and node billing do not change an island's step."""
    hardware = cm.pool.model_dump(
        mode="json",
        exclude={
            "name",
            "nodes",
            "max_nodes",
            "price_per_gpu_hour_usd",
            "site",
            "wan_uplink",
            "coefficients",
            "pue",
            "grid_carbon_intensity_g_per_kwh",
            "wan_egress_usd_per_gb",
            "exclusive_nodes",
        },
    )
    doc = cm.coefficients.model_dump(
        mode="json",
        include={"gpu", "precision", "attention_kernel", "compute", "communication", "memory"},
    )
    return json.dumps([hardware, doc, cm.compute_scale], sort_keys=True)
