"""The modes, end to end: ``compute`` (profile + fit, collectives from priors), ``comm``
(collectives + fit, compute from priors), ``all`` (both) and ``validate`` (``all``, or a
given ``--coefficients`` file, then the accuracy report). Fit and validation run in one
process lifetime because the host drifts over minutes.

Under a launcher the catalog is split across ranks (each profiles ``shapes[rank::world]``,
rank 0 gathers) and every rank joins the collectives; as a plain process compute runs here
and the distributed phases spawn ``--ranks`` local ranks.
"""

from __future__ import annotations

import os
import platform
import time

import torch

from shardmeter.cost.coefficients import CoefficientsDocument, CommSample, ValidationVerdict
from shardmeter.spec.hardware import GPUSpec
from shardmeter.spec.training import AttentionKernel
from shardmeter_bench import fit
from shardmeter_bench.collectives import distributed
from shardmeter_bench.collectives.distributed import DistContext
from shardmeter_bench.collectives.timing import (
    FULL_PAYLOADS,
    SMALL_PAYLOADS,
    CommPlan,
)
from shardmeter_bench.compute.catalog import generate_catalog
from shardmeter_bench.compute.sweep import ComputeResult, profile_catalog
from shardmeter_bench.device import default_links, torch_device
from shardmeter_bench.errors import BenchError
from shardmeter_bench.logs import get_logger
from shardmeter_bench.pipeline_validate import run_validation
from shardmeter_bench.runconfig import (
    Interleaved,
    RunConfig,
    RunResult,
    comm_ranks,
    comm_timing,
    device_spec,
    load_average,
    machine_description,
    profiled_block,
    validation_share,
    validation_specs,
)
from shardmeter_bench.validation.unseen import interleave_schedule

log = get_logger(__name__)


def _profile(
    cfg: RunConfig,
    ctx: DistContext,
    device: torch.device,
    truth: Interleaved | None,
    block: str,
) -> ComputeResult:
    scale = cfg.scale_range
    shapes = generate_catalog(
        scale, cfg.configs or scale.default_configs, cfg.seed, exclude=validation_specs(cfg)
    )
    mine = shapes[ctx.rank :: ctx.world_size] if ctx.launched else shapes
    log.info("compute_started", shapes=len(mine), of=len(shapes), scale=scale.name)
    after_shape = None
    if truth is not None and truth.cases:
        schedule = interleave_schedule(len(mine), truth.passes * len(truth.cases))

        def after_shape(k: int) -> None:
            for j in schedule.get(k, []):
                truth.measure(j, device, cfg)

        if not mine:
            truth.measure_all(device, cfg)
        truth.measured = True
    part = profile_catalog(
        mine, scale, device, cfg.dtype, cfg.repeats, cfg.seed, after_shape, block
    )
    parts = distributed.gather_to_main(part, ctx) or []
    merged = ComputeResult()
    for p in parts:
        merged.extend(p)
    return merged


def _comm(cfg: RunConfig, ctx: DistContext, notes: list[str]) -> list[CommSample]:
    ranks = comm_ranks(cfg, ctx)
    if ranks < 2:
        message = (
            f"collective benchmarks need at least 2 ranks (found {ranks}); "
            "run under torchrun or with --ranks 2 or more"
        )
        if cfg.mode == "comm":
            raise BenchError(message)
        log.warning("comm_skipped", reason=message)
        notes.append(f"collectives not measured: {message}")
        return []
    plan = CommPlan(
        payloads=SMALL_PAYLOADS if cfg.scale == "small" else FULL_PAYLOADS,
        device_type=cfg.device_type,
        **comm_timing(cfg),
    )
    log.info("comm_started", ranks=ranks, payloads=len(plan.payloads))
    result = distributed.run_phase(
        _comm_entry, plan, ctx, ranks, cfg.device_type, cfg.timeout_s, cfg.threads or 1
    )
    return list(result or [])


def _comm_entry(ctx: DistContext, plan: CommPlan) -> list[CommSample] | None:
    from shardmeter_bench.collectives.timing import comm_phase

    return comm_phase(ctx, plan)


