"""What limits a training step, in one vocabulary for the model, the CLI and the operator.

``Bottleneck`` names the kinds a prediction reports; ``BLOCKING_EPSILON_S`` is the one threshold
below which an outer step's wait for a fragment's all_reduce counts as hidden (simulated event
times are sums of many floats, so exact zero is not a safe test).
"""

from __future__ import annotations

from enum import StrEnum

BLOCKING_EPSILON_S = 1e-9
"""Blocking at or below this many seconds per outer step is hidden (not blocking)."""


class Bottleneck(StrEnum):
    """What bounds a step: its compute, its collectives, or the outer step's synchronisation."""

    COMPUTE = "compute-bound"
    COMMUNICATION = "communication-bound"
    OUTER_STEP = "outer-step-bound"


def blocks(blocking_s: float) -> bool:
    """Whether an outer step waits visibly: ``blocking_s`` beyond ``BLOCKING_EPSILON_S``."""
    return blocking_s > BLOCKING_EPSILON_S
