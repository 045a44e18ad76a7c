"""Scoring candidate plans (layouts), many at once, in numpy.

A layout is one option or none per pool (a row of a *choice* matrix of option indices, −1 for
none). Given its inner step T (the exact apportioning, `shardmeter.plan.apportion`), a layout
is scored as:

* **outer level** — for DiLoCo strategies the outer all_reduce and Streaming DiLoCo settings
  in closed form (`shardmeter.plan.overhead`), adding ``(blocking + outer step) / H`` per
  inner step;
* **figures** — tokens/s = the requested global batch B per effective step (any overshoot
  the islands' granularity forces is reported, not rewarded), wall-clock for the total tokens,
  MFU of the useful tokens; cost = billed GPUs × price × hours + WAN egress; energy = the
  options' facility power × hours; CO₂e = their CO₂ rate × hours (`shardmeter.plan.options`);
* **quality** — DiLoCo's loss penalty against data-parallel and its equivalent-token factor
  at the layout's islands M, syncEvery H and fragmentSyncDelay τ with the strategy's outer
  precision (`shardmeter.cost.quality_law`), from a table over (M, H) built once per request
  (other τ memoised);
* **egress** — for layouts spanning sites, the outer all_reduce's bytes leaving each site
  over the run (`shardmeter.plan.footprint`) × the site's price;
* **ranked figures** — what the objective compares: time, cost, energy and CO₂e × the
  factor when ``objective.qualityAdjusted`` (what reaching data-parallel's loss takes), else
  as they are. A CO₂ budget marks the layouts above it infeasible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from shardmeter.plan.apportion import apportion, equal_best
from shardmeter.plan.configs import BatchGrid
from shardmeter.plan.footprint import EgressModel, QualityTable
from shardmeter.plan.options import UNUSED_RANK, OptionTable, PoolContext, max_islands
from shardmeter.plan.overhead import OuterModel
from shardmeter.plan.schema import PlanSpec, Runtime

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

RELATIVE_TIE = 1e-12
"""Throughput and budget comparisons allow this relative slack (floating-point noise)."""

# status codes
OK, BATCH_UNREACHABLE, NO_WAN_UPLINK, EMPTY, NO_SETTINGS, OVER_CO2_BUDGET = 0, 1, 2, 3, 4, 5


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
    """Wall-clock for ``totalTokens``."""
    cost_usd: FloatArray
    """GPU cost plus WAN egress for ``totalTokens``."""
    mfu: FloatArray
    sync_every: IntArray
    fragments: IntArray
    fragment_sync_delay: IntArray
    blocking_s: FloatArray
    """Outer-step blocking per outer step (closed form)."""
    zero_blocking: BoolArray
    billed_gpus: IntArray
    energy_kwh: FloatArray
    """Facility energy for ``totalTokens``."""
    co2_kg: FloatArray
    egress_gb: FloatArray
    """GB leaving the sites over their WAN uplinks for ``totalTokens`` (0 at one site)."""
    egress_usd: FloatArray
    loss_penalty: FloatArray
    """DiLoCo's relative eval-loss penalty against data-parallel (0 for FSDP)."""
    token_factor: FloatArray
    """The equivalent-token factor (1 for FSDP)."""
    rank_factor: FloatArray
    """What the objective multiplies every figure by: ``token_factor`` when quality-adjusted,
    else 1."""

    @property
    def feasible(self) -> BoolArray:
        return np.asarray(self.status == OK)

    @property
    def rank_time_s(self) -> FloatArray:
        """The time the objective compares (× ``rank_factor``)."""
        return np.asarray(self.time_s * self.rank_factor)

    @property
    def rank_cost_usd(self) -> FloatArray:
        return np.asarray(self.cost_usd * self.rank_factor)

    @property
    def rank_energy_kwh(self) -> FloatArray:
        return np.asarray(self.energy_kwh * self.rank_factor)

    @property
    def rank_co2_kg(self) -> FloatArray:
        return np.asarray(self.co2_kg * self.rank_factor)

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
        matrices = ("choice", "tie")
        ints = (
            "status",
            "islands",
            "gpus",
            "nodes",
            "sync_every",
            "fragments",
            "fragment_sync_delay",
            "billed_gpus",
        )
        values: dict[str, np.ndarray] = {}
        for f in fields(Evaluation):
            if f.name in matrices:
                values[f.name] = np.zeros((0, pools), dtype=np.int64)
            elif f.name in ints:
                values[f.name] = np.zeros(0, dtype=np.int64)
            elif f.name == "zero_blocking":
                values[f.name] = np.zeros(0, dtype=bool)
            else:
                values[f.name] = np.zeros(0)
        return Evaluation(**values)

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
        rails = table.ranks / self.outer.gpus_per_node[table.pool]
        self.min_rails = float(rails.min(initial=1.0))
        """The fewest node networks any island fills (the worst outer all_reduce)."""
        floors = self.outer.delay_floors(
            max_islands(spec), self.min_rails, float(rails.max(initial=1.0))
        )
        self.quality = QualityTable(spec, self.outer.hs, max_islands(spec), floors)
        self.egress = EgressModel(spec, [c.pool for c in contexts])
        obj = spec.objective
        self.quality_adjusted = obj.quality_adjusted
        self.co2_budget_kg = obj.co2_budget_kg if obj.co2_budget_kg is not None else np.inf
        self.least_co2_over_budget_kg = np.inf
        """The least ranked CO₂e of a layout the budget excluded (for the message when no
        plan is within it)."""

    def step_that_matters(self, ranked_time_s: float, islands_at_least: int = 2) -> float:
        """The longest inner step a layout of at least ``islands_at_least`` islands (two: any
        the search bounds) can have with a ranked time of at most ``ranked_time_s``: time =
        steps × (T + a non-negative outer overhead) × the ranked factor, which is at least
        `QualityTable.least_factor` at T (1 when not quality-adjusted)."""
        if not math.isfinite(ranked_time_s):
            return math.inf
        per_step = ranked_time_s / self.steps
        if not self.quality_adjusted:
            return per_step
        return self.quality.step_that_matters(per_step, islands_at_least)

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
        # per fragment count F (column F − 1): the slowest used pool's outer optimizer steps
        outer_s = np.zeros((len(choice), t.outer_step_s.shape[1]))
        for p in range(choice.shape[1]):
            outer_s = np.maximum(
                outer_s, np.where(used[:, p, None], t.outer_step_s[opt[:, p]], 0.0)
            )
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
        penalty, factor = self.quality.lookup(islands, o.sync_every, o.fragment_sync_delay)
        rank = factor if self.quality_adjusted else np.ones(len(factor))
        hours = np.where(status == OK, time_s, 0.0) / 3600.0
        watts = np.where(used, t.facility_watts[opt], 0.0).sum(axis=1)
        co2_rate = np.where(used, t.co2_kg_per_hour[opt], 0.0).sum(axis=1)
        energy = watts * hours / 1000.0
        co2 = co2_rate * hours
        egress_gb, egress_usd = self.egress.evaluate(used, islands, o.sync_every, self.steps)
        over = (status == OK) & (co2 * rank > self.co2_budget_kg * (1 + RELATIVE_TIE))
        if over.any():
            least = float((co2 * rank)[over].min())
            self.least_co2_over_budget_kg = min(self.least_co2_over_budget_kg, least)
            status = np.where(over, OVER_CO2_BUDGET, status)
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
            cost_usd=np.where(ok, rate * hours + egress_usd, np.inf),
            mfu=mfu,
            sync_every=o.sync_every,
            fragments=o.fragments,
            fragment_sync_delay=o.fragment_sync_delay,
            blocking_s=o.blocking_s,
            zero_blocking=o.zero_blocking,
            billed_gpus=np.where(used, t.billed_gpus[opt], 0).sum(axis=1),
            energy_kwh=np.where(ok, energy, np.inf),
            co2_kg=np.where(ok, co2, np.inf),
            egress_gb=egress_gb,
            egress_usd=egress_usd,
            loss_penalty=penalty,
            token_factor=factor,
            rank_factor=rank,
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
