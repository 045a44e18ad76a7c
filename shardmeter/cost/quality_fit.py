"""The data behind `shardmeter.cost.quality` and the fits and checks that produced its constants.

Only *Scaling Laws for DiLoCo* (Charles, Teston, Dery, Rush, Fallen, Garrett, Szlam,
Douillard, 2025, arXiv:2503.09799) is used: the C4 evaluation losses of its Table 4 (sizes
35 M–2.4 B, swept hyperparameters) and of its Table 5 / Table 12 "Joint" rows (4 B and 10 B,
hyperparameters from the joint-fit laws, which the paper recommends, §6.4), all at H = 30
and the Chinchilla budget D = 20 N of its Table 3. Each DiLoCo loss is compared with the
data-parallel loss of the same row: the relative penalty in percent. Not fitted: the
"Independent" rows of Table 12 (hyperparameters from the per-M laws) — the same runs with a
slightly different recipe, so their gap to the Joint rows measures how much the penalty moves
with the hyperparameters (`hyperparameter_spread_pct`). Comparisons from other papers
(Streaming DiLoCo, Eager updates, DiLoCo, MuLoCo) are held out and appear nowhere here.

The 35 M row prints a 70 M-token budget in Table 3 although the text fixes D = 20 N; its
data-parallel loss (3.485) lies on the paper's own L(N) law (Table 7: 18.129 · N^−0.0953 =
3.46 at 35 M, the 20 N diagonal of every other size), which a model trained on a tenth of
those tokens would not: it is taken at 20 N = 700 M tokens.

`fit` estimates the law's six constants (least squares in percentage points);
`leave_one_size_out` refits without each model size in turn and predicts it — the residual
the model states as its own (`fit_residual_pct`) is the RMS of those out-of-sample errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shardmeter.cost.quality_law import (
    FIT_H,
    FIT_TOKENS_PER_PARAM,
    FITTED,
    QualityConstants,
    fitted_penalty,
    outer_gain,
    replicas_price,
)

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class FitPoint:
    """One DiLoCo run of the paper against its data-parallel baseline."""

    id: str
    ref: str
    """Where in the paper (v1 numbering)."""
    params: float
    """N, as the paper names the size (raw parameter count)."""
    islands: int
    """M, DiLoCo replicas."""
    loss: float
    """C4 eval loss of DiLoCo (nats/token, as printed)."""
    dp_loss: float
    """C4 eval loss of data-parallel at the same N and tokens (as printed)."""
    fitted: bool = True
    """False: shown in the benchmark, not fitted (the Table 12 "Independent" rows)."""

    @property
    def tokens(self) -> float:
        """D = 20 N (Table 3; see the module docstring for the 35 M row)."""
        return FIT_TOKENS_PER_PARAM * self.params

    @property
    def sync_every(self) -> int:
        return FIT_H

    @property
    def penalty_pct(self) -> float:
        """(loss − dp_loss) / dp_loss in percent, from the printed losses."""
        return (self.loss / self.dp_loss - 1.0) * 100.0


def _table4() -> list[FitPoint]:
    """v1 Table 4: DP, then DiLoCo M = 1, 2, 4, 8, per size."""
    rows = {
        35e6: (3.485, 3.482, 3.508, 3.554, 3.621),
        90e6: (3.167, 3.162, 3.182, 3.213, 3.265),
        180e6: (2.950, 2.943, 2.957, 2.981, 3.019),
        335e6: (2.784, 2.777, 2.788, 2.808, 2.841),
        550e6: (2.653, 2.645, 2.657, 2.673, 2.698),
        1.3e9: (2.460, 2.451, 2.464, 2.472, 2.493),
        2.4e9: (2.326, 2.317, 2.323, 2.332, 2.351),
    }
    out = []
    for n, (dp, *diloco) in rows.items():
        name = f"{n / 1e9:g}B" if n >= 1e9 else f"{n / 1e6:g}M"
        for m, loss in zip((1, 2, 4, 8), diloco, strict=True):
            out.append(
                FitPoint(
                    f"SL-T4-{name}-M{m}",
                    f"v1 Table 4 (N={name}, DiLoCo M={m} vs DP)",
                    n,
                    m,
                    loss,
                    dp,
                )
            )
    return out


def _table12() -> list[FitPoint]:
    """v1 Table 5 / Table 12: 4 B and 10 B, DP and DiLoCo M = 1, 2, 4 with hyperparameters from
    the joint-fit laws (fitted) and from the independent ones (not fitted)."""
    rows = {
        4e9: (2.224, {"joint": (2.219, 2.220, 2.230), "independent": (2.229, 2.218, 2.232)}),
        10e9: (2.090, {"joint": (2.086, 2.086, 2.096), "independent": (2.103, 2.083, 2.098)}),
    }
    out = []
    for n, (dp, fits) in rows.items():
        name = f"{n / 1e9:g}B"
        for how, losses in fits.items():
            for m, loss in zip((1, 2, 4), losses, strict=True):
                table = "Table 5 and Table 12" if how == "joint" else "Table 12"
                out.append(
                    FitPoint(
                        f"SL-T12-{name}-M{m}-{how}",
                        f"v1 {table} '{how.capitalize()}' (N={name}, DiLoCo M={m} vs DP)",
                        n,
                        m,
                        loss,
                        dp,
                        fitted=how == "joint",
                    )
                )
    return out


POINTS: tuple[FitPoint, ...] = (*_table4(), *_table12())
"""Every DiLoCo-vs-DP comparison of the paper's tables (34 fitted, 6 shown only)."""


