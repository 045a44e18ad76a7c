"""Choosing Streaming DiLoCo settings (paper §IV-D): the fewest fragments, then the shortest
delay, with zero blocking — or, when none exists, the least-blocking option and the smallest
``sync_every`` that would allow zero blocking.

With one fragment in flight, a fragment blocks compute for
``max(0, T_allreduce(fragment) − τ·T_step)`` (its all_reduce starts τ inner steps before it is
needed). Zero blocking with F fragments therefore needs ``τ = ⌈T_allreduce/T_step⌉ < H/F``.
The search uses this closed form; `shardmeter.sim.diloco` confirms the choice by simulation
(tests cross-check the two).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

SYNC_EVERY_CANDIDATES: tuple[int, ...] = (10, 20, 50, 100, 200, 500, 1000)
"""``sync_every: auto`` picks the smallest of these with zero blocking: round numbers used by
DiLoCo (H = 500) and Streaming DiLoCo (H = 100) and their ablations, with many divisors so that
many fragment counts are legal."""

BLOCKING_DILOCO_OVERHEAD = 0.05
"""Blocking DiLoCo always stalls for the all_reduce; ``sync_every: auto`` then picks the
smallest candidate whose stall is at most this fraction of the H inner steps."""

ZERO_BLOCKING_EPS_S = 1e-12
"""Blocking at or below this many seconds counts as zero (floating-point noise)."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def closed_form_blocking(all_reduce_s: Sequence[float], step_s: float, delay: int) -> float:
    """Blocking seconds per outer step: Σ_fragments max(0, T_ar − τ·T_step)."""
    return sum(max(0.0, ar - delay * step_s) for ar in all_reduce_s)


@dataclass(frozen=True)
class SettingsChoice:
    sync_every: int
    fragments: int
    delay: int
    blocking_s_per_outer_step: float
    """Closed-form estimate for the chosen settings."""
    zero_blocking: bool
    sync_every_for_zero_blocking: int | None
    """When not zero-blocking: the smallest candidate H (≥ this one) that would be, if any."""
    reason: str
    recommended: SettingsChoice | None = None
    """When fixed values block: what the unconstrained search picks."""


def _options(
    h: int,
    step_s: float,
    all_reduce: Callable[[int], Sequence[float]],
    max_fragments: int,
    fragments: int | None,
    delay: int | None,
) -> list[tuple[float, int, int]]:
    """(blocking, F, τ) for every legal option given the fixed values, F then τ ascending."""
    out = []
    for f in divisors(h):
        if f > max_fragments or (fragments is not None and f != fragments):
            continue
        window = h // f
        ars = all_reduce(f)
        taus = [delay] if delay is not None else range(window)
        for tau in taus:
            if tau < window:
                out.append((closed_form_blocking(ars, step_s, tau), f, tau))
    return out


def search_settings(
    sync_every: int,
    step_s: float,
    all_reduce: Callable[[int], Sequence[float]],
    max_fragments: int,
    fragments: int | None = None,
    delay: int | None = None,
    candidates: Sequence[int] = SYNC_EVERY_CANDIDATES,
) -> SettingsChoice:
    """Fewest fragments, then shortest delay, with zero blocking for this ``sync_every``;
    ``fragments``/``delay`` pin user-fixed values. ``all_reduce(F)`` gives each fragment's
    all_reduce seconds when the model is cut into F fragments."""
    options = _options(sync_every, step_s, all_reduce, max_fragments, fragments, delay)
    if not options:
        raise ValueError(
            f"no legal settings for syncEvery {sync_every} with fragments={fragments}, "
            f"fragmentSyncDelay={delay}"
        )
    for blocking, f, tau in options:
        if blocking <= ZERO_BLOCKING_EPS_S:
            return SettingsChoice(
                sync_every,
                f,
                tau,
                0.0,
                True,
                None,
                f"{f} fragment(s) with delay {tau}: each all_reduce "
                f"({max(all_reduce(f)):.3g} s) hides behind {tau} inner steps of {step_s:.3g} s",
            )
    blocking, f, tau = min(options, key=lambda o: (o[0], o[1], o[2]))
    needed = next(
        (
            h
            for h in sorted(candidates)
            if h > sync_every
            and any(
                b <= ZERO_BLOCKING_EPS_S
                for b, _, _ in _options(h, step_s, all_reduce, max_fragments, fragments, delay)
            )
        ),
        None,
    )
    pinned = " with the fixed fragments/delay" if fragments is not None or delay is not None else ""
    hint = (
        f"syncEvery ≥ {needed} would allow zero blocking{pinned}"
        if needed
        else f"no candidate syncEvery allows zero blocking{pinned}"
    )
    return SettingsChoice(
        sync_every,
        f,
        tau,
        blocking,
        False,
        needed,
        f"no zero-blocking settings at syncEvery {sync_every}; least blocking is "
        f"{f} fragment(s), delay {tau} ({blocking:.3g} s per outer step); {hint}",
    )


def choose_sync_every(
    step_s: float,
    all_reduce: Callable[[int], Sequence[float]],
    max_fragments: int,
    fragments: int | None = None,
    delay: int | None = None,
    candidates: Sequence[int] = SYNC_EVERY_CANDIDATES,
) -> SettingsChoice:
    """``sync_every: auto`` for Streaming DiLoCo: the smallest candidate with zero blocking
    (else the least-blocking option at the largest candidate)."""
    last: SettingsChoice | None = None
    for h in sorted(candidates):
        if fragments is not None and h % fragments:
            continue
        try:
            choice = search_settings(
                h, step_s, all_reduce, max_fragments, fragments, delay, candidates
            )
        except ValueError:
            continue
        if choice.zero_blocking:
            return choice
        last = choice
    if last is None:
        raise ValueError("no candidate syncEvery is compatible with the fixed fragments/delay")
    return last


def choose_blocking_sync_every(
    step_s: float, all_reduce_s: float, candidates: Sequence[int] = SYNC_EVERY_CANDIDATES
) -> int:
    """``sync_every: auto`` for blocking DiLoCo (see `BLOCKING_DILOCO_OVERHEAD`)."""
    for h in sorted(candidates):
        if all_reduce_s <= BLOCKING_DILOCO_OVERHEAD * h * step_s:
            return h
    return max(candidates)
