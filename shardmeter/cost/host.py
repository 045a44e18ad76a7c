"""Host overhead: the CPU time a training step spends launching its kernels, which the GPU
waits for whenever the host is the slower of the two.

PyTorch launches asynchronously: the host issues kernels into a stream and runs ahead while
the GPU works through them, so launching costs nothing while the GPU is busier than the host.
When a unit's kernels are short — a small model, few tokens per micro-batch, the many small
kernels of eager float8 casts — the host is the slower side and the GPU idles between
kernels: the unit then takes the host's time. `unit_host_seconds` is that time per unit
pass; `shardmeter.cost.model.CostModel` takes the larger of it and the GPU time (a
datasheet prior's; a measured document already timed what the step paid).

**Kernels per unit** follow torchtitan 0.3.0's Llama 3 block on PyTorch 2.13 (the runtime a
pool trains with), eager: one launch per dispatched op that launches a kernel, held to the
ops that block really dispatches by ``benchmarks/bench_block_kernels.py`` (and its test):

* forward: each norm one fused op (``nn.RMSNorm`` dispatches ``aten::_fused_rms_norm`` on a
  CUDA device; LayerNorm ``native_layer_norm``), one GEMM per weight matrix with q, k and v
  one fused ``wqkv`` GEMM whose split is copied into three contiguous tensors, rotary
  (``float``, the complex multiply, ``type_as`` per q and k: 6), the attention kernel (its
  output already in the layout the ``contiguous()`` after it asks for; grouped-query
  attention is the kernel's ``enable_gqa``, no ``repeat_kv`` copies), the residual adds and
  the MLP activation (SiLU and the gate product, or GELU);
* backward: two GEMMs per weight (input and weight gradient), the fused norm's backward op
  (two launches: the input gradient and the weight gradient's reduction over tokens), each
  element-wise op's backward (rotary's complex multiply also materialises the conjugated
  table: 4 per q and k), the ``cat`` that joins the q, k, v gradients, the gradient sums
  autograd inserts where a tensor fans out (each residual stream into its norm and the add;
  the MLP input into gate and up), and the attention backward;
* attention: FlashAttention-2 / cuDNN through SDPA one kernel forward and three backward
  (the ``dO·O`` pre-pass, the main kernel, the dQ conversion); FlexAttention — what
  torchtitan 0.3.0 runs — is a compiled region even in an eager block: one template kernel
  forward, backward Inductor's ``delta = sum(dO·O)`` reduction and the backward template
  (``torch/_inductor/kernel/flex/flex_attention.py``), each pass one compiled-graph call;
* ``torch.compile`` (Inductor, one graph per block as torchtitan compiles it) keeps the GEMMs
  and the attention kernels as they are; complex tensors have no Inductor codegen, so the
  two rotary complex multiplies stay ATen kernels (backward two more and the materialised
  conjugate of the table) and split the element-wise chains around them; the rest fuses
  into one kernel per chain between two of those — forward: norm, q and k upcasts, the
  ``type_as`` + v copy, residual + norm, activation, residual; backward: activation, each
  norm's input gradient (with its residual sum) and weight-gradient reduction, q and k
  rotary downcasts, the q, k, v ``cat``. That grouping is the one Inductor builds for this
  block on a CPU (the benchmark prints it); Triton's grouping can differ by a kernel or two,
  so the compiled counts are estimates from that structure, not a measurement;
* float8 (torchao's dynamic tensorwise ``Float8Linear``, on every linear of the block, the
  fused ``wqkv`` included) adds per linear, eager: an amax (``abs``, ``max``), a scale
  (``clamp``, ``reciprocal``, ``to``) and a saturated cast (``mul``, ``clamp``, ``to``) of the
  input and of the weight forward (16 kernels), of the output gradient backward plus the
  transposed copies the two backward ``_scaled_mm`` need (11); compiled, the casts fuse into
  their producers and the reductions stay apart (3 forward, 4 backward) — counted from
  torchao's code, not dispatched here (torchao is not installed).

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
from shardmeter.spec.model import MLPKind, TransformerSpec
from shardmeter.spec.training import ActivationCheckpointing, AttentionKernel, TrainingSpec

EAGER_FORWARD_KERNEL_S = 10e-6
"""Host seconds per eager forward op (Python dispatch + autograd record + launch)."""
EAGER_BACKWARD_KERNEL_S = 4e-6
"""Host seconds per kernel the autograd engine launches (C++ dispatch + launch)."""
COMPILED_KERNEL_S = 8e-6
"""Host seconds per kernel of an Inductor-compiled graph (its launcher, launch included)."""
COMPILED_GRAPH_S = 35e-6
"""Host seconds per call of a compiled graph beyond its kernels (guards, wrapper)."""

NORM_BACKWARD_KERNELS = 2
"""A fused norm's backward op launches two kernels: the input gradient and the weight
gradient's reduction over tokens."""
QKV_SPLIT_COPIES = 3
"""torchtitan's fused ``wqkv``: the split views of q, k and v each copied contiguous."""
ROTARY_EAGER_OPS = 3
"""Per rotated tensor (q, k): ``float``, the complex multiply, ``type_as``."""
ROTARY_EAGER_BACKWARD_OPS = 4
"""Per rotated tensor: the three ops' backwards and the conjugated table the complex
multiply's backward materialises (a ``clone``) before multiplying."""
ROTARY_COMPLEX_BACKWARD_EXTRA = 1
"""Compiled backward: the conjugated rotary table materialised for the complex multiplies."""
SDPA_ATTENTION_KERNELS = (1, 3)
"""FlashAttention-2 through SDPA: (forward, backward) kernels."""
FLEX_ATTENTION_KERNELS = (1, 2)
"""FlexAttention (Inductor): the forward template; the ``delta`` reduction and the backward
template."""
FLOAT8_EAGER_FORWARD_PER_LINEAR = 16
FLOAT8_EAGER_BACKWARD_PER_LINEAR = 11
FLOAT8_COMPILED_FORWARD_PER_LINEAR = 3
FLOAT8_COMPILED_BACKWARD_PER_LINEAR = 4


