"""Compose the cost model with the simulators: an island's step time at any gradient
accumulation, and the DiLoCo level across islands with settings resolved from the strategy.
Shared by ``shardmeter simulate``, the optimizer and the operator."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from shardmeter.cost.model import CostModel
from shardmeter.cost.outer_precision import wire_bytes_per_value
from shardmeter.sim.diloco import (
    DiLoCoResult,
    IslandSteps,
    fragment_params,
    simulate_diloco,
)
from shardmeter.sim.fsdp import (
    DEFAULT_MAX_INFLIGHT,
    FSDPDurations,
    StepResult,
    fsdp_step_seconds,
    simulate_fsdp_step,
)
from shardmeter.sim.outer import OuterLink
from shardmeter.sim.settings import (
    GuardRails,
    SettingsChoice,
    choose_blocking_sync_every,
    choose_sync_every,
    search_settings,
)
from shardmeter.spec.model import TransformerSpec
from shardmeter.spec.training import GradientSync, StrategyKind, StrategySpec


@dataclass(frozen=True)
class IslandShape:
    """N nodes × G GPUs per node of one pool."""

    nodes: int
    gpus_per_node: int

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    def __str__(self) -> str:
        return f"{self.nodes}×{self.gpus_per_node}"


def first_steps_s(
    durations: FSDPDurations, max_inflight: int, gradient_sync: GradientSync
) -> tuple[float, float, float]:
    """Simulated step seconds at accumulation 1, 2 and 3 (see `IslandStepModel`)."""
    return tuple(  # type: ignore[return-value]
        fsdp_step_seconds(durations, a, max_inflight, gradient_sync) for a in (1, 2, 3)
    )


def extrapolated_step_s(first: tuple[float, float, float], accumulation: int) -> float:
    """T(A) = T(2) + (A − 2)·(T(3) − T(2)) for A ≥ 2 (see `IslandStepModel`)."""
    t1, t2, t3 = first
    if accumulation <= 2:
        return t1 if accumulation == 1 else t2
    return t2 + (accumulation - 2) * (t3 - t2)


def resolved_gradient_sync(cm: CostModel, gradient_sync: GradientSync | None) -> GradientSync:
    """The mode a step is simulated with: the argument, else the training spec's; ``auto``
    (a planner decision) counts as FSDP2's default, every-micro-batch, until resolved."""
    mode = gradient_sync or cm.training.gradient_sync
    return GradientSync.EVERY_MICRO_BATCH if mode is GradientSync.AUTO else mode


class IslandStepModel:
    """Step time of one island shape at one micro-batch, for any accumulation A.

    The FSDP graph of A micro-steps repeats the same micro-step pattern, so after a short
    transient every extra micro-step adds the same time. The increments are constant from the
    second micro-step on (the first may differ when the prefetch bound interacts with the
    optimizer tail), so three simulations give every A exactly:
    T(A) = T(2) + (A − 2)·(T(3) − T(2)) for A ≥ 2. A property test holds this against full
    simulations of random graphs; the optimizer relies on it to stay fast.

    ``gradient_sync`` selects the FSDP gradient-accumulation mode (default: the training
    spec's; ``auto`` → every-micro-batch). To let a planner weigh both modes, build one model
    per mode and check memory with ``cm.max_micro_batch(..., gradient_sync=mode)``;
    `best_gradient_sync` does exactly that for one configuration.
    """

    def __init__(
        self,
        cm: CostModel,
        shape: IslandShape,
        micro_batch: int,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        gradient_sync: GradientSync | None = None,
    ) -> None:
        self.cm = cm
        self.shape = shape
        self.micro_batch = micro_batch
        self.max_inflight = max_inflight
        self.gradient_sync = resolved_gradient_sync(cm, gradient_sync)
        self.durations = FSDPDurations.from_cost_model(
            cm, shape.nodes, shape.gpus_per_node, micro_batch
        )

    @cached_property
    def _first_steps(self) -> tuple[float, float, float]:
        return first_steps_s(self.durations, self.max_inflight, self.gradient_sync)

    @property
    def increment_s(self) -> float:
        """What each micro-step beyond the second adds."""
        _, t2, t3 = self._first_steps
        return t3 - t2

    def step_s(self, accumulation: int) -> float:
        return extrapolated_step_s(self._first_steps, accumulation)

    def simulate(self, accumulation: int) -> StepResult:
        return simulate_fsdp_step(
            self.durations, accumulation, self.max_inflight, self.gradient_sync
        )

    def fits(self, accumulation: int, outer_state_on_gpu: bool = False) -> bool:
        """Whether this configuration fits in GPU memory in this gradient-sync mode."""
        return self.cm.memory(
            self.shape.ranks,
            self.micro_batch,
            accumulation,
            outer_state_on_gpu,
            gradient_sync=self.gradient_sync,
            gpus_per_node=self.shape.gpus_per_node,
        ).fits

    def tokens_per_step(self, accumulation: int) -> int:
        return accumulation * self.micro_batch * self.shape.ranks * self.cm.training.seq_len_tokens

    def mfu(self, accumulation: int) -> float:
        flops = accumulation * self.cm.model_flops_per_micro_step(self.micro_batch)
        return flops / (self.step_s(accumulation) * self.cm.peak_flop_per_s)


