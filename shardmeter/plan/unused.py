"""Why the chosen plan leaves a pool out: for each pool it does not use, the best plan the
search found that uses the pool — by the objective's own rule — and what that plan lost on
against the chosen one (time, cost, throughput, a budget; the inner step its slowest islands
set, the outer step over the WAN, quality), or why no plan can use the pool at all.

Computed from the search's own results: the layouts it scored (every layout when it was
exhaustive, so the plan named is the best that uses the pool) and, after branch and bound,
also the chosen plan with each of the pool's options added and each option alone (then the
plan named is the best of those, not a proven optimum)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardmeter.plan.evaluate import (
    BATCH_UNREACHABLE,
    NO_SETTINGS,
    NO_WAN_UPLINK,
    OVER_CO2_BUDGET,
    Evaluation,
)
from shardmeter.plan.frontier import canonical_order, first_least, pick
from shardmeter.plan.infeasible import no_option_reason
from shardmeter.plan.options import max_islands
from shardmeter.plan.result import PlanResult, PlanSummary, summarise
from shardmeter.plan.schema import ObjectiveKind, Runtime


@dataclass(frozen=True)
class UnusedPool:
    """A pool the chosen plan does not use, and why."""

    pool: str
    plan: PlanSummary | None
    """The best plan found that uses the pool, by the objective's rule (None: no feasible
    plan uses it)."""
    exact: bool
    """Every layout was scored (exhaustive search): no plan that uses the pool does better.
    Else ``plan`` is the best of those the search scored and the chosen plan with the pool
    added."""
    lost_on: str
    """What decided against it: ``time``, ``cost``, ``energy``, ``co2``, ``throughput``
    (outside the throughput fraction), ``budget`` (outside the time or cost budget),
    ``tie`` (equal figures, the canonical order), or ``infeasible`` / ``excluded``."""
    reason: str
    """One sentence for people: the plan, its figures against the chosen one's, and why."""


def unused_pools(result: PlanResult) -> list[UnusedPool]:
    """Every pool of the request the chosen plan does not use, in file order."""
    out = result.output
    spec = out.spec
    by_name = {c.pool.name: c for c in out.contexts}
    used = {g.pool for g in result.chosen.groups}
    found = []
    for pool in spec.pools:
        if pool.name in used:
            continue
        ctx = by_name.get(pool.name)
        if ctx is None:
            reason = "not in constraints.allowedPools"
            found.append(UnusedPool(pool.name, None, True, "excluded", reason))
            continue
        found.append(_explain(result, ctx.index))
    return found


# ---- one pool -------------------------------------------------------------------------------
def _candidates(result: PlanResult, p: int) -> tuple[Evaluation, bool, Evaluation | None]:
    """(feasible layouts that use pool ``p``, exact, the extra layouts scored for it)."""
    out = result.output
    ev = out.evaluated
    scored = ev.subset(np.flatnonzero(ev.choice[:, p] >= 0))
    exact = out.stats.mode == "exhaustive" and out.stats.proven
    if exact and len(scored):
        return scored, True, None
    extra = _extra_layouts(result, p)
    if extra is None:
        return scored, exact, None
    both = Evaluation.concat([scored, extra.subset(extra.feasible)], len(out.contexts))
    return both, exact, extra


def _extra_layouts(result: PlanResult, p: int) -> Evaluation | None:
    """The chosen layout with each option of pool ``p`` added, and each option alone, within
    the island and GPU limits, scored as the search scores layouts."""
    out = result.output
    t, spec = out.table, out.spec
    options = np.flatnonzero(t.pool == p)
    if not len(options):
        return None
    chosen = out.evaluated.choice[out.chosen]
    used = chosen >= 0
    islands = int(t.islands[chosen[used]].sum())
    gpus = int(t.gpus[chosen[used]].sum())
    kmax, gmax = max_islands(spec), spec.constraints.max_gpus or (1 << 62)
    rows = []
    for o in options:
        alone = np.full(len(chosen), -1, dtype=np.int64)
        alone[p] = o
        rows.append(alone)
        if islands + int(t.islands[o]) <= kmax and gpus + int(t.gpus[o]) <= gmax:
            added = chosen.copy()
            added[p] = o
            rows.append(added)
    return out.evaluator.evaluate(np.asarray(rows, dtype=np.int64))


