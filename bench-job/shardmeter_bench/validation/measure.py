"""``validate``: measure shapes the fit never saw and compare with the predictions
(paper §IV-B, its accuracy table).

* **fwd / bwd**: whole Hugging Face models at reduced depth — eight unseen Llama
  architectures (`unseen`, the headline) and the paper's preset models — forward
  (embedding → layers → head → loss) and backward, against the sum of the fitted unit times
  (embedding + L · block + head), timed with the fit's own clock (`device.compute_clock`);
* **step**: a real FSDP2 step (`fsdp_step`), against the execution-graph simulator;
* **collectives**: payloads between the fitted ones, against the ring model.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.model import CostModel
from shardmeter.sim.fsdp import FSDPDurations, simulate_fsdp_step
from shardmeter.spec.model import MODEL_PRESETS, MLPKind, NormKind, TransformerSpec
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import AttentionKernel, TrainingSpec
from shardmeter_bench.compute.footprint import process_bytes
from shardmeter_bench.device import (
    compute_clock,
    peak_rss_bytes,
    release_memory,
    synchronize,
    timed_repeats,
)
from shardmeter_bench.isolation import isolated
from shardmeter_bench.logs import get_logger, progress
from shardmeter_bench.validation.hf_models import build_hf_model

log = get_logger(__name__)


PRESETS = "presets"
"""`ValidationCase.suite` of the paper's models."""


@dataclass(frozen=True)
class ValidationCase:
    """One model: its architecture (full width), the layers built, (micro-batch, seq), and
    the suite it reports in (`PRESETS`, or `unseen.UNSEEN`)."""

    key: str
    spec: TransformerSpec
    layers: int
    sizes: tuple[tuple[int, int], ...]
    suite: str = PRESETS

    def peak_bytes(self, element_bytes: int) -> float:
        """The process's estimated peak while measuring this case (`footprint`)."""
        return max(
            process_bytes(self.spec, self.layers, b, s, element_bytes) for b, s in self.sizes
        )


def within_budget(
    cases: list[ValidationCase], max_process_bytes: float | None, element_bytes: int
) -> tuple[list[ValidationCase], list[str]]:
    """The cases whose estimated peak fits ``max_process_bytes`` (all when None), and a note
    for each one left out."""
    if max_process_bytes is None:
        return cases, []
    kept, notes = [], []
    for case in cases:
        need = case.peak_bytes(element_bytes)
        if need <= max_process_bytes:
            kept.append(case)
        else:
            notes.append(
                f"{case.key} not measured: needs ~{need / 2**30:.1f} GiB, over the "
                f"{max_process_bytes / 2**30:.1f} GiB budget (--max-memory-gib)"
            )
    return kept, notes


@dataclass(frozen=True)
class FsdpCase:
    key: str
    spec: TransformerSpec
    layers: int
    micro_batch: int
    seq_len: int


TINY_SPECS = {
    "tiny-llama": TransformerSpec(
        name="tiny-llama",
        hidden_size=96,
        num_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=320,
        vocab_size=1536,
        tie_embeddings=True,
    ),
    "tiny-phi": TransformerSpec(
        name="tiny-phi",
        hidden_size=128,
        num_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=512,
        vocab_size=1000,
        mlp_kind=MLPKind.PLAIN,
        parallel_attention_mlp=True,
        linear_bias=True,
        norm=NormKind.LAYERNORM,
    ),
    "tiny-gemma": TransformerSpec(
        name="tiny-gemma",
        hidden_size=128,
        num_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=48,
        intermediate_size=512,
        vocab_size=2000,
        tie_embeddings=True,
    ),
}

_PAPER_MODELS = (
    ("smollm-360m", 4),
    ("llama-3.2-1b", 2),
    ("phi-1.5", 2),
    ("gemma-2b", 2),
    ("yi-1.5-6b", 2),
)


def validation_cases(scale: str, device_type: str) -> list[ValidationCase]:
    """The paper's models (full width, 2–4 layers) or, for ``small``, tiny look-alikes."""
    if scale == "small":
        return [ValidationCase(k, s, 2, ((1, 48), (2, 48))) for k, s in TINY_SPECS.items()]
    sizes = ((1, 128), (2, 128)) if device_type == "cpu" else ((1, 2048), (4, 2048))
    return [ValidationCase(k, MODEL_PRESETS[k], layers, sizes) for k, layers in _PAPER_MODELS]


