"""The plan file: what to train, where, under which constraints and objective. The same
schema is the spec of the ``TrainingPlan`` custom resource (which adds ``launch`` and
``template``, and takes pools from ``GPUPool`` resources)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from shardmeter.errors import SpecError
from shardmeter.spec.base import SpecModel
from shardmeter.spec.hardware import PoolSpec
from shardmeter.spec.loading import read_document, validate
from shardmeter.spec.model import ModelRef
from shardmeter.spec.training import StrategySpec, TrainingSpec


class ObjectiveKind(StrEnum):
    MIN_TIME = "min-time"
    """Fastest plan."""
    MIN_COST = "min-cost"
    """Cheapest plan."""
    THROUGHPUT_FRACTION = "throughput-fraction"
    """Cheapest plan with at least ``throughputFraction`` × the best throughput (paper §V)."""
    COST_BUDGET = "cost-budget"
    """Fastest plan costing at most ``costBudgetUsd``."""
    TIME_BUDGET = "time-budget"
    """Cheapest plan finishing within ``timeBudgetHours``."""


class ObjectiveSpec(SpecModel):
    kind: ObjectiveKind = ObjectiveKind.THROUGHPUT_FRACTION
    throughput_fraction: float = Field(default=0.99, gt=0, le=1)
    """For throughput-fraction: the share of the best throughput to keep."""
    cost_budget_usd: float | None = Field(default=None, gt=0)
    time_budget_hours: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _budget_given(self) -> ObjectiveSpec:
        if self.kind is ObjectiveKind.COST_BUDGET and self.cost_budget_usd is None:
            raise ValueError("kind cost-budget needs costBudgetUsd")
        if self.kind is ObjectiveKind.TIME_BUDGET and self.time_budget_hours is None:
            raise ValueError("kind time-budget needs timeBudgetHours")
        return self


class ConstraintsSpec(SpecModel):
    """Limits on the deployment. Islands never share nodes."""

    max_islands: int = Field(default=10, ge=1, le=64)
    """Most islands in a plan (the paper uses ≤ 10 for training stability)."""
    max_gpus: int | None = Field(default=None, ge=1)
    """Most GPUs in a plan."""
    max_gpus_per_island: int | None = Field(default=None, ge=1)
    min_gpus_per_island: int = Field(default=1, ge=1)
    allowed_pools: list[str] | None = Field(default=None, max_length=64)
    """Pools the plan may use (default: all)."""
    global_batch_tolerance: float = Field(default=0.05, ge=0, le=1)
    """The islands' local batches must sum to [B, B·(1 + tolerance)] tokens."""

    @model_validator(mode="after")
    def _island_bounds(self) -> ConstraintsSpec:
        if (
            self.max_gpus_per_island is not None
            and self.max_gpus_per_island < self.min_gpus_per_island
        ):
            raise ValueError("maxGpusPerIsland must be ≥ minGpusPerIsland")
        return self


class PlanPool(PoolSpec):
    """A pool in a plan file, optionally with measured coefficients."""

    coefficients: str | None = Field(default=None, max_length=1024)
    """Path to a coefficients JSON (relative to the plan file); default: datasheet priors."""
    max_nodes: int | None = Field(default=None, ge=0)
    """Use at most this many of the pool's nodes (default: all)."""


class PlanSpec(SpecModel):
    """A planning request."""

    model: ModelRef
    """Model preset name, ``{preset: NAME, <overrides>}`` or a full TransformerSpec."""
    training: TrainingSpec
    strategy: StrategySpec = Field(default_factory=StrategySpec)
    pools: list[PlanPool] = Field(min_length=1, max_length=64)
    constraints: ConstraintsSpec = Field(default_factory=ConstraintsSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)

    @model_validator(mode="after")
    def _references(self) -> PlanSpec:
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pool names must be unique; repeated: {', '.join(dupes)}")
        for name in self.constraints.allowed_pools or []:
            if name not in names:
                raise ValueError(
                    f"constraints.allowedPools names unknown pool {name!r}; pools are {', '.join(names)}"
                )
        return self

    def usable_pools(self) -> list[PlanPool]:
        allowed = self.constraints.allowed_pools
        return [p for p in self.pools if allowed is None or p.name in allowed]


def load_plan(path: str | Path) -> tuple[PlanSpec, Path]:
    """Read a plan file; returns the spec and the directory relative paths resolve against."""
    raw: Any = read_document(path)
    if not isinstance(raw, dict):
        raise SpecError(str(path), "must be a mapping with model, training, pools, …")
    for key in ("apiVersion", "kind", "metadata"):  # a TrainingPlan manifest is accepted too
        raw.pop(key, None)
    if "spec" in raw and isinstance(raw["spec"], dict):
        raw = {k: v for k, v in raw["spec"].items() if k not in ("launch", "template")}
    return validate(PlanSpec, raw, str(path)), Path(path).resolve().parent
