"""The islands' observations held against the model (pure; runs in a planning worker):

* **drift** — each island's median inner step against its prediction (``error_ratio``);
* **calibration samples** — the compute scale at which the model, with the pool's *base*
  coefficients, reproduces the observed step (`shardmeter.sim.calibrate`); they become the
  pool's observed correction (`shardmeter.cost.observed`, :mod:`~.gpupool.correction`);
* **outer-step re-check** — Streaming DiLoCo blocking with the observed inner step (the
  slowest island's) and the observed fragment all_reduce, at the running settings, and the
  settings the model's own search (`shardmeter.sim.settings.search_settings`) recommends
  at those times.

The fragment all_reduce is observable only when it blocks: a sync whose stall exceeds
`STALL_SIGNIFICANT` of the inner step waited for it, so its duration (all_reduce start →
commit) measures it; otherwise it finished behind the delay and the observation only bounds
it (the duration minus the stall), and the model's time, capped by that bound, is used. The
observed time scales the model's per-fragment times, so other fragment counts are predicted
in proportion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.model import CostModel
from shardmeter.cost.observed import ObservedStepSample
from shardmeter.plan.schema import PlanSpec
from shardmeter.sim.bottleneck import blocks
from shardmeter.sim.calibrate import fit_compute_scale
from shardmeter.sim.outer import IslandPlacement, outer_link
from shardmeter.sim.scenario import IslandShape, IslandStepModel, fragment_all_reduce_seconds
from shardmeter.sim.settings import GuardRails, closed_form_blocking, search_settings
from shardmeter_operator.api import DiLoCoSettings, IslandStatus
from shardmeter_operator.api.observation import (
    IslandObservation,
    ObservedRecommendation,
    ObserveReason,
)

STALL_SIGNIFICANT = 0.05
"""A sync stall above this fraction of the inner step means the sync waited for its
all_reduce (below it: the commit round trip alone)."""


@dataclass(frozen=True)
class Provenance:
    plan: str
    """``namespace/name``."""
    uid: str
    revision: str
    observed_at: datetime
    recalibrate: bool


@dataclass
class OuterRecheck:
    all_reduce_s: float
    bounded: bool
    blocking_s: float
    recommended: ObservedRecommendation | None


@dataclass
class ObservedEvaluation:
    observations: dict[str, IslandObservation]
    """Island name → its observation, with ``compute_scale`` set where it could be fitted."""
    samples: dict[str, list[ObservedStepSample]] = field(default_factory=dict)
    """Pool → samples for its observed correction."""
    outer: OuterRecheck | None = None


def evaluate_observations(
    request: PlanSpec,
    docs: Mapping[str, CoefficientsDocument | None],
    islands: Sequence[IslandStatus],
    observations: Mapping[str, IslandObservation],
    settings: DiLoCoSettings | None,
    provenance: Provenance,
) -> ObservedEvaluation:
    pools = {p.name: p for p in request.pools}
    base = {name: (doc.base() if doc is not None else None) for name, doc in docs.items()}
    models: dict[str, CostModel] = {}

    def cost_model(pool: str) -> CostModel:
        if pool not in models:
            models[pool] = CostModel(request.model, request.training, pools[pool], base.get(pool))
        return models[pool]

    out = ObservedEvaluation(dict(observations))
    for isl in islands:
        obs = observations.get(isl.name)
        if obs is None or obs.reason != ObserveReason.OBSERVED or not obs.step_seconds_p50:
            continue
        cm = cost_model(isl.pool)
        model = IslandStepModel(cm, IslandShape(isl.nodes, isl.gpus_per_node), isl.micro_batch)
        fit = fit_compute_scale(
            model.durations,
            isl.accumulation,
            obs.step_seconds_p50,
            model.max_inflight,
            model.gradient_sync,
        )
        out.observations[isl.name] = obs.model_copy(
            update={"compute_scale": round(fit.compute_scale, 4)}
        )
        doc = base.get(isl.pool)
        if not provenance.recalibrate or not fit.reachable or doc is None:
            continue
        out.samples.setdefault(isl.pool, []).append(
            ObservedStepSample(
                plan=provenance.plan,
                plan_uid=provenance.uid,
                revision=provenance.revision,
                island=isl.name,
                model=request.model.name or "custom",
                nodes=isl.nodes,
                gpus_per_node=isl.gpus_per_node,
                micro_batch=isl.micro_batch,
                accumulation=isl.accumulation,
                predicted_step_s=fit.predicted_step_s,
                observed_step_s=obs.step_seconds_p50,
                compute_scale=round(fit.compute_scale, 4),
                steps=max(1, obs.steps),
                observed_at=provenance.observed_at,
                base_digest=doc.base_digest(),
            )
        )
    if request.strategy.is_diloco and settings is not None:
        placements = [
            IslandPlacement(cost_model(i.pool), i.nodes * i.gpus_per_node) for i in islands
        ]
        out.outer = _recheck(request, out.observations, placements, settings)
    return out


def _recheck(
    request: PlanSpec,
    observations: Mapping[str, IslandObservation],
    placements: Sequence[IslandPlacement],
    settings: DiLoCoSettings,
) -> OuterRecheck | None:
    seen = [
        o
        for o in observations.values()
        if o.reason == ObserveReason.OBSERVED and o.step_seconds_p50
    ]
    synced = [o for o in seen if o.fragment_sync_seconds is not None]
    if not seen or not synced:
        return None
    step_s = max(o.step_seconds_p50 or 0.0 for o in seen)
    link = outer_link(placements)

    def model_all_reduce(fragments: int) -> list[float]:
        return fragment_all_reduce_seconds(
            request.model, request.strategy, link, len(placements), fragments
        )

    current = model_all_reduce(settings.fragments)
    mean_model = sum(current) / len(current)
    slowest = max(synced, key=lambda o: o.fragment_sync_seconds or 0.0)
    duration = slowest.fragment_sync_seconds or 0.0
    stall = slowest.sync_stall_seconds or 0.0
    blocked = stall > STALL_SIGNIFICANT * step_s
    observed = duration if blocked else min(mean_model, max(0.0, duration - stall))
    scale = observed / mean_model if mean_model > 0 else 1.0

    def all_reduce(fragments: int) -> list[float]:
        return [a * scale for a in model_all_reduce(fragments)]

    blocking = closed_form_blocking(
        all_reduce(settings.fragments), step_s, settings.fragment_sync_delay
    )
    recommended = None
    if blocks(blocking):
        rails = GuardRails.of(request.strategy, request.model.num_layers)  # as the planner's
        choice = search_settings(
            settings.sync_every,
            step_s,
            all_reduce,
            request.model.num_layers,
            max_fragment_sync_delay=rails.max_fragment_sync_delay,
            max_fragment_sync_delay_fraction=rails.max_fragment_sync_delay_fraction,
            target_fragments=rails.target_fragments,
        )
        text = (
            f"fragments {choice.fragments}, fragmentSyncDelay {choice.fragment_sync_delay} at syncEvery "
            f"{choice.sync_every}"
        )
        if not choice.zero_blocking:
            text += f" (still {choice.blocking_s_per_outer_step:.3g} s blocking"
            text += (
                f"; syncEvery ≥ {choice.sync_every_for_zero_blocking} would hide it)"
                if choice.sync_every_for_zero_blocking
                else ")"
            )
        recommended = ObservedRecommendation(
            sync_every=choice.sync_every,
            fragments=choice.fragments,
            fragment_sync_delay=choice.fragment_sync_delay,
            zero_blocking=choice.zero_blocking,
            text=text,
        )
    return OuterRecheck(round(observed, 6), not blocked, round(blocking, 6), recommended)
