"""The device under test: availability checks, timing helpers, out-of-memory detection,
and the `GPUSpec` written into the coefficients document.

On a GPU the spec is a datasheet preset (``--gpu``, else recognised from the device name,
else built from the device's properties and probes). On a CPU there is no datasheet: the
spec is named ``cpu-<arch>-<threads>t``; its peak FP32/BF16 FLOP/s come from a matmul probe
(best of several, +5 % headroom, so the roofline guard never clamps an honest prediction),
memory from the system RAM and memory bandwidth from a copy probe.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import torch

from shardmeter.spec.hardware import GPU_LOOKUP, LINK_PRESETS, GPUSpec, LinkKind, LinkSpec
from shardmeter_bench.errors import DeviceUnavailableError

CPU_NOMINAL_WATTS_PER_THREAD = 10.0
"""No datasheet TDP exists for "n threads of this CPU"; a nominal figure (stated in notes)."""
PROBE_HEADROOM = 1.05


@functools.cache
def _glibc() -> Any:
    """This process's glibc through ctypes, or None (another libc, or not loadable)."""
    if platform.libc_ver()[0] != "glibc":
        return None
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Hand the heap's free pages back to the OS (``malloc_trim``) once a phase is over —
    after each shape and model, and before spawning ranks — so what the next one needs is
    free. The allocator is otherwise left as a training process has it (glibc's defaults:
    large blocks are mapped and unmapped, so every iteration page-faults its fresh gradient
    buffers, a cost in parameters the ``p_block``/``v_h`` features carry); that every
    measurement starts from the same heap is `isolation`'s job. glibc only; returns whether
    anything was released."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))


def peak_rss_bytes() -> int:
    """The peak resident memory so far of this process or of any child it waited for (the
    kernel's ``ru_maxrss``; 0 where the platform has none) — on a CPU each shape and model is
    measured in a child (`isolation`) — logged after every shape and model to see what a
    budget must hold."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Linux
        return 0
    scale = 1 if platform.system() == "Darwin" else 1024  # bytes on macOS, KiB on Linux
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return int(max(own, children)) * scale


def check_device(device_type: str) -> None:
    """Fail early and clearly when ``--device cuda`` cannot be honoured."""
    if device_type == "cuda" and not torch.cuda.is_available():
        built = "with" if torch.version.cuda else "without"
        raise DeviceUnavailableError(
            f"--device cuda was asked but no CUDA device is available "
            f"(torch {torch.__version__}, built {built} CUDA); use --device cpu or run on a GPU node"
        )


def torch_device(device_type: str, local_rank: int = 0) -> torch.device:
    return torch.device(device_type, local_rank) if device_type == "cuda" else torch.device("cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_oom(exc: BaseException) -> bool:
    """CUDA OOM, or a CPU allocation failure (which torch raises as a plain RuntimeError)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text.lower()
    )


def release_memory(device: torch.device) -> None:
    """After a model is dropped: collect it and give its memory back (the CUDA cache, or on a
    CPU the heap's free pages) so the next shape or the next ranks can use it."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        release_freed_memory()


def compute_clock(device: torch.device) -> Callable[[], float]:
    """The clock compute is timed with: on a CPU running one intra-op thread, this thread's
    CPU time (user + system, page faults included), which other processes on a shared host
    cannot inflate by taking the core — the wall time a dedicated host would show; otherwise
    (GPUs, several threads) the wall clock. Fit and validation use the same clock."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


MIN_TIMED_S = 2.0
"""Timed iterations of one measurement last at least this long together (fast shapes get
more than ``--repeats``, up to `MAX_REPEAT_FACTOR` times as many): the median of 5 iterations
of a 50 ms unit moved ±5 % from one measurement to the next on a shared host."""
MAX_REPEAT_FACTOR = 4


def timed_repeats(repeats: int, iteration_s: float) -> int:
    """How many iterations to time: ``repeats``, or more for an iteration this short."""
    wanted = math.ceil(MIN_TIMED_S / max(iteration_s, 1e-6))
    return max(repeats, min(wanted, MAX_REPEAT_FACTOR * repeats))


