"""Per-unit forward/backward times of one shape at one micro-batch, from ranges opened and
closed by module hooks (paper §III-A "Runtime profiling"): ``torch.profiler`` ranges on a GPU
(device time), a clock read in the hooks on a CPU (`device.compute_clock`).

Pitfalls handled here (each one measured on this code):

* **Block 0's backward.** A *full* backward hook fires once the gradients w.r.t. the
  module's inputs exist; if no input requires grad it fires as soon as the output gradient
  exists — before the module's backward ran. `blocks.UnitModel` makes block 0's input
  require grad. The embedding's input (token ids) never can, so its backward range is opened
  by a hook on its output gradient and closed by its weight's post-accumulate-grad hook.
* **Empty events.** With a profiler ``schedule`` the events of the active steps are only
  kept with ``acc_events=True``; without it ``events()`` comes back empty.
* **Slow first iteration.** The first iteration pays allocation and library set-up, and the
  first *profiled* one pays the profiler's; both are warm-ups (an unprofiled one and the
  schedule's ``warmup=1``) and never counted.
* **What a step pays.** On a GPU a range is timed by CUDA events recorded on the stream at
  its opening and closing hooks: the GPU time between them, kernels *and* the gaps where the
  GPU waited for the host to launch the next one (on an H200 the summed kernel time of real
  decoder layers was 47–57 % of their wall time for a 360M-class model, 90–99 % for 7B-class
  and up). Iterations start and end synchronised. The summed device time of the kernels a
  range launched (``torch.profiler``) is kept as a diagnostic only, from one extra profiled
  iteration at the sweep's first micro-batch (the profiler slows the host, which would
  inflate exactly the gaps the events measure). On a CPU the ops run inside the hooks'
  thread, so the range is timed by `device.compute_clock` read in the hooks — no profiler,
  whose per-op bookkeeping the models validated against do not pay. Each target's time is
  the median over repeats (and blocks).
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile, schedule

from shardmeter.cost.features import Target
from shardmeter_bench.compute.blocks import UnitModel
from shardmeter_bench.device import compute_clock, synchronize, timed_repeats

RANGE_PREFIX = "shardmeter|"
_TARGETS = {
    ("embedding", "fwd"): Target.EMBEDDING_FORWARD,
    ("embedding", "bwd"): Target.EMBEDDING_BACKWARD,
    ("block", "fwd"): Target.BLOCK_FORWARD,
    ("block", "bwd"): Target.BLOCK_BACKWARD,
    ("head", "fwd"): Target.HEAD_FORWARD,
    ("head", "bwd"): Target.HEAD_BACKWARD,
}


class RangeRecorder:
    """Ranges ``<unit>|<fwd|bwd>|<iteration>`` driven by hooks: profiler ranges (named
    ``shardmeter|…``) without a ``clock``; with one, the clock's elapsed time per range in
    ``seconds`` (what a CPU run uses)."""

    def __init__(self, clock: Callable[[], float] | None = None, events: bool = False) -> None:
        self.iteration = 0
        self.clock = clock
        self.events = events
        """CUDA events recorded on the current stream instead of profiler ranges."""
        self.seconds: dict[tuple[str, str, int], float] = {}
        self._open: dict[tuple[str, str], Any] = {}
        self._pairs: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._handles: list[Any] = []

    def _enter(self, unit: str, phase: str) -> None:
        if self.clock is not None:
            self._open[(unit, phase)] = self.clock()
            return
        if self.events:
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            self._open[(unit, phase)] = start
            return
        rf = record_function(f"{RANGE_PREFIX}{unit}|{phase}|{self.iteration}")
        rf.__enter__()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        self._open[(unit, phase)] = rf

    def _exit(self, unit: str, phase: str) -> None:
        opened = self._open.pop((unit, phase), None)
        if opened is None:
            return
        if self.clock is not None:
            self.seconds[(unit, phase, self.iteration)] = self.clock() - opened
        elif self.events:
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end.record()
            self._pairs[(unit, phase, self.iteration)] = (opened, end)
        else:
            opened.__exit__(None, None, None)

    def event_seconds(self) -> dict[tuple[str, str, int], float]:
        """Seconds per range from the recorded event pairs (call after synchronising)."""
        out = {key: start.elapsed_time(end) * 1e-3 for key, (start, end) in self._pairs.items()}
        self._pairs.clear()
        return out

    def _unit_hooks(self, unit: str, module: torch.nn.Module) -> list[Any]:
        """Open and close ``unit``'s forward and backward ranges around ``module``."""

        def forward_pre(_m: Any, _a: Any) -> None:
            self._enter(unit, "fwd")

        def forward(_m: Any, _a: Any, _o: Any) -> None:
            self._exit(unit, "fwd")

        def backward_pre(_m: Any, _g: Any) -> None:
            self._enter(unit, "bwd")

        def backward(_m: Any, _gi: Any, _go: Any) -> None:
            self._exit(unit, "bwd")

        return [
            module.register_forward_pre_hook(forward_pre),
            module.register_forward_hook(forward),
            module.register_full_backward_pre_hook(backward_pre),
            module.register_full_backward_hook(backward),
        ]

    def attach(self, model: UnitModel) -> RangeRecorder:
        units: list[tuple[str, torch.nn.Module]] = [
            *((f"block{i}", b) for i, b in enumerate(model.blocks)),
            ("head", model.head),
        ]
        for unit, module in units:
            self._handles += self._unit_hooks(unit, module)
        emb = model.embedding

        def emb_forward(_m: Any, _a: Any, out: torch.Tensor) -> None:
            self._exit("embedding", "fwd")
            if out.requires_grad:
                out.register_hook(  # type: ignore[no-untyped-call]  # unannotated in torch
                    lambda _g: self._enter("embedding", "bwd")
                )

        self._handles += [
            emb.register_forward_pre_hook(lambda _m, _a: self._enter("embedding", "fwd")),
            emb.register_forward_hook(emb_forward),
        ]
        if emb.weight.requires_grad:
            self._handles.append(
                emb.weight.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                    lambda _p: self._exit("embedding", "bwd")
                )
            )
        return self

    def close_all(self) -> None:
        for key in list(self._open):
            self._exit(*key)

    def detach(self) -> None:
        self.close_all()
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _parse(name: str) -> tuple[str, str, int] | None:
    if not name.startswith(RANGE_PREFIX):
        return None
    unit, phase, iteration = name[len(RANGE_PREFIX) :].split("|")
    return unit, phase, int(iteration)


