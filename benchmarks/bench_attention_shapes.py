"""Attention's prior rate at the head dims and lengths the H200 measured, with and without the
head-dim law and the sequence ramp of `shardmeter.cost.attention`.

    .venv/bin/python benchmarks/bench_attention_shapes.py [--jsonl PATH]

Default: ``../shared/calibration/h200-2026-12-04/probes-and-attention.jsonl`` (README there):
SDPA's flash and cuDNN backends and compiled FlexAttention, causal bf16, forward and backward
alone, at (batch, seq, heads, kv heads, head dim) = (1, 8192, 32, 8, 128), (2, 4096, 32, 8,
64), (1, 16384, 32, 8, 128), (1, 8192, 64, 8, 128).

1. Per kernel, pass and shape: the measured TFLOP/s (causal FLOPs), the H200 prior's rate
   through `CostModel.block_work` without the laws (every shape at head dim 128's rate at
   4k) and with them, each as model ÷ measured; then per shape the spread of model ÷ measured
   over the three kernels (max ÷ min: 1 when the kernels' relative speeds are right).
2. The prior's block forward / backward (eager, bf16, micro-batch 1) of the head-dim-64
   models the README's small-layer gaps name (SmolLM-360M: 15 heads × 64, Llama-3.2-1B:
   32 × 64; Llama-3.1-8B at 128 for contrast) at 4k, 8k and 16k tokens on the H200, with
   FlexAttention (torchtitan's) and FlashAttention-2 (SDPA's flash): before, after, the
   change, the attention share after; at 4k tokens also the block with its attention at the
   rate the H200 measured for that kernel at head dim 64, 4k tokens (the measurement's one
   64 shape) — what the measurement implies.

Exit status 0 (a measurement); 2 when the file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from shardmeter.cost.model import CostModel
from shardmeter.spec.model import MODEL_PRESETS, TransformerSpec
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.training import AttentionKernel, TrainingSpec

_ROOT = Path(__file__).resolve().parents[1]
_NAME = "h200-2026-12-04/probes-and-attention.jsonl"
_CANDIDATES = [base / "shared" / "calibration" / _NAME for base in (_ROOT.parent, _ROOT)]
DEFAULT = next((c for c in _CANDIDATES if c.exists()), _CANDIDATES[0])
KERNELS = {"flash": AttentionKernel.FLASH2, "cudnn": AttentionKernel.CUDNN,
           "flex": AttentionKernel.FLEX}  # fmt: skip
"""The measurement's kernel names → the model's."""
POOL = PoolSpec(name="h200", gpu="h200", nodes=1, gpus_per_node=1)
BLOCK_MODELS = ("smollm-360m", "llama-3.2-1b", "llama-3.1-8b")
BLOCK_LENGTHS = (4096, 8192, 16384)


@contextmanager
def laws(on: bool) -> Iterator[None]:
    """The head-dim law and the sequence ramp as they are (``on``) or both off."""
    if on:
        yield
        return
    with (
        mock.patch("shardmeter.cost.attention.head_dim_ratio", lambda *_a: (1.0, 1.0)),
        mock.patch("shardmeter.cost.attention.sequence_ratio", lambda *_a: 1.0),
    ):
        yield


def attention_spec(heads: int, kv_heads: int, head_dim: int) -> TransformerSpec:
    """A one-block model with the measured attention shape (the rest does not matter here)."""
    width = heads * head_dim
    return TransformerSpec(
        name=f"attn-{heads}x{head_dim}", hidden_size=width, num_layers=1,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        intermediate_size=4 * width, vocab_size=32000,
    )  # fmt: skip


def model_rates(row: dict[str, Any], on: bool) -> tuple[float, float]:
    """(forward, backward) attention FLOP/s of the H200 prior at the row's shape."""
    spec = attention_spec(row["heads"], row["kv_heads"], row["head_dim"])
    seq, batch = row["seq_len"], row["batch"]
    training = TrainingSpec(
        seq_len_tokens=seq, global_batch_tokens=batch * seq, attention_kernel=KERNELS[row["kernel"]]
    )
    with laws(on):
        fwd, bwd = CostModel(spec, training, POOL).block_work(batch)
    flops = 2.0 * batch * seq * seq * spec.q_dim  # causal half of QKᵀ and PV (the file's count)
    return flops / fwd.attention_s, 2.5 * flops / bwd.attention_s


def shape_name(row: dict[str, Any]) -> str:
    return f"{row['batch']}×{row['seq_len']} {row['heads']}h/{row['kv_heads']}kv d{row['head_dim']}"