def _explain(result: PlanResult, p: int) -> UnusedPool:
    out = result.output
    ctx = out.contexts[p]
    name = ctx.pool.name
    if not (out.table.pool == p).any():
        why = no_option_reason(out.spec, [ctx], out.grid).removeprefix("no island fits: ")
        return UnusedPool(name, None, True, "infeasible", f"no island of it fits: {why}")
    cands, exact, extra = _candidates(result, p)
    if not len(cands):
        return UnusedPool(name, None, exact, "infeasible", _no_plan(result, extra))
    i, lost_on = _best(result, cands)
    alt = summarise(out, cands, i)
    head = (
        f"the best plan with it, {alt.label}, "
        if exact
        else f"the best plan found with it (not proven best), {alt.label}, "
    )
    lost_on, why = _why(result, alt, lost_on)
    return UnusedPool(name, alt, exact, lost_on, head + why)


def _no_plan(result: PlanResult, extra: Evaluation | None) -> str:
    """Why no feasible plan uses the pool: the verdicts of its layouts (``extra``)."""
    spec = result.output.spec
    if extra is None or not len(extra):
        return "no plan with it within constraints.maxIslands and maxGpus"
    codes = set(extra.status.tolist())
    parts = []
    if BATCH_UNREACHABLE in codes:
        parts.append(
            "its islands cannot make up the global batch"
            + (
                " with the same tokens per island as the others (runtime torchtitan-ft)"
                if spec.runtime is Runtime.TORCHTITAN_FT
                else ""
            )
            + " (training.globalBatchTokens, constraints.globalBatchTolerance)"
        )
    if NO_WAN_UPLINK in codes:
        parts.append("plans with it span sites and a pool there has no wanUplink")
    if NO_SETTINGS in codes:
        parts.append("no Streaming DiLoCo settings within the guard-rails hide its outer step")
    if OVER_CO2_BUDGET in codes:
        parts.append("its plans emit more than objective.co2BudgetKg")
    return "no feasible plan uses it: " + ("; ".join(parts) or "none meets the constraints")


LOST_ON = {
    ObjectiveKind.MIN_TIME: "time",
    ObjectiveKind.MIN_COST: "cost",
    ObjectiveKind.MIN_ENERGY: "energy",
    ObjectiveKind.MIN_CO2: "co2",
    ObjectiveKind.THROUGHPUT_FRACTION: "cost",
    ObjectiveKind.COST_BUDGET: "time",
    ObjectiveKind.TIME_BUDGET: "cost",
}
"""What a candidate the objective picks (`pick`) lost on against the chosen plan."""


def _best(result: PlanResult, ev: Evaluation) -> tuple[int, str]:
    """The candidate the objective would pick among ``ev`` (`pick`, the throughput fraction
    taken of the chosen plan's fastest) and what it lost on against the chosen plan; none
    within the throughput fraction or budget: the fastest (the cheapest for a cost budget),
    which lost on that."""
    kind = result.output.spec.objective.kind
    order = canonical_order(ev)
    i = pick(ev, result.output.spec, order, result.fastest.rank_hours * 3600)
    if i is not None:
        return i, LOST_ON[kind]
    if kind is ObjectiveKind.THROUGHPUT_FRACTION:
        return int(order[0]), "throughput"
    if kind is ObjectiveKind.COST_BUDGET:
        return first_least(order, ev.rank_cost_usd), "budget"
    return int(order[0]), "budget"


