"""The DiLoCo quality model (`shardmeter.cost.quality`) against its fitting set, in sample and
on what each fit did not see.

    .venv/bin/python benchmarks/bench_quality.py [--file PATH] [--json]

Prints, for every comparison of *Scaling Laws for DiLoCo* (arXiv:2503.09799) Tables 4 and
5/12 — DiLoCo with M replicas against data-parallel at the same N and tokens — the printed
penalty (from the printed losses), the model's, and the residual in percentage points, with
the median, max and RMS |residual| over the 34 fitted points (**in sample**). Then checks on
data a fit did not see, each with the model's own 1σ for the point and the share of errors
inside it (**coverage**; about two thirds is calibrated):

* **leave one size out** — for each of the 9 sizes, fit on the other 8 and predict it; the
  fold's 1σ is the model's with the fold's own out-of-sample residual (its own leave-one-size-
  out over the 8 sizes) and its own size range (the end sizes are extrapolations), without the
  hyperparameters term (these are the paper's own recipe);
* **Independent hyperparameters** — Table 12's runs with the per-M laws' recipe (not fitted),
  against the stored model with its full 1σ (hyperparameters included);
* **fit N ≤ 1.3 B, predict 2.4–10 B** — the paper's own leave-out (size extrapolation);
* **fit M ≤ 4, predict M = 8** — the one islands extrapolation the data allows.

Then the stored constants against a fresh fit (they must agree). ``--file`` (default
``benchmarks/data/diloco-scaling-laws.json``, a copy of ``shared/calibration/
diloco-scaling-laws.json``) is checked against the model's embedded table: every fitted loss
must be the file's. Exit status 0 (a measurement); 2 when the file cannot be read or disagrees
with the embedded table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from shardmeter.cost.quality import (
    FIT_RESIDUAL,
    STORED_FIT,
    OuterSettings,
    QualityFit,
    uncertainty_terms,
)
from shardmeter.cost.quality_fit import (
    POINTS,
    FitPoint,
    fit,
    fit_residual_pct,
    fitting_set,
    sizes,
)
from shardmeter.cost.quality_law import FITTED, QualityConstants, fitted_penalty

DEFAULT_FILE = Path(__file__).parent / "data" / "diloco-scaling-laws.json"
PAPER_RECIPE = ("hyperparameters",)
"""Terms the paper's own runs do not carry (they are its recipe)."""


def check_file(path: Path) -> list[str]:
    """Disagreements between the file's points and the embedded table (empty: none)."""
    doc = json.loads(path.read_text())
    by_id = {p["id"]: p for p in doc["points"]}
    problems = []
    for p in POINTS:
        row = by_id.get(p.id)
        if row is None:
            problems.append(f"{p.id}: not in {path}")
            continue
        if abs(row["value"] - p.loss) > 1e-9 or abs(row["dp_baseline"]["value"] - p.dp_loss) > 1e-9:
            problems.append(
                f"{p.id}: file {row['value']} vs DP {row['dp_baseline']['value']}, "
                f"embedded {p.loss} vs {p.dp_loss}"
            )
        if row["M"] != p.islands or abs(row["model"]["params_nominal"] - p.params) > 1:
            problems.append(f"{p.id}: M or N differ")
    return problems


def sigma_pct(
    p: FitPoint, qfit: QualityFit, leave_out: tuple[str, ...] = (), measured_islands: int = 8
) -> float:
    """The model's 1σ (percentage points) for point ``p`` under ``qfit``."""
    s = OuterSettings(
        p.islands, p.sync_every, streaming=False, max_measured_islands=measured_islands
    )
    terms = uncertainty_terms(p.params, p.tokens, s, qfit)
    return 100 * math.sqrt(sum(v * v for k, v in terms.items() if k not in leave_out))


def row(p: FitPoint, c: QualityConstants, sigma: float | None = None) -> dict[str, Any]:
    model = 100 * fitted_penalty(p.params, p.tokens, p.islands, c)
    out = {
        "id": p.id,
        "N": p.params,
        "M": p.islands,
        "printed_pct": p.penalty_pct,
        "model_pct": model,
        "residual_pp": model - p.penalty_pct,
    }
    if sigma is not None:
        out["sigma_pp"] = sigma
        out["inside_1sigma"] = abs(model - p.penalty_pct) <= sigma
    return out


def summary(table: list[dict[str, Any]]) -> dict[str, float]:
    errors = [abs(r["residual_pp"]) for r in table]
    out = {
        "points": len(errors),
        "median_abs_pp": statistics.median(errors),
        "max_abs_pp": max(errors),
        "rms_pp": (sum(e * e for e in errors) / len(errors)) ** 0.5,
    }
    if table and "inside_1sigma" in table[0]:
        out["inside_1sigma"] = sum(r["inside_1sigma"] for r in table)
        out["coverage"] = out["inside_1sigma"] / len(errors)
    return out