def fsdp_cases(scale: str, device_type: str) -> list[FsdpCase]:
    if scale == "small":
        return [FsdpCase("tiny-llama", TINY_SPECS["tiny-llama"], 2, 2, 48)]
    if device_type == "cpu":
        return [FsdpCase("smollm-360m", MODEL_PRESETS["smollm-360m"], 4, 4, 128)]
    return [
        FsdpCase("smollm-360m", MODEL_PRESETS["smollm-360m"], 32, 4, 2048),
        FsdpCase("llama-3.2-1b", MODEL_PRESETS["llama-3.2-1b"], 16, 2, 2048),
    ]


def time_forward_backward(
    model: torch.nn.Module,
    micro_batch: int,
    seq_len: int,
    vocab: int,
    repeats: int,
    warmup: int = 2,
    seed: int = 0,
) -> tuple[list[float], list[float]]:
    """Seconds of every timed ``model(ids, labels=ids)`` and ``loss.backward()`` after
    ``warmup`` iterations, on the clock the fit is measured with (`device.compute_clock`);
    on a CPU a fast model gets more iterations, as the catalog does (`device.timed_repeats`)."""
    device = next(model.parameters()).device
    clock = compute_clock(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=gen).to(device)
    forward, backward = [], []
    k, total = 0, warmup + repeats
    with hf_attention(device):
        while k < total:
            synchronize(device)
            t0 = clock()
            loss = model(input_ids=ids, labels=ids).loss
            synchronize(device)
            t1 = clock()
            loss.backward()
            synchronize(device)
            t2 = clock()
            model.zero_grad(set_to_none=True)
            if k >= warmup:
                forward.append(t1 - t0)
                backward.append(t2 - t1)
            elif k == warmup - 1 and device.type == "cpu":
                total = warmup + timed_repeats(repeats, t2 - t0)  # as the catalog is timed
            k += 1
    return forward, backward


