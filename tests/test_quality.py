"""DiLoCo's quality model (`shardmeter.cost.quality`, `quality_law`, `quality_outer`): it
reproduces the table it was fitted on, its constants and calibrated uncertainty terms are what
the fit and the checks give, every knob it documents moves the penalty the way its mechanism
says (or is documented not to), and outside the fit it behaves as the paper says DiLoCo does."""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmeter.cost.quality import (
    FIT_RESIDUAL,
    HYPERPARAMETER_SPREAD,
    ISLANDS_PER_DOUBLING,
    SIZE_PER_DECADE,
    OuterSettings,
    diloco_quality,
    strategy_quality,
    uncertainty_terms,
)
from shardmeter.cost.quality_fit import (
    POINTS,
    fit,
    fit_residual_pct,
    fitting_set,
    hyperparameter_spread_pct,
    islands_per_doubling,
    leave_one_size_out,
    residuals_pct,
    size_per_decade,
)
from shardmeter.cost.quality_law import (
    ABLATION_MAX_SYNC_EVERY,
    ALPHA_TOKENS,
    FITTED,
    equivalent_token_factor,
    loss_penalty,
    outer_gain,
    replicas_price,
)
from shardmeter.cost.quality_outer import (
    FRAGMENT_UPDATE_ALPHA,
    LAUNCHED_OUTER_LR,
    LAUNCHED_OUTER_MOMENTUM,
    ROW_VALUES,
    gaussian_row,
    overlap_efficiency,
    quantisation_efficiency,
    rounding_error,
)
from shardmeter.spec.precision import Precision
from shardmeter.spec.training import StrategyKind, StrategySpec

REPO = Path(__file__).resolve().parents[1]
SITE = Path(np.__file__).resolve().parents[1]
SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None)
params = st.floats(1e7, 1e12)
tokens_per_param = st.floats(1.0, 2000.0)
islands = st.integers(1, 64)
sync_every = st.integers(1, 10_000)


def test_the_embedded_table_is_the_calibration_file() -> None:
    """The losses the fit uses are the calibration file's (a copy of the shared one)."""
    doc = json.loads((REPO / "benchmarks" / "data" / "diloco-scaling-laws.json").read_text())
    by_id = {p["id"]: p for p in doc["points"]}
    for p in POINTS:
        row = by_id[p.id]
        assert row["value"] == p.loss and row["dp_baseline"]["value"] == p.dp_loss, p.id
        assert row["M"] == p.islands and row["model"]["params_nominal"] == p.params, p.id
        assert row["H"] == p.sync_every == 30
    # every DiLoCo comparison of the file is in the table, none from another source
    diloco = {p["id"] for p in doc["points"] if p["algorithm"] == "diloco"}
    assert diloco == {p.id for p in POINTS}
    assert {by_id[p.id]["source"] for p in POINTS} == {"scaling-laws-diloco"}


def test_the_stored_constants_are_the_fit_and_beat_the_old_law_in_sample() -> None:
    """The six constants are the fit's; in sample the law is no worse than the one it
    replaced (b + a·c^−γ·(M^x − 1): median 0.065, max 0.181, RMS 0.082 pp)."""
    refit = fit()
    for name, value in vars(FITTED).items():
        assert getattr(refit, name) == pytest.approx(value, rel=1e-4), name
    residuals = np.abs(residuals_pct(FITTED, fitting_set()))
    assert len(residuals) == 34
    assert np.median(residuals) < 0.065 and residuals.max() < 0.181
    assert math.sqrt(np.mean(residuals**2)) < 0.082


def test_the_uncertainty_terms_are_their_calibrations() -> None:
    """Each data-calibrated 1σ term is what its check gives (stored rounded up, so the
    points on a term's edge stay inside)."""
    assert fit_residual_pct() == pytest.approx(100 * FIT_RESIDUAL, rel=0.01)
    spread = hyperparameter_spread_pct()
    for key in (1, 2):
        assert spread[key] <= 100 * HYPERPARAMETER_SPREAD[key] <= spread[key] * 1.01
    assert islands_per_doubling() <= ISLANDS_PER_DOUBLING <= islands_per_doubling() * 1.01
    assert size_per_decade() <= SIZE_PER_DECADE <= size_per_decade() * 1.01


