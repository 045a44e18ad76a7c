"""One FSDP training step of one island as a two-stream task graph (paper §II-B, Fig. 1),
with FSDP2's semantics.

Units in forward order: embedding, blocks 0…L−1, final norm + head. For each micro-step
k = 1…A: for each unit, ``all_gather → forward``; then in reverse, ``all_gather → backward →
reduce_scatter``. Then the optimizer step, after the last reduce_scatter.

* **Gradient sync.** ``every-micro-batch`` (FSDP2's default, torchtitan, Composer):
  reduce_scatter after every micro-step's backward, into the sharded gradient.
  ``last-micro-batch`` (``set_requires_gradient_sync(False)`` until the last micro-step):
  reduce_scatter only on the last micro-step, all_gathers still every micro-step.
* **Reshard after forward.** A unit with ``reshard_after_forward`` False keeps its
  parameters from its forward to its backward: no all_gather before its backward. FSDP2
  sets this for the root unit (embedding, final norm and head), whose parameters are
  gathered once at the start of forward and reduce-scattered once at the end of backward:
  `FSDPDurations.from_cost_model` puts the root's whole all_gather and reduce_scatter on the
  embedding unit and none on the head. A non-resharded unit whose all_gather (or
  reduce_scatter) is zero gets no task of that kind at all.
* **Comm/compute interference.** Communication kernels share SMs and HBM with the compute
  kernels that overlap them; compute slows by ``overlap_slowdown`` × the time the two
  streams overlap (see `INTERFERENCE_PER_OVERLAPPED_SECOND`). The step time adds it after
  the schedule; the timeline itself shows the uncontended schedule.

Streams: one compute and one comm stream (one compute and one communication task active at
a time, as in the paper). Comm order in the backward pass follows FSDP's ``BACKWARD_PRE``
prefetch: the next unit's all_gather is issued before the current unit's reduce_scatter.

**Prefetch bound.** At most ``max_inflight`` gathered units are resident: the j-th
all_gather of the step may start only once the compute task that consumed the
(j − max_inflight)-th has finished and freed its parameters. The default of 2 (the unit
computing now plus one prefetched) matches FSDP1's ``limit_all_gathers`` rate limiter and
FSDP2's implicit one-unit-ahead prefetch on its all-gather stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from shardmeter.cost.model import CostModel
from shardmeter.cost.stragglers import straggler_factor
from shardmeter.errors import SpecError
from shardmeter.sim.bottleneck import Bottleneck
from shardmeter.sim.engine import Category, Kind, Schedule, TaskGraph, simulate
from shardmeter.spec.base import format_seconds
from shardmeter.spec.training import GradientSync

DEFAULT_MAX_INFLIGHT = 2

MAX_UNITS = 2048
"""Most FSDP units a step may have (a model has at most 1,024 blocks, plus its root)."""
MAX_ACCUMULATION = 65_536
"""Most micro-steps an optimizer step may have."""
MAX_SIMULATED_UNIT_STEPS = 100_000
"""Most unit × micro-step pairs one simulated step may hold (≈ 500,000 tasks: about 10 s
and 400 MB on a 2-core machine). Larger steps are predicted from three micro-steps
(`shardmeter.sim.scenario.IslandStepModel.step_s`, exact after the first micro-step)."""

INTERFERENCE_PER_OVERLAPPED_SECOND = 0.61
"""Compute time lost per second that communication overlaps it. Lee et al., *Characterizing
Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning* (arXiv
2507.03114, 2025; GPT and Llama on A100, H100, MI250, MI210) measure two averages: compute
slows by 18.9 % when overlapped, and running compute and communication back to back is
10.2 % slower than overlapping them. With communication C and compute T, the second says
(T + C) = 1.102 · 1.189 · T, so C = 0.31 T; the 18.9 % slowdown therefore costs
0.189 / 0.31 = 0.61 s of compute per second of overlapped communication."""


@dataclass(frozen=True)
class FSDPDurations:
    """Seconds of every task of one micro-step, per unit in forward order."""

    unit_names: tuple[str, ...]
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    all_gather_s: tuple[float, ...]
    reduce_scatter_s: tuple[float, ...]
    optimizer_s: float
    reshard_after_forward: tuple[bool, ...] = field(default=())
    """Per unit; empty = every unit is resharded after forward (re-gathered for backward)."""
    overlap_slowdown: float = 0.0
    """Compute seconds lost per second of compute/comm overlap (0 = no interference)."""

    def __post_init__(self) -> None:
        n = len(self.unit_names)
        for label in ("forward_s", "backward_s", "all_gather_s", "reduce_scatter_s"):
            values = getattr(self, label)
            if len(values) != n:
                raise SpecError(label, f"has {len(values)} values for {n} units")
            if any(not v >= 0 for v in values):
                raise SpecError(label, "durations must be ≥ 0")
        if self.reshard_after_forward and len(self.reshard_after_forward) != n:
            raise SpecError(
                "reshard_after_forward",
                f"has {len(self.reshard_after_forward)} values for {n} units",
            )
        if not self.optimizer_s >= 0:
            raise SpecError("optimizer_s", "must be ≥ 0")
        if not 0 <= self.overlap_slowdown <= 1:
            raise SpecError("overlap_slowdown", f"must be in [0, 1] (got {self.overlap_slowdown})")
        if n == 0:
            raise SpecError("units", "at least one unit is needed")

    def resharded(self, unit: int) -> bool:
        return not self.reshard_after_forward or self.reshard_after_forward[unit]

    def scaled_compute(self, scale: float) -> FSDPDurations:
        """The same step with every compute-stream task ``scale`` times as long (forward,
        backward, optimizer): what a `CostModel` with that observed compute scale gives."""
        return replace(
            self,
            forward_s=tuple(v * scale for v in self.forward_s),
            backward_s=tuple(v * scale for v in self.backward_s),
            optimizer_s=self.optimizer_s * scale,
        )

    @classmethod
    def from_cost_model(
        cls, cm: CostModel, nodes: int, gpus_per_node: int, micro_batch: int
    ) -> FSDPDurations:
        """Durations of one micro-step on an island of ``nodes × gpus_per_node`` GPUs.

        Blocks are gathered before forward and again before backward. The root unit
        (embedding + final norm + head) is gathered once before the embedding's forward and
        reduce-scattered once after the embedding's backward (FSDP2 keeps the root unsharded
        after forward). FSDP2's copies around the collectives are charged where they run: the
        copy out of the all_gather buffer on the compute stream (with the unit's forward or
        backward), the copy into the reduce_scatter buffer on the comm stream. Under HSDP the
        gathers and reduce_scatters span one shard group and each reduce_scatter is followed
        by the all_reduce of the shards across replicas. Compute runs at the pace of the
        island's slowest GPU (`shardmeter.cost.stragglers`)."""
        u = cm.unit_times(micro_batch)
        p = cm.payloads()
        layers = cm.model.num_layers
        ranks = nodes * gpus_per_node
        sharded = cm.shard_ranks(nodes, gpus_per_node) > 1
        root = p.embedding_params + p.head_params

        def ag(n: float, block: bool = True) -> float:
            return cm.gather_seconds(n, nodes, gpus_per_node, block) if sharded else 0.0

        def rs(n: float) -> float:
            if ranks <= 1:
                return 0.0
            return cm.gradient_sync_seconds(n, nodes, gpus_per_node) + cm.fsdp_copy_seconds(n)[1]

        copy_out_block = cm.fsdp_copy_seconds(p.block_params)[0] if sharded else 0.0
        copy_out_root = cm.fsdp_copy_seconds(root, block=False)[0] if sharded else 0.0
        slow = straggler_factor(ranks)
        return cls(
            unit_names=("embedding", *(f"block{i}" for i in range(layers)), "head"),
            forward_s=(
                slow * (u.embedding_forward_s + copy_out_root),
                *([slow * (u.block_forward_s + copy_out_block)] * layers),
                slow * u.head_forward_s,
            ),
            backward_s=(
                slow * u.embedding_backward_s,
                *([slow * (u.block_backward_s + copy_out_block)] * layers),
                slow * u.head_backward_s,
            ),
            all_gather_s=(ag(root, block=False), *([ag(p.block_params)] * layers), 0.0),
            reduce_scatter_s=(rs(root), *([rs(p.block_params)] * layers), 0.0),
            optimizer_s=slow * cm.optimizer_seconds(cm.shard_ranks(nodes, gpus_per_node)),
            reshard_after_forward=(False, *([True] * layers), False),
            overlap_slowdown=(
                INTERFERENCE_PER_OVERLAPPED_SECOND * cm.contention_scale(nodes, gpus_per_node)
                if ranks > 1
                else 0.0
            ),
        )


