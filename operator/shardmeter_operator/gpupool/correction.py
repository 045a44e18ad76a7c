"""A GPUPool's observed correction (a step of its reconcile): the samples that launched
plans observed on the pool (:mod:`~.observe.read`) merged into the ``observed`` section of the
pool's coefficients document (`shardmeter.cost.observed`), which the operator alone writes.

* **Separate and visible.** The fitted or prior coefficients are never changed: the
  correction is its own section of the ConfigMap's document and ``status.observed`` of the
  GPUPool (``source: observed``), next to ``status.source``; plans show it per pool
  (``status.coefficients[].observedComputeScale``).
* **Tied to its base.** Samples are fitted against the base coefficients; a new benchmark
  fit (or a changed pool) makes them inapplicable, and they are dropped.
* **Resettable.** Setting the annotation ``shardmeter.io/reset-observed`` to a new value
  (``kubectl annotate gpupool NAME shardmeter.io/reset-observed=$(date +%s) --overwrite``)
  drops every sample observed before, once; ``status.observed.resetToken`` echoes it.
* **Quiet.** The published scale moves only beyond `shardmeter.cost.observed.HYSTERESIS`, and
  the pool's ``coefficientsRevision`` (which re-plans the plans on the pool) follows the scale,
  not every new sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.observed import (
    ObservedCorrection,
    ObservedStepSample,
    correction,
    merge_samples,
)
from shardmeter_operator.api import GPUPoolSpec, GPUPoolStatus
from shardmeter_operator.api.observation import PoolObservedStatus
from shardmeter_operator.render.revisions import revision

RESET_ANNOTATION = "shardmeter.io/reset-observed"
Event = tuple[str, str, str]


def reset_requested(body: Mapping[str, Any]) -> bool:
    """Whether a GPUPool's reset annotation asks for a reset its status has not answered."""
    token = ((body.get("metadata") or {}).get("annotations") or {}).get(RESET_ANNOTATION) or ""
    status = GPUPoolStatus.model_validate(body.get("status") or {})
    done = status.observed.reset_token if status.observed is not None else ""
    return bool(token) and token != done


def _iso(at: datetime | None) -> str:
    return at.replace(microsecond=0).isoformat().replace("+00:00", "Z") if at else ""


def coefficients_revision(spec: GPUPoolSpec, doc: CoefficientsDocument) -> str:
    """What plans re-plan on: the pool, its base coefficients and the published scale (not
    the samples behind it). A document without an observed section hashes as before."""
    if doc.observed is None:
        return revision(spec.model_dump(), doc.to_json())
    return revision(spec.model_dump(), doc.base().to_json(), doc.observed.compute_scale)


@dataclass(frozen=True)
class CorrectionUpdate:
    """A pool's document with its observed section brought up to date."""

    document: CoefficientsDocument
    observed: PoolObservedStatus | None
    """The pool's ``status.observed``."""
    events: list[Event]
    changed: bool
    """Whether the document's observed section changed (the ConfigMap is rewritten)."""


def update_correction(
    doc: CoefficientsDocument,
    samples: Sequence[ObservedStepSample],
    annotations: Mapping[str, str],
    before: GPUPoolStatus,
    min_samples: int,
    now: datetime,
) -> CorrectionUpdate:
    """The pool's document with its observed section brought up to date, the pool's
    ``status.observed``, and Events (pure: the caller writes the ConfigMap when it changed)."""
    original = doc.observed
    digest = doc.base_digest()
    previous = _carried(original, before, digest, min_samples)
    token = annotations.get(RESET_ANNOTATION) or ""
    reset = (token, now) if token and token != previous.reset_token else None
    reset_at = reset[1] if reset else previous.reset_at
    merged = merge_samples(previous.samples, samples, digest, reset_at)
    new = correction(previous, merged, digest, now, min_samples, reset)
    if new == original:
        return CorrectionUpdate(doc, _status(doc.observed), [], changed=False)
    doc = doc.model_copy(update={"observed": new})
    return CorrectionUpdate(doc, _status(doc.observed), _events(new, original, reset), changed=True)


def _carried(
    obs: ObservedCorrection | None, before: GPUPoolStatus, digest: str, min_samples: int
) -> ObservedCorrection:
    """What still holds of the document's section: its samples and scale only for the same
    base; the reset it answered in any case (from the status when the document lost it, e.g.
    a benchmark published a new document)."""
    if obs is None:
        st = before.observed
        at = st.reset_at if st is not None else ""
        return ObservedCorrection(
            min_samples=min_samples,
            base_digest=digest,
            reset_token=st.reset_token if st is not None else "",
            reset_at=datetime.fromisoformat(at.replace("Z", "+00:00")) if at else None,
        )
    if obs.base_digest != digest:
        return obs.model_copy(
            update={"samples": [], "compute_scale": None, "sample_count": 0, "base_digest": digest}
        )
    return obs


def _status(obs: ObservedCorrection | None) -> PoolObservedStatus | None:
    if obs is None:
        return None
    return PoolObservedStatus(
        compute_scale=obs.compute_scale,
        samples=obs.sample_count,
        min_samples=obs.min_samples,
        plans=len({s.plan_uid for s in obs.samples}),
        updated_at=_iso(obs.updated_at),
        reset_at=_iso(obs.reset_at),
        reset_token=obs.reset_token,
    )


def _events(
    new: ObservedCorrection | None,
    old: ObservedCorrection | None,
    reset: tuple[str, datetime] | None,
) -> list[Event]:
    out: list[Event] = []
    if reset is not None:
        out.append(
            (
                "Normal",
                "ObservedCorrectionReset",
                f"observed samples before {_iso(reset[1])} discarded ({RESET_ANNOTATION}="
                f"{reset[0]}); plans use the base coefficients until new samples arrive",
            )
        )
    scale = new.compute_scale if new else None
    if scale != (old.compute_scale if old else None):
        if scale is None:
            text = "observed correction withdrawn: plans use the base coefficients"
        else:
            plans = len({s.plan_uid for s in new.samples}) if new else 0
            text = (
                f"observed compute scale {scale:.3g} from {new.sample_count if new else 0} "
                f"island(s) of {plans} plan(s), on top of the base coefficients; later plans "
                "on this pool use it"
            )
        out.append(("Normal", "ObservedCorrection", text))
    return out
