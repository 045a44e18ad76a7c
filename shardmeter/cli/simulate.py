"""``shardmeter simulate``: simulate an FSDP step of one island shape and, for DiLoCo
strategies, the outer level across identical islands — from the cost model or from an
explicit durations file (what-if analysis)."""

from __future__ import annotations

import argparse
from typing import Any

from shardmeter.cli.common import add_model_pool_args, build_cost_model, emit_json
from shardmeter.errors import SpecError
from shardmeter.output import format as fmt
from shardmeter.output.sim_plots import SweepPoint, plot_batch_sweep, plot_timeline
from shardmeter.output.trace import write_trace
from shardmeter.sim.diloco import DiLoCoResult, IslandSteps, StreamingSettings, simulate_diloco
from shardmeter.sim.fsdp import DEFAULT_MAX_INFLIGHT, FSDPDurations, StepResult, simulate_fsdp_step
from shardmeter.sim.outer import IslandPlacement, OuterLink, fabric_link, outer_link, wan_link
from shardmeter.sim.scenario import DiLoCoIsland, IslandShape, IslandStepModel, simulate_islands
from shardmeter.sim.settings import SettingsChoice
from shardmeter.spec.hardware import LinkKind
from shardmeter.spec.loading import link_from_arg, read_document, validate
from shardmeter.spec.training import StrategySpec


def _int_or_auto(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer or 'auto' (got {value!r})") from None


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate an FSDP step and the (Streaming) DiLoCo outer level",
        description=__doc__,
    )
    add_model_pool_args(p)
    s = p.add_argument_group("step and strategy")
    s.add_argument(
        "--accumulation", type=int, default=1, help="gradient accumulation micro-steps A"
    )
    s.add_argument(
        "--max-inflight",
        type=int,
        default=DEFAULT_MAX_INFLIGHT,
        help=f"gathered units resident at once (default {DEFAULT_MAX_INFLIGHT})",
    )
    s.add_argument("--strategy", choices=["fsdp", "diloco", "streaming-diloco"], default="fsdp")
    s.add_argument("--islands", type=int, default=1, help="identical islands (DiLoCo strategies)")
    s.add_argument(
        "--outer-link",
        help="link between islands: a WAN preset/file means different sites "
        "(default: the pool's inter-node fabric)",
    )
    s.add_argument("--sync-every", type=_int_or_auto, default="auto", help="H, or auto")
    s.add_argument(
        "--fragments", type=_int_or_auto, default="auto", help="Streaming DiLoCo fragments, or auto"
    )
    s.add_argument(
        "--fragment-sync-delay", type=_int_or_auto, default="auto", help="τ in inner steps, or auto"
    )
    s.add_argument("--fragment-layout", choices=["contiguous", "strided"], default="contiguous")
    s.add_argument("--outer-precision", choices=["bf16", "fp32"], default="fp32")
    s.add_argument(
        "--rounds", type=int, default=3, help="outer steps simulated (the last is measured)"
    )
    s.add_argument(
        "--durations", help="explicit task durations (YAML/JSON) instead of the cost model"
    )
    o = p.add_argument_group("outputs")
    o.add_argument("--trace", help="write a Chrome/Perfetto trace JSON here")
    o.add_argument("--png", help="write a timeline PNG here")
    o.add_argument("--sweep-png", help="write a micro-batch sweep PNG here (cost-model mode)")
    p.set_defaults(run=run)


def _strategy(args: argparse.Namespace) -> StrategySpec:
    return validate(
        StrategySpec,
        {
            "kind": args.strategy,
            "sync_every": args.sync_every,
            "fragments": args.fragments,
            "fragment_sync_delay": args.fragment_sync_delay,
            "fragment_layout": args.fragment_layout,
            "outer_precision": args.outer_precision,
        },
        "strategy",
    )


