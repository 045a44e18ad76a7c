"""Choosing Streaming DiLoCo settings (paper §IV-D) within convergence guard-rails.

With one fragment in flight, a fragment blocks compute for
``max(0, T_allreduce(fragment) − τ·T_step)`` (its all_reduce starts τ inner steps before it is
needed). Zero blocking with F fragments therefore needs ``τ = ⌈T_allreduce/T_step⌉ < H/F``.

**The rule** (the optimizer's vectorised closed form in `shardmeter.plan.overhead` implements
the same rule; tests hold the two together, and `shardmeter.sim.diloco` confirms the closed
form by simulation):

1. *Zero blocking*: the smallest ``sync_every`` H (from `SYNC_EVERY_CANDIDATES`, at most
   ``max_sync_every``), then the fewest fragments F, then the shortest delay τ
   (``τ ≤ max_fragment_sync_delay``) whose all_reduces all hide behind τ inner steps — the
   paper's choice: the shortest time until the pseudo-gradient is fully exchanged.
2. *Otherwise* blocking cannot be hidden within the guard-rails, and the settings that slow
   training least are taken: the least ``(blocking + outer optimizer step) / H`` per inner
   step (ties: smaller H, fewer fragments, shorter delay). The blocking is reported; it is
   never hidden by proposing a sync interval or delay beyond the guard-rails.

**Guard-rails** (`StrategySpec.max_sync_every`, `StrategySpec.max_fragment_sync_delay`): the
DiLoCo paper (Douillard et al. 2023, arXiv:2311.08105) trains with H = 500 inner steps and sees
quality drop as H grows; Streaming DiLoCo (Douillard et al. 2025, arXiv:2501.18512) trains with
H = 100 and overlaps each fragment's communication with only a few inner steps (τ ≤ 5).

With these two rules the effective step time ``T + overhead(T)`` never decreases when the
inner step T grows (zero blocking: a longer step needs no larger H; blocking: every option's
slope is ``1 − F·τ/H > 0``), which is what lets the optimizer minimise T first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardmeter.errors import SpecError

SYNC_EVERY_CANDIDATES: tuple[int, ...] = (10, 20, 50, 100, 200, 500, 1000)
"""``sync_every: auto`` picks from these (capped by ``max_sync_every``, which is itself a
candidate): round numbers used by DiLoCo (H = 500) and Streaming DiLoCo (H = 100) and their
ablations, with many divisors so that many fragment counts are legal."""

HINT_SYNC_EVERY_CANDIDATES: tuple[int, ...] = (*SYNC_EVERY_CANDIDATES, 2000, 5000, 10000)
"""Where blocking cannot be hidden within the guard-rails, the report names the smallest of
these that would hide it (a hint, never a choice)."""

DEFAULT_MAX_SYNC_EVERY = 500
"""Default guard-rail on H: DiLoCo's own setting (Douillard et al. 2023)."""

DEFAULT_MAX_FRAGMENT_SYNC_DELAY = 5
"""Default guard-rail on τ: the overlaps Streaming DiLoCo trains with (Douillard et al. 2025)."""

BLOCKING_DILOCO_OVERHEAD = 0.05
"""Blocking DiLoCo always stalls for the all_reduce; ``sync_every: auto`` then picks the
smallest candidate whose stall is at most this fraction of the H inner steps."""