def range_seconds(events: Any, device_type: str) -> dict[tuple[str, str, int], float]:
    """Seconds per (unit, phase, iteration) range from profiler events (see module doc)."""
    ranges: dict[tuple[str, str, int], float] = {}
    spans: dict[int, list[tuple[int, int, tuple[str, str, int]]]] = defaultdict(list)
    for e in events:
        key = _parse(e.name)
        if key is None:
            continue
        if device_type == "cpu":
            ranges[key] = e.time_range.elapsed_us() * 1e-6
        else:
            ranges[key] = 0.0
            spans[e.thread].append((e.time_range.start, e.time_range.end, key))
    if device_type == "cpu":
        return ranges
    for thread_spans in spans.values():
        thread_spans.sort()
    starts = {t: [s[0] for s in v] for t, v in spans.items()}
    for e in events:
        kernels = getattr(e, "kernels", None)
        if not kernels or e.thread not in spans or _parse(e.name) is not None:
            continue
        i = bisect.bisect_right(starts[e.thread], e.time_range.start) - 1
        if i < 0:
            continue
        start, end, key = spans[e.thread][i]
        if start <= e.time_range.start <= end:
            ranges[key] += sum(k.duration for k in kernels) * 1e-6
    return ranges


def cpu_peak_bytes(prof: Any) -> float:
    """Peak of the running sum of allocations minus frees in a ``profile_memory`` run."""
    deltas = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )
    running = peak = 0.0
    for _, nbytes in deltas:
        running += nbytes
        peak = max(peak, running)
    return peak


@dataclass
class ShapeProfile:
    """Median seconds per target, the raw per-range seconds, and the step's peak memory."""

    seconds: dict[Target, float]
    raw: dict[Target, list[float]] = field(default_factory=dict)
    peak_bytes: float = 0.0
    ranges: dict[tuple[str, str, int], float] = field(default_factory=dict)
    """Seconds per (unit, phase, iteration), e.g. ``("block0", "bwd", 3)``."""
    kernel_seconds: dict[Target, float] = field(default_factory=dict)
    """GPU only, when asked for: the summed device time of the kernels each target launched
    (median), a diagnostic beside ``seconds`` (which includes the launch gaps)."""


