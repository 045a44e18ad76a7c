"""Kernels torchtitan 0.3.0's Llama 3 block really launches per pass, against the host
model's count (`shardmeter.cost.host.block_kernels`).

    PYTHONPATH=.venv/triton-site .venv/bin/python benchmarks/bench_block_kernels.py
        [--compiled] [--json]

(torchtitan's models import triton, which the Makefile keeps out of site-packages.)

Builds torchtitan's own block (`shardmeter_bench.compute.titan_block`) at a small width on
the CPU in BF16, once with grouped-query and once with multi-head attention, and runs one
forward and one backward under a ``TorchDispatchMode`` that records every ATen op reaching
the dispatcher. **An op counts as one kernel** unless it only makes metadata: a view (the
op's schema returns an alias it does not write — ``view``, ``t``, ``transpose``, ``expand``,
``split``, ``view_as_complex``…), or one of ``_unsafe_view``, ``detach``, ``alias``,
``empty*``, ``lift_fresh``, and ``prim`` ops (a fake tensor's device query).

The CPU run is then turned into what a CUDA device dispatches, where the two differ:

* the norm: on a CPU ``aten::rms_norm`` decomposes into eight ops (backward seventeen); on a
  CUDA device it dispatches ``aten::_fused_rms_norm`` and its backward
  ``aten::_fused_rms_norm_backward`` — counted here on a fake CUDA tensor (forward under the
  mode; backward by calling the autograd node directly, since the autograd engine needs a
  real device), the backward op's launches at `host.NORM_BACKWARD_KERNELS`;
* attention: on a CPU FlexAttention has no backward, so the block runs torchtitan's SDPA
  module (``_scaled_dot_product_flash_attention_for_cpu``, one op each way); the CUDA
  count takes FlexAttention's launches instead (`host.FLEX_ATTENTION_KERNELS`, read from
  Inductor's flex lowering), since that is the kernel torchtitan 0.3.0 runs.

``--compiled`` also compiles the block with Inductor on the CPU and counts the launches in
its generated code (C++ kernels, extern GEMM / attention calls, ATen fallbacks). CPU
Inductor fuses differently from Triton (its loop nests can hold reductions along different
axes in one kernel), so that count shows the graph's structure — which ops stay ATen
kernels, which chains fuse — not the CUDA kernel count; ``block_kernels``'s compiled counts
are estimates built on that structure.

Exit status 0 (a measurement); 2 when torchtitan cannot be imported.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from shardmeter.cost import host
from shardmeter.spec.model import MODEL_PRESETS, TransformerSpec
from shardmeter.spec.training import AttentionKernel

WIDTH = 256
HEADS = 8
KV_HEADS = {"gqa": 2, "mha": 8}
BATCH, SEQ = 2, 64

_METADATA = {"_unsafe_view", "detach", "alias", "lift_fresh", "empty", "empty_strided"}
_METADATA_PREFIX = ("empty", "new_empty", "_reshape_alias")


def spec_for(variant: str) -> TransformerSpec:
    """Llama 3.1 8B's block shape at a CPU-sized width (``variant``: gqa or mha)."""
    return MODEL_PRESETS["llama-3.1-8b"].model_copy(
        update={
            "hidden_size": WIDTH,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS[variant],
            "intermediate_size": 2 * WIDTH,
        }
    )


def launches_kernel(func: Any) -> bool:
    """Whether an ATen op launches a kernel on a GPU (module docstring)."""
    if func.namespace != "aten":
        return False
    name = func._schema.name.split("::")[-1]
    return not (func.is_view or name in _METADATA or name.startswith(_METADATA_PREFIX))


def _counter() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class KernelOps(TorchDispatchMode):
        """Records the kernel-launching ATen ops dispatched while active."""

        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if launches_kernel(func):
                self.ops.append(func._schema.name.split("::")[-1])
            return func(*args, **(kwargs or {}))

    return KernelOps()


def _bf16(module: Any) -> Any:
    import torch

    # real floating tensors only: the complex RoPE table keeps its dtype
    return module._apply(lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)


