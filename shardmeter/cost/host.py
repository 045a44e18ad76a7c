"""Host overhead: the CPU time a training step spends launching its kernels, which the GPU
waits for whenever the host is the slower of the two.

PyTorch launches asynchronously: the host issues kernels into a stream and runs ahead while
the GPU works through them, so launching costs nothing while the GPU is busier than the host.
When a unit's kernels are short — a small model, few tokens per micro-batch, the many small
kernels of eager float8 casts — the host is the slower side and the GPU idles between
kernels: the unit then takes the host's time. `unit_host_seconds` is that time per unit
pass; `shardmeter.cost.model.CostModel` takes the larger of it and the GPU time (a
datasheet prior's; a measured document already timed what the step paid).

**Kernels per unit**, counted op by op on the implementations the element-wise bytes of
`shardmeter.cost.elementwise` follow (torchtitan's Llama block, eager: one kernel per op):

* forward: each norm's ops (RMSNorm as PyTorch's composite chain ``float``, ``pow``,
  ``mean``, ``+eps``, ``rsqrt``, ``mul``, ``type_as``, ``·weight``: 8; LayerNorm one fused
  kernel), one GEMM per weight matrix, rotary (``float``, complex multiply, ``type_as`` per
  q and k: 6), ``repeat_kv``'s two copies under grouped-query attention, the attention kernel,
  the ``transpose().contiguous()`` of its output, the residual adds and the MLP activation
  (SiLU and the gate product, or GELU);
* backward: two GEMMs per weight (input and weight gradient), each element-wise op's
  backward (a composite norm's about twice its forward ops, plus the weight-gradient sum),
  the gradient sums autograd inserts where a tensor fans out, and the attention backward's
  three kernels (FlashAttention-2: the ``dO·O`` pre-pass, the main kernel, the dQ conversion);
* ``torch.compile`` (Inductor, one graph per block as torchtitan compiles it) keeps the GEMMs
  and the attention kernels and fuses every chain of element-wise ops between two of them
  into one kernel: norm, rotary, residual + norm, activation, residual forward; their
  backwards and the norms' weight-gradient reductions backward;
* float8 (torchao's dynamic tensorwise ``Float8Linear``) adds per linear, eager: an amax
  (``abs``, ``max``), a scale (``clamp``, ``reciprocal``, ``to``) and a saturated cast
  (``mul``, ``clamp``, ``to``) of the input and of the weight forward (16 kernels), of the
  output gradient backward plus the transposed copies the two backward ``_scaled_mm`` need
  (11); compiled, the casts fuse into their producers and the reductions stay apart (3
  forward, 4 backward).

**Host seconds per kernel** (each constant's source beside it):

* eager forward — an op called from Python with autograd recording: 5–7 µs of dispatch on
  the host (pytorch/pytorch#41383: 6.8 µs per ``2*x`` with ``requires_grad``, 5 µs without)
  plus the driver's launch, 3.0–3.3 µs (``cuLaunchKernel``, meta-pytorch/tritonbench#1017):
  `EAGER_FORWARD_KERNEL_S` = 10 µs;
* eager backward — the autograd engine's C++ thread, no Python: "about a microsecond" of
  dispatch (the same issue, a PyTorch maintainer on the C++ API) plus the launch:
  `EAGER_BACKWARD_KERNEL_S` = 4 µs; activation checkpointing re-runs the forward's Python in
  the backward (its kernels at the forward's cost);
* compiled — Inductor's per-kernel launcher, 6.8–9.1 µs (``CachingAutotuner.run``, the same
  tritonbench measurement): `COMPILED_KERNEL_S` = 8 µs, and per compiled graph call (guards,
  device guard, wrapper) 42–44 µs end to end for a one-kernel graph, less that kernel:
  `COMPILED_GRAPH_S` = 35 µs, once forward and once backward per block.

Not counted: FSDP2's per-unit hooks (all-gather copy-in/out, stream waits), the data loader,
the optimizer's foreach kernels (its prior carries a fixed launch term) — no published
per-call figure was found for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardmeter.cost.features import Target
from shardmeter.spec.model import MLPKind, NormKind, TransformerSpec
from shardmeter.spec.training import ActivationCheckpointing, TrainingSpec

EAGER_FORWARD_KERNEL_S = 10e-6
"""Host seconds per eager forward op (Python dispatch + autograd record + launch)."""
EAGER_BACKWARD_KERNEL_S = 4e-6
"""Host seconds per kernel the autograd engine launches (C++ dispatch + launch)."""
COMPILED_KERNEL_S = 8e-6
"""Host seconds per kernel of an Inductor-compiled graph (its launcher, launch included)."""
COMPILED_GRAPH_S = 35e-6
"""Host seconds per call of a compiled graph beyond its kernels (guards, wrapper)."""

RMSNORM_EAGER_OPS = 8
RMSNORM_EAGER_BACKWARD_OPS = 2 * RMSNORM_EAGER_OPS + 1
"""Each op's backward (about two kernels per op through autograd) and the weight gradient's
sum over tokens."""
ROTARY_EAGER_OPS = 3
"""Per rotated tensor (q, k): ``float``, the complex multiply, ``type_as``."""
ATTENTION_FORWARD_KERNELS = 1
ATTENTION_BACKWARD_KERNELS = 3
FLOAT8_EAGER_FORWARD_PER_LINEAR = 16
FLOAT8_EAGER_BACKWARD_PER_LINEAR = 11
FLOAT8_COMPILED_FORWARD_PER_LINEAR = 3
FLOAT8_COMPILED_BACKWARD_PER_LINEAR = 4


@dataclass(frozen=True)
class UnitKernels:
    """Kernels of one unit pass, forward and backward."""

    forward: int
    backward: int


def _linears(spec: TransformerSpec) -> int:
    return 4 + (3 if spec.mlp_kind is MLPKind.GATED else 2)


def block_kernels(spec: TransformerSpec, compiled: bool = False, fp8: bool = False) -> UnitKernels:
    """Kernels one transformer block launches (module docstring)."""
    linears = _linears(spec)
    gated = spec.mlp_kind is MLPKind.GATED
    norms = 1 if spec.parallel_attention_mlp else 2
    gqa = spec.kv_dim < spec.q_dim
    attention = (ATTENTION_FORWARD_KERNELS, ATTENTION_BACKWARD_KERNELS)
    if compiled:
        # fused: norm | rotary (+ repeat_kv) | [residual + norm] | activation | residual
        fused_fwd = 4 + (1 if norms == 2 else 0)
        # their backwards plus each norm's weight-gradient reduction
        fused_bwd = fused_fwd + norms
        fwd = linears + attention[0] + fused_fwd
        bwd = 2 * linears + attention[1] + fused_bwd
        if fp8:
            fwd += linears * FLOAT8_COMPILED_FORWARD_PER_LINEAR
            bwd += linears * FLOAT8_COMPILED_BACKWARD_PER_LINEAR
        return UnitKernels(fwd, bwd)
    rms = spec.norm is NormKind.RMSNORM
    norm_fwd = RMSNORM_EAGER_OPS if rms else 1
    norm_bwd = RMSNORM_EAGER_BACKWARD_OPS if rms else 2
    activation = 2 if gated else 1
    fwd = (
        norms * norm_fwd
        + linears
        + 2 * ROTARY_EAGER_OPS
        + (2 if gqa else 0)
        + attention[0]
        + 1  # transpose().contiguous() of the attention output
        + 2  # residual adds
        + activation
    )
    fan_out = 2 + (1 if gated else 0) + 2  # x_norm → q, k, v; h_norm → gate, up; residuals
    bwd = (
        norms * norm_bwd
        + 2 * linears
        + 2 * ROTARY_EAGER_OPS
        + (2 if gqa else 0)
        + attention[1]
        + 1
        + fan_out
        + (3 if gated else 1)  # SwiGLU: two products and SiLU backward; GELU backward
    )
    if fp8:
        fwd += linears * FLOAT8_EAGER_FORWARD_PER_LINEAR
        bwd += linears * FLOAT8_EAGER_BACKWARD_PER_LINEAR
    return UnitKernels(fwd, bwd)


def head_kernels(spec: TransformerSpec, compiled: bool = False) -> UnitKernels:
    """Final norm, LM head and FP32 cross-entropy (``compiled``: the loss compiled too)."""
    if compiled:
        return UnitKernels(forward=1 + 1 + 2, backward=2 + 2 + 2)
    rms = spec.norm is NormKind.RMSNORM
    norm_fwd = RMSNORM_EAGER_OPS if rms else 1
    norm_bwd = RMSNORM_EAGER_BACKWARD_OPS if rms else 2
    # upcast, log_softmax, nll_loss (+ its mean); backward: zero + scatter, log_softmax
    # backward, upcast backward
    return UnitKernels(forward=norm_fwd + 1 + 4, backward=norm_bwd + 2 + 4)


EMBEDDING_KERNELS = UnitKernels(forward=1, backward=4)
"""The gather forward; backward ``embedding_dense_backward`` (zero, sort the ids, sum the rows
per id, scatter)."""


@dataclass(frozen=True)
class HostSeconds:
    """Host seconds of each unit pass (backward without recomputation)."""

    block_forward_s: float
    block_backward_s: float
    head_forward_s: float
    head_backward_s: float
    embedding_forward_s: float
    embedding_backward_s: float


def unit_host_seconds(
    spec: TransformerSpec, compiled: bool, compiled_loss: bool, fp8: bool
) -> HostSeconds:
    """Host time of each unit pass: its kernels at the eager or compiled cost per kernel,
    plus a compiled graph's call overhead (module docstring)."""
    block = block_kernels(spec, compiled, fp8)
    head = head_kernels(spec, compiled and compiled_loss)
    if compiled:
        bf = block.forward * COMPILED_KERNEL_S + COMPILED_GRAPH_S
        bb = block.backward * COMPILED_KERNEL_S + COMPILED_GRAPH_S
    else:
        bf = block.forward * EAGER_FORWARD_KERNEL_S
        bb = block.backward * EAGER_BACKWARD_KERNEL_S
    if compiled and compiled_loss:
        hf = head.forward * COMPILED_KERNEL_S + COMPILED_GRAPH_S
        hb = head.backward * COMPILED_KERNEL_S + COMPILED_GRAPH_S
    else:
        hf = head.forward * EAGER_FORWARD_KERNEL_S
        hb = head.backward * EAGER_BACKWARD_KERNEL_S
    return HostSeconds(
        block_forward_s=bf,
        block_backward_s=bb,
        head_forward_s=hf,
        head_backward_s=hb,
        embedding_forward_s=EMBEDDING_KERNELS.forward * EAGER_FORWARD_KERNEL_S,
        embedding_backward_s=EMBEDDING_KERNELS.backward * EAGER_BACKWARD_KERNEL_S,
    )