def _memory_peak(model: UnitModel, step: Any, device: torch.device) -> float:
    """Peak allocated during one fwd+bwd minus what was allocated before it, with gradient
    buffers already allocated (so they are part of the baseline, not of the peak)."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        return float(torch.cuda.max_memory_allocated(device) - base)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    return cpu_peak_bytes(prof)


def _clocked_iterations(
    model: UnitModel, step: Callable[[], None], recorder: RangeRecorder, repeats: int
) -> dict[tuple[str, str, int], float]:
    """CPU: ``repeats`` timed iterations (1 … repeats) after the warm-ups."""
    recorder.seconds.clear()
    for k in range(1, repeats + 1):
        recorder.iteration = k
        step()
        model.zero_grad(set_to_none=True)
    return dict(recorder.seconds)


def _event_iterations(
    model: UnitModel,
    step: Callable[[], None],
    recorder: RangeRecorder,
    repeats: int,
    device: torch.device,
) -> dict[tuple[str, str, int], float]:
    """GPU: ``repeats`` iterations (1 … repeats), each started and ended synchronised, its
    ranges timed by CUDA events (what the step pays, launch gaps included)."""
    ranges: dict[tuple[str, str, int], float] = {}
    for k in range(1, repeats + 1):
        recorder.iteration = k
        synchronize(device)
        step()
        model.zero_grad(set_to_none=True)
        synchronize(device)
        ranges.update(recorder.event_seconds())
    return ranges


def _profiled_iterations(
    model: UnitModel,
    step: Callable[[], None],
    recorder: RangeRecorder,
    repeats: int,
    device: torch.device,
) -> dict[tuple[str, str, int], float]:
    """GPU: the profiler's schedule (``warmup=1`` is iteration 0), then ``repeats`` active."""
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=0, warmup=1, active=repeats, repeat=1),
        acc_events=True,
    ) as prof:
        for k in range(repeats + 1):
            recorder.iteration = k
            step()
            model.zero_grad(set_to_none=True)
            synchronize(device)
            prof.step()
    return range_seconds(prof.events(), device.type)


def _by_target(ranges: dict[tuple[str, str, int], float]) -> dict[Target, list[float]]:
    raw: dict[Target, list[float]] = defaultdict(list)
    for (unit, phase, _), seconds in sorted(ranges.items()):
        kind = "block" if unit.startswith("block") else unit
        raw[_TARGETS[(kind, phase)]].append(seconds)
    return raw


def profile_shape(
    model: UnitModel,
    micro_batch: int,
    seq_len: int,
    repeats: int,
    seed: int = 0,
    measure_memory: bool = True,
    kernel_diagnostic: bool = False,
) -> ShapeProfile:
    """Warm up, measure peak memory once, then time ``repeats`` training iterations (on a
    CPU more for a fast shape, `device.timed_repeats`); on a GPU with ``kernel_diagnostic``
    one more, profiled, for the summed kernel time of each target."""
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    vocab = model.spec.vocab_size
    ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=gen).to(device)
    labels = torch.randint(0, vocab, (micro_batch, seq_len), generator=gen).to(device)

    def step() -> None:
        model(ids, labels).backward()

    clock = compute_clock(device) if device.type == "cpu" else None
    recorder = RangeRecorder(clock, events=device.type == "cuda").attach(model)
    kernels: dict[tuple[str, str, int], float] = {}
    try:
        step()  # warm-up 1: allocator, oneDNN/cuBLAS set-up; leaves gradients allocated
        peak = _memory_peak(model, step, device) if measure_memory else 0.0
        model.zero_grad(set_to_none=True)
        if clock is not None:
            started = clock()
            step()  # warm-up 2, timed: how many iterations make a steady median
            model.zero_grad(set_to_none=True)
            repeats = timed_repeats(repeats, clock() - started)
            ranges = _clocked_iterations(model, step, recorder, repeats)
        else:
            ranges = _event_iterations(model, step, recorder, repeats, device)
    finally:
        recorder.detach()
    if kernel_diagnostic and device.type == "cuda":
        profiler = RangeRecorder().attach(model)
        try:
            kernels = _profiled_iterations(model, step, profiler, 1, device)
        finally:
            profiler.detach()
    raw = _by_target(ranges)
    medians = {t: statistics.median(v) for t, v in raw.items() if v}
    kernel_medians = {t: statistics.median(v) for t, v in _by_target(kernels).items() if v}
    return ShapeProfile(
        seconds=medians,
        raw=dict(raw),
        peak_bytes=peak,
        ranges=ranges,
        kernel_seconds=kernel_medians,
    )