@dataclass(frozen=True)
class UnitKernels:
    """Kernels of one unit pass, forward and backward (all launches), of which
    ``compiled_forward`` / ``compiled_backward`` come from compiled graphs, called
    ``graph_calls`` times per pass (each direction)."""

    forward: int
    backward: int
    compiled_forward: int = 0
    compiled_backward: int = 0
    graph_calls: int = 0


def _gemms(spec: TransformerSpec) -> int:
    """GEMMs of one block forward: the fused ``wqkv``, ``wo`` and the MLP's matrices."""
    return 2 + (3 if spec.mlp_kind is MLPKind.GATED else 2)


def block_kernels(
    spec: TransformerSpec,
    compiled: bool = False,
    fp8: bool = False,
    attention: AttentionKernel = AttentionKernel.FLEX,
) -> UnitKernels:
    """Kernels one transformer block launches (module docstring)."""
    gemms = _gemms(spec)
    gated = spec.mlp_kind is MLPKind.GATED
    norms = 1 if spec.parallel_attention_mlp else 2
    flex = attention is AttentionKernel.FLEX
    attn_fwd, attn_bwd = FLEX_ATTENTION_KERNELS if flex else SDPA_ATTENTION_KERNELS
    mlp_inputs = 2 if gated else 1
    if compiled:
        rotary_fwd = 2  # the complex multiplies (no Inductor codegen for complex)
        rotary_bwd = 2 + ROTARY_COMPLEX_BACKWARD_EXTRA
        # norm | q upcast | k upcast | type_as + v copy | [residual + norm] | activation |
        # residual
        fused_fwd = norms + 3 + 1 + 1
        # activation | each norm's input gradient and weight gradient | q, k downcasts | cat
        fused_bwd = 1 + 2 * norms + 2 + 1
        fwd = gemms + attn_fwd + rotary_fwd + fused_fwd
        bwd = 2 * gemms + attn_bwd + rotary_bwd + fused_bwd
        if fp8:
            fwd += gemms * FLOAT8_COMPILED_FORWARD_PER_LINEAR
            bwd += gemms * FLOAT8_COMPILED_BACKWARD_PER_LINEAR
        return UnitKernels(fwd, bwd, compiled_forward=fwd, compiled_backward=bwd, graph_calls=1)
    activation = 2 if gated else 1
    fwd = (
        norms
        + gemms
        + QKV_SPLIT_COPIES
        + 2 * ROTARY_EAGER_OPS
        + attn_fwd
        + 2  # residual adds
        + activation
    )
    # each residual stream feeds its norm and the add; the MLP input feeds gate and up (or,
    # attention and MLP in parallel, the one norm's output feeds wqkv and the MLP)
    fan_out = norms + (mlp_inputs - 1 if norms == 2 else mlp_inputs)
    bwd = (
        norms * NORM_BACKWARD_KERNELS
        + 2 * gemms
        + 1  # cat of the q, k, v gradients
        + 2 * ROTARY_EAGER_BACKWARD_OPS
        + attn_bwd
        + fan_out
        + (3 if gated else 1)  # SwiGLU: two products and SiLU backward; GELU backward
    )
    if fp8:
        fwd += gemms * FLOAT8_EAGER_FORWARD_PER_LINEAR
        bwd += gemms * FLOAT8_EAGER_BACKWARD_PER_LINEAR
    if flex:
        return UnitKernels(
            fwd, bwd, compiled_forward=attn_fwd, compiled_backward=attn_bwd, graph_calls=1
        )
    return UnitKernels(fwd, bwd)


