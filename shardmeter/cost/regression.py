"""Scikit-learn estimators behind the cost models.

* `RelativeNNLSRegressor` — ``y ≈ X · c`` with ``c ≥ 0``, fitted for *relative* error (rows
  weighted by 1/y, so a 1 ms kernel counts as much as a 1 s one), with forward feature
  selection by cross-validated MAPE (the paper "selects those that contribute most").
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
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import GroupKFold, KFold
from sklearn.utils.validation import check_is_fitted, check_X_y, validate_data

FloatArray = npt.NDArray[np.float64]


def mape(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> float:
    """Mean absolute percentage error as a fraction (0.05 = 5 %)."""
    t = np.asarray(y_true, dtype=np.float64)
    p = np.asarray(y_pred, dtype=np.float64)
    return float(np.mean(np.abs(p - t) / np.abs(t)))


def _nnls_relative(X: FloatArray, y: FloatArray) -> FloatArray:
    """Non-negative least squares minimising Σ((X·c − y)/y)². Columns are scaled to unit
    maximum first so features spanning 1 … 1e13 stay well conditioned."""
    scale = np.max(np.abs(X), axis=0)
    scale[scale == 0] = 1.0
    model = LinearRegression(positive=True, fit_intercept=False)
    model.fit(X / scale, y, sample_weight=1.0 / np.square(y))
    coef: FloatArray = np.asarray(model.coef_, dtype=np.float64) / scale
    return coef


class RelativeNNLSRegressor(RegressorMixin, BaseEstimator):  # type: ignore[misc]
    """Non-negative linear regression for relative error with CV forward feature selection.

    Parameters
    ----------
    feature_names: names of X's columns (kept in ``selected_features_``).
    select: ``"cv"`` forward selection by cross-validated MAPE, ``"all"`` use every column.
    cv: folds (capped at the number of samples, or of groups when ``groups`` is passed).
    tol: a feature is added only if it lowers the CV MAPE by more than this fraction of it.
    random_state: seeds the fold shuffle.
    """

    def __init__(
        self,
        feature_names: Sequence[str] | None = None,
        select: str = "cv",
        cv: int = 5,
        tol: float = 0.01,
        random_state: int = 0,
    ) -> None:
        self.feature_names = feature_names
        self.select = select
        self.cv = cv
        self.tol = tol
        self.random_state = random_state

    def _splits(self, n: int, groups: npt.ArrayLike | None) -> list[tuple[Any, Any]]:
        if groups is not None:
            g = np.asarray(groups)
            k = min(self.cv, len(np.unique(g)))
            if k >= 2:
                return list(GroupKFold(n_splits=k).split(np.zeros(n), groups=g))
        k = min(self.cv, n)
        if k < 2:
            return []
        return list(
            KFold(n_splits=k, shuffle=True, random_state=self.random_state).split(np.zeros(n))
        )

    def _cv_mape(
        self, X: FloatArray, y: FloatArray, cols: list[int], splits: list[tuple[Any, Any]]
    ) -> float:
        if not splits:
            c = _nnls_relative(X[:, cols], y)
            return mape(y, X[:, cols] @ c)
        pred = np.empty_like(y)
        for train, test in splits:
            c = _nnls_relative(X[np.ix_(train, cols)], y[train])
            pred[test] = X[np.ix_(test, cols)] @ c
        return mape(y, pred)

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
        splits = self._splits(len(ya), groups)
        if self.select == "all":
            cols = list(range(n_features))
            best = self._cv_mape(Xa, ya, cols, splits)
        elif self.select == "cv":
            cols, best = [], np.inf
            while len(cols) < n_features:
                trials = [
                    (self._cv_mape(Xa, ya, [*cols, j], splits), j)
                    for j in range(n_features)
                    if j not in cols
                ]
                score, j = min(trials)
                if not score < best * (1.0 - self.tol):
                    break
                cols.append(j)
                best = score
            cols.sort()
        else:
            raise ValueError(f"select must be 'cv' or 'all', not {self.select!r}")
        coef = np.zeros(n_features)
        coef[cols] = _nnls_relative(Xa[:, cols], ya)
        self.coef_ = coef
        self.support_ = coef > 0
        self.selected_features_ = [names[j] for j in range(n_features) if coef[j] > 0]
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


def ring_factor(collective: str) -> int:
    """k in T = k·(P−1)·(L + β·D/P): 2 for all_reduce (reduce_scatter + all_gather), else 1."""
    return 2 if collective == "all_reduce" else 1


def ring_seconds(
    collective: str, payload_bytes: float, ranks: int, latency_s: float, seconds_per_byte: float
) -> float:
    """Ring collective time over P ranks for a full payload of D bytes."""
    if ranks <= 1:
        return 0.0
    return (
        ring_factor(collective)
        * (ranks - 1)
        * (latency_s + seconds_per_byte * payload_bytes / ranks)
    )


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
