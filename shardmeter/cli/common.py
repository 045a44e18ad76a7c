"""Arguments shared by ``predict`` and ``simulate``: model, pool, training, coefficients."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.cost.model import CostModel
from shardmeter.errors import SpecError
from shardmeter.spec.hardware import PoolSpec
from shardmeter.spec.loading import (
    gpu_from_arg,
    link_from_arg,
    model_from_arg,
    read_document,
    validate,
)
from shardmeter.spec.training import Precision, TrainingSpec


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
    g.add_argument("--inter-node-link", help="link preset or file (default: the GPU's usual one)")
    g.add_argument("--coefficients", help="coefficients JSON (default: datasheet priors)")
    t = p.add_argument_group("training")
    t.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (default 4096)")
    t.add_argument("--micro-batch", type=int, default=1, help="sequences per GPU per micro-step")
    t.add_argument(
        "--precision",
        choices=[x.value for x in Precision],
        help="compute precision (default: the coefficients', else bf16)",
    )
    t.add_argument(
        "--activation-checkpointing", action="store_true", help="full activation checkpointing"
    )
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
        pool = PoolSpec(
            name="cli",
            gpu=gpu,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            intra_node_link=link_from_arg(args.intra_node_link, "--intra-node-link")
            if args.intra_node_link
            else None,
            inter_node_link=link_from_arg(args.inter_node_link, "--inter-node-link")
            if args.inter_node_link
            else None,
        )
    if args.nodes > pool.nodes:
        raise SpecError("--nodes", f"{args.nodes} exceeds the pool's {pool.nodes} nodes")
    if args.gpus_per_node > pool.gpus_per_node:
        raise SpecError(
            "--gpus-per-node", f"{args.gpus_per_node} exceeds the pool's {pool.gpus_per_node}"
        )
    precision = args.precision or (coefficients.precision.value if coefficients else "bf16")
    ranks = args.nodes * args.gpus_per_node
    batch = global_batch_tokens or args.seq_len * args.micro_batch * ranks
    training = validate(
        TrainingSpec,
        {
            "seq_len_tokens": args.seq_len,
            "global_batch_tokens": batch,
            "precision": precision,
            "activation_checkpointing": args.activation_checkpointing,
        },
        "training",
    )
    return CostModel(model, training, pool, coefficients)


def emit_json(payload: dict[str, Any]) -> None:
    json.dump(payload, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
