"""The accuracy report of ``validate``: a JSON file and markdown tables — the unseen Llama
architectures point by point with the median and maximum error (the headline), the paper's
accuracy table for the preset models (model, size, fwd, bwd, step — MAPE in %), and the
collectives."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument, CommSample, ValidationVerdict
from shardmeter.cost.collectives import link_ring_seconds
from shardmeter_bench.validation.measure import ModelResult
from shardmeter_bench.validation.unseen import UNSEEN

GOAL_MEDIAN = 0.10
GOAL_MAX = 0.20
"""The unseen-architecture goal, for forward and for backward, in every run."""


def ape(measured: float, predicted: float) -> float:
    return abs(predicted - measured) / measured


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def unseen_summary(results: Sequence[ModelResult]) -> dict[str, Any] | None:
    """Per (unseen model, size) point: measured, predicted and error, forward and backward;
    the median and maximum error over the points (None when no unseen model was measured)."""
    points: list[dict[str, Any]] = []
    for r in results:
        if r.suite != UNSEEN:
            continue
        for p in r.points:
            points.append(
                {
                    "model": r.name,
                    "architecture": r.architecture,
                    "layers": r.layers,
                    **p,
                    "fwd_error": ape(p["fwd_measured_s"], p["fwd_predicted_s"]),
                    "bwd_error": ape(p["bwd_measured_s"], p["bwd_predicted_s"]),
                    "fwd_signed": p["fwd_predicted_s"] / p["fwd_measured_s"] - 1.0,
                    "bwd_signed": p["bwd_predicted_s"] / p["bwd_measured_s"] - 1.0,
                }
            )
    if not points:
        return None
    for p in points:
        for phase in ("fwd", "bwd"):
            if f"{phase}_prior_s" in p:
                p[f"{phase}_prior_error"] = ape(p[f"{phase}_measured_s"], p[f"{phase}_prior_s"])
    out: dict[str, Any] = {"points": points, "goal": {"median": GOAL_MEDIAN, "max": GOAL_MAX}}
    for phase in ("fwd", "bwd"):
        errors = [float(p[f"{phase}_error"]) for p in points]
        out[f"{phase}_median"] = statistics.median(errors)
        out[f"{phase}_max"] = max(errors)
        prior = [float(p[f"{phase}_prior_error"]) for p in points if f"{phase}_prior_error" in p]
        if prior:
            out[f"{phase}_prior_median"] = statistics.median(prior)
            out[f"{phase}_prior_max"] = max(prior)
    out["meets_goal"] = all(
        out[f"{phase}_median"] <= GOAL_MEDIAN and out[f"{phase}_max"] <= GOAL_MAX
        for phase in ("fwd", "bwd")
    )
    return out


def verdict(unseen: dict[str, Any] | None, suite: str = "") -> ValidationVerdict | None:
    """The document against the priors on the unseen points, forward and backward errors
    pooled (None without unseen points or prior predictions)."""
    if not unseen:
        return None
    points = unseen["points"]
    errors = [p[f"{ph}_error"] for p in points for ph in ("fwd", "bwd")]
    priors = [p.get(f"{ph}_prior_error") for p in points for ph in ("fwd", "bwd")]
    if not errors or any(e is None for e in priors):
        return None
    prior_errors = [float(e) for e in priors if e is not None]
    return ValidationVerdict(
        points=len(points),
        suite=suite,
        document_median_error=statistics.median(errors),
        document_max_error=max(errors),
        priors_median_error=statistics.median(prior_errors),
        priors_max_error=max(prior_errors),
    )


def model_rows(results: Sequence[ModelResult]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        if r.suite == UNSEEN:
            continue
        fwd = [ape(p["fwd_measured_s"], p["fwd_predicted_s"]) for p in r.points]
        bwd = [ape(p["bwd_measured_s"], p["bwd_predicted_s"]) for p in r.points]
        step = r.step
        rows.append(
            {
                "model": r.name,
                "key": r.key,
                "params": r.params,
                "layers": r.layers,
                "fwd_mape": _mean(fwd),
                "bwd_mape": _mean(bwd),
                "step_error": ape(step["measured_s"], step["predicted_s"]) if step else None,
                "points": r.points,
                "step": step,
            }
        )
    return rows


def collective_rows(
    doc: CoefficientsDocument, measured: Sequence[CommSample]
) -> dict[str, dict[str, Any]]:
    """Per collective: MAPE of the ring model at the measured (unseen) payloads."""
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"points": []})
    for s in measured:
        fit = doc.communication[s.role][s.collective]
        predicted = link_ring_seconds(
            s.collective, s.payload_bytes, s.ranks, fit.latency_s, fit.seconds_per_byte
        )
        out[s.collective]["points"].append(
            {
                "role": s.role.value,
                "ranks": s.ranks,
                "payload_bytes": s.payload_bytes,
                "measured_s": s.seconds,
                "predicted_s": predicted,
                "error": ape(s.seconds, predicted),
            }
        )
    for row in out.values():
        row["mape"] = _mean([p["error"] for p in row["points"]])
        row["ranks"] = sorted({p["ranks"] for p in row["points"]})
    return dict(out)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def build_report(
    doc: CoefficientsDocument,
    results: Sequence[ModelResult],
    collectives: Sequence[CommSample],
    meta: dict[str, Any],
) -> dict[str, Any]:
    rows = model_rows(results)
    coll = collective_rows(doc, collectives)
    unseen = unseen_summary(results)
    judged = verdict(unseen, str(meta.get("unseen_suite", "")))
    if unseen is not None and judged is not None:
        beats = "beats" if judged.beats_priors else "does not beat"
        unseen["verdict"] = f"the document {beats} the priors: {judged.describe()}"
        unseen["beats_priors"] = judged.beats_priors
    return {
        "meta": meta,
        "device": doc.gpu.name,
        "precision": doc.precision.value,
        "unseen": unseen,
        "verdict": judged.model_dump(mode="json") if judged is not None else None,
        "models": rows,
        "collectives": coll,
        "median": {
            "fwd_mape": _median([r["fwd_mape"] for r in rows]),
            "bwd_mape": _median([r["bwd_mape"] for r in rows]),
            "step_error": _median([r["step_error"] for r in rows]),
            "collective_mape": _median([c["mape"] for c in coll.values()]),
        },
    }


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def _size(params: int) -> str:
    return f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"


def render_unseen(unseen: dict[str, Any]) -> list[str]:
    lines = [
        "Unseen Llama architectures (never in the catalog), error of each point in %:",
        "",
        "| Model | Architecture | Layers | b × s | Fwd measured | Fwd predicted | Fwd err "
        "| Bwd measured | Bwd predicted | Bwd err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in unseen["points"]:
        lines.append(
            f"| {p['model']} | {p['architecture']} | {p['layers']} "
            f"| {p['micro_batch']} × {p['seq_len']} "
            f"| {p['fwd_measured_s'] * 1e3:.1f} ms | {p['fwd_predicted_s'] * 1e3:.1f} ms "
            f"| {100 * p['fwd_signed']:+.1f} "
            f"| {p['bwd_measured_s'] * 1e3:.1f} ms | {p['bwd_predicted_s'] * 1e3:.1f} ms "
            f"| {100 * p['bwd_signed']:+.1f} |"
        )
    goal = unseen["goal"]
    priors = "fwd_prior_median" in unseen
    extra = " priors median | priors max |" if priors else ""
    lines += [
        "",
        f"| unseen, {len(unseen['points'])} points | median | max |{extra}",
        "| --- | --- | --- |" + (" --- | --- |" if priors else ""),
    ]
    for phase, name in (("fwd", "forward"), ("bwd", "backward")):
        row = f"| {name} | {_pct(unseen[f'{phase}_median'])} | {_pct(unseen[f'{phase}_max'])} |"
        if priors:
            row += (
                f" {_pct(unseen[f'{phase}_prior_median'])} | {_pct(unseen[f'{phase}_prior_max'])} |"
            )
        lines.append(row)
    lines += [f"| goal | ≤ {_pct(goal['median'])} | ≤ {_pct(goal['max'])} |", ""]
    if unseen.get("verdict"):
        lines += [f"Document against the datasheet priors: {unseen['verdict']}", ""]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        f"Prediction error (MAPE, %) on {report['device']} ({report['precision']}), "
        f"{meta.get('machine', '')}",
        "",
    ]
    if report.get("unseen"):
        lines += render_unseen(report["unseen"])
    lines += [
        "| Model | Size | Layers built | Fwd | Bwd | Step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["models"]:
        lines.append(
            f"| {r['model']} | {_size(r['params'])} | {r['layers']} | {_pct(r['fwd_mape'])} "
            f"| {_pct(r['bwd_mape'])} | {_pct(r['step_error'])} |"
        )
    med = report["median"]
    lines.append(
        f"| **median** | | | **{_pct(med['fwd_mape'])}** | **{_pct(med['bwd_mape'])}** "
        f"| **{_pct(med['step_error'])}** |"
    )
    if report["collectives"]:
        lines += ["", "| Collective | Ranks | MAPE | Payloads |", "| --- | --- | --- | --- |"]
        for name, c in report["collectives"].items():
            sizes = sorted({p["payload_bytes"] for p in c["points"]})
            span = f"{sizes[0] / 1024:.0f} KiB – {sizes[-1] / 2**20:.0f} MiB" if sizes else ""
            ranks = ", ".join(str(r) for r in c["ranks"])
            lines.append(f"| {name} | {ranks} | {_pct(c['mape'])} | {len(sizes)}: {span} |")
    steps = [r for r in report["models"] if r["step"]]
    if steps:
        lines += ["", "| FSDP2 step | micro-batch × seq | ranks | measured | predicted |"]
        lines.append("| --- | --- | --- | --- | --- |")
        for r in steps:
            s = r["step"]
            lines.append(
                f"| {r['model']} ({r['layers']} layers) | {s['micro_batch']} × {s['seq_len']} "
                f"| {s['ranks']} | {s['measured_s']:.3f} s | {s['predicted_s']:.3f} s |"
            )
    lines += [
        "",
        f"Fwd/Bwd: whole Hugging Face models ({meta.get('sizes', '')}), mean over sizes; "
        "Step: one FSDP2 step vs the simulator; collectives: payloads the fit never saw.",
    ]
    lines += [f"Not measured: {note}" for note in meta.get("left_out", [])]
    return "\n".join(lines)


def write_report(report: dict[str, Any], folder: str | Path) -> tuple[Path, Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    js = folder / "validation.json"
    md = folder / "validation.md"
    js.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md.write_text(render_markdown(report) + "\n")
    return js, md
