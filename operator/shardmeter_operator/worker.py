"""The planning worker thread, and keeping the operator's resident memory flat under bursts
of plan searches.

Searches are CPU-bound and run off the event loop in one worker thread
(:func:`search_in_worker`). Memory (glibc only): every thread that allocates gets its own glibc malloc arena, and freed arena pages are kept;
a burst of plan searches in worker threads therefore ratchets RSS up (measured: +55 MiB for 50
plans at once). Two arenas, and a ``malloc_trim`` after each search, keep it near the import
baseline. No-ops off glibc."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import functools
import platform
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

M_ARENA_MAX = -8


@functools.cache
def _glibc() -> Any:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def limit_arenas(count: int = 2) -> bool:
    """Call before threads start. Returns whether it was applied."""
    libc = _glibc()
    return libc is not None and libc.mallopt(M_ARENA_MAX, count) == 1


def trim() -> bool:
    """Hand freed heap pages back to the OS. Returns whether anything was released."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


PLANNING_WORKERS = 1
"""Searches are CPU-bound (the GIL serialises most of them): two workers keep the cores busy
without queueing the API calls (which use asyncio's default pool) behind a burst of plans."""
_planning = concurrent.futures.ThreadPoolExecutor(PLANNING_WORKERS, thread_name_prefix="plan")


async def search_in_worker(fn: Callable[..., T], *args: Any) -> T:
    def run() -> T:
        try:
            return fn(*args)
        finally:
            trim()

    return await asyncio.get_running_loop().run_in_executor(_planning, run)