def build_fsdp_step(
    d: FSDPDurations,
    accumulation: int = 1,
    max_inflight: int = DEFAULT_MAX_INFLIGHT,
    gradient_sync: GradientSync = GradientSync.EVERY_MICRO_BATCH,
) -> TaskGraph:
    """The task graph of one optimizer step with ``accumulation`` micro-steps."""
    if accumulation < 1:
        raise SpecError("accumulation", f"must be ≥ 1 (got {accumulation})")
    if max_inflight < 1:
        raise SpecError("max_inflight", f"must be ≥ 1 (got {max_inflight})")
    pairs = accumulation * len(d.unit_names)
    if pairs > MAX_SIMULATED_UNIT_STEPS:
        raise SpecError(
            "accumulation",
            f"{accumulation:,} micro-steps × {len(d.unit_names):,} FSDP units = {pairs:,} to "
            f"simulate; at most {MAX_SIMULATED_UNIT_STEPS:,} (accumulation ≤ "
            f"{max(1, MAX_SIMULATED_UNIT_STEPS // len(d.unit_names)):,} for this model)",
        )
    every = gradient_sync is not GradientSync.LAST_MICRO_BATCH
    g = TaskGraph()
    compute, comm = g.add_stream("compute"), g.add_stream("comm")
    names, n_units = d.unit_names, len(d.unit_names)

    def skip(u: int, seconds: float) -> bool:
        """A root member with nothing to move (its collective rides on another unit)."""
        return not d.resharded(u) and seconds == 0

    gathers: list[int] = []  # all_gather task ids in comm-stream order
    consumers: list[int] = []  # the compute task that uses each gather
    last_rs = -1
    for k in range(accumulation):
        last = k == accumulation - 1
        tag = f"[{k}]" if accumulation > 1 else ""
        for u in range(n_units):
            deps: tuple[int, ...] = ()
            ag = -1
            if not skip(u, d.all_gather_s[u]):
                ag = g.add(
                    comm, f"all_gather {names[u]}{tag}", Kind.ALL_GATHER, d.all_gather_s[u], group=k
                )
                deps = (ag,)
            fwd = g.add(
                compute, f"forward {names[u]}{tag}", Kind.FORWARD, d.forward_s[u], deps, group=k
            )
            if ag >= 0:
                gathers.append(ag)
                consumers.append(fwd)
        # backward comm order: the first unit's gather, then per unit the next unit's gather
        # (prefetch, issued first) and this unit's reduce_scatter
        backward = list(range(n_units - 1, -1, -1))
        order: list[tuple[str, int]] = []
        if d.resharded(backward[0]):
            order.append(("ag", backward[0]))
        for idx, u in enumerate(backward):
            if idx + 1 < n_units and d.resharded(backward[idx + 1]):
                order.append(("ag", backward[idx + 1]))
            if (every or last) and not skip(u, d.reduce_scatter_s[u]):
                order.append(("rs", u))
        bwd_gather: dict[int, int] = {}
        rs_tasks: dict[int, int] = {}
        rs_tag = tag if every else ""
        for op, u in order:
            if op == "ag":
                bwd_gather[u] = g.add(
                    comm,
                    f"all_gather {names[u]}{tag} (bwd)",
                    Kind.ALL_GATHER,
                    d.all_gather_s[u],
                    group=k,
                )
            else:
                rs_tasks[u] = g.add(
                    comm,
                    f"reduce_scatter {names[u]}{rs_tag}",
                    Kind.REDUCE_SCATTER,
                    d.reduce_scatter_s[u],
                    group=k,
                )
        for u in backward:
            deps = (bwd_gather[u],) if u in bwd_gather else ()
            b = g.add(
                compute, f"backward {names[u]}{tag}", Kind.BACKWARD, d.backward_s[u], deps, group=k
            )
            if u in bwd_gather:
                gathers.append(bwd_gather[u])
                consumers.append(b)
            if u in rs_tasks:
                g.depend(rs_tasks[u], b)
                if last:
                    last_rs = rs_tasks[u]
    g.add(
        compute,
        "optimizer step",
        Kind.OPTIMIZER,
        d.optimizer_s,
        (last_rs,) if last_rs >= 0 else (),
        group=accumulation - 1,
    )
    for j in range(max_inflight, len(gathers)):
        g.depend(gathers[j], consumers[j - max_inflight])
    return g