ZERO_BLOCKING_EPS_S = 1e-12
"""Blocking at or below this many seconds counts as zero (floating-point noise)."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def sync_every_candidates(
    max_sync_every: int, candidates: Sequence[int] = SYNC_EVERY_CANDIDATES
) -> list[int]:
    """The candidates ``auto`` may pick: those ≤ the guard-rail, plus the guard-rail itself."""
    return sorted({h for h in candidates if h <= max_sync_every} | {max_sync_every})


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
    """When not zero-blocking: the smallest candidate H (≥ this one, guard-rail ignored) that
    would be, if any."""
    reason: str
    recommended: SettingsChoice | None = None
    """When fixed values block: what the unconstrained search picks."""


def _no_legal_settings(
    sync_every: int, max_fragments: int, fragments: int | None, delay: int | None
) -> SpecError:
    """Why no (F, τ) is legal at this H, naming the fixed value at fault."""
    if fragments is not None and fragments > max_fragments:
        return SpecError(
            "strategy.fragments",
            f"{fragments} > the model's {max_fragments} blocks (a fragment holds at least one)",
        )
    if fragments is not None and sync_every % fragments:
        return SpecError(
            "strategy.fragments",
            f"{fragments} does not divide syncEvery {sync_every} (torchft rule); use a divisor "
            f"of {sync_every} or auto",
        )
    window = sync_every // (fragments or 1)
    return SpecError(
        "strategy.fragmentSyncDelay",
        f"{delay} must be < syncEvery / fragments = {window} (torchft rule); lower it or use auto",
    )


def _no_candidate(
    candidates: Sequence[int], max_fragments: int, fragments: int | None, delay: int | None
) -> SpecError:
    """Why no candidate H of ``syncEvery: auto`` fits the fixed fragments and delay."""
    listed = ", ".join(str(h) for h in candidates)
    if fragments is not None and fragments > max_fragments:
        return _no_legal_settings(candidates[-1], max_fragments, fragments, delay)
    if fragments is not None and all(h % fragments for h in candidates):
        return SpecError(
            "strategy.fragments",
            f"{fragments} divides none of the syncEvery values auto may pick ({listed}; "
            f"maxSyncEvery {candidates[-1]}); set syncEvery to a multiple of {fragments}, or "
            "fragments auto",
        )
    f = fragments or 1
    return SpecError(
        "strategy.fragmentSyncDelay",
        f"{delay} needs syncEvery > {delay} × {f} fragment(s), but auto picks at most "
        f"{candidates[-1]} (maxSyncEvery); set syncEvery, or a shorter delay",
    )


def _options(
    h: int,
    step_s: float,
    all_reduce: Callable[[int], Sequence[float]],
    max_fragments: int,
    fragments: int | None,
    delay: int | None,
    max_delay: int | None,
) -> list[tuple[float, int, int]]:
    """(blocking, F, τ) for every legal option given the fixed values, F then τ ascending."""
    out = []
    for f in divisors(h):
        if f > max_fragments or (fragments is not None and f != fragments):
            continue
        window = h // f
        ars = all_reduce(f)
        if delay is not None:
            taus: Sequence[int] = [delay]
        else:
            taus = range(window if max_delay is None else min(window, max_delay + 1))
        for tau in taus:
            if tau < window:
                out.append((closed_form_blocking(ars, step_s, tau), f, tau))
    return out


def _zero_blocking_hint(
    sync_every: int,
    step_s: float,
    all_reduce: Callable[[int], Sequence[float]],
    max_fragments: int,
    fragments: int | None,
    delay: int | None,
    max_delay: int | None,
    candidates: Sequence[int],
) -> int | None:
    """The smallest candidate H > ``sync_every`` (from ``candidates`` and
    `HINT_SYNC_EVERY_CANDIDATES`) with a zero-blocking option, delays still within
    ``max_delay`` (fixed values kept)."""
    return next(
        (
            h
            for h in sorted({*candidates, *HINT_SYNC_EVERY_CANDIDATES})
            if h > sync_every
            and (fragments is None or h % fragments == 0)
            and any(
                b <= ZERO_BLOCKING_EPS_S
                for b, _, _ in _options(
                    h, step_s, all_reduce, max_fragments, fragments, delay, max_delay
                )
            )
        ),
        None,
    )


def _delay_hint(
    sync_every: int,
    step_s: float,
    all_reduce: Callable[[int], Sequence[float]],
    max_fragments: int,
    fragments: int | None,
) -> int | None:
    """The shortest delay with a zero-blocking option at ``sync_every`` (no delay limit)."""
    found = [
        tau
        for b, _, tau in _options(
            sync_every, step_s, all_reduce, max_fragments, fragments, None, None
        )
        if b <= ZERO_BLOCKING_EPS_S
    ]
    return min(found, default=None)


def search_settings(
    sync_every: int,
    step_s: float,
    all_reduce: Callable[[int], Sequence[float]],
    max_fragments: int,
    fragments: int | None = None,
    delay: int | None = None,
    candidates: Sequence[int] = SYNC_EVERY_CANDIDATES,
    max_delay: int | None = None,
) -> SettingsChoice:
    """Fewest fragments, then shortest delay (≤ ``max_delay``), with zero blocking for this
    ``sync_every``; else the least blocking. ``fragments``/``delay`` pin user-fixed values.
    ``all_reduce(F)`` gives each fragment's all_reduce seconds when the model is cut into F
    fragments. ``candidates`` (with `HINT_SYNC_EVERY_CANDIDATES`) are where the hint for a
    zero-blocking ``sync_every`` is looked for."""
    options = _options(sync_every, step_s, all_reduce, max_fragments, fragments, delay, max_delay)
    if not options:
        raise _no_legal_settings(sync_every, max_fragments, fragments, delay)
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
    return _blocking_choice(
        sync_every,
        f,
        tau,
        blocking,
        step_s,
        all_reduce,
        max_fragments,
        fragments,
        delay,
        max_delay,
        candidates,
    )


def _blocking_choice(
    sync_every: int,
    f: int,
    tau: int,
    blocking: float,
    step_s: float,
    all_reduce: Callable[[int], Sequence[float]],
    max_fragments: int,
    fragments: int | None,
    delay: int | None,
    max_delay: int | None,
    candidates: Sequence[int] = SYNC_EVERY_CANDIDATES,
) -> SettingsChoice:
    needed = _zero_blocking_hint(
        sync_every, step_s, all_reduce, max_fragments, fragments, delay, max_delay, candidates
    )
    pinned = " with the fixed fragments/delay" if fragments is not None or delay is not None else ""
    rails = f" (fragmentSyncDelay ≤ {max_delay})" if max_delay is not None and delay is None else ""
    hints = []
    if needed is not None:
        hints.append(
            f"syncEvery ≥ {needed} would allow zero blocking{pinned}"
            + (f" with fragmentSyncDelay ≤ {max_delay}" if rails else "")
        )
    if delay is None and max_delay is not None:
        tau_needed = _delay_hint(sync_every, step_s, all_reduce, max_fragments, fragments)
        if tau_needed is not None:
            hints.append(f"fragmentSyncDelay {tau_needed} would at syncEvery {sync_every}")
    hint = " or ".join(hints) or (
        f"no syncEvery up to {HINT_SYNC_EVERY_CANDIDATES[-1]} allows zero blocking{pinned}"
    )
    return SettingsChoice(
        sync_every,
        f,
        tau,
        blocking,
        False,
        needed,
        f"no zero-blocking settings at syncEvery {sync_every}{rails}; least blocking is "
        f"{f} fragment(s), delay {tau} ({blocking:.3g} s per outer step); {hint}",
    )


def choose_sync_every(
    step_s: float,
    all_reduce: Callable[[int], Sequence[float]],
    max_fragments: int,
    fragments: int | None = None,
    delay: int | None = None,
    candidates: Sequence[int] = SYNC_EVERY_CANDIDATES,
    max_sync_every: int | None = None,
    max_delay: int | None = None,
    outer_step_s: float = 0.0,
) -> SettingsChoice:
    """``sync_every: auto`` for Streaming DiLoCo (see the module docstring): the smallest
    candidate H ≤ ``max_sync_every`` with zero blocking; else the settings with the least
    ``(blocking + outer_step_s) / H``."""
    hs = (
        sorted(candidates)
        if max_sync_every is None
        else sync_every_candidates(max_sync_every, candidates)
    )
    best: tuple[float, int, int, int, float] | None = None  # overhead, H, F, τ, blocking
    for h in hs:
        if fragments is not None and h % fragments:
            continue
        options = _options(h, step_s, all_reduce, max_fragments, fragments, delay, max_delay)
        if any(blocking <= ZERO_BLOCKING_EPS_S for blocking, _, _ in options):
            return search_settings(
                h, step_s, all_reduce, max_fragments, fragments, delay, max_delay=max_delay
            )
        if options:
            blocking, f, tau = min(options, key=lambda o: (o[0], o[1], o[2]))
            key = ((blocking + outer_step_s) / h, h, f, tau, blocking)
            if best is None or key[:4] < best[:4]:
                best = key
    if best is None:
        raise _no_candidate(hs, max_fragments, fragments, delay)
    _, h, f, tau, blocking = best
    return _blocking_choice(
        h,
        f,
        tau,
        blocking,
        step_s,
        all_reduce,
        max_fragments,
        fragments,
        delay,
        max_delay,
        candidates,
    )


def choose_blocking_sync_every(
    step_s: float,
    all_reduce_s: float,
    candidates: Sequence[int] = SYNC_EVERY_CANDIDATES,
    max_sync_every: int | None = None,
) -> int:
    """``sync_every: auto`` for blocking DiLoCo (see `BLOCKING_DILOCO_OVERHEAD`)."""
    hs = (
        sorted(candidates)
        if max_sync_every is None
        else sync_every_candidates(max_sync_every, candidates)
    )
    for h in hs:
        if all_reduce_s <= BLOCKING_DILOCO_OVERHEAD * h * step_s:
            return h
    return max(hs)
