"""Physical floors of the compute coefficients: the fewest FLOPs each feature unit must
execute, so that no fitted coefficient implies a rate above the device's peak.

A coefficient of a FLOP feature is seconds per unit; one unit executes at least
``FLOPS_PER_UNIT[target][feature]`` FLOPs, so the coefficient can never be below that many
FLOPs ÷ peak FLOP/s. Unconstrained, a fit once put the Q/O projections at 194 GFLOP/s on a
CPU whose probed peak was 117 (the MLP feature absorbed the difference), and such a fit
extrapolates badly to a new architecture. The counts are the ones every matmul executes
(2 FLOPs per multiply-add; backward computes the input and the weight gradient, twice the
forward), and attention counts only the causal half (what a flash kernel executes), so the
floors are lower bounds, never estimates. Features of memory-bound work (norms, the
activation function, softmax, gradient buffers, the optimizer) have no FLOP floor.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shardmeter.cost.coefficients import ComputeSample
from shardmeter.cost.features import Target, feature_values
from shardmeter.spec.model import TransformerSpec

FLOPS_PER_UNIT: dict[Target, dict[str, float]] = {
    # t_h_q = t·h·q_dim covers Q and O (2 matrices × 2 FLOPs); t_h_kv likewise K and V;
    # t_h_i already counts the MLP matrices (2 FLOPs each); t_s_q: QKᵀ and AV over the
    # causal half, 2·(t·s·q_dim/2)·2.
    Target.BLOCK_FORWARD: {"t_h_q": 4.0, "t_h_kv": 4.0, "t_h_i": 2.0, "t_s_q": 2.0},
    Target.BLOCK_BACKWARD: {"t_h_q": 8.0, "t_h_kv": 8.0, "t_h_i": 4.0, "t_s_q": 4.0},
    Target.HEAD_FORWARD: {"t_h_v": 2.0},
    Target.HEAD_BACKWARD: {"t_h_v": 4.0},
}

BYTES_PER_UNIT: dict[Target, dict[str, float]] = {
    # t_v = t·V logits: the loss's log-softmax reads FP32 logits and writes FP32
    # log-probabilities (forward); its gradient reads those and writes the logits' gradient.
    Target.HEAD_FORWARD: {"t_v": 8.0},
    Target.HEAD_BACKWARD: {"t_v": 8.0},
}


def lower_bounds(
    target: Target,
    feature_names: Sequence[str],
    peak_flop_per_s: float | None,
    bandwidth_bytes_per_s: float | None = None,
) -> list[float]:
    """Seconds-per-unit floor of each feature: FLOPs per unit ÷ the peak, or bytes per unit ÷
    the memory bandwidth (0 without a count, or without the rate it needs)."""
    for name, rate in (("peak_flop_per_s", peak_flop_per_s), ("bandwidth", bandwidth_bytes_per_s)):
        if rate is not None and not rate > 0:
            raise ValueError(f"{name} must be > 0 (got {rate})")
    flops = FLOPS_PER_UNIT.get(target, {})
    moved = BYTES_PER_UNIT.get(target, {})

    def floor(feature: str) -> float:
        if peak_flop_per_s is not None and feature in flops:
            return flops[feature] / peak_flop_per_s
        if bandwidth_bytes_per_s is not None and feature in moved:
            return moved[feature] / bandwidth_bytes_per_s
        return 0.0

    return [floor(f) for f in feature_names]


def executed_flops(sample: ComputeSample) -> float:
    """The fewest FLOPs the sample's unit must have executed (0 for targets without)."""
    flops = FLOPS_PER_UNIT.get(sample.target)
    if not flops:
        return 0.0
    spec = TransformerSpec.model_validate(sample.model)
    values = feature_values(spec, sample.micro_batch, sample.seq_len, sample.params_local)
    return sum(n * values[f] for f, n in flops.items())


def demonstrated_flop_per_s(samples: Iterable[ComputeSample]) -> float:
    """The highest rate any sample proves the device reached (its executed FLOPs ÷ its
    seconds, both lower bounds): the peak is at least this, whatever a probe said."""
    return max((executed_flops(s) / s.seconds for s in samples), default=0.0)