def _step_dict(r: StepResult, tokens: int | None, mfu: float | None) -> dict[str, Any]:
    total = sum(r.critical_path_s.values()) or 1.0
    return {
        "step_s": r.step_s,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / r.step_s if tokens else None,
        "mfu": mfu,
        "bottleneck": r.verdict,
        "evidence": r.evidence(),
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
        "fragment_sync_delay": s.delay,
        "outer_link": link,
        "fragment_all_reduce_s": list(res.fragment_all_reduce_s),
        "period_s": res.period_s,
        "blocking_s_per_outer_step": res.blocking_s_per_outer_step,
        "island_idle_s_per_outer_step": list(res.island_idle_s_per_outer_step),
        "slowdown": res.slowdown,
        "bottleneck": "outer-step-bound" if res.blocking_s_per_outer_step > 1e-9 else None,
    }
    if choice is not None:
        out["zero_blocking_possible"] = choice.zero_blocking
        out["sync_every_for_zero_blocking"] = choice.sync_every_for_zero_blocking
        out["recommendation"] = choice.reason
    return out


def _render(p: dict[str, Any]) -> str:
    st = p["step"]
    lines = [p["title"], ""]
    head = f"step: {fmt.seconds(st['step_s'])}"
    if st["tokens_per_s"]:
        head += f"; {fmt.si(st['tokens_per_step'])} tokens/step → {fmt.si(st['tokens_per_s'])} tokens/s per island"
    if st["mfu"] is not None:
        head += f"; MFU {fmt.percent(st['mfu'])}"
    lines += [
        head,
        f"bottleneck: {st['bottleneck']} — {st['evidence']}",
        "critical path: "
        + ", ".join(f"{k} {fmt.percent(v)}" for k, v in st["critical_path_share"].items()),
    ]
    d = p.get("diloco")
    if d:
        lines += [
            "",
            f"{p['strategy']} across {p['islands']} island(s) over {d['outer_link']}:",
            f"  settings: syncEvery {d['sync_every']}, fragments {d['fragments']}, "
            f"fragmentSyncDelay {d['fragment_sync_delay']}",
            "  fragment all_reduce: "
            + ", ".join(fmt.seconds(x) for x in d["fragment_all_reduce_s"][:8])
            + (" …" if len(d["fragment_all_reduce_s"]) > 8 else ""),
            f"  outer step every {fmt.seconds(d['period_s'])}; blocking per outer step "
            f"{fmt.seconds(d['blocking_s_per_outer_step'])}; slowdown vs no DiLoCo communication "
            f"{fmt.percent(d['slowdown'])}",
        ]
        if d.get("recommendation"):
            lines.append(f"  {d['recommendation']}")
    for label in ("trace", "png", "sweep_png"):
        if p.get(label):
            lines.append(f"wrote {p[label]}")
    return "\n".join(lines)


def _from_durations(args: argparse.Namespace) -> dict[str, Any]:
    raw = read_document(args.durations)
    if not isinstance(raw, dict):
        raise SpecError(args.durations, "must be a mapping with 'units'")
    durations = FSDPDurations.from_mapping(raw, args.durations)
    accumulation = raw.get("accumulation", args.accumulation)
    if not isinstance(accumulation, int) or accumulation < 1:
        raise SpecError(
            f"{args.durations}.accumulation", f"must be an integer ≥ 1 (got {accumulation!r})"
        )
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
    dil = raw.get("diloco")
    if dil is not None:
        payload.update(_durations_diloco(dil, step.step_s, f"{args.durations}.diloco", args.rounds))
    return payload


