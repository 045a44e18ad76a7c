"""DiLoCo's quality price for a plan: the relative eval-loss penalty against data-parallel
training, its uncertainty, the tokens it takes to make it up, where the numbers come from and
what the plan's outer level runs — the one entry point for plans, simulations and the operator
(`strategy_quality`).

**Centre**: `shardmeter.cost.quality_law` (fitted on *Scaling Laws for DiLoCo*,
arXiv:2503.09799, Tables 4 and 5/12) with the launched outer level's mechanisms
(`shardmeter.cost.quality_outer`). Every knob of `OuterSettings` acts there or is stated not
to: islands M, syncEvery H, fragmentSyncDelay τ and outerPrecision move the penalty; fragments
F do not (torchft syncs each fragment every H steps). The inner optimizer is not a knob: the
fit, torchtitan's configs and the memory model are AdamW (MuLoCo's Muon inner optimizer,
arXiv:2505.23725, is outside the model).

**One island.** A one-island DiLoCo plan runs DiLoCo's outer step: torchtitan 0.3.0 builds
torchft's DiLoCo with its Nesterov outer optimizer (η 0.7, momentum 0.9) for any number of
replica groups, and the operator launches every DiLoCo plan with ``semi_sync_method=diloco``
(`shardmeter_operator.render.torchtitan`). It is priced as the paper's M = 1 (Lookahead-style
DiLoCo), whose gain is the least certain number here (see hyperparameters below); FSDP is the
data-parallel reference.

**Uncertainty** (1σ, the terms added in quadrature; ``benchmarks/bench_quality.py`` shows how
they cover errors on data the fit did not see):

* *fit* — the RMS error of the law on model sizes it was not fitted on (leave one size out);
* *hyperparameters* — how far the penalty moves when only the recipe changes: Table 12's
  Independent rows are the Joint runs with the per-M instead of the joint hyperparameter laws;
  the term that covers two thirds of the law's errors on them is 0.89 percentage points for
  one island (its gain is the most fragile number here: +0.2 % and +0.6 % behind
  data-parallel with that recipe at 4 B and 10 B, −0.2 % ahead with the joint one) and 0.18
  for more. A plan's recipe is its own (torchtitan's outer learning rate is a fixed 0.7, the
  paper's best 0.4–0.8 by M), so every plan carries it; the paper's own runs (the
  leave-one-size-out check) do not;
* *syncEvery*, *overlap*, *outerPrecision* — each mechanism's whole effect: the difference
  between the penalty with it and without it (H = 30 at τ = 0; τ = 0; FP32);
* *tokens per parameter* — off the fit's D = 20 N: half the difference between giving the
  compute's effect to N alone and to D alone;
* *islands* — beyond the most islands measured (8): 7.5 % of the replicas' price per doubling,
  calibrated on fitting M ≤ 4 to predict M = 8;
* *model size* — outside 35 M–10 B: |b(c)| + R per decade, calibrated on the paper's own
  leave-out (fit N ≤ 1.3 B, predict 2.4–10 B).

The data-calibrated terms (fit, hyperparameters, islands, model size) each cover two thirds of
the errors on the split they were calibrated on; the leave-one-size-out check, whose end sizes
use the model-size term calibrated elsewhere, covers 26 of 34 (76 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardmeter.cost.quality_law import (
    ABLATION_MAX_SYNC_EVERY,
    ALPHA_TOKENS,
    FIT_H,
    FIT_TOKENS_PER_PARAM,
    FITTED,
    MEASURED_PARAMS,
    QualityConstants,
    equivalent_token_factor,
    loss_penalty,
    outer_gain,
    replicas_price,
)
from shardmeter.cost.quality_outer import (
    LAUNCHED_OUTER_LR,
    LAUNCHED_OUTER_MOMENTUM,
    token_efficiency,
)
from shardmeter.spec.precision import Precision
from shardmeter.spec.training import (
    DEFAULT_LAYERS_PER_FRAGMENT,
    DEFAULT_MAX_FRAGMENT_SYNC_DELAY_FRACTION,
    DEFAULT_MAX_MEASURED_ISLANDS,
    StrategyKind,
    StrategySpec,
)

FIT_RESIDUAL = 0.000791
"""1σ of the law on sizes it was not fitted on: the RMS of its leave-one-size-out errors on
the 34 comparisons, 0.079 percentage points (`shardmeter.cost.quality_fit.fit_residual_pct`),
as a fraction. The printed losses' rounding (3 decimals) is 0.02 %."""
HYPERPARAMETER_SPREAD = {1: 0.00893, 2: 0.0018}
"""How far the penalty moves with the hyperparameter recipe alone, one island (key 1) and
more (key 2): with the fit residual, it covers two thirds of the law's errors on Table 12's
Independent rows (the fitted Joint runs with the per-M laws' inner learning rate and batch) —
0.89 and 0.18 percentage points (`shardmeter.cost.quality_fit.hyperparameter_spread_pct`)."""
ISLANDS_PER_DOUBLING = 0.0753
"""Beyond the measured islands: this share of the replicas' price per doubling, calibrated on
the one islands extrapolation the data allows — fit M ≤ 4, predict M = 8 (7 sizes; the law
errs by +0.06 to +0.52 pp there, always above the printed penalty)
(`shardmeter.cost.quality_fit.islands_per_doubling`)."""
SIZE_PER_DECADE = 1.0
"""Outside 35 M–10 B: this share of |b(c)| + R per decade, calibrated on the paper's own
leave-out — fit N ≤ 1.3 B, predict 2.4 B, 4 B and 10 B
(`shardmeter.cost.quality_fit.size_per_decade`: 0.997)."""
DATA_PARALLEL_BASIS = "data-parallel (FSDP in one island): the reference, no penalty"


