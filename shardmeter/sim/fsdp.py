"""One FSDP training step of one island as a two-stream task graph (paper §II-B, Fig. 1).

Units in forward order: embedding, blocks 0…L−1, final norm + head. For each micro-step
k = 1…A: for each unit, ``all_gather → forward``; then in reverse, ``all_gather → backward``
and, **only on the last micro-step**, ``reduce_scatter`` (during gradient accumulation FSDP
skips the reduce_scatter but must still gather parameters). Then the optimizer step, after
the last reduce_scatter.

Streams: one compute and one comm stream (one compute and one communication task active at
a time, as in the paper). Comm order in the backward pass follows PyTorch FSDP's
``BACKWARD_PRE`` prefetch: the next unit's all_gather is issued before the current unit's
reduce_scatter.

**Prefetch bound.** At most ``max_inflight`` gathered units are resident: the j-th
all_gather of the step may start only once the compute task that consumed the
(j − max_inflight)-th has finished and freed its parameters. The default of 2 (the unit
computing now plus one prefetched) matches FSDP1's ``limit_all_gathers`` rate limiter and
FSDP2's implicit one-unit-ahead prefetch on its all-gather stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from shardmeter.cost.model import CostModel
from shardmeter.errors import SpecError
from shardmeter.sim.engine import Category, Kind, Schedule, TaskGraph, simulate

DEFAULT_MAX_INFLIGHT = 2


@dataclass(frozen=True)
class FSDPDurations:
    """Seconds of every task of one micro-step, per unit in forward order."""

    unit_names: tuple[str, ...]
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    all_gather_s: tuple[float, ...]
    reduce_scatter_s: tuple[float, ...]
    optimizer_s: float

    def __post_init__(self) -> None:
        n = len(self.unit_names)
        for label in ("forward_s", "backward_s", "all_gather_s", "reduce_scatter_s"):
            values = getattr(self, label)
            if len(values) != n:
                raise SpecError(label, f"has {len(values)} values for {n} units")
            if any(v < 0 for v in values):
                raise SpecError(label, "durations must be ≥ 0")
        if self.optimizer_s < 0:
            raise SpecError("optimizer_s", "must be ≥ 0")
        if n == 0:
            raise SpecError("units", "at least one unit is needed")

    @classmethod
    def from_cost_model(
        cls, cm: CostModel, nodes: int, gpus_per_node: int, micro_batch: int
    ) -> FSDPDurations:
        u = cm.unit_times(micro_batch)
        p = cm.payloads()
        c, r = cm.training.compute_bytes, cm.training.grad_reduce_bytes
        layers = cm.model.num_layers
        params = [p.embedding_params, *([p.block_params] * layers), p.head_params]

        def ag(n: int) -> float:
            return cm.collective_seconds("all_gather", n * c, nodes, gpus_per_node)

        def rs(n: int) -> float:
            return cm.collective_seconds("reduce_scatter", n * r, nodes, gpus_per_node)

        return cls(
            unit_names=("embedding", *(f"block{i}" for i in range(layers)), "head"),
            forward_s=(u.embedding_forward_s, *([u.block_forward_s] * layers), u.head_forward_s),
            backward_s=(
                u.embedding_backward_s,
                *([u.block_backward_s] * layers),
                u.head_backward_s,
            ),
            all_gather_s=tuple(ag(n) for n in params),
            reduce_scatter_s=tuple(rs(n) for n in params),
            optimizer_s=cm.optimizer_seconds(nodes * gpus_per_node),
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "durations") -> FSDPDurations:
        """Explicit durations (what-if analysis). ``units`` is a list of
        ``{name, forward_s, backward_s, all_gather_s, reduce_scatter_s, repeat}``
        (``repeat`` expands e.g. 32 identical blocks), plus ``optimizer_s``."""
        units = data.get("units")
        if not isinstance(units, Sequence) or isinstance(units, str) or not units:
            raise SpecError(f"{where}.units", "must be a non-empty list of units")
        names: list[str] = []
        cols: dict[str, list[float]] = {
            k: [] for k in ("forward_s", "backward_s", "all_gather_s", "reduce_scatter_s")
        }
        for idx, unit in enumerate(units):
            loc = f"{where}.units[{idx}]"
            if not isinstance(unit, Mapping):
                raise SpecError(loc, "must be a mapping")
            unknown = set(unit) - {"name", "repeat", *cols}
            if unknown:
                raise SpecError(
                    f"{loc}.{sorted(unknown)[0]}",
                    "unknown field; allowed: name, repeat, " + ", ".join(cols),
                )
            repeat = unit.get("repeat", 1)
            if not isinstance(repeat, int) or repeat < 1:
                raise SpecError(f"{loc}.repeat", f"must be an integer ≥ 1 (got {repeat!r})")
            values = {}
            for key in cols:
                value = unit.get(key, 0.0)
                if not isinstance(value, int | float) or value < 0:
                    raise SpecError(f"{loc}.{key}", f"must be a number ≥ 0 (got {value!r})")
                values[key] = float(value)
            base = str(unit.get("name", f"unit{idx}"))
            for r in range(repeat):
                names.append(base if repeat == 1 else f"{base}{r}")
                for key, value in values.items():
                    cols[key].append(value)
        opt = data.get("optimizer_s", 0.0)
        if not isinstance(opt, int | float) or opt < 0:
            raise SpecError(f"{where}.optimizer_s", f"must be a number ≥ 0 (got {opt!r})")
        return cls(
            tuple(names),
            tuple(cols["forward_s"]),
            tuple(cols["backward_s"]),
            tuple(cols["all_gather_s"]),
            tuple(cols["reduce_scatter_s"]),
            float(opt),
        )


def build_fsdp_step(
    d: FSDPDurations, accumulation: int = 1, max_inflight: int = DEFAULT_MAX_INFLIGHT
) -> TaskGraph:
    """The task graph of one optimizer step with ``accumulation`` micro-steps."""
    if accumulation < 1:
        raise SpecError("accumulation", f"must be ≥ 1 (got {accumulation})")
    if max_inflight < 1:
        raise SpecError("max_inflight", f"must be ≥ 1 (got {max_inflight})")
    g = TaskGraph()
    compute, comm = g.add_stream("compute"), g.add_stream("comm")
    names, n_units = d.unit_names, len(d.unit_names)
    gathers: list[int] = []  # all_gather task ids in comm-stream order
    consumers: list[int] = []  # the compute task that uses each gather
    last_rs = -1
    for k in range(accumulation):
        last = k == accumulation - 1
        tag = f"[{k}]" if accumulation > 1 else ""
        for u in range(n_units):
            ag = g.add(
                comm, f"all_gather {names[u]}{tag}", Kind.ALL_GATHER, d.all_gather_s[u], group=k
            )
            gathers.append(ag)
            consumers.append(
                g.add(
                    compute,
                    f"forward {names[u]}{tag}",
                    Kind.FORWARD,
                    d.forward_s[u],
                    (ag,),
                    group=k,
                )
            )
        # backward: comm order AG(U-1), then per unit u: AG(u-1) [prefetch], RS(u) [last only]
        bwd_gather = {
            n_units - 1: g.add(
                comm,
                f"all_gather {names[-1]}{tag} (bwd)",
                Kind.ALL_GATHER,
                d.all_gather_s[-1],
                group=k,
            )
        }
        order: list[tuple[str, int]] = []
        for u in range(n_units - 1, -1, -1):
            if u >= 1:
                order.append(("ag", u - 1))
            if last:
                order.append(("rs", u))
        rs_tasks: dict[int, int] = {}
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
                    f"reduce_scatter {names[u]}",
                    Kind.REDUCE_SCATTER,
                    d.reduce_scatter_s[u],
                    group=k,
                )
        for u in range(n_units - 1, -1, -1):
            gathers.append(bwd_gather[u])
            b = g.add(
                compute,
                f"backward {names[u]}{tag}",
                Kind.BACKWARD,
                d.backward_s[u],
                (bwd_gather[u],),
                group=k,
            )
            consumers.append(b)
            if u in rs_tasks:
                g.depend(rs_tasks[u], b)
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
    compute_busy_s: float
    comm_busy_s: float
    compute_idle_s: dict[str, float]
    """Compute-stream idle seconds by what it waited on (e.g. ``all_gather``)."""
    critical_path_s: dict[Category, float]

    @property
    def verdict(self) -> str:
        """``compute-bound`` or ``communication-bound``: the larger share of the critical path."""
        cp = self.critical_path_s
        if cp[Category.COMMUNICATION] > cp[Category.COMPUTE]:
            return "communication-bound"
        return "compute-bound"

    @property
    def compute_idle_fraction(self) -> float:
        return sum(self.compute_idle_s.values()) / self.step_s if self.step_s > 0 else 0.0

    def evidence(self) -> str:
        waits = (
            ", ".join(
                f"{v * 1e3:.2f} ms waiting on {k}"
                for k, v in sorted(self.compute_idle_s.items())
                if v > 0
            )
            or "no idle time"
        )
        return (
            f"compute busy {self.compute_busy_s * 1e3:.2f} ms, comm busy {self.comm_busy_s * 1e3:.2f} ms "
            f"of {self.step_s * 1e3:.2f} ms; compute idle: {waits}"
        )


def analyse(schedule: Schedule) -> StepResult:
    step = schedule.makespan_s
    g = schedule.graph
    compute, comm = g.stream_names.index("compute"), g.stream_names.index("comm")
    return StepResult(
        schedule=schedule,
        step_s=step,
        compute_busy_s=sum(iv.seconds for iv in schedule.busy(compute)),
        comm_busy_s=sum(iv.seconds for iv in schedule.busy(comm)),
        compute_idle_s=schedule.idle_by_cause(compute),
        critical_path_s=schedule.critical_path_seconds(),
    )


def simulate_fsdp_step(
    d: FSDPDurations, accumulation: int = 1, max_inflight: int = DEFAULT_MAX_INFLIGHT
) -> StepResult:
    return analyse(simulate(build_fsdp_step(d, accumulation, max_inflight)))


@lru_cache(maxsize=32768)
def fsdp_step_seconds(
    d: FSDPDurations, accumulation: int = 1, max_inflight: int = DEFAULT_MAX_INFLIGHT
) -> float:
    """Only the step time (no bottleneck analysis): what the optimizer needs. Cached by the
    durations, so pools with the same hardware and shapes share their simulations."""
    return simulate(build_fsdp_step(d, accumulation, max_inflight)).makespan_s
