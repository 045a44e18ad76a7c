"""Refit a measured coefficients document from the raw samples it carries, and check it.

    .venv/bin/python benchmarks/bench_refit.py [DOCUMENT.json]

Default: the benchmark Job's first H200 document
(``../shared/calibration/h200-2026-12-04/bench-compute-8-shapes.coefficients.json``). Prints
the fit summary the Job prints (samples, architectures, leave-one-model-out MAPE, the rate
each FLOP coefficient implies), the fit's notes on dropped samples, and per target the
fastest sample the fit kept as a share of the device's peak (no kept sample may exceed 1).
Exit status 0 (a measurement); 2 when the document cannot be read.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.fitting import refit
from shardmeter.cost.floors import executed_flops
from shardmeter.errors import ShardMeterError
from shardmeter.spec.hardware import LINK_PRESETS
from shardmeter_bench.fit import fit_summary, render_summary

_ROOT = Path(__file__).resolve().parents[1]
_NAME = "h200-2026-12-04/bench-compute-8-shapes.coefficients.json"
_CANDIDATES = [base / "shared" / "calibration" / _NAME for base in (_ROOT.parent, _ROOT)]
DEFAULT = next((c for c in _CANDIDATES if c.exists()), _CANDIDATES[0])


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT
    try:
        doc = CoefficientsDocument.read(path)
    except (ShardMeterError, OSError) as exc:
        print(f"bench_refit: error: {exc}", file=sys.stderr)
        return 2
    gpu = doc.gpu
    again = refit(
        doc,
        LINK_PRESETS[gpu.default_intra_node_link],
        LINK_PRESETS[gpu.default_inter_node_link],
    )
    print(f"{path}\nas published:")
    print(render_summary(fit_summary(doc)))
    print("\nrefitted:")
    print(render_summary(fit_summary(again)))
    for note in again.notes:
        if note.startswith("compute"):
            print(f"note: {note}")
    peak = gpu.peak_flop_per_s(doc.precision.value)
    dropped = sum(fit.n_samples for fit in doc.compute.values()) - sum(
        fit.n_samples for fit in again.compute.values()
    )
    fastest: dict[str, float] = defaultdict(float)
    for s in doc.samples.compute:
        rate = executed_flops(s) / s.seconds / peak
        if rate <= 1.0:
            fastest[s.target.value] = max(fastest[s.target.value], rate)
    print(f"\nsamples dropped: {dropped}; fastest kept sample per target ÷ peak:")
    for target, share in sorted(fastest.items()):
        if share > 0:
            print(f"  {target:<20} {share:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
