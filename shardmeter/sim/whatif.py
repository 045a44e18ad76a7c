"""The what-if file of ``shardmeter simulate --durations``: explicit task durations instead of
the cost model, validated like every spec (strict numbers, finite, bounded).

.. code-block:: yaml

    units:                       # forward order; `repeat` expands identical units
      - {name: embedding, forward_s: 0.002, backward_s: 0.004, all_gather_s: 0.01,
         reduce_scatter_s: 0.012, reshard_after_forward: false}
      - {name: block, repeat: 32, forward_s: 0.03, backward_s: 0.06, all_gather_s: 0.02,
         reduce_scatter_s: 0.025}
    optimizer_s: 0.05
    overlap_slowdown: 0.61       # compute seconds lost per second of overlapped comm
    accumulation: 4              # default: --accumulation
    diloco:                      # optional: the outer level over identical or listed islands
      sync_every: 100
      fragments: 4
      fragment_sync_delay: 2
      islands: 2                 # or [{name, step_s, outer_step_s}, …]
      all_reduce_s: 1.5          # per fragment: one number or one per fragment

Keys are snake_case, as above, or camelCase (``forwardS``, ``syncEvery``,
``fragmentSyncDelay``), as in plan files; ``examples/what-if.yaml`` is a complete file.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator
from pydantic.alias_generators import to_camel

from shardmeter.sim.diloco import IslandSteps
from shardmeter.sim.fsdp import MAX_ACCUMULATION, MAX_UNITS, FSDPDurations
from shardmeter.spec.base import SpecModel
from shardmeter.spec.training import (
    CAMEL_CASE,
    MAX_FRAGMENTS,
    MAX_ISLANDS,
    MAX_SYNC_EVERY,
    StreamingSettings,
    torchft_violation,
)

MAX_TASK_S = 1e9
"""Longest duration one task may have (about 32 years): sums of them stay finite."""


class _WhatIf(SpecModel):
    """The what-if file's keys: snake_case (the simulator's names, used in errors about a
    missing key) or camelCase (as in plan files), alike."""

    model_config = SpecModel.model_config | {"alias_generator": None, "serialize_by_alias": False}

    @model_validator(mode="before")
    @classmethod
    def _camel_case_keys(cls, data: Any) -> Any:
        """camelCase keys as their snake_case fields (``forwardS`` → ``forward_s``)."""
        if not isinstance(data, dict):
            return data
        camel = {to_camel(name): name for name in cls.model_fields if to_camel(name) != name}
        out: dict[Any, Any] = {}
        for key, value in data.items():
            name = camel.get(key, key) if isinstance(key, str) else key
            if name in out:
                raise ValueError(f"{key} and {name} are the same key: give one of them")
            out[name] = value
        return out


TaskSeconds = Annotated[float, Field(ge=0, le=MAX_TASK_S)]
"""A task's duration in seconds (0 to `MAX_TASK_S`)."""


class UnitDurations(_WhatIf):
    """One FSDP unit's tasks for one micro-step."""

    name: str = Field(default="", max_length=63)
    """Display name (default ``unit<i>``); repeated units get an index appended."""
    repeat: int = Field(default=1, ge=1, le=MAX_UNITS)
    """Identical units in a row (e.g. the 32 blocks of a model)."""
    forward_s: TaskSeconds = 0.0
    backward_s: TaskSeconds = 0.0
    all_gather_s: TaskSeconds = 0.0
    reduce_scatter_s: TaskSeconds = 0.0
    reshard_after_forward: bool = True
    """False: the unit keeps its parameters from forward to backward (FSDP2's root unit)."""


class IslandDurations(_WhatIf):
    """One island at the DiLoCo level."""

    name: str = Field(default="", max_length=63)
    step_s: float | None = Field(default=None, gt=0, le=MAX_TASK_S)
    """Inner step; default: the simulated FSDP step."""
    outer_step_s: TaskSeconds = 0.0
    """Outer optimizer step of each fragment on this island."""


