"""shardmeter simulate: simulate an FSDP step of one island shape and, for DiLoCo
strategies, the outer level across identical islands — from the cost model or from an
explicit durations file (what-if analysis; examples/what-if.yaml).

From the cost model the island is checked against GPU memory first: a configuration that
does not fit says so and prints no step (exit 1), unless --ignore-memory."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shardmeter.cli.args import (
    HelpFormatter,
    check_output_file,
    int_arg,
    writing,
)
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
from shardmeter.cli.specflags import SpecFlag, add_spec_flags, flag_names, spec_values
from shardmeter.cost.energy import co2_kg, facility_kwh, gpu_power_watts, islands_facility_watts
from shardmeter.cost.model import CostModel
from shardmeter.cost.quality import (
    OuterSettings,
    QualityEstimate,
    runs_text,
    strategy_quality,
)
from shardmeter.errors import SpecError
from shardmeter.output import format as fmt
from shardmeter.output.sim_plots import (
    SweepPoint,
    diloco_caption,
    outer_step_window,
    plot_batch_sweep,
    plot_timeline,
)
from shardmeter.output.trace import write_trace
from shardmeter.sim.bottleneck import Bottleneck, blocks
from shardmeter.sim.diloco import (
    DEFAULT_ROUNDS,
    MAX_ROUNDS,
    MAX_SIMULATED_INNER_STEPS,
    DiLoCoResult,
    simulate_diloco,
)
from shardmeter.sim.fsdp import (
    DEFAULT_MAX_INFLIGHT,
    MAX_ACCUMULATION,
    MAX_SIMULATED_UNIT_STEPS,
    MAX_UNITS,
    StepResult,
    simulate_fsdp_step,
)
from shardmeter.sim.outer import IslandPlacement, OuterLink, fabric_link, outer_link, wan_link
from shardmeter.sim.scenario import DiLoCoIsland, IslandShape, IslandStepModel, simulate_islands
from shardmeter.sim.settings import SettingsChoice
from shardmeter.sim.whatif import WhatIfDocument
from shardmeter.spec.hardware import LinkKind
from shardmeter.spec.loading import link_from_arg, read_document, validate
from shardmeter.spec.training import AUTO_FIELD_BOUNDS, MAX_ISLANDS, StrategySpec

QUALITY_NEEDS_TOKENS = (
    "not priced — DiLoCo's loss penalty against data-parallel depends on the run's tokens; "
    "give --total-tokens (e.g. 20 × the model's parameters, the Chinchilla budget)"
)
"""What ``simulate`` says instead of a quality figure for tokens nobody gave."""

EXAMPLES = """examples:
  shardmeter simulate --model llama-3.2-1b --gpu a100 --seq-len 4096 --accumulation 4
  shardmeter simulate --model llama-3.2-1b --gpu a100 --seq-len 4096 --strategy streaming-diloco \\
                      --islands 4 --outer-link wan-10g-30ms --png t.png --trace t.json
  shardmeter simulate --durations examples/what-if.yaml --rounds 5 --json
"""

STRATEGY_FLAGS = (
    SpecFlag("kind", "--strategy"),
    SpecFlag("sync_every", "--sync-every", "H|auto"),
    SpecFlag("fragments", "--fragments", "F|auto"),
    SpecFlag("fragment_sync_delay", "--fragment-sync-delay", "τ|auto"),
    SpecFlag("fragment_layout", "--fragment-layout"),
    SpecFlag("outer_precision", "--outer-precision"),
)
"""The strategy's flags: each is its `StrategySpec` field (choices, range, default, help)."""

FLAGS: dict[str, str] = {
    **flag_names(StrategySpec, STRATEGY_FLAGS, "strategy"),
    "strategy": "--strategy",
    "strategy.maxSyncEvery": "--sync-every",
    "rounds": "--rounds",
    "islands": "--islands",
}
"""Errors about the strategy's fields name the flags that set them."""

