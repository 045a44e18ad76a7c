"""DiLoCo's relative eval-loss penalty against data-parallel training, p = L_DiLoCo / L_DP − 1
(0.007 = +0.7 %), and the tokens it takes to make it up: the centre of
`shardmeter.cost.quality`'s estimate.

**Source.** Fitted only on *Scaling Laws for DiLoCo* (Charles et al. 2025, arXiv:2503.09799):
the C4 eval losses of its Tables 4 and 5/12 (DiLoCo with M = 1, 2, 4, 8 replicas at H = 30
against data-parallel at the same N and tokens, 35 M–10 B at D = 20 N) — data and fit in
`shardmeter.cost.quality_fit`, residuals in ``benchmarks/bench_quality.py``. Comparisons from
other papers are held out. For N parameters, D tokens, M islands, H inner steps per outer step::

    p₀ = b(c) + R,   c = N·D / C_ref,   C_ref = 1e9 · 20e9
    b(c) = b · exp(d·ln c + e·ln² c)                          (the outer optimizer's gain)
    R = a · c^(−γ) · ((M − 1)·M^β)^y · h(H)                  (the replicas' price)
    h(H) = (H/30)^y for H ≤ 30,   1 + y·ln(H/30) above

* **b(c) ≤ 0** — the outer Nesterov step on one replica trains better than data-parallel (M = 1
  in Table 4: −0.1 % at 35 M widening to −0.4 % at 2.4 B, then −0.22 % and −0.19 % at 4 B and
  10 B in Table 5): a gain that grows and then narrows with compute, log-quadratic in c. It
  belongs to every M.
* **R** — the replicas drift apart between outer steps. In the local-SGD analyses (Stich 2018,
  arXiv:1805.09767; Woodworth et al. 2020, arXiv:2002.07839) the error local steps add grows
  with the steps H between averagings and with each step's noise, γ² times the gradient noise
  of a replica's batch B/M; M replicas spread around their mean by (M − 1)/M of that, so the
  drift is ∝ (M − 1)·H·γ²/B for inner learning rate γ and global batch B. The paper's recipe
  scales γ ∝ M^0.2929 and B ∝ M^0.3399 at fixed N (its joint laws, Table 10): drift ∝
  (M − 1)·M^β·H with β = 2·0.2929 − 0.3399 = 0.2459. The fit finds the price ∝ drift^y with
  y ≈ 0.70 across M = 2…8, shrinking with training compute as c^(−γ). The tables have
  H = 30 only, so **H enters through the same drift, with the fitted exponent** — (H/30)^y
  below H = 30, where the drift is small and the analysis holds; above it the same slope in
  ln H but no faster, 1 + y·ln(H/30): the paper, which re-tunes the outer learning rate per H,
  says loss rises with H, less for larger models and for M = 1, and that beyond H = 1 "all
  values of H perform somewhat comparably" up to H = 300 (§5.1, Figure 9; no numbers), which
  a price growing as H^0.7 (×5 from 30 to 300) would not. A mechanism, not a measurement:
  `shardmeter.cost.quality` counts the whole H effect as uncertainty.
  H = 1, the worst of the paper's H ablation (Figure 9), is priced as H = 300, its largest.
* Along the paper's D = 20 N diagonal only N·D's product is identified; splitting it evenly
  between N and D (c = N·D) lets the penalty follow both off the diagonal — an assumption,
  priced into the uncertainty.
* For M ≥ 3 the penalty is floored at 0: the paper never measures DiLoCo with M ≥ 4 ahead of
  data-parallel (Tables 4 and 5, to 10 B).

**The outer level as launched** (`shardmeter.cost.quality_outer`): an overlap delay τ and the
outer precision lose a share 1 − e of the run's tokens' progress; DiLoCo is priced at e·D tokens
against data-parallel at D: 1 + p = (1 + p₀(N, e·D)) · e^α_D. Fragments do not move it.

**Equivalent tokens.** How many tokens DiLoCo needs to reach data-parallel's loss: f with
``(1 + p(N, f·D)) · f^α_D = 1``. α_D, the loss's exponent in tokens at fixed N, follows from
the paper's L ∝ N^α along D = 20 N (Table 7, α = −0.0953): that diagonal is compute-optimal
(the paper's premise, Chinchilla's allocation), where the loss is equally sensitive to N and
D, so each carries half: α_D = α / 2. A penalty of 1 % costs about 23 % more tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardmeter.cost.quality_outer import token_efficiency
from shardmeter.spec.precision import Precision

FIT_H = 30
"""H of every run in the fit (the paper's §3 setup; Table 4 is at H = 30)."""
FIT_TOKENS_PER_PARAM = 20
"""D = 20 N, the Chinchilla budget of every run in the fit (Table 3)."""
REFERENCE_COMPUTE = 1e9 * FIT_TOKENS_PER_PARAM * 1e9
"""C_ref = N·D of a 1 B model at 20 tokens per parameter: where the constants are read."""
MEASURED_PARAMS = (35e6, 10e9)
"""The smallest and largest N of the fit (Table 3: 35 M to 10 B)."""
ABLATION_MAX_SYNC_EVERY = 300
"""The largest H of the paper's H ablation (Figure 9: H ∈ {1, 5, 10, 30, 100, 300})."""
RECIPE_ISLANDS_EXPONENT = 2 * 0.2929 - 0.3399
"""β: how the paper's recipe moves γ²/B with M at fixed N — its joint laws (Table 10):
inner learning rate ∝ M^0.2929, global batch ∝ M^0.3399."""
ALPHA_DP = -0.0953
"""Exponent of data-parallel's loss in N along D = 20 N: L = 18.129 · N^−0.0953 (Table 7,
Data-Parallel row)."""
ALPHA_TOKENS = ALPHA_DP / 2
"""The loss's exponent in tokens at fixed N: half the diagonal exponent (see above)."""


@dataclass(frozen=True)
class QualityConstants:
    """The six fitted constants of p₀ at H = 30 (fractions where not exponents)."""

    credit: float
    """b: the outer optimizer's gain at C_ref (negative = ahead of data-parallel)."""
    credit_slope: float
    """d: d ln|b(c)| / d ln c at C_ref."""
    credit_curvature: float
    """e: the gain's curvature in ln c (negative: it narrows again at large compute)."""
    amplitude: float
    """a: the replicas' price at C_ref per unit of drift^y."""
    compute_exponent: float
    """γ: how fast the price falls with training compute N·D."""
    drift_exponent: float
    """y: how the price grows with the replicas' drift (M − 1)·M^β·H."""


FITTED = QualityConstants(
    credit=-0.003290490846,
    credit_slope=0.04506941277,
    credit_curvature=-0.01848404119,
    amplitude=0.003144891515,
    compute_exponent=0.1259918817,
    drift_exponent=0.6964219751,
)
"""`shardmeter.cost.quality_fit.fit` on the 34 comparisons of Tables 4 and 5/12 (Joint):
residual RMS 0.067 percentage points, largest 0.17 (``benchmarks/bench_quality.py``)."""


def compute_ratio(params: float, tokens: float) -> float:
    """c = N·D / C_ref."""
    return params * tokens / REFERENCE_COMPUTE


def outer_gain(params: float, tokens: float, c: QualityConstants = FITTED) -> float:
    """b(c): the outer optimizer's gain (≤ 0, a fraction)."""
    lc = math.log(compute_ratio(params, tokens))
    return c.credit * math.exp(c.credit_slope * lc + c.credit_curvature * lc * lc)


def pricing_sync_every(sync_every: int) -> int:
    """The H the price is read at: H = 1 (the ablation's worst) as H = 300."""
    return ABLATION_MAX_SYNC_EVERY if sync_every <= 1 else sync_every


def drift(islands: int) -> float:
    """(M − 1)·M^β: the replicas' dispersion between outer steps at H = 30, relative to one
    replica pair's (0 for one island)."""
    m = float(islands)
    return float((m - 1.0) * m**RECIPE_ISLANDS_EXPONENT)


def cadence_scale(sync_every: int, c: QualityConstants = FITTED) -> float:
    """h(H): the replicas' price at H relative to H = 30 — the drift's (H/30)^y up to the
    fitted cadence, then 1 + y·ln(H/30), the same slope in ln H, no faster (module
    docstring)."""
    ratio = pricing_sync_every(sync_every) / FIT_H
    y = c.drift_exponent
    return float(ratio**y) if ratio <= 1 else 1.0 + y * math.log(ratio)


def replicas_price(
    params: float, tokens: float, islands: int, sync_every: int, c: QualityConstants = FITTED
) -> float:
    """R: the replicas' price (≥ 0, a fraction)."""
    z = drift(islands)
    if z <= 0:
        return 0.0
    compute = compute_ratio(params, tokens) ** (-c.compute_exponent)
    return float(c.amplitude * compute * z**c.drift_exponent * cadence_scale(sync_every, c))


def fitted_penalty(
    params: float, tokens: float, islands: int, c: QualityConstants = FITTED
) -> float:
    """b(c) + R at H = 30, unfloored: the fitted form itself (what `quality_fit` fits)."""
    return outer_gain(params, tokens, c) + replicas_price(params, tokens, islands, FIT_H, c)


def base_penalty(
    params: float, tokens: float, islands: int, sync_every: int, c: QualityConstants = FITTED
) -> float:
    """p₀: the penalty of DiLoCo training on ``tokens`` whose progress all reaches the global
    model (floored at 0 for M ≥ 3)."""
    p = outer_gain(params, tokens, c) + replicas_price(params, tokens, islands, sync_every, c)
    return max(p, 0.0) if islands >= 3 else p


def loss_penalty(
    params: float,
    tokens: float,
    islands: int,
    sync_every: int,
    *,
    fragment_sync_delay: int = 0,
    outer_precision: Precision = Precision.FP32,
    c: QualityConstants = FITTED,
) -> float:
    """p: DiLoCo's relative eval-loss penalty against data-parallel on ``tokens`` (a fraction):
    1 + p = (1 + p₀(N, e·D)) · e^α_D with e the outer level's token efficiency."""
    e = token_efficiency(sync_every, fragment_sync_delay, outer_precision)
    p0 = base_penalty(params, tokens * e, islands, sync_every, c)
    return float((1.0 + p0) * e**ALPHA_TOKENS - 1.0)


def equivalent_token_factor(
    params: float,
    tokens: float,
    islands: int,
    sync_every: int,
    *,
    fragment_sync_delay: int = 0,
    outer_precision: Precision = Precision.FP32,
    shift: float = 0.0,
    c: QualityConstants = FITTED,
) -> float:
    """Tokens DiLoCo needs to reach data-parallel's loss, as a multiple f of ``tokens``:
    (1 + p(N, f·D) + shift) · f^α_D = 1. ``shift`` moves the whole penalty curve (an
    uncertainty band's edge)."""

    def excess(u: float) -> float:  # increasing in u = ln f
        p = loss_penalty(
            params,
            tokens * math.exp(u),
            islands,
            sync_every,
            fragment_sync_delay=fragment_sync_delay,
            outer_precision=outer_precision,
            c=c,
        )
        return u - math.log1p(max(p + shift, -0.5)) / -ALPHA_TOKENS

    lo, hi = -30.0, 30.0  # f within e^±30: far beyond any plan's penalty
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if excess(mid) > 0:
            hi = mid
        else:
            lo = mid
    return math.exp(0.5 * (lo + hi))