def test_leave_one_size_out_errors_are_small_and_the_stated_sigma_covers_them() -> None:
    """On sizes the fit never saw the law errs by < 0.2 pp, and its stated 1σ (the fit term,
    the paper's own recipe) covers about two thirds of those errors."""
    data = fitting_set()
    errors = leave_one_size_out(data) - np.array([p.penalty_pct for p in data])
    assert np.abs(errors).max() < 0.2
    inside = np.mean(np.abs(errors) <= 100 * FIT_RESIDUAL)
    assert 0.6 <= inside <= 0.8


def test_the_papers_headline_numbers() -> None:
    """Table 4: +0.7 / +2.0 / +3.9 % for M = 2 / 4 / 8 at 35 M, +0.26 / +1.1 % for M = 4 / 8
    at 2.4 B; M = 1 ahead of data-parallel, more so at 2.4 B than at 35 M."""
    n = 35e6
    got = [100 * loss_penalty(n, 20 * n, m, 30) for m in (2, 4, 8)]
    assert got == pytest.approx([0.7, 2.0, 3.9], abs=0.15)
    n = 2.4e9
    assert 100 * loss_penalty(n, 20 * n, 4, 30) == pytest.approx(0.26, abs=0.15)
    assert 100 * loss_penalty(n, 20 * n, 8, 30) == pytest.approx(1.1, abs=0.15)
    assert 100 * loss_penalty(n, 20 * n, 1, 30) < 100 * loss_penalty(35e6, 7e8, 1, 30) < 0


def test_one_island_follows_the_data_not_a_constant() -> None:
    """M = 1 (Tables 4, 5): −0.1 % at 35 M widening to −0.4 % at 2.4 B, −0.2 % at 4–10 B."""
    got = {n: 100 * loss_penalty(n, 20 * n, 1, 30) for n in (35e6, 550e6, 2.4e9, 10e9)}
    assert got[35e6] == pytest.approx(-0.09, abs=0.05)
    assert got[2.4e9] == pytest.approx(-0.39, abs=0.08)
    assert got[10e9] == pytest.approx(-0.19, abs=0.1)
    assert got[550e6] < got[35e6] and got[2.4e9] < got[10e9]


@SETTINGS
@given(params, tokens_per_param, st.integers(1, 63), sync_every)
def test_more_islands_cost_more(n: float, tpp: float, m: int, h: int) -> None:
    assert loss_penalty(n, tpp * n, m + 1, h) >= loss_penalty(n, tpp * n, m, h)


@SETTINGS
@given(params, tokens_per_param, st.integers(2, 64), sync_every, st.floats(1.01, 100.0))
def test_the_replicas_price_falls_with_size_and_tokens(
    n: float, tpp: float, m: int, h: int, grow: float
) -> None:
    """The price of M ≥ 2 replicas shrinks with model size and with tokens per parameter; the
    outer optimizer's gain b(c) is ≤ 0 everywhere (it narrows again past ~2 B, as measured)."""
    here = replicas_price(n, tpp * n, m, h)
    assert replicas_price(n * grow, tpp * n * grow, m, h) < here
    assert replicas_price(n, tpp * grow * n, m, h) < here
    assert outer_gain(n, tpp * n) <= 0


@SETTINGS
@given(params, tokens_per_param, st.integers(2, 64), st.integers(2, 5000), st.integers(1, 5000))
def test_a_longer_sync_costs_more_and_h1_is_worst(
    n: float, tpp: float, m: int, h: int, more: int
) -> None:
    d = tpp * n
    assert loss_penalty(n, d, m, h + more) >= loss_penalty(n, d, m, h)
    if h <= ABLATION_MAX_SYNC_EVERY:  # H = 1 is the worst of the paper's ablation range
        assert loss_penalty(n, d, m, 1) >= loss_penalty(n, d, m, h)


