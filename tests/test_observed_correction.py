"""A pool's observed correction: the compute scale fitted to an observed step reproduces that
step through an independently built CostModel; the document keeps the base coefficients
untouched; samples merge, expire with their base, reset, and move the published scale only
past the hysteresis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.model import CostModel
from shardmeter.cost.observed import (
    HYSTERESIS,
    MAX_SAMPLES,
    ObservedCorrection,
    ObservedStepSample,
    correction,
    merge_samples,
)
from shardmeter.cost.priors import pool_priors
from shardmeter.sim.calibrate import MIN_SCALE, fit_compute_scale, step_at_scale
from shardmeter.sim.scenario import IslandShape, IslandStepModel
from shardmeter.spec.model import MODEL_PRESETS
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import TrainingSpec
from strategies import transformer_specs

POOL = PoolSpec(name="p", gpu="h100-80gb-sxm", nodes=4, gpus_per_node=8, network="8x-ndr")
TRAINING = TrainingSpec(seq_len_tokens=4096, global_batch_tokens=2**20)
MODEL = MODEL_PRESETS["llama-3.1-8b"]
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def with_scale(scale: float) -> CoefficientsDocument:
    doc = pool_priors(POOL, name="p")
    return doc.model_copy(
        update={"observed": ObservedCorrection(compute_scale=scale, sample_count=3)}
    )


def sample(
    island: str, scale: float, at: datetime = T0, base: str = "b", uid: str = "u"
) -> ObservedStepSample:
    return ObservedStepSample(
        plan="ns/p",
        plan_uid=uid,
        revision="r",
        island=island,
        nodes=1,
        gpus_per_node=8,
        micro_batch=1,
        accumulation=4,
        predicted_step_s=1.0,
        observed_step_s=scale,
        compute_scale=scale,
        steps=100,
        observed_at=at,
        base_digest=base,
    )


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("ratio", [0.7, 1.3, 2.5])
def test_fitted_scale_reproduces_the_observed_step_through_the_cost_model(
    nodes: int, ratio: float
) -> None:
    base = IslandStepModel(CostModel(MODEL, TRAINING, POOL), IslandShape(nodes, 8), 1)
    observed = base.step_s(4) * ratio
    fit = fit_compute_scale(base.durations, 4, observed, gradient_sync=base.gradient_sync)
    assert fit.reachable and fit.predicted_step_s == pytest.approx(base.step_s(4))
    corrected = CostModel(MODEL, TRAINING, POOL, with_scale(fit.compute_scale))
    again = IslandStepModel(corrected, IslandShape(nodes, 8), 1).step_s(4)
    assert again == pytest.approx(observed, rel=1e-3)
    if nodes == 2:  # communication overlaps and slows compute: not the plain ratio
        assert abs(fit.compute_scale - ratio) > 0.01


def test_a_step_shorter_than_its_communication_is_not_reachable() -> None:
    slow = PoolSpec.model_validate({**POOL.model_dump(), "network": "1x-100gbe"})
    base = IslandStepModel(CostModel(MODEL, TRAINING, slow), IslandShape(2, 8), 1)
    floor = step_at_scale(base.durations, 4, MIN_SCALE, gradient_sync=base.gradient_sync)
    fit = fit_compute_scale(base.durations, 4, floor / 2, gradient_sync=base.gradient_sync)
    assert not fit.reachable and fit.compute_scale == MIN_SCALE
    with pytest.raises(ValueError, match="observed_step_s"):
        fit_compute_scale(base.durations, 4, float("nan"))


@settings(max_examples=15, deadline=None)
@given(transformer_specs(), st.floats(0.05, 5.0), st.floats(1.01, 3.0))
def test_the_step_never_shrinks_as_compute_grows(spec, scale, more) -> None:  # type: ignore[no-untyped-def]
    pool = PoolSpec(name="p", gpu="a100-80gb-sxm", nodes=2, gpus_per_node=8)
    model = IslandStepModel(
        CostModel(spec, TrainingSpec(seq_len_tokens=1024, global_batch_tokens=2**16), pool),
        IslandShape(2, 8),
        1,
    )
    lo = step_at_scale(model.durations, 3, scale, gradient_sync=model.gradient_sync)
    hi = step_at_scale(model.durations, 3, scale * more, gradient_sync=model.gradient_sync)
    assert hi >= lo * (1 - 1e-12)  # what the root finder relies on


def test_the_correction_scales_compute_only_and_survives_the_prior_rebuild() -> None:
    plain, scaled = (
        CostModel(MODEL, TRAINING, POOL),
        CostModel(MODEL, TRAINING, POOL, with_scale(1.5)),
    )
    assert scaled.compute_scale == 1.5 and plain.compute_scale == 1.0
    a, b = plain.unit_times(2), scaled.unit_times(2)
    for field in ("block_forward_s", "block_backward_s", "head_forward_s", "embedding_forward_s"):
        assert getattr(b, field) == pytest.approx(1.5 * getattr(a, field))
    assert scaled.optimizer_seconds(8) == pytest.approx(1.5 * plain.optimizer_seconds(8))
    payload = 2e8
    assert scaled.collective_seconds("all_gather", payload, 2, 8) == plain.collective_seconds(
        "all_gather", payload, 2, 8
    )
    assert scaled.coefficients.observed is not None  # kept on the per-model prior
    assert scaled.coefficients.compute == plain.coefficients.compute  # the base is untouched


def test_the_document_round_trips_and_its_base_ignores_the_correction() -> None:
    doc = with_scale(1.25)
    again = CoefficientsDocument.from_configmap_data(doc.to_configmap_data())
    assert again == doc and again.to_configmap_data()["observed-compute-scale"] == "1.25"
    assert doc.base().observed is None
    assert (
        doc.base_digest()
        == pool_priors(POOL, name="p")
        .model_copy(update={"created_at": doc.created_at})
        .base_digest()
    )


def test_samples_merge_by_island_and_expire_with_their_base_or_a_reset() -> None:
    old = [sample("a", 1.0), sample("b", 1.2)]
    newer = [sample("a", 1.4, T0 + timedelta(minutes=1)), sample("c", 1.1, base="other")]
    merged = merge_samples(old, newer, "b", None)
    assert {(s.island, s.compute_scale) for s in merged} == {("a", 1.4), ("b", 1.2)}
    assert merge_samples(old, newer, "b", T0 + timedelta(seconds=30)) == [newer[0]]
    many = [sample(f"i{k}", 1.0, T0 + timedelta(seconds=k)) for k in range(MAX_SAMPLES + 5)]
    kept = merge_samples([], many, "b", None)
    assert len(kept) == MAX_SAMPLES and kept[0].island == "i5"  # the most recent


def test_the_scale_is_the_median_moves_past_the_hysteresis_and_is_withdrawn() -> None:
    s3 = [sample("a", 1.0), sample("b", 1.2), sample("c", 5.0)]  # one slow island
    first = correction(None, s3, "b", T0, min_samples=3)
    assert first is not None and first.compute_scale == 1.2 and first.updated_at == T0
    assert correction(None, s3[:2], "b", T0, min_samples=3).compute_scale is None  # type: ignore[union-attr]
    nudged = [*s3[:1], sample("b", 1.2 * (1 + HYSTERESIS / 2)), s3[2]]
    later = T0 + timedelta(hours=1)
    kept = correction(first, nudged, "b", later, min_samples=3)
    assert kept is not None and kept.compute_scale == 1.2 and kept.updated_at == T0
    moved = correction(first, [*s3[:1], sample("b", 1.5), s3[2]], "b", later, min_samples=3)
    assert moved is not None and moved.compute_scale == 1.5 and moved.updated_at == later
    withdrawn = correction(first, s3[:1], "b", later, min_samples=3)
    assert withdrawn is not None and withdrawn.compute_scale is None
    assert correction(None, [], "b", T0) is None
    reset = correction(first, [], "b", later, reset=("tok", later))
    assert reset is not None and reset.reset_token == "tok" and reset.compute_scale is None