def leave_one_size_out() -> list[dict[str, Any]]:
    """Each size predicted by a fit on the others, with that fold's own calibrated 1σ."""
    data = fitting_set()
    out = []
    for n in sizes(data):
        train = [p for p in data if p.params != n]
        seen = sizes(train)
        qfit = QualityFit(fit(train), fit_residual_pct(train) / 100, (seen[0], seen[-1]))
        for p in data:
            if p.params == n:
                out.append(row(p, qfit.constants, sigma_pct(p, qfit, PAPER_RECIPE)))
    return out


def extrapolation(
    train: list[FitPoint], test: list[FitPoint], islands: int = 8
) -> list[dict[str, Any]]:
    """``test`` predicted by a fit on ``train`` (calibrated on it), with the fold's 1σ."""
    seen = sizes(train)
    qfit = QualityFit(fit(train), fit_residual_pct(train) / 100, (seen[0], seen[-1]))
    return [row(p, qfit.constants, sigma_pct(p, qfit, PAPER_RECIPE, islands)) for p in test]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        problems = check_file(args.file)
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    if problems:
        print("the embedded table disagrees with the file:\n  " + "\n  ".join(problems))
        return 2
    data = fitting_set()
    refit = fit()
    tables = {
        "in sample (Tables 4 and 5/12 Joint, H = 30, D = 20 N):": [row(p, FITTED) for p in data],
        "leave one size out (each size from a fit on the other 8; 1σ of that fold, paper's "
        "recipe):": leave_one_size_out(),
        "not fitted: Table 12 Independent hyperparameters (stored model, full 1σ):": [
            row(p, FITTED, sigma_pct(p, STORED_FIT)) for p in POINTS if not p.fitted
        ],
        "fit on N ≤ 1.3 B, predict the larger sizes (the paper's own leave-out):": extrapolation(
            [p for p in data if p.params <= 1.3e9], [p for p in data if p.params > 1.3e9]
        ),
        "fit on M ≤ 4, predict M = 8 (islands extrapolation; 1σ with 4 measured islands):": (
            extrapolation(
                [p for p in data if p.islands <= 4], [p for p in data if p.islands == 8], 4
            )
        ),
    }
    report = {
        "constants": vars(FITTED),
        "refit": vars(refit),
        "fit_residual_pp": {"stored": 100 * FIT_RESIDUAL, "recomputed": fit_residual_pct()},
        "tables": {k: {"rows": v, "summary": summary(v)} for k, v in tables.items()},
    }
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"fitting set: {args.file} agrees with the embedded table ({len(POINTS)} comparisons)")
    names = ("b", "d", "e", "a", "γ", "y")
    for label, c in (("constants", FITTED), ("refit    ", refit)):
        values = vars(c).values()
        print(
            f"{label}: " + ", ".join(f"{k} = {v:+.5g}" for k, v in zip(names, values, strict=True))
        )
    print(
        f"fit residual (RMS of leave-one-size-out errors): stored {100 * FIT_RESIDUAL:.3f} pp, "
        f"recomputed {fit_residual_pct():.3f} pp"
    )
    for title, table in tables.items():
        print(f"\n{title}")
        sig = "sigma_pp" in table[0]
        print(
            f"{'point':28s} {'N':>7s} {'M':>2s} {'printed %':>10s} {'model %':>8s} {'resid pp':>9s}"
            + (f" {'1σ pp':>6s}" if sig else "")
        )
        for r in table:
            n = f"{r['N'] / 1e9:g}B" if r["N"] >= 1e9 else f"{r['N'] / 1e6:g}M"
            line = (
                f"{r['id']:28s} {n:>7s} {r['M']:>2d} {r['printed_pct']:>+10.3f} "
                f"{r['model_pct']:>+8.3f} {r['residual_pp']:>+9.3f}"
            )
            if sig:
                line += f" {r['sigma_pp']:>6.3f}" + ("" if r["inside_1sigma"] else " out")
            print(line)
        s = summary(table)
        line = (
            f"{s['points']} points: median |residual| {s['median_abs_pp']:.3f} pp, "
            f"max {s['max_abs_pp']:.3f} pp, RMS {s['rms_pp']:.3f} pp"
        )
        if "coverage" in s:
            line += f"; inside 1σ: {s['inside_1sigma']}/{s['points']} ({s['coverage']:.0%})"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