@dataclass(frozen=True)
class StepResult:
    """One simulated FSDP step and its bottleneck analysis."""

    schedule: Schedule
    step_s: float
    """The schedule's makespan plus ``interference_s``."""
    compute_busy_s: float
    comm_busy_s: float
    compute_idle_s: dict[str, float]
    """Compute-stream idle seconds by what it waited on (e.g. ``all_gather``)."""
    critical_path_s: dict[Category, float]
    overlap_s: float = 0.0
    """Seconds during which compute and communication ran at the same time."""
    interference_s: float = 0.0
    """Compute time lost to sharing the GPU with overlapped communication."""
    micro_steps_simulated: int = 0
    """Micro-steps ``schedule`` holds when fewer than the step's (a step too large to
    simulate whole, its figures carried on from these); 0 = all of them."""

    @property
    def verdict(self) -> Bottleneck:
        """``compute-bound`` or ``communication-bound``: the larger share of the critical path
        (interference counts as communication: it exists only because comm overlaps)."""
        cp = self.critical_path_s
        if cp[Category.COMMUNICATION] + self.interference_s > cp[Category.COMPUTE]:
            return Bottleneck.COMMUNICATION
        return Bottleneck.COMPUTE

    @property
    def compute_idle_fraction(self) -> float:
        return sum(self.compute_idle_s.values()) / self.step_s if self.step_s > 0 else 0.0

    def evidence(self) -> str:
        waits = (
            ", ".join(
                f"{format_seconds(v)} waiting on {k}"
                for k, v in sorted(self.compute_idle_s.items())
                if v > 0
            )
            or "no idle time"
        )
        contention = (
            f"; {format_seconds(self.interference_s)} lost to comm/compute contention"
            if self.interference_s > 0
            else ""
        )
        return f"{self.busy()}; compute idle: {waits}{contention}"

    def busy(self) -> str:
        """The short form of `evidence`: how busy each stream was in the step."""
        return (
            f"compute busy {format_seconds(self.compute_busy_s)}, comm busy "
            f"{format_seconds(self.comm_busy_s)} of {format_seconds(self.step_s)}"
        )