def _fit_and_publish(
    cfg: RunConfig,
    gpu: GPUSpec,
    compute: ComputeResult,
    comm: list[CommSample],
    notes: list[str],
    attention_kernel: AttentionKernel | None = None,
) -> RunResult:
    intra, inter = default_links(gpu, cfg.device_type, cfg.intra_node_link, cfg.inter_node_link)
    if compute.oom_stops:
        notes.append(f"batch sweeps stopped by out-of-memory: {len(compute.oom_stops)} shapes")
    if compute.skipped:
        notes.append(f"shapes skipped (OOM at micro-batch 1): {', '.join(compute.skipped)}")
    doc = fit.fit(
        gpu=gpu,
        precision=cfg.precision_enum,
        intra_node=intra,
        inter_node=inter,
        compute=compute.compute,
        communication=comm,
        memory=compute.memory,
        pool=cfg.pool,
        device_type=cfg.device_type,
        notes=notes,
        attention_kernel=attention_kernel,
    )
    result = RunResult(doc=doc, summary=fit.fit_summary(doc))
    if cfg.mode != "validate":
        _write_and_publish(cfg, result)
    return result


def _write_and_publish(cfg: RunConfig, result: RunResult) -> None:
    """Write the document (``--out``, or the default file without ``--publish``) and patch the
    ConfigMap (``--publish``)."""
    doc = result.doc
    assert doc is not None
    if cfg.out or not cfg.publish:
        path = doc.write(cfg.out or "shardmeter-coefficients.json")
        result.outputs["coefficients"] = str(path)
        log.info("coefficients_written", path=str(path), fit_mape=doc.fit_mape())
    if cfg.publish:
        from shardmeter_bench.publish import parse_target, publish_configmap

        result.outputs["configmap"] = publish_configmap(
            doc, parse_target(cfg.publish), cfg.namespace
        )


def _judge_and_publish(cfg: RunConfig, result: RunResult) -> None:
    """``validate`` that measured: the document carries its verdict against the priors
    (`ValidationVerdict`) when it is written and published, so the operator can judge it."""
    verdict = (result.report or {}).get("verdict")
    if verdict is not None and result.doc is not None:
        judged = ValidationVerdict.model_validate(verdict)
        result.doc = result.doc.model_copy(update={"validation": judged})
        log.info("validation_verdict", beats_priors=judged.beats_priors, verdict=judged.describe())
    _write_and_publish(cfg, result)


def run(cfg: RunConfig, ctx: DistContext) -> RunResult:
    """Run one mode on this rank; rank 0's result carries the document and the report."""
    started = time.perf_counter()
    load_start = load_average()
    if load_start is not None and load_start > 0.5 * (os.cpu_count() or 1) and ctx.is_main:
        log.warning("background_load", load_1m=load_start, cpus=os.cpu_count())
    if ctx.launched:
        distributed.init(ctx, cfg.device_type, cfg.timeout_s)
    try:
        device = torch_device(cfg.device_type, ctx.local_rank)
        gpu, notes = device_spec(cfg, device) if ctx.is_main else (None, [])
        gpu = distributed.broadcast_from_main(gpu, ctx)
        assert gpu is not None
        result = RunResult()
        truth = None
        if cfg.mode == "validate":
            truth = validation_share(cfg, ctx)
        if cfg.measures:
            block = profiled_block(cfg, device)
            compute = (
                _profile(cfg, ctx, device, truth, block.name)
                if cfg.mode != "comm"
                else ComputeResult()
            )
            comm = _comm(cfg, ctx, notes) if cfg.mode != "compute" else []
            if ctx.is_main:
                if cfg.mode != "comm":
                    notes.append(block.note)
                kernel = block.attention_kernel if cfg.mode != "comm" else None
                result = _fit_and_publish(cfg, gpu, compute, comm, notes, kernel)
        elif ctx.is_main:
            assert cfg.coefficients is not None
            result.doc = CoefficientsDocument.read(cfg.coefficients)
            result.summary = fit.fit_summary(result.doc)
        if cfg.mode == "validate":
            meta = {
                "machine": machine_description(cfg, ctx),
                "host": platform.node(),
                "argv": list(cfg.argv),
                "load_1m_start": load_start,
            }
            result.report = run_validation(cfg, ctx, device, result.doc, meta, truth)
            if ctx.is_main and cfg.measures:
                _judge_and_publish(cfg, result)
            if result.report is not None:
                result.report["meta"]["wall_s"] = time.perf_counter() - started
                result.report["meta"]["load_1m_end"] = load_average()
                from shardmeter_bench.validation.report import write_report

                js, md = write_report(result.report, cfg.report_dir)
                result.outputs["report_json"], result.outputs["report_md"] = str(js), str(md)
        return result
    finally:
        if ctx.launched:
            # a launched rank ends through `distributed.exit_now` (``__main__``): leave Gloo's
            # groups to the process's end rather than tear them down
            distributed.shutdown(synchronise=True, destroy=not cfg.exits_after)
