"""Choosing Streaming DiLoCo settings (paper §IV-D) within convergence guard-rails.

With one fragment in flight, a fragment blocks compute for
``max(0, T_allreduce(fragment) − τ·T_step)`` (its all_reduce starts τ inner steps before it is
needed). Zero blocking with F fragments therefore needs ``τ = ⌈T_allreduce/T_step⌉ < H/F``.

**The rule** (the optimizer's vectorised closed form in `shardmeter.plan.overhead` implements
the same rule; tests hold the two together, and `shardmeter.sim.diloco` confirms the closed
form by simulation):

1. *Zero blocking*: the smallest ``sync_every`` H (from `SYNC_EVERY_CANDIDATES`, at most
   ``max_sync_every``; with pinned ``fragments`` P, those rounded to multiples of P, as
   torchft requires: `sync_every_candidates`) — the smallest H costs the least quality
   (`shardmeter.cost.quality`) — then the *preferred* fragment count F, then the shortest
   delay τ (``τ ≤`` the delay limit at H) whose all_reduces all hide behind τ inner steps.
   Preferred: nearest to blocks ÷ ``layers_per_fragment`` (ties: fewer), the fragment size
   the Streaming DiLoCo papers train with; without a target, the fewest (the paper's §IV-D
   choice, kept for callers that pass none).
2. *Otherwise* blocking cannot be hidden within the guard-rails, and the settings that slow
   training least are taken: the least ``(blocking + outer optimizer steps) / H`` per inner
   step (ties: smaller H, preferred fragments, shorter delay), the outer optimizer steps
   those of the option's F fragments — one optimizer call per fragment, each paying the step
   regression's per-call intercept, as the simulator charges them
   (`shardmeter.sim.scenario.outer_step_seconds_by_fragments`). The blocking is reported; it
   is never hidden by proposing a sync interval or delay beyond the guard-rails.

**Guard-rails** (`StrategySpec`): ``max_sync_every`` — the DiLoCo paper (Douillard et al.
2023, arXiv:2311.08105) trains with H = 500 and sees quality drop as H grows;
``max_fragment_sync_delay`` and ``max_fragment_sync_delay_fraction`` — Streaming DiLoCo
(Douillard et al. 2025, arXiv:2501.18512) trains with H = 100 and reports training robust to
overlaps of τ ≤ 5 inner steps, i.e. 5 % of H: the delay limit at H is
``min(max_fragment_sync_delay, ⌊fraction × H⌋)``; ``layers_per_fragment`` — about 3 blocks
per fragment in those papers.

With these two rules the effective step time ``T + overhead(T)`` never decreases when the
inner step T grows (zero blocking: a longer step needs no larger H; blocking: every option's
slope is ``1 − F·τ/H > 0``; from blocking to zero blocking: the zero-blocking option was one
of the blocking options), which is what lets the optimizer minimise T first — exactly when
the outer optimizer steps do not depend on F. With one call per fragment they grow with F,
and rule 1 picks F for convergence, not cost: a longer step that lets it hide a preferred
count with fewer calls (at the same or a smaller H) lowers the overhead, so the effective
step can fall, by at most ``(outer(F) − outer(F')) / H`` — F, F' the counts before and after,
H the sync interval before: (F − F') per-call intercepts per H inner steps (the case study:
1 ms intercepts, F ≤ 10 at H = 20 on 3.6 s steps, at most about 1e-4 of the step). The
optimizer keeps each layout at its fastest inner step, so a layout's figures can be that
much above its best configuration's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from shardmeter.errors import SpecError
from shardmeter.sim.bottleneck import BLOCKING_EPSILON_S
from shardmeter.spec.training import (
    MAX_SYNC_EVERY,
    StrategyKind,
    StrategySpec,
    StreamingSettings,
    fragment_sync_delay_limit,
    torchft_violation,
)

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


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def sync_every_candidates(
    max_sync_every: int,
    candidates: Collection[int] = SYNC_EVERY_CANDIDATES,
    fragments: int | None = None,
) -> list[int]:
    """The candidates ``auto`` may pick: those ≤ the guard-rail, plus the guard-rail itself.
    With pinned ``fragments`` P only multiples of P are legal (torchft's ``syncEvery %
    fragments == 0``): each candidate is rounded up to the next multiple of P and the
    guard-rail down to one, dropping those beyond the guard-rail (none are left when
    P > ``max_sync_every``). For a P that divides every candidate the list is unchanged."""
    if fragments is None:
        return sorted({h for h in candidates if h <= max_sync_every} | {max_sync_every})
    p = fragments
    rounded = {-(-h // p) * p for h in candidates} | {max_sync_every // p * p}
    return sorted(h for h in rounded if 0 < h <= max_sync_every)


def closed_form_blocking(
    all_reduce_s: Sequence[float], step_s: float, fragment_sync_delay: int
) -> float:
    """Blocking seconds per outer step: Σ_fragments max(0, T_ar − τ·T_step)."""
    return sum(max(0.0, ar - fragment_sync_delay * step_s) for ar in all_reduce_s)


@dataclass(frozen=True)
class SettingsChoice:
    """Streaming DiLoCo settings a search chose (`settings`) and what they come to: the
    blocking they leave, whether it is zero, and why they were chosen."""

    sync_every: int
    fragments: int
    fragment_sync_delay: int
    blocking_s_per_outer_step: float
    """Closed-form estimate for the chosen settings."""
    zero_blocking: bool
    sync_every_for_zero_blocking: int | None
    """When not zero-blocking: the smallest candidate H (≥ this one, guard-rail ignored) that
    would be, if any."""
    reason: str
    recommended: SettingsChoice | None = None
    """When fixed values block: what the unconstrained search picks."""

    @property
    def settings(self) -> StreamingSettings:
        """The chosen settings themselves (validated against torchft's rule)."""
        return StreamingSettings(self.sync_every, self.fragments, self.fragment_sync_delay)


def fragment_preference(fragments: int, target: float | None) -> tuple[float, int]:
    """Sort key of a fragment count: nearest to ``target`` (blocks ÷ layers per fragment),
    ties fewer; without a target, fewer."""
    return (abs(fragments - target) if target is not None else 0.0, fragments)


@dataclass(frozen=True)
class _Search:
    """One settings search: the island's inner step, its fragments' all_reduce seconds, the
    user's pinned values (None: auto) and the guard-rails. Every search function below works
    on one of these, so the inputs travel together."""

    step_s: float
    all_reduce: Callable[[int], Sequence[float]]
    """``all_reduce(F)``: each fragment's all_reduce seconds when the model is cut into F."""
    max_fragments: int
    fragments: int | None
    fragment_sync_delay: int | None
    max_fragment_sync_delay: int | None
    candidates: Sequence[int]
    max_fragment_sync_delay_fraction: float | None = None
    """τ ≤ ⌊this × H⌋ as well (None: no bound relative to H)."""
    target_fragments: float | None = None
    """Preferred fragment count (blocks ÷ layers per fragment); None: the fewest."""
    outer_step_s: float | Callable[[int], float] = 0.0
    """The outer optimizer steps per outer step with F fragments (`outer_step`)."""

    def outer_step(self, fragments: int) -> float:
        """Outer optimizer seconds per outer step with ``fragments`` fragments: one call per
        fragment (`shardmeter.sim.scenario.outer_step_seconds_by_fragments`); a number is
        the same for every count."""
        if callable(self.outer_step_s):
            return self.outer_step_s(fragments)
        return self.outer_step_s

    def delay_limit(self, h: int) -> int | None:
        """The largest τ auto may take at H (None: up to the window)."""
        return fragment_sync_delay_limit(
            h, self.max_fragment_sync_delay, self.max_fragment_sync_delay_fraction
        )

    def options(self, h: int) -> list[tuple[float, int, int]]:
        """(blocking, F, τ) for every legal option at H given the fixed values, F in
        preference order, then τ ascending."""
        out = []
        counts = [
            f
            for f in divisors(h)
            if f <= self.max_fragments and (self.fragments is None or f == self.fragments)
        ]
        counts.sort(key=lambda f: fragment_preference(f, self.target_fragments))
        limit = self.delay_limit(h)
        for f in counts:
            window = h // f
            ars = self.all_reduce(f)
            taus: Sequence[int]
            if self.fragment_sync_delay is not None:
                taus = [self.fragment_sync_delay]
            elif limit is None:
                taus = range(window)
            else:
                taus = range(min(window, limit + 1))
            for tau in taus:
                if torchft_violation(h, f, tau) is None:
                    out.append((closed_form_blocking(ars, self.step_s, tau), f, tau))
        return out

    def fragment_note(self, f: int) -> str:
        """Why F fragments, when auto chose them towards the convergence target."""
        if self.target_fragments is None or self.fragments is not None:
            return ""
        per = self.max_fragments / f
        return (
            f" ({per:.3g} blocks per fragment: the count nearest {self.max_fragments} blocks ÷ "
            f"{self.max_fragments / self.target_fragments:g} (layersPerFragment) that hides it)"
        )

    def least_blocking(self, options: Sequence[tuple[float, int, int]]) -> tuple[float, int, int]:
        """The option with the least blocking plus outer optimizer steps (`outer_step`: F
        fragments cost F optimizer calls) per outer step (ties: preferred fragments, shorter
        delay)."""
        return min(
            options,
            key=lambda o: (
                o[0] + self.outer_step(o[1]),
                fragment_preference(o[1], self.target_fragments),
                o[2],
            ),
        )

    def fits(self, h: int) -> bool:
        """Whether H keeps torchft's rule with the pinned fragments (any H when auto)."""
        return self.fragments is None or torchft_violation(h, self.fragments) is None

    def at(self, sync_every: int) -> SettingsChoice:
        """Fewest fragments, then shortest delay, with zero blocking at this H; else the
        least blocking."""
        options = self.options(sync_every)
        if not options:
            raise self.no_legal_settings(sync_every)
        for blocking, f, tau in options:
            if blocking <= BLOCKING_EPSILON_S:
                return SettingsChoice(
                    sync_every,
                    f,
                    tau,
                    0.0,
                    True,
                    None,
                    f"{f} fragment(s) with delay {tau}: each all_reduce "
                    f"({max(self.all_reduce(f)):.3g} s) hides behind {tau} inner steps of "
                    f"{self.step_s:.3g} s" + self.fragment_note(f),
                )
        blocking, f, tau = self.least_blocking(options)
        return self.blocking_choice(sync_every, f, tau, blocking)

    def relative_limit_note(self, smaller: Sequence[int]) -> str:
        """When a smaller H of ``smaller`` would hide the all_reduce but for the delay limit
        relative to H: which, and the delay it would need."""
        if self.max_fragment_sync_delay_fraction is None or self.fragment_sync_delay is not None:
            return ""
        free = replace(self, max_fragment_sync_delay_fraction=None)
        for h in smaller:
            if not self.fits(h):
                continue
            taus = [tau for b, _, tau in free.options(h) if b <= BLOCKING_EPSILON_S]
            if taus:
                return (
                    f"; syncEvery {h} would need fragmentSyncDelay {min(taus)} > "
                    f"{self.max_fragment_sync_delay_fraction:g} × {h} "
                    "(maxFragmentSyncDelayFraction, the overlap Streaming DiLoCo reports robust)"
                )
        return ""

    def zero_blocking_hint(self, sync_every: int) -> int | None:
        """The smallest candidate H > ``sync_every`` (from ``candidates`` and
        `HINT_SYNC_EVERY_CANDIDATES`) with a zero-blocking option, delays still within the
        guard-rail (fixed values kept)."""
        hints = sync_every_candidates(
            MAX_SYNC_EVERY, {*self.candidates, *HINT_SYNC_EVERY_CANDIDATES}, self.fragments
        )
        return next(
            (
                h
                for h in hints
                if h > sync_every
                and self.fits(h)
                and any(b <= BLOCKING_EPSILON_S for b, _, _ in self.options(h))
            ),
            None,
        )

    def delay_hint(self, sync_every: int) -> int | None:
        """The shortest delay with a zero-blocking option at ``sync_every`` (no delay limit)."""
        free = replace(
            self,
            fragment_sync_delay=None,
            max_fragment_sync_delay=None,
            max_fragment_sync_delay_fraction=None,
        )
        found = [tau for b, _, tau in free.options(sync_every) if b <= BLOCKING_EPSILON_S]
        return min(found, default=None)

    def blocking_choice(self, sync_every: int, f: int, tau: int, blocking: float) -> SettingsChoice:
        """The least-blocking option (F, τ) at H, with hints that would hide the blocking."""
        needed = self.zero_blocking_hint(sync_every)
        pinned_values = self.fragments is not None or self.fragment_sync_delay is not None
        pinned = " with the fixed fragments/delay" if pinned_values else ""
        limit = self.delay_limit(sync_every)
        railed = limit is not None and self.fragment_sync_delay is None
        rails = f" (fragmentSyncDelay ≤ {limit})" if railed else ""
        hints = []
        if needed is not None:
            hints.append(
                f"syncEvery ≥ {needed} would allow zero blocking{pinned}"
                + (f" with fragmentSyncDelay ≤ {self.delay_limit(needed)}" if rails else "")
            )
        if railed:
            tau_needed = self.delay_hint(sync_every)
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

    def no_legal_settings(self, sync_every: int) -> SpecError:
        """Why no (F, τ) is legal at this H, naming the fixed value at fault."""
        fragments, delay = self.fragments, self.fragment_sync_delay
        if fragments is not None and fragments > self.max_fragments:
            return SpecError(
                "strategy.fragments",
                f"{fragments} > the model's {self.max_fragments} blocks (a fragment holds at "
                "least one)",
            )
        violation = torchft_violation(sync_every, fragments or 1, delay or 0)
        if fragments is not None and violation is not None and violation[0] == "syncEvery":
            return SpecError(
                "strategy.fragments",
                f"{fragments} does not divide syncEvery {sync_every} (torchft rule); use a "
                f"divisor of {sync_every} or auto",
            )
        window = sync_every // (fragments or 1)
        return SpecError(
            "strategy.fragmentSyncDelay",
            f"{delay} must be < syncEvery / fragments = {window} (torchft rule); "
            "lower it or use auto",
        )

    def no_candidate(self, max_sync_every: int) -> SpecError:
        """Why no candidate H of ``syncEvery: auto`` (at most ``max_sync_every``) fits the
        fixed fragments and delay, naming torchft's rule and the fields to change."""
        fragments, delay = self.fragments, self.fragment_sync_delay
        if fragments is not None and fragments > self.max_fragments:
            return self.no_legal_settings(max_sync_every)
        hs = sync_every_candidates(max_sync_every, self.candidates, fragments)
        if not any(self.fits(h) for h in hs):
            listed = ", ".join(
                str(h) for h in sync_every_candidates(max_sync_every, self.candidates)
            )
            return SpecError(
                "strategy.fragments",
                f"{fragments} divides none of the syncEvery values auto may pick ({listed}; "
                f"maxSyncEvery {max_sync_every}): torchft needs syncEvery % fragments == 0; "
                f"raise strategy.maxSyncEvery to at least {fragments}, set strategy.syncEvery to a multiple of {fragments}, "
                f"or set strategy.fragments to at most {max_sync_every} or auto",
            )
        return SpecError(
            "strategy.fragmentSyncDelay",
            f"{delay} needs syncEvery > {delay} × {fragments or 1} fragment(s), but auto picks "
            f"at most {max_sync_every} (maxSyncEvery): torchft needs fragmentSyncDelay < "
            "syncEvery / fragments; set strategy.syncEvery, raise strategy.maxSyncEvery, or "
            "use a shorter delay",
        )


def search_settings(
    sync_every: int,
    step_s: float,
    all_reduce: Callable[[int], Sequence[float]],
    max_fragments: int,
    fragments: int | None = None,
    fragment_sync_delay: int | None = None,
    candidates: Sequence[int] = SYNC_EVERY_CANDIDATES,
    max_fragment_sync_delay: int | None = None,
    *,
    max_fragment_sync_delay_fraction: float | None = None,
    target_fragments: float | None = None,
    outer_step_s: float | Callable[[int], float] = 0.0,
) -> SettingsChoice:
    """The preferred fragments (nearest ``target_fragments``, else the fewest), then the
    shortest delay (≤ ``max_fragment_sync_delay`` and ≤ ⌊``max_fragment_sync_delay_fraction``
    × H⌋), with zero blocking for this ``sync_every``; else the least blocking plus outer
    optimizer steps (``outer_step_s``: seconds per outer step, a function of the fragment
    count where each fragment's step is its own call).
    ``fragments`` and ``fragment_sync_delay`` pin user-fixed values. ``all_reduce(F)`` gives
    each fragment's all_reduce seconds when the model is cut into F fragments.
    ``candidates`` (with `HINT_SYNC_EVERY_CANDIDATES`) are where the hint for a
    zero-blocking ``sync_every`` is looked for."""
    search = _Search(
        step_s,
        all_reduce,
        max_fragments,
        fragments,
        fragment_sync_delay,
        max_fragment_sync_delay,
        candidates,
        max_fragment_sync_delay_fraction,
        target_fragments,
        outer_step_s,
    )
    return search.at(sync_every)


def choose_sync_every(
    step_s: float,
    all_reduce: Callable[[int], Sequence[float]],
    max_fragments: int,
    fragments: int | None = None,
    fragment_sync_delay: int | None = None,
    candidates: Sequence[int] = SYNC_EVERY_CANDIDATES,
    max_sync_every: int | None = None,
    max_fragment_sync_delay: int | None = None,
    outer_step_s: float | Callable[[int], float] = 0.0,
    *,
    max_fragment_sync_delay_fraction: float | None = None,
    target_fragments: float | None = None,
) -> SettingsChoice:
    """``sync_every: auto`` for Streaming DiLoCo (see the module docstring): the smallest
    candidate H ≤ ``max_sync_every`` with zero blocking; else the settings with the least
    ``(blocking + outer_step_s(F)) / H`` (``outer_step_s``: the outer optimizer steps per
    outer step with F fragments, or one number for every F). When the delay limit relative
    to H is what rules out a smaller H, the reason says so."""
    search = _Search(
        step_s,
        all_reduce,
        max_fragments,
        fragments,
        fragment_sync_delay,
        max_fragment_sync_delay,
        candidates,
        max_fragment_sync_delay_fraction,
        target_fragments,
        outer_step_s,
    )
    limit = max(candidates) if max_sync_every is None else max_sync_every
    hs = sync_every_candidates(limit, candidates, fragments)
    best: tuple[float, int, int, int, float] | None = None  # overhead, H, F, τ, blocking
    for i, h in enumerate(hs):
        if not search.fits(h):
            continue
        options = search.options(h)
        if any(blocking <= BLOCKING_EPSILON_S for blocking, _, _ in options):
            choice = search.at(h)
            return replace(choice, reason=choice.reason + search.relative_limit_note(hs[:i]))
        if options:
            blocking, f, tau = search.least_blocking(options)
            key = ((blocking + search.outer_step(f)) / h, h, f, tau, blocking)
            if best is None or key[:4] < best[:4]:
                best = key
    if best is None:
        raise search.no_candidate(limit)
    _, h, f, tau, blocking = best
    return search.blocking_choice(h, f, tau, blocking)


def settings_problem(strategy: StrategySpec, max_fragments: int) -> SpecError | None:
    """Why no Streaming DiLoCo settings are legal for ``strategy`` on a model of
    ``max_fragments`` blocks, whatever the islands (None when some are, and for fsdp and
    blocking DiLoCo): torchft's rule with the pinned fragments and delay over the fixed
    ``syncEvery`` or every value ``auto`` may pick. Which settings are legal depends on
    neither the islands nor the links, so a planner can refuse such a request before its
    search, naming the rule instead of a symptom."""
    if strategy.kind is not StrategyKind.STREAMING_DILOCO:
        return None
    fragments = strategy.fragments if isinstance(strategy.fragments, int) else None
    delay = strategy.fragment_sync_delay if isinstance(strategy.fragment_sync_delay, int) else None
    search = _Search(
        1.0,
        lambda f: [0.0] * f,
        max_fragments,
        fragments,
        delay,
        strategy.max_fragment_sync_delay,
        SYNC_EVERY_CANDIDATES,
        strategy.max_fragment_sync_delay_fraction,
    )
    if isinstance(strategy.sync_every, int):
        h = strategy.sync_every
        return None if search.options(h) else search.no_legal_settings(h)
    hs = sync_every_candidates(strategy.max_sync_every, fragments=fragments)
    if any(search.fits(h) and search.options(h) for h in hs):
        return None
    return search.no_candidate(strategy.max_sync_every)


@dataclass(frozen=True)
class GuardRails:
    """A strategy's convergence guard-rails, as the settings searches take them."""

    max_sync_every: int
    max_fragment_sync_delay: int
    max_fragment_sync_delay_fraction: float
    target_fragments: float
    """Blocks ÷ ``layersPerFragment``: the fragment count auto prefers."""

    @classmethod
    def of(cls, strategy: StrategySpec, num_layers: int) -> GuardRails:
        return cls(
            strategy.max_sync_every,
            strategy.max_fragment_sync_delay,
            strategy.max_fragment_sync_delay_fraction,
            num_layers / strategy.layers_per_fragment,
        )

    def described(self) -> str:
        return (
            f"maxSyncEvery {self.max_sync_every}, maxFragmentSyncDelay "
            f"{self.max_fragment_sync_delay}, maxFragmentSyncDelayFraction "
            f"{self.max_fragment_sync_delay_fraction:g}"
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