def overlap_seconds(schedule: Schedule) -> float:
    """Seconds during which the compute and comm streams were both busy (tasks of one
    stream run back to back in program order, so each stream's intervals are sorted)."""
    g = schedule.graph
    ci, mi = g.stream_names.index("compute"), g.stream_names.index("comm")
    start, end = schedule.start, schedule.end
    a = [(start[i], end[i]) for i, s in enumerate(g.stream) if s == ci and end[i] > start[i]]
    b = [(start[i], end[i]) for i, s in enumerate(g.stream) if s == mi and end[i] > start[i]]
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo = a[i][0] if a[i][0] > b[j][0] else b[j][0]
        hi = a[i][1] if a[i][1] < b[j][1] else b[j][1]
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def analyse(schedule: Schedule, overlap_slowdown: float = 0.0) -> StepResult:
    g = schedule.graph
    compute, comm = g.stream_names.index("compute"), g.stream_names.index("comm")
    overlap = overlap_seconds(schedule) if overlap_slowdown > 0 else 0.0
    interference = overlap_slowdown * overlap
    return StepResult(
        schedule=schedule,
        step_s=schedule.makespan_s + interference,
        compute_busy_s=sum(iv.seconds for iv in schedule.busy(compute)),
        comm_busy_s=sum(iv.seconds for iv in schedule.busy(comm)),
        compute_idle_s=schedule.idle_by_cause(compute),
        critical_path_s=schedule.critical_path_seconds(),
        overlap_s=overlap,
        interference_s=interference,
    )