def head_kernels(spec: TransformerSpec, compiled: bool = False) -> UnitKernels:
    """Final norm, LM head and FP32 cross-entropy (``compiled``: the loss compiled too)."""
    if compiled:
        return UnitKernels(
            forward=1 + 1 + 2,
            backward=2 + 2 + 2,
            compiled_forward=4,
            compiled_backward=6,
            graph_calls=1,
        )
    # norm, LM head GEMM, upcast, log_softmax, nll_loss (+ its mean); backward: the norm's two
    # kernels, two GEMMs, zero + scatter, log_softmax backward, upcast backward
    return UnitKernels(forward=1 + 1 + 4, backward=NORM_BACKWARD_KERNELS + 2 + 4)


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


def _pass_seconds(kernels: int, compiled: int, graph_calls: int, eager_s: float) -> float:
    """Host seconds of one pass: eager launches at ``eager_s``, compiled ones at the Inductor
    launcher's cost, plus each compiled graph call."""
    return (
        (kernels - compiled) * eager_s
        + compiled * COMPILED_KERNEL_S
        + graph_calls * (COMPILED_GRAPH_S)
    )


def unit_host_seconds(
    spec: TransformerSpec,
    compiled: bool,
    compiled_loss: bool,
    fp8: bool,
    attention: AttentionKernel = AttentionKernel.FLEX,
) -> HostSeconds:
    """Host time of each unit pass: its kernels at the eager or compiled cost per kernel,
    plus a compiled graph's call overhead (module docstring)."""
    block = block_kernels(spec, compiled, fp8, attention)
    head = head_kernels(spec, compiled and compiled_loss)
    f, b = EAGER_FORWARD_KERNEL_S, EAGER_BACKWARD_KERNEL_S
    return HostSeconds(
        block_forward_s=_pass_seconds(block.forward, block.compiled_forward, block.graph_calls, f),
        block_backward_s=_pass_seconds(
            block.backward, block.compiled_backward, block.graph_calls, b
        ),
        head_forward_s=_pass_seconds(head.forward, head.compiled_forward, head.graph_calls, f),
        head_backward_s=_pass_seconds(head.backward, head.compiled_backward, head.graph_calls, b),
        embedding_forward_s=EMBEDDING_KERNELS.forward * f,
        embedding_backward_s=EMBEDDING_KERNELS.backward * b,
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
