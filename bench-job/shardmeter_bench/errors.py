"""Failures of the benchmark Job and their exit statuses.

Every failure reaches the user as one line on stderr (and a structlog event), never a
traceback, and exits with a status that says what went wrong, so a Job's pod status is
enough to tell a missing GPU from a network problem:

====  ==========================================================================
code  meaning
====  ==========================================================================
0     success
1     any other runtime failure (a bug, a worker that died, a bad coefficients file)
2     bad command-line arguments (argparse and our own checks)
3     the requested device is not available (``--device cuda`` without a GPU)
4     out of memory outside the expected batch sweep
5     distributed initialisation or a collective timed out / failed
6     publishing the coefficients failed (ConfigMap missing, RBAC, API unreachable)
130   interrupted
====  ==========================================================================
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DEVICE = 3
EXIT_OOM = 4
EXIT_DISTRIBUTED = 5
EXIT_PUBLISH = 6
EXIT_INTERRUPTED = 130


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none — what a
    one-line failure report quotes."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class BenchError(Exception):
    """A failure the Job reports as one line and exits with ``code``."""

    code = EXIT_FAILURE
    event = "bench_failed"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(BenchError):
    code = EXIT_USAGE
    event = "bad_arguments"


class DeviceUnavailableError(BenchError):
    code = EXIT_DEVICE
    event = "device_unavailable"


class OutOfMemoryError(BenchError):
    code = EXIT_OOM
    event = "out_of_memory"


class DistributedError(BenchError):
    code = EXIT_DISTRIBUTED
    event = "distributed_failed"


class PublishError(BenchError):
    code = EXIT_PUBLISH
    event = "publish_failed"