# ---- the sentence ---------------------------------------------------------------------------
def _why(result: PlanResult, alt: PlanSummary, lost_on: str) -> tuple[str, str]:
    """(what it lost on, the verdict against the chosen plan and what makes the difference);
    equal on the objective's figure, it lost on the tie-break (``tie``)."""
    c = result.chosen
    obj = result.output.spec.objective
    dp = " to reach data-parallel's loss" if c.ranked_by_quality else ""
    a_h, c_h = alt.rank_hours, c.rank_hours
    a_usd, c_usd = alt.rank_cost_usd, c.rank_cost_usd
    figures = {
        "time": (a_h, c_h),
        "cost": (a_usd, c_usd),
        "energy": (_ranked(alt, alt.energy_kwh), _ranked(c, c.energy_kwh)),
        "co2": (_ranked(alt, alt.co2_kg), _ranked(c, c.co2_kg)),
    }
    tie = ""
    if lost_on in figures and figures[lost_on][0] <= figures[lost_on][1] * (1 + 1e-9):
        tie = _tie_break(lost_on, a_h, c_h, a_usd, c_usd, dp)
        lost_on = "tie"
    verdict = {
        "time": f"takes {a_h:,.1f} h{dp} against {c_h:,.1f} h ({_change(a_h, c_h)})",
        "cost": (
            "is within the throughput fraction but "
            if obj.kind is ObjectiveKind.THROUGHPUT_FRACTION
            else ""
        )
        + f"costs ${a_usd:,.0f}{dp} against ${c_usd:,.0f} ({_change(a_usd, c_usd)})",
        "energy": f"uses {figures['energy'][0]:,.0f} kWh{dp} against {figures['energy'][1]:,.0f} "
        f"({_change(*figures['energy'])})",
        "co2": f"emits {figures['co2'][0]:,.0f} kg CO₂e{dp} against {figures['co2'][1]:,.0f} "
        f"({_change(*figures['co2'])})",
        "throughput": f"runs at {_share(alt, result.fastest)} of the best throughput, below "
        f"objective.throughputFraction {obj.throughput_fraction:g} ({a_h:,.1f} h{dp} against "
        f"{c_h:,.1f} h)",
        "budget": (
            f"takes {a_h:,.1f} h{dp}, over objective.timeBudgetHours {obj.time_budget_hours:g}"
            if obj.kind is ObjectiveKind.TIME_BUDGET
            else f"costs ${a_usd:,.0f}{dp}, over objective.costBudgetUsd "
            f"${float(obj.cost_budget_usd or 0):,.0f}"
        ),
        "tie": tie,
    }[lost_on]
    causes = _causes(result, alt)
    return lost_on, verdict + (": " + "; ".join(causes) if causes else "")


def _tie_break(figure: str, a_h: float, c_h: float, a_usd: float, c_usd: float, dp: str) -> str:
    """Equal on the objective's ``figure``: the canonical order (`TIE_BREAK`) decided — less
    time, then less cost, then fewer nodes, islands, pools in file order."""
    slower, dearer = a_h > c_h * (1 + 1e-9), a_usd > c_usd * (1 + 1e-9)
    if figure == "time" and dearer:
        return (
            f"takes as long as the chosen plan ({a_h:,.1f} h{dp}) but costs ${a_usd:,.0f} "
            f"against ${c_usd:,.0f} ({_change(a_usd, c_usd)}): of equally fast plans the "
            "cheaper goes first"
        )
    if slower:
        what = {"cost": f"costs as much as the chosen plan (${a_usd:,.0f}{dp})"}.get(
            figure, f"ties with the chosen plan on {figure}"
        )
        return (
            f"{what} but takes {a_h:,.1f} h against {c_h:,.1f} h ({_change(a_h, c_h)}): of "
            "equal plans the faster goes first"
        )
    return (
        f"ties with the chosen plan ({a_h:,.1f} h, ${a_usd:,.0f}{dp}); equal plans go by "
        "the canonical order (fewer nodes, fewer islands, then pools in file order)"
    )


