"""The task-graph engine: stream order, dependencies, critical path, determinism, errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardmeter.sim.engine import Category, GraphError, Kind, TaskGraph, simulate


def test_start_is_max_of_stream_and_dependencies() -> None:
    g = TaskGraph()
    c, m = g.add_stream("compute"), g.add_stream("comm")
    a = g.add(m, "ag", Kind.ALL_GATHER, 3.0)
    f = g.add(c, "fwd", Kind.FORWARD, 1.0, (a,))
    x = g.add(c, "other", Kind.FORWARD, 2.0)
    s = simulate(g)
    assert (s.start[f], s.end[f]) == (3.0, 4.0)
    assert (s.start[x], s.end[x]) == (4.0, 6.0)  # program order in the stream
    assert s.binding[f] == a and s.binding[x] == f
    assert s.critical_path() == [a, f, x]
    assert s.critical_path_seconds() == {
        Category.COMPUTE: 3.0,
        Category.COMMUNICATION: 3.0,
        Category.OUTER: 0.0,
    }
    assert s.idle(c) == [s.idle(c)[0]] and s.idle(c)[0].seconds == 3.0
    assert s.idle_by_cause(c) == {"all_gather": 3.0}


def test_edges_may_point_forward_in_creation_order() -> None:
    g = TaskGraph()
    c, m = g.add_stream("compute"), g.add_stream("comm")
    rs = g.add(m, "rs", Kind.REDUCE_SCATTER, 1.0)
    b = g.add(c, "bwd", Kind.BACKWARD, 2.0)
    g.depend(rs, b)
    s = simulate(g)
    assert s.start[rs] == 2.0 and s.makespan_s == 3.0


def test_cycle_and_bad_ids_are_reported() -> None:
    g = TaskGraph()
    c = g.add_stream("compute")
    a = g.add(c, "a", Kind.FORWARD, 1.0)
    b = g.add(c, "b", Kind.FORWARD, 1.0)
    g.depend(a, b)
    with pytest.raises(GraphError, match="cycle"):
        simulate(g)
    g2 = TaskGraph()
    g2.add(g2.add_stream("x"), "a", Kind.FORWARD, 1.0, (7,))
    with pytest.raises(GraphError, match="unknown task id 7"):
        simulate(g2)
    with pytest.raises(GraphError, match="≥ 0"):
        g2.add(0, "neg", Kind.FORWARD, -1.0)


@st.composite
def random_graphs(draw: st.DrawFn) -> TaskGraph:
    g = TaskGraph()
    streams = [g.add_stream(f"s{i}") for i in range(draw(st.integers(1, 3)))]
    kinds = list(Kind)
    for i in range(draw(st.integers(1, 25))):
        deps = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        g.add(
            draw(st.sampled_from(streams)),
            f"t{i}",
            draw(st.sampled_from(kinds)),
            draw(st.floats(0, 10, allow_nan=False)),
            deps,
        )
    return g


@given(random_graphs())
def test_makespan_bounds(g: TaskGraph) -> None:
    s = simulate(g)
    for sid in range(len(g.stream_names)):
        assert s.makespan_s >= sum(g.duration[i] for i in s.stream_tasks(sid)) - 1e-9
    assert s.makespan_s <= sum(g.duration) + 1e-9
    path = s.critical_path()
    assert sum(g.duration[i] for i in path) == pytest.approx(s.makespan_s)  # no gaps on the path


@given(random_graphs(), st.data())
def test_monotone_in_every_duration(g: TaskGraph, data: st.DataObject) -> None:
    base = simulate(g).makespan_s
    i = data.draw(st.integers(0, len(g) - 1))
    longer = list(g.duration)
    longer[i] += data.draw(st.floats(0, 5, allow_nan=False))
    assert simulate(g.with_durations(longer)).makespan_s >= base - 1e-12


@given(random_graphs())
def test_deterministic(g: TaskGraph) -> None:
    a, b = simulate(g), simulate(g)
    assert (a.start, a.end, a.binding) == (b.start, b.end, b.binding)
