"""`isolation.isolated`: on a CPU a measurement runs in a forked child and its result or
its exception comes back; a child that dies says what it was measuring and how it died;
``SHARDMETER_BENCH_NO_FORK=1`` and non-CPU devices run in-process."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from shardmeter_bench.errors import BenchError
from shardmeter_bench.isolation import NO_FORK_ENV, forks, isolated

CPU = torch.device("cpu")


def _pid_and_sum(a: int, b: int) -> tuple[int, int]:
    return os.getpid(), a + b


def _raise_value_error() -> None:
    raise ValueError("catalog shape full-003: hidden must be even")


class _TwoArgError(Exception):
    def __init__(self, a: int, b: int) -> None:  # two arguments: cannot be unpickled
        super().__init__(f"{a}/{b}")


def _raise_unpicklable() -> None:
    raise _TwoArgError(1, 2)


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _tensor_sum() -> float:
    return float(torch.arange(10, dtype=torch.float32).sum())


def test_result_comes_back_from_another_process() -> None:
    pid, total = isolated(CPU, "a sum", _pid_and_sum, 2, 3)
    assert total == 5
    assert pid != os.getpid()
    assert isolated(CPU, "a tensor", _tensor_sum) == 45.0


def test_exception_is_raised_in_the_caller() -> None:
    with pytest.raises(ValueError, match="hidden must be even"):
        isolated(CPU, "full-003", _raise_value_error)


def test_unpicklable_exception_keeps_its_message() -> None:
    with pytest.raises(Exception, match="1/2"):
        isolated(CPU, "x", _raise_unpicklable)


def test_dead_child_names_the_work_and_the_signal() -> None:
    with pytest.raises(BenchError, match=r"measuring full-007 killed by SIGKILL.*out-of-memory"):
        isolated(CPU, "full-007", _killed)


def test_no_fork_switch_and_other_devices_run_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    assert forks(CPU)
    assert not forks(torch.device("meta"))
    monkeypatch.setenv(NO_FORK_ENV, "1")
    assert not forks(CPU)
    pid, _ = isolated(CPU, "a sum", _pid_and_sum, 1, 1)
    assert pid == os.getpid()
