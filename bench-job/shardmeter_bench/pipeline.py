"""The modes, end to end: ``compute`` (profile + fit, collectives from priors), ``comm``
(collectives + fit, compute from priors), ``all`` (both) and ``validate`` (``all``, or a
given ``--coefficients`` file, then the accuracy report). Fit and validation run in one
process lifetime because the host drifts over minutes.

Under a launcher the catalog is split across ranks (each profiles ``shapes[rank::world]``,
rank 0 gathers) and every rank joins the collectives; as a plain process compute runs here
and the distributed phases spawn ``--ranks`` local ranks.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from shardmeter.cost.coefficients import CoefficientsDocument, CommSample
from shardmeter.spec.hardware import GPUSpec, LinkSpec
from shardmeter.spec.model import TransformerSpec
from shardmeter.spec.training import Precision
from shardmeter_bench import distributed, fit
from shardmeter_bench.catalog import ScaleRange, generate_catalog, scale_range
from shardmeter_bench.comm import (
    FULL_PAYLOADS,
    SMALL_PAYLOADS,
    SMALL_VALIDATION_PAYLOADS,
    VALIDATION_PAYLOADS,
    CommPlan,
)
from shardmeter_bench.compute import ComputeResult, profile_catalog
from shardmeter_bench.device import cpu_model_name, cpu_spec, cuda_spec, default_links, torch_device
from shardmeter_bench.distributed import DistContext
from shardmeter_bench.errors import BenchError
from shardmeter_bench.logs import get_logger
from shardmeter_bench.unseen import interleave_schedule, unseen_cases
from shardmeter_bench.validate import (
    ValidationCase,
    measure_case,
    validation_cases,
    within_budget,
)

log = get_logger(__name__)


@dataclass(frozen=True)
class RunConfig:
    mode: str
    device_type: str = "cpu"
    scale: str = "full"
    configs: int | None = None
    repeats: int = 5
    seed: int = 0
    out: str | None = None
    publish: str | None = None
    namespace: str | None = None
    pool: str | None = None
    gpu: GPUSpec | None = None
    intra_node_link: LinkSpec | None = None
    inter_node_link: LinkSpec | None = None
    report_dir: str = "shardmeter-validation"
    ranks: int = 2
    threads: int | None = 1
    timeout_s: float = 600.0
    precision: str | None = None
    coefficients: str | None = None
    max_memory_gib: float | None = None
    """CPU: budget for the process's peak memory (None: the scale's own)."""
    exits_after: bool = False
    """The process ends (through `distributed.exit_now`) once the run returns."""
    argv: tuple[str, ...] = ()

    @property
    def precision_enum(self) -> Precision:
        if self.precision:
            return Precision(self.precision)
        return Precision.FP32 if self.device_type == "cpu" else Precision.BF16

    @property
    def element_bytes(self) -> int:
        return 2 if self.precision_enum is Precision.BF16 else 4

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.precision_enum is Precision.BF16 else torch.float32

    @property
    def scale_range(self) -> ScaleRange:
        """The catalog range, with ``--max-memory-gib`` as its budget on a CPU."""
        scale = scale_range(self.scale, self.device_type)
        if self.device_type == "cpu" and self.max_memory_gib is not None:
            scale = dataclasses.replace(scale, max_process_bytes=self.max_memory_gib * 2**30)
        return scale

    @property
    def max_process_bytes(self) -> float | None:
        """The memory budget validation models must fit (CPU only)."""
        return self.scale_range.max_process_bytes if self.device_type == "cpu" else None

    @property
    def measures(self) -> bool:
        """Whether this run profiles and fits (``validate`` with a file does not)."""
        return self.mode != "validate" or self.coefficients is None


@dataclass
class RunResult:
    doc: CoefficientsDocument | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] | None = None


VALIDATION_PASSES = 2
"""Each validation model is measured this many times, at different points of the catalog,
its timed iterations pooled: a host's page-fault cost moves with its free memory over
minutes (one pass once timed a model's backward 17 % fast), and two passes rarely both
land in the same state."""


@dataclass
class Interleaved:
    """Validation models measured between catalog shapes (``validate``): the cases this rank
    measures, each ``passes`` times, and the rows measured so far."""

    cases: list[ValidationCase]
    left_out: list[str] = field(default_factory=list)
    """Why models were not measured (the memory budget)."""
    passes: int = VALIDATION_PASSES
    rows: list[dict[str, Any]] = field(default_factory=list)
    measured: bool = False

    def repeats_per_pass(self, repeats: int) -> int:
        """Timed iterations of one pass: the run's ``--repeats`` shared out, at least 3."""
        return max(3, math.ceil(repeats / self.passes))

    def measure_all(self, device: torch.device, cfg: RunConfig) -> None:
        """Every pass now, one after the other (no catalog to interleave with)."""
        for j in range(self.passes * len(self.cases)):
            self.measure(j, device, cfg)
        self.measured = True

    def measure(self, j: int, device: torch.device, cfg: RunConfig) -> None:
        """Item ``j`` of the schedule: pass ``j // len(cases)`` of case ``j % len(cases)``."""
        case = self.cases[j % len(self.cases)]
        self.rows += measure_case(
            case, device, cfg.dtype, self.repeats_per_pass(cfg.repeats), cfg.seed
        )


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def machine_description(cfg: RunConfig, ctx: DistContext) -> str:
    if cfg.device_type == "cuda":
        return f"{torch.cuda.get_device_name(0)} × {ctx.world_size if ctx.launched else cfg.ranks}"
    return f"{cpu_model_name()}, {os.cpu_count()} cores, {cfg.threads or 'default'} thread(s)/rank"


def device_spec(cfg: RunConfig, device: torch.device) -> tuple[GPUSpec, list[str]]:
    if cfg.device_type == "cpu":
        return cpu_spec(torch.get_num_threads())
    return cuda_spec(cfg.gpu, device)


def comm_ranks(cfg: RunConfig, ctx: DistContext) -> int:
    if ctx.launched:
        return ctx.world_size
    if cfg.device_type == "cuda":
        return min(cfg.ranks, torch.cuda.device_count())
    return cfg.ranks


def validation_specs(cfg: RunConfig) -> list[TransformerSpec]:
    """Every architecture ``validate`` measures: the catalog never draws them."""
    return [c.spec for c in validation_cases(cfg.scale, cfg.device_type)] + [
        c.spec for c in unseen_cases(cfg.scale)
    ]


def _profile(
    cfg: RunConfig, ctx: DistContext, device: torch.device, truth: Interleaved | None
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
    part = profile_catalog(mine, scale, device, cfg.dtype, cfg.repeats, cfg.seed, after_shape)
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
    from shardmeter_bench.comm import comm_phase

    return comm_phase(ctx, plan)


def _fit_and_publish(
    cfg: RunConfig,
    gpu: GPUSpec,
    compute: ComputeResult,
    comm: list[CommSample],
    notes: list[str],
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
    )
    result = RunResult(doc=doc, summary=fit.fit_summary(doc))
    if cfg.out or not cfg.publish:
        path = doc.write(cfg.out or "shardmeter-coefficients.json")
        result.outputs["coefficients"] = str(path)
        log.info("coefficients_written", path=str(path), fit_mape=doc.fit_mape())
    if cfg.publish:
        from shardmeter_bench.publish import parse_target, publish_configmap

        result.outputs["configmap"] = publish_configmap(
            doc, parse_target(cfg.publish), cfg.namespace
        )
    return result


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
            compute = _profile(cfg, ctx, device, truth) if cfg.mode != "comm" else ComputeResult()
            comm = _comm(cfg, ctx, notes) if cfg.mode != "compute" else []
            if ctx.is_main:
                result = _fit_and_publish(cfg, gpu, compute, comm, notes)
        elif ctx.is_main:
            assert cfg.coefficients is not None
            result.doc = CoefficientsDocument.read(cfg.coefficients)
            result.summary = fit.fit_summary(result.doc)
        if cfg.mode == "validate":
            from shardmeter_bench.pipeline_validate import run_validation

            meta = {
                "machine": machine_description(cfg, ctx),
                "host": platform.node(),
                "argv": list(cfg.argv),
                "load_1m_start": load_start,
            }
            result.report = run_validation(cfg, ctx, device, result.doc, meta, truth)
            if result.report is not None:
                result.report["meta"]["wall_s"] = time.perf_counter() - started
                result.report["meta"]["load_1m_end"] = load_average()
                from shardmeter_bench.report import write_report

                js, md = write_report(result.report, cfg.report_dir)
                result.outputs["report_json"], result.outputs["report_md"] = str(js), str(md)
        return result
    finally:
        if ctx.launched:
            # a launched rank ends through `distributed.exit_now` (``__main__``): leave Gloo's
            # groups to the process's end rather than tear them down
            distributed.shutdown(synchronise=True, destroy=not cfg.exits_after)


def validation_share(cfg: RunConfig, ctx: DistContext) -> Interleaved:
    """This rank's share of the validation models (the unseen architectures, then the
    presets) that fit the memory budget."""
    cases, left_out = within_budget(
        unseen_cases(cfg.scale) + validation_cases(cfg.scale, cfg.device_type),
        cfg.max_process_bytes,
        cfg.element_bytes,
    )
    return Interleaved(cases[ctx.rank :: ctx.world_size] if ctx.launched else cases, left_out)


def validation_comm_plan(cfg: RunConfig) -> CommPlan:
    """Collectives at payloads between the fitted ones, inside the node."""
    return CommPlan(
        payloads=SMALL_VALIDATION_PAYLOADS if cfg.scale == "small" else VALIDATION_PAYLOADS,
        device_type=cfg.device_type,
        inter_node=False,
        **comm_timing(cfg),
    )


def comm_timing(cfg: RunConfig) -> dict[str, Any]:
    """Repeats and loop length of the collective timings. A full CPU run loops ≥ 0.1 s per
    repeat, 7 repeats: with 0.02 s × 5, Gloo's latency-bound payloads on this 2-core host
    varied 10–50 % from one measurement to the next (`benchmarks/bench_accuracy.py`)."""
    if cfg.device_type == "cpu" and cfg.scale == "full":
        return {"repeats": max(cfg.repeats, 7), "min_loop_s": 0.1, "max_ops": 2000}
    return {"repeats": max(cfg.repeats, 5)}
