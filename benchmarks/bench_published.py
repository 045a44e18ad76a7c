"""Predicted vs published GPU-cluster training throughput, from datasheet priors.

    .venv/bin/python benchmarks/bench_published.py [--file PATH ...] [--ablate] [--loso] [--json]
        [--no-setups]

Default files: ``../shared/calibration/published-throughput.json`` (the calibration set:
torchtitan A100 Llama and llm-foundry MPT A100/H100 runs) and
``benchmarks/data/published-validation.json`` (held-out: torchtitan H100/H200, torchao float8,
IBM fms-fsdp, llm-foundry's 2023 sequence sweeps and 2024 tables). The calibration file gets
the setup facts it does not record from ``benchmarks/data/calibration-setups.json`` (each with
its source; ``--no-setups`` reads it as it stands). For each file: one row per point — id, setup,
published and predicted tokens/s per GPU, their ratio, the bottleneck, predicted vs published
MFU — then the median and max |error| (goal: ≤ 10 % and ≤ 25 %) and the bias, the median
signed error (goal: within ±5 %), overall, per GPU and per group (one publication's table:
a point's ``group``; no group may be biased by more than ±10 %). Points the model cannot
express are listed with the reason and left out of the figures.

``--ablate`` turns each modelling mechanism off in turn and prints every point's ratio
without it (the mechanism's contribution per point). ``--loso`` is the over-fitting check:
for each source, a throughput factor per GPU fitted on all *other* sources (what a fudge
factor would do) against the unfitted model on that source.

Exit status 0 whether or not the goals are met (this is a measurement); 2 when a file cannot
be read.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from shardmeter.calibration import (
    Prediction,
    Report,
    Summary,
    apply_setups,
    evaluate,
    load_document,
)
from shardmeter.cost.host import HostSeconds
from shardmeter.cost.model import CostModel
from shardmeter.errors import ShardMeterError

_ROOT = Path(__file__).resolve().parents[1]


def _main_checkout() -> Path:
    """The main checkout a git worktree belongs to (its common .git directory's parent), so a
    worktree outside the checkout's directory finds ``shared/`` beside the main checkout."""
    git = _ROOT / ".git"
    if git.is_file():  # a worktree: "gitdir: <main>/.git/worktrees/<name>"
        text = git.read_text(encoding="utf-8").strip()
        if text.startswith("gitdir:"):
            return Path(text.split(":", 1)[1].strip()).resolve().parents[2]
    return _ROOT


_CANDIDATES = [
    base / "shared" / "calibration" / "published-throughput.json"
    # checkout beside shared/, a worktree inside the checkout, or a worktree elsewhere
    for base in (_ROOT.parent, _ROOT.parent.parent, _main_checkout().parent)
]
CALIBRATION_FILE = next((c for c in _CANDIDATES if c.exists()), _CANDIDATES[0])
VALIDATION_FILE = _ROOT / "benchmarks" / "data" / "published-validation.json"
SETUPS_FILE = _ROOT / "benchmarks" / "data" / "calibration-setups.json"
"""Setup facts the shared calibration file does not record (with sources), added to it."""
MEDIAN_GOAL, MAX_GOAL, BIAS_GOAL = 0.10, 0.25, 0.05
GROUP_BIAS_GOAL = 0.10
"""No group (one publication's table) biased by more than this."""

Document = dict[str, Any]


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None or math.isnan(x):
        return "—"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


# ---- mechanisms, each turned off by rewriting the points (or, for one, the cost model) ------
def _with_gpu(point: Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    gpu = point.get("gpu")
    base = dict(gpu) if isinstance(gpu, Mapping) else {"preset": gpu}
    return {**point, "gpu": {**base, **overrides}}


@contextmanager
def _no_patch() -> Iterator[None]:
    yield


@contextmanager
def _contention_by_time() -> Iterator[None]:
    with mock.patch.object(CostModel, "contention_scale", lambda self, nodes, gpn: 1.0):
        yield


@contextmanager
def _no_host_overhead() -> Iterator[None]:
    idle = HostSeconds(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    with mock.patch("shardmeter.cost.model.unit_host_seconds", lambda *_a, **_k: idle):
        yield


@contextmanager
def _attention_at_head_dim_128() -> Iterator[None]:
    with mock.patch("shardmeter.cost.attention.head_dim_ratio", lambda *_a: (1.0, 1.0)):
        yield


@contextmanager
def _attention_at_every_length() -> Iterator[None]:
    with mock.patch("shardmeter.cost.attention.sequence_ratio", lambda *_a: 1.0):
        yield


Ablation = tuple[str, Callable[[Mapping[str, Any]], dict[str, Any]], Callable[[], Any]]
ABLATIONS: list[Ablation] = [
    (
        "sustained clock",
        lambda p: _with_gpu(
            p, matmul_efficiency_duty_cycle=1.0, fp8_matmul_efficiency_duty_cycle=1.0
        ),
        _no_patch,
    ),
    ("GEMM waves", lambda p: _with_gpu(p, sm_count=None), _no_patch),
    ("comm contention by bytes", dict, _contention_by_time),
    ("loss outside compile", lambda p: {**p, "torch_compile_loss": True}, _no_patch),
    ("attention kernel as run", lambda p: {**p, "attention_kernel": "flash2"}, _no_patch),
    ("host overhead", dict, _no_host_overhead),
    ("attention head-dim law", dict, _attention_at_head_dim_128),
    ("attention sequence ramp", dict, _attention_at_every_length),
]
"""(name, point rewrite that turns the mechanism off, context that turns it off in code)."""


def ablated(document: Document, ablation: Ablation) -> Report:
    _, rewrite, context = ablation
    points = [rewrite(p) if isinstance(p, Mapping) else p for p in document.get("points", [])]
    with context():
        return evaluate({**document, "points": points})


# ---- rendering ---------------------------------------------------------------------------------
def _summary_line(label: str, s: Summary) -> str:
    return (
        f"{label:<34} n={s.n:<3} median |error| {_pct(s.median_error):>6}  "
        f"max {_pct(s.max_error):>6}  bias {_pct(s.bias, signed=True):>7}"
    )


def _goals(overall: Summary, groups: Mapping[str, Summary]) -> tuple[bool, float]:
    """Whether a file meets every goal, and its worst group's |bias|."""
    worst = max((abs(s.bias) for s in groups.values()), default=0.0)
    met = (
        overall.median_error <= MEDIAN_GOAL
        and overall.max_error <= MAX_GOAL
        and abs(overall.bias) <= BIAS_GOAL
        and worst <= GROUP_BIAS_GOAL
    )
    return met, worst


def render(report: Report, path: str) -> str:
    head = (
        f"{'id':<44} {'setup':<64} {'published':>9} {'predicted':>9} {'ratio':>6} "
        f"{'bottleneck':<14} {'MFU pred':>8} {'MFU pub':>8}"
    )
    lines = [f"{path} — predictions from datasheet priors", head, "-" * len(head)]
    for p in report.predictions:
        fit = "" if p.fits_in_memory else "  (predicted not to fit in memory)"
        lines.append(
            f"{p.id:<44} {p.setup[:64]:<64} {p.published_tokens_per_s_per_gpu:>9.0f} "
            f"{p.predicted_tokens_per_s_per_gpu:>9.0f} {p.ratio:>6.2f} {p.bottleneck[:14]:<14} "
            f"{_pct(p.predicted_mfu):>8} {_pct(p.published_mfu):>8}{fit}"
        )
    for s in report.skipped:
        lines.append(f"{s.id:<44} not predicted: {s.reason}")
    if report.predictions:
        overall = Summary.of(report.predictions)
        groups = report.by(lambda p: p.source)
        met, worst = _goals(overall, groups)
        lines += [
            "",
            f"{len(report.predictions)} points predicted, {len(report.skipped)} skipped; goals: "
            f"median ≤ {_pct(MEDIAN_GOAL)}, max ≤ {_pct(MAX_GOAL)}, |bias| ≤ {_pct(BIAS_GOAL)}, "
            f"every group's |bias| ≤ {_pct(GROUP_BIAS_GOAL)} (worst {_pct(worst)}) — "
            + ("goals met" if met else "goals NOT met"),
            _summary_line("all", overall),
        ]
        for gpu, s in report.by(lambda p: p.gpu_family).items():
            lines.append(_summary_line(f"  GPU {gpu}", s))
        for group, s in groups.items():
            lines.append(_summary_line(f"  group {group}", s))
    return "\n".join(lines)


def render_ablations(document: Document, report: Report) -> str:
    ratios = {p.id: p.ratio for p in report.predictions}
    off = [(a[0], {p.id: p.ratio for p in ablated(document, a).predictions}) for a in ABLATIONS]
    names = [n for n, _ in off]
    head = f"{'id':<44} {'model':>6} " + " ".join(f"{'−' + n:>26}" for n in names)
    lines = ["mechanism contributions: ratio with every mechanism, and without each one", head]
    for pid, ratio in ratios.items():
        cells = " ".join(f"{r[pid]:>20.3f} ({100 * (ratio / r[pid] - 1):+5.1f}%)" for _, r in off)
        lines.append(f"{pid:<44} {ratio:>6.3f} {cells}")
    for name, r in off:
        preds = [_with_ratio(p, r[p.id]) for p in report.predictions]
        lines.append(_summary_line(f"without {name}", Summary.of(preds)))
    lines += ["", "median effect of each mechanism per group (ratio with ÷ without − 1)"]
    lines.append(f"{'group':<30} " + " ".join(f"{n[:24]:>24}" for n in names))
    for group, effects in group_effects(report, off).items():
        lines.append(f"{group:<30} " + " ".join(f"{_pct(e, True):>24}" for e in effects))
    return "\n".join(lines)


def group_effects(
    report: Report, off: list[tuple[str, dict[str, float]]]
) -> dict[str, list[float]]:
    """Per group (one publication's table), each mechanism's median effect on the predicted
    ÷ published ratio: what the mechanism does to that group's points."""
    out: dict[str, list[float]] = {}
    for group, _ in report.by(lambda p: p.source).items():
        points = [p for p in report.predictions if p.source == group]
        out[group] = [statistics.median(p.ratio / r[p.id] - 1 for p in points) for _, r in off]
    return out


def _with_ratio(p: Prediction, ratio: float) -> Prediction:
    from dataclasses import replace

    return replace(p, predicted_tokens_per_s_per_gpu=ratio * p.published_tokens_per_s_per_gpu)


def render_loso(reports: dict[str, Report]) -> str:
    """For each source: a per-GPU throughput factor fitted on every other source (the median
    published ÷ predicted there), applied to this source; against the unfitted model."""
    everything = [p for r in reports.values() for p in r.predictions]
    sources = sorted({p.source for p in everything})
    lines = [
        "leave-one-source-out: a per-GPU factor fitted without the source vs the unfitted model",
        f"{'source':<28} {'n':>3} {'unfitted median/bias':>22} {'LOSO-fitted median/bias':>25}",
    ]
    for source in sources:
        held = [p for p in everything if p.source == source]
        rest = [p for p in everything if p.source != source]
        fitted = []
        for p in held:
            same = [1 / q.ratio for q in rest if q.gpu_family == p.gpu_family] or [
                1 / q.ratio for q in rest
            ]
            fitted.append(_with_ratio(p, p.ratio * statistics.median(same)))
        a, b = Summary.of(held), Summary.of(fitted)
        lines.append(
            f"{source:<28} {a.n:>3} {_pct(a.median_error):>10} / {_pct(a.bias, True):>8} "
            f"{_pct(b.median_error):>13} / {_pct(b.bias, True):>8}"
        )
    return "\n".join(lines)


def _md_summary(label: str, s: Summary) -> str:
    return (
        f"| {label} | {s.n} | {_pct(s.median_error)} | {_pct(s.max_error)} | "
        f"{_pct(s.bias, signed=True)} |"
    )


def render_markdown(
    reports: dict[str, Report], documents: dict[str, Document], setups: bool
) -> str:
    """The figures as a Markdown page (``--markdown``): deterministic arithmetic, no machine
    line, so the checked-in page changes only when the model or the data does."""
    out = [
        "# Published runs predicted from datasheet priors",
        "",
        "Generated by `python benchmarks/bench_published.py --markdown docs/accuracy-tables.md`"
        + ("" if setups else " --no-setups")
        + ";",
        "do not edit by hand (a test regenerates it and compares). How to read it, and what each",
        "mechanism rests on: [accuracy.md](accuracy.md).",
        "",
        f"Goals per file: median |error| ≤ {_pct(MEDIAN_GOAL)}, max ≤ {_pct(MAX_GOAL)}, "
        f"|bias| ≤ {_pct(BIAS_GOAL)} (bias: median signed error, + = optimistic), every "
        f"group's |bias| ≤ {_pct(GROUP_BIAS_GOAL)}.",
    ]
    for path, report in reports.items():
        name = Path(path).name
        groups = report.by(lambda p: p.source)
        overall = Summary.of(report.predictions)
        met, worst = _goals(overall, groups)
        out += [
            "",
            f"## {name}",
            "",
            f"{len(report.predictions)} points predicted, {len(report.skipped)} not expressible; "
            + ("goals met." if met else f"goals **not met** (worst group bias {_pct(worst)})."),
            "",
            "| | points | median \\|error\\| | max \\|error\\| | bias |",
            "| --- | ---: | ---: | ---: | ---: |",
            _md_summary("all", overall),
            *(_md_summary(f"GPU {g}", s) for g, s in report.by(lambda p: p.gpu_family).items()),
            *(_md_summary(f"group {g}", s) for g, s in groups.items()),
            "",
            "| id | setup | published | predicted | ratio | MFU predicted / published |",
            "| --- | --- | ---: | ---: | ---: | --- |",
        ]
        for p in report.predictions:
            fit = "" if p.fits_in_memory else " (predicted not to fit in memory)"
            out.append(
                f"| {p.id} | {p.setup}{fit} | {p.published_tokens_per_s_per_gpu:,.0f} | "
                f"{p.predicted_tokens_per_s_per_gpu:,.0f} | {p.ratio:.2f} | "
                f"{_pct(p.predicted_mfu)} / {_pct(p.published_mfu)} |"
            )
        if report.skipped:
            out += ["", "Not expressible:", ""]
            out += [f"* {s.id}: {s.reason}" for s in report.skipped]
        out += [
            "",
            "Without each mechanism (`--ablate`):",
            "",
            "| mechanism turned off | points | median \\|error\\| | max \\|error\\| | bias |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        off = []
        for ablation in ABLATIONS:
            ratios = {p.id: p.ratio for p in ablated(documents[path], ablation).predictions}
            off.append((ablation[0], ratios))
            preds = [_with_ratio(p, ratios[p.id]) for p in report.predictions]
            out.append(_md_summary(ablation[0], Summary.of(preds)))
        out += [
            "",
            "Median effect of each mechanism per group (predicted ÷ published with it, ÷ "
            "without it, − 1; 0 where it does not act):",
            "",
            "| group | " + " | ".join(n for n, _ in off) + " |",
            "| --- |" + " ---: |" * len(off),
        ]
        for group, effects in group_effects(report, off).items():
            out.append(f"| {group} | " + " | ".join(_pct(e, True) for e in effects) + " |")
    return "\n".join(out) + "\n"


def _payload(path: str, report: Report) -> dict[str, Any]:
    def stats(s: Summary) -> dict[str, float | int]:
        return {"n": s.n, "median_error": s.median_error, "max_error": s.max_error, "bias": s.bias}

    return {
        "file": path,
        **stats(Summary.of(report.predictions)),
        "by_gpu": {k: stats(v) for k, v in report.by(lambda p: p.gpu_family).items()},
        "by_source": {k: stats(v) for k, v in report.by(lambda p: p.source).items()},
        "points": [
            {
                "id": p.id,
                "setup": p.setup,
                "gpu": p.gpu_family,
                "source": p.source,
                "published": p.published_tokens_per_s_per_gpu,
                "predicted": p.predicted_tokens_per_s_per_gpu,
                "ratio": p.ratio,
                "bottleneck": p.bottleneck,
                "predicted_mfu": p.predicted_mfu,
                "published_mfu": p.published_mfu,
                "fits_in_memory": p.fits_in_memory,
            }
            for p in report.predictions
        ],
        "skipped": [{"id": s.id, "reason": s.reason} for s in report.skipped],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--file",
        action="append",
        help="calibration JSON file (repeatable; default: the calibration and validation sets)",
    )
    parser.add_argument("--ablate", action="store_true", help="per-mechanism contributions")
    parser.add_argument("--loso", action="store_true", help="leave-one-source-out check")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--markdown",
        metavar="PATH",
        help="write the figures as a Markdown page (docs/accuracy-tables.md) instead of tables",
    )
    parser.add_argument(
        "--no-setups",
        action="store_true",
        help=f"read the calibration file as it stands, without {SETUPS_FILE.name}'s facts",
    )
    args = parser.parse_args(argv)
    paths = args.file or [str(CALIBRATION_FILE), str(VALIDATION_FILE)]
    reports: dict[str, Report] = {}
    documents: dict[str, Document] = {}
    try:
        setups = None if args.no_setups else load_document(SETUPS_FILE)
        for path in paths:
            documents[path] = load_document(path)
            if setups is not None and Path(path).name == setups.get("file"):
                documents[path] = apply_setups(documents[path], setups)
            reports[path] = evaluate(documents[path])
    except ShardMeterError as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"bench_published: error: {message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([_payload(p, r) for p, r in reports.items()], indent=2))
        return 0
    if args.markdown:
        page = render_markdown(reports, documents, setups=not args.no_setups)
        Path(args.markdown).write_text(page, encoding="utf-8")
        print(f"wrote {args.markdown}")
        return 0
    blocks = []
    for path, report in reports.items():
        blocks.append(render(report, path))
        if args.ablate:
            blocks.append(render_ablations(documents[path], report))
    if args.loso:
        blocks.append(render_loso(reports))
    blocks.append(
        f"machine: {platform.machine()} {platform.processor() or ''} "
        f"Python {platform.python_version()}"
    )
    print("\n\n".join(blocks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
