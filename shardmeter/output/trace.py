"""Chrome-trace / Perfetto JSON export (open in https://ui.perfetto.dev or chrome://tracing).

One process per island (stream names ``island/stream``; plain names go to one process), one
thread (track) per stream. Colours follow the paper's figures through Chrome's reserved
colour names: all_gather red, reduce_scatter orange, compute blue, outer all_reduce green,
and compute blocked on the outer all_reduce dark red. Output is deterministic: the same
schedule gives byte-identical JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardmeter.sim.engine import Kind, Schedule

COLOURS: dict[Kind, str] = {
    Kind.ALL_GATHER: "bad",  # red
    Kind.REDUCE_SCATTER: "thread_state_iowait",  # orange
    Kind.FORWARD: "rail_response",  # blue
    Kind.BACKWARD: "rail_response",
    Kind.OPTIMIZER: "rail_load",
    Kind.INNER_STEP: "rail_response",
    Kind.OUTER_STEP: "rail_load",
    Kind.OUTER_ALL_REDUCE: "good",  # green
}
BLOCKED_COLOUR = "terrible"  # dark red
IDLE_COLOUR = "thread_state_sleeping"  # grey


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def chrome_trace(schedule: Schedule, title: str = "shardmeter") -> dict[str, Any]:
    """The trace as a dict (``traceEvents`` plus metadata)."""
    g = schedule.graph
    processes: dict[str, int] = {}
    threads: dict[int, tuple[int, int]] = {}
    events: list[dict[str, Any]] = []
    for sid, sname in enumerate(g.stream_names):
        proc, _, thread = sname.rpartition("/")
        proc = proc or title
        if proc not in processes:
            processes[proc] = len(processes) + 1
            events.append(
                {
                    "ph": "M",
                    "name": "process_name",
                    "pid": processes[proc],
                    "tid": 0,
                    "args": {"name": proc},
                }
            )
            events.append(
                {
                    "ph": "M",
                    "name": "process_sort_index",
                    "pid": processes[proc],
                    "tid": 0,
                    "args": {"sort_index": processes[proc]},
                }
            )
        threads[sid] = (processes[proc], sid + 1)
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": processes[proc],
                "tid": sid + 1,
                "args": {"name": thread or sname},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": processes[proc],
                "tid": sid + 1,
                "args": {"sort_index": sid + 1},
            }
        )
    for i in range(len(g)):
        pid, tid = threads[g.stream[i]]
        events.append(
            {
                "ph": "X",
                "name": g.name[i],
                "cat": g.kind[i].value,
                "pid": pid,
                "tid": tid,
                "ts": _us(schedule.start[i]),
                "dur": _us(g.duration[i]),
                "cname": COLOURS[g.kind[i]],
                "args": {"kind": g.kind[i].value},
            }
        )
    for sid in range(len(g.stream_names)):
        if not any(g.kind[i].category.value == "compute" for i in schedule.stream_tasks(sid)):
            continue
        pid, tid = threads[sid]
        last = max((schedule.end[i] for i in schedule.stream_tasks(sid)), default=0.0)
        for gap in schedule.idle(sid, until_s=last):
            if gap.task >= 0 and g.kind[gap.task] is Kind.OUTER_ALL_REDUCE:
                continue  # split into imbalance and blocking below
            cause = g.kind[gap.task].value if gap.task >= 0 else "start"
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": tid,
                    "ts": _us(gap.start_s),
                    "dur": _us(gap.seconds),
                    "name": f"idle: waiting on {cause}",
                    "cat": "idle",
                    "cname": IDLE_COLOUR,
                    "args": {"waiting_on": g.name[gap.task] if gap.task >= 0 else ""},
                }
            )
        for wait, why in schedule.outer_waits(sid):
            blocked = why == "blocking"
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": tid,
                    "ts": _us(wait.start_s),
                    "dur": _us(wait.seconds),
                    "name": "blocked: outer all_reduce still running"
                    if blocked
                    else "idle: waiting for slower islands",
                    "cat": "blocked" if blocked else "imbalance",
                    "cname": BLOCKED_COLOUR if blocked else IDLE_COLOUR,
                    "args": {"waiting_on": g.name[wait.task]},
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "shardmeter",
            "title": title,
            "makespan_s": round(schedule.makespan_s, 9),
        },
    }


def trace_json(schedule: Schedule, title: str = "shardmeter") -> str:
    return json.dumps(chrome_trace(schedule, title), sort_keys=True, separators=(",", ":"))


def write_trace(schedule: Schedule, path: str | Path, title: str = "shardmeter") -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(trace_json(schedule, title) + "\n")
    return target
