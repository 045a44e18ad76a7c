"""DiLoCo's quality price: the relative eval-loss penalty against data-parallel training and
the tokens it takes to make it up.

**Source.** Fitted only on *Scaling Laws for DiLoCo* (Charles et al. 2025, arXiv:2503.09799):
the C4 eval losses of its Tables 4 and 5/12 (DiLoCo with M = 1, 2, 4, 8 replicas at H = 30,
sizes 35 M–10 B at D = 20 N tokens) and its fitted L(N) law (Table 7). The data and the fit
are in `shardmeter.cost.quality_fit`; ``benchmarks/bench_quality.py`` prints the residuals.
The values were read from a conversion of the paper's text
(``shared/calibration/diloco-scaling-laws.json``); comparisons from other papers are held out.

**The penalty** p = L_DiLoCo / L_DP − 1 (0.007 = +0.7 %) for N parameters, D tokens, M islands
and H inner steps per outer step::

    p = b + R,   R = a · (N·D / C_ref)^(−γ) · (M^x − 1) · h(H),   C_ref = 1e9 · 20e9

* b < 0 — one replica with DiLoCo's outer Nesterov step trains *better* than data-parallel
  (M = 1 in Table 4: −0.1 to −0.4 %);
* R — the replicas' price: grows with M (x < 1: sub-linear), shrinks with training compute
  N·D. Along the paper's D = 20 N diagonal only N·D's product is identified; splitting the
  decay evenly between N and D makes the penalty shrink with size *and* with tokens per
  parameter (off the diagonal an assumption, priced into the uncertainty);
* h(H) = 1 + κ·ln(H/30) for H ≥ 2, h(1) = h(300). The paper's H ablation (its Figure 9:
  H ∈ {1, 5, 10, 30, 100, 300}) prints no numbers, only its shape — H = 1 worst, loss rising
  slowly with H beyond — so κ is a prior (`KAPPA`), not a fit, with its whole effect counted
  as uncertainty;
* for M ≥ 3 the penalty is floored at 0: the paper measures DiLoCo ahead of data-parallel
  only with M = 1 and with M = 2 at ≥ 2.4 B (never M = 4, up to 10 B), and its per-M laws
  that would predict M = 4 ahead beyond 4 B (Table 7) are contradicted by its own 4 B/10 B
  runs (Table 5).

**Streaming DiLoCo.** The paper trains plain DiLoCo (one fragment, no overlap). Streaming
DiLoCo syncs every fragment once per H steps, so H keeps its meaning and the penalty is
predicted at H; what fragments and the overlap τ do to quality is not in the fit: τ widens
the uncertainty as τ extra inner steps of staleness would, and settings beyond the
guard-rails (`StrategySpec`: τ ≤ 5 % of H, ~3 blocks per fragment) are warned. The outer
precision is not in the fit either (the paper sends bf16; Streaming DiLoCo reports FP4 and
INTELLECT-1 int8 pseudo-gradients quality-neutral).

**Equivalent tokens.** How many tokens DiLoCo needs to reach data-parallel's loss: f with
``(1 + p(N, f·D)) · f^α_D = 1``. α_D, the loss's exponent in tokens at fixed N, follows from
the paper's L ∝ N^α along D = 20 N (Table 7, α = −0.0953): that diagonal is compute-optimal
(the paper's premise, Chinchilla's allocation), where the loss is equally sensitive to N and
D, so each carries half: α_D = α / 2. A penalty of 1 % costs about 23 % more tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardmeter.spec.precision import Precision
from shardmeter.spec.training import (
    DEFAULT_LAYERS_PER_FRAGMENT,
    DEFAULT_MAX_FRAGMENT_SYNC_DELAY_FRACTION,
    DEFAULT_MAX_MEASURED_ISLANDS,
    StrategyKind,
    StrategySpec,
)

FIT_H = 30
"""H of every run in the fit (the paper's §3 setup; Table 4 is at H = 30)."""
FIT_TOKENS_PER_PARAM = 20
"""D = 20 N, the Chinchilla budget of every run in the fit (Table 3)."""
REFERENCE_COMPUTE = 1e9 * FIT_TOKENS_PER_PARAM * 1e9
"""C_ref = N·D of a 1 B model at 20 tokens per parameter: where ``amplitude`` is read."""
MEASURED_PARAMS = (35e6, 10e9)
"""The smallest and largest N of the fit (Table 3: 35 M to 10 B)."""
ABLATION_MAX_SYNC_EVERY = 300
"""The largest H of the paper's H ablation (Figure 9: H ∈ {1, 5, 10, 30, 100, 300})."""
KAPPA = 0.25
"""Slope of h(H) = 1 + κ·ln(H/30). A prior, not a fit: Figure 9 gives the shape (H = 1
worst, loss rising slowly with H) but no numbers. 0.25 lets the replicas' price grow by
about half from H = 30 to H = 300; the uncertainty counts 100 % of the H effect."""
ALPHA_DP = -0.0953
"""Exponent of data-parallel's loss in N along D = 20 N: L = 18.129 · N^−0.0953 (Table 7,
Data-Parallel row)."""
ALPHA_TOKENS = ALPHA_DP / 2
"""The loss's exponent in tokens at fixed N: half the diagonal exponent (see the module
docstring)."""
DATA_PARALLEL_BASIS = "data-parallel (FSDP in one island): the reference, no penalty"


@dataclass(frozen=True)
class QualityConstants:
    """The four fitted constants of p = b + a·(N·D/C_ref)^(−γ)·(M^x − 1) at H = 30."""

    offset: float
    """b: the outer optimizer's gain with one replica (a fraction; negative = ahead of DP)."""
    amplitude: float
    """a: the replicas' price per unit of (M^x − 1) at C_ref (a fraction)."""
    compute_exponent: float
    """γ: how fast the price falls with training compute N·D."""
    islands_exponent: float
    """x: how it grows with the islands M."""


FITTED = QualityConstants(
    offset=-0.0026731835,
    amplitude=0.0061578601,
    compute_exponent=0.1401701694,
    islands_exponent=0.6289923946,
)
"""`shardmeter.cost.quality_fit.fit` on the 34 comparisons of Tables 4 and 5/12 (Joint):
residual RMS 0.082 percentage points, largest 0.18 (``benchmarks/bench_quality.py``)."""
FIT_RESIDUAL = 0.00087
"""1σ of the fit: its residual RMS with 4 of 34 degrees of freedom spent
(0.082 pp · √(34/30)), as a fraction. The printed losses' rounding (3 decimals) is 0.02 %."""


def _replicas_at_fit(params: float, tokens: float, islands: int, c: QualityConstants) -> float:
    """R at H = 30: the replicas' price before the H term."""
    compute = params * tokens / REFERENCE_COMPUTE
    growth = float(islands) ** c.islands_exponent - 1.0
    return float(c.amplitude * compute ** (-c.compute_exponent) * growth)


def fitted_penalty(
    params: float, tokens: float, islands: int, c: QualityConstants = FITTED
) -> float:
    """b + R at H = 30, unfloored: the fitted form itself (what `quality_fit` fits)."""
    return c.offset + _replicas_at_fit(params, tokens, islands, c)


def sync_every_scale(sync_every: int) -> float:
    """h(H): the replicas' price at H relative to H = 30 (see the module docstring)."""
    h = ABLATION_MAX_SYNC_EVERY if sync_every <= 1 else sync_every
    return 1.0 + KAPPA * math.log(h / FIT_H)


def loss_penalty(
    params: float, tokens: float, islands: int, sync_every: int, c: QualityConstants = FITTED
) -> float:
    """p: DiLoCo's relative eval-loss penalty against data-parallel (a fraction)."""
    p = c.offset + _replicas_at_fit(params, tokens, islands, c) * sync_every_scale(sync_every)
    return max(p, 0.0) if islands >= 3 else p


def _factor_for(penalty_at: float, params: float, tokens: float, islands: int, h: int) -> float:
    """Solve (1 + p(N, f·D)) · f^α_D = 1 for f, with p shifted by ``penalty_at`` − p(N, D)
    (an uncertainty band moves the whole curve)."""
    shift = penalty_at - loss_penalty(params, tokens, islands, h)

    def excess(u: float) -> float:  # increasing in u = ln f
        p = loss_penalty(params, tokens * math.exp(u), islands, h) + shift
        return u - math.log1p(max(p, -0.5)) / -ALPHA_TOKENS

    lo, hi = -8.0, 8.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if excess(mid) > 0:
            hi = mid
        else:
            lo = mid
    return math.exp(0.5 * (lo + hi))


def equivalent_token_factor(params: float, tokens: float, islands: int, sync_every: int) -> float:
    """Tokens DiLoCo needs to reach data-parallel's loss, as a multiple of ``tokens``."""
    p = loss_penalty(params, tokens, islands, sync_every)
    return _factor_for(p, params, tokens, islands, sync_every)


@dataclass(frozen=True)
class QualityEstimate:
    """What a plan's outer level costs in quality against data-parallel training."""

    loss_penalty_vs_dp: float
    """Relative eval-loss penalty against data-parallel on the same tokens (0.007 = +0.7 %;
    negative: DiLoCo ahead)."""
    loss_penalty_uncertainty: float
    """1σ of ``loss_penalty_vs_dp`` (the same unit)."""
    equivalent_token_factor: float
    """Tokens to reach data-parallel's loss ÷ the plan's tokens (1 = none extra)."""
    equivalent_token_factor_range: tuple[float, float]
    """The factor at the penalty ± its uncertainty."""
    basis: str
    """Where the numbers come from, for this plan."""
    warnings: tuple[str, ...] = ()
    """Guard-rails the plan is beyond and extrapolations (empty: within what was measured)."""


def data_parallel_quality() -> QualityEstimate:
    """FSDP in one island: the reference."""
    return QualityEstimate(0.0, 0.0, 1.0, (1.0, 1.0), DATA_PARALLEL_BASIS)


@dataclass(frozen=True)
class OuterSettings:
    """What the quality model reads of a DiLoCo plan (all given, none auto)."""

    islands: int
    sync_every: int
    fragments: int = 1
    fragment_sync_delay: int = 0
    streaming: bool = True
    """Streaming DiLoCo (fragments, overlap) rather than blocking DiLoCo."""
    outer_precision: Precision = Precision.FP32
    max_measured_islands: int = DEFAULT_MAX_MEASURED_ISLANDS
    max_fragment_sync_delay_fraction: float = DEFAULT_MAX_FRAGMENT_SYNC_DELAY_FRACTION
    layers_per_fragment: int = DEFAULT_LAYERS_PER_FRAGMENT


def diloco_quality(
    params: float, tokens: float, num_layers: int, s: OuterSettings
) -> QualityEstimate:
    """The penalty, its uncertainty, the equivalent-token factor, the basis and the warnings
    for a DiLoCo plan of ``s.islands`` islands (see the module docstring)."""
    m, h = s.islands, s.sync_every
    p = loss_penalty(params, tokens, m, h)
    r30 = _replicas_at_fit(params, tokens, m, FITTED)
    r = r30 * sync_every_scale(h)
    tpp = tokens / params
    g = FITTED.compute_exponent
    terms = {
        "fit": FIT_RESIDUAL,
        # the slope in H is a prior: its whole effect is uncertain
        "syncEvery": r30 * abs(sync_every_scale(h) - 1.0),
        # off the 20 N diagonal: the decay given to N alone or to D alone
        "tokens per parameter": r * abs((tpp / 20) ** g - (tpp / 20) ** (-g)) / 2,
        "overlap": r30 * KAPPA * math.log1p(s.fragment_sync_delay / h) if s.streaming else 0.0,
    }
    warnings: list[str] = []
    if m > s.max_measured_islands:
        terms["islands"] = r * 0.5 * math.log2(m / s.max_measured_islands)
        warnings.append(
            f"{m} islands: more than any published DiLoCo run ({s.max_measured_islands}, "
            "Scaling Laws for DiLoCo Table 4); the penalty is extrapolated"
        )
    low, high = MEASURED_PARAMS
    if not low <= params <= high:
        edge = low if params < low else high
        terms["model size"] = r * 0.25 * abs(math.log10(params / edge))
        warnings.append(
            f"{params / 1e9:.3g} B parameters: outside the fit's 35 M–10 B; extrapolated"
        )
    if not 5 <= tpp <= 80:
        warnings.append(
            f"{tpp:.3g} tokens per parameter: far from the fit's 20 (Chinchilla); the split of "
            "the penalty's decay between size and tokens is an assumption there"
        )
    if h > ABLATION_MAX_SYNC_EVERY:
        warnings.append(
            f"syncEvery {h}: beyond the paper's H ablation (≤ {ABLATION_MAX_SYNC_EVERY}); "
            "the H slope is extrapolated"
        )
    if s.streaming:
        limit = math.floor(s.max_fragment_sync_delay_fraction * h + 1e-9)
        if s.fragment_sync_delay > limit:
            warnings.append(
                f"fragmentSyncDelay {s.fragment_sync_delay} is "
                f"{s.fragment_sync_delay / h:.0%} of syncEvery {h}: beyond the "
                f"{s.max_fragment_sync_delay_fraction:.0%} Streaming DiLoCo reports robust "
                "(τ ≤ 5 at H = 100); fragments arrive stale"
            )
        per = num_layers / s.fragments
        want = s.layers_per_fragment
        if s.fragments > 1 and not want / 2 <= per <= 2 * want:
            warnings.append(
                f"{s.fragments} fragments of {per:.3g} blocks: the Streaming DiLoCo papers "
                f"train about {want} per fragment; not in the quality model"
            )
        elif s.fragments == 1 and s.fragment_sync_delay > 0 and num_layers > 2 * want:
            warnings.append(
                f"one fragment with fragmentSyncDelay {s.fragment_sync_delay}: the whole "
                "model's update arrives stale; the Streaming DiLoCo papers overlap fragments "
                f"of about {want} blocks instead"
            )
    sigma = math.sqrt(sum(v * v for v in terms.values()))
    factor = _factor_for(p, params, tokens, m, h)
    band = (
        _factor_for(p - sigma, params, tokens, m, h),
        _factor_for(p + sigma, params, tokens, m, h),
    )
    notes = [
        f"Scaling Laws for DiLoCo (arXiv:2503.09799) Tables 4–5 fit at H = {FIT_H}, "
        f"D = 20 N; here N = {params / 1e9:.3g} B, D = {tokens / 1e9:.3g} B "
        f"({tpp:.3g} tokens/param), M = {m}, H = {h}",
        f"±{100 * sigma:.2f} pp (1σ: fit {100 * FIT_RESIDUAL:.2f}"
        + "".join(f", {k} {100 * v:.2f}" for k, v in terms.items() if k != "fit" and v > 5e-5)
        + ")",
    ]
    if h != FIT_H:
        notes.append(f"H slope κ = {KAPPA} a prior (Fig. 9 prints no numbers)")
    if s.streaming and (s.fragments > 1 or s.fragment_sync_delay > 0):
        notes.append("fragments and overlap not in the fit (predicted at H)")
    if s.outer_precision is not Precision.FP32 and s.outer_precision is not Precision.BF16:
        notes.append(
            f"{s.outer_precision.value} pseudo-gradients not in the fit (reported "
            "quality-neutral by Streaming DiLoCo and INTELLECT-1)"
        )
    notes.append(f"tokens to DP's loss via L ∝ D^{ALPHA_TOKENS:.4f} (half of Table 7's N exponent)")
    return QualityEstimate(p, sigma, factor, band, "; ".join(notes), tuple(warnings))


def strategy_quality(
    params: float,
    tokens: float,
    num_layers: int,
    strategy: StrategySpec,
    islands: int,
    sync_every: int,
    fragments: int = 1,
    fragment_sync_delay: int = 0,
) -> QualityEstimate:
    """The quality of a plan with ``strategy`` and these islands and (resolved) settings:
    the reference for FSDP, `diloco_quality` with the strategy's guard-rails otherwise. The
    one entry point for plans, simulations and the operator."""
    if not strategy.is_diloco:
        return data_parallel_quality()
    return diloco_quality(
        params,
        tokens,
        num_layers,
        OuterSettings(
            islands,
            sync_every,
            fragments,
            fragment_sync_delay,
            strategy.kind is StrategyKind.STREAMING_DILOCO,
            strategy.outer_precision,
            strategy.max_measured_islands,
            strategy.max_fragment_sync_delay_fraction,
            strategy.layers_per_fragment,
        ),
    )