def best_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Fastest of ``repeats`` calls after one warm-up, on `compute_clock` (a probe timed on
    the wall clock of a loaded host read 48 GFLOP/s for a 117 GFLOP/s core, and the fit's
    FLOP floors would then have forced every prediction 2× too slow)."""
    clock = compute_clock(device)
    fn()
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        synchronize(device)
        best = min(best, clock() - start)
    return best


def probe_peak_flops(device: torch.device, dtype: torch.dtype, n: int = 2048) -> float:
    """Best achieved dense matmul FLOP/s (× headroom)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    seconds = best_seconds(lambda: a @ b, device, repeats=5 if device.type == "cpu" else 20)
    return PROBE_HEADROOM * 2.0 * n**3 / seconds


def probe_bandwidth(device: torch.device, mib: int = 256) -> float:
    """Copy bandwidth (read + write) in bytes/s."""
    src = torch.empty(mib * 2**18, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = best_seconds(lambda: dst.copy_(src), device, repeats=5)
    return 2.0 * src.numel() * 4 / seconds


def system_memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_spec(threads: int) -> tuple[GPUSpec, list[str]]:
    device = torch.device("cpu")
    fp32 = probe_peak_flops(device, torch.float32)
    bf16 = probe_peak_flops(device, torch.bfloat16, n=1024)
    bandwidth = probe_bandwidth(device)
    spec = GPUSpec(
        name=f"cpu-{platform.machine()}-{threads}t",
        memory_bytes=system_memory_bytes(),
        peak_bf16_flop_per_s=bf16,
        peak_fp32_flop_per_s=fp32,
        hbm_bandwidth_bytes_per_s=bandwidth,
        tdp_watts=CPU_NOMINAL_WATTS_PER_THREAD * threads,
        default_intra_node_link="pcie4",
        default_inter_node_link="eth-100g",
    )
    notes = [
        f"device: {cpu_model_name()}, {threads} thread(s) per rank; peak FP32 "
        f"{fp32 / 1e9:.1f} GFLOP/s and BF16 {bf16 / 1e9:.1f} GFLOP/s from a matmul probe "
        f"(+{(PROBE_HEADROOM - 1) * 100:.0f} % headroom), memory bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s from a copy probe, nominal TDP",
    ]
    return spec, notes


_NAME_TO_PRESET = (
    ("H200", "h200-141gb-sxm"),
    ("H100", "h100-80gb-sxm"),
    ("A100", "a100-80gb-sxm"),
    ("L40S", "l40s"),
)


def cuda_spec(given: GPUSpec | None, device: torch.device) -> tuple[GPUSpec, list[str]]:
    """``--gpu`` (a preset or the pool's spec), else the preset matching the device name,
    else probed figures."""
    if given is not None:
        return given, [f"device: {torch.cuda.get_device_name(device)} as --gpu {given.name}"]
    name = torch.cuda.get_device_name(device)
    props = torch.cuda.get_device_properties(device)
    for marker, key in _NAME_TO_PRESET:
        if marker in name.upper() and "PCIE" not in name.upper():
            if key.startswith("a100") and props.total_memory < 70 * 2**30:
                break
            return GPU_LOOKUP[key], [f"device: {name}, recognised as preset {key}"]
    fp32 = probe_peak_flops(device, torch.float32, n=8192)
    bf16 = probe_peak_flops(device, torch.bfloat16, n=8192)
    spec = GPUSpec(
        name=name.replace("NVIDIA ", "")[:63] or "gpu",
        memory_bytes=int(props.total_memory),
        peak_bf16_flop_per_s=bf16,
        peak_fp32_flop_per_s=fp32,
        hbm_bandwidth_bytes_per_s=probe_bandwidth(device, mib=1024),
        tdp_watts=400.0,
        default_intra_node_link="pcie4",
        default_inter_node_link="eth-100g",
    )
    return spec, [f"device: {name} has no preset; peaks from probes, nominal TDP 400 W"]


def loopback_link() -> LinkSpec:
    """What Gloo ranks on one CPU host talk over (the label of the intra-node fit)."""
    return LinkSpec(
        name="gloo-loopback",
        kind=LinkKind.PCIE,
        latency_s=20e-6,
        bandwidth_bytes_per_s=2e9,
    )


def default_links(
    gpu: GPUSpec, device_type: str, intra: LinkSpec | None, inter: LinkSpec | None
) -> tuple[LinkSpec, LinkSpec]:
    """The links the fit is labelled with: the given ones, else the GPU's defaults (Gloo's
    loopback inside a CPU host)."""
    if intra is None:
        cpu = device_type == "cpu"
        intra = loopback_link() if cpu else LINK_PRESETS[gpu.default_intra_node_link]
    return intra, inter or LINK_PRESETS[gpu.default_inter_node_link]
