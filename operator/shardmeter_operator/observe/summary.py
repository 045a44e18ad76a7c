"""From a parsed rank-0 log (:mod:`~.observe.logparse`) to an island's observation: step times,
throughput and Streaming DiLoCo syncs over a window of recent metric lines. Pure.

A *window* is the interval between two consecutive torchtitan metric lines (``log_freq``
steps): torchtitan's ``tps`` is the tokens per device over that interval divided by its wall
time, so the interval's wall time is ``steps × tokens per step per GPU ÷ tps``. A process's
first metric line has no interval before it (start-up, compilation, healing) and is never
used. Within an interval, the fragment syncs' stalls (``Syncing`` → commit) and the quorum
waits (torchft's ``Start``/``Finished quorum``) are outer-step work: the **inner step** of an
interval is its wall time minus them, per step; the **effective step** keeps them. The
window is the last ``window`` intervals; the observation reports the median and p90 of the
inner step over them, the island's tokens per second, and the syncs committed inside it.

Nothing is reported from too little evidence: fewer than `MIN_INTERVALS` usable intervals
(after a restart, say) is ``NotEnoughSteps``; an interval whose stalls exceed its own wall time
(inconsistent lines) is dropped, not clamped.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from shardmeter_operator.api.observation import IslandObservation, ObserveReason
from shardmeter_operator.observe.logparse import MetricLine, ParsedLog

MIN_INTERVALS = 3
DEFAULT_WINDOW = 20


@dataclass(frozen=True)
class IslandFacts:
    """What the plan says about an island (to turn per-GPU figures into step times)."""

    tokens_per_step_per_gpu: int
    """micro-batch × accumulation × sequence length."""
    gpus: int
    fragments: int
    """Streaming DiLoCo fragments (1 for DiLoCo, 0 without an outer step)."""
    predicted_step_s: float


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def unavailable(read_at: str, reason: str, message: str, **fields: object) -> IslandObservation:
    return IslandObservation(read_at=read_at, reason=reason, message=message[:1024], **fields)


def summarize(
    parsed: ParsedLog,
    facts: IslandFacts,
    read_at: str,
    window: int = DEFAULT_WINDOW,
    *,
    pod: str = "",
    restarts: int = 0,
) -> IslandObservation:
    """The island's observation from its parsed log (see the module docstring)."""
    where = {"pod": pod, "restarts": restarts}
    if not parsed.metrics:
        if parsed.unparsed:
            return unavailable(
                read_at,
                ObserveReason.UNPARSABLE,
                f"{parsed.unparsed} line(s) look like torchtitan's metric line but do not "
                "parse (is the trainer torchtitan 0.3.0's?)",
                **where,
            )
        return unavailable(
            read_at,
            ObserveReason.NO_METRIC_LINES,
            f"no torchtitan metric line in the last {parsed.lines} line(s) of rank 0's log "
            "(still starting, or --metrics.log_freq larger than the steps so far)",
            **where,
        )
    pairs = list(zip(parsed.metrics, parsed.metrics[1:], strict=False))[-window:]
    intervals = [iv for a, b in pairs if (iv := _interval(a, b, parsed, facts)) is not None]
    if len(intervals) < MIN_INTERVALS:
        why = (
            f"rank 0's trainer container restarted {restarts} time(s); "
            if restarts
            else (
                f"{parsed.processes} training process start(s) in the log; "
                if parsed.processes > 1
                else ""
            )
        )
        reason = ObserveReason.POD_RESTARTED if restarts else ObserveReason.NOT_ENOUGH_STEPS
        return unavailable(
            read_at,
            reason,
            f"{why}{len(intervals)} usable interval(s) between metric lines since it started, "
            f"{MIN_INTERVALS} needed",
            **where,
        )
    first, last = pairs[0][0], pairs[-1][1]
    inner = [iv.inner_s for iv in intervals]
    steps = sum(iv.steps for iv in intervals)
    wall = sum(iv.wall_s for iv in intervals)
    per_gpu = steps * facts.tokens_per_step_per_gpu / wall
    syncs = [
        s
        for s in parsed.syncs
        if s.committed_index is not None and first.index < s.committed_index <= last.index
    ]
    stalls = [s.stall_s for s in syncs if s.stall_s is not None]
    durations = [s.duration_s for s in syncs if s.duration_s is not None]
    quorums = [q.seconds for q in parsed.quorums if first.index < q.index <= last.index]
    p50 = statistics.median(inner)
    stall = statistics.fmean(stalls) if stalls else None
    return IslandObservation(
        read_at=read_at,
        reason=ObserveReason.OBSERVED,
        message=f"{len(intervals)} interval(s), steps {first.step}–{last.step}",
        first_step=first.step,
        last_step=last.step,
        steps=steps,
        windows=len(intervals),
        step_seconds_p50=round(p50, 6),
        step_seconds_p90=round(percentile(inner, 0.9), 6),
        effective_step_seconds=round(wall / steps, 6),
        tokens_per_second=round(per_gpu * facts.gpus, 3),
        tokens_per_second_per_gpu=round(per_gpu, 3),
        fragment_syncs=len(syncs),
        fragment_sync_seconds=round(statistics.median(durations), 6) if durations else None,
        sync_stall_seconds=round(stall, 6) if stall is not None else None,
        quorum_wait_seconds=round(statistics.fmean(quorums), 6) if quorums else None,
        outer_step_blocking_seconds=(
            round(stall * facts.fragments, 6) if stall is not None and facts.fragments else None
        ),
        predicted_step_seconds=facts.predicted_step_s,
        error_ratio=round(p50 / facts.predicted_step_s - 1, 6)
        if facts.predicted_step_s > 0
        else None,
        **where,
    )


@dataclass(frozen=True)
class Interval:
    steps: int
    wall_s: float
    inner_s: float
    """Per step, outer-step stalls removed."""


def _interval(
    a: MetricLine, b: MetricLine, parsed: ParsedLog, facts: IslandFacts
) -> Interval | None:
    steps = b.step - a.step
    if steps <= 0 or b.tokens_per_s_per_device <= 0:
        return None
    wall = steps * facts.tokens_per_step_per_gpu / b.tokens_per_s_per_device
    stalls = sum(
        s.stall_s or 0.0
        for s in parsed.syncs
        if s.committed_index is not None and a.index < s.committed_index <= b.index
    )
    quorum = sum(q.seconds for q in parsed.quorums if a.index < q.index <= b.index)
    inner = wall - stalls - quorum
    if inner <= 0:
        return None
    return Interval(steps, wall, inner / steps)