def best_gradient_sync(
    cm: CostModel,
    shape: IslandShape,
    micro_batch: int,
    accumulation: int,
    outer_state_on_gpu: bool = False,
    max_inflight: int = DEFAULT_MAX_INFLIGHT,
) -> IslandStepModel | None:
    """For ``gradientSync: auto``: the faster of the two modes that fits in memory (ties go to
    every-micro-batch, FSDP2's default), or None when neither fits."""
    best: IslandStepModel | None = None
    for mode in (GradientSync.EVERY_MICRO_BATCH, GradientSync.LAST_MICRO_BATCH):
        model = IslandStepModel(cm, shape, micro_batch, max_inflight, mode)
        if not model.fits(accumulation, outer_state_on_gpu):
            continue
        if best is None or model.step_s(accumulation) < best.step_s(accumulation):
            best = model
    return best


@dataclass(frozen=True)
class DiLoCoIsland:
    """An island at the DiLoCo level: its cost model, shape and inner step time."""

    name: str
    cm: CostModel
    shape: IslandShape
    step_s: float


@dataclass(frozen=True)
class DiLoCoOutcome:
    choice: SettingsChoice
    result: DiLoCoResult
    link: OuterLink
    fragment_all_reduce_s: tuple[float, ...]


def outer_payload_bytes(model: TransformerSpec, strategy: StrategySpec, params: float) -> float:
    """Bytes of ``params`` pseudo-gradient values on the wire in the strategy's outer
    precision (`shardmeter.cost.outer_precision`)."""
    return params * wire_bytes_per_value(strategy.outer_precision, model.hidden_size)


def fragment_all_reduce_seconds(
    model: TransformerSpec, strategy: StrategySpec, link: OuterLink, islands: int, fragments: int
) -> list[float]:
    payload = [
        outer_payload_bytes(model, strategy, p)
        for p in fragment_params(model, fragments, strategy.fragment_layout)
    ]
    return [link.all_reduce_seconds(d, islands) for d in payload]


def fragment_outer_step_seconds(
    cm: CostModel, model: TransformerSpec, strategy: StrategySpec, ranks: int, fragments: int
) -> list[float]:
    """The outer optimizer step (and merge) of each of ``fragments`` fragments on one rank of
    an island of ``ranks``: one `CostModel.outer_step_seconds` call per fragment, as torchft
    steps each fragment's outer optimizer on its own."""
    return [
        cm.outer_step_seconds(p, ranks, strategy.outer_state_on_gpu, strategy.outer_precision)
        for p in fragment_params(model, fragments, strategy.fragment_layout)
    ]


def outer_step_seconds_by_fragments(
    cm: CostModel, model: TransformerSpec, strategy: StrategySpec, ranks: int, counts: int
) -> list[float]:
    """Index F − 1 (F = 1 … ``counts``): the outer optimizer steps of one outer step with the
    model cut into F fragments — the sum, in fragment order, of `fragment_outer_step_seconds`,
    which is what `simulate_islands` puts on an island's compute stream per outer step. Each
    fragment's call pays the optimizer step's per-call intercept (1 ms on the case study's
    pools), so the sum grows with F.
    (Fragment sizes repeat across counts; each distinct size is costed once.)"""
    memo: dict[int, float] = {}

    def one(p: int) -> float:
        if p not in memo:
            memo[p] = cm.outer_step_seconds(
                p, ranks, strategy.outer_state_on_gpu, strategy.outer_precision
            )
        return memo[p]

    return [
        sum(one(p) for p in fragment_params(model, f, strategy.fragment_layout))
        for f in range(1, counts + 1)
    ]


def islands_outer_step_seconds(
    model: TransformerSpec, strategy: StrategySpec, islands: Sequence[DiLoCoIsland]
) -> Callable[[int], float]:
    """``outer(F)``: the slowest island's outer optimizer steps per outer step with F
    fragments (`outer_step_seconds_by_fragments`), as the settings rules take it."""
    memo: dict[int, float] = {}

    def outer(fragments: int) -> float:
        if fragments not in memo:
            memo[fragments] = max(
                sum(
                    fragment_outer_step_seconds(isl.cm, model, strategy, isl.shape.ranks, fragments)
                )
                for isl in islands
            )
        return memo[fragments]

    return outer


