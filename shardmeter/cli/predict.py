"""``shardmeter predict``: per-unit compute, collectives, memory, FLOPs and MFU for one
island shape."""

from __future__ import annotations

import argparse
from typing import Any

from shardmeter.cli import format as fmt
from shardmeter.cli.common import add_model_pool_args, build_cost_model, emit_json
from shardmeter.cost.model import CostModel


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "predict",
        help="per-unit times, collectives, memory and MFU of one island",
        description=__doc__,
    )
    add_model_pool_args(p)
    p.set_defaults(run=run)


def prediction(cm: CostModel, nodes: int, gpus_per_node: int, micro_batch: int) -> dict[str, Any]:
    """The prediction as a JSON-ready dict (also the basis of the table)."""
    m, t = cm.model, cm.training
    ranks = nodes * gpus_per_node
    ut = cm.unit_times(micro_batch)
    pay = cm.payloads()
    c, r = t.compute_bytes, t.grad_reduce_bytes
    units = {
        "embedding": (ut.embedding_forward_s, ut.embedding_backward_s, pay.embedding_params, 1),
        "block": (ut.block_forward_s, ut.block_backward_s, pay.block_params, m.num_layers),
        "head": (ut.head_forward_s, ut.head_backward_s, pay.head_params, 1),
    }
    compute = sum((f + b) * n for f, b, _, n in units.values())
    flops = cm.model_flops_per_micro_step(micro_batch)
    mem = cm.memory(ranks, micro_batch)
    return {
        "model": {"name": m.name, "total_params": m.total_params},
        "gpu": cm.gpu.name,
        "island": {"nodes": nodes, "gpus_per_node": gpus_per_node, "ranks": ranks},
        "seq_len": t.seq_len_tokens,
        "micro_batch": micro_batch,
        "precision": t.precision.value,
        "activation_checkpointing": t.activation_checkpointing,
        "coefficients_source": cm.coefficients.source.value,
        "units": {
            name: {"forward_s": f, "backward_s": b, "params": p, "count": n}
            for name, (f, b, p, n) in units.items()
        },
        "collectives": {
            "link": cm.link_fit("all_gather", nodes).link,
            "all_gather_s": {
                name: cm.collective_seconds("all_gather", p * c, nodes, gpus_per_node)
                for name, (_, _, p, _) in units.items()
            },
            "reduce_scatter_s": {
                name: cm.collective_seconds("reduce_scatter", p * r, nodes, gpus_per_node)
                for name, (_, _, p, _) in units.items()
            },
        },
        "optimizer_step_s": cm.optimizer_seconds(ranks),
        "memory": {
            **mem.as_dict(),
            "fits": mem.fits,
            "max_micro_batch": cm.max_micro_batch(ranks),
            "max_micro_batch_with_accumulation": cm.max_micro_batch(ranks, accumulation=2),
        },
        "flops_per_micro_step_per_gpu": flops,
        "compute_s_per_micro_step": compute,
        "mfu_compute_only": flops / (compute * cm.peak_flop_per_s),
        "roofline_clamped": list(ut.roofline_clamped),
    }


def render(p: dict[str, Any]) -> str:
    isl = p["island"]
    lines = [
        f"{p['model']['name']} ({fmt.si(p['model']['total_params'])} params) on "
        f"{isl['nodes']}×{isl['gpus_per_node']} {p['gpu']}, seq {p['seq_len']}, micro-batch "
        f"{p['micro_batch']}, {p['precision']}"
        + (", activation checkpointing" if p["activation_checkpointing"] else ""),
        f"coefficients: {p['coefficients_source']}"
        + (
            " (datasheet priors — benchmark the pool for measured figures)"
            if p["coefficients_source"] == "prior"
            else ""
        ),
        "",
    ]
    col = p["collectives"]
    rows = []
    for name, u in p["units"].items():
        label = f"{name} ×{u['count']}" if u["count"] > 1 else name
        rows.append(
            [
                label,
                fmt.si(u["params"]),
                fmt.seconds(u["forward_s"]),
                fmt.seconds(u["backward_s"]),
                fmt.seconds(col["all_gather_s"][name]),
                fmt.seconds(col["reduce_scatter_s"][name]),
            ]
        )
    lines.append(f"per FSDP unit (collectives over {isl['ranks']} ranks, {col['link']})")
    lines.append(
        fmt.table(["unit", "params", "forward", "backward", "all_gather", "reduce_scatter"], rows)
    )
    mem = p["memory"]
    lines += ["", "memory per GPU"]
    mem_rows = [
        [k.removesuffix("_bytes").replace("_", " "), fmt.gib(mem[k])]
        for k in (
            "sharded_state_bytes",
            "gathered_units_bytes",
            "activation_bytes",
            "logits_bytes",
            "reserve_bytes",
            "total_bytes",
            "capacity_bytes",
        )
    ]
    lines.append(fmt.table(["component", "bytes"], mem_rows))
    lines += [
        f"fits: {'yes' if mem['fits'] else 'NO'}; max micro-batch {mem['max_micro_batch']} "
        f"(with gradient accumulation {mem['max_micro_batch_with_accumulation']})",
        "",
        f"optimizer step: {fmt.seconds(p['optimizer_step_s'])}",
        f"model FLOPs per GPU per micro-step: {fmt.si(p['flops_per_micro_step_per_gpu'], 'FLOP')}",
        f"compute per micro-step: {fmt.seconds(p['compute_s_per_micro_step'])}; "
        f"MFU (compute only, no communication): {fmt.percent(p['mfu_compute_only'])}",
    ]
    if p["roofline_clamped"]:
        lines.append(
            "warning: raised to the roofline bound (fit extrapolates too fast): "
            + ", ".join(p["roofline_clamped"])
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    cm = build_cost_model(args)
    result = prediction(cm, args.nodes, args.gpus_per_node, args.micro_batch)
    if args.json:
        emit_json(result)
    else:
        print(render(result))
    return 0
