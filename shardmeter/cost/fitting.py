"""Fitting API: turn measured samples into a coefficients document. The bench Job calls
this (it never carries a second copy of the regression code)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

import numpy as np

from shardmeter import __version__
from shardmeter.cost.coefficients import (
    COLLECTIVES,
    CoefficientsDocument,
    CollectiveFit,
    CommSample,
    ComputeSample,
    LinearFit,
    LinkRole,
    MemoryCoefficients,
    MemorySample,
    Samples,
    Source,
)
from shardmeter.cost.features import CANDIDATE_FEATURES, Target, design_row
from shardmeter.cost.floors import executed_flops, lower_bounds
from shardmeter.cost.memory import activation_bytes_per_token
from shardmeter.cost.priors import compute_priors, link_prior
from shardmeter.cost.regression import RelativeNNLSRegressor, RingCollectiveRegressor
from shardmeter.spec.hardware import GPUSpec, LinkSpec
from shardmeter.spec.model import TransformerSpec
from shardmeter.spec.training import ActivationCheckpointing, Precision, TrainingSpec

MIN_SAMPLES_PER_TARGET = 3


def _design(
    samples: Sequence[ComputeSample], target: Target
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    rows, ys, groups = [], [], []
    for s in samples:
        spec = TransformerSpec.model_validate(s.model)
        rows.append(design_row(target, spec, s.micro_batch, s.seq_len, s.params_local))
        ys.append(s.seconds)
        groups.append(s.group or spec.name)
    return np.vstack(rows), np.asarray(ys), groups


MISREAD_SHARE = 0.05
"""Samples faster than the peak are misread timings when they are at most this share of the
samples that execute FLOPs (the rest, timed the same way, respect the peak): they are
dropped. More of them prove the peak itself wrong (a probe read low on a busy host)."""

SELECTION_TOL = 0.02
"""The smallest feature set whose leave-one-architecture-out MAPE is within one standard
error (over architectures), and at least 2 %, of the best set's is chosen: smaller gains are
run-to-run noise, and chasing them made the selection flip between runs."""


def fit_compute_target(
    samples: Sequence[ComputeSample],
    target: Target,
    cv: int = 5,
    random_state: int = 0,
    peak_flop_per_s: float | None = None,
    bandwidth_bytes_per_s: float | None = None,
) -> tuple[LinearFit, RelativeNNLSRegressor]:
    """Fit one target. Coefficients of FLOP features are bounded below by their physical
    floor at ``peak_flop_per_s``, the loss's pass over the logits by its floor at
    ``bandwidth_bytes_per_s`` (`shardmeter.cost.floors`), and those are always kept; the other
    features are selected by leave-one-architecture-out MAPE, which is also the fit's
    headline (``leave_one_model_out_mape``). ``cv_mape`` is a shuffled K-fold's MAPE
    (rows of every architecture on both sides: the optimistic figure, for contrast)."""
    X, y, groups = _design(samples, target)
    names = list(CANDIDATE_FEATURES[target])
    lower = lower_bounds(target, names, peak_flop_per_s, bandwidth_bytes_per_s)
    architectures = len(set(groups))
    grouped = groups if architectures >= 2 else None
    model = RelativeNNLSRegressor(
        feature_names=names,
        cv=cv,
        tol=SELECTION_TOL,
        random_state=random_state,
        lower_bounds=lower,
    ).fit(X, y, groups=grouped)
    fit = LinearFit(
        coefficients=model.coefficients(),
        cv_mape=model.cross_validated_mape(X, y),
        leave_one_model_out_mape=model.cv_mape_ if grouped is not None else None,
        n_samples=len(y),
        architectures=architectures,
        floors={f: b for f, b in zip(names, lower, strict=True) if b > 0},
    )
    return fit, model


def fit_compute(
    samples: Iterable[ComputeSample],
    gpu: GPUSpec,
    precision: Precision,
    cv: int = 5,
    random_state: int = 0,
) -> tuple[dict[Target, LinearFit], list[str]]:
    """Fit every target with enough samples, FLOP coefficients floored at the GPU's peak
    FLOP/s for ``precision`` and the loss's logits pass at its memory bandwidth; the rest
    fall back to datasheet priors (noted). A sample whose time is below its executed FLOPs ÷
    the peak cannot have happened: a few such samples among many that respect the peak are
    misread timings (`MISREAD_SHARE`; one on an H200 read a 12.7 TFLOP head forward in
    0.41 ms, 31× the peak) and are dropped, noted; when more of them beat it, the peak is
    wrong (a probe read on a busy host), so the FLOP floors are dropped instead and a note
    says why, rather than forcing every prediction slow (the bandwidth floor stays: on the
    CPU it sits ~10× below the fitted cost)."""
    rows_in = list(samples)
    stated = gpu.peak_flop_per_s(precision.value)
    flop_rows = [(s, executed_flops(s)) for s in rows_in]
    flop_rows = [(s, f) for s, f in flop_rows if f > 0]
    beating = [(s, f / s.seconds) for s, f in flop_rows if f / s.seconds > stated]
    peak: float | None = stated
    notes: list[str] = []
    if beating and len(beating) <= MISREAD_SHARE * len(flop_rows):
        dropped = {id(s) for s, _ in beating}
        rows_in = [s for s in rows_in if id(s) not in dropped]
        described = "; ".join(
            f"{s.target.value} of {s.group or s.model.get('name', '?')} at "
            f"{s.micro_batch}×{s.seq_len} ({rate / stated:.3g}× the peak)"
            for s, rate in beating[:5]
        )
        notes.append(
            f"compute: {len(beating)} of {len(flop_rows)} samples ran faster than the "
            f"{gpu.name} peak of {stated / 1e9:.1f} GFLOP/s and were dropped as misread "
            f"timings: {described}"
        )
    elif beating:
        peak = None
        fastest = max(rate for _, rate in beating)
        notes.append(
            f"compute: the samples ran at {fastest / 1e9:.1f} GFLOP/s, above the "
            f"{gpu.name} peak of {stated / 1e9:.1f} — the peak is wrong, so no FLOP floor "
            "is known and coefficients are only kept non-negative"
        )
    by_target: dict[Target, list[ComputeSample]] = defaultdict(list)
    for s in rows_in:
        by_target[s.target].append(s)
    priors = compute_priors(gpu, precision)
    fits: dict[Target, LinearFit] = {}
    for target in Target:
        rows = by_target.get(target, [])
        if len(rows) >= MIN_SAMPLES_PER_TARGET:
            fits[target], _ = fit_compute_target(
                rows, target, cv, random_state, peak, gpu.hbm_bandwidth_bytes_per_s
            )
        else:
            fits[target] = priors[target]
            notes.append(f"compute.{target.value}: {len(rows)} samples, using the datasheet prior")
    return fits, notes


def fit_communication(
    samples: Iterable[CommSample], intra_node: LinkSpec, inter_node: LinkSpec
) -> tuple[dict[LinkRole, dict[str, CollectiveFit]], list[str]]:
    """L and β per (role, collective); roles without samples fall back to link priors."""
    grouped: dict[tuple[LinkRole, str], list[CommSample]] = defaultdict(list)
    for s in samples:
        grouped[(s.role, s.collective)].append(s)
    links = {LinkRole.INTRA_NODE: intra_node, LinkRole.INTER_NODE: inter_node}
    out: dict[LinkRole, dict[str, CollectiveFit]] = {}
    notes: list[str] = []
    for role in LinkRole:
        out[role] = {}
        for collective in COLLECTIVES:
            rows = grouped.get((role, collective), [])
            if len(rows) >= 2:
                X = np.array([[r.payload_bytes, r.ranks] for r in rows], dtype=np.float64)
                y = np.array([r.seconds for r in rows])
                reg = RingCollectiveRegressor(collective).fit(X, y)
                out[role][collective] = CollectiveFit(
                    latency_s=reg.latency_s_,
                    seconds_per_byte=reg.seconds_per_byte_,
                    mape=reg.mape_,
                    n_samples=len(rows),
                    link=links[role].name,
                    # inter-node rings run one per rail at once: node bandwidth = rings / β
                    parallel_rings=max(r.parallel_rings for r in rows),
                )
            else:
                out[role][collective] = link_prior(links[role])
                notes.append(
                    f"communication.{role.value}.{collective}: no samples, using the "
                    f"{links[role].name} datasheet prior"
                )
    return out, notes


def calibrate_memory(
    samples: Iterable[MemorySample], precision: Precision, base: MemoryCoefficients | None = None
) -> MemoryCoefficients:
    """Fit ``activation_scale`` α so that α·activations + logits matches the measured peak
    step memory (least squares on relative error, closed form)."""
    base = base or MemoryCoefficients()
    num = den = 0.0
    unit = base.model_copy(update={"activation_scale": 1.0})
    for s in samples:
        spec = TransformerSpec.model_validate(s.model)
        training = TrainingSpec(
            seq_len_tokens=s.seq_len,
            global_batch_tokens=s.seq_len,
            precision=precision,
            activation_checkpointing=ActivationCheckpointing.FULL
            if s.activation_checkpointing
            else ActivationCheckpointing.NONE,
        )
        tokens = s.micro_batch * s.seq_len
        act = tokens * activation_bytes_per_token(spec, training, unit)
        logits = tokens * spec.vocab_size * base.logits_bytes_per_element
        w = 1.0 / s.peak_bytes**2
        num += w * act * (s.peak_bytes - logits)
        den += w * act * act
    if den == 0:
        return base
    return base.model_copy(update={"activation_scale": max(num / den, 1e-3)})


def fit_coefficients(
    *,
    gpu: GPUSpec,
    precision: Precision,
    intra_node: LinkSpec,
    inter_node: LinkSpec,
    compute: Sequence[ComputeSample] = (),
    communication: Sequence[CommSample] = (),
    memory: Sequence[MemorySample] = (),
    pool: str | None = None,
    software: dict[str, str] | None = None,
    cv: int = 5,
    random_state: int = 0,
    measured_at: datetime | None = None,
) -> CoefficientsDocument:
    """A measured coefficients document from samples (raw samples kept for re-fitting)."""
    compute_fits, notes = fit_compute(compute, gpu, precision, cv, random_state)
    comm_fits, comm_notes = fit_communication(communication, intra_node, inter_node)
    now = datetime.now(UTC)
    return CoefficientsDocument(
        source=Source.MEASURED,
        gpu=gpu,
        precision=precision,
        pool=pool,
        created_at=now,
        measured_at=measured_at or now,
        software={"shardmeter": __version__, **(software or {})},
        compute=compute_fits,
        communication=comm_fits,
        memory=calibrate_memory(memory, precision),
        notes=notes + comm_notes,
        samples=Samples(
            compute=list(compute), communication=list(communication), memory=list(memory)
        ),
    )


def refit(
    document: CoefficientsDocument,
    intra_node: LinkSpec,
    inter_node: LinkSpec,
    cv: int = 5,
    random_state: int = 0,
) -> CoefficientsDocument:
    """Fit again from the samples a document carries (e.g. after a library upgrade)."""
    refitted = fit_coefficients(
        gpu=document.gpu,
        precision=document.precision,
        intra_node=intra_node,
        inter_node=inter_node,
        compute=document.samples.compute,
        communication=document.samples.communication,
        memory=document.samples.memory,
        pool=document.pool,
        software=document.software,
        cv=cv,
        random_state=random_state,
        measured_at=document.measured_at,
    )
    return refitted.model_copy(update={"attention_kernel": document.attention_kernel})
