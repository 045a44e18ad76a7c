"""Arguments shared by ``predict`` and ``simulate``: model, pool, training, coefficients.

The training options (activation checkpointing mode, gradient sync, ``torch.compile``,
sharding, …) are derived from `TrainingSpec`'s own fields — flag name, choices and help
come from the field — so the CLI never drifts from the spec; values are validated by the
spec, and a bad one exits 2 with one line naming the field."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from shardmeter.cli.args import field_bounds, float_arg, int_arg
from shardmeter.cli.specflags import SpecFlag, add_spec_flags, flag_names, spec_values
from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.model import CostModel
from shardmeter.errors import SpecError
from shardmeter.spec.loading import (
    gpu_from_arg,
    link_from_arg,
    model_from_arg,
    network_from_arg,
    read_document,
    validate,
)
from shardmeter.spec.pool import (
    DEFAULT_GRID_CARBON_INTENSITY_G_PER_KWH,
    DEFAULT_PUE,
    MAX_GRID_CARBON_INTENSITY,
    MAX_PUE,
    PoolHardware,
    PoolSpec,
)
from shardmeter.spec.training import ActivationCheckpointing, TrainingSpec

TRAINING_FLAGS = (
    SpecFlag("precision", "--precision", "bf16|fp32|fp8"),
    *(
        SpecFlag(name, "--" + name.replace("_", "-"))
        for name in (
            "activation_checkpointing",
            "activation_checkpointing_every",
            "gradient_sync",
            "torch_compile",
            "sharding",
            "shard_group_nodes",
            "grad_reduce_bytes",
            "param_all_gather",
            "attention_kernel",
            "total_tokens",
        )
    ),
)
"""`TrainingSpec` fields exposed as ``--kebab-case`` flags (the rest come from
``--seq-len``/``--micro-batch`` or keep their defaults)."""


def add_training_flags(group: argparse._ArgumentGroup) -> None:
    """One flag per `TRAINING_FLAGS` field, typed (and range-checked) from the field; unset
    flags keep the spec's defaults."""
    ac = next(f for f in TRAINING_FLAGS if f.field == "activation_checkpointing")
    add_spec_flags(group, TrainingSpec, [f for f in TRAINING_FLAGS if f is not ac], overrides=True)
    field = TrainingSpec.model_fields[ac.field]
    help_text = " ".join((field.description or "").split("\n\n")[0].split()).replace("%", "%%")
    group.add_argument(  # ``--activation-checkpointing`` alone still means full, as before the modes
        ac.flag,
        nargs="?",
        const=ActivationCheckpointing.FULL.value,
        default=None,
        metavar="|".join(e.value for e in ActivationCheckpointing),
        help=f"{help_text} Alone: full. (default: none)",
    )


def training_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in spec_values(args, TRAINING_FLAGS).items() if v is not None}


MODEL_POOL_FLAGS: dict[str, str] = {
    "pool": "--power-cap-watts",  # the pool's own rule: the cap within the board's limits
    "pool.gpu": "--gpu",
    "pool.nodes": "--nodes",
    "pool.gpus_per_node": "--gpus-per-node",
    "pool.intra_node_link": "--intra-node-link",
    "pool.inter_node_link": "--inter-node-link",
    "pool.network": "--network",
    "pool.power_cap_watts": "--power-cap-watts",
    "pool.pue": "--pue",
    "pool.grid_carbon_intensity_g_per_kwh": "--grid-carbon-intensity-g-per-kwh",
    "training": "--seq-len",
    "training.seq_len_tokens": "--seq-len",
    "training.global_batch_tokens": "--micro-batch",
    **flag_names(TrainingSpec, TRAINING_FLAGS, "training"),
    "accumulation": "--accumulation",
    "max_inflight": "--max-inflight",
}
"""Spec fields the model and pool flags set: errors about them name the flag."""


