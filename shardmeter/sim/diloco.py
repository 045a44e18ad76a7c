"""DiLoCo across islands (paper §III-C.1 and §IV-D), with torchft's Streaming DiLoCo
schedule (the one TorchTitan uses and the paper models).

Each island's stream runs inner steps (their duration comes from the island's own FSDP
simulation — the nested graph of the paper's second level). With H = ``sync_every``,
F = ``fragments`` and τ = ``fragment_sync_delay``, fragment j (j = 0…F−1) owns the window of
W = H/F inner steps ending at completed-step count m·H + (j+1)·W:

* τ steps before the window ends (at count m·H + (j+1)·W − τ) its pseudo-gradient
  all_reduce starts on the shared **outer** stream, once *every* island reached that count;
* at the window's end each island waits for that all_reduce, then applies the fragment's
  outer optimizer step (and merges) before its next inner step. If the all_reduce is not
  done, compute **blocks**.

τ = 0 is fully synchronous. **Blocking DiLoCo** is the case F = 1, τ = 0: after H inner
steps every island waits for the whole model's all_reduce. Islands that are faster than the
slowest one idle at every sync as well; that idle is reported per island, separately from
the blocking of the slowest island, which is what the outer step costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardmeter.errors import SpecError
from shardmeter.sim.engine import Kind, Schedule, TaskGraph, simulate
from shardmeter.spec.model import TransformerSpec

DEFAULT_ROUNDS = 3
"""Outer rounds simulated; the last one is measured (the first settles island drift)."""
MAX_ROUNDS = 100
"""Most outer rounds a simulation may run."""
MAX_SIMULATED_INNER_STEPS = 2_000_000
"""Most inner steps (islands × rounds × syncEvery) one DiLoCo simulation may hold: about
10 s and 0.9 GB on a 2-core machine. Three rounds of 64 islands at the largest syncEvery
(10,000) fit."""


@dataclass(frozen=True)
class StreamingSettings:
    """torchft's knobs: H, F and τ (validated: H % F == 0 and τ < H/F)."""

    sync_every: int
    fragments: int = 1
    delay: int = 0

    def __post_init__(self) -> None:
        if self.sync_every < 1 or self.fragments < 1 or self.delay < 0:
            raise SpecError("strategy", f"invalid settings {self}")
        if self.sync_every % self.fragments:
            raise SpecError(
                "strategy.syncEvery",
                f"{self.sync_every} is not a multiple of fragments {self.fragments} (torchft rule)",
            )
        if self.delay >= self.window:
            raise SpecError(
                "strategy.fragmentSyncDelay",
                f"{self.delay} must be < syncEvery / fragments = {self.window} (torchft rule)",
            )

    @property
    def window(self) -> int:
        return self.sync_every // self.fragments


def fragment_params(
    model: TransformerSpec, fragments: int, layout: str = "contiguous"
) -> list[int]:
    """Parameters of each fragment: blocks split contiguously (fragment j holds a run of
    consecutive blocks, the first L mod F runs one longer) or strided (blocks j, j+F, …);
    the embedding joins fragment 0 and the final norm + head the last one."""
    layers = model.num_layers
    if not 1 <= fragments <= layers:
        raise SpecError(
            "strategy.fragments",
            f"must be between 1 and the model's {layers} blocks (got {fragments})",
        )
    if layout == "contiguous":
        counts = [
            layers // fragments + (1 if j < layers % fragments else 0) for j in range(fragments)
        ]
    elif layout == "strided":
        counts = [len(range(j, layers, fragments)) for j in range(fragments)]
    else:
        raise SpecError(
            "strategy.fragmentLayout", f"must be contiguous or strided (got {layout!r})"
        )
    params = [c * model.params_per_block for c in counts]
    params[0] += model.params_embedding
    params[-1] += model.params_head
    return params


@dataclass(frozen=True)
class IslandSteps:
    """One island at the DiLoCo level."""

    name: str
    step_s: float
    """Inner step (from the island's FSDP simulation)."""
    outer_step_s: tuple[float, ...]
    """Outer optimizer step (and merge) of each fragment on this island."""


@dataclass(frozen=True)
class DiLoCoResult:
    schedule: Schedule
    settings: StreamingSettings
    rounds: int
    period_s: float
    """Wall-clock seconds of one outer step (H inner steps) in steady state."""
    no_comm_period_s: float
    """The same with instantaneous all_reduces (outer optimizer steps still run)."""
    blocking_s_per_outer_step: float
    """Compute stall of the slowest island waiting on outer all_reduces, per outer step."""
    island_idle_s_per_outer_step: tuple[float, ...]
    """Each island's idle per outer step (blocking plus waiting for slower islands)."""
    fragment_all_reduce_s: tuple[float, ...]

    @property
    def slowdown(self) -> float:
        """Relative slowdown versus the same run without DiLoCo communication."""
        return self.period_s / self.no_comm_period_s - 1.0 if self.no_comm_period_s > 0 else 0.0


