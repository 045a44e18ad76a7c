"""Scoring candidate plans (layouts), many at once, in numpy.

A layout is one option or none per pool (a row of a *choice* matrix of option indices, −1 for
none). Given its inner step T (the exact apportioning, `shardmeter.plan.apportion`), a layout
is scored as:

* **outer level** — for DiLoCo strategies the outer all_reduce and Streaming DiLoCo settings
  in closed form (`shardmeter.plan.overhead`), adding ``(blocking + outer step) / H`` per
  inner step;
* **figures** — tokens/s = the requested global batch B per effective step (any overshoot
  the islands' granularity forces is reported, not rewarded), wall-clock for the total tokens,
  cost = GPUs × price × hours, MFU of the useful tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from shardmeter.plan.apportion import apportion, equal_best
from shardmeter.plan.configs import BatchGrid
from shardmeter.plan.options import UNUSED_RANK, OptionTable, PoolContext
from shardmeter.plan.overhead import OuterModel
from shardmeter.plan.schema import PlanSpec, Runtime

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# status codes
OK, BATCH_UNREACHABLE, NO_WAN_UPLINK, EMPTY, NO_SETTINGS = 0, 1, 2, 3, 4


@dataclass
class Evaluation:
    """Per-layout results (arrays of equal length)."""

    choice: IntArray
    """(layouts × pools) option index into the OptionTable, −1 for none."""
    tie: IntArray
    """(layouts × pools) the canonical tie-break: per pool in order, the option's rank by
    (islands, nodes, GPUs per node), unused pools last (`OptionTable.tie_rank`)."""
    status: IntArray
    step_s: FloatArray
    """Inner step T (the slowest island), from the exact apportioning."""
    effective_step_s: FloatArray
    """T plus the outer level's overhead per inner step."""
    islands: IntArray
    gpus: IntArray
    nodes: IntArray
    usd_per_hour: FloatArray
    tokens_per_s: FloatArray
    time_s: FloatArray
    cost_usd: FloatArray
    mfu: FloatArray
    sync_every: IntArray
    fragments: IntArray
    delay: IntArray
    blocking_s: FloatArray
    """Outer-step blocking per outer step (closed form)."""
    zero_blocking: BoolArray

    @property
    def feasible(self) -> BoolArray:
        return np.asarray(self.status == OK)

    def subset(self, mask: BoolArray | IntArray) -> Evaluation:
        return Evaluation(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    @staticmethod
    def concat(parts: Sequence[Evaluation], pools: int) -> Evaluation:
        if not parts:
            return Evaluation.empty(pools)
        return Evaluation(
            **{
                f.name: np.concatenate([getattr(p, f.name) for p in parts])
                for f in fields(Evaluation)
            }
        )

    @staticmethod
    def empty(pools: int) -> Evaluation:
        e = np.zeros(0)
        i = np.zeros(0, dtype=np.int64)
        return Evaluation(
            np.zeros((0, pools), dtype=np.int64),
            np.zeros((0, pools), dtype=np.int64),
            i,
            e,
            e,
            i,
            i,
            i,
            e,
            e,
            e,
            e,
            e,
            i,
            i,
            i,
            e,
            np.zeros(0, dtype=bool),
        )

    def __len__(self) -> int:
        return len(self.status)


class Evaluator:
    """Scores layouts of one planning request (see the module docstring)."""

    def __init__(
        self,
        spec: PlanSpec,
        contexts: Sequence[PoolContext],
        table: OptionTable,
        grid: BatchGrid,
    ) -> None:
        self.spec = spec
        self.contexts = list(contexts)
        self.table = table
        self.grid = grid
        self.n_pools = len(contexts)
        self.equal = spec.runtime is Runtime.TORCHTITAN_FT
        tr = spec.training
        self.batch = tr.global_batch_sequences
        self.seq_len = tr.seq_len_tokens
        self.total_sequences = tr.total_tokens / tr.seq_len_tokens
        self.steps = self.total_sequences / self.batch
        """Inner steps for the whole run: time = steps × effective step."""
        self.flops_per_sequence = (
            spec.model.training_flops_per_token(tr.seq_len_tokens) * tr.seq_len_tokens
        )
        self.outer = OuterModel(spec, contexts)

    # ---- the inner step ---------------------------------------------------------------------
    def step_times(self, choice: IntArray) -> FloatArray:
        """Exact T of each layout (inf where the batch cannot be met)."""
        t = self.table
        used = choice >= 0
        opt = np.where(used, choice, 0)
        islands = np.where(used, t.islands[opt], 0).sum(axis=1)
        rows = t.row[opt]
        g = self.grid
        if self.equal:
            return equal_best(t.steps, rows, used, islands, g.lo, g.hi)[0]
        out = np.full(len(choice), np.inf)
        single = used.sum(axis=1) == 1
        if single.any():
            out[single] = equal_best(
                t.steps, rows[single], used[single], islands[single], g.lo, g.hi
            )[0]
        for i in np.flatnonzero(~single & used.any(axis=1)):
            ps = np.flatnonzero(used[i])
            a = apportion(
                [t.steps[rows[i, p]] for p in ps],
                [int(t.islands[choice[i, p]]) for p in ps],
                g.lo,
                g.hi,
                equal=False,
            )
            out[i] = a.step_s if a is not None else np.inf
        return out

    # ---- everything else --------------------------------------------------------------------
    def score(self, choice: IntArray, step_s: FloatArray) -> Evaluation:
        """Score layouts whose inner step T is known."""
        t = self.table
        used = choice >= 0
        opt = np.where(used, choice, 0)
        islands = np.where(used, t.islands[opt], 0).sum(axis=1)
        gpus = np.where(used, t.gpus[opt], 0).sum(axis=1)
        nodes = np.where(used, t.nodes[opt], 0).sum(axis=1)
        rate = np.where(used, t.usd_per_hour[opt], 0.0).sum(axis=1)
        rails = np.where(used, t.ranks[opt] / self.outer.gpus_per_node[None, :], np.inf).min(axis=1)
        outer_s = np.where(used, t.outer_step_s[opt], 0.0).max(axis=1)
        status = np.where(islands > 0, OK, EMPTY)
        status = np.where((status == OK) & ~np.isfinite(step_s), BATCH_UNREACHABLE, status)
        step = np.where(np.isfinite(step_s), step_s, 0.0)
        o = self.outer.evaluate(used, islands, rails, outer_s, step, status == OK)
        status = np.where((status == OK) & ~o.link_ok, NO_WAN_UPLINK, status)
        status = np.where((status == OK) & ~np.isfinite(o.overhead_s), NO_SETTINGS, status)
        eff = step + np.where(np.isfinite(o.overhead_s), o.overhead_s, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            seq_per_s = np.where(eff > 0, self.batch / eff, 0.0)
            # steps × effective step: the same formula as the search's bounds, so plans
            # that tie do so bit for bit
            time_s = np.where(eff > 0, self.steps * eff, np.inf)
            peak = np.where(used, t.peak_flops[opt], 0.0).sum(axis=1)
            mfu = np.where(peak > 0, seq_per_s * self.flops_per_sequence / peak, 0.0)
        ok = status == OK
        return Evaluation(
            choice=choice,
            tie=np.where(used, t.tie_rank[opt], UNUSED_RANK),
            status=status.astype(np.int64),
            step_s=step,
            effective_step_s=eff,
            islands=islands,
            gpus=gpus,
            nodes=nodes,
            usd_per_hour=rate,
            tokens_per_s=np.where(ok, seq_per_s * self.seq_len, 0.0),
            time_s=np.where(ok, time_s, np.inf),
            cost_usd=np.where(ok, rate * np.where(ok, time_s, 0.0) / 3600.0, np.inf),
            mfu=mfu,
            sync_every=o.sync_every,
            fragments=o.fragments,
            delay=o.delay,
            blocking_s=o.blocking_s,
            zero_blocking=o.zero_blocking,
        )

    def evaluate(self, choice: IntArray) -> Evaluation:
        return self.score(choice, self.step_times(choice))

    def apportion(self, choice_row: IntArray) -> tuple[float, dict[int, int]] | None:
        """T and the cells one island of each used pool processes, for one layout."""
        t = self.table
        ps = [p for p in range(self.n_pools) if choice_row[p] >= 0]
        a = apportion(
            [t.steps[t.row[choice_row[p]]] for p in ps],
            [int(t.islands[choice_row[p]]) for p in ps],
            self.grid.lo,
            self.grid.hi,
            equal=self.equal,
        )
        if a is None:
            return None
        return a.step_s, dict(zip(ps, a.cells, strict=True))
