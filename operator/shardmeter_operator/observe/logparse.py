"""Read a launched island's rank-0 log: the lines torchtitan 0.3.0 and torchft 0.2.0 print,
parsed by their own formats (the training code is never instrumented).

What is read, and where each format comes from:

* **torchtitan's metric line**, every ``--metrics.log_freq`` steps and at step 1, written by
  ``MetricsProcessor.log`` (``torchtitan/components/metrics.py``) through the root logger that
  ``init_logger`` (``torchtitan/tools/logging.py``) formats as
  ``[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s``::

      step: {step:2}  loss: {loss:8.5f}  grad_norm: {grad_norm:7.4f}  memory: {gib:5.2f}GiB({pct:.2f}%)
      tps: {round(tps):,}  tflops: {tflops:,.2f}  mfu: {mfu:.2f}% | N/A

  (one line; each field may be wrapped in ANSI colours unless
  ``--metrics.disable_color_printing``). ``tps`` is tokens per second per device over the
  steps since the previous metric line; ``Training starts at step N`` (``Trainer.train``)
  starts a process's lines.
* **torchft's Streaming DiLoCo lines** (``torchft/local_sgd.py``, logger ``torchft.local_sgd``):
  ``Preparing fragment=F step=S`` after the quorum, right before the fragment's all_reduce
  starts, and ``Syncing fragment=F step=S manager_step=M`` before the training thread waits
  for it; the Python manager's ``[replica/group_rank - step M] should_commit=True|False …``
  (``torchft/manager.py``) when the sync is over.
* **torchft's Rust manager server** (in group rank 0's process):
  ``<ISO time> [INFO] [torchft::manager] - [Replica R] Start quorum for group_rank 0`` and
  ``… Finished quorum for group_rank 0`` around the quorum each fragment sync forms.

Lines of other ranks: a ``torchrun --local-ranks-filter``/``--tee`` prefix
(``[default0]:``, ``[${rank}]:``) keeps local rank 0 only; without one, every rank's copy of
an event is counted once (metric lines by step, syncs by (fragment, manager step), commits of
group rank 0). A line that looks like a metric line but does not parse is counted in
``unparsed``, never guessed at. The Python lines' ``asctime`` has millisecond resolution;
durations are only taken between timestamps of the same source (Python with Python, Rust
with Rust), so the two clocks' formats never mix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RANK_PREFIX = re.compile(r"^\[(?:[A-Za-z_][\w-]*?)?(?P<rank>\d+)\]:")
TITAN = re.compile(
    r"^\[titan\] (?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - (?P<logger>\S+) - "
    r"(?P<level>[A-Z]+) - (?P<message>.*)$"
)
RUST = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\S* \[[A-Z]+\] \[torchft::manager\] - "
    r"\[Replica [^\]]*\] (?P<message>.*)$"
)
_NUMBER = r"-?(?:[\d,]+(?:\.\d+)?|nan|inf)"
METRIC = re.compile(
    rf"^step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_NUMBER})\s+grad_norm:\s*(?P<grad_norm>{_NUMBER})"
    r"\s+memory:\s*(?P<memory_gib>[\d.]+)GiB\((?P<memory_pct>[\d.]+)%\)"
    rf"\s+tps:\s*(?P<tps>[\d,]+)\s+tflops:\s*(?P<tflops>{_NUMBER})"
    r"\s+mfu:\s*(?:(?P<mfu>[\d.]+)%|N/A)\s*$"
)
PREPARE = re.compile(r"^Preparing fragment=(?P<fragment>\d+) step=\d+$")
SYNC = re.compile(r"^Syncing fragment=(?P<fragment>\d+) step=\d+ manager_step=(?P<manager>\d+)$")
COMMIT = re.compile(
    r"^\[[^\]]*/(?P<rank>\d+) - step \d+\] should_commit=(?P<ok>True|False) "
    r"enough_replicas=(?:True|False), errored=.*$"
)
STARTS = re.compile(r"^Training starts at step (?P<step>\d+)$")
QUORUM_START = "Start quorum for group_rank 0"
QUORUM_END = "Finished quorum for group_rank 0"


@dataclass(frozen=True)
class MetricLine:
    """One of torchtitan's metric lines."""

    index: int
    """Position among the parsed lines (orders events between metric lines)."""
    at_s: float
    step: int
    loss: float
    tokens_per_s_per_device: float
    tflops: float
    mfu_percent: float | None
    memory_gib: float


@dataclass
class FragmentSync:
    """One Streaming DiLoCo fragment sync (Python timestamps)."""

    fragment: int
    manager_step: int
    synced_index: int
    synced_at_s: float
    prepared_at_s: float | None = None
    committed_index: int | None = None
    committed_at_s: float | None = None
    committed: bool | None = None

    @property
    def stall_s(self) -> float | None:
        """Training thread waiting: from ``Syncing`` to the commit decision (the all_reduce
        still in flight, then the commit round trip with the other islands)."""
        if self.committed_at_s is None:
            return None
        return max(0.0, self.committed_at_s - self.synced_at_s)

    @property
    def duration_s(self) -> float | None:
        """From the start of the fragment's all_reduce to the commit decision."""
        if self.committed_at_s is None or self.prepared_at_s is None:
            return None
        return max(0.0, self.committed_at_s - self.prepared_at_s)