def resolve_settings(
    model: TransformerSpec,
    strategy: StrategySpec,
    link: OuterLink,
    islands: int,
    step_s: float,
    outer_step_s: float | Callable[[int], float] = 0.0,
) -> SettingsChoice:
    """Concrete H, F, τ for ``strategy`` (``auto`` values searched, fixed ones honoured).
    ``outer_step_s``: the outer optimizer steps per outer step, by fragment count
    (`islands_outer_step_seconds`), which the blocking case weighs with the blocking."""

    def all_reduce(f: int) -> list[float]:
        return fragment_all_reduce_seconds(model, strategy, link, islands, f)

    h = strategy.sync_every if isinstance(strategy.sync_every, int) else None
    if strategy.kind is StrategyKind.DILOCO:
        if h is None:
            h = choose_blocking_sync_every(
                step_s, all_reduce(1)[0], max_sync_every=strategy.max_sync_every
            )
        return search_settings(h, step_s, all_reduce, 1, fragments=1, fragment_sync_delay=0)
    f = strategy.fragments if isinstance(strategy.fragments, int) else None
    fragment_sync_delay = (
        strategy.fragment_sync_delay if isinstance(strategy.fragment_sync_delay, int) else None
    )
    rails = GuardRails.of(strategy, model.num_layers)
    if h is None:
        choice = choose_sync_every(
            step_s,
            all_reduce,
            model.num_layers,
            f,
            fragment_sync_delay,
            max_sync_every=rails.max_sync_every,
            max_fragment_sync_delay=rails.max_fragment_sync_delay,
            max_fragment_sync_delay_fraction=rails.max_fragment_sync_delay_fraction,
            target_fragments=rails.target_fragments,
            outer_step_s=outer_step_s,
        )
    else:
        choice = search_settings(
            h,
            step_s,
            all_reduce,
            model.num_layers,
            f,
            fragment_sync_delay,
            max_fragment_sync_delay=rails.max_fragment_sync_delay,
            max_fragment_sync_delay_fraction=rails.max_fragment_sync_delay_fraction,
            target_fragments=rails.target_fragments,
            outer_step_s=outer_step_s,
        )
    if choice.zero_blocking or (f is None and fragment_sync_delay is None):
        return choice
    # the user's fixed values block: say what the free search would pick instead
    free = (
        search_settings(
            h,
            step_s,
            all_reduce,
            model.num_layers,
            max_fragment_sync_delay=rails.max_fragment_sync_delay,
            max_fragment_sync_delay_fraction=rails.max_fragment_sync_delay_fraction,
            target_fragments=rails.target_fragments,
            outer_step_s=outer_step_s,
        )
        if h is not None
        else choose_sync_every(
            step_s,
            all_reduce,
            model.num_layers,
            max_sync_every=rails.max_sync_every,
            max_fragment_sync_delay=rails.max_fragment_sync_delay,
            max_fragment_sync_delay_fraction=rails.max_fragment_sync_delay_fraction,
            target_fragments=rails.target_fragments,
            outer_step_s=outer_step_s,
        )
    )
    advice = (
        f"recommended instead: syncEvery {free.sync_every}, fragments {free.fragments}, "
        f"fragmentSyncDelay {free.fragment_sync_delay}"
        + ("" if free.zero_blocking else f" ({free.blocking_s_per_outer_step:.3g} s blocking)")
    )
    return replace(choice, reason=f"{choice.reason}; {advice}", recommended=free)


def simulate_islands(
    model: TransformerSpec,
    strategy: StrategySpec,
    islands: Sequence[DiLoCoIsland],
    link: OuterLink,
    choice: SettingsChoice | None = None,
    rounds: int = 3,
) -> DiLoCoOutcome:
    """Resolve settings (unless given) against the slowest island and simulate the DiLoCo level."""
    slowest = max(isl.step_s for isl in islands)
    choice = choice or resolve_settings(
        model,
        strategy,
        link,
        len(islands),
        slowest,
        islands_outer_step_seconds(model, strategy, islands),
    )
    settings = choice.settings
    ar = fragment_all_reduce_seconds(model, strategy, link, len(islands), choice.fragments)
    steps = [
        IslandSteps(
            isl.name,
            isl.step_s,
            tuple(
                fragment_outer_step_seconds(
                    isl.cm, model, strategy, isl.shape.ranks, choice.fragments
                )
            ),
        )
        for isl in islands
    ]
    result = simulate_diloco(steps, settings, ar, rounds)
    return DiLoCoOutcome(choice, result, link, tuple(ar))
