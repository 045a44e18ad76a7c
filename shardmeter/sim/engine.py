"""A deterministic multi-stream task-graph simulator.

A graph has **streams** (e.g. compute, comm, outer); tasks in one stream run one at a time
in the order they were added (program order); **dependencies** are extra edges, usually
across streams. A task starts at max(its stream is free, all its dependencies are done) and
runs for its duration — there is no other contention. Because of that, start times do not
depend on the order in which ready tasks are processed; the simulation is a single pass in a
topological order (Kahn's algorithm seeded in task-id order), deterministic by construction.

For every task the simulator records the **binding predecessor**: the stream predecessor or
dependency whose end fixed the task's start (ties go to the lower task id). Walking those
back from the last task gives the **critical path**.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from shardmeter.errors import ShardMeterError


class Kind(StrEnum):
    """What a task does. The category decides bottleneck attribution."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    INNER_STEP = "inner_step"
    OUTER_STEP = "outer_step"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    OUTER_ALL_REDUCE = "outer_all_reduce"

    @property
    def category(self) -> Category:
        if self in (Kind.ALL_GATHER, Kind.REDUCE_SCATTER):
            return Category.COMMUNICATION
        if self is Kind.OUTER_ALL_REDUCE:
            return Category.OUTER
        return Category.COMPUTE


class Category(StrEnum):
    COMPUTE = "compute"
    COMMUNICATION = "communication"
    OUTER = "outer"


class GraphError(ShardMeterError):
    """The task graph is malformed (unknown task id, cycle, negative duration)."""


@dataclass
class TaskGraph:
    """Tasks as parallel lists (fast to build and to simulate)."""

    stream_names: list[str] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    kind: list[Kind] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    deps: list[list[int]] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    """Free integer tag per task (island index for DiLoCo graphs, micro-step for FSDP)."""
    _stream_ids: dict[str, int] = field(default_factory=dict)

    def add_stream(self, name: str) -> int:
        if name in self._stream_ids:
            return self._stream_ids[name]
        self._stream_ids[name] = len(self.stream_names)
        self.stream_names.append(name)
        return self._stream_ids[name]

    def add(
        self,
        stream: int,
        name: str,
        kind: Kind,
        duration_s: float,
        deps: Iterable[int] = (),
        group: int = 0,
    ) -> int:
        """Append a task to ``stream`` (after that stream's earlier tasks); returns its id."""
        if duration_s < 0:
            raise GraphError(f"task {name!r}: duration must be ≥ 0 (got {duration_s})")
        tid = len(self.name)
        self.name.append(name)
        self.kind.append(kind)
        self.stream.append(stream)
        self.duration.append(duration_s)
        self.deps.append(list(deps))
        self.group.append(group)
        return tid

    def depend(self, task: int, on: int) -> None:
        """Add the edge ``on`` → ``task`` (``task`` may have been added before ``on``)."""
        self.deps[task].append(on)

    def __len__(self) -> int:
        return len(self.name)

    def with_durations(self, durations: Sequence[float]) -> TaskGraph:
        """The same graph with other durations (what-if analysis)."""
        if len(durations) != len(self):
            raise GraphError(f"expected {len(self)} durations, got {len(durations)}")
        return TaskGraph(
            self.stream_names,
            self.name,
            self.kind,
            self.stream,
            list(durations),
            self.deps,
            self.group,
            self._stream_ids,
        )


