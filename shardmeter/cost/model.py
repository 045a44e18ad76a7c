"""`CostModel`: one model on one pool — per-unit compute seconds, collective seconds,
memory and FLOPs — evaluated from a coefficients document (measured or prior)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from shardmeter.cost.coefficients import CoefficientsDocument, CollectiveFit, LinkRole
from shardmeter.cost.features import CANDIDATE_FEATURES, Target, feature_values
from shardmeter.cost.memory import MemoryBreakdown, max_micro_batch, memory_breakdown
from shardmeter.cost.priors import prior_coefficients
from shardmeter.cost.regression import ring_seconds
from shardmeter.errors import SpecError
from shardmeter.spec.hardware import GPUSpec, PoolSpec
from shardmeter.spec.model import TransformerSpec
from shardmeter.spec.training import TrainingSpec

HOST_LINK_BYTES_PER_S = 25e9
"""Achievable GPU↔host copy bandwidth (PCIe 4.0 x16, pinned memory); conservative for PCIe 5."""


@dataclass(frozen=True)
class UnitTimes:
    """Seconds of each FSDP unit's forward and backward pass for one micro-batch.

    ``block_backward_s`` includes the forward recomputation when activation checkpointing
    is on. ``roofline_clamped`` names the targets whose regression predicted less than
    executed FLOPs ÷ peak FLOP/s; those were raised to that bound (see `CostModel`)."""

    embedding_forward_s: float
    embedding_backward_s: float
    block_forward_s: float
    block_backward_s: float
    head_forward_s: float
    head_backward_s: float
    roofline_clamped: tuple[str, ...] = ()


@dataclass(frozen=True)
class UnitPayloads:
    """Parameters per FSDP unit (embedding, one block, final norm + head)."""

    embedding_params: int
    block_params: int
    head_params: int


class CostModel:
    """Predicts compute, communication and memory for ``model`` trained per ``training``
    on ``pool``. ``coefficients`` defaults to the pool's datasheet priors.

    **Roofline guard.** A compute prediction below executed FLOPs ÷ peak FLOP/s is
    physically impossible; it is *clamped* to that bound and flagged in
    ``UnitTimes.roofline_clamped`` rather than raised, because planning must go on when a
    fitted model extrapolates badly — the flag surfaces in every report instead.
    """

    def __init__(
        self,
        model: TransformerSpec,
        training: TrainingSpec,
        pool: PoolSpec,
        coefficients: CoefficientsDocument | None = None,
    ) -> None:
        self.model = model
        self.training = training
        self.pool = pool
        if coefficients is None:
            coefficients = prior_coefficients(
                pool.gpu, pool.intra, pool.inter, training.precision, pool.name
            )
        elif coefficients.gpu.name.lower() != pool.gpu.name.lower():
            raise SpecError(
                f"pools[{pool.name}].coefficients",
                f"were measured on {coefficients.gpu.name!r} but the pool's GPU is "
                f"{pool.gpu.name!r}; use that pool's own coefficients or drop them to use priors",
            )
        if coefficients.precision is not training.precision:
            raise SpecError(
                "training.precision",
                f"is {training.precision.value} but pool {pool.name!r} coefficients were "
                f"fitted at {coefficients.precision.value}; "
                f"set precision: {coefficients.precision.value}",
            )
        self.coefficients = coefficients
        self.gpu: GPUSpec = coefficients.gpu
        self.peak_flop_per_s = self.gpu.peak_flop_per_s(training.precision.value)
        self._unit_times = lru_cache(maxsize=256)(self._compute_unit_times)
        self._collectives: dict[tuple[str, float, int, int], float] = {}

    # ---- compute --------------------------------------------------------------------------
    def _predict(self, target: Target, values: dict[str, float]) -> float:
        coefs = self.coefficients.compute[target].coefficients
        return sum(c * values[f] for f, c in coefs.items() if f in CANDIDATE_FEATURES[target])

    def unit_times(self, micro_batch: int) -> UnitTimes:
        """Per-unit seconds at ``micro_batch`` sequences per GPU (cached)."""
        return self._unit_times(micro_batch)

    def _compute_unit_times(self, micro_batch: int) -> UnitTimes:
        s = self.training.seq_len_tokens
        values = feature_values(self.model, micro_batch, s)
        tokens = micro_batch * s
        block_flops = self.model.block_forward_flops_executed(tokens, s)
        head_flops = self.model.head_forward_flops(tokens)
        floors = {
            Target.EMBEDDING_FORWARD: 0.0,
            Target.EMBEDDING_BACKWARD: 0.0,
            Target.BLOCK_FORWARD: block_flops / self.peak_flop_per_s,
            Target.BLOCK_BACKWARD: 2 * block_flops / self.peak_flop_per_s,
            Target.HEAD_FORWARD: head_flops / self.peak_flop_per_s,
            Target.HEAD_BACKWARD: 2 * head_flops / self.peak_flop_per_s,
        }
        out: dict[Target, float] = {}
        clamped: list[str] = []
        for target, floor in floors.items():
            value = self._predict(target, values)
            if value < floor:
                clamped.append(target.value)
                value = floor
            out[target] = value
        block_bwd = out[Target.BLOCK_BACKWARD]
        if self.training.activation_checkpointing:
            block_bwd += out[Target.BLOCK_FORWARD]
        return UnitTimes(
            embedding_forward_s=out[Target.EMBEDDING_FORWARD],
            embedding_backward_s=out[Target.EMBEDDING_BACKWARD],
            block_forward_s=out[Target.BLOCK_FORWARD],
            block_backward_s=block_bwd,
            head_forward_s=out[Target.HEAD_FORWARD],
            head_backward_s=out[Target.HEAD_BACKWARD],
            roofline_clamped=tuple(clamped),
        )

    def optimizer_seconds(self, ranks: int) -> float:
        values = feature_values(self.model, 0, 0, params_local=self.model.total_params / ranks)
        return self._predict(Target.OPTIMIZER_STEP, values)

    # ---- communication --------------------------------------------------------------------
    def link_fit(self, collective: str, nodes: int) -> CollectiveFit:
        """Coefficients of ``collective`` for an island spanning ``nodes`` nodes: the intra-node
        fit inside one node; across nodes the slowest of intra- and inter-node (max latency,
        max seconds per byte), since a ring is as slow as its slowest hop (paper §III-B)."""
        intra = self.coefficients.communication[LinkRole.INTRA_NODE][collective]
        if nodes <= 1:
            return intra
        inter = self.coefficients.communication[LinkRole.INTER_NODE][collective]
        return CollectiveFit(
            latency_s=max(intra.latency_s, inter.latency_s),
            seconds_per_byte=max(intra.seconds_per_byte, inter.seconds_per_byte),
            link=inter.link,
        )

    def collective_seconds(
        self, collective: str, payload_bytes: float, nodes: int, gpus_per_node: int
    ) -> float:
        """Ring ``collective`` of a full payload over nodes × gpus_per_node ranks (cached)."""
        key = (collective, payload_bytes, nodes, gpus_per_node)
        seconds = self._collectives.get(key)
        if seconds is None:
            fit = self.link_fit(collective, nodes)
            seconds = ring_seconds(
                collective,
                payload_bytes,
                nodes * gpus_per_node,
                fit.latency_s,
                fit.seconds_per_byte,
            )
            self._collectives[key] = seconds
        return seconds

    def payloads(self) -> UnitPayloads:
        m = self.model
        return UnitPayloads(m.params_embedding, m.params_per_block, m.params_head)

    def outer_step_seconds(self, fragment_params: int, ranks: int, state_on_gpu: bool) -> float:
        """DiLoCo outer optimizer step (Nesterov SGD) and merge for one fragment on one rank.

        Estimated with the optimizer-step regression at the fragment's parameters per rank
        (outer SGD with momentum moves fewer bytes than AdamW, so this errs long). When the
        outer state lives on the CPU (torchft's default) the fragment's FP32 parameters also
        cross PCIe to the host and back, at ``HOST_LINK_BYTES_PER_S``.
        """
        local = fragment_params / ranks
        values = feature_values(self.model, 0, 0, params_local=local)
        seconds = self._predict(Target.OPTIMIZER_STEP, values)
        if not state_on_gpu:
            seconds += 2 * 4 * local / HOST_LINK_BYTES_PER_S
        return seconds

    # ---- memory ---------------------------------------------------------------------------
    def memory(
        self, ranks: int, micro_batch: int, accumulation: int = 1, outer_state_on_gpu: bool = False
    ) -> MemoryBreakdown:
        return memory_breakdown(
            self.model,
            self.training,
            ranks,
            micro_batch,
            float(self.pool.gpu.memory_bytes),
            self.coefficients.memory,
            accumulation,
            outer_state_on_gpu,
        )

    def max_micro_batch(
        self, ranks: int, accumulation: int = 1, outer_state_on_gpu: bool = False
    ) -> int:
        return max_micro_batch(
            self.model,
            self.training,
            ranks,
            float(self.pool.gpu.memory_bytes),
            self.coefficients.memory,
            accumulation,
            outer_state_on_gpu,
        )

    # ---- FLOPs ----------------------------------------------------------------------------
    def model_flops_per_micro_step(self, micro_batch: int) -> float:
        """Model FLOPs (forward + backward) of one GPU's micro-batch."""
        tokens = micro_batch * self.training.seq_len_tokens
        return tokens * self.model.training_flops_per_token(self.training.seq_len_tokens)
