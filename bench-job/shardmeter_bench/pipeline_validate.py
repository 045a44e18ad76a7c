"""The ``validate`` phase of a run: Hugging Face models on this rank (split across ranks
under a launcher; already measured, in two passes, when they were interleaved with the
catalog), then FSDP2 steps and collectives on all ranks, then — on rank 0 — the
predictions and the report."""

from __future__ import annotations

from typing import Any

import torch

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.spec.training import Precision
from shardmeter_bench.collectives import distributed
from shardmeter_bench.collectives.distributed import DistContext
from shardmeter_bench.logs import get_logger
from shardmeter_bench.runconfig import (
    Interleaved,
    RunConfig,
    comm_ranks,
    validation_comm_plan,
    validation_share,
)
from shardmeter_bench.validation.fsdp_step import (
    DistributedValidation,
    distributed_validation_phase,
)
from shardmeter_bench.validation.measure import (
    ModelResult,
    attach_predictions,
    fsdp_cases,
    merge_passes,
    predict_step,
    validation_cases,
)
from shardmeter_bench.validation.report import build_report
from shardmeter_bench.validation.unseen import unseen_cases

log = get_logger(__name__)


def run_validation(
    cfg: RunConfig,
    ctx: DistContext,
    device: torch.device,
    doc: CoefficientsDocument | None,
    meta: dict[str, Any],
    truth: Interleaved | None = None,
) -> dict[str, Any] | None:
    truth = truth or validation_share(cfg, ctx)
    log.info("validation_started", models=len(truth.cases), interleaved=truth.measured)
    if not truth.measured:
        truth.measure_all(device, cfg)
    gathered = distributed.gather_to_main(truth.rows, ctx) or []
    all_rows = merge_passes([r for part in gathered for r in part])
    cases = unseen_cases(cfg.scale, cfg.device_type) + validation_cases(cfg.scale, cfg.device_type)
    meta["left_out"] = truth.left_out
    meta["interleaved"] = truth.measured
    meta["passes"] = truth.passes

    steps: list[dict[str, Any]] = []
    collectives = []
    ranks = comm_ranks(cfg, ctx)
    fsdp = fsdp_cases(cfg.scale, cfg.device_type)
    if ranks >= 2:
        job = DistributedValidation(
            cases=tuple(fsdp),
            device_type=cfg.device_type,
            bf16=cfg.precision_enum is Precision.BF16,
            repeats=cfg.repeats,
            seed=cfg.seed,
            comm=validation_comm_plan(cfg),
        )
        out = distributed.run_phase(
            distributed_validation_phase,
            job,
            ctx,
            ranks,
            cfg.device_type,
            cfg.timeout_s,
            cfg.threads or 1,
        )
        if out is not None:
            steps, collectives = out["steps"], out["collectives"]
    else:
        log.warning("fsdp_validation_skipped", reason=f"needs at least 2 ranks, found {ranks}")
    if not ctx.is_main:
        return None
    assert doc is not None
    results = attach_predictions(doc, cases, all_rows)
    by_key = {r.key: r for r in results}
    nodes, per_node = (ctx.nnodes, ctx.local_world_size) if ctx.launched else (1, ranks)
    for measured in steps:
        case = next(c for c in fsdp if c.key == measured["key"])
        spec = case.spec.model_copy(update={"num_layers": case.layers})
        predicted = predict_step(doc, spec, case.micro_batch, case.seq_len, nodes, per_node)
        result = by_key.get(case.key)
        if result is None or result.layers != case.layers:
            result = ModelResult(case.key, case.spec.name, case.spec.total_params, case.layers)
            results.append(result)
            by_key[case.key] = result
        result.step = {
            "measured_s": measured["seconds"],
            "predicted_s": predicted,
            "micro_batch": case.micro_batch,
            "seq_len": case.seq_len,
            "ranks": nodes * per_node,
        }
    unseen = unseen_cases(cfg.scale, cfg.device_type)
    widths = sorted(c.spec.hidden_size for c in unseen)
    tokens = sorted({b * s for c in unseen for b, s in c.sizes})
    if widths and tokens:
        meta["unseen_suite"] = (
            f"{len(unseen)} unseen architectures, hidden {widths[0]}–{widths[-1]}, "
            f"{tokens[0]}–{tokens[-1]} tokens"
        )
    sizes = sorted({(r["micro_batch"], r["seq_len"]) for r in all_rows})
    meta["sizes"] = ", ".join(f"{b}×{s}" for b, s in sizes) + " tokens (micro-batch × seq)"
    return build_report(doc, results, collectives, meta)
