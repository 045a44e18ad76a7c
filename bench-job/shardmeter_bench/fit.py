"""Fitting through ``shardmeter``'s API (`shardmeter.cost.fitting`) — this package keeps no
second copy of the regression — plus the fit-quality summary the CLI prints."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from typing import Any

import torch

from shardmeter.cost.coefficients import (
    CoefficientsDocument,
    CommSample,
    ComputeSample,
    LinearFit,
    LinkRole,
    MemorySample,
)
from shardmeter.cost.features import Target
from shardmeter.cost.fitting import fit_coefficients
from shardmeter.cost.floors import FLOPS_PER_UNIT, demonstrated_flop_per_s
from shardmeter.spec.hardware import GPUSpec, LinkSpec
from shardmeter.spec.training import AttentionKernel, Precision
from shardmeter_bench import __version__
from shardmeter_bench.device import PROBE_HEADROOM

CONFIGMAP_LIMIT_BYTES = 1_000_000
"""Kubernetes rejects objects over ~1 MiB; leave room for metadata."""


def software_versions(device_type: str) -> dict[str, str]:
    versions = {
        "shardmeter-bench": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    try:
        import transformers

        versions["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover - the bench image always has it
        pass
    if device_type == "cuda" and torch.version.cuda:
        versions["cuda"] = str(torch.version.cuda)
        nccl = getattr(torch.cuda, "nccl", None)
        if nccl is not None:
            versions["nccl"] = ".".join(str(x) for x in nccl.version())
    else:
        versions["backend"] = "gloo"
    return versions


def fit(
    *,
    gpu: GPUSpec,
    precision: Precision,
    intra_node: LinkSpec,
    inter_node: LinkSpec,
    compute: Sequence[ComputeSample],
    communication: Sequence[CommSample],
    memory: Sequence[MemorySample],
    pool: str | None,
    device_type: str,
    notes: Sequence[str] = (),
    attention_kernel: AttentionKernel | None = None,
) -> CoefficientsDocument:
    """The measured document; ``attention_kernel``: the kernel the profiled block's attention
    ran (`runconfig.profiled_block`), None when not known (a CPU)."""
    if device_type == "cpu":
        gpu, raised = probed_peak_at_least_demonstrated(gpu, precision, compute)
        notes = [*notes, *raised]
    doc = fit_coefficients(
        gpu=gpu,
        precision=precision,
        intra_node=intra_node,
        inter_node=inter_node,
        compute=compute,
        communication=communication,
        memory=memory,
        pool=pool,
        software=software_versions(device_type),
    )
    if attention_kernel is not None:
        doc = doc.model_copy(update={"attention_kernel": attention_kernel})
    if notes:
        doc = doc.model_copy(update={"notes": [*notes, *doc.notes]})
    return doc


def probed_peak_at_least_demonstrated(
    gpu: GPUSpec, precision: Precision, compute: Sequence[ComputeSample]
) -> tuple[GPUSpec, list[str]]:
    """A CPU's peak comes from a probe; if a profiled sample demonstrates a higher rate
    (`floors.demonstrated_flop_per_s`), the probe read low (a busy host) and the peak is
    raised to that rate with the probe's headroom — else the fit's FLOP floors and the cost
    model's roofline guard would both force predictions slow."""
    demonstrated = demonstrated_flop_per_s(compute) * PROBE_HEADROOM
    field = "peak_bf16_flop_per_s" if precision is Precision.BF16 else "peak_fp32_flop_per_s"
    probed = getattr(gpu, field)
    if demonstrated <= probed:
        return gpu, []
    note = (
        f"device: the {precision.value} peak probe read {probed / 1e9:.1f} GFLOP/s but a "
        f"profiled unit ran at {demonstrated / PROBE_HEADROOM / 1e9:.1f}; peak set to "
        f"{demonstrated / 1e9:.1f} (+{(PROBE_HEADROOM - 1) * 100:.0f} % headroom)"
    )
    return gpu.model_copy(update={field: demonstrated}), [note]


def without_samples(doc: CoefficientsDocument, reason: str) -> CoefficientsDocument:
    from shardmeter.cost.coefficients import Samples

    return doc.model_copy(
        update={"samples": Samples(), "notes": [*doc.notes, f"raw samples omitted: {reason}"]}
    )


def implied_flop_rates(target: Target, fit: LinearFit) -> dict[str, float]:
    """FLOP/s each FLOP feature's coefficient implies (FLOPs per unit ÷ seconds per unit)."""
    flops = FLOPS_PER_UNIT.get(target, {})
    return {f: flops[f] / c for f, c in fit.coefficients.items() if f in flops and c > 0}


def fit_summary(doc: CoefficientsDocument) -> dict[str, Any]:
    """Per target: samples, architectures, leave-one-model-out MAPE (the headline: error on
    architectures the fit did not see), shuffled K-fold MAPE, the features, and the FLOP/s
    each FLOP feature implies against the device's peak; per collective: samples, L, β and
    MAPE (measured fits only)."""
    compute = {
        t.value: {
            "n_samples": f.n_samples,
            "architectures": f.architectures,
            "leave_one_model_out_mape": f.leave_one_model_out_mape,
            "cv_mape": f.cv_mape,
            "features": sorted(f.coefficients),
            "implied_flop_per_s": implied_flop_rates(t, f),
        }
        for t, f in doc.compute.items()
    }
    comm = {
        f"{role.value}.{name}": {
            "n_samples": c.n_samples,
            "latency_s": c.latency_s,
            "seconds_per_byte": c.seconds_per_byte,
            "mape": c.mape,
            "link": c.link,
        }
        for role in LinkRole
        for name, c in doc.communication.get(role, {}).items()
        if c.n_samples > 0
    }
    return {
        "gpu": doc.gpu.name,
        "precision": doc.precision.value,
        "peak_flop_per_s": doc.gpu.peak_flop_per_s(doc.precision.value),
        "compute": compute,
        "communication": comm,
        "activation_scale": doc.memory.activation_scale,
        "fit_mape": doc.fit_mape(),
        "notes": list(doc.notes),
    }


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def render_summary(summary: dict[str, Any]) -> str:
    peak = summary["peak_flop_per_s"]
    lines = [
        f"coefficients for {summary['gpu']} ({summary['precision']}, peak "
        f"{peak / 1e9:.1f} GFLOP/s)",
        f"{'target':<22}{'samples':>8}{'models':>7}{'LOMO MAPE':>11}{'K-fold':>9}  "
        "features (implied GFLOP/s)",
    ]
    for target, row in summary["compute"].items():
        rates = row["implied_flop_per_s"]
        features = [f"{f} ({rates[f] / 1e9:.0f})" if f in rates else f for f in row["features"]]
        lines.append(
            f"{target:<22}{row['n_samples']:>8}{row['architectures']:>7}"
            f"{_pct(row['leave_one_model_out_mape']):>11}{_pct(row['cv_mape']):>9}  "
            f"{', '.join(features)}"
        )
    if summary["communication"]:
        lines.append(f"{'collective':<30}{'samples':>8}{'L':>12}{'1/β':>12}{'MAPE':>9}")
        for key, row in summary["communication"].items():
            bw = 1.0 / row["seconds_per_byte"] if row["seconds_per_byte"] > 0 else float("inf")
            lines.append(
                f"{key:<30}{row['n_samples']:>8}{row['latency_s'] * 1e6:>9.1f} µs"
                f"{bw / 1e9:>7.2f} GB/s{_pct(row['mape']):>9}"
            )
    lines.append(f"activation scale α = {summary['activation_scale']:.3f}")
    return "\n".join(lines)
