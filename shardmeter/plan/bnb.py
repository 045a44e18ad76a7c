"""The search over layouts: a depth-first tree in which every node is a layout and its
children add one option from a pool later in the search order, so every layout is visited
exactly once. Expanding a node scores all its children at once (exact apportioning,
`shardmeter.plan.apportion`, from the node's prefix state) and bounds their descendants
(`shardmeter.plan.descendants`).

Goals (all exact for what they return):

* ``all`` — no pruning: every layout is scored (small instances; the full cloud of Fig. 7);
* ``frontier`` — prunes descendants whose bound a frontier point strictly dominates: the
  exact Pareto frontier;
* ``time`` / ``cost`` / ``energy`` / ``co2`` — minimise that figure under optional time and
  cost caps, pruning against the incumbent: the objective's exact optimum.

Everything compared is a *ranked* figure (`Evaluation.rank_time_s` …): with quality-adjusted
objectives a layout's figures × its equivalent-token factor, bounded below for descendants
by the least factor any layout with more islands can have (`QualityTable.least_factor`).

A deadline stops the search early; the lower bound over every subtree not yet explored then
gives the proven gap of the best plan found.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from shardmeter.plan.apportion import (
    empty_weighted,
    equal_extend,
    group_row,
    minmax_convolve,
    weighted_last,
)
from shardmeter.plan.bounds import SuffixTables
from shardmeter.plan.descendants import BOUNDS, COST, TIME, DescendantBounds, Node
from shardmeter.plan.evaluate import Evaluation, Evaluator
from shardmeter.plan.frontier import RELATIVE_TIE, merge_frontier, pareto_frontier
from shardmeter.plan.options import max_islands

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
CHILD_CHUNK = 512
REPLAY_CHUNK = 1 << 16


@dataclass
class Goal:
    minimise: str
    """``all``, ``frontier``, ``time``, ``cost``, ``energy`` or ``co2``."""
    time_cap_s: float = math.inf
    cost_cap_usd: float = math.inf


OPTIMISED = ("time", "cost", "energy", "co2")
"""The goals that minimise one figure against an incumbent."""


@dataclass
class Progress:
    """Where a search stands (passed to the progress callback)."""

    phase: str
    fraction: float
    """Share of the search tree finished (pruned subtrees count as finished)."""
    scored: int
    elapsed_s: float
    best: float
    """The incumbent (seconds or dollars; inf before the first)."""
    bound: float
    """A proven lower bound on the goal (0 before any)."""


ProgressCallback = Callable[[Progress], None]


@dataclass
class Frame:
    node: Node
    options: IntArray
    lb: FloatArray
    """(children × 4): lower bounds on (time, cost, energy, CO₂e) of each child's
    descendants (`bound_columns`)."""
    weight: float
    """Share of the whole tree under each child."""
    index: int = 0


@dataclass(frozen=True)
class Enumeration:
    """Every layout of a search space that meets the batch, with its inner step, in the order
    the ``all`` pass scores them, and that pass's counts. It depends on the options' pools,
    islands, GPUs and step tables, the batch grid and the caps only (`space_digest`) — not on
    prices, total tokens or the objective — so another request over the same space scores
    these rows instead of walking the tree (`TreeSearch.replay`)."""

    choice: IntArray
    step_s: FloatArray
    scored: int
    expanded: int

    @property
    def weight(self) -> int:
        return int(self.choice.size + self.step_s.size)


def space_digest(tree: TreeSearch) -> str:
    """Identifies everything the ``all`` pass's enumeration depends on (`Enumeration`)."""
    ev = tree.evaluator
    t = ev.table
    h = hashlib.sha256()
    head = (ev.n_pools, ev.grid.lo, ev.grid.hi, ev.equal, tree.kmax, tree.gmax, t.steps.shape)
    h.update(repr(head).encode())
    for a in (t.pool, t.islands, t.gpus, t.row, t.min_cell, t.steps):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@dataclass