def fitting_set() -> list[FitPoint]:
    return [p for p in POINTS if p.fitted]


def residuals_pct(constants: QualityConstants, points: list[FitPoint]) -> FloatArray:
    """Predicted minus printed penalty, in percentage points."""
    return np.array(
        [
            100.0 * fitted_penalty(p.params, p.tokens, p.islands, constants) - p.penalty_pct
            for p in points
        ]
    )


def _constants(theta: FloatArray) -> QualityConstants:
    """θ in the fit's units (b and a in percentage points) → constants (fractions)."""
    b, d, e, a, g, y = (float(v) for v in theta)
    return QualityConstants(b / 100, d, e, a / 100, g, y)


def fit(points: list[FitPoint] | None = None) -> QualityConstants:
    """Least squares (in percentage points) of the six constants on ``points`` (default:
    `fitting_set`), unfloored (the floor for M ≥ 3 binds only beyond the data)."""
    from scipy.optimize import least_squares

    data = points if points is not None else fitting_set()
    c = FITTED
    start = np.array(
        [
            100 * c.credit,
            c.credit_slope,
            c.credit_curvature,
            100 * c.amplitude,
            c.compute_exponent,
            c.drift_exponent,
        ]
    )
    r = least_squares(lambda t: residuals_pct(_constants(t), data), start, method="lm")
    return _constants(r.x)


def sizes(points: list[FitPoint]) -> list[float]:
    """The model sizes N of ``points``, ascending."""
    return sorted({p.params for p in points})


def leave_one_size_out(points: list[FitPoint] | None = None) -> FloatArray:
    """Each point's penalty (percent) predicted by a fit on the other sizes only."""
    data = points if points is not None else fitting_set()
    out = np.zeros(len(data))
    for n in sizes(data):
        c = fit([p for p in data if p.params != n])
        for i, p in enumerate(data):
            if p.params == n:
                out[i] = 100.0 * fitted_penalty(p.params, p.tokens, p.islands, c)
    return out


def fit_residual_pct(points: list[FitPoint] | None = None) -> float:
    """The RMS of the leave-one-size-out errors (percentage points): the 1σ the model gives a
    run with the paper's recipe."""
    data = points if points is not None else fitting_set()
    errors = leave_one_size_out(data) - np.array([p.penalty_pct for p in data])
    return float(np.sqrt(np.mean(errors**2)))


COVERAGE = 2 / 3
"""The share of out-of-sample errors a calibrated 1σ covers (a normal error's ±1σ: 68 %)."""


def covering_share(errors: FloatArray, fixed: FloatArray, scale: FloatArray) -> float:
    """The least k with |error| ≤ √(fixed² + (k·scale)²) for at least `COVERAGE` of the
    points: the share of ``scale`` a 1σ term needs to cover them."""
    need = np.sqrt(np.maximum(errors**2 - fixed**2, 0.0)) / np.maximum(scale, 1e-12)
    return float(np.sort(need)[math.ceil(COVERAGE * len(need)) - 1])


def _fold(train: list[FitPoint]) -> tuple[QualityConstants, float]:
    """A fold's constants and its own out-of-sample residual (fraction)."""
    return fit(train), fit_residual_pct(train) / 100


def size_per_decade() -> float:
    """The model-size term's share of |b(c)| + R per decade beyond the sizes fitted, calibrated
    on the paper's own leave-out: fit N ≤ 1.3 B, predict 2.4 B, 4 B and 10 B."""
    data = fitting_set()
    train = [p for p in data if p.params <= 1.3e9]
    test = [p for p in data if p.params > 1.3e9]
    c, residual = _fold(train)
    edge = max(p.params for p in train)
    errors = 100 * np.array([fitted_penalty(p.params, p.tokens, p.islands, c) for p in test])
    errors -= np.array([p.penalty_pct for p in test])
    scale = 100 * np.array(
        [
            (
                abs(outer_gain(p.params, p.tokens, c))
                + replicas_price(p.params, p.tokens, p.islands, FIT_H, c)
            )
            * math.log10(p.params / edge)
            for p in test
        ]
    )
    return covering_share(errors, np.full(len(test), 100 * residual), scale)


def islands_per_doubling() -> float:
    """The islands term's share of the replicas' price per doubling beyond the islands fitted,
    calibrated on the one extrapolation the data allows: fit M ≤ 4, predict M = 8."""
    data = fitting_set()
    train = [p for p in data if p.islands <= 4]
    test = [p for p in data if p.islands == 8]
    c, residual = _fold(train)
    errors = 100 * np.array([fitted_penalty(p.params, p.tokens, p.islands, c) for p in test])
    errors -= np.array([p.penalty_pct for p in test])
    scale = 100 * np.array([replicas_price(p.params, p.tokens, 8, FIT_H, c) for p in test])
    return covering_share(errors, np.full(len(test), 100 * residual), scale)


def hyperparameter_spread_pct() -> dict[int, float]:
    """How far the penalty moves with the hyperparameter recipe alone, for one island (key 1)
    and more (key 2): the term that, with the fit residual, covers `COVERAGE` of the stored
    law's errors on Table 12's Independent rows (the same runs as the fitted Joint rows, inner
    learning rate and batch from the per-M laws instead of the joint ones)."""
    shown = [p for p in POINTS if not p.fitted]
    out = {}
    for key in (1, 2):
        rows = [p for p in shown if min(p.islands, 2) == key]
        errors = residuals_pct(FITTED, rows)
        fixed = np.full(len(rows), fit_residual_pct())
        out[key] = covering_share(errors, fixed, np.ones(len(rows)))
    return out