def test_the_h_slope_is_the_drift_exponent_at_the_fit_and_logarithmic_above() -> None:
    """(H/30)^y below H = 30, 1 + y·ln(H/30) above: the price's slope in ln H at 30 is y."""
    n, m, y = 1e9, 4, FITTED.drift_exponent
    r30 = replicas_price(n, 20 * n, m, 30)
    assert replicas_price(n, 20 * n, m, 10) == pytest.approx(r30 * (1 / 3) ** y)
    assert replicas_price(n, 20 * n, m, 300) == pytest.approx(r30 * (1 + y * math.log(10)))


@SETTINGS
@given(params, tokens_per_param, st.integers(3, 64), sync_every)
def test_never_ahead_of_data_parallel_where_the_paper_never_measured_it(
    n: float, tpp: float, m: int, h: int
) -> None:
    """M ≥ 3: the paper measured M = 4 and 8 behind data-parallel at every size (to 10 B)."""
    assert loss_penalty(n, tpp * n, m, h) >= 0
    assert equivalent_token_factor(n, tpp * n, m, h) >= 1 - 1e-9


def test_two_islands_are_ahead_only_at_billions() -> None:
    """M = 2 (Tables 4, 5): behind data-parallel up to 1.3 B (the law: to 1 B), ahead from
    2.4 B."""
    for n in (35e6, 90e6, 180e6, 335e6, 550e6, 1e9):
        assert equivalent_token_factor(n, 20 * n, 2, 30) > 1, n
    for n in (2.4e9, 4e9, 10e9, 70e9):
        assert equivalent_token_factor(n, 20 * n, 2, 30) < 1, n


@SETTINGS
@given(params, tokens_per_param, islands, sync_every)
def test_the_factor_buys_back_the_penalty(n: float, tpp: float, m: int, h: int) -> None:
    """With f× the tokens DiLoCo reaches data-parallel's loss at the original tokens:
    (1 + p(N, f·D)) · f^α_D = 1 (the loss-vs-tokens law of the module docstring)."""
    d = tpp * n
    f = equivalent_token_factor(n, d, m, h)
    assert (1 + loss_penalty(n, f * d, m, h)) * f**ALPHA_TOKENS == pytest.approx(1, abs=1e-9)
    assert (f > 1) == (loss_penalty(n, d, m, h) > 0) or loss_penalty(n, d, m, h) == 0


# ---- the outer level's knobs ----------------------------------------------------------------
def test_torchft_drops_the_overlapped_steps_so_the_delay_costs_tokens() -> None:
    """τ of every H inner steps never reach the global model (α = 0): priced as DiLoCo on
    (1 − τ/H) of the tokens against data-parallel on all of them."""
    n, d, m, h = 1e9, 20e9, 4, 100
    assert overlap_efficiency(h, 5) == 0.95 and overlap_efficiency(h, 0) == 1.0
    base = loss_penalty(n, d, m, h)
    for tau in (1, 5, 20):
        e = 1 - tau / h
        want = (1 + loss_penalty(n, e * d, m, h)) * e**ALPHA_TOKENS - 1
        assert loss_penalty(n, d, m, h, fragment_sync_delay=tau) == pytest.approx(want)
        assert loss_penalty(n, d, m, h, fragment_sync_delay=tau) > base
    # about 0.05 × 4.8 % = 0.24 pp for τ = 5 at H = 100, more at H = 30 (a larger share)
    extra = loss_penalty(n, d, m, h, fragment_sync_delay=5) - base
    assert 0.002 < extra < 0.004
    assert loss_penalty(n, d, m, 30, fragment_sync_delay=5) - loss_penalty(n, d, m, 30) > extra
    with pytest.raises(ValueError, match="fragment_sync_delay"):
        loss_penalty(n, d, m, h, fragment_sync_delay=h)