def add_model_pool_args(p: argparse.ArgumentParser) -> None:
    nodes = field_bounds(PoolHardware, "nodes")
    gpus = field_bounds(PoolHardware, "gpus_per_node")
    seq = field_bounds(TrainingSpec, "seq_len_tokens")
    g = p.add_argument_group("model and hardware")
    g.add_argument(
        "--model",
        metavar="NAME|FILE",
        help="model preset (e.g. llama-3.1-8b) or YAML/JSON file (required)",
    )
    g.add_argument(
        "--gpu",
        metavar="NAME|FILE",
        help="GPU preset (e.g. h200-141gb-sxm) or file (default: the coefficients file's device)",
    )
    g.add_argument(
        "--pool", metavar="FILE", help="a PoolSpec YAML/JSON file instead of --gpu/--*-link"
    )
    g.add_argument(
        "--nodes",
        type=int_arg(*nodes),
        default=1,
        metavar="N",
        help=f"island nodes N ({nodes[0]}–{nodes[1]:,})",
    )
    g.add_argument(
        "--gpus-per-node",
        type=int_arg(*gpus),
        default=8,
        metavar="G",
        help=f"island GPUs per node G ({gpus[0]}–{gpus[1]})",
    )
    g.add_argument(
        "--intra-node-link",
        metavar="NAME|FILE",
        help="link preset or file (default: the GPU's usual one)",
    )
    g.add_argument(
        "--network",
        metavar="NAME|FILE|JSON",
        help="node network: preset (8x-ndr, 8x-hdr, 8x-400gbe, 4x-200gbe, 1x-100gbe), YAML/JSON "
        'file or inline JSON ({"nicsPerNode": 8, "nicBandwidthBytesPerS": "400 Gbit/s"}) '
        "(default: the GPU's usual server)",
    )
    g.add_argument(
        "--inter-node-link",
        metavar="NAME|FILE",
        help="legacy: a per-GPU rail preset or file, one NIC per GPU (prefer --network)",
    )
    g.add_argument(
        "--power-cap-watts",
        type=float_arg(0, 100_000, low_open=True),
        metavar="W",
        help="GPU power limit, within the board's (default: the board's TDP)",
    )
    g.add_argument(
        "--pue",
        type=float_arg(1.0, MAX_PUE),
        metavar="X",
        help=f"the site's power usage effectiveness (1–{MAX_PUE:g}; default {DEFAULT_PUE:g})",
    )
    g.add_argument(
        "--grid-carbon-intensity-g-per-kwh",
        type=float_arg(0.0, MAX_GRID_CARBON_INTENSITY),
        metavar="G",
        help="the site's grid carbon intensity in gCO₂e/kWh (default "
        f"{DEFAULT_GRID_CARBON_INTENSITY_G_PER_KWH:g}, the 2023 world average)",
    )
    g.add_argument(
        "--coefficients", metavar="FILE", help="coefficients JSON (default: datasheet priors)"
    )
    t = p.add_argument_group("training")
    t.add_argument(
        "--seq-len",
        type=int_arg(*seq),
        default=4096,
        metavar="S",
        help=f"tokens per sequence ({seq[0]}–{seq[1]:,})",
    )
    t.add_argument(
        "--micro-batch",
        type=int_arg(1, MAX_MICRO_BATCH),
        default=1,
        metavar="B",
        help=f"sequences per GPU per micro-step (1–{MAX_MICRO_BATCH:,})",
    )
    add_training_flags(t)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


MAX_MICRO_BATCH = 1_048_576
"""Largest ``--micro-batch`` (the step's tokens must also stay within the training spec's
global batch limit)."""