HF_SDPA_ORDER = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""On CUDA the Hugging Face models' SDPA runs FlashAttention-2 first (PyTorch's own default
order, pinned so that a PyTorch that changes it does not change the truth); predictions are
made for ``flash2`` (`VALIDATION_KERNEL`)."""
VALIDATION_KERNEL = AttentionKernel.FLASH2


def hf_attention(device: torch.device) -> contextlib.AbstractContextManager[None]:
    if device.type == "cuda":
        return sdpa_kernel(HF_SDPA_ORDER, set_priority=True)
    return contextlib.nullcontext()


def cost_model(
    doc: CoefficientsDocument,
    spec: TransformerSpec,
    micro_batch: int,
    seq_len: int,
    nodes: int = 1,
    gpus_per_node: int = 1,
    priors: bool = False,
) -> CostModel:
    """The cost model of a validation model, for the attention kernel the Hugging Face
    models run (`VALIDATION_KERNEL`); ``priors``: the datasheet priors of the document's
    GPU instead of the document."""
    training = TrainingSpec(
        seq_len_tokens=seq_len,
        global_batch_tokens=seq_len * micro_batch * nodes * gpus_per_node,
        precision=doc.precision,
        attention_kernel=VALIDATION_KERNEL,
    )
    pool = PoolSpec(name="validate", gpu=doc.gpu, nodes=nodes, gpus_per_node=gpus_per_node)
    return CostModel(spec, training, pool, None if priors else doc)


def predict_forward_backward(
    doc: CoefficientsDocument,
    spec: TransformerSpec,
    micro_batch: int,
    seq_len: int,
    priors: bool = False,
) -> tuple[float, float]:
    """Whole-model forward and backward seconds: embedding + L · block + head (from the
    document, or from its GPU's datasheet priors)."""
    cm = cost_model(doc, spec, micro_batch, seq_len, priors=priors)
    u = cm.unit_times(micro_batch)
    layers = spec.num_layers
    forward = u.embedding_forward_s + layers * u.block_forward_s + u.head_forward_s
    backward = u.embedding_backward_s + layers * u.block_backward_s + u.head_backward_s
    return forward, backward


def predict_step(
    doc: CoefficientsDocument,
    spec: TransformerSpec,
    micro_batch: int,
    seq_len: int,
    nodes: int,
    gpus_per_node: int,
) -> float:
    """One FSDP step (no accumulation) from the execution-graph simulator."""
    cm = cost_model(doc, spec, micro_batch, seq_len, nodes, gpus_per_node)
    durations = FSDPDurations.from_cost_model(cm, nodes, gpus_per_node, micro_batch)
    return simulate_fsdp_step(durations, accumulation=1).step_s


@dataclass
class ModelResult:
    key: str
    name: str
    params: int
    """Parameters of the full-depth preset (the "size" column)."""
    layers: int
    points: list[dict[str, float]] = field(default_factory=list)
    step: dict[str, float] | None = None
    suite: str = PRESETS
    architecture: str = ""
    """Width, heads / key-value heads, MLP width and vocabulary, for the report."""


def describe(spec: TransformerSpec) -> str:
    """``h576 9/3 i1536 V49152 tied``: width, heads/key-value heads, MLP width, vocabulary."""
    tied = " tied" if spec.tie_embeddings else ""
    return (
        f"h{spec.hidden_size} {spec.num_attention_heads}/{spec.kv_heads} "
        f"i{spec.intermediate_size} V{spec.vocab_size}{tied}"
    )


def measure_case(
    case: ValidationCase, device: torch.device, dtype: torch.dtype, repeats: int, seed: int
) -> list[dict[str, Any]]:
    """Measured forward/backward seconds of one case at each of its sizes: every timed
    iteration (``fwd_all``, ``bwd_all``) and their medians (``fwd``, ``bwd``)."""
    started = time.perf_counter()
    longest = max(s for _, s in case.sizes)
    model = build_hf_model(case.spec, case.layers, device, dtype, seed, max_positions=longest)
    rows: list[dict[str, Any]] = []
    try:
        for b, s in case.sizes:
            fwd, bwd = time_forward_backward(
                model, b, s, case.spec.vocab_size, repeats, seed=seed + b
            )
            rows.append(
                {
                    "key": case.key,
                    "micro_batch": b,
                    "seq_len": s,
                    "fwd": statistics.median(fwd),
                    "bwd": statistics.median(bwd),
                    "fwd_all": fwd,
                    "bwd_all": bwd,
                }
            )
    finally:
        del model
        release_memory(device)
    log.info(
        "model_validated",
        model=case.key,
        elapsed_s=round(time.perf_counter() - started, 1),
        peak_rss_gib=round(peak_rss_bytes() / 2**30, 2),
    )
    return rows


def merge_passes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, size): the medians over the timed iterations of every pass that
    measured it (``passes`` says how many), in first-measured order."""
    merged: dict[tuple[str, int, int], dict[str, Any]] = {}
    for row in rows:
        key = (row["key"], row["micro_batch"], row["seq_len"])
        if key not in merged:
            merged[key] = {**row, "fwd_all": [], "bwd_all": [], "passes": 0}
        out = merged[key]
        out["fwd_all"] = out["fwd_all"] + list(row.get("fwd_all", [row["fwd"]]))
        out["bwd_all"] = out["bwd_all"] + list(row.get("bwd_all", [row["bwd"]]))
        out["passes"] += 1
        out["fwd"] = statistics.median(out["fwd_all"])
        out["bwd"] = statistics.median(out["bwd_all"])
    return list(merged.values())


def measure_models(
    cases: list[ValidationCase],
    device: torch.device,
    dtype: torch.dtype,
    repeats: int,
    seed: int,
) -> list[dict[str, Any]]:
    """Measured forward/backward seconds of every case and size, each case in a process
    of its own on a CPU (`isolation`); no predictions: the process measuring may not hold the
    coefficients."""
    rows: list[dict[str, Any]] = []
    for case in progress(cases, total=len(cases), desc="validate"):
        rows += isolated(device, case.key, measure_case, case, device, dtype, repeats, seed)
    return rows


def attach_predictions(
    doc: CoefficientsDocument, cases: list[ValidationCase], rows: list[dict[str, Any]]
) -> list[ModelResult]:
    results: dict[str, ModelResult] = {}
    by_key = {c.key: c for c in cases}
    for row in rows:
        case = by_key[row["key"]]
        spec = case.spec.model_copy(update={"num_layers": case.layers})
        fwd_p, bwd_p = predict_forward_backward(doc, spec, row["micro_batch"], row["seq_len"])
        fwd_prior, bwd_prior = predict_forward_backward(
            doc, spec, row["micro_batch"], row["seq_len"], priors=True
        )
        result = results.setdefault(
            case.key,
            ModelResult(
                case.key,
                case.spec.name,
                case.spec.total_params,
                case.layers,
                suite=case.suite,
                architecture=describe(case.spec),
            ),
        )
        result.points.append(
            {
                "micro_batch": row["micro_batch"],
                "seq_len": row["seq_len"],
                "fwd_measured_s": row["fwd"],
                "fwd_predicted_s": fwd_p,
                "bwd_measured_s": row["bwd"],
                "bwd_predicted_s": bwd_p,
                "fwd_prior_s": fwd_prior,
                "bwd_prior_s": bwd_prior,
            }
        )
    return [results[c.key] for c in cases if c.key in results]