@dataclass(frozen=True)
class QualityFit:
    """What the uncertainty reads of a fit: its constants, its out-of-sample residual and the
    sizes it saw (the stored model's, or a benchmark fold's)."""

    constants: QualityConstants = FITTED
    residual: float = FIT_RESIDUAL
    params_range: tuple[float, float] = MEASURED_PARAMS


STORED_FIT = QualityFit()


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
    runs: str = DATA_PARALLEL_BASIS
    """What the plan's outer level runs, in words (what the penalty prices)."""


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

    @property
    def delay(self) -> int:
        """τ as priced: 0 for blocking DiLoCo."""
        return self.fragment_sync_delay if self.streaming else 0


def runs_text(s: OuterSettings) -> str:
    """What the plan's outer level runs (torchtitan 0.3.0 + torchft 0.2.0, as launched)."""
    step = (
        f"torchft's DiLoCo outer step (Nesterov SGD, lr {LAUNCHED_OUTER_LR}, momentum "
        f"{LAUNCHED_OUTER_MOMENTUM}) every {s.sync_every} inner steps"
    )
    if s.islands == 1:
        return (
            f"one island running {step} on its own pseudo-gradient: DiLoCo with M = 1 "
            "(a Lookahead-style optimizer, no cross-island traffic), priced as the paper's M = 1"
        )
    return f"{s.islands} islands averaging pseudo-gradients under {step}"


def _penalty(
    params: float,
    tokens: float,
    s: OuterSettings,
    c: QualityConstants,
    *,
    sync_every: int | None = None,
    fragment_sync_delay: int | None = None,
    outer_precision: Precision | None = None,
) -> float:
    """The penalty at ``s``, with any knob given here in its place."""
    return loss_penalty(
        params,
        tokens,
        s.islands,
        s.sync_every if sync_every is None else sync_every,
        fragment_sync_delay=s.delay if fragment_sync_delay is None else fragment_sync_delay,
        outer_precision=s.outer_precision if outer_precision is None else outer_precision,
        c=c,
    )


def uncertainty_terms(
    params: float, tokens: float, s: OuterSettings, fit: QualityFit = STORED_FIT
) -> dict[str, float]:
    """The 1σ terms of the module docstring, by name (fractions; zero terms left out)."""
    c = fit.constants
    m = s.islands
    p = _penalty(params, tokens, s, c)
    d_eff = tokens * token_efficiency(s.sync_every, s.delay, s.outer_precision)
    r = replicas_price(params, d_eff, m, s.sync_every, c)
    b = outer_gain(params, d_eff, c)
    # off the D = 20 N diagonal: the compute's effect given to N alone, then to D alone
    along_n = _penalty(params, FIT_TOKENS_PER_PARAM * params, s, c)
    along_d = _penalty(tokens / FIT_TOKENS_PER_PARAM, tokens, s, c)
    terms = {
        "fit": fit.residual,
        "hyperparameters": HYPERPARAMETER_SPREAD[min(m, 2)],
        "syncEvery": abs(
            _penalty(params, tokens, s, c, fragment_sync_delay=0)
            - _penalty(params, tokens, s, c, sync_every=FIT_H, fragment_sync_delay=0)
        ),
        "tokens per parameter": abs(along_n - along_d) / 2,
        "overlap": abs(p - _penalty(params, tokens, s, c, fragment_sync_delay=0)),
        "outerPrecision": abs(p - _penalty(params, tokens, s, c, outer_precision=Precision.FP32)),
    }
    if m > s.max_measured_islands:
        terms["islands"] = r * ISLANDS_PER_DOUBLING * math.log2(m / s.max_measured_islands)
    low, high = fit.params_range
    if not low <= params <= high:
        edge = low if params < low else high
        terms["model size"] = (r + abs(b)) * SIZE_PER_DECADE * abs(math.log10(params / edge))
    return {k: v for k, v in terms.items() if v > 0 or k == "fit"}


