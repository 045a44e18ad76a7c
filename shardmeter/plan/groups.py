"""An island group: ``count`` identical islands from one pool — the one type for it in the model.

What the islands run (pool, shape, micro-batch, accumulation, gradient-sync mode) is given when a
group is evaluated as is (`shardmeter.plan.fixed.evaluate_fixed`, the operator's re-evaluation of
a launched plan); a plan's groups (`shardmeter.plan.result.PlanSummary.groups`) also carry the GPU
and what each island is predicted to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardmeter.spec.training import GradientSync


@dataclass(frozen=True)
class IslandGroup:
    """``count`` identical islands of ``nodes`` × ``gpus_per_node`` GPUs from pool ``pool``."""

    pool: str
    count: int
    nodes: int
    gpus_per_node: int
    micro_batch: int
    accumulation: int
    gradient_sync: GradientSync | None = None
    """The FSDP gradient-accumulation mode (None: the training spec's)."""
    variant: str = ""
    """Further per-configuration settings (see `shardmeter.plan.configs.ConfigVariant`)."""
    gpu: str = ""
    """The pool's GPU (in a plan)."""
    local_batch_tokens: int = 0
    """Tokens one island processes per inner step (in a plan)."""
    step_s: float = 0.0
    """One island's predicted inner step (in a plan)."""

    @property
    def label(self) -> str:
        """ "k×N×G GPU", as in the paper's Fig. 8."""
        return f"{self.count}×{self.nodes}×{self.gpus_per_node} {self.gpu.split('-')[0]}"


def plan_label(groups: Sequence[IslandGroup]) -> str:
    """A plan's groups joined by "+"; a group names its pool when another group has the same
    GPU (e.g. "2×2×8 A100 (zone-a) + 2×2×8 A100 (zone-b)")."""
    gpus = [g.gpu for g in groups]
    return " + ".join(g.label + (f" ({g.pool})" if gpus.count(g.gpu) > 1 else "") for g in groups)