class PassStats:
    goal: Goal
    completed: bool
    best: float
    bound: float
    expanded: int = 0


@dataclass
class TreeSearch:
    evaluator: Evaluator
    progress: ProgressCallback | None = None
    deadline: float = math.inf
    """time.monotonic() after which the search stops."""
    keep_all: bool = True
    """Keep every feasible layout scored (for the plots); else only the frontier."""
    parts: list[Evaluation] = field(default_factory=list)
    frontier: Evaluation | None = None
    scored: int = 0
    passes: list[PassStats] = field(default_factory=list)
    recording: list[tuple[IntArray, FloatArray]] | None = None
    """When a list: every layout that meets the batch, as scored (choice rows, inner step),
    in the order scored (`Enumeration`)."""

    def __post_init__(self) -> None:
        ev = self.evaluator
        t = ev.table
        spec = ev.spec
        self.n_pools = ev.n_pools
        self.kmax = max_islands(spec)
        self.gmax = spec.constraints.max_gpus or (1 << 62)
        self.order = list(range(self.n_pools))
        self.groups = [np.flatnonzero(t.pool == p) for p in self.order]
        self.tables = SuffixTables(t, self.order, self.groups, ev.grid, self.kmax, ev.equal)
        self.tables_cap = -1.0
        self.descendants = DescendantBounds(ev, self.tables, self.groups, self.kmax)
        self.position = self.descendants.position
        self.goal = Goal("all")
        self.best = self.best_second = math.inf
        self.started = time.monotonic()
        self.done_weight = 0.0
        self.expanded = 0
        self._last_report = 0.0
        self.grid_top = self.tables.max_step

    # ---- public ---------------------------------------------------------------------------
    def run(self, goal: Goal, phase: str = "") -> PassStats:
        """One pass; returns whether it finished and the proven bound."""
        self.goal = goal
        self.best = self.best_second = math.inf
        for part in self.parts:
            self._update_best(part)
        if self.frontier is not None:
            self._update_best(self.frontier)
        cap = self.evaluator.step_that_matters(goal.time_cap_s)
        if cap != self.tables_cap:
            if self.evaluator.equal:
                self.tables.rates_per_cell(cap)
            else:
                self.tables.rates_per_sum(cap)
            self.tables_cap = cap
        self.done_weight = 0.0
        self.phase = phase or goal.minimise
        if not self.evaluator.equal:
            self._weighted_grid()
        root = self._root()
        stack = [self._expand(root, 1.0)]
        completed = True
        while stack:
            if time.monotonic() > self.deadline:
                completed = False
                break
            frame = stack[-1]
            if frame.index >= len(frame.options):
                stack.pop()
                continue
            i = frame.index
            frame.index += 1
            if self._pruned(frame.lb[i : i + 1])[0]:
                self.done_weight += frame.weight
                continue
            child = self._child(frame.node, int(frame.options[i]))
            stack.append(self._expand(child, frame.weight))
            self._report(stack)
        bound = self.best if completed else min(self.best, self._open_bound(stack))
        stats = PassStats(goal, completed, self.best, bound, self.expanded)
        self.passes.append(stats)
        self._report(stack, force=True, bound=bound)
        return stats

    def enumeration(self) -> Enumeration:
        """What the ``all`` pass just run enumerated (``recording`` must have been set)."""
        assert self.recording is not None and len(self.passes) == 1
        choice = (
            np.concatenate([c for c, _ in self.recording])
            if self.recording
            else np.zeros((0, self.n_pools), dtype=np.int64)
        )
        step = np.concatenate([s for _, s in self.recording]) if self.recording else np.zeros(0)
        choice.flags.writeable = False
        step.flags.writeable = False
        return Enumeration(choice, step, self.scored, self.passes[-1].expanded)

    def replay(self, e: Enumeration, phase: str = "") -> PassStats:
        """The ``all`` pass over a space an earlier pass enumerated (`Enumeration`): the
        layouts and their inner steps as that pass found them, scored for this request.
        Scoring is row by row (`Evaluator.score`), so it is the same in one call as in the
        pass's many."""
        self.goal = Goal("all")
        self.phase = phase or "all"
        self.best = self.best_second = math.inf
        for a in range(0, len(e.step_s), REPLAY_CHUNK):
            self._record(
                self.evaluator.score(e.choice[a : a + REPLAY_CHUNK], e.step_s[a : a + REPLAY_CHUNK])
            )
        self.scored += e.scored
        self.expanded += e.expanded
        self.done_weight = 1.0
        stats = PassStats(self.goal, True, self.best, self.best, self.expanded)
        self.passes.append(stats)
        self._report([], force=True, bound=self.best)
        return stats

    def _weighted_grid(self) -> None:
        """Fit the bound grid to the pass: up to the inner step a plan may have to matter
        (the time cap, or the incumbent's when minimising time — single-pool layouts are
        scored first for one)."""
        top = self.tables.max_step
        if self.goal.minimise == "time":
            if not math.isfinite(self.best):
                root = self._root()
                for j in range(self.n_pools):
                    opts = self.groups[j]
                    for a in range(0, len(opts), CHILD_CHUNK):
                        self._score_only(root, opts[a : a + CHILD_CHUNK])
            if math.isfinite(self.best):
                top = self.evaluator.step_that_matters(self.best)
        if math.isfinite(self.tables.cap_s):
            top = min(top, self.tables.cap_s)
        if self.goal.minimise in OPTIMISED and top != self.grid_top:
            self.tables.set_grid(top)
            self.grid_top = top
        elif self.goal.minimise not in OPTIMISED and self.grid_top != self.tables.max_step:
            self.tables.set_grid(self.tables.max_step)
            self.grid_top = self.tables.max_step

    def evaluated(self) -> Evaluation:
        return Evaluation.concat(self.parts, self.n_pools)

    # ---- nodes ------------------------------------------------------------------------------
    def _root(self) -> Node:
        hi = self.evaluator.grid.hi
        state = np.zeros(hi + 1) if self.evaluator.equal else empty_weighted(hi)
        node = Node(-1, np.full(self.n_pools, -1, dtype=np.int64), 0, 0, 0.0, 0.0, state)
        if not self.evaluator.equal:
            node.maxsum = np.zeros(len(self.tables.theta), dtype=np.int64)
        return node

    def _child(self, node: Node, o: int) -> Node:
        t = self.evaluator.table
        row = t.steps[t.row[o]]
        k = int(t.islands[o])
        choice = node.choice.copy()
        choice[t.pool[o]] = o
        least = k * int(t.min_cell[t.row[o]])
        spend = node.spend + least * float(self.tables.efficiency[o])
        best = min(node.efficiency, float(self.tables.efficiency[o]))
        if self.evaluator.equal:
            state = np.maximum(node.state, row)
            child = Node(
                int(self.position[o]),
                choice,
                node.islands + k,
                node.gpus + int(t.gpus[o]),
                node.rate + float(t.usd_per_hour[o]),
                max(node.outer_s, float(t.outer_step_least_s[o])),
                state,
                min_cells=node.min_cells + least,
                spend=spend,
                efficiency=best,
            )
            return self._with_rates(child, node, o)
        hi = self.evaluator.grid.hi
        d = minmax_convolve(node.state, group_row(row, k, hi))
        child = Node(
            int(self.position[o]),
            choice,
            node.islands + k,
            node.gpus + int(t.gpus[o]),
            node.rate + float(t.usd_per_hour[o]),
            max(node.outer_s, float(t.outer_step_least_s[o])),
            d,
            max(node.floor, float(self.tables.row_min_step[t.row[o]])),
            node.min_cells + least,
            spend,
            best,
        )
        child.maxsum = self._maxsum(d)
        return self._with_rates(child, node, o)

    def _with_rates(self, child: Node, node: Node, o: int) -> Node:
        """The child's power and CO₂ rate: its parent's plus option ``o``'s."""
        t = self.evaluator.table
        child.watts = node.watts + float(t.facility_watts[o])
        child.co2_rate = node.co2_rate + float(t.co2_kg_per_hour[o])
        return child

    def _maxsum(self, d: FloatArray) -> IntArray:
        cells = np.flatnonzero(np.isfinite(d))
        if not len(cells):
            return np.zeros(len(self.tables.theta), dtype=np.int64)
        order = np.argsort(d[cells], kind="stable")
        best = np.maximum.accumulate(cells[order])
        pos = np.searchsorted(d[cells][order], self.tables.theta, side="right") - 1
        return np.asarray(np.where(pos >= 0, best[np.maximum(pos, 0)], 0), dtype=np.int64)

    # ---- expansion --------------------------------------------------------------------------
    def _expand(self, node: Node, weight: float) -> Frame:
        """Score every child of ``node`` and bound their descendants."""
        self.expanded += 1
        t = self.evaluator.table
        if node.pos + 1 < self.n_pools:
            opts = np.concatenate(self.groups[node.pos + 1 :])
        else:
            opts = np.zeros(0, dtype=np.int64)
        opts = opts[
            (t.islands[opts] <= self.kmax - node.islands) & (t.gpus[opts] <= self.gmax - node.gpus)
        ]
        lb = np.zeros((len(opts), len(BOUNDS)))
        for a in range(0, len(opts), CHILD_CHUNK):
            sl = slice(a, a + CHILD_CHUNK)
            lb[sl] = self._score_children(node, opts[sl])
        # only children that can still grow (a later pool, an island to spare) are expanded
        grows = (self.position[opts] + 1 < self.n_pools) & (
            node.islands + t.islands[opts] < self.kmax
        )
        alive = grows & np.isfinite(lb[:, TIME]) & ~self._pruned(lb)
        share = weight / max(len(opts), 1)
        self.done_weight += share * float((~alive).sum()) + (weight if not len(opts) else 0.0)
        opts, lb = opts[alive], lb[alive]
        key = (
            lb[:, BOUNDS.index(self.goal.minimise)] if self.goal.minimise in BOUNDS else lb[:, TIME]
        )
        order = np.argsort(key, kind="stable")
        return Frame(node, opts[order], lb[order], share)

    def _score_children(self, node: Node, opts: IntArray) -> FloatArray:
        """Score the children and bound their descendants: (children × 4) ranked lower
        bounds on (time, cost, energy, CO₂e)."""
        self._score_only(node, opts)
        if self.goal.minimise == "all":
            return np.zeros((len(opts), len(BOUNDS)))  # nothing is pruned: no bound
        return self.descendants.bounds(node, opts, self._ranked_that_matters())

    def _score_only(self, node: Node, opts: IntArray) -> None:
        """Score the layouts ``node`` + each option (exact apportioning) and record them."""
        ev = self.evaluator
        t = ev.table
        g = ev.grid
        n = len(opts)
        rows = t.row[opts]
        ks = t.islands[opts]
        islands = node.islands + ks
        if ev.equal:
            step_s = equal_extend(node.state, t.steps, rows, islands, g.lo, g.hi)
        elif node.pos < 0:
            step_s = equal_extend(np.zeros(g.hi + 1), t.steps, rows, ks, g.lo, g.hi)
        else:
            step_s = weighted_last(node.state, t.steps, rows, ks, g.lo, g.hi)
        self.scored += n
        meets = np.flatnonzero(np.isfinite(step_s))  # the others cannot meet the batch
        if len(meets):
            choice = np.repeat(node.choice[None, :], len(meets), axis=0)
            choice[np.arange(len(meets)), t.pool[opts[meets]]] = opts[meets]
            if self.recording is not None:
                self.recording.append((choice, step_s[meets]))
            self._record(ev.score(choice, step_s[meets]))

    def _record(self, ev: Evaluation) -> None:
        ok = ev.subset(ev.feasible) if not ev.feasible.all() else ev
        if not len(ok):
            return
        if self.keep_all:
            self.parts.append(ok)
        if self.goal.minimise == "frontier" or not self.keep_all:
            # the running frontier prunes (frontier goal) or is all that is kept
            self.frontier = merge_frontier(self.frontier, pareto_frontier(ok), self.n_pools)
        self._update_best(ok)

    def _update_best(self, ev: Evaluation) -> None:
        g = self.goal
        if g.minimise not in OPTIMISED or not len(ev):
            return
        time_s, cost = ev.rank_time_s, ev.rank_cost_usd
        ok = (time_s <= g.time_cap_s * (1 + RELATIVE_TIE)) & (
            cost <= g.cost_cap_usd * (1 + RELATIVE_TIE)
        )
        figures = (time_s, cost, ev.rank_energy_kwh, ev.rank_co2_kg)
        first = figures[BOUNDS.index(g.minimise)]
        second = cost if g.minimise == "time" else time_s
        if ok.any():
            i = np.flatnonzero(ok)
            j = i[np.lexsort((second[i], first[i]))[0]]
            self.best, self.best_second = min(
                (self.best, self.best_second), (float(first[j]), float(second[j]))
            )

    def _ranked_that_matters(self) -> float:
        """The ranked time a descendant must not exceed to matter: the time cap, and when
        minimising time the incumbent's (`Evaluator.step_that_matters` turns it into the
        inner step a subtree must undercut)."""
        if self.goal.minimise == "time" and math.isfinite(self.best):
            return min(self.goal.time_cap_s, self.best)
        return self.goal.time_cap_s

    def _pruned(self, lb: FloatArray) -> BoolArray:
        """Which children's descendants cannot matter, from their (… × 4) lower bounds."""
        g = self.goal
        time_lb, cost_lb = lb[:, TIME], lb[:, COST]
        if g.minimise == "all":
            return np.zeros(len(lb), dtype=bool)
        if g.minimise == "frontier":
            f = self.frontier
            if f is None or len(f) == 0:
                return np.zeros(len(lb), dtype=bool)
            ft, fc = f.rank_time_s[None, :], f.rank_cost_usd[None, :]
            tl, cl = time_lb[:, None], cost_lb[:, None]
            dom = (ft <= tl) & (fc <= cl) & ((ft < tl) | (fc < cl))
            return np.asarray(dom.any(axis=1) | ~np.isfinite(time_lb))
        slack = 1 + RELATIVE_TIE
        out = (time_lb > g.time_cap_s * slack) | (cost_lb > g.cost_cap_usd * slack)
        # lexicographic incumbent: strictly worse on the goal (beyond float noise), or no
        # better on it and worse on the tie-break (time ties are bit-exact: same formula)
        first = lb[:, BOUNDS.index(g.minimise)]
        second = cost_lb if g.minimise == "time" else time_lb
        shrink = 1 - RELATIVE_TIE
        worse = (first * shrink > self.best) | (
            (first >= self.best) & (second * shrink > self.best_second)
        )
        return np.asarray(out | worse | ~np.isfinite(time_lb))

    def _open_bound(self, stack: list[Frame]) -> float:
        g = self.goal
        column = BOUNDS.index(g.minimise) if g.minimise in BOUNDS else TIME
        lows = []
        for f in stack:
            rest = f.lb[f.index :, column]
            if len(rest):
                lows.append(float(rest.min()))
        return min(lows, default=math.inf)

    def _report(self, stack: list[Frame], force: bool = False, bound: float | None = None) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if not force and now - self._last_report < 0.25:
            return
        self._last_report = now
        if bound is None:
            bound = min(self.best, self._open_bound(stack)) if stack else self.best
        self.progress(
            Progress(
                self.phase,
                min(self.done_weight, 1.0),
                self.scored,
                now - self.started,
                self.best,
                bound if math.isfinite(bound) else 0.0,
            )
        )
