"""GPU power cap → sustained clock → compute throughput.

The achieved fractions of peak in the GPU presets are measured at the board's default power
limit (its TDP), where sustained matmul work already runs power-limited. A lower cap
(``nvidia-smi -pl``, a pool's ``powerCapWatts``) lowers the clock further. The model is the
standard CMOS one (Hennessy & Patterson, *Computer Architecture: A Quantitative Approach*,
6th ed., §1.5): dynamic power ∝ C·V²·f and, in the voltage–frequency scaling range, V ∝ f,
so dynamic power ∝ f³; static power (leakage, HBM, I/O) does not scale with the SM clock:

    P(f) = P_static + (TDP − P_static) · (f / f_TDP)³   ⇒   f / f_TDP = ((cap − P_static) / (TDP − P_static))^(1/3)

Compute-bound work (matmuls, flash attention) scales with the clock; memory-bound work is
set by the HBM clock, which the power cap does not lower, and is left unchanged. The model
errs pessimistic: it assumes the compute-bound phases draw the full TDP at the default
limit, while phases that draw less keep their clock under a moderate cap.
"""

from __future__ import annotations

from shardmeter.errors import SpecError
from shardmeter.spec.hardware import GPUSpec

STATIC_POWER_FRACTION = 0.15
"""Static share of the board power: the idle draw nvidia-smi reports for SXM A100/H100
boards (≈ 55–60 W of 400 W, ≈ 70–100 W of 700 W)."""


def clock_fraction(
    gpu: GPUSpec, power_cap_watts: float | None, where: str = "powerCapWatts"
) -> float:
    """Sustained SM clock under ``power_cap_watts`` relative to the clock at the TDP."""
    if power_cap_watts is None or power_cap_watts >= gpu.tdp_watts:
        return 1.0
    static = STATIC_POWER_FRACTION * gpu.tdp_watts
    if power_cap_watts <= static:
        raise SpecError(
            where,
            f"{power_cap_watts:g} W is at or below the {gpu.name}'s static power "
            f"(≈ {static:.0f} W); raise it (the board limit is {gpu.tdp_watts:g} W)",
        )
    return float(((power_cap_watts - static) / (gpu.tdp_watts - static)) ** (1.0 / 3.0))