class DiLoCoDurations(_WhatIf):
    """The outer level: torchft's knobs, the islands and the all_reduce durations."""

    sync_every: int = Field(ge=1, le=MAX_SYNC_EVERY)
    """Inner steps per outer step H."""
    fragments: int = Field(default=1, ge=1, le=MAX_FRAGMENTS)
    """Streaming DiLoCo fragments F (H must be a multiple)."""
    fragment_sync_delay: int = Field(default=0, ge=0, le=MAX_SYNC_EVERY)
    """τ (must be < H / F)."""
    islands: (
        Annotated[int, Field(ge=1, le=MAX_ISLANDS)]
        | Annotated[list[IslandDurations], Field(min_length=1, max_length=MAX_ISLANDS)]
    ) = 2
    """A number of identical islands (1–64), or each island."""
    all_reduce_s: TaskSeconds | Annotated[list[TaskSeconds], Field(max_length=MAX_FRAGMENTS)] = 0.0
    """Each fragment's all_reduce: one number for all, or one per fragment."""

    @model_validator(mode="after")
    def _consistent(self) -> DiLoCoDurations:
        f = self.fragments
        snake = {name: name for name in CAMEL_CASE}
        violation = torchft_violation(self.sync_every, f, self.fragment_sync_delay, names=snake)
        if violation is not None:
            raise ValueError(violation[1])
        if isinstance(self.all_reduce_s, list) and len(self.all_reduce_s) != f:
            raise ValueError(
                f"all_reduce_s lists {len(self.all_reduce_s)} durations for {f} fragment(s)"
            )
        return self

    @property
    def settings(self) -> StreamingSettings:
        return StreamingSettings(self.sync_every, self.fragments, self.fragment_sync_delay)

    def fragment_all_reduce_s(self) -> list[float]:
        if isinstance(self.all_reduce_s, list):
            return list(self.all_reduce_s)
        return [self.all_reduce_s] * self.fragments

    def island_steps(self, step_s: float) -> list[IslandSteps]:
        """The islands, each inner step defaulting to ``step_s`` (the simulated FSDP step)."""
        f = self.fragments
        if isinstance(self.islands, int):
            return [IslandSteps(f"island{i}", step_s, (0.0,) * f) for i in range(self.islands)]
        return [
            IslandSteps(
                x.name or f"island{i}",
                x.step_s if x.step_s is not None else step_s,
                (x.outer_step_s,) * f,
            )
            for i, x in enumerate(self.islands)
        ]


class WhatIfDocument(_WhatIf):
    """A ``--durations`` file."""

    units: list[UnitDurations] = Field(min_length=1, max_length=MAX_UNITS)
    """FSDP units in forward order."""
    optimizer_s: float = Field(default=0.0, ge=0, le=MAX_TASK_S)
    """The optimizer step after the last reduce_scatter."""
    overlap_slowdown: float = Field(default=0.0, ge=0, le=1)
    """Compute seconds lost per second of compute/comm overlap."""
    accumulation: int | None = Field(default=None, ge=1, le=MAX_ACCUMULATION)
    """Micro-steps per step (default: ``--accumulation``)."""
    diloco: DiLoCoDurations | None = None
    """The DiLoCo level, if any."""

    @model_validator(mode="after")
    def _bounded(self) -> WhatIfDocument:
        total = sum(u.repeat for u in self.units)
        if total > MAX_UNITS:
            raise ValueError(
                f"units expand to {total:,} units (repeat included); at most {MAX_UNITS:,}"
            )
        busy = self.optimizer_s + sum(
            u.forward_s + u.backward_s + u.all_gather_s + u.reduce_scatter_s for u in self.units
        )
        if busy <= 0:
            raise ValueError("every task lasts 0 s: give at least one a positive duration")
        return self

    def fsdp_durations(self) -> FSDPDurations:
        names: list[str] = []
        cols: dict[str, list[float]] = {
            k: [] for k in ("forward_s", "backward_s", "all_gather_s", "reduce_scatter_s")
        }
        reshard: list[bool] = []
        for idx, unit in enumerate(self.units):
            base = unit.name or f"unit{idx}"
            for r in range(unit.repeat):
                names.append(base if unit.repeat == 1 else f"{base}{r}")
                reshard.append(unit.reshard_after_forward)
                for key, values in cols.items():
                    values.append(getattr(unit, key))
        return FSDPDurations(
            tuple(names),
            tuple(cols["forward_s"]),
            tuple(cols["backward_s"]),
            tuple(cols["all_gather_s"]),
            tuple(cols["reduce_scatter_s"]),
            self.optimizer_s,
            tuple(reshard) if not all(reshard) else (),
            self.overlap_slowdown,
        )
