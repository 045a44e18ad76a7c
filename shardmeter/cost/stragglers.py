"""Synchronous training runs at the pace of its slowest GPU.

GPUs of one model are not equally fast: manufacturing variation (each die's voltage–
frequency curve) and uneven cooling give each its own sustained clock. Stas Bekman, *Machine
Learning Engineering* (compute/accelerator/README.md, "Not all accelerators are created
equal"): "I have seen 5% and higher differences on an 8-gpu node", and "the slowest
accelerator (struggler) will set the speed for all other accelerators" — every FSDP
collective waits for the last rank.

Model: each GPU's compute speed deviates from the typical one (the one the Maximum Achievable
Matmul FLOPS figures measure) by a normal variable of standard deviation
``SPEED_SPREAD_SIGMA``, chosen so that the expected spread (max − min) of 8 GPUs is 5 %;
an island of n GPUs computes at the expected slowest of n, 1 + σ·E[max of n standard
normals] times slower (Blom's approximation of the expected maximum).
"""

from __future__ import annotations

from functools import lru_cache
from statistics import NormalDist

OBSERVED_SPREAD_ON_8_GPUS = 0.05
"""Bekman: "5% and higher differences on an 8-gpu node"."""


@lru_cache(maxsize=4096)
def expected_max_of_normals(n: int) -> float:
    """E[max of n iid standard normals] (Blom: Φ⁻¹((n − 0.375)/(n + 0.25)))."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


SPEED_SPREAD_SIGMA = OBSERVED_SPREAD_ON_8_GPUS / (2 * expected_max_of_normals(8))
"""σ of one GPU's speed: expected range of 8 normals is 2·E[max of 8] ≈ 2.83 σ."""


def straggler_factor(ranks: int) -> float:
    """How much slower an island of ``ranks`` GPUs computes than one typical GPU."""
    return 1.0 + SPEED_SPREAD_SIGMA * expected_max_of_normals(ranks)