@dataclass(frozen=True)
class Interval:
    start_s: float
    end_s: float
    task: int
    """The task running (busy) or the task whose wait caused the gap (idle; −1 if none)."""

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass
class Schedule:
    """Start and end of every task, plus analysis helpers."""

    graph: TaskGraph
    start: list[float]
    end: list[float]
    binding: list[int]
    """Per task: the predecessor whose end fixed its start, −1 if it started at 0."""

    @property
    def makespan_s(self) -> float:
        return max(self.end, default=0.0)

    def last_task(self) -> int:
        best, best_end = -1, -1.0
        for i, e in enumerate(self.end):
            if e >= best_end:  # ties: the later task (deterministic)
                best, best_end = i, e
        return best

    def critical_path(self) -> list[int]:
        """Task ids from the first to the last task along binding predecessors."""
        path = []
        i = self.last_task()
        while i >= 0:
            path.append(i)
            i = self.binding[i]
        return path[::-1]

    def critical_path_seconds(self) -> dict[Category, float]:
        """Time on the critical path by category, including the waits the path crosses
        (a gap before a task that waited on a task of another category is charged to the
        category it waited on)."""
        out = dict.fromkeys(Category, 0.0)
        g = self.graph
        for i in self.critical_path():
            out[g.kind[i].category] += g.duration[i]
        return out

    def stream_tasks(self, stream: int) -> list[int]:
        return [i for i, s in enumerate(self.graph.stream) if s == stream]

    def busy(self, stream: int) -> list[Interval]:
        return [
            Interval(self.start[i], self.end[i], i)
            for i in self.stream_tasks(stream)
            if self.end[i] > self.start[i]
        ]

    def idle(self, stream: int, until_s: float | None = None) -> list[Interval]:
        """Gaps in ``stream`` between 0 and ``until_s`` (default: the makespan); each names
        the dependency the next task waited on (−1 for the trailing gap)."""
        until = self.makespan_s if until_s is None else until_s
        gaps, cursor = [], 0.0
        for i in self.stream_tasks(stream):
            if self.start[i] > cursor + 1e-15:
                gaps.append(Interval(cursor, self.start[i], self.binding[i]))
            cursor = max(cursor, self.end[i])
        if until > cursor + 1e-15:
            gaps.append(Interval(cursor, until, -1))
        return gaps

    def outer_waits(self, stream: int) -> list[tuple[Interval, str]]:
        """Idle gaps of ``stream`` before tasks that waited on an outer all_reduce, split into
        ``imbalance`` (until the last island waiting on the same all_reduce got there: the
        wait for slower islands, which lockstep syncs impose anyway) and ``blocking`` (after
        that: the all_reduce itself was still running)."""
        ready = self._sync_ready()
        out: list[tuple[Interval, str]] = []
        tasks = self.stream_tasks(stream)
        until = max((self.end[i] for i in tasks), default=0.0)
        for gap in self.idle(stream, until):
            if gap.task < 0 or self.graph.kind[gap.task] is not Kind.OUTER_ALL_REDUCE:
                continue
            split = min(max(ready.get(gap.task, gap.start_s), gap.start_s), gap.end_s)
            if split > gap.start_s:
                out.append((Interval(gap.start_s, split, gap.task), "imbalance"))
            if gap.end_s > split:
                out.append((Interval(split, gap.end_s, gap.task), "blocking"))
        return out

    def _sync_ready(self) -> dict[int, float]:
        """Per outer all_reduce: when the last task waiting on it had its stream free."""
        g = self.graph
        prev_end: dict[int, float] = {}
        ready: dict[int, float] = {}
        for i in range(len(g)):
            free = prev_end.get(g.stream[i], 0.0)
            for d in g.deps[i]:
                if g.kind[d] is Kind.OUTER_ALL_REDUCE and g.kind[i] is not Kind.OUTER_ALL_REDUCE:
                    ready[d] = max(ready.get(d, 0.0), free)
            prev_end[g.stream[i]] = self.end[i]
        return ready

    def idle_by_cause(self, stream: int, until_s: float | None = None) -> dict[str, float]:
        """Idle seconds of ``stream`` keyed by the kind of task it waited on ('end' for the
        trailing gap after the stream's last task)."""
        out: dict[str, float] = defaultdict(float)
        for gap in self.idle(stream, until_s):
            out[self.graph.kind[gap.task].value if gap.task >= 0 else "end"] += gap.seconds
        return dict(out)


def simulate(graph: TaskGraph) -> Schedule:
    """Start/end times of every task (see the module docstring)."""
    n = len(graph)
    stream_prev = [-1] * n
    last_in_stream: dict[int, int] = {}
    for i, s in enumerate(graph.stream):
        stream_prev[i] = last_in_stream.get(s, -1)
        last_in_stream[s] = i
    # successors: the stream successor, plus reverse dependency edges
    stream_next = [-1] * n
    for i, p in enumerate(stream_prev):
        if p >= 0:
            stream_next[p] = i
    rdeps: dict[int, list[int]] = defaultdict(list)
    deps = graph.deps
    indeg = [(p >= 0) + len(ds) for p, ds in zip(stream_prev, deps, strict=True)]
    for i, ds in enumerate(deps):
        for d in ds:
            if not 0 <= d < n:
                raise GraphError(f"task {graph.name[i]!r} depends on unknown task id {d}")
            rdeps[d].append(i)
    start = [0.0] * n
    end = [0.0] * n
    binding = [-1] * n
    dur = graph.duration
    ready = deque(i for i in range(n) if indeg[i] == 0)
    done = 0
    while ready:
        i = ready.popleft()
        done += 1
        t, b = 0.0, -1
        p = stream_prev[i]
        if p >= 0:
            t, b = end[p], p
        for d in deps[i]:
            e = end[d]
            if e > t or (e == t and (b < 0 or d < b)):
                t, b = e, d
        start[i] = t
        end[i] = t + dur[i]
        binding[i] = b
        j = stream_next[i]
        if j >= 0:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
        for j in rdeps.get(i, ()):
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if done != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise GraphError(f"dependency cycle involving task {graph.name[stuck]!r}")
    return Schedule(graph, start, end, binding)