def test_the_outer_precision_costs_what_its_rounding_noise_does() -> None:
    """Twice-rounded pseudo-gradients: fp32 exact, bf16 and int8 and fp8 negligible (< 0.01
    pp), fp4 about a tenth of a point; fewer bits never cost less."""
    n, d, m, h = 1e9, 20e9, 4, 100
    assert rounding_error(Precision.FP32) == 0
    assert rounding_error(Precision.FP8) == pytest.approx(0.026, abs=0.002)  # 3 mantissa bits
    assert rounding_error(Precision.FP4) == pytest.approx(0.12, abs=0.01)  # 1 mantissa bit
    extra = {
        p: loss_penalty(n, d, m, h, outer_precision=p) - loss_penalty(n, d, m, h) for p in Precision
    }
    assert extra[Precision.FP32] == 0
    assert 0 < extra[Precision.BF16] < extra[Precision.INT8] < extra[Precision.FP8] < 1e-4
    assert 0.0008 < extra[Precision.FP4] < 0.002


def test_the_rounding_error_is_what_torchs_own_casts_leave() -> None:
    """ε against torch's casts, not our float grid: bf16 unscaled, fp8 E4M3 (torchft's format
    on sm90) and int8 (its fallback; a float→int cast truncates) on the row scaled to the
    format's maximum as torchft scales it. fp4 has no unpacked torch dtype to cast to."""
    import torch

    row = torch.tensor(gaussian_row(ROW_VALUES), dtype=torch.float64)
    top = row.abs().max()

    def left(x: torch.Tensor, dtype: torch.dtype) -> float:
        q = x.float().to(dtype).double()
        return math.sqrt(float(((q - x) ** 2).sum() / (x * x).sum()))

    assert rounding_error(Precision.BF16) == pytest.approx(left(row, torch.bfloat16), rel=1e-9)
    fp8 = left(row * 448 / top, torch.float8_e4m3fn)
    assert rounding_error(Precision.FP8) == pytest.approx(fp8, rel=1e-9)
    assert rounding_error(Precision.INT8) == pytest.approx(
        left(row * 127 / top, torch.int8), rel=1e-9
    )
    assert quantisation_efficiency(Precision.FP4) < quantisation_efficiency(Precision.FP8) < 1


def test_every_documented_knob_moves_the_penalty_or_is_documented_not_to() -> None:
    """Islands, syncEvery, fragmentSyncDelay and outerPrecision move the penalty; fragments
    do not (torchft syncs every fragment every H steps), and the docs say so."""
    n, d = 1e9, 20e9
    base = OuterSettings(4, 100, fragments=4, fragment_sync_delay=2)

    def penalty(**kw: Any) -> float:
        return diloco_quality(n, d, 24, replace(base, **kw)).loss_penalty_vs_dp

    p = penalty()
    assert penalty(islands=8) > p and penalty(sync_every=200) > p
    assert penalty(fragment_sync_delay=4) > p
    assert penalty(outer_precision=Precision.FP4) > p
    assert penalty(fragments=2) == p == penalty(fragments=5, sync_every=100)
    docs = (REPO / "shardmeter" / "cost" / "quality_outer.py").read_text()
    assert "**Fragments** F do not move the penalty" in docs


def test_a_delay_no_step_survives_is_refused() -> None:
    with pytest.raises(ValueError, match="fragment_sync_delay 100"):
        diloco_quality(1e9, 2e10, 24, OuterSettings(4, 100, fragment_sync_delay=100))


def test_mechanism_terms_count_their_whole_effect() -> None:
    n, d = 1e9, 20e9
    s = OuterSettings(4, 100, fragments=4, fragment_sync_delay=5, outer_precision=Precision.FP4)
    terms = uncertainty_terms(n, d, s)
    p = loss_penalty(n, d, 4, 100, fragment_sync_delay=5, outer_precision=Precision.FP4)
    no_tau = loss_penalty(n, d, 4, 100, outer_precision=Precision.FP4)
    no_q = loss_penalty(n, d, 4, 100, fragment_sync_delay=5)
    assert terms["overlap"] == pytest.approx(p - no_tau)
    assert terms["outerPrecision"] == pytest.approx(p - no_q)
    at30 = loss_penalty(n, d, 4, 30, outer_precision=Precision.FP4)
    assert terms["syncEvery"] == pytest.approx(no_tau - at30)
    assert terms["hyperparameters"] == HYPERPARAMETER_SPREAD[2]