def _warnings(params: float, tokens: float, num_layers: int, s: OuterSettings) -> list[str]:
    m, h = s.islands, s.sync_every
    out: list[str] = []
    if m > s.max_measured_islands:
        out.append(
            f"{m} islands: more than any published DiLoCo run ({s.max_measured_islands}, "
            "Scaling Laws for DiLoCo Table 4); the penalty is extrapolated"
        )
    low, high = MEASURED_PARAMS
    if not low <= params <= high:
        out.append(f"{params / 1e9:.3g} B parameters: outside the fit's 35 M–10 B; extrapolated")
    tpp = tokens / params
    if not 5 <= tpp <= 80:
        out.append(
            f"{tpp:.3g} tokens per parameter: far from the fit's 20 (Chinchilla); the split of "
            "the penalty's decay between size and tokens is an assumption there"
        )
    if h > ABLATION_MAX_SYNC_EVERY:
        out.append(
            f"syncEvery {h}: beyond the paper's H ablation (≤ {ABLATION_MAX_SYNC_EVERY}); "
            "the H slope is extrapolated"
        )
    if not s.streaming:
        return out
    limit = math.floor(s.max_fragment_sync_delay_fraction * h + 1e-9)
    if s.fragment_sync_delay > limit:
        out.append(
            f"fragmentSyncDelay {s.fragment_sync_delay} is {s.fragment_sync_delay / h:.0%} of "
            f"syncEvery {h}: beyond the {s.max_fragment_sync_delay_fraction:.0%} Streaming "
            "DiLoCo reports robust (τ ≤ 5 at H = 100); torchft drops each fragment's last "
            f"{s.fragment_sync_delay} inner steps of every {h}"
        )
    per = num_layers / s.fragments
    want = s.layers_per_fragment
    if s.fragments > 1 and not want / 2 <= per <= 2 * want:
        out.append(
            f"{s.fragments} fragments of {per:.3g} blocks: the Streaming DiLoCo papers train "
            f"about {want} per fragment; not in the quality model"
        )
    elif s.fragments == 1 and s.fragment_sync_delay > 0 and num_layers > 2 * want:
        out.append(
            f"one fragment with fragmentSyncDelay {s.fragment_sync_delay}: the whole model's "
            "update arrives stale; the Streaming DiLoCo papers overlap fragments of about "
            f"{want} blocks instead"
        )
    return out


def diloco_quality(
    params: float, tokens: float, num_layers: int, s: OuterSettings, fit: QualityFit = STORED_FIT
) -> QualityEstimate:
    """The penalty, its uncertainty, the equivalent-token factor, the basis, the warnings and
    what runs, for a DiLoCo plan of ``s.islands`` islands. Raises ValueError for τ ≥ H (no
    inner step would reach the global model; torchft itself refuses τ ≥ H / F)."""
    m, h, tau = s.islands, s.sync_every, s.delay
    p = _penalty(params, tokens, s, fit.constants)
    terms = uncertainty_terms(params, tokens, s, fit)
    sigma = math.sqrt(sum(v * v for v in terms.values()))

    def factor_at(shift: float) -> float:
        return equivalent_token_factor(
            params,
            tokens,
            m,
            h,
            fragment_sync_delay=tau,
            outer_precision=s.outer_precision,
            shift=shift,
            c=fit.constants,
        )

    factor, band = factor_at(0.0), (factor_at(-sigma), factor_at(sigma))
    tpp = tokens / params
    setting = f"M = {m}, H = {h}" + (f", τ = {tau}" if tau else "")
    if s.outer_precision is not Precision.FP32:
        setting += f", outer {s.outer_precision.value}"
    notes = [
        f"Scaling Laws for DiLoCo (arXiv:2503.09799) Tables 4–5 fit at H = {FIT_H}, "
        f"D = 20 N; here N = {params / 1e9:.3g} B, D = {tokens / 1e9:.3g} B "
        f"({tpp:.3g} tokens/param), {setting}",
        f"±{100 * sigma:.2f} pp (1σ: "
        + ", ".join(f"{k} {100 * v:.2f}" for k, v in terms.items() if k == "fit" or v > 5e-5)
        + ")",
    ]
    if h != FIT_H and m > 1:
        y = fit.constants.drift_exponent
        notes.append(
            f"H through the replicas' drift (slope {y:.2f} in ln H at H = 30, a mechanism)"
        )
    if tau:
        notes.append(f"torchft drops τ/H = {tau / h:.1%} of each fragment's steps (α = 0)")
    notes.append(f"tokens to DP's loss via L ∝ D^{ALPHA_TOKENS:.4f} (half of Table 7's N exponent)")
    return QualityEstimate(
        p,
        sigma,
        factor,
        band,
        "; ".join(notes),
        tuple(_warnings(params, tokens, num_layers, s)),
        runs_text(s),
    )


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