def recompute_share(spec: TransformerSpec, training: TrainingSpec) -> float:
    """Share of the block forward's ops that activation checkpointing runs again in the
    backward, averaged over the blocks (selective-op re-runs the whole forward function;
    the ops it saved skip only their kernels)."""
    mode = training.activation_checkpointing
    if mode is ActivationCheckpointing.NONE:
        return 0.0
    if mode is ActivationCheckpointing.SELECTIVE_LAYER:
        k, layers = training.activation_checkpointing_every, spec.num_layers
        return (layers // k) / layers
    return 1.0


def raise_to_host(
    gpu_s: dict[Target, float], host: HostSeconds, recompute_s: float, share: float
) -> tuple[str, ...]:
    """Raise each unit pass in ``gpu_s`` (GPU seconds, changed in place) to its host time
    where that is longer: the GPU waits for the kernels. The block backward is compared with
    its GPU recomputation (``recompute_s``) on one side and ``share`` of the forward's host
    time on the other. Returns the targets raised."""
    floors = {
        Target.EMBEDDING_FORWARD: host.embedding_forward_s,
        Target.EMBEDDING_BACKWARD: host.embedding_backward_s,
        Target.BLOCK_FORWARD: host.block_forward_s,
        Target.BLOCK_BACKWARD: host.block_backward_s + share * host.block_forward_s - recompute_s,
        Target.HEAD_FORWARD: host.head_forward_s,
        Target.HEAD_BACKWARD: host.head_backward_s,
    }
    raised = []
    for target, floor in floors.items():
        if floor > gpu_s[target]:
            gpu_s[target] = floor
            raised.append(target.value)
    return tuple(raised)
