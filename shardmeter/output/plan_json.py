"""Plan results as JSON-ready data (the CLI's ``--json``): the chosen and fastest plans, the
frontier, the highest-throughput plans, the tolerance spread and how the search went."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from shardmeter.plan.result import TIE_BREAK, PlanResult, PlanSummary
from shardmeter.plan.unused import unused_pools


def result_dict(
    result: PlanResult, top: list[PlanSummary] | None = None, files: dict[str, str] | None = None
) -> dict[str, Any]:
    d = result.detail
    diloco = None
    if d.diloco is not None:
        r = d.diloco
        diloco = {
            "outer_link": d.outer_link,
            "period_s": r.period_s,
            "blocking_s_per_outer_step": r.blocking_s_per_outer_step,
            "slowdown": r.slowdown,
            "fragment_all_reduce_s": list(r.fragment_all_reduce_s),
            "island_idle_s_per_outer_step": list(r.island_idle_s_per_outer_step),
            "settings_reason": d.settings_reason,
        }
    out = result.output
    stats = out.stats
    spread = result.spread
    return {
        "runtime": result.runtime.value,
        "chosen": {
            **result.chosen.as_dict(),
            "bottleneck": d.bottleneck,
            "evidence": d.evidence,
            "simulated_diloco": diloco,
        },
        "fastest": result.fastest.as_dict(),
        "saving_vs_fastest": result.saving_vs_fastest,
        "within_throughput_fraction": {**asdict(spread), "spread": spread.spread},
        "tie_break": TIE_BREAK,
        "objective": out.spec.objective.model_dump(),
        "guard_rails": {
            "max_sync_every": out.spec.strategy.max_sync_every,
            "max_fragment_sync_delay": out.spec.strategy.max_fragment_sync_delay,
            "max_fragment_sync_delay_fraction": out.spec.strategy.max_fragment_sync_delay_fraction,
            "layers_per_fragment": out.spec.strategy.layers_per_fragment,
            "max_measured_islands": out.spec.strategy.max_measured_islands,
            "beyond_measured_islands": out.spec.strategy.beyond_measured_islands.value,
        },
        "frontier": [p.as_dict() for p in result.frontier],
        "top_by_throughput": [p.as_dict() for p in (top or [])],
        "coefficients": result.coefficient_sources,
        "search": {
            "mode": stats.mode,
            "plans_scored": stats.candidates_evaluated,
            "layouts_estimate": stats.layouts_estimate,
            "seconds": stats.seconds,
            "frontier_size": stats.frontier_size,
            "proven_optimal": stats.proven,
            "gap": stats.gap,
            "shapes_not_simulated": stats.shapes_left,
            "passes": [
                {
                    "goal": p.goal.minimise,
                    "completed": p.completed,
                    "best": p.best,
                    "bound": p.bound,
                    "nodes_expanded": p.expanded,
                }
                for p in stats.passes
            ],
        },
        "notes": out.notes,
        "unused_pools": [
            {
                "pool": u.pool,
                "best_plan": u.plan.as_dict() if u.plan is not None else None,
                "best_plan_exact": u.exact,
                "lost_on": u.lost_on,
                "reason": u.reason,
            }
            for u in unused_pools(result)
        ],
        "excluded_shapes": {c.pool.name: c.notes for c in out.contexts if c.notes},
        "files": files or {},
    }