def build_cost_model(args: argparse.Namespace) -> CostModel:
    """The CostModel the arguments describe; the island must fit inside the pool and, for
    hsdp, be whole shard groups (``--nodes`` a multiple of ``--shard-group-nodes``)."""
    if not args.model:
        raise SpecError("--model", "is required (a preset such as llama-3.1-8b, or a file)")
    model = model_from_arg(args.model)
    coefficients = CoefficientsDocument.read(args.coefficients) if args.coefficients else None
    if args.pool:
        pool = validate(PoolSpec, read_document(args.pool), source=args.pool)
    else:
        if args.gpu:
            gpu = gpu_from_arg(args.gpu)
        elif coefficients is not None:
            gpu = coefficients.gpu
        else:
            raise SpecError("--gpu", "is required unless --pool or --coefficients gives the device")
        if args.network and args.inter_node_link:
            raise SpecError("--network", "give either --network or --inter-node-link, not both")
        pool = validate(
            PoolSpec,
            {
                "name": "command-line",
                "gpu": gpu,
                "nodes": args.nodes,
                "gpus_per_node": args.gpus_per_node,
                "intra_node_link": link_from_arg(args.intra_node_link, "--intra-node-link")
                if args.intra_node_link
                else None,
                "inter_node_link": link_from_arg(args.inter_node_link, "--inter-node-link")
                if args.inter_node_link
                else None,
                "network": network_from_arg(args.network) if args.network else None,
                "power_cap_watts": args.power_cap_watts,
                **({"pue": args.pue} if args.pue is not None else {}),
                **(
                    {"grid_carbon_intensity_g_per_kwh": args.grid_carbon_intensity_g_per_kwh}
                    if args.grid_carbon_intensity_g_per_kwh is not None
                    else {}
                ),
            },
            "pool",
        )
    if args.nodes > pool.nodes:
        raise SpecError("--nodes", f"{args.nodes} exceeds the pool's {pool.nodes} nodes")
    if args.gpus_per_node > pool.gpus_per_node:
        raise SpecError(
            "--gpus-per-node", f"{args.gpus_per_node} exceeds the pool's {pool.gpus_per_node}"
        )
    ranks = args.nodes * args.gpus_per_node
    batch = args.seq_len * args.micro_batch * ranks
    _, most = field_bounds(TrainingSpec, "global_batch_tokens")
    if batch > most:
        raise SpecError(
            "--micro-batch",
            f"--seq-len {args.seq_len} × --micro-batch {args.micro_batch} × {ranks} GPUs = "
            f"{batch:,} tokens per micro-step; at most {most:,}",
        )
    training = validate(
        TrainingSpec,
        {
            "seq_len_tokens": args.seq_len,
            "global_batch_tokens": batch,
            "precision": coefficients.precision.value if coefficients else "bf16",
            **training_overrides(args),
        },
        "training",
    )
    problem = training.shard_group_problem(args.nodes)  # hsdp: the island is whole groups
    if problem is not None:
        raise SpecError("--shard-group-nodes", problem)
    return CostModel(model, training, pool, coefficients)


def json_ready(value: Any) -> Any:
    """``value`` with every non-finite float (an unbounded search bound, an undefined ratio)
    as ``None``: the output is strict JSON (no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value


def emit_json(payload: dict[str, Any]) -> None:
    """Strict JSON on stdout (non-finite numbers become null)."""
    json.dump(
        json_ready(payload), sys.stdout, indent=2, sort_keys=False, default=str, allow_nan=False
    )
    sys.stdout.write("\n")


# ---- memory and peaks, shared by predict and simulate -------------------------------------

EXIT_DOES_NOT_FIT = 1
"""``predict``/``simulate`` of a configuration that does not fit in GPU memory (without
``--ignore-memory``)."""


def add_ignore_memory_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ignore-memory",
        action="store_true",
        help="print the times and throughput of a configuration that does not fit in GPU "
        "memory as if it did (exit 0); without it such a configuration says so first, prints "
        "no throughput and exits 1",
    )


def does_not_fit_line(memory: dict[str, Any], accumulation: int) -> str:
    """The first line for a configuration that does not fit: how much it needs, how much
    there is, and the micro-batch that would fit at this accumulation."""
    most = memory["max_micro_batch_with_accumulation"]
    hint = (
        f"the largest micro-batch that fits at accumulation {accumulation} is {most}"
        if most > 0
        else "not even micro-batch 1 fits: more GPUs per island, activation checkpointing "
        "or a shorter sequence"
    )
    return (
        f"does not fit in memory: {memory['total_bytes'] / 2**30:.1f} GiB per GPU needed, "
        f"{memory['capacity_bytes'] / 2**30:.1f} GiB usable; {hint}"
    )


def peak_flops(cm: CostModel) -> dict[str, Any]:
    """The peak MFU is quoted against (dense bf16 for bf16 and fp8 training, as torchtitan
    does; fp32 for fp32) and, for fp8 training, the GPU's dense fp8 peak beside it."""
    gpu, precision = cm.gpu, cm.training.precision.value
    basis = "fp32" if precision == "fp32" else "bf16"
    out: dict[str, Any] = {"basis": basis, basis: cm.peak_flop_per_s}
    if precision == "fp8" and gpu.peak_fp8_flop_per_s is not None:
        out["fp8"] = gpu.peak_fp8_flop_per_s
    return out
