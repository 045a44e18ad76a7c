"""Scikit-learn estimators behind the cost models.

* `RelativeNNLSRegressor` — ``y ≈ X · c`` with ``c ≥ lower`` (non-negative, or a physical
  floor per feature), fitted for *relative* error (rows weighted by 1/y, so a 1 ms kernel
  counts as much as a 1 s one) by bounded least squares, with feature selection by
  cross-validated MAPE (the paper "selects those that contribute most"). Passed ``groups``
  (which architecture each row measured), the folds leave one architecture out: a fit is
  judged on models it never saw, as it is used.
* `RingCollectiveRegressor` — ``T = k·(P−1)·(L + β·D/P)`` for one collective on one link,
  fitted by non-negative least squares on the same relative-error weighting.

Both follow the scikit-learn contract: hyper-parameters in ``__init__``, ``fit`` returns
``self``, learned attributes end in ``_``, ``random_state`` is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import lsq_linear
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.model_selection import KFold, LeaveOneGroupOut
from sklearn.utils.validation import check_is_fitted, check_X_y, validate_data

from shardmeter.cost.collectives import ring_factor

FloatArray = npt.NDArray[np.float64]
EXHAUSTIVE_MAX = 10
"""Feature selection tries every subset of up to this many optional features."""
SELECTION_ABS_TOL = 1e-9
"""MAPEs closer than this are equal (exact synthetic data leaves only rounding)."""


def mape(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> float:
    """Mean absolute percentage error as a fraction (0.05 = 5 %)."""
    t = np.asarray(y_true, dtype=np.float64)
    p = np.asarray(y_pred, dtype=np.float64)
    return float(np.mean(np.abs(p - t) / np.abs(t)))


def _nnls_relative(X: FloatArray, y: FloatArray) -> FloatArray:
    """Non-negative least squares minimising Σ((X·c − y)/y)² (`bounded_relative_lsq` with
    zero bounds)."""
    return bounded_relative_lsq(X, y, np.zeros(X.shape[1]))


def bounded_relative_lsq(X: FloatArray, y: FloatArray, lower: FloatArray) -> FloatArray:
    """``c ≥ lower`` minimising Σ((X·c − y)/y)² (bounded-variable least squares). Columns
    are scaled to unit maximum so features spanning 1 … 1e13 stay well conditioned. SciPy's
    BVLS, not ``scipy.optimize.nnls``: SciPy 1.17's C ``nnls`` aborted a torchrun rank here
    ("free(): double free detected in tcache 2") in about one fit in three."""
    scale = np.max(np.abs(X), axis=0)
    scale[scale == 0] = 1.0
    A = X / scale / y[:, None]
    lo = lower * scale
    x = lsq_linear(A, np.ones_like(y), bounds=(lo, np.inf), method="bvls").x
    coef: FloatArray = np.maximum(np.asarray(x, dtype=np.float64), lo) / scale
    return coef


class RelativeNNLSRegressor(RegressorMixin, BaseEstimator):  # type: ignore[misc]
    """Bounded linear regression for relative error with CV forward feature selection.

    Parameters
    ----------
    feature_names: names of X's columns (kept in ``selected_features_``).
    select: ``"cv"`` forward selection by cross-validated MAPE, ``"all"`` use every column.
    cv: folds of the shuffled K-fold used when ``fit`` gets no ``groups`` (capped at the
        number of samples); with ``groups`` each fold leaves one group out.
    tol: the smallest subset whose CV MAPE is within one standard error, and at least this
        fraction, of the best subset's is chosen.
    random_state: seeds the fold shuffle.
    lower_bounds: per column, the least value its coefficient may take (default 0): a
        physical floor such as FLOPs per unit ÷ peak FLOP/s.
    required: columns always in the model (default: those with a positive lower bound —
        work that physically happens is never left out).
    """

    def __init__(
        self,
        feature_names: Sequence[str] | None = None,
        select: str = "cv",
        cv: int = 5,
        tol: float = 0.01,
        random_state: int = 0,
        lower_bounds: Sequence[float] | None = None,
        required: Sequence[str] | None = None,
    ) -> None:
        self.feature_names = feature_names
        self.select = select
        self.cv = cv
        self.tol = tol
        self.random_state = random_state
        self.lower_bounds = lower_bounds
        self.required = required

    def _splits(self, n: int, groups: npt.ArrayLike | None) -> list[tuple[Any, Any]]:
        if groups is not None:
            g = np.asarray(groups)
            if len(np.unique(g)) >= 2:
                return list(LeaveOneGroupOut().split(np.zeros(n), groups=g))
        k = min(self.cv, n)
        if k < 2:
            return []
        return list(
            KFold(n_splits=k, shuffle=True, random_state=self.random_state).split(np.zeros(n))
        )

    def _cv_errors(
        self,
        X: FloatArray,
        y: FloatArray,
        cols: list[int],
        splits: list[tuple[Any, Any]],
        lower: FloatArray,
    ) -> tuple[float, float]:
        """(CV MAPE, its standard error over folds) of the columns ``cols``."""
        if not splits:
            c = bounded_relative_lsq(X[:, cols], y, lower[cols])
            return mape(y, X[:, cols] @ c), 0.0
        ape = np.empty_like(y)
        fold_means = []
        for train, test in splits:
            c = bounded_relative_lsq(X[np.ix_(train, cols)], y[train], lower[cols])
            ape[test] = np.abs(X[np.ix_(test, cols)] @ c - y[test]) / y[test]
            fold_means.append(float(np.mean(ape[test])))
        se = float(np.std(fold_means, ddof=1) / np.sqrt(len(fold_means)))
        return float(np.mean(ape)), se

    def _cv_mape(
        self,
        X: FloatArray,
        y: FloatArray,
        cols: list[int],
        splits: list[tuple[Any, Any]],
        lower: FloatArray,
    ) -> float:
        return self._cv_errors(X, y, cols, splits, lower)[0]

    def _select(
        self,
        X: FloatArray,
        y: FloatArray,
        required: list[int],
        splits: list[tuple[Any, Any]],
        lower: FloatArray,
    ) -> tuple[list[int], float]:
        """The required columns plus a subset of the others: the smallest subset whose CV
        MAPE is within one standard error (over folds) — and at least ``tol`` — of the best
        subset's, ties going to the earlier candidates (the one-standard-error rule: a gain
        inside the noise buys no feature, so repeated runs select the same features). Every subset is tried up to
        `EXHAUSTIVE_MAX` optional columns (greedy forward selection stops early when two
        features only help together), forward selection beyond."""
        optional = [j for j in range(X.shape[1]) if j not in required]
        if len(optional) > EXHAUSTIVE_MAX:
            return self._forward(X, y, required, optional, splits, lower)
        scored: list[tuple[float, float, list[int]]] = []
        for mask in range(1 << len(optional)):
            cols = sorted(required + [j for k, j in enumerate(optional) if mask >> k & 1])
            if cols:
                scored.append((*self._cv_errors(X, y, cols, splits, lower), cols))
        best, best_se, _ = min(scored, key=lambda t: t[0])
        limit = best + max(best_se, self.tol * best) + SELECTION_ABS_TOL
        # Inside the band the scores are indistinguishable: the fewest columns, then the
        # earliest in the candidate order — never the noisy score — decide, so the same
        # subset wins run after run until another one truly leaves the band.
        within = [(len(cols), cols, score) for score, _, cols in scored if score <= limit]
        _, cols, score = min(within)
        return cols, score

    def _forward(
        self,
        X: FloatArray,
        y: FloatArray,
        required: list[int],
        optional: list[int],
        splits: list[tuple[Any, Any]],
        lower: FloatArray,
    ) -> tuple[list[int], float]:
        cols = sorted(required)
        best = self._cv_mape(X, y, cols, splits, lower) if cols else np.inf
        while len(cols) < X.shape[1]:
            score, j = min(
                (self._cv_mape(X, y, sorted([*cols, j]), splits, lower), j)
                for j in optional
                if j not in cols
            )
            if not score < best * (1.0 - self.tol):
                break
            cols = sorted([*cols, j])
            best = score
        return cols, float(best)

    def cross_validated_mape(
        self, X: npt.ArrayLike, y: npt.ArrayLike, groups: npt.ArrayLike | None = None
    ) -> float:
        """MAPE of the fitted feature set (same bounds) refitted on each fold's training
        rows and predicting its held-out rows: leave-one-group-out with ``groups``, else
        shuffled K-fold."""
        check_is_fitted(self, "coef_")
        Xa, ya = check_X_y(X, y, dtype=np.float64, y_numeric=True)
        cols = [j for j in range(len(self.coef_)) if self.support_[j]]
        return self._cv_mape(Xa, ya, cols, self._splits(len(ya), groups), self._lower_)

    def fit(
        self, X: npt.ArrayLike, y: npt.ArrayLike, groups: npt.ArrayLike | None = None
    ) -> RelativeNNLSRegressor:
        Xa, ya = check_X_y(X, y, dtype=np.float64, y_numeric=True)
        if np.any(ya <= 0):
            raise ValueError("targets must be positive durations")
        validate_data(self, Xa, reset=True, skip_check_array=True)
        n_features = Xa.shape[1]
        names = (
            list(self.feature_names)
            if self.feature_names is not None
            else [f"x{j}" for j in range(n_features)]
        )
        if len(names) != n_features:
            raise ValueError(f"feature_names has {len(names)} names for {n_features} columns")
        lower = np.zeros(n_features)
        if self.lower_bounds is not None:
            lower = np.asarray(self.lower_bounds, dtype=np.float64)
            if lower.shape != (n_features,) or not np.all(np.isfinite(lower) & (lower >= 0)):
                raise ValueError(f"lower_bounds must be {n_features} finite values ≥ 0")
        required = (
            [names.index(f) for f in self.required]
            if self.required is not None
            else [j for j in range(n_features) if lower[j] > 0]
        )
        splits = self._splits(len(ya), groups)
        if self.select == "all":
            cols = list(range(n_features))
            best = self._cv_mape(Xa, ya, cols, splits, lower)
        elif self.select == "cv":
            cols, best = self._select(Xa, ya, required, splits, lower)
        else:
            raise ValueError(f"select must be 'cv' or 'all', not {self.select!r}")
        coef = np.zeros(n_features)
        coef[cols] = bounded_relative_lsq(Xa[:, cols], ya, lower[cols])
        self._lower_ = lower
        self.coef_ = coef
        self.support_ = np.isin(np.arange(n_features), cols) & (coef > 0)
        self.selected_features_ = [names[j] for j in range(n_features) if self.support_[j]]
        self.at_lower_bound_ = [
            names[j] for j in cols if lower[j] > 0 and coef[j] <= lower[j] * (1 + 1e-9)
        ]
        self.cv_mape_ = float(best)
        self.train_mape_ = mape(ya, Xa @ coef)
        return self

    def predict(self, X: npt.ArrayLike) -> FloatArray:
        check_is_fitted(self, "coef_")
        Xa = validate_data(self, X, reset=False, dtype=np.float64)
        return np.asarray(Xa @ self.coef_, dtype=np.float64)

    def coefficients(self) -> dict[str, float]:
        """Selected features → seconds per unit (zeros omitted)."""
        check_is_fitted(self, "coef_")
        names = (
            list(self.feature_names)
            if self.feature_names is not None
            else [f"x{j}" for j in range(len(self.coef_))]
        )
        return {n: float(c) for n, c in zip(names, self.coef_, strict=True) if c > 0}


class RingCollectiveRegressor(RegressorMixin, BaseEstimator):  # type: ignore[misc]
    """Fits latency L (s) and inverse bandwidth β (s/byte) of one collective on one link.

    X columns: payload bytes D (the full, unsharded tensor) and ranks P; y: seconds.
    """

    def __init__(self, collective: str = "all_gather") -> None:
        self.collective = collective

    def _design(self, X: FloatArray) -> FloatArray:
        k = ring_factor(self.collective)
        d, p = X[:, 0], X[:, 1]
        return np.column_stack([k * (p - 1), k * (p - 1) * d / p])

    def fit(self, X: npt.ArrayLike, y: npt.ArrayLike) -> RingCollectiveRegressor:
        Xa, ya = check_X_y(X, y, dtype=np.float64, y_numeric=True)
        if Xa.shape[1] != 2:
            raise ValueError("X must have two columns: payload_bytes, ranks")
        if np.any(Xa[:, 1] < 2):
            raise ValueError("collective samples need at least 2 ranks")
        if np.any(ya <= 0):
            raise ValueError("targets must be positive durations")
        validate_data(self, Xa, reset=True, skip_check_array=True)
        coef = _nnls_relative(self._design(Xa), ya)
        self.latency_s_ = float(coef[0])
        self.seconds_per_byte_ = float(coef[1])
        self.mape_ = mape(ya, self.predict(Xa))
        return self

    def predict(self, X: npt.ArrayLike) -> FloatArray:
        check_is_fitted(self, "seconds_per_byte_")
        Xa = validate_data(self, X, reset=False, dtype=np.float64)
        return np.asarray(
            self._design(Xa) @ np.array([self.latency_s_, self.seconds_per_byte_]), dtype=np.float64
        )
