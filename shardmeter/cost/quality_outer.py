"""What the launched outer level does to DiLoCo's training signal, beyond what *Scaling Laws for
DiLoCo* measured: the overlap delay τ, the fragments and the outer precision, each from its
mechanism in the runtime the operator launches (torchtitan 0.3.0 + torchft 0.2.0), and the
outer optimizer that runtime steps with.

Both mechanisms are priced as a **token efficiency** e ≤ 1: the share of the run's tokens whose
progress reaches the global model. `shardmeter.cost.quality_law` prices DiLoCo at e·D tokens
and compares it with data-parallel at D (the loss's slope in tokens turns lost tokens into loss).

**Overlap delay τ** (``fragmentSyncDelay``). torchft's Streaming DiLoCo takes a fragment's
pseudo-gradient τ inner steps before its sync (``torchft/local_sgd.py``: ``prepare_sync`` at
local step ``H/F − τ``, ``perform_sync`` at ``H/F``, round robin over the F fragments, so each
fragment every H steps) and at the sync sets the fragment to the new global parameters merged
with the local ones by ``fragment_update_alpha`` α: ``lerp(global, local, α)``. torchtitan's
default — the operator sets no other — is α = 0 (``experiments/torchft/config/job_config.py``:
"By default, we just use the global parameters"), so the τ inner steps a fragment trained after
its pseudo-gradient was taken are discarded: of every H inner steps, H − τ reach the global
model, whatever F. e_τ = 1 − τ/H. (The inner AdamW moments keep what those steps saw, so this
is the upper end of the loss; the uncertainty counts the whole effect.) torchft refuses
τ ≥ H/F (`shardmeter.spec.training.torchft_violation`), so e_τ > 1 − 1/F.

**Fragments** F do not move the penalty: torchft syncs each fragment every H inner steps with
the same outer optimizer, so every parameter sees the cadence plain DiLoCo has, and the share
τ/H discarded above is the same for any F. Streaming DiLoCo (Douillard et al. 2025,
arXiv:2501.18512, abstract) states that its fragments, overlap and 4-bit exchange together
"reach similar quality as before"; no number from the fitting set says otherwise, so F adds
nothing to the penalty or its uncertainty.

**Outer precision.** torchft's quantised all_reduce (``torchft/collectives.py``
``allreduce_quantized``) rounds the pseudo-gradient twice — each rank quantises its own before
the all-to-all, the reducing rank quantises the average again before the all-gather — with one
absmax scale per row (``torchft/quantization.py``: ``scale = FP8_MAX / row_max``). Rounding
adds noise of relative variance ε² per pass (ε: the format's relative RMS rounding error over a
row of Gaussian values, computed here from the format's definition). The averaged
pseudo-gradient of an LLM is dominated by sampling noise, whose variance falls as 1 / tokens:
noise of relative variance q = 2ε² costs the outer step as much as 1 − 1/(1 + q) of its
tokens. e_q = 1 / (1 + q). The formats (`Precision`): fp32 exact; bf16 a cast to 8 significand
bits (round to nearest even); fp8 torchft's E4M3 on compute capability ≥ 9.0 (max 448, 3
mantissa bits, round to nearest even); int8 torchft's fallback below (max 127; Triton's float
to int cast truncates toward zero); fp4 E2M1 (OCP Microscaling: max 6, 1 mantissa bit, round
to nearest even; torchft has no 4-bit kernel). Resulting ε: see `rounding_error`. Streaming
DiLoCo (arXiv:2501.18512) sends FP4 E3M0 with the "similar quality" above, and INTELLECT-1
(Jaghouar et al. 2024, arXiv:2412.01152) trained on int8 pseudo-gradients; the mechanism
agrees: fp8 and int8 cost under 0.01 percentage points of loss, fp4 about 0.13, bf16 nothing.

**The launched outer optimizer.** torchtitan 0.3.0 builds it in
``experiments/torchft/manager.py`` (``maybe_semi_sync_training``) as
``SGD(lr=0.7, momentum=0.9, nesterov=True)`` per fragment, for any number of replica groups —
one island included: a one-island DiLoCo plan runs DiLoCo's outer Nesterov step on its own
pseudo-gradient (DiLoCo with M = 1). The paper tuned η per M (its Figure 7, best η for
N ≥ 335 M at H = 30: 0.4 for M = 1, 0.6 for M = 2 and 4, 0.8 for M = 8).
"""

from __future__ import annotations

import math
from functools import cache
from statistics import NormalDist

