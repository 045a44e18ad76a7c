"""A pool's correction learned from running training: the compute scale at which the model
reproduces the inner step times observed on the pool's launched islands.

The correction is a separate section of the coefficients document
(`CoefficientsDocument.observed`), never a change to the fitted (or prior) coefficients
beneath it:

* every **sample** is one island of one launch (plan, launch revision, island): its shape, the
  inner step the model predicts with the *base* coefficients (the document without this
  section), the observed median inner step, and ``compute_scale`` — the factor on every
  compute task (forward, backward, recompute, optimizer step, FSDP's copies) at which the
  simulated step equals the observed one (`shardmeter.sim.calibrate`). A later read of the
  same island replaces its sample, so reading often does not multiply the evidence;
* a sample is tied to the base it was fitted against (``base_digest``): when the base changes
  (a benchmark publishes a new fit) the samples no longer apply and are dropped;
* the pool's ``compute_scale`` is the **median** of its samples' scales once there are at
  least ``min_samples`` of them: one slow island (a bad node) moves a median little and is
  reported by its plan's drift instead of being learned;
* a **reset** (``reset_at``) drops every sample taken before it.

`CostModel` multiplies its compute times by ``compute_scale`` when the section has one.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_SAMPLES = 64
"""Samples a document keeps (the most recent ones)."""
DEFAULT_MIN_SAMPLES = 2
"""Samples (islands) a correction needs before it is applied."""
HYSTERESIS = 0.02
"""A published scale changes only when the samples' median moves by more than this fraction
(so that every new read does not re-plan every plan on the pool)."""
SCALE_DECIMALS = 3


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObservedStepSample(_Doc):
    """One island of one launch, as last observed."""

    plan: str = Field(max_length=253)
    """``namespace/name`` of the TrainingPlan."""
    plan_uid: str = Field(max_length=64)
    revision: str = Field(default="", max_length=64)
    """The launch revision the island belongs to (a relaunch is a new sample)."""
    island: str = Field(max_length=63)
    model: str = Field(default="", max_length=128)
    """What was trained (preset name or description), for provenance."""
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    micro_batch: int = Field(ge=1)
    accumulation: int = Field(ge=1)
    predicted_step_s: float = Field(gt=0)
    """The inner step the model predicts with the base coefficients."""
    observed_step_s: float = Field(gt=0)
    """The observed median inner step (outer-step stalls removed)."""
    compute_scale: float = Field(gt=0)
    """The compute factor at which the simulated step equals ``observed_step_s``."""
    steps: int = Field(ge=1)
    """Inner steps the observation window covered."""
    observed_at: datetime
    base_digest: str = Field(max_length=64)
    """Digest of the base coefficients ``predicted_step_s`` and ``compute_scale`` refer to."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.plan_uid, self.revision, self.island)


class ObservedCorrection(_Doc):
    """The observed correction of one pool (a section of its coefficients document)."""

    source: Literal["observed"] = "observed"
    compute_scale: float | None = Field(default=None, gt=0)
    """Multiplies every compute time of the base coefficients; None while fewer than
    ``min_samples`` samples exist (nothing is applied then)."""
    sample_count: int = 0
    min_samples: int = Field(default=DEFAULT_MIN_SAMPLES, ge=1)
    base_digest: str = Field(default="", max_length=64)
    """The base coefficients the samples were fitted against."""
    updated_at: datetime | None = None
    """When ``compute_scale`` last changed."""
    reset_at: datetime | None = None
    """Samples observed before this were discarded (a reset)."""
    reset_token: str = Field(default="", max_length=253)
    """The reset request this reset answered (the GPUPool annotation's value)."""
    samples: list[ObservedStepSample] = Field(default_factory=list, max_length=MAX_SAMPLES)

    @property
    def active(self) -> bool:
        return self.compute_scale is not None


def digest(text: str) -> str:
    """A short stable digest of a base document's JSON."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def merge_samples(
    kept: Iterable[ObservedStepSample],
    new: Iterable[ObservedStepSample],
    base_digest: str,
    reset_at: datetime | None,
) -> list[ObservedStepSample]:
    """The samples that still apply: fitted against ``base_digest``, observed after
    ``reset_at``; a newer sample of the same (plan, revision, island) replaces an older one;
    the most recent `MAX_SAMPLES`, oldest first."""
    by_key: dict[tuple[str, str, str], ObservedStepSample] = {}
    for s in [*kept, *new]:
        if s.base_digest != base_digest or (reset_at is not None and s.observed_at < reset_at):
            continue
        old = by_key.get(s.key)
        if old is None or s.observed_at >= old.observed_at:
            by_key[s.key] = s
    ordered = sorted(by_key.values(), key=lambda s: (s.observed_at, s.key))
    return ordered[-MAX_SAMPLES:]


def correction(
    previous: ObservedCorrection | None,
    samples: Sequence[ObservedStepSample],
    base_digest: str,
    now: datetime,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    reset: tuple[str, datetime] | None = None,
) -> ObservedCorrection | None:
    """The pool's correction from its ``samples`` (already merged): the median compute scale
    once ``min_samples`` exist, kept at the previous value while the median stays within
    `HYSTERESIS` of it. ``reset`` = (token, time) records a reset. None when there is nothing
    to record (no samples and no reset)."""
    reset_token, reset_at = (
        reset
        if reset is not None
        else ((previous.reset_token, previous.reset_at) if previous else ("", None))
    )
    if not samples and not reset_token:
        return None
    scale: float | None = None
    updated_at = previous.updated_at if previous else None
    if len(samples) >= min_samples:
        median = round(statistics.median(s.compute_scale for s in samples), SCALE_DECIMALS)
        old = previous.compute_scale if previous and previous.base_digest == base_digest else None
        if old is not None and abs(median / old - 1) <= HYSTERESIS:
            scale = old
        else:
            scale, updated_at = median, now
    elif previous is not None and previous.compute_scale is not None:
        updated_at = now  # withdrawn (reset, new base, or samples expired)
    return ObservedCorrection(
        compute_scale=scale,
        sample_count=len(samples),
        min_samples=min_samples,
        base_digest=base_digest,
        updated_at=updated_at,
        reset_at=reset_at,
        reset_token=reset_token,
        samples=list(samples),
    )
