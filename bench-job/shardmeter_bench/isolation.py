"""Each CPU measurement in a process of its own, so every one starts from the same heap.

Why: with glibc's allocator a tensor above the mmap threshold is mapped on allocation and
unmapped on free, so each iteration page-faults it afresh — *unless* the heap already holds a
free chunk that large, which it then reuses with no fault at all. Which of the two happens
depends on what the process ran before. Measured on the 2-core dev VM (torch 2.13 CPU, one
thread): the backward of a 4-layer h448 / V32000 Hugging Face Llama at 1 × 128 tokens took
168 ms with 28–31 k minor faults per iteration in a fresh process, and 134 ms with none after
one catalog shape (h1216, V32768) had left a 376 MiB free region in the heap — a 20 % swing
from history alone, in the fit and in the truth alike. Measured in forked children of a
parent that runs nothing large, it read 166–171 ms whatever ran before.

So on a CPU every catalog shape, every validation model and the device probes run in a child
forked from the bench's main process (which itself allocates nothing large), as a training
process starts: with glibc's default allocator and an empty heap. On a GPU the caching
allocator makes history irrelevant and CUDA cannot be forked, so the call runs in-process.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import torch

from shardmeter_bench.errors import BenchError

T = TypeVar("T")

NO_FORK_ENV = "SHARDMETER_BENCH_NO_FORK"
"""Set to 1 to measure in-process (debugging with breakpoints; results depend on history)."""


def forks(device: torch.device) -> bool:
    """Whether `isolated` runs calls on ``device`` in a forked child."""
    return device.type == "cpu" and hasattr(os, "fork") and os.environ.get(NO_FORK_ENV) != "1"


def _child(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        result = fn(*args)
    except BaseException as exc:  # every failure goes back to the parent
        try:
            pickle.loads(pickle.dumps(exc))  # the parent must be able to rebuild it
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        conn.send((False, exc))
    else:
        conn.send((True, result))
    finally:
        conn.close()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (the kernel's out-of-memory killer?)" if -exitcode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with status {exitcode}"


def isolated(device: torch.device, what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, on a CPU in a forked child (see the module's docstring); its result or
    exception comes back to the caller. ``what`` names the work in the error raised if the
    child dies without answering."""
    if not forks(device):
        return fn(*args)
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    # daemonic: a bench that exits on an error or an interrupt does not wait for the child
    proc = ctx.Process(target=_child, args=(writer, fn, args), name=f"bench-{what}", daemon=True)
    proc.start()
    writer.close()
    try:
        ok, payload = reader.recv()
    except EOFError:
        proc.join()
        raise BenchError(
            f"the process measuring {what} {_death(proc.exitcode)} before it answered"
        ) from None
    finally:
        reader.close()
    proc.join()
    if not ok:
        raise payload
    result: T = payload
    return result
