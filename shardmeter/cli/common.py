"""Arguments shared by ``predict`` and ``simulate``: model, pool, training, coefficients.

The training options (activation checkpointing mode, gradient sync, ``torch.compile``,
sharding, …) are derived from `TrainingSpec`'s own fields — flag name, choices and help
come from the field — so the CLI never drifts from the spec; values are validated by the
spec, and a bad one exits 2 with one line naming the field."""

from __future__ import annotations

import argparse
import json
import sys
from enum import Enum
from typing import Any, get_args

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.model import CostModel
from shardmeter.errors import SpecError
from shardmeter.spec.hardware import PoolSpec
from shardmeter.spec.loading import (
    gpu_from_arg,
    link_from_arg,
    model_from_arg,
    network_from_arg,
    read_document,
    validate,
)
from shardmeter.spec.training import ActivationCheckpointing, TrainingSpec

TRAINING_FLAGS = (
    "precision",
    "activation_checkpointing",
    "activation_checkpointing_every",
    "gradient_sync",
    "torch_compile",
    "sharding",
    "shard_group_nodes",
    "grad_reduce_bytes",
)
"""`TrainingSpec` fields exposed as ``--kebab-case`` flags (the rest come from
``--seq-len``/``--micro-batch`` or keep their defaults)."""


def _enum_of(annotation: Any) -> type[Enum] | None:
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, Enum):
            return candidate
        for inner in get_args(candidate):
            if isinstance(inner, type) and issubclass(inner, Enum):
                return inner
    return None


def add_training_flags(group: argparse._ArgumentGroup) -> None:
    """One flag per `TRAINING_FLAGS` field, typed from the field."""
    for name in TRAINING_FLAGS:
        field = TrainingSpec.model_fields[name]
        flag = "--" + name.replace("_", "-")
        help_text = (field.description or "").split("\n\n")[0].replace("%", "%%")
        enum = _enum_of(field.annotation)
        if name == "activation_checkpointing":
            # ``--activation-checkpointing`` alone still means full, as before the modes
            group.add_argument(
                flag,
                nargs="?",
                const=ActivationCheckpointing.FULL.value,
                default=None,
                metavar="MODE",
                help=f"{help_text} Alone: full.",
            )
        elif enum is not None:
            group.add_argument(
                flag, default=None, metavar="|".join(e.value for e in enum), help=help_text
            )
        elif field.annotation is bool:
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            group.add_argument(flag, type=int, default=None, help=help_text)


def training_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {n: getattr(args, n) for n in TRAINING_FLAGS if getattr(args, n, None) is not None}


def _validate_as_flags(model: type[Any], data: dict[str, Any], where: str) -> Any:
    """``validate`` whose error names the command-line flag (``--power-cap-watts``) when
    the field at fault came from one."""
    try:
        return validate(model, data, where)
    except SpecError as exc:
        head, _, rest = exc.field.partition(".")
        name, _, tail = rest.partition(".")
        if head == where and name and not tail:
            raise SpecError("--" + name.replace("_", "-"), exc.message) from exc
        raise


def add_model_pool_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and hardware")
    g.add_argument("--model", help="model preset (e.g. llama-3.1-8b) or YAML/JSON file (required)")
    g.add_argument(
        "--gpu",
        help="GPU preset (e.g. h200-141gb-sxm) or file; default: the coefficients file's device",
    )
    g.add_argument("--pool", help="a PoolSpec YAML/JSON file instead of --gpu/--*-link")
    g.add_argument("--nodes", type=int, default=1, help="island nodes N (default 1)")
    g.add_argument(
        "--gpus-per-node", type=int, default=8, help="island GPUs per node G (default 8)"
    )
    g.add_argument("--intra-node-link", help="link preset or file (default: the GPU's usual one)")
    g.add_argument(
        "--network",
        help="node network: preset (8x-ndr, 8x-hdr, 8x-400gbe, 4x-200gbe, 1x-100gbe), YAML/JSON "
        'file or inline JSON ({"nicsPerNode": 8, "nicBandwidthBytesPerS": "400 Gbit/s"}); '
        "default: the GPU's usual server",
    )
    g.add_argument(
        "--inter-node-link",
        help="legacy: a per-GPU rail preset or file, one NIC per GPU (prefer --network)",
    )
    g.add_argument(
        "--power-cap-watts", type=float, help="GPU power limit (default: the board's TDP)"
    )
    g.add_argument("--coefficients", help="coefficients JSON (default: datasheet priors)")
    t = p.add_argument_group("training")
    t.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (default 4096)")
    t.add_argument("--micro-batch", type=int, default=1, help="sequences per GPU per micro-step")
    add_training_flags(t)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SpecError("--" + name.replace("_", "-"), f"must be ≥ 1 (got {value})")


def build_cost_model(args: argparse.Namespace, global_batch_tokens: int | None = None) -> CostModel:
    """The CostModel the arguments describe; the island must fit inside the pool."""
    _positive(args, "nodes", "gpus_per_node", "seq_len", "micro_batch")
    if not args.model:
        raise SpecError("--model", "is required")
    model = model_from_arg(args.model)
    coefficients = CoefficientsDocument.read(args.coefficients) if args.coefficients else None
    if args.pool:
        pool = validate(PoolSpec, read_document(args.pool), args.pool)
    else:
        if args.gpu:
            gpu = gpu_from_arg(args.gpu)
        elif coefficients is not None:
            gpu = coefficients.gpu
        else:
            raise SpecError("--gpu", "is required unless --pool or --coefficients gives the device")
        if args.network and args.inter_node_link:
            raise SpecError("--network", "give either --network or --inter-node-link, not both")
        pool = _validate_as_flags(
            PoolSpec,
            {
                "name": "cli",
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
    batch = global_batch_tokens or args.seq_len * args.micro_batch * ranks
    training = _validate_as_flags(
        TrainingSpec,
        {
            "seq_len_tokens": args.seq_len,
            "global_batch_tokens": batch,
            "precision": coefficients.precision.value if coefficients else "bf16",
            **training_overrides(args),
        },
        "training",
    )
    return CostModel(model, training, pool, coefficients)


def emit_json(payload: dict[str, Any]) -> None:
    json.dump(payload, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