DETAILS_HELP = (
    "also print where the step's idle time goes, the quality's basis, every fragment's "
    "all_reduce and why these DiLoCo settings where nothing blocks (the JSON always has them)"
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate an FSDP step and the (Streaming) DiLoCo outer level",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    add_model_pool_args(p)
    s = p.add_argument_group("step and strategy")
    s.add_argument(
        "--accumulation",
        type=int_arg(1, MAX_ACCUMULATION),
        default=1,
        metavar="A",
        help=f"gradient accumulation micro-steps A (1–{MAX_ACCUMULATION:,}; steps over "
        f"{MAX_SIMULATED_UNIT_STEPS:,} unit-micro-steps are carried on from the first ones)",
    )
    s.add_argument(
        "--max-inflight",
        type=int_arg(1, MAX_UNITS),
        default=DEFAULT_MAX_INFLIGHT,
        metavar="K",
        help=f"gathered units resident at once (1–{MAX_UNITS:,})",
    )
    s.add_argument(
        "--islands",
        type=int_arg(1, MAX_ISLANDS),
        default=1,
        metavar="N",
        help=f"identical islands, for the DiLoCo strategies (1–{MAX_ISLANDS})",
    )
    s.add_argument(
        "--outer-link",
        metavar="NAME|FILE",
        help="link between islands: a WAN preset/file means different sites "
        "(default: the pool's inter-node fabric)",
    )
    add_spec_flags(
        s,
        StrategySpec,
        STRATEGY_FLAGS,
        defaults={"kind": "fsdp"},
        bounds=AUTO_FIELD_BOUNDS,
    )
    s.add_argument(
        "--rounds",
        type=int_arg(1, MAX_ROUNDS),
        default=DEFAULT_ROUNDS,
        metavar="R",
        help=f"outer steps simulated, the last one measured (1–{MAX_ROUNDS}; islands × rounds "
        f"× H ≤ {MAX_SIMULATED_INNER_STEPS:,})",
    )
    s.add_argument(
        "--durations",
        metavar="FILE",
        help="explicit task durations (YAML/JSON, snake_case or camelCase keys; "
        "examples/what-if.yaml) instead of the cost model",
    )
    o = p.add_argument_group("outputs (checked before anything is simulated)")
    o.add_argument("--trace", metavar="FILE.json", help="write a Chrome/Perfetto trace JSON here")
    o.add_argument("--png", metavar="FILE.png", help="write a timeline PNG here")
    o.add_argument(
        "--sweep-png",
        metavar="FILE.png",
        help="write a micro-batch sweep PNG here (cost-model mode)",
    )
    o.add_argument("--details", action="store_true", help=DETAILS_HELP)
    add_ignore_memory_flag(p)
    p.set_defaults(run=run, flags={**MODEL_POOL_FLAGS, **FLAGS})


_STRATEGY_RULE_FLAGS = (
    ("fragmentSyncDelay", "--fragment-sync-delay"),
    ("fragments", "--fragments"),
    ("syncEvery", "--sync-every"),
    ("outerPrecision", "--outer-precision"),
)


def _strategy(args: argparse.Namespace) -> StrategySpec:
    try:
        return validate(
            StrategySpec,
            spec_values(args, STRATEGY_FLAGS),
            "strategy",
        )
    except SpecError as exc:
        if exc.field != "strategy":
            raise
        # a torchft rule between the values: name the flag the message starts with
        message = exc.message.replace(
            "use kind: streaming-diloco", "use --strategy streaming-diloco"
        )
        flag = next(
            (f for name, f in _STRATEGY_RULE_FLAGS if message.startswith(name)), "--strategy"
        )
        raise SpecError(flag, message) from exc


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output path is writable before anything is simulated."""
    for flag, path, suffix in (
        ("--trace", args.trace, ".json"),
        ("--png", args.png, ".png"),
        ("--sweep-png", args.sweep_png, ".png"),
    ):
        if path is None:
            continue
        if Path(path).suffix.lower() != suffix:
            raise SpecError(flag, f"must name a {suffix} file (got {path!r})")
        check_output_file(path, flag)
    if args.sweep_png and args.durations:
        raise SpecError("--sweep-png", "sweeps the cost model's micro-batch; not with --durations")


def _step_dict(r: StepResult, tokens: int | None, mfu: float | None) -> dict[str, Any]:
    total = sum(r.critical_path_s.values()) or 1.0
    return {
        "step_s": r.step_s,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / r.step_s if tokens else None,
        "mfu": mfu,
        "bottleneck": r.verdict,
        "evidence": r.evidence(),
        "busy": r.busy(),
        "compute_busy_s": r.compute_busy_s,
        "comm_busy_s": r.comm_busy_s,
        "compute_idle_s": r.compute_idle_s,
        "critical_path_share": {k.value: v / total for k, v in r.critical_path_s.items()},
    }


def _diloco_dict(res: DiLoCoResult, choice: SettingsChoice | None, link: str) -> dict[str, Any]:
    s = res.settings
    out: dict[str, Any] = {
        "sync_every": s.sync_every,
        "fragments": s.fragments,
        "fragment_sync_delay": s.fragment_sync_delay,
        "outer_link": link,
        "fragment_all_reduce_s": list(res.fragment_all_reduce_s),
        "period_s": res.period_s,
        "blocking_s_per_outer_step": res.blocking_s_per_outer_step,
        "island_idle_s_per_outer_step": list(res.island_idle_s_per_outer_step),
        "slowdown": res.slowdown,
        "bottleneck": Bottleneck.OUTER_STEP if blocks(res.blocking_s_per_outer_step) else None,
    }
    if choice is not None:
        out["zero_blocking_possible"] = choice.zero_blocking
        out["sync_every_for_zero_blocking"] = choice.sync_every_for_zero_blocking
        out["recommendation"] = choice.reason
    return out


def _render(p: dict[str, Any], details: bool = False) -> str:
    if "step" not in p:  # does not fit: what was asked and its memory, no step
        m = p["memory"]
        return "\n".join(
            [
                p["error"],
                p["title"],
                f"memory per GPU: {fmt.gib(m['total_bytes'])} of {fmt.gib(m['capacity_bytes'])}"
                f"; max micro-batch {m['max_micro_batch_with_accumulation']} at accumulation "
                f"{p['accumulation']} (see shardmeter predict for the breakdown)",
            ]
        )
    st = p["step"]
    lines = [p["title"], ""]
    if p.get("memory_fits") is False:
        lines[0:0] = [
            "(--ignore-memory: does not fit in GPU memory; the figures below are as if it did)"
        ]
    head = f"step: {fmt.seconds(st['step_s'])}"
    if st["tokens_per_s"]:
        head += f"; {fmt.si(st['tokens_per_step'])} tokens/step → {fmt.si(st['tokens_per_s'])} tokens/s per island"
    if st["mfu"] is not None:
        head += f"; MFU {fmt.mfu(st['mfu'], p['peak_flop_per_s'])}"
    lines += [
        head,
        f"bottleneck: {st['bottleneck']} — {st['evidence'] if details else st['busy']}",
        "critical path: "
        + ", ".join(f"{k} {fmt.percent(v)}" for k, v in st["critical_path_share"].items()),
    ]
    q, e = p.get("quality"), p.get("energy")
    if p.get("quality_note"):
        lines += ["", f"quality: {p['quality_note']}"]
    if q and (q["loss_penalty_vs_dp"] or q["equivalent_token_factor"] != 1.0):
        lo, hi = q["equivalent_token_factor_range"]
        lines += [
            "",
            f"quality: eval loss {100 * q['loss_penalty_vs_dp']:+.2f} % ± "
            f"{100 * q['loss_penalty_uncertainty']:.2f} pp against data-parallel; "
            f"×{q['equivalent_token_factor']:.3f} tokens ({lo:.3f}–{hi:.3f}) to reach its loss",
            *([f"  basis: {q['basis']}"] if details else []),
            *[f"  warning: {w}" for w in q["warnings"]],
        ]
    if e:
        power = (
            f"power: {e['gpu_watts']:.0f} W per GPU at {fmt.percent(e['utilisation'])} compute "
            f"utilisation, {e['facility_kw']:.1f} kW at the meter"
        )
        if e["hours"] is None:
            lines.append(f"{power}; --total-tokens gives the run's hours, energy and CO₂e")
        else:
            lines.append(
                f"{power}; {fmt.si(e['total_tokens'])} tokens in {e['hours']:,.1f} h: "
                f"{fmt.energy(e['energy_kwh'])}, {fmt.mass(e['co2_kg'])} CO₂e"
            )
    d = p.get("diloco")
    if d:
        lines += [
            "",
            f"{p['strategy']} across {p['islands']} island(s) over {d['outer_link']}:",
            f"  settings: syncEvery {d['sync_every']}, fragments {d['fragments']}, "
            f"fragmentSyncDelay {d['fragment_sync_delay']}",
            *([f"  runs: {d['runs']}"] if p["islands"] == 1 and d.get("runs") else []),
            _fragment_all_reduces(d["fragment_all_reduce_s"], details),
            f"  outer step every {fmt.seconds(d['period_s'])}; blocking per outer step "
            f"{fmt.seconds(d['blocking_s_per_outer_step'])}; slowdown vs no DiLoCo communication "
            f"{fmt.percent(d['slowdown'])}",
        ]
        if d.get("recommendation") and (details or d["blocking_s_per_outer_step"] > 0):
            lines.append(f"  {d['recommendation']}")  # what would hide blocking: always
    for label in ("trace", "png", "sweep_png"):
        if p.get(label):
            lines.append(f"wrote {p[label]}")
    return "\n".join(lines)


def _fragment_all_reduces(seconds: list[float], details: bool) -> str:
    """The fragments' all_reduce times: the longest (and how many) by default, each one with
    ``details``."""
    if details or len(seconds) == 1:
        return "  fragment all_reduce: " + ", ".join(fmt.seconds(x) for x in seconds)
    return (
        f"  fragment all_reduce: up to {fmt.seconds(max(seconds))} "
        f"({len(seconds)} fragments; --details lists each)"
    )


def _from_durations(args: argparse.Namespace) -> dict[str, Any]:
    doc = validate(WhatIfDocument, read_document(args.durations), source=args.durations)
    durations = doc.fsdp_durations()
    accumulation = doc.accumulation or args.accumulation
    step = simulate_fsdp_step(durations, accumulation, args.max_inflight)
    payload: dict[str, Any] = {
        "title": f"what-if from {args.durations}: {len(durations.unit_names)} units, "
        f"accumulation {accumulation}",
        "step": _step_dict(step, None, None),
        "strategy": "fsdp",
        "islands": 1,
        "_schedule": step.schedule,
        "_inner": step,
    }
    if doc.diloco is not None:
        dil = doc.diloco
        try:
            res = simulate_diloco(
                dil.island_steps(step.step_s),
                dil.settings,
                dil.fragment_all_reduce_s(),
                args.rounds,
            )
        except SpecError as exc:
            if exc.field == "rounds":  # the work bound: islands × rounds × syncEvery
                raise SpecError("--rounds", exc.message) from exc
            raise SpecError(f"diloco.{exc.field}", exc.message, args.durations) from exc
        payload.update(
            {
                "diloco": _diloco_dict(res, None, "given durations"),
                "_diloco": res,
                "strategy": "streaming-diloco"
                if dil.fragments > 1 or dil.fragment_sync_delay
                else "diloco",
                "islands": len(res.island_idle_s_per_outer_step),
            }
        )
    return payload


def _from_cost_model(args: argparse.Namespace) -> dict[str, Any]:
    strategy = _strategy(args)
    cm = build_cost_model(args)
    shape = IslandShape(args.nodes, args.gpus_per_node)
    title = (
        f"{cm.model.name} on {shape} {cm.gpu.name} ({cm.coefficients.source.value} coefficients), "
        f"seq {cm.training.seq_len_tokens}, micro-batch {args.micro_batch} × accumulation {args.accumulation}"
    )
    mem = cm.memory(
        shape.ranks, args.micro_batch, args.accumulation, gpus_per_node=shape.gpus_per_node
    )
    memory = {
        **mem.as_dict(),
        "fits": mem.fits,
        "max_micro_batch_with_accumulation": cm.max_micro_batch(
            shape.ranks, args.accumulation, gpus_per_node=shape.gpus_per_node
        ),
    }
    if not mem.fits and not args.ignore_memory:
        return {
            "title": title,
            "error": does_not_fit_line(memory, args.accumulation),
            "accumulation": args.accumulation,
            "memory": memory,
            "memory_fits": False,
        }
    model = IslandStepModel(cm, shape, args.micro_batch, args.max_inflight)
    step = model.simulate(args.accumulation)
    tokens = model.tokens_per_step(args.accumulation)
    payload: dict[str, Any] = {
        "title": title,
        "step": _step_dict(step, tokens, model.mfu(args.accumulation)),
        "peak_flop_per_s": peak_flops(cm),
        "strategy": strategy.kind.value,
        "islands": args.islands,
        "_schedule": step.schedule,
        "_inner": step,
        "memory_fits": mem.fits,
        "memory": memory,
    }
    if strategy.is_diloco:
        link: OuterLink
        if args.outer_link:
            spec = link_from_arg(args.outer_link, "--outer-link")
            link = wan_link([spec]) if spec.kind is LinkKind.WAN else fabric_link(spec, shape.ranks)
        else:
            link = outer_link([IslandPlacement(cm, shape.ranks)])
        islands = [DiLoCoIsland(f"island{i}", cm, shape, step.step_s) for i in range(args.islands)]
        outcome = simulate_islands(cm.model, strategy, islands, link, rounds=args.rounds)
        payload["diloco"] = _diloco_dict(outcome.result, outcome.choice, link.description)
        payload["_diloco"] = outcome.result
    _add_footprint(payload, args, cm, shape, step, strategy, tokens)
    if args.sweep_png:
        points = []
        most = cm.max_micro_batch(shape.ranks, args.accumulation, gpus_per_node=shape.gpus_per_node)
        limit = max(2, 2 * most)
        b = 1
        while b <= limit:
            sm = IslandStepModel(cm, shape, b, args.max_inflight)
            r = sm.simulate(1)
            points.append(
                SweepPoint(
                    b,
                    r.step_s,
                    r.compute_idle_fraction,
                    sm.tokens_per_step(1) / r.step_s,
                    cm.memory(shape.ranks, b, gpus_per_node=shape.gpus_per_node).fits,
                )
            )
            b *= 2
        sweep_title = (
            f"{cm.model.name} on {shape} {cm.gpu.name} ({cm.coefficients.source.value} "
            f"coefficients), seq {cm.training.seq_len_tokens}\nmicro-batch sweep: one step at "
            f"each micro-batch, no accumulation; memory checked at accumulation {args.accumulation}"
        )
        sweep = writing(
            "--sweep-png",
            args.sweep_png,
            lambda: plot_batch_sweep(points, args.sweep_png, sweep_title),
        )
        payload["sweep_png"] = str(sweep)
    return payload


def _add_footprint(
    payload: dict[str, Any],
    args: argparse.Namespace,
    cm: CostModel,
    shape: IslandShape,
    step: StepResult,
    strategy: StrategySpec,
    tokens_per_island_step: int,
) -> None:
    """Quality against data-parallel (DiLoCo strategies), power, energy and CO₂e of the
    simulated islands training ``training.totalTokens`` (``--total-tokens``)."""
    islands = args.islands if strategy.is_diloco else 1
    diloco: DiLoCoResult | None = payload.get("_diloco")
    sync_every, fragments, delay = 1, 1, 0
    effective_s = step.step_s
    if diloco is not None:
        s = diloco.settings
        sync_every, fragments, delay = s.sync_every, s.fragments, s.fragment_sync_delay
        effective_s = diloco.period_s / s.sync_every
    m = cm.model
    quality: QualityEstimate | None = None
    tokens_given = getattr(args, "total_tokens", None) is not None
    if strategy.is_diloco and not tokens_given:
        payload["quality_note"] = QUALITY_NEEDS_TOKENS
    else:
        quality = strategy_quality(
            float(m.total_params),
            float(cm.training.total_tokens),
            m.num_layers,
            strategy,
            islands,
            sync_every,
            fragments,
            delay,
        )
    payload["quality"] = asdict(quality) if quality is not None else None
    if strategy.is_diloco and "diloco" in payload:
        outer = OuterSettings(islands, sync_every, fragments, delay)
        payload["diloco"]["runs"] = runs_text(outer)
    utilisation = step.compute_busy_s / step.step_s if step.step_s > 0 else 1.0
    watts = islands_facility_watts(cm.pool, islands, shape.nodes, shape.ranks, utilisation)
    energy: dict[str, Any] = {
        "utilisation": utilisation,
        "gpu_watts": gpu_power_watts(cm.gpu, cm.pool.power_cap_watts, utilisation),
        "facility_kw": watts / 1000,
        "total_tokens": None,
        "hours": None,
        "energy_kwh": None,
        "co2_kg": None,
        "dp_equivalent_energy_kwh": None,
    }
    tokens_per_s = islands * tokens_per_island_step / effective_s if effective_s > 0 else 0.0
    if tokens_given and tokens_per_s > 0:  # a run's totals only for the tokens the user gave
        hours = cm.training.total_tokens / tokens_per_s / 3600
        kwh = facility_kwh(watts, hours, 1.0)
        energy |= {
            "total_tokens": cm.training.total_tokens,
            "hours": hours,
            "energy_kwh": kwh,
            "co2_kg": co2_kg(kwh, cm.pool.grid_carbon_intensity_g_per_kwh),
            "dp_equivalent_energy_kwh": (
                kwh * quality.equivalent_token_factor if quality is not None else None
            ),
        }
    payload["energy"] = energy


def run(args: argparse.Namespace) -> int:
    _check_outputs(args)
    payload = _from_durations(args) if args.durations else _from_cost_model(args)
    if "step" not in payload:  # does not fit in memory: nothing simulated, nothing written
        if args.json:
            emit_json(payload)
        else:
            print(_render(payload, args.details))
        return EXIT_DOES_NOT_FIT
    schedule = payload.pop("_schedule")
    inner = payload.pop("_inner")
    diloco: DiLoCoResult | None = payload.pop("_diloco", None)
    shown = diloco.schedule if diloco is not None else schedule
    if args.trace:
        trace = writing(
            "--trace", args.trace, lambda: write_trace(shown, args.trace, "shardmeter simulate")
        )
        payload["trace"] = str(trace)
    if args.png:
        window, inner_map = None, None
        if diloco is not None:
            shown_window = outer_step_window(diloco, inner.step_s)
            window = (shown_window.start_s, shown_window.end_s)
            span = window[1] - window[0]
            if inner.step_s > 0 and span / inner.step_s <= 16:  # few steps: each one's FSDP detail
                inner_map = dict.fromkeys(range(int(payload["islands"])), inner.schedule)
            caption = (
                diloco_caption(
                    payload["strategy"],
                    int(payload["islands"]),
                    payload["diloco"]["outer_link"],
                    diloco,
                )
                + "\n"
                + shown_window.caption
            )
        else:
            caption = f"fsdp: one island; shown: one step ({fmt.seconds(inner.step_s)})"
        title = f"{payload['title']}\n{caption}"
        png = writing(
            "--png",
            args.png,
            lambda: plot_timeline(shown, args.png, title, window, inner_map),
        )
        payload["png"] = str(png)
    if args.json:
        emit_json(payload)
    else:
        print(_render(payload, args.details))
    return 0
