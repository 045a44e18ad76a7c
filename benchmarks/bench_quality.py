"""The DiLoCo quality model (`shardmeter.cost.quality`) against its fitting set.

    .venv/bin/python benchmarks/bench_quality.py [--file PATH] [--json]

Prints, for every comparison of *Scaling Laws for DiLoCo* (arXiv:2503.09799) Tables 4 and
5/12 — DiLoCo with M replicas against data-parallel at the same N and tokens — the printed
penalty (from the printed losses), the model's, and the residual in percentage points; then the
median and max |residual| over the fitted points. The Table 12 "Independent" rows (not fitted:
the paper recommends its joint-fit hyperparameters) are shown apart. Then two over-fitting
checks: the stored constants against a fresh fit (they must agree), and the paper's own
leave-out — fit on N ≤ 1.3 B, predict 2.4 B, 4 B and 10 B.

``--file`` (default ``benchmarks/data/diloco-scaling-laws.json``, a copy of
``shared/calibration/diloco-scaling-laws.json``) is checked against the model's embedded table:
every fitted loss must be the file's. Exit status 0 (a measurement); 2 when the file cannot be
read or disagrees with the embedded table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from shardmeter.cost.quality import FITTED, QualityConstants, fitted_penalty, loss_penalty
from shardmeter.cost.quality_fit import POINTS, FitPoint, fit, fitting_set

DEFAULT_FILE = Path(__file__).parent / "data" / "diloco-scaling-laws.json"


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


def rows(points: list[FitPoint], c: QualityConstants) -> list[dict[str, Any]]:
    out = []
    for p in points:
        model = 100 * fitted_penalty(p.params, p.tokens, p.islands, c)
        out.append(
            {
                "id": p.id,
                "ref": p.ref,
                "N": p.params,
                "M": p.islands,
                "printed_pct": p.penalty_pct,
                "model_pct": model,
                "floored_pct": 100 * loss_penalty(p.params, p.tokens, p.islands, p.sync_every),
                "residual_pp": model - p.penalty_pct,
            }
        )
    return out


def summary(table: list[dict[str, Any]]) -> dict[str, float]:
    errors = [abs(r["residual_pp"]) for r in table]
    return {
        "points": len(errors),
        "median_abs_pp": statistics.median(errors),
        "max_abs_pp": max(errors),
        "rms_pp": (sum(e * e for e in errors) / len(errors)) ** 0.5,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    fitted = rows(fitting_set(), FITTED)
    shown = rows([p for p in POINTS if not p.fitted], FITTED)
    refit = fit()
    early = [p for p in fitting_set() if p.params <= 1.3e9]
    late = [p for p in fitting_set() if p.params > 1.3e9]
    leave_out = rows(late, fit(early))
    report = {
        "constants": vars(FITTED),
        "refit": vars(refit),
        "fitted": fitted,
        "fitted_summary": summary(fitted),
        "not_fitted": shown,
        "not_fitted_summary": summary(shown),
        "fit_to_1.3B_predict_larger": leave_out,
        "fit_to_1.3B_summary": summary(leave_out),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"fitting set: {args.file} agrees with the embedded table ({len(POINTS)} comparisons)")
    print(
        "constants: b = {offset:+.5f}, a = {amplitude:.5f}, γ = {compute_exponent:.4f}, "
        "x = {islands_exponent:.4f}".format(**vars(FITTED))
    )
    print(
        "refit:     b = {offset:+.5f}, a = {amplitude:.5f}, γ = {compute_exponent:.4f}, "
        "x = {islands_exponent:.4f}".format(**vars(refit))
    )

    def show(title: str, table: list[dict[str, Any]]) -> None:
        print(f"\n{title}")
        print(
            f"{'point':28s} {'N':>7s} {'M':>2s} {'printed %':>10s} {'model %':>8s} {'resid pp':>9s}"
        )
        for r in table:
            n = f"{r['N'] / 1e9:g}B" if r["N"] >= 1e9 else f"{r['N'] / 1e6:g}M"
            print(
                f"{r['id']:28s} {n:>7s} {r['M']:>2d} {r['printed_pct']:>+10.3f} "
                f"{r['model_pct']:>+8.3f} {r['residual_pp']:>+9.3f}"
            )
        s = summary(table)
        print(
            f"{s['points']} points: median |residual| {s['median_abs_pp']:.3f} pp, "
            f"max {s['max_abs_pp']:.3f} pp, RMS {s['rms_pp']:.3f} pp"
        )

    show("fitted (Tables 4 and 5/12 Joint, H = 30, D = 20 N):", fitted)
    show("not fitted (Table 12 Independent hyperparameters):", shown)
    show("fit on N ≤ 1.3 B, predict the larger sizes (the paper's own leave-out):", leave_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