def block_ops(spec: TransformerSpec) -> tuple[list[str], list[str]]:
    """ATen kernel ops of torchtitan's block, forward and backward, on the CPU."""
    import torch

    from shardmeter_bench.compute.titan_block import TitanBlock

    torch.manual_seed(0)
    block = _bf16(TitanBlock(spec, "sdpa", SEQ))
    x = torch.randn(BATCH, SEQ, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    with _counter() as forward:
        y = block(x)
    grad = torch.randn_like(y)
    with _counter() as backward:
        y.backward(grad)
    return forward.ops, backward.ops


def norm_ops(spec: TransformerSpec, device: str) -> tuple[list[str], list[str]]:
    """ATen kernel ops of torchtitan's RMSNorm alone, forward and backward, on ``device``:
    ``cpu`` (real tensors) or ``cuda`` (fake tensors; the backward node called directly)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchtitan.models.common import RMSNorm

    def run() -> tuple[list[str], list[str]]:
        h = spec.hidden_size
        with torch.device(device):
            norm = RMSNorm.Config(normalized_shape=h).build()
            norm.weight = torch.nn.Parameter(torch.ones(h, dtype=torch.bfloat16))
            x = torch.randn(BATCH, SEQ, h, dtype=torch.bfloat16, requires_grad=True)
        with _counter() as forward:
            y = norm(x)
        grad = torch.ones_like(y)
        with _counter() as backward:
            if device == "cpu":
                y.backward(grad)
            else:
                with torch.no_grad():  # as the engine runs a node
                    y.grad_fn(grad, None)
        return forward.ops, backward.ops

    if device == "cpu":
        return run()
    with FakeTensorMode():
        return run()


def _is_attention(op: str) -> bool:
    return op.startswith("_scaled_dot_product")


def measured(variant: str) -> dict[str, Any]:
    """One variant's dispatched ops on the CPU and its CUDA-equivalent launches, with the
    host model's count beside them."""
    spec = spec_for(variant)
    fwd, bwd = block_ops(spec)
    norm_cpu = norm_ops(spec, "cpu")
    norm_cuda = norm_ops(spec, "cuda")
    norms = sum(1 for op in fwd if op == "rsqrt")  # one per composite RMSNorm on the CPU
    flex_fwd, flex_bwd = host.FLEX_ATTENTION_KERNELS
    cuda_norm_bwd = [
        k
        for op in norm_cuda[1]
        for k in [op] * (host.NORM_BACKWARD_KERNELS if op == "_fused_rms_norm_backward" else 1)
    ]
    cuda_fwd = (
        len(fwd)
        - norms * len(norm_cpu[0])
        + norms * len(norm_cuda[0])
        - sum(map(_is_attention, fwd))
        + flex_fwd
    )
    cuda_bwd = (
        len(bwd)
        - norms * len(norm_cpu[1])
        + norms * len(cuda_norm_bwd)
        - sum(map(_is_attention, bwd))
        + flex_bwd
    )
    model = host.block_kernels(spec, attention=AttentionKernel.FLEX)
    return {
        "variant": variant,
        "spec": spec.model_dump(mode="json"),
        "norms": norms,
        "cpu_forward_ops": fwd,
        "cpu_backward_ops": bwd,
        "norm_cpu_ops": {"forward": norm_cpu[0], "backward": norm_cpu[1]},
        "norm_cuda_ops": {"forward": norm_cuda[0], "backward": norm_cuda[1]},
        "cuda_forward": cuda_fwd,
        "cuda_backward": cuda_bwd,
        "model_forward": model.forward,
        "model_backward": model.backward,
    }


def _launch_lines(code: str) -> list[str]:
    """The launches in one Inductor output module's ``call``: generated kernels, extern calls
    and ATen fallbacks that launch kernels."""
    body = code[code.index("def call(") :]
    body = body[: body.index("\n    return ") if "\n    return " in body else len(body)]
    return [k for k in map(_launch, body.splitlines()) if k is not None]


def _launch(line: str) -> str | None:
    """The kernel one line of generated code launches (None: it launches none)."""
    import torch

    line = line.strip()
    if m := re.match(r"(?:\w+ = )?((?:cpp|triton)_\w+)[.(]", line):
        return m.group(1).split("_")[0] + "_kernel"
    if m := re.match(r"(?:\w+ = )?extern_kernels\.(\w+)\(", line):
        return m.group(1)
    m = re.match(r"(?:\w+ = )?torch\.ops\.aten\.(\w+)\.(\w+)\(", line)
    if m and launches_kernel(getattr(getattr(torch.ops.aten, m.group(1)), m.group(2))):
        return m.group(1)
    return None


def compiled_cpu(variant: str) -> dict[str, Any]:
    """Launches in the code Inductor generates for the block on the CPU (module docstring)."""
    import torch
    from torch._inductor.utils import run_and_get_code

    from shardmeter_bench.compute.titan_block import TitanBlock

    spec = spec_for(variant)
    block = torch.compile(_bf16(TitanBlock(spec, "sdpa", SEQ)))
    x = torch.randn(BATCH, SEQ, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)

    def step() -> None:
        block(x).sum().backward()

    _, codes = run_and_get_code(step)
    forward, backward = (_launch_lines(c) for c in codes[:2])
    model = host.block_kernels(spec, compiled=True)
    return {
        "variant": variant,
        "inductor_cpu_forward": forward,
        "inductor_cpu_backward": backward,
        "model_forward": model.forward,
        "model_backward": model.backward,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiled", action="store_true", help="also count Inductor's CPU code")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    from shardmeter_bench.compute.titan_block import unavailable

    if reason := unavailable():
        print(f"bench_block_kernels: {reason}", file=sys.stderr)
        return 2
    rows = [measured(v) for v in KV_HEADS]
    compiled = [compiled_cpu(v) for v in KV_HEADS] if args.compiled else []
    if args.json:
        print(json.dumps({"eager": rows, "compiled_cpu": compiled}))
        return 0
    print(f"torchtitan Llama 3 block, width {WIDTH}, {HEADS} heads, BF16, batch {BATCH}×{SEQ}")
    print(f"{'variant':8} {'CPU ops f/b':>12} {'CUDA launches f/b':>18} {'model f/b':>10}")
    for r in rows:
        cpu = f"{len(r['cpu_forward_ops'])}/{len(r['cpu_backward_ops'])}"
        cuda = f"{r['cuda_forward']}/{r['cuda_backward']}"
        print(
            f"{r['variant']:8} {cpu:>12} {cuda:>18} {r['model_forward']}/{r['model_backward']:<7}"
        )
    r = rows[0]
    print("norm on the CPU:", r["norm_cpu_ops"])
    print("norm on CUDA:   ", r["norm_cuda_ops"])
    print("block forward (CPU):", " ".join(r["cpu_forward_ops"]))
    print("block backward (CPU):", " ".join(r["cpu_backward_ops"]))
    for c in compiled:
        print(
            f"compiled {c['variant']}: Inductor CPU {len(c['inductor_cpu_forward'])}/"
            f"{len(c['inductor_cpu_backward'])}, model {c['model_forward']}/{c['model_backward']}"
        )
        print("  forward:", " ".join(c["inductor_cpu_forward"]))
        print("  backward:", " ".join(c["inductor_cpu_backward"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
