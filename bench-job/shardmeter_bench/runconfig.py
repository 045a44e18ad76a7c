"""What a run is: its configuration (`RunConfig`) and result, and the choices the run's phases
share — the ranks of the collectives, the validation models this rank measures (interleaved
with the catalog), the collective timings — for `shardmeter_bench.pipeline` (fit) and
`shardmeter_bench.pipeline_validate` (the accuracy report), which both import it."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.spec.hardware import GPUSpec, LinkSpec
from shardmeter.spec.model import TransformerSpec
from shardmeter.spec.training import AttentionKernel, Precision
from shardmeter_bench.collectives.distributed import DistContext
from shardmeter_bench.collectives.timing import (
    SMALL_VALIDATION_PAYLOADS,
    VALIDATION_PAYLOADS,
    CommPlan,
)
from shardmeter_bench.compute import titan_block
from shardmeter_bench.compute.catalog import ScaleRange, scale_range
from shardmeter_bench.compute.sweep import REFERENCE_BLOCK, TORCHTITAN_BLOCK
from shardmeter_bench.device import cpu_model_name, cpu_spec, cuda_spec
from shardmeter_bench.errors import BenchError
from shardmeter_bench.isolation import isolated
from shardmeter_bench.validation.measure import (
    ValidationCase,
    measure_case,
    validation_cases,
    within_budget,
)
from shardmeter_bench.validation.unseen import unseen_cases


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
    block: str = "auto"
    """The profiled block: ``reference`` (`compute.blocks`), ``torchtitan`` (torchtitan's
    Llama 3 block with the attention it runs, `compute.titan_block`) or ``auto``
    (torchtitan's on CUDA where it imports, else the reference)."""
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
        repeats = self.repeats_per_pass(cfg.repeats)
        self.rows += isolated(
            device, case.key, measure_case, case, device, cfg.dtype, repeats, cfg.seed
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
        return isolated(device, "the device probes", cpu_spec, torch.get_num_threads())
    return cuda_spec(cfg.gpu, device)


@dataclass(frozen=True)
class ProfiledBlock:
    """Which block the catalog profiles, the attention kernel its document records, and the
    note that says so."""

    name: str
    attention_kernel: AttentionKernel | None
    note: str


def profiled_block(cfg: RunConfig, device: torch.device) -> ProfiledBlock:
    """Resolve ``--block`` on ``device`` (`RunConfig.block`); BenchError when torchtitan's
    block is asked for and cannot be built here."""
    wants = cfg.block == TORCHTITAN_BLOCK or (cfg.block == "auto" and device.type == "cuda")
    why = titan_block.unavailable() if wants else None
    if cfg.block == TORCHTITAN_BLOCK and why is not None:
        raise BenchError(f"--block torchtitan: {why}; use --block reference")
    if not wants or why is not None:
        kernel = AttentionKernel.CUDNN if device.type == "cuda" else None
        how = (
            "SDPA in torchtitan's ScaledDotProductAttention order (cuDNN first)"
            if device.type == "cuda"
            else "SDPA's CPU kernel"
        )
        reason = f" ({why})" if why is not None and cfg.block == "auto" else ""
        return ProfiledBlock(
            REFERENCE_BLOCK,
            kernel,
            f"compute: profiled the reference Llama block, attention through {how}{reason}",
        )
    backend, kernel = titan_block.backend(device)
    how = (
        "FlexAttention compiled by torchtitan (attn_backend flex), what torchtitan's Llama 3 runs"
        if backend == "flex"
        else "torchtitan's ScaledDotProductAttention (FlexAttention has no backward on a CPU)"
    )
    return ProfiledBlock(
        TORCHTITAN_BLOCK,
        kernel,
        f"compute: profiled torchtitan 0.3.0's Llama3TransformerBlock, attention: {how}",
    )


def comm_ranks(cfg: RunConfig, ctx: DistContext) -> int:
    if ctx.launched:
        return ctx.world_size
    if cfg.device_type == "cuda":
        return min(cfg.ranks, torch.cuda.device_count())
    return cfg.ranks


def validation_specs(cfg: RunConfig) -> list[TransformerSpec]:
    """Every architecture ``validate`` measures: the catalog never draws them."""
    return [c.spec for c in validation_cases(cfg.scale, cfg.device_type)] + [
        c.spec for c in unseen_cases(cfg.scale, cfg.device_type)
    ]


def validation_share(cfg: RunConfig, ctx: DistContext) -> Interleaved:
    """This rank's share of the validation models (the unseen architectures, then the
    presets) that fit the memory budget."""
    cases, left_out = within_budget(
        unseen_cases(cfg.scale, cfg.device_type) + validation_cases(cfg.scale, cfg.device_type),
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