def _islands(n: int) -> str:
    return f"{n} island" + ("s" if n != 1 else "")


def _change(a: float, b: float) -> str:
    """``a`` against ``b`` as a signed percentage."""
    return f"{100 * (a / b - 1):+.1f} %" if b > 0 else "n/a"


def _ranked(p: PlanSummary, figure: float) -> float:
    return figure * p.quality.equivalent_token_factor if p.ranked_by_quality else figure


def _share(alt: PlanSummary, fastest: PlanSummary) -> str:
    return f"{100 * alt.rank_tokens_per_s / fastest.rank_tokens_per_s:.1f} %"


def _causes(result: PlanResult, alt: PlanSummary) -> list[str]:
    """What makes the difference: the inner step (and the islands that set it), the outer
    step over the WAN, quality, the price per hour and egress, the batch's overshoot."""
    c = result.chosen
    spec = result.output.spec
    out: list[str] = []
    if alt.step_s > c.step_s * 1.005:
        slow = max(alt.groups, key=lambda g: g.step_s)
        equal = spec.runtime is Runtime.TORCHTITAN_FT and len(alt.groups) > 1
        out.append(
            f"its inner step is {alt.step_s:.3g} s against {c.step_s:.3g} s, set by its "
            f"{slow.label} island{'s' if slow.count > 1 else ''} at "
            f"{slow.local_batch_tokens:,} tokens each"
            + (" (every island the same tokens: runtime torchtitan-ft)" if equal else "")
        )
    elif alt.step_s < c.step_s / 1.005:
        out.append(f"its inner step is shorter, {alt.step_s:.3g} s against {c.step_s:.3g} s")
    a_outer, c_outer = alt.effective_step_s - alt.step_s, c.effective_step_s - c.step_s
    if a_outer - c_outer > 0.005 * alt.effective_step_s:
        out.append(
            f"the outer step adds {a_outer:.3g} s per inner step against {c_outer:.3g} s"
            + _wan(result, alt)
            + (
                f", compute blocks {alt.blocking_s_per_outer_step:.3g} s per outer step"
                if alt.blocking_s_per_outer_step > 0
                else ""
            )
        )
    fa, fc = alt.quality.equivalent_token_factor, c.quality.equivalent_token_factor
    if c.ranked_by_quality and abs(fa - fc) > 1e-4:
        out.append(
            f"quality: its {_islands(alt.islands)} need ×{fa:.3f} the tokens to reach "
            f"data-parallel's loss, the chosen plan's {_islands(c.islands)} ×{fc:.3f}"
        )
    if alt.usd_per_hour > c.usd_per_hour * 1.005:
        out.append(f"its GPUs cost ${alt.usd_per_hour:,.0f}/h against ${c.usd_per_hour:,.0f}/h")
    if alt.egress_usd > c.egress_usd + 0.5:
        out.append(f"WAN egress ${alt.egress_usd:,.0f}")
    over = alt.global_batch_tokens / spec.training.global_batch_tokens - 1
    if over > 1e-9:
        out.append(
            f"its islands process {alt.global_batch_tokens:,} tokens per step, "
            f"{100 * over:.1f} % over the batch (only the batch counts)"
        )
    return out


def _wan(result: PlanResult, alt: PlanSummary) -> str:
    """ ", over the WAN (slowest uplink …)" when the plan spans sites."""
    pools = {p.name: p for p in result.output.spec.pools}
    used = [pools[g.pool] for g in alt.groups]
    if len({p.site for p in used}) < 2:
        return ""
    links = [p.wan_uplink for p in used if p.wan_uplink is not None]
    if not links:
        return ", over the WAN"
    slowest = min(links, key=lambda link: link.bandwidth_bytes_per_s)
    return (
        f", its outer all_reduce crossing the WAN (slowest uplink {slowest.name}: "
        f"{slowest.bandwidth_bytes_per_s * 8 / 1e9:,.3g} Gbit/s)"
    )
