"""Summarise one run of ``benchmarks/gpu/bench_job_cuda.sh``: the document against the
datasheet priors on unseen models, the fit's checks, the summed-kernel diagnostic and the run
time, with a verdict per check.

    python benchmarks/gpu/summarize_run.py OUT_DIR [--bench-exit N] [--bench-seconds S]
        [--budget-s S]

Reads ``coefficients.json``, ``validation.json`` and ``bench.log`` (JSON log lines) from
OUT_DIR. Checks (issue 34): no kept sample implies more than the device's peak; head.forward
leave-one-model-out error ≤ 15 %; the document predicts the unseen models at least as well as
the priors (median and max, forward and backward); the default run fits in 10 minutes (from the
run's own per-shape times when it was cut or asked for fewer shapes). Exit 0 when every check
passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.floors import executed_flops

DEFAULT_RUN_LIMIT_S = 600.0
HEAD_FORWARD_LOMO_GOAL = 0.15


def _events(log: Path) -> list[dict[str, Any]]:
    out = []
    if not log.exists():
        return out
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def timing(events: list[dict[str, Any]], default_shapes: int) -> tuple[list[str], float | None]:
    """Lines on the run's phases and the default run's estimated seconds (None: no shape ran)."""
    done = [e for e in events if e.get("event") == "shape_done"]
    models = [e for e in events if e.get("event") == "model_validated"]
    lines = []
    if not done:
        return ["no catalog shape finished"], None
    elapsed = [float(e["elapsed_s"]) for e in done]
    per_shape = [b - a for a, b in zip([0.0, *elapsed[:-1]], elapsed, strict=True)]
    validation_s = sum(float(e.get("elapsed_s", 0.0)) for e in models)
    compute_s = elapsed[-1] - validation_s  # interleaved validation counts inside elapsed
    per = max(compute_s, 0.0) / len(done)
    lines.append(
        f"catalog: {len(done)} shapes in {elapsed[-1]:.0f} s (validation models inside it: "
        f"{validation_s:.0f} s); per shape median {statistics.median(per_shape):.1f} s, "
        f"first {per_shape[0]:.1f} s (compiles), max {max(per_shape):.1f} s"
    )
    estimate = per * default_shapes + validation_s
    lines.append(
        f"default run ({default_shapes} shapes + these validation models): ~{estimate:.0f} s "
        f"(goal ≤ {DEFAULT_RUN_LIMIT_S:.0f} s)"
    )
    return lines, estimate


def document_lines(doc: CoefficientsDocument) -> tuple[list[str], dict[str, bool]]:
    lines = [f"document: {doc.source.value} on {doc.gpu.name}, attention {doc.attention_kernel}"]
    lines += [f"  note: {n}" for n in doc.notes if n.startswith("compute")]
    checks: dict[str, bool] = {}
    peak = doc.gpu.peak_flop_per_s(doc.precision.value)
    over = [s for s in doc.samples.compute if executed_flops(s) / s.seconds > peak]
    fitted = sum(f.n_samples for f in doc.compute.values())
    dropped = len(doc.samples.compute) - fitted
    checks["no kept sample above the peak"] = len(over) <= max(dropped, 0)
    lines.append(f"samples above the peak: {len(over)} (dropped by the fit: {max(dropped, 0)})")
    share: dict[str, list[float]] = defaultdict(list)
    for s in doc.samples.compute:
        if s.kernel_seconds:
            share[s.target.value].append(s.kernel_seconds / s.seconds)
    lines.append(f"{'target':<20} {'samples':>7} {'LOMO':>8}  summed kernels ÷ wall (median)")
    for target, fit in doc.compute.items():
        kernel = statistics.median(share[target.value]) if share[target.value] else None
        lines.append(
            f"{target.value:<20} {fit.n_samples:>7} {_pct(fit.leave_one_model_out_mape):>8}  "
            f"{'—' if kernel is None else f'{kernel:.2f}'}"
        )
    head = next((f for t, f in doc.compute.items() if t.value == "head.forward"), None)
    lomo = head.leave_one_model_out_mape if head is not None else None
    checks["head.forward LOMO ≤ 15 %"] = lomo is not None and lomo <= HEAD_FORWARD_LOMO_GOAL
    return lines, checks


def validation_lines(report: dict[str, Any]) -> tuple[list[str], dict[str, bool]]:
    unseen = report.get("unseen")
    if not unseen:
        return ["validation: no unseen model measured"], {"validation ran": False}
    lines = [
        f"unseen models, {len(unseen['points'])} points: document vs datasheet priors",
        f"{'':<10} {'doc median':>10} {'doc max':>8} {'prior median':>12} {'prior max':>9}",
    ]
    checks: dict[str, bool] = {}
    for phase, name in (("fwd", "forward"), ("bwd", "backward")):
        doc_med, doc_max = unseen[f"{phase}_median"], unseen[f"{phase}_max"]
        pri_med, pri_max = unseen.get(f"{phase}_prior_median"), unseen.get(f"{phase}_prior_max")
        lines.append(
            f"{name:<10} {_pct(doc_med):>10} {_pct(doc_max):>8} {_pct(pri_med):>12} "
            f"{_pct(pri_max):>9}"
        )
        if pri_med is not None and pri_max is not None:
            checks[f"document ≤ priors, {name}"] = doc_med <= pri_med and doc_max <= pri_max
    for p in unseen["points"]:
        lines.append(
            f"  {p['model']:<22} {p['micro_batch']}×{p['seq_len']:<6} "
            f"fwd {p['fwd_measured_s'] * 1e3:8.1f} ms doc {100 * p['fwd_signed']:+6.1f} % "
            f"prior {100 * (p['fwd_prior_s'] / p['fwd_measured_s'] - 1):+6.1f} % | "
            f"bwd {p['bwd_measured_s'] * 1e3:8.1f} ms doc {100 * p['bwd_signed']:+6.1f} % "
            f"prior {100 * (p['bwd_prior_s'] / p['bwd_measured_s'] - 1):+6.1f} %"
        )
    if unseen.get("verdict"):
        lines.append(unseen["verdict"])
    return lines, checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--bench-exit", type=int, default=0)
    parser.add_argument("--bench-seconds", type=float, default=0.0)
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--default-shapes", type=int, default=16)
    args = parser.parse_args(argv)
    lines = [f"bench exit {args.bench_exit} after {args.bench_seconds:.0f} s"]
    checks: dict[str, bool] = {"bench finished inside its budget": args.bench_exit == 0}
    more, estimate = timing(_events(args.out / "bench.log"), args.default_shapes)
    lines += more
    checks["default run ≤ 10 min (estimated)"] = (
        estimate is not None and estimate <= DEFAULT_RUN_LIMIT_S
    )
    doc_path = args.out / "coefficients.json"
    if doc_path.exists():
        more, found = document_lines(CoefficientsDocument.read(doc_path))
        lines += more
        checks.update(found)
    else:
        lines.append("no coefficients document (the run did not reach the fit)")
        checks["document written"] = False
    report_path = args.out / "validation.json"
    if report_path.exists():
        more, found = validation_lines(json.loads(report_path.read_text()))
        lines += more
        checks.update(found)
    else:
        checks["validation ran"] = False
    lines.append("")
    lines += [f"{'PASS' if ok else 'FAIL'}  {name}" for name, ok in checks.items()]
    print("\n".join(lines))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
