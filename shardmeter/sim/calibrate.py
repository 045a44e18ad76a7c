"""From an observed inner step back to the model: the compute scale at which the simulated
FSDP step of an island equals the step observed on it (`shardmeter.cost.observed` keeps it).

The step is not proportional to compute when communication is exposed, so the scale is not
the ratio of the two step times: it is the root of ``T(k) = observed``, where ``T(k)`` is the
simulated step with every compute task ``k`` times as long (`FSDPDurations.scaled_compute`,
which is what `CostModel` does with that scale). ``T`` never decreases with ``k``; Brent's
method finds the root in log space. When even ``k`` = `MIN_SCALE` simulates a step longer than
the one observed, the exposed communication alone exceeds it: the scale is clamped there and
``reachable`` is False (the communication coefficients are what is off, which a compute
correction cannot express).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardmeter.sim.fsdp import DEFAULT_MAX_INFLIGHT, FSDPDurations
from shardmeter.sim.scenario import extrapolated_step_s, first_steps_s
from shardmeter.spec.training import GradientSync

MIN_SCALE, MAX_SCALE = 0.01, 100.0
"""The compute scales searched (100× faster to 100× slower than the base coefficients)."""
RELATIVE_TOLERANCE = 1e-4


@dataclass(frozen=True)
class ScaleFit:
    compute_scale: float
    predicted_step_s: float
    """The simulated step with the base durations (scale 1)."""
    fitted_step_s: float
    """The simulated step at ``compute_scale`` (= the observed step when ``reachable``)."""
    reachable: bool


def step_at_scale(
    durations: FSDPDurations,
    accumulation: int,
    scale: float,
    max_inflight: int = DEFAULT_MAX_INFLIGHT,
    gradient_sync: GradientSync = GradientSync.EVERY_MICRO_BATCH,
) -> float:
    first = first_steps_s(durations.scaled_compute(scale), max_inflight, gradient_sync)
    return extrapolated_step_s(first, accumulation)


def fit_compute_scale(
    durations: FSDPDurations,
    accumulation: int,
    observed_step_s: float,
    max_inflight: int = DEFAULT_MAX_INFLIGHT,
    gradient_sync: GradientSync = GradientSync.EVERY_MICRO_BATCH,
) -> ScaleFit:
    """The compute scale whose simulated step equals ``observed_step_s`` (see the module)."""
    if not observed_step_s > 0 or math.isinf(observed_step_s):
        raise ValueError(f"observed_step_s must be a finite number > 0 (got {observed_step_s})")

    def step(scale: float) -> float:
        return step_at_scale(durations, accumulation, scale, max_inflight, gradient_sync)

    predicted = step(1.0)
    low, high = step(MIN_SCALE), step(MAX_SCALE)
    if observed_step_s <= low:
        return ScaleFit(MIN_SCALE, predicted, low, math.isclose(observed_step_s, low))
    if observed_step_s >= high:
        return ScaleFit(MAX_SCALE, predicted, high, math.isclose(observed_step_s, high))
    # imported here: scipy.optimize costs ~40 MiB resident, and the operator needs it only
    # for plans whose islands it observes
    from scipy.optimize import brentq

    root = brentq(
        lambda log_k: step(math.exp(log_k)) - observed_step_s,
        math.log(MIN_SCALE),
        math.log(MAX_SCALE),
        rtol=RELATIVE_TOLERANCE,
    )
    scale = math.exp(float(root))
    return ScaleFit(scale, predicted, step(scale), True)