def simulate_fsdp_step(
    d: FSDPDurations,
    accumulation: int = 1,
    max_inflight: int = DEFAULT_MAX_INFLIGHT,
    gradient_sync: GradientSync = GradientSync.EVERY_MICRO_BATCH,
) -> StepResult:
    """Simulate one step of ``accumulation`` micro-steps. A step larger than
    `MAX_SIMULATED_UNIT_STEPS` is simulated for its first k and k + 1 micro-steps (the
    largest k within the bound) and every figure is carried on linearly to ``accumulation``
    — exact once the one-micro-step transient is over (see
    `shardmeter.sim.scenario.IslandStepModel`); ``schedule`` then holds k + 1 micro-steps
    and ``micro_steps_simulated`` says so."""
    if not 1 <= accumulation <= MAX_ACCUMULATION:
        raise SpecError("accumulation", f"must be between 1 and {MAX_ACCUMULATION:,}")
    units = len(d.unit_names)
    if accumulation * units <= MAX_SIMULATED_UNIT_STEPS or accumulation <= 3:
        graph = build_fsdp_step(d, accumulation, max_inflight, gradient_sync)
        return analyse(simulate(graph), d.overlap_slowdown)
    k = max(2, MAX_SIMULATED_UNIT_STEPS // units - 1)
    a, b = (
        analyse(simulate(build_fsdp_step(d, n, max_inflight, gradient_sync)), d.overlap_slowdown)
        for n in (k, k + 1)
    )
    extra = accumulation - (k + 1)

    def carry(x: float, y: float) -> float:
        return y + extra * (y - x)

    return StepResult(
        schedule=b.schedule,
        step_s=carry(a.step_s, b.step_s),
        compute_busy_s=carry(a.compute_busy_s, b.compute_busy_s),
        comm_busy_s=carry(a.comm_busy_s, b.comm_busy_s),
        compute_idle_s={
            c: carry(a.compute_idle_s.get(c, 0.0), v) for c, v in b.compute_idle_s.items()
        },
        critical_path_s={
            c: carry(a.critical_path_s.get(c, 0.0), v) for c, v in b.critical_path_s.items()
        },
        overlap_s=carry(a.overlap_s, b.overlap_s),
        interference_s=carry(a.interference_s, b.interference_s),
        micro_steps_simulated=k + 1,
    )


@lru_cache(maxsize=32768)
def fsdp_step_seconds(
    d: FSDPDurations,
    accumulation: int = 1,
    max_inflight: int = DEFAULT_MAX_INFLIGHT,
    gradient_sync: GradientSync = GradientSync.EVERY_MICRO_BATCH,
) -> float:
    """Only the step time (no bottleneck analysis): what the optimizer needs. Cached by the
    durations, so pools with the same hardware and shapes share their simulations."""
    schedule = simulate(build_fsdp_step(d, accumulation, max_inflight, gradient_sync))
    if d.overlap_slowdown > 0:
        return schedule.makespan_s + d.overlap_slowdown * overlap_seconds(schedule)
    return schedule.makespan_s