def build_diloco_graph(
    islands: Sequence[IslandSteps],
    settings: StreamingSettings,
    all_reduce_s: Sequence[float],
    rounds: int = DEFAULT_ROUNDS,
) -> tuple[TaskGraph, list[list[int]]]:
    """The graph and, per island, the id of its last task after each completed step count
    (index c = 0…rounds·H; −1 before any task)."""
    if not islands:
        raise SpecError("islands", "at least one island is needed")
    if not 1 <= rounds <= MAX_ROUNDS:
        raise SpecError("rounds", f"must be between 1 and {MAX_ROUNDS} (got {rounds})")
    inner_steps = len(islands) * rounds * settings.sync_every
    if inner_steps > MAX_SIMULATED_INNER_STEPS:
        raise SpecError(
            "rounds",
            f"{len(islands)} island(s) × {rounds} round(s) × syncEvery {settings.sync_every} = "
            f"{inner_steps:,} inner steps to simulate; at most {MAX_SIMULATED_INNER_STEPS:,}",
        )
    if len(all_reduce_s) != settings.fragments:
        raise SpecError(
            "fragments",
            f"{len(all_reduce_s)} all_reduce durations for {settings.fragments} fragments",
        )
    for isl in islands:
        if len(isl.outer_step_s) != settings.fragments:
            raise SpecError(f"islands[{isl.name}].outer_step_s", "needs one value per fragment")
    g = TaskGraph()
    streams = [g.add_stream(f"{isl.name}/compute") for isl in islands]
    outer = g.add_stream("outer")
    h, w, tau = settings.sync_every, settings.window, settings.delay
    total = rounds * h
    last = [[-1] * (total + 1) for _ in islands]
    pending: dict[int, int] = {}
    for c in range(1, total + 1):
        steps = []
        for i, isl in enumerate(islands):
            steps.append(g.add(streams[i], f"step {c}", Kind.INNER_STEP, isl.step_s, group=i))
            last[i][c] = steps[-1]
        phase = c % h
        for j in range(settings.fragments):
            if phase == ((j + 1) * w - tau) % h:
                pending[j] = g.add(
                    outer,
                    f"all_reduce fragment {j} (after step {c})",
                    Kind.OUTER_ALL_REDUCE,
                    all_reduce_s[j],
                    steps,
                    group=-1,
                )
        for j in range(settings.fragments):
            if phase == ((j + 1) * w) % h:
                ar = pending.pop(j)
                for i, isl in enumerate(islands):
                    last[i][c] = g.add(
                        streams[i],
                        f"outer step fragment {j}",
                        Kind.OUTER_STEP,
                        isl.outer_step_s[j],
                        (ar,),
                        group=i,
                    )
    return g, last


def simulate_diloco(
    islands: Sequence[IslandSteps],
    settings: StreamingSettings,
    all_reduce_s: Sequence[float],
    rounds: int = DEFAULT_ROUNDS,
) -> DiLoCoResult:
    """Simulate ``rounds`` outer steps and measure the last one (see the module docstring)."""
    graph, last = build_diloco_graph(islands, settings, all_reduce_s, rounds)
    schedule = simulate(graph)
    period, idles = _steady_state(schedule, len(islands), last, settings.sync_every, rounds)
    quiet = simulate(
        graph.with_durations(
            [
                0.0 if k is Kind.OUTER_ALL_REDUCE else d
                for k, d in zip(graph.kind, graph.duration, strict=True)
            ]
        )
    )
    quiet_period, _ = _steady_state(quiet, len(islands), last, settings.sync_every, rounds)
    slowest = max(range(len(islands)), key=lambda i: (islands[i].step_s, -i))
    return DiLoCoResult(
        schedule=schedule,
        settings=settings,
        rounds=rounds,
        period_s=period,
        no_comm_period_s=quiet_period,
        blocking_s_per_outer_step=idles[slowest],
        island_idle_s_per_outer_step=tuple(idles),
        fragment_all_reduce_s=tuple(all_reduce_s),
    )


def _steady_state(
    schedule: Schedule, n_islands: int, last: list[list[int]], h: int, rounds: int
) -> tuple[float, list[float]]:
    """Period of the last round (slowest island) and each island's idle in it: the gaps on
    the island's stream between the end of step count (rounds−1)·H and rounds·H."""
    a, b = (rounds - 1) * h, rounds * h
    periods, idles = [], []
    for i in range(n_islands):
        first, final = last[i][a], last[i][b]
        t_a = schedule.end[first] if first >= 0 else 0.0
        periods.append(schedule.end[final] - t_a)
        tasks = [
            t
            for t in range(first + 1, final + 1)
            if schedule.graph.group[t] == i
            and schedule.graph.stream[t] == schedule.graph.stream[final]
        ]
        busy = sum(schedule.graph.duration[t] for t in tasks)
        idle = schedule.end[final] - t_a - busy
        idles.append(idle if idle > 1e-9 * max(1.0, busy) else 0.0)  # float noise is not idle
    return max(periods), idles
