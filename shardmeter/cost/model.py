"""`CostModel`: one model on one pool — per-unit compute seconds, collective seconds,
memory and FLOPs — evaluated from a coefficients document (measured or prior) and the
training options (activation checkpointing mode, ``torch.compile``, float8, HSDP, power cap).

**From coefficients to unit times.** A coefficients document gives each unit's forward and
backward seconds as Σ c_f·f over shape features, for eager execution at the document's
precision. Every feature belongs to one kind of work — matmuls (``t_h_q``, ``t_h_kv``,
``t_h_i``, ``t_h_v``), attention (``t_s_q``), memory-bound element-wise work (``t_h``, ``t_i``,
``t_v``, ``v_h``) or launch overhead (``one``) — so the options act on the kinds they change:

* ``torch.compile`` scales the block element-wise terms (and the head's, when the loss is
  compiled too: ``torchCompileLoss``) by the ratio of fused to eager bytes
  (`shardmeter.cost.elementwise`: Inductor fuses each element-wise chain between two matmuls
  into one kernel);
* float8 (``precision: fp8``) scales the blocks' matmul terms by the ratio of achieved BF16 to
  achieved FP8 matmul throughput and adds the casts' bytes; the LM head stays in BF16, as in
  torchtitan;
* a power cap divides matmul and attention terms by the clock fraction of
  `shardmeter.cost.power` (memory-bound work keeps the HBM clock);
* with prior coefficients, the matmul terms are further divided by the sustained-clock ratio
  of `shardmeter.cost.power.sustained_clock_ratio`: the MAMF benchmark behind
  ``matmul_efficiency`` keeps the tensor cores busy only part of the time, a training step
  for its matmul and attention share of the micro-step (its *tensor duty cycle*), and a
  power-limited GPU clocks lower the busier its tensor cores are (measured coefficients
  were timed inside training-like passes and are left as measured);
* activation checkpointing adds the recomputed forward work to the block backward:
  ``full`` the whole forward, ``selective-layer`` every k-th block's forward (averaged over
  the blocks), ``selective-op`` the matmuls torchtitan's policy does not save (K, O and the
  MLP up projection of a gated MLP; K, O and down for a plain one) plus all element-wise
  work, attention excluded.

**Host overhead** (`shardmeter.cost.host`): with priors, each unit pass takes the larger of
its GPU time and the host time of launching its kernels (eager or compiled, float8 casts
included; activation checkpointing re-launches the recomputed forward in the backward). A
measured document timed what the step paid, launch gaps included, and is left as measured.

**Observed correction** (`shardmeter.cost.observed`): its compute scale multiplies every
compute time (after the roofline guard), never a collective; priors rebuilt keep it.
"""

from __future__ import annotations

from functools import lru_cache

from shardmeter.cost.attention import prior_shape, relative_speed
from shardmeter.cost.coefficients import CoefficientsDocument, CollectiveFit, LinkRole, Source
from shardmeter.cost.collectives import Topology, replica_all_reduce_seconds, ring_seconds
from shardmeter.cost.elementwise import block_bytes, float8_cast_bytes, head_bytes
from shardmeter.cost.features import CANDIDATE_FEATURES, Target, feature_values
from shardmeter.cost.host import HostSeconds, raise_to_host, recompute_share, unit_host_seconds
from shardmeter.cost.memory import MemoryBreakdown, max_micro_batch, memory_breakdown
from shardmeter.cost.outer_precision import conversion_seconds
from shardmeter.cost.power import clock_fraction
from shardmeter.cost.priors import network_prior, pool_priors
from shardmeter.cost.step import sustained_step_parts
from shardmeter.cost.units import (
    ATTENTION_FEATURES,
    ELEMENTWISE_FEATURES,
    MATMUL_FEATURES,
    TENSOR_FEATURES,
    StepParts,
    UnitPayloads,
    UnitTimes,
    WorkSplit,
)
from shardmeter.errors import SpecError
from shardmeter.spec.hardware import GPUSpec
from shardmeter.spec.model import MLPKind, TransformerSpec
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import (
    ActivationCheckpointing,
    AttentionKernel,
    GradientSync,
    Precision,
    Sharding,
    TrainingSpec,
)

