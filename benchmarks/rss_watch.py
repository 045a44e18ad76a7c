"""Run a command and follow the resident memory of its whole process tree (the command and
every process it spawns), sampled from ``/proc`` every ``interval_s``: the peak of the
tree's summed RSS and of its largest process, and a guard that ends the tree when the sum
passes ``kill_above_bytes`` (a shared host must not be pushed into its OOM killer).
Linux only (``/proc``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Watched:
    returncode: int
    wall_s: float
    peak_tree_bytes: int
    """Highest sampled sum of RSS over the process tree."""
    peak_process_bytes: int
    """Highest RSS of any one process: the kernel's ``ru_maxrss`` of the command and the
    descendants it waited for (exact), or the highest sample if that is higher."""
    killed: bool


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss(root: int) -> tuple[int, int]:
    """(sum, max) of RSS over ``root`` and its descendants."""
    total = largest = 0
    stack = [root]
    while stack:
        pid = stack.pop()
        rss = _rss_bytes(pid)
        total += rss
        largest = max(largest, rss)
        stack += _children(pid)
    return total, largest


def run_watched(
    cmd: list[str],
    kill_above_bytes: float | None = None,
    interval_s: float = 0.2,
    **popen: object,
) -> Watched:
    """Run ``cmd`` in its own session; sample its tree's RSS until it exits."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)  # type: ignore[call-overload]
    peak_tree = peak_one = 0
    killed = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        total, largest = tree_rss(proc.pid)
        peak_tree, peak_one = max(peak_tree, total), max(peak_one, largest)
        if kill_above_bytes is not None and total > kill_above_bytes and not killed:
            os.killpg(proc.pid, signal.SIGKILL)
            killed = True
        time.sleep(interval_s)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    peak_one = max(peak_one, usage.ru_maxrss * 1024)  # Linux reports KiB
    return Watched(proc.returncode, wall, max(peak_tree, peak_one), peak_one, killed)


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"