# ---- one island: what runs and what it is priced as -----------------------------------------
def test_one_island_runs_the_outer_step_torchtitan_builds_and_is_priced_as_m1() -> None:
    """torchtitan 0.3.0 builds torchft's DiLoCo with SGD(lr 0.7, momentum 0.9, Nesterov) for
    any group size and α = 0 by default — what `quality_outer` states — so a one-island
    DiLoCo plan runs DiLoCo's outer step and is priced as the paper's M = 1, with the
    recipe's whole spread as its uncertainty."""
    manager = (SITE / "torchtitan" / "experiments" / "torchft" / "manager.py").read_text()
    call = re.search(r"torch\.optim\.SGD\(\s*params,([^)]*)\)", manager)
    assert call is not None
    expr = ast.parse(f"f({call.group(1)})", mode="eval").body
    assert isinstance(expr, ast.Call)
    kw = {k.arg: ast.literal_eval(k.value) for k in expr.keywords}
    assert kw == {"lr": LAUNCHED_OUTER_LR, "momentum": LAUNCHED_OUTER_MOMENTUM, "nesterov": True}
    assert "group_size" not in manager[manager.index("def maybe_semi_sync_training") :]
    config = SITE / "torchtitan" / "experiments" / "torchft" / "config" / "job_config.py"
    assert f"fragment_update_alpha: float = {FRAGMENT_UPDATE_ALPHA}" in config.read_text()
    n = 8e9
    q = strategy_quality(n, 20 * n, 32, StrategySpec(kind=StrategyKind.DILOCO), 1, 10)
    assert (
        q.loss_penalty_vs_dp == pytest.approx(loss_penalty(n, 20 * n, 1, 10))
        and q.loss_penalty_vs_dp < 0
    )
    assert "one island running torchft's DiLoCo outer step" in q.runs and "M = 1" in q.runs
    assert q.loss_penalty_uncertainty > HYPERPARAMETER_SPREAD[1] > abs(q.loss_penalty_vs_dp)
    lo, hi = q.equivalent_token_factor_range
    assert lo < q.equivalent_token_factor < 1 < hi


def test_extrapolation_is_warned_and_widens_the_uncertainty() -> None:
    n, d = 8e9, 160e9
    inside = diloco_quality(n, d, 32, OuterSettings(8, 30))
    outside = diloco_quality(n, d, 32, OuterSettings(16, 30))
    assert inside.warnings == ()
    assert any("16 islands" in w for w in outside.warnings)
    assert outside.loss_penalty_uncertainty > inside.loss_penalty_uncertainty
    lo, hi = outside.equivalent_token_factor_range
    assert lo < outside.equivalent_token_factor < hi
    # an H the paper never printed numbers for is less certain than its H = 30
    assert (
        diloco_quality(n, d, 32, OuterSettings(4, 300)).loss_penalty_uncertainty
        > diloco_quality(n, d, 32, OuterSettings(4, 30)).loss_penalty_uncertainty
    )
    big = diloco_quality(70e9, 1.4e12, 80, OuterSettings(4, 30))
    assert "model size" in big.basis and any("70 B" in w for w in big.warnings)
    assert "arXiv:2503.09799" in inside.basis and "H = 30" in inside.basis


def test_streaming_settings_beyond_the_guard_rails_are_warned() -> None:
    n, d = 1e9, 20e9
    ok = diloco_quality(n, d, 24, OuterSettings(4, 100, fragments=10, fragment_sync_delay=5))
    assert ok.warnings == ()
    stale = diloco_quality(n, d, 24, OuterSettings(4, 100, fragments=4, fragment_sync_delay=10))
    assert any("fragmentSyncDelay 10" in w and "drops" in w for w in stale.warnings)
    coarse = diloco_quality(n, d, 24, OuterSettings(4, 100, fragments=2))
    assert any("blocks" in w for w in coarse.warnings)
    blocking = diloco_quality(n, d, 24, OuterSettings(4, 100, streaming=False))
    assert blocking.warnings == ()  # plain DiLoCo is what the paper trained