def attention_table(rows: list[dict[str, Any]]) -> list[str]:
    head = (
        f"{'kernel':<6} {'pass':<4} {'shape':<26} {'measured':>9} {'before':>8} {'after':>8} "
        f"{'before÷meas':>11} {'after÷meas':>10}"
    )
    lines = ["1. attention alone: TFLOP/s measured on the H200 and the prior's", head]
    lines.append("-" * len(head))
    ratios: dict[tuple[str, str, str], tuple[float, float]] = {}
    for row in rows:
        before, after = model_rates(row, on=False), model_rates(row, on=True)
        for i, p in enumerate(("fwd", "bwd")):
            measured = row[f"{p}_tflops"] * 1e12
            b, a = before[i] / measured, after[i] / measured
            ratios[(row["kernel"], p, shape_name(row))] = (b, a)
            lines.append(
                f"{row['kernel']:<6} {p:<4} {shape_name(row):<26} {measured / 1e12:>9.0f} "
                f"{before[i] / 1e12:>8.0f} {after[i] / 1e12:>8.0f} {b:>11.2f} {a:>10.2f}"
            )
    lines += ["", "per shape and pass: model ÷ measured over the three kernels, and their spread"]
    lines.append(f"{'shape':<26} {'pass':<4} {'before: range':>16} {'spread':>7} "
                 f"{'after: range':>16} {'spread':>7}")  # fmt: skip
    for shape in dict.fromkeys(shape_name(r) for r in rows):
        for p in ("fwd", "bwd"):
            got = [v for (_, q, s), v in ratios.items() if s == shape and q == p]
            b, a = [x[0] for x in got], [x[1] for x in got]
            lines.append(
                f"{shape:<26} {p:<4} {min(b):>7.2f}–{max(b):<8.2f} {max(b) / min(b):>7.2f} "
                f"{min(a):>7.2f}–{max(a):<8.2f} {max(a) / min(a):>7.2f}"
            )
    for label, i in (("before", 0), ("after", 1)):
        errs = [abs(v[i] - 1) for v in ratios.values()]
        lines.append(
            f"{label}: |model ÷ measured − 1| median {100 * statistics.median(errs):.1f} %, "
            f"max {100 * max(errs):.1f} % over {len(errs)} (kernel, pass, shape)"
        )
    return lines


def block_table(rows: list[dict[str, Any]]) -> list[str]:
    at64 = {r["kernel"]: r for r in rows if r["head_dim"] == 64}
    head = (
        f"{'model':<14} {'kernel':<7} {'tokens':>6} {'fwd before':>10} {'after':>7} {'Δ':>6} "
        f"{'bwd before':>10} {'after':>7} {'Δ':>6} {'attn share':>10} {'fwd/bwd at meas. rate':>22}"
    )
    lines = ["2. the prior's block (ms, eager bf16, micro-batch 1, H200)", head, "-" * len(head)]
    for name in BLOCK_MODELS:
        spec = MODEL_PRESETS[name]
        for kernel, measured in (("flex", "flex"), ("flash2", "flash")):
            for seq in BLOCK_LENGTHS:
                training = TrainingSpec(
                    seq_len_tokens=seq, global_batch_tokens=seq, attention_kernel=kernel
                )
                splits = []
                for on in (False, True):
                    with laws(on):
                        splits.append(CostModel(spec, training, POOL).block_work(1))
                (bf, bb), (af, ab) = splits
                share = (af.attention_s + ab.attention_s) / (af.total_s + ab.total_s)
                implied = ""
                row = at64.get(measured)
                if row is not None and spec.head_width == 64 and seq == row["seq_len"]:
                    flops = 2.0 * seq * seq * spec.q_dim
                    f = af.total_s - af.attention_s + flops / (row["fwd_tflops"] * 1e12)
                    b = ab.total_s - ab.attention_s + 2.5 * flops / (row["bwd_tflops"] * 1e12)
                    implied = f"{1e3 * f:.3f}/{1e3 * b:.3f}"
                lines.append(
                    f"{spec.name:<14} {kernel:<7} {seq:>6} {1e3 * bf.total_s:>10.3f} "
                    f"{1e3 * af.total_s:>7.3f} {100 * (af.total_s / bf.total_s - 1):>+5.1f}% "
                    f"{1e3 * bb.total_s:>10.3f} {1e3 * ab.total_s:>7.3f} "
                    f"{100 * (ab.total_s / bb.total_s - 1):>+5.1f}% {100 * share:>9.0f}% "
                    f"{implied:>22}"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jsonl", type=Path, default=DEFAULT, help="the H200 attention file")
    args = parser.parse_args(argv)
    try:
        lines = args.jsonl.read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:
        print(f"bench_attention_shapes: error: {args.jsonl}: {exc}", file=sys.stderr)
        return 2
    attention = [r for r in rows if r.get("kind") == "attn" and r.get("kernel") in KERNELS]
    if not attention:
        print(f"bench_attention_shapes: error: {args.jsonl}: no attention rows", file=sys.stderr)
        return 2
    print("\n".join([*attention_table(attention), "", *block_table(attention)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
