"""Keeping the operator's resident memory flat under bursts of plan searches (glibc only).

Every thread that allocates gets its own glibc malloc arena, and freed arena pages are kept;
a burst of plan searches in worker threads therefore ratchets RSS up (measured: +55 MiB for 50
plans at once). Two arenas, and a ``malloc_trim`` after each search, keep it near the import
baseline. No-ops off glibc."""

from __future__ import annotations

import ctypes
import functools
import platform
from typing import Any

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