def _durations_diloco(dil: Any, step_s: float, where: str, rounds: int) -> dict[str, Any]:
    if not isinstance(dil, dict):
        raise SpecError(where, "must be a mapping")
    try:
        settings = StreamingSettings(
            int(dil.get("sync_every", 0)),
            int(dil.get("fragments", 1)),
            int(dil.get("fragment_sync_delay", 0)),
        )
    except (TypeError, ValueError) as exc:
        raise SpecError(
            where, "sync_every, fragments and fragment_sync_delay must be integers"
        ) from exc
    islands_raw = dil.get("islands", 2)
    islands = (
        [IslandSteps(f"island{i}", step_s, (0.0,) * settings.fragments) for i in range(islands_raw)]
        if isinstance(islands_raw, int)
        else [
            IslandSteps(
                str(x.get("name", f"island{i}")),
                float(x.get("step_s", step_s)),
                (float(x.get("outer_step_s", 0.0)),) * settings.fragments,
            )
            for i, x in enumerate(islands_raw)
        ]
    )
    ar = dil.get("all_reduce_s", 0.0)
    ars = (
        [float(ar)] * settings.fragments if isinstance(ar, int | float) else [float(x) for x in ar]
    )
    res = simulate_diloco(islands, settings, ars, rounds)
    return {
        "diloco": _diloco_dict(res, None, "given durations"),
        "_diloco": res,
        "strategy": "streaming-diloco" if settings.fragments > 1 or settings.delay else "diloco",
        "islands": len(islands),
    }


def _from_cost_model(args: argparse.Namespace) -> dict[str, Any]:
    if args.accumulation < 1:
        raise SpecError("--accumulation", f"must be ≥ 1 (got {args.accumulation})")
    if args.islands < 1:
        raise SpecError("--islands", f"must be ≥ 1 (got {args.islands})")
    strategy = _strategy(args)
    cm = build_cost_model(args)
    shape = IslandShape(args.nodes, args.gpus_per_node)
    model = IslandStepModel(cm, shape, args.micro_batch, args.max_inflight)
    step = model.simulate(args.accumulation)
    tokens = model.tokens_per_step(args.accumulation)
    payload: dict[str, Any] = {
        "title": f"{cm.model.name} on {shape} {cm.gpu.name} ({cm.coefficients.source.value} coefficients), "
        f"seq {cm.training.seq_len_tokens}, micro-batch {args.micro_batch} × accumulation {args.accumulation}",
        "step": _step_dict(step, tokens, model.mfu(args.accumulation)),
        "strategy": strategy.kind.value,
        "islands": args.islands,
        "_schedule": step.schedule,
        "_inner": step,
        "memory_fits": cm.memory(shape.ranks, args.micro_batch, args.accumulation).fits,
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
    if args.sweep_png:
        points = []
        limit = max(2, 2 * cm.max_micro_batch(shape.ranks, args.accumulation))
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
                    cm.memory(shape.ranks, b).fits,
                )
            )
            b *= 2
        payload["sweep_png"] = str(plot_batch_sweep(points, args.sweep_png, payload["title"]))
    return payload


def run(args: argparse.Namespace) -> int:
    payload = _from_durations(args) if args.durations else _from_cost_model(args)
    schedule = payload.pop("_schedule")
    inner = payload.pop("_inner")
    diloco: DiLoCoResult | None = payload.pop("_diloco", None)
    shown = diloco.schedule if diloco is not None else schedule
    if args.trace:
        payload["trace"] = str(write_trace(shown, args.trace, "shardmeter simulate"))
    if args.png:
        window, inner_map = None, None
        if diloco is not None:
            # a steady-state window of the last round: two fragment windows (≥ 6 inner steps)
            step_s, period = inner.step_s, diloco.period_s
            span = min(period, max(6, 2 * diloco.settings.window) * step_s * 1.05)
            begin = diloco.schedule.makespan_s - period
            window = (begin, begin + span)
            if span / step_s <= 16:  # few enough steps to draw each one's FSDP detail
                inner_map = dict.fromkeys(range(int(payload["islands"])), inner.schedule)
        payload["png"] = str(plot_timeline(shown, args.png, payload["title"], window, inner_map))
    if args.json:
        emit_json(payload)
    else:
        print(_render(payload))
    return 0
