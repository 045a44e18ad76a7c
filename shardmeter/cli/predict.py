"""shardmeter predict: per-unit compute, collectives, memory, FLOPs and MFU for one
island shape.

A shape that does not fit in GPU memory says so first and prints no step time or throughput
(exit 1), unless --ignore-memory asks for the figures as if it fitted."""

from __future__ import annotations

import argparse
from typing import Any

from shardmeter.cli.args import HelpFormatter, int_arg
from shardmeter.cli.common import (
    EXIT_DOES_NOT_FIT,
    MODEL_POOL_FLAGS,
    add_ignore_memory_flag,
    add_model_pool_args,
    build_cost_model,
    does_not_fit_line,
    emit_json,
    peak_flops,
)
from shardmeter.cost.energy import co2_kg, facility_kwh, gpu_power_watts, islands_facility_watts
from shardmeter.cost.model import CostModel
from shardmeter.cost.stragglers import straggler_factor
from shardmeter.output import format as fmt
from shardmeter.sim.fsdp import MAX_ACCUMULATION
from shardmeter.sim.scenario import IslandShape, IslandStepModel

EXAMPLES = """examples:
  shardmeter predict --model llama-3.1-8b --gpu h200 --seq-len 8192 --micro-batch 1
  shardmeter predict --model llama-3.1-70b --gpu h100 --nodes 8 --network 8x-ndr \\
                     --activation-checkpointing selective-op --torch-compile --accumulation 2 --json
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "predict",
        help="per-unit times, collectives, memory and MFU of one island",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    add_model_pool_args(p)
    p.add_argument(
        "--accumulation",
        type=int_arg(1, MAX_ACCUMULATION),
        default=1,
        metavar="A",
        help=f"micro-steps per optimizer step (1–{MAX_ACCUMULATION:,})",
    )
    add_ignore_memory_flag(p)
    p.set_defaults(run=run, flags=MODEL_POOL_FLAGS)


def prediction(
    cm: CostModel, nodes: int, gpus_per_node: int, micro_batch: int, accumulation: int = 1
) -> dict[str, Any]:
    """The prediction as a JSON-ready dict (also the basis of the table)."""
    m, t = cm.model, cm.training
    ranks = nodes * gpus_per_node
    ut = cm.unit_times(micro_batch)
    pay = cm.payloads()
    net = cm.pool.node_network
    step_model = IslandStepModel(cm, IslandShape(nodes, gpus_per_node), micro_batch)
    step = step_model.simulate(accumulation)
    fwd, bwd = cm.block_work(micro_batch)
    units = {
        "embedding": (ut.embedding_forward_s, ut.embedding_backward_s, pay.embedding_params, 1),
        "block": (ut.block_forward_s, ut.block_backward_s, pay.block_params, m.num_layers),
        "head": (ut.head_forward_s, ut.head_backward_s, pay.head_params, 1),
    }
    compute = sum((f + b) * n for f, b, _, n in units.values())
    flops = cm.model_flops_per_micro_step(micro_batch)
    mem = cm.memory(ranks, micro_batch, accumulation, gpus_per_node=gpus_per_node)
    tokens = accumulation * micro_batch * t.seq_len_tokens
    return {
        "model": {"name": m.name, "total_params": m.total_params},
        "gpu": cm.gpu.name,
        "island": {"nodes": nodes, "gpus_per_node": gpus_per_node, "ranks": ranks},
        "seq_len": t.seq_len_tokens,
        "micro_batch": micro_batch,
        "accumulation": accumulation,
        "precision": t.precision.value,
        "activation_checkpointing": t.activation_checkpointing.value,
        "gradient_sync": step_model.gradient_sync.value,
        "torch_compile": t.torch_compile,
        "sharding": t.sharding.value,
        "power_cap_watts": cm.pool.power_cap_watts,
        "clock_fraction": cm.clock_fraction,
        "coefficients_source": cm.coefficients.source.value,
        "units": {
            name: {"forward_s": f, "backward_s": b, "params": p, "count": n}
            for name, (f, b, p, n) in units.items()
        },
        "block_work_s": {
            "forward": vars(fwd),
            "backward": vars(bwd),
            "recompute": ut.block_recompute_s,
        },
        "collectives": {
            "intra_node_link": cm.pool.intra.name,
            "network": {
                "nics_per_node": net.nics_per_node,
                "nic_bandwidth_bytes_per_s": net.nic_bandwidth_bytes_per_s,
                "kind": net.kind.value,
                "rail_optimized": net.rail_optimized,
            },
            "link": cm.link_fit("all_gather", nodes).link,
            "all_gather_s": {
                name: cm.gather_seconds(p, nodes, gpus_per_node, block=name == "block")
                for name, (_, _, p, _) in units.items()
            },
            "reduce_scatter_s": {
                name: cm.gradient_sync_seconds(p, nodes, gpus_per_node)
                for name, (_, _, p, _) in units.items()
            },
        },
        "optimizer_step_s": cm.optimizer_seconds(cm.shard_ranks(nodes, gpus_per_node)),
        "memory": {
            **mem.as_dict(),
            "fits": mem.fits,
            "max_micro_batch": cm.max_micro_batch(ranks, gpus_per_node=gpus_per_node),
            "max_micro_batch_with_accumulation": cm.max_micro_batch(
                ranks, accumulation=accumulation, gpus_per_node=gpus_per_node
            ),
        },
        "peak_flop_per_s": peak_flops(cm),
        "flops_per_micro_step_per_gpu": flops,
        "compute_s_per_micro_step": compute,
        "mfu_compute_only": flops / (compute * cm.peak_flop_per_s),
        "step": {
            "step_s": step.step_s,
            "tokens_per_s_per_gpu": tokens / step.step_s,
            "mfu": step_model.mfu(accumulation),
            "bottleneck": step.verdict,
            "evidence": step.evidence(),
            "interference_s": step.interference_s,
            "straggler_factor": straggler_factor(ranks),
        },
        "roofline_clamped": list(ut.roofline_clamped),
        "power": _power(cm, nodes, gpus_per_node, step.compute_busy_s / step.step_s),
    }


def _power(cm: CostModel, nodes: int, gpus_per_node: int, utilisation: float) -> dict[str, Any]:
    """The island's draw (`shardmeter.cost.energy`) and what an hour of it costs in energy
    and CO₂e."""
    watts = islands_facility_watts(cm.pool, 1, nodes, nodes * gpus_per_node, utilisation)
    kwh = facility_kwh(watts, 1.0, 1.0)
    return {
        "utilisation": utilisation,
        "gpu_watts": gpu_power_watts(cm.gpu, cm.pool.power_cap_watts, utilisation),
        "pue": cm.pool.pue,
        "facility_kw": watts / 1000,
        "kwh_per_hour": kwh,
        "co2_kg_per_hour": co2_kg(kwh, cm.pool.grid_carbon_intensity_g_per_kwh),
    }


def render(p: dict[str, Any]) -> str:
    isl = p["island"]
    options = [p["precision"], f"activation checkpointing {p['activation_checkpointing']}"]
    if p["torch_compile"]:
        options.append("torch.compile")
    if p["sharding"] != "fsdp":
        options.append(p["sharding"])
    if p["accumulation"] > 1:
        options.append(f"accumulation {p['accumulation']} ({p['gradient_sync']} gradient sync)")
    if p["power_cap_watts"] is not None:
        options.append(f"power cap {p['power_cap_watts']:g} W (clock ×{p['clock_fraction']:.2f})")
    lines = [] if p["memory"]["fits"] else [does_not_fit_line(p["memory"], p["accumulation"])]
    if not p["memory"]["fits"] and "step" in p:
        lines.append("(--ignore-memory: the figures below are as if it fitted; it would not run)")
    lines += [
        f"{p['model']['name']} ({fmt.si(p['model']['total_params'])} params) on "
        f"{isl['nodes']}×{isl['gpus_per_node']} {p['gpu']}, seq {p['seq_len']}, micro-batch "
        f"{p['micro_batch']}, " + ", ".join(options),
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
    net = col["network"]
    lines.append(
        f"per FSDP unit (collectives over {isl['ranks']} ranks; {col['intra_node_link']} inside "
        f"a node, {net['nics_per_node']} × {net['nic_bandwidth_bytes_per_s'] * 8 / 1e9:g} Gbit/s "
        f"{net['kind']} between nodes; embedding and head are FSDP2's root unit, gathered once)"
    )
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
            "accumulation_bytes",
            "activation_bytes",
            "logits_bytes",
            "reserve_bytes",
            "total_bytes",
            "capacity_bytes",
        )
    ]
    lines.append(fmt.table(["component", "bytes"], mem_rows))
    lines.append(max_micro_batch_line(mem, p["accumulation"]))
    if "step" not in p:  # does not fit: no figures as if it ran
        return "\n".join(lines)
    peak = p["peak_flop_per_s"]
    lines += [
        "",
        f"optimizer step: {fmt.seconds(p['optimizer_step_s'])}",
        f"model FLOPs per GPU per micro-step: {fmt.si(p['flops_per_micro_step_per_gpu'], 'FLOP')}",
        f"compute per micro-step: {fmt.seconds(p['compute_s_per_micro_step'])}; "
        f"MFU (compute only, no communication): {fmt.mfu(p['mfu_compute_only'], peak)}",
        "",
        f"simulated step: {fmt.seconds(p['step']['step_s'])}, "
        f"{p['step']['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
        f"MFU {fmt.mfu(p['step']['mfu'], peak)}, {p['step']['bottleneck']}",
        f"  {p['step']['evidence']}; slowest of {isl['ranks']} GPUs: "
        f"×{p['step']['straggler_factor']:.3f}",
    ]
    pw = p["power"]
    lines.append(
        f"power: {pw['gpu_watts']:.0f} W per GPU at {fmt.percent(pw['utilisation'])} compute "
        f"utilisation; the island draws {pw['facility_kw']:.1f} kW at the meter (PUE "
        f"{pw['pue']:g}): {pw['kwh_per_hour']:.1f} kWh and {pw['co2_kg_per_hour']:.1f} kg CO₂e "
        "per hour"
    )
    if p["roofline_clamped"]:
        lines.append(
            "warning: raised to the roofline bound (fit extrapolates too fast): "
            + ", ".join(p["roofline_clamped"])
        )
    return "\n".join(lines)


def max_micro_batch_line(mem: dict[str, Any], accumulation: int) -> str:
    """Whether it fits, and the largest micro-batch that does at accumulation 1 and at the
    accumulation asked for (the accumulated gradients take memory of their own)."""
    line = f"fits: {'yes' if mem['fits'] else 'NO'}; max micro-batch {mem['max_micro_batch']}"
    if accumulation > 1:
        line += (
            f" without gradient accumulation, {mem['max_micro_batch_with_accumulation']} "
            f"with gradient accumulation {accumulation}"
        )
    return line


def without_step(p: dict[str, Any]) -> dict[str, Any]:
    """The prediction of a shape that does not fit: what it is and its memory, nothing that
    reads as if it ran (times, throughput, MFU, power)."""
    kept = (
        "model",
        "gpu",
        "island",
        "seq_len",
        "micro_batch",
        "accumulation",
        "precision",
        "activation_checkpointing",
        "gradient_sync",
        "torch_compile",
        "sharding",
        "power_cap_watts",
        "clock_fraction",
        "coefficients_source",
        "units",
        "collectives",
        "memory",
    )
    out = {k: p[k] for k in kept}
    out["error"] = does_not_fit_line(p["memory"], p["accumulation"])
    return out


def run(args: argparse.Namespace) -> int:
    cm = build_cost_model(args)
    result = prediction(cm, args.nodes, args.gpus_per_node, args.micro_batch, args.accumulation)
    fits = bool(result["memory"]["fits"])
    if not fits and not args.ignore_memory:
        result = without_step(result)
    if args.json:
        emit_json(result)
    else:
        print(render(result))
    return 0 if fits or args.ignore_memory else EXIT_DOES_NOT_FIT