@dataclass(frozen=True)
class QuorumWait:
    """A quorum the island waited for (Rust timestamps)."""

    index: int
    """Position of its end."""
    seconds: float


@dataclass
class ParsedLog:
    metrics: list[MetricLine] = field(default_factory=list)
    syncs: list[FragmentSync] = field(default_factory=list)
    quorums: list[QuorumWait] = field(default_factory=list)
    lines: int = 0
    unparsed: int = 0
    """Lines that look like torchtitan's metric line but do not parse."""
    processes: int = 0
    """Process starts the text shows (``Training starts at step``, or steps going back); the
    parse keeps the last process's lines."""


def _python_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _rust_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _lines(text: str) -> list[str]:
    """Rank 0's lines, colour codes removed: with torchrun's rank prefixes, local rank 0's
    (torchrun's own unprefixed lines too); without them, every line."""
    lines = [ANSI.sub("", raw).rstrip("\r") for raw in text.splitlines()]
    if not any(RANK_PREFIX.match(line) for line in lines):
        return lines
    out = []
    for line in lines:
        m = RANK_PREFIX.match(line)
        if m is None:
            if not line.startswith("[titan]"):
                out.append(line)  # torchrun's own lines; an unprefixed worker is not rank 0
        elif int(m["rank"]) == 0:
            out.append(line[m.end() :].lstrip())
    return out


def parse_log(text: str) -> ParsedLog:
    """The metric lines, fragment syncs and quorum waits of the last training process in
    ``text`` (see the module docstring)."""
    out = ParsedLog()
    pending_prepare: dict[int, float] = {}
    seen_syncs: set[tuple[int, int]] = set()
    seen_steps: set[int] = set()
    quorum_started: float | None = None
    for line in _lines(text):
        out.lines += 1
        index = out.lines
        titan = TITAN.match(line)
        if titan is not None:
            message, logger = titan["message"], titan["logger"]
            if logger == "root" and STARTS.match(message):
                _restart(out, pending_prepare, seen_syncs, seen_steps)
                continue
            if logger == "root" and message.startswith("step:"):
                m = METRIC.match(message)
                if m is None:
                    out.unparsed += 1
                    continue
                step = int(m["step"])
                if out.metrics and step < out.metrics[-1].step:
                    _restart(out, pending_prepare, seen_syncs, seen_steps)  # steps went back
                if step in seen_steps:
                    continue  # another rank's copy
                seen_steps.add(step)
                out.metrics.append(
                    MetricLine(
                        index,
                        _python_time(titan["at"]),
                        step,
                        _number(m["loss"]),
                        _number(m["tps"]),
                        _number(m["tflops"]),
                        float(m["mfu"]) if m["mfu"] is not None else None,
                        float(m["memory_gib"]),
                    )
                )
            elif logger == "torchft.local_sgd":
                _fragment_line(out, message, titan["at"], index, pending_prepare, seen_syncs)
            elif logger == "torchft.manager":
                _commit_line(out, message, titan["at"], index)
            continue
        rust = RUST.match(line)
        if rust is not None:
            if rust["message"] == QUORUM_START:
                quorum_started = _rust_time(rust["at"])
            elif rust["message"] == QUORUM_END and quorum_started is not None:
                seconds = max(0.0, _rust_time(rust["at"]) - quorum_started)
                out.quorums.append(QuorumWait(index, seconds))
                quorum_started = None
    return out


def _restart(
    out: ParsedLog,
    pending: dict[int, float],
    seen_syncs: set[tuple[int, int]],
    seen_steps: set[int],
) -> None:
    """A new training process: what came before belongs to the previous one."""
    out.processes += 1
    out.metrics.clear()
    out.syncs.clear()
    out.quorums.clear()
    pending.clear()
    seen_syncs.clear()
    seen_steps.clear()


def _fragment_line(
    out: ParsedLog,
    message: str,
    at: str,
    index: int,
    pending: dict[int, float],
    seen: set[tuple[int, int]],
) -> None:
    m = PREPARE.match(message)
    if m is not None:
        pending.setdefault(int(m["fragment"]), _python_time(at))  # other ranks' copies later
        return
    m = SYNC.match(message)
    if m is None:
        return
    key = (int(m["fragment"]), int(m["manager"]))
    if key in seen:
        return
    seen.add(key)
    out.syncs.append(
        FragmentSync(key[0], key[1], index, _python_time(at), pending.pop(key[0], None))
    )


def _commit_line(out: ParsedLog, message: str, at: str, index: int) -> None:
    m = COMMIT.match(message)
    if m is None or int(m["rank"]) != 0:
        return
    for sync in out.syncs:
        if sync.committed_index is None:
            sync.committed_index, sync.committed_at_s = index, _python_time(at)
            sync.committed = m["ok"] == "True"
            return
