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

**Benchmark duty cycle → training clock.** The same law says how much of a matmul benchmark's
rate a training step keeps. A power-limited GPU whose tensor cores are busy a share d of the
time (memory-bound phases between them add no clock-dependent power) holds the clock f where
``P_static + d·P_dyn·(f/f₀)³ = TDP``, so ``d·f³`` is the same at every duty cycle: a loop that
leaves the tensor cores idle 40 % of the time runs them at a (1/0.6)^(1/3) = 1.19× higher
clock than back-to-back matmuls. The MAMF figures behind ``matmul_efficiency`` come from
such a loop (a 256 MiB memset and an output rewrite before every timed matmul:
``GPUSpec.matmul_efficiency_duty_cycle``); a training step keeps its tensor cores busy for
the matmul and attention share of its compute (`sustained_clock_ratio`). Evidence that the
clock, not the kernel, moves: matmuls on H100 are power-limited (H. He, "Strangely, Matrix
Multiplications on GPUs Run Faster When Given 'Predictable' Data", 2024); B200 clocks fall
from 1,965 to ~1,580 MHz within ~5 ms of back-to-back kernels (flashinfer-ai/flashinfer
PR #2899); NVIDIA rates A100 HPL at the 1,305 MHz it sustains at 400 W, not the 1,410 MHz
boost (G. Lockwood, "peak FLOPS" notes).
"""

from __future__ import annotations

from shardmeter.errors import SpecError
from shardmeter.spec.hardware import GPUSpec


def sustained_clock_ratio(benchmark_duty_cycle: float, training_duty_cycle: float) -> float:
    """Matmul clock of a training step relative to the benchmark that measured the matmul
    efficiency, both power-limited: with tensor-core time T_t and other time T_o at the
    benchmark clock (``training_duty_cycle`` = T_t / (T_t + T_o)), a step at clock ratio r has
    duty T_t/r ÷ (T_t/r + T_o) and holds ``duty·r³ = benchmark_duty_cycle``, i.e.
    ``r³ = d_b·(1 + r·(1 − d_t)/d_t)``. Capped at 1: a step with more idle tensor time than
    the benchmark is not credited with boost headroom nobody measured."""
    d_b, d_t = benchmark_duty_cycle, training_duty_cycle
    if not (0 < d_b <= 1 and 0 < d_t <= 1):
        raise ValueError(f"duty cycles must be in (0, 1] (got {d_b!r}, {d_t!r})")
    slack = (1.0 - d_t) / d_t

    def excess(r: float) -> float:  # increasing in r
        return r**3 - d_b * (1.0 + r * slack)

    if excess(1.0) >= 0:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if excess(mid) > 0:
                hi = mid
            else:
                lo = mid
        return 0.5 * (lo + hi)
    return 1.0


def clock_fraction(
    gpu: GPUSpec, power_cap_watts: float | None, where: str = "powerCapWatts"
) -> float:
    """Sustained SM clock under ``power_cap_watts`` (and the GPU variant's own
    ``power_limit_watts``, the lower holding) relative to the clock at the TDP."""
    power_cap_watts = gpu.power_limit(power_cap_watts)
    if power_cap_watts >= gpu.tdp_watts:
        return 1.0
    static = gpu.static_power_fraction * gpu.tdp_watts  # the pool's own check uses the same
    if power_cap_watts <= static:
        raise SpecError(
            where,
            f"{power_cap_watts:g} W is at or below the {gpu.name}'s static power "
            f"(≈ {static:.0f} W); raise it (the board limit is {gpu.tdp_watts:g} W)",
        )
    return float(((power_cap_watts - static) / (gpu.tdp_watts - static)) ** (1.0 / 3.0))