HOST_LINK_BYTES_PER_S = 25e9
"""Achievable GPU↔host copy bandwidth (PCIe 4.0 x16, pinned memory); conservative for PCIe 5."""


def _check_options(model: TransformerSpec, training: TrainingSpec, pool: PoolSpec) -> None:
    if training.precision is Precision.FP8 and not pool.gpu.supports_fp8:
        raise SpecError(
            "training.precision",
            f"fp8 (float8 matmuls) needs FP8 tensor cores with torchao support (H100, H200); "
            f"pool {pool.name!r} has {pool.gpu.name}: use bf16",
        )
    if (
        training.activation_checkpointing is ActivationCheckpointing.SELECTIVE_LAYER
        and training.activation_checkpointing_every > model.num_layers
    ):
        raise SpecError(
            "training.activationCheckpointingEvery",
            f"{training.activation_checkpointing_every} exceeds the model's "
            f"{model.num_layers} blocks, so no block would be checkpointed",
        )


class CostModel:
    """Predicts compute, communication and memory for ``model`` trained per ``training``
    on ``pool``. ``coefficients`` defaults to the pool's datasheet priors (a prior document
    is rebuilt for this model's shape; see `shardmeter.cost.priors`).

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
        _check_options(model, training, pool)
        self.model = model
        self.training = training
        self.pool = pool
        base = training.precision.base
        if coefficients is not None and coefficients.gpu.name.lower() != pool.gpu.name.lower():
            raise SpecError(
                f"pools[{pool.name}].coefficients",
                f"were measured on {coefficients.gpu.name!r} but the pool's GPU is "
                f"{pool.gpu.name!r}; use that pool's own coefficients or drop them to use priors",
            )
        if coefficients is not None and coefficients.precision is not base:
            raise SpecError(
                "training.precision",
                f"is {training.precision.value} but pool {pool.name!r} coefficients were "
                f"fitted at {coefficients.precision.value}; "
                f"set precision: {coefficients.precision.value}",
            )
        observed = coefficients.observed if coefficients is not None else None
        if coefficients is None or coefficients.source is Source.PRIOR:
            coefficients = pool_priors(pool, base, pool.name, model)
            if observed is not None:
                coefficients = coefficients.model_copy(update={"observed": observed})
        else:
            coefficients = self._per_node_network(coefficients)
        self.coefficients = coefficients
        self.compute_scale = coefficients.compute_scale  # the observed correction (1.0: none)
        self.gpu: GPUSpec = coefficients.gpu
        self.peak_flop_per_s = self.gpu.peak_flop_per_s(training.precision.value)
        timed_with = (
            AttentionKernel.FLASH2
            if coefficients.source is Source.PRIOR
            else coefficients.attention_kernel
        )
        self.attention_speed = relative_speed(
            training.attention_kernel, timed_with, self.gpu, model.head_width
        )
        """(forward, backward) speed of the job's attention kernel against the one the
        coefficients' attention rate stands for (`shardmeter.cost.attention`)."""
        flash = coefficients.source is Source.PRIOR and base is not Precision.FP32
        self.attention_shape = (
            prior_shape(self.gpu, model.head_width, training.seq_len_tokens)
            if flash
            else (1.0, 1.0)
        )
        """(forward, backward) FlashAttention-2's rate at the model's head dim and length ÷
        the prior's (head dim 128, the GPU's reference length); 1 for measured coefficients
        and FP32 (no flash kernel)."""
        self.host: HostSeconds | None = (
            unit_host_seconds(
                model,
                training.torch_compile,
                training.torch_compile_loss,
                training.precision is Precision.FP8,
                training.attention_kernel,
            )
            if coefficients.source is Source.PRIOR
            else None
        )
        """Host seconds of each unit pass (priors only; see the module docstring)."""
        self.clock_fraction = clock_fraction(
            pool.gpu, pool.power_cap_watts, f"pools[{pool.name}].powerCapWatts"
        )
        network = pool.node_network
        self.topology = Topology(pool.gpus_per_node, network.nics_per_node)
        self._unit_times = lru_cache(maxsize=256)(self._compute_unit_times)
        self._collectives: dict[tuple[str, float, int, int], float] = {}

    def _per_node_network(self, doc: CoefficientsDocument) -> CoefficientsDocument:
        """A measured document's inter-node fits as node-level bus bandwidth: a fit of
        ``parallel_rings`` concurrent rings (one per rail) moves that many times one ring's
        bytes; a fit written before topology (None) is one rail per GPU of the pool's nodes;
        an inter-node collective never measured (one-node benchmark) takes the pool's
        node-network prior."""
        prior = network_prior(self.pool.node_network)
        fits: dict[str, CollectiveFit] = {}
        for name, fit in doc.communication[LinkRole.INTER_NODE].items():
            if fit.n_samples == 0:
                fits[name] = prior
                continue
            rings = fit.parallel_rings or self.pool.gpus_per_node
            fits[name] = fit.model_copy(
                update={"seconds_per_byte": fit.seconds_per_byte / rings, "parallel_rings": 1}
            )
        return doc.model_copy(
            update={"communication": {**doc.communication, LinkRole.INTER_NODE: fits}}
        )

    # ---- compute --------------------------------------------------------------------------
    def _split(self, target: Target, values: dict[str, float]) -> dict[str, float]:
        coefs = self.coefficients.compute[target].coefficients
        return {f: c * values[f] for f, c in coefs.items() if f in CANDIDATE_FEATURES[target]}

    def _work(self, parts: dict[str, float]) -> WorkSplit:
        return WorkSplit(
            matmul_s=sum(v for f, v in parts.items() if f in MATMUL_FEATURES),
            attention_s=sum(v for f, v in parts.items() if f in ATTENTION_FEATURES),
            elementwise_s=sum(v for f, v in parts.items() if f in ELEMENTWISE_FEATURES),
            launch_s=sum(
                v
                for f, v in parts.items()
                if f not in MATMUL_FEATURES | ATTENTION_FEATURES | ELEMENTWISE_FEATURES
            ),
        )

    def _compile_factor(self, kind: str) -> float:
        """Fused ÷ eager element-wise bytes of this model (block width/intermediate, head)."""
        m = self.model
        if kind == "block":
            eager, fused = block_bytes(m), block_bytes(m, compiled=True)
            return fused.total / eager.total
        eager_h, fused_h = head_bytes(m), head_bytes(m, compiled=True)
        return sum(fused_h) / sum(eager_h)

    def _block_parts(
        self, target: Target, values: dict[str, float], tokens: int
    ) -> dict[str, float]:
        """Per-feature seconds of one block pass after compile / float8 / power cap."""
        parts = self._split(target, values)
        t = self.training
        clock = self.clock_fraction
        if t.torch_compile:
            factor = self._compile_factor("block")
            parts = {f: v * factor if f in ELEMENTWISE_FEATURES else v for f, v in parts.items()}
        if t.precision is Precision.FP8:
            g = self.gpu
            assert g.peak_fp8_flop_per_s is not None  # checked in _check_options
            ratio = (g.peak_bf16_flop_per_s * g.matmul_efficiency) / (
                g.peak_fp8_flop_per_s * g.fp8_matmul_efficiency
            )
            parts = {f: v * ratio if f in MATMUL_FEATURES else v for f, v in parts.items()}
            cast = float8_cast_bytes(self.model, compiled=t.torch_compile)
            cast_bytes = cast.forward if target is Target.BLOCK_FORWARD else cast.backward
            bw = g.hbm_bandwidth_bytes_per_s * g.memory_efficiency
            parts["float8_cast"] = tokens * cast_bytes / bw
        (fwd_speed, bwd_speed), (fwd_shape, bwd_shape) = self.attention_speed, self.attention_shape
        forward = target is Target.BLOCK_FORWARD
        speed = fwd_speed * fwd_shape if forward else bwd_speed * bwd_shape
        rate = {f: clock for f in MATMUL_FEATURES} | {f: clock * speed for f in ATTENTION_FEATURES}
        return {f: v / rate.get(f, 1.0) for f, v in parts.items()}

    def _head_parts(self, target: Target, values: dict[str, float]) -> dict[str, float]:
        parts = self._split(target, values)
        if self.training.torch_compile and self.training.torch_compile_loss:
            factor = self._compile_factor("head")
            parts = {f: v * factor if f in ELEMENTWISE_FEATURES else v for f, v in parts.items()}
        clock = self.clock_fraction
        return {f: v / clock if f in MATMUL_FEATURES else v for f, v in parts.items()}

    def _recompute(self, forward: dict[str, float]) -> float:
        """Seconds one block's backward spends recomputing forward work (averaged)."""
        return sum(self._recompute_split(forward))

    def _recompute_split(self, forward: dict[str, float]) -> tuple[float, float]:
        """(tensor-core, other) seconds of one block's recomputation (averaged)."""
        mode = self.training.activation_checkpointing
        if mode is ActivationCheckpointing.NONE:
            return 0.0, 0.0
        tensor = sum(v for f, v in forward.items() if f in TENSOR_FEATURES)
        other = sum(forward.values()) - tensor
        if mode is ActivationCheckpointing.FULL:
            return tensor, other
        if mode is ActivationCheckpointing.SELECTIVE_LAYER:
            k, layers = self.training.activation_checkpointing_every, self.model.num_layers
            share = (layers // k) / layers
            return tensor * share, other * share
        # selective-op: torchtitan saves the outputs of attention and of every other matmul
        # (the 1st, 3rd, … of a block: Q, V, gate, down for a gated MLP; Q, V, up for a plain
        # one) and recomputes the rest — K and O, and up (gated) or down (plain)
        mlp_share = 1 / 3 if self.model.mlp_kind is MLPKind.GATED else 1 / 2
        matmuls = (
            0.5 * forward.get("t_h_kv", 0.0)
            + 0.5 * forward.get("t_h_q", 0.0)
            + mlp_share * forward.get("t_h_i", 0.0)
        )
        return matmuls, other

    def _step_parts(self, micro_batch: int) -> StepParts:
        """Per-feature seconds of the block and head passes of one micro-step; priors get
        wave quantization and the sustained clock (`shardmeter.cost.step`)."""
        s = self.training.seq_len_tokens
        values = feature_values(self.model, micro_batch, s)
        tokens = micro_batch * s
        fwd = self._block_parts(Target.BLOCK_FORWARD, values, tokens)
        bwd = self._block_parts(Target.BLOCK_BACKWARD, values, tokens)
        head = [self._head_parts(t, values) for t in (Target.HEAD_FORWARD, Target.HEAD_BACKWARD)]
        embedding = sum(
            sum(self._split(t, values).values())
            for t in (Target.EMBEDDING_FORWARD, Target.EMBEDDING_BACKWARD)
        )
        if self.coefficients.source is not Source.PRIOR:
            return StepParts(fwd, bwd, head[0], head[1])
        return sustained_step_parts(
            model=self.model,
            gpu=self.gpu,
            tokens=tokens,
            fp8_blocks=self.training.precision is Precision.FP8,
            block=(fwd, bwd),
            head=(head[0], head[1]),
            embedding_s=embedding,
            recompute_split=self._recompute_split,
        )

    def unit_times(self, micro_batch: int) -> UnitTimes:
        """Per-unit seconds at ``micro_batch`` sequences per GPU (cached)."""
        return self._unit_times(micro_batch)

    def _compute_unit_times(self, micro_batch: int) -> UnitTimes:
        s = self.training.seq_len_tokens
        values = feature_values(self.model, micro_batch, s)
        tokens = micro_batch * s
        peak = self.peak_flop_per_s * (
            2.0 if self.training.precision is Precision.FP8 else 1.0
        )  # float8 block matmuls may run up to the FP8 peak
        block_flops = self.model.block_forward_flops_executed(tokens, s)
        head_flops = self.model.head_forward_flops(tokens)
        parts = self._step_parts(micro_batch)
        block_fwd, block_bwd = parts.block_forward, parts.block_backward
        raw = {
            Target.EMBEDDING_FORWARD: sum(self._split(Target.EMBEDDING_FORWARD, values).values()),
            Target.EMBEDDING_BACKWARD: sum(self._split(Target.EMBEDDING_BACKWARD, values).values()),
            Target.BLOCK_FORWARD: sum(block_fwd.values()),
            Target.BLOCK_BACKWARD: sum(block_bwd.values()),
            Target.HEAD_FORWARD: sum(parts.head_forward.values()),
            Target.HEAD_BACKWARD: sum(parts.head_backward.values()),
        }
        floors = {
            Target.EMBEDDING_FORWARD: 0.0,
            Target.EMBEDDING_BACKWARD: 0.0,
            Target.BLOCK_FORWARD: block_flops / peak,
            Target.BLOCK_BACKWARD: 2 * block_flops / peak,
            Target.HEAD_FORWARD: head_flops / self.peak_flop_per_s,
            Target.HEAD_BACKWARD: 2 * head_flops / self.peak_flop_per_s,
        }
        out: dict[Target, float] = {}
        clamped: list[str] = []
        for target, floor in floors.items():
            value = raw[target]
            if value < floor:
                clamped.append(target.value)
                value = floor
            out[target] = value
        recompute = self._recompute(block_fwd)
        host_bound = (
            raise_to_host(out, self.host, recompute, recompute_share(self.model, self.training))
            if self.host is not None
            else ()
        )
        k = self.compute_scale
        recompute *= k
        return UnitTimes(
            embedding_forward_s=out[Target.EMBEDDING_FORWARD] * k,
            embedding_backward_s=out[Target.EMBEDDING_BACKWARD] * k,
            block_forward_s=out[Target.BLOCK_FORWARD] * k,
            block_backward_s=out[Target.BLOCK_BACKWARD] * k + recompute,
            head_forward_s=out[Target.HEAD_FORWARD] * k,
            head_backward_s=out[Target.HEAD_BACKWARD] * k,
            block_recompute_s=recompute,
            roofline_clamped=tuple(clamped),
            tensor_duty_cycle=parts.tensor_duty_cycle,
            matmul_clock_ratio=parts.matmul_clock_ratio,
            host_bound=host_bound,
        )

    def block_work(self, micro_batch: int) -> tuple[WorkSplit, WorkSplit]:
        """One block's forward and backward (without recompute) by kind of work."""
        parts = self._step_parts(micro_batch)
        return self._work(parts.block_forward), self._work(parts.block_backward)

    def shard_ranks(self, nodes: int, gpus_per_node: int) -> int:
        """Ranks the sharded state is spread over (the island, or one HSDP shard group)."""
        return self.training.shard_group_ranks(nodes, gpus_per_node)

    def optimizer_seconds(self, ranks: int) -> float:
        """Optimizer step on one rank whose shard is ``total_params / ranks`` parameters
        (pass the shard-group size under HSDP)."""
        values = feature_values(self.model, 0, 0, params_local=self.model.total_params / ranks)
        return sum(self._split(Target.OPTIMIZER_STEP, values).values()) * self.compute_scale

    def fsdp_copy_seconds(self, params: float, block: bool = True) -> tuple[float, float]:
        """FSDP2's copies around the collectives of one unit: (after an all_gather: split
        the gathered buffer into the parameters, r+w g bytes each for g gathered bytes, and
        when FP32 master weights are gathered for bf16 compute, their cast, r 4 + w c bytes
        each; before a reduce_scatter: copy and cast the gradients into the flat buffer,
        r c + w reduce bytes each)."""
        t = self.training
        bw = self.gpu.hbm_bandwidth_bytes_per_s * self.gpu.memory_efficiency
        c, r, g = t.compute_bytes, t.grad_reduce_bytes, t.gather_bytes(block)
        cast = g + c if g > c else 0
        return params * (2 * g + cast) / bw * self.compute_scale, params * (c + r) / bw

    # ---- communication --------------------------------------------------------------------
    def link_fit(self, collective: str, nodes: int) -> CollectiveFit:
        """The coefficients that bound ``collective`` on an island of ``nodes`` nodes: the
        intra-node fit inside one node, the node-network fit across nodes (its
        ``seconds_per_byte`` is per node, all rails)."""
        role = LinkRole.INTRA_NODE if nodes <= 1 else LinkRole.INTER_NODE
        return self.coefficients.communication[role][collective]

    def collective_seconds(
        self, collective: str, payload_bytes: float, nodes: int, gpus_per_node: int
    ) -> float:
        """Ring ``collective`` of a full payload over nodes × gpus_per_node ranks (cached)."""
        key = (collective, payload_bytes, nodes, gpus_per_node)
        seconds = self._collectives.get(key)
        if seconds is None:
            comm = self.coefficients.communication
            seconds = ring_seconds(
                collective,
                payload_bytes,
                nodes,
                gpus_per_node,
                comm[LinkRole.INTRA_NODE][collective],
                comm[LinkRole.INTER_NODE][collective],
                self.topology.rail_fraction(gpus_per_node),
            )
            self._collectives[key] = seconds
        return seconds

    def replica_all_reduce_seconds(
        self, shard_payload_bytes: float, replicas: int, gpus_per_node: int
    ) -> float:
        """HSDP: all_reduce of one rank's gradient shard with its ``replicas`` copies."""
        return replica_all_reduce_seconds(
            shard_payload_bytes,
            replicas,
            gpus_per_node,
            self.coefficients.communication[LinkRole.INTER_NODE]["all_reduce"],
            self.topology.rail_fraction(gpus_per_node),
        )

    def gradient_sync_seconds(self, params: float, nodes: int, gpus_per_node: int) -> float:
        """Reduce one unit's gradients: reduce_scatter over the shard group, then (HSDP) the
        all_reduce of the shards across replicas."""
        t = self.training
        payload = params * t.grad_reduce_bytes
        group_nodes = t.nodes_per_shard_group(nodes)  # hsdp: SpecError unless it divides nodes
        if t.sharding is Sharding.HSDP and nodes > 1:
            replicas = nodes // group_nodes
            rs = self.collective_seconds("reduce_scatter", payload, group_nodes, gpus_per_node)
            shard = payload / (group_nodes * gpus_per_node)
            return rs + self.replica_all_reduce_seconds(shard, replicas, gpus_per_node)
        return self.collective_seconds("reduce_scatter", payload, nodes, gpus_per_node)

    def contention_scale(self, nodes: int, gpus_per_node: int) -> float:
        """Bytes per second this island's FSDP collectives push through each GPU, relative to
        the same collectives inside one NVLink domain (≤ 1). Overlapped communication slows
        compute by taking HBM bandwidth, SM issue slots and power in proportion to the bytes
        it moves; the contention constant of `shardmeter.sim.fsdp` was measured on collectives
        that ran at intra-node speed, and a ring throttled by slower NICs moves
        proportionally fewer bytes per second while it overlaps compute."""
        if nodes <= 1:
            return 1.0
        t = self.training
        params = self.payloads().block_params
        intra = self.coefficients.communication[LinkRole.INTRA_NODE]
        ranks = nodes * gpus_per_node
        work = [
            ("all_gather", params * t.gather_bytes()),
            ("reduce_scatter", params * t.grad_reduce_bytes),
        ]
        actual = self.gather_seconds(params, nodes, gpus_per_node) + self.gradient_sync_seconds(
            params, nodes, gpus_per_node
        )
        reference = sum(ring_seconds(c, b, 1, ranks, intra[c], intra[c]) for c, b in work)
        if actual <= 0:
            return 1.0
        return min(1.0, reference / actual)

    def gather_seconds(
        self, params: float, nodes: int, gpus_per_node: int, block: bool = True
    ) -> float:
        """All-gather one unit's parameters over the shard group, in the format
        ``training.param_all_gather`` gives (``block``: a transformer block; else the
        embedding or LM head, which float8 all-gather leaves in bf16)."""
        t = self.training
        group = t.nodes_per_shard_group(nodes)
        payload = params * t.gather_bytes(block)
        return self.collective_seconds("all_gather", payload, group, gpus_per_node)

    def payloads(self) -> UnitPayloads:
        m = self.model
        return UnitPayloads(m.params_embedding, m.params_per_block, m.params_head)

    def outer_step_seconds(
        self,
        fragment_params: int,
        ranks: int,
        state_on_gpu: bool,
        outer_precision: Precision = Precision.FP32,
    ) -> float:
        """DiLoCo outer optimizer step (Nesterov SGD) and merge for one fragment on one rank.

        Estimated with the optimizer-step regression at the fragment's parameters per rank
        (outer SGD with momentum moves fewer bytes than AdamW, so this errs long). When the
        outer state lives on the CPU (torchft's default) the fragment's FP32 parameters also
        cross PCIe to the host and back, at ``HOST_LINK_BYTES_PER_S``. An outer precision
        narrower than FP32 adds its conversion pass (`shardmeter.cost.outer_precision`).
        """
        local = fragment_params / ranks
        values = feature_values(self.model, 0, 0, params_local=local)
        seconds = sum(self._split(Target.OPTIMIZER_STEP, values).values()) * self.compute_scale
        if not state_on_gpu:
            seconds += 2 * 4 * local / HOST_LINK_BYTES_PER_S
        g = self.gpu
        seconds += conversion_seconds(
            outer_precision, local, g.hbm_bandwidth_bytes_per_s, g.memory_efficiency
        )
        return seconds

    # ---- memory ---------------------------------------------------------------------------
    def _shard_ranks_for(self, ranks: int, gpus_per_node: int | None) -> int:
        if self.training.sharding is not Sharding.HSDP:
            return ranks
        g = gpus_per_node or min(ranks, self.pool.gpus_per_node)
        return self.training.shard_group_ranks(max(1, ranks // g), g)

    def memory(
        self,
        ranks: int,
        micro_batch: int,
        accumulation: int = 1,
        outer_state_on_gpu: bool = False,
        gradient_sync: GradientSync | None = None,
        gpus_per_node: int | None = None,
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
            gradient_sync=gradient_sync,
            shard_ranks=self._shard_ranks_for(ranks, gpus_per_node),
        )

    def max_micro_batch(
        self,
        ranks: int,
        accumulation: int = 1,
        outer_state_on_gpu: bool = False,
        gradient_sync: GradientSync | None = None,
        gpus_per_node: int | None = None,
    ) -> int:
        return max_micro_batch(
            self.model,
            self.training,
            ranks,
            float(self.pool.gpu.memory_bytes),
            self.coefficients.memory,
            accumulation,
            outer_state_on_gpu,
            gradient_sync=gradient_sync,
            shard_ranks=self._shard_ranks_for(ranks, gpus_per_node),
        )

    # ---- FLOPs ----------------------------------------------------------------------------
    def model_flops_per_micro_step(self, micro_batch: int) -> float:
        """Model FLOPs (forward + backward) of one GPU's micro-batch."""
        tokens = micro_batch * self.training.seq_len_tokens
        return tokens * self.model.training_flops_per_token(self.training.seq_len_tokens)