from shardmeter.spec.precision import Precision

LAUNCHED_OUTER_LR = 0.7
"""η of torchtitan 0.3.0's outer optimizer (``experiments/torchft/manager.py``, fixed)."""
LAUNCHED_OUTER_MOMENTUM = 0.9
"""Its Nesterov momentum (the same line; the paper's too, §3)."""
PAPER_BEST_OUTER_LR = {1: 0.4, 2: 0.6, 4: 0.6, 8: 0.8}
"""Scaling Laws for DiLoCo, Figure 7: the best η over {0.2, …, 1.0} per M, constant for
N ≥ 335 M (H = 30)."""
FRAGMENT_UPDATE_ALPHA = 0.0
"""torchtitan 0.3.0's ``fault_tolerance.fragment_update_alpha`` default: a synced fragment takes
the global parameters, its local progress since the pseudo-gradient dropped."""
QUANTISATION_PASSES = 2
"""Roundings per outer all_reduce: before the all-to-all and after the reduction
(``torchft/collectives.py`` ``allreduce_quantized``)."""
ROW_VALUES = 4096
"""Values per scaled row in `rounding_error` (a hidden size; the row's maximum, and so the
grid, moves as √(2 ln n): 4,096 vs 16,384 changes ε by under 10 %)."""


def _float_round(
    values: list[float], mantissa_bits: int, min_exponent: int, max_value: float
) -> list[float]:
    """Round to a binary float grid (round half to even), saturating at ``max_value``;
    subnormals below ``2**min_exponent``."""
    out = []
    for v in values:
        a = abs(v)
        e = max(math.floor(math.log2(a)), min_exponent) if a > 0 else min_exponent
        step = 2.0 ** (e - mantissa_bits)
        q = min(round(a / step) * step, max_value)
        out.append(math.copysign(q, v))
    return out


def gaussian_row(n: int) -> list[float]:
    """n values at the Gaussian's quantiles (i − ½)/n: a deterministic row."""
    normal = NormalDist()
    return [normal.inv_cdf((i + 0.5) / n) for i in range(n)]


@cache
def rounding_error(precision: Precision, row_values: int = ROW_VALUES) -> float:
    """ε: the relative RMS error one rounding to ``precision`` leaves on a row of Gaussian
    values scaled as torchft scales it (absmax to the format's maximum; a bf16 cast unscaled):
    √(Σ (q(x) − x)² / Σ x²). fp32: 0 (the pseudo-gradient's own dtype)."""
    if precision is Precision.FP32:
        return 0.0
    row = gaussian_row(row_values)
    top = max(abs(v) for v in row)
    if precision is Precision.BF16:
        q = _float_round(row, 7, -126, 3.0e38)
        scaled = row
    elif precision is Precision.INT8:
        scaled = [v * 127 / top for v in row]
        q = [float(math.trunc(v)) for v in scaled]
    elif precision is Precision.FP8:
        scaled = [v * 448 / top for v in row]
        q = _float_round(scaled, 3, -6, 448.0)
    else:  # FP4, E2M1
        scaled = [v * 6 / top for v in row]
        q = _float_round(scaled, 1, 0, 6.0)
    error = sum((a - b) ** 2 for a, b in zip(q, scaled, strict=True))
    return math.sqrt(error / sum(v * v for v in scaled))


def quantisation_efficiency(precision: Precision) -> float:
    """e_q = 1 / (1 + 2ε²): the share of the outer step's tokens the rounding leaves."""
    return 1.0 / (1.0 + QUANTISATION_PASSES * rounding_error(precision) ** 2)


def overlap_efficiency(sync_every: int, fragment_sync_delay: int) -> float:
    """e_τ = 1 − τ/H: the share of each fragment's inner steps that reach the global model
    (torchft with α = 0). Raises ValueError for τ ≥ H (no step would reach it)."""
    if not 0 <= fragment_sync_delay < max(sync_every, 1):
        raise ValueError(
            f"fragment_sync_delay {fragment_sync_delay} must be in [0, sync_every "
            f"{sync_every}): torchft discards a fragment's steps after its pseudo-gradient"
        )
    return 1.0 - fragment_sync_delay / max(sync_every, 1)


def token_efficiency(sync_every: int, fragment_sync_delay: int, precision: Precision) -> float:
    """e = e_τ · e_q: the share of the run's tokens whose progress reaches the global model."""
    return overlap_efficiency(sync_every, fragment_sync_delay) * quantisation_efficiency(precision)
