"""Branch and bound over configurations: the exact solvers' first phase.

The lower-bound model of :mod:`pipeplan.solver.exact.bound_model` is a path of arcs (candidate stages) from
layer 0 to layer ``L``.  On small and medium instances it is faster to walk those paths
directly than to solve the MILP or CP-SAT model once per configuration: this module
grows paths from layer 0, one stage at a time, and prunes a partial path (a *prefix*)
as soon as a bound valid for every completion of it reaches the incumbent.  A complete
path whose configuration bound (:func:`pipeplan.solver.bounds.terms.config_lower_bound`) is below the
incumbent is simulated on its placements, exactly like a configuration the model
returns, unless its :func:`pipeplan.solver.bounds.terms.optimistic_time` (the simulator with the best
conceivable links) already reaches the cutoff.  When the walk ends, every configuration
was simulated or proved no better than the incumbent: the incumbent is optimal.

Bound of a prefix
-----------------
Each term is a term of :mod:`pipeplan.solver.bounds.terms`'s docstring evaluated with the prefix's own
arcs and, for the layers ``[h, L)`` still to cover, the least any completion can add.
Completions are counted with the devices the prefix leaves (*device-aware completion
tables*, by dynamic programming over ``(h, label, devices left)``, from the arcs whose
standalone bound is below the pass's cutoff, so they tighten as it falls): the smallest
sum of ``u'`` (``pass_cost``) and of the work share, and the smallest possible largest
``delta`` (``pivot_extra``) and standalone bound of the stages still to come.

- busy path (term 1) of every placed stage, exactly;
- pivot paths (terms 2, 2b, 2c) whose pivot is placed, with the later passes at least
  the prefix's own plus the smallest completion sum; term 2 with the largest ``delta``
  at least the completion's smallest largest ``delta``;
- work (term 4) with the smallest completion work share;
- the standalone bound of every arc (valid for every configuration holding it), placed
  or still to come;
- **the rest on the devices left**: the layers ``[h, L)`` need ``W_rest = M (a_f + a_b)
  + B (b_f + b_b)`` of work in total, done by stages whose devices' speeds sum to at
  most ``V_left``, so some later stage ``j`` is busy ``busy_j >= W_rest / V_left``; it
  cannot start before the prefix's ``F_0`` arrive (``sum head_f``), nor end before its
  ``B_{M-1}`` has run back through the prefix (``sum head_fb``).

[Note: delta bands]  Term 2 of a whole configuration is ``sum pass_cost + max delta``.
Taking the completions' least pass sum and least largest ``delta`` separately is weak:
few large stages give the least pass sum, many small ones the least largest ``delta``.
So the pass-sum table is also kept per *band* of the completions' largest ``delta``:
``banded[h, t, a, k]`` is the least pass sum of the completions whose every ``delta``
is at most ``edges[k]``.  A completion whose largest ``delta`` lies in
``(edges[k-1], edges[k]]`` adds at least ``banded[..., k]`` and leaves the largest
``delta`` above ``edges[k-1]``, so ``min over k of (prefix pass sum + banded[..., k] +
max(md, edges[k-1]))`` (the last band: every completion) bounds term 2 for every
completion.  The edges run evenly from the least largest ``delta`` of any whole
configuration to the cutoff.  On 96 layers x 32 devices a pass to 0.2248 s expanded
32 thousand prefixes in 6 s with 12 bands, against 251 thousand in 33 s without; the
bands multiply the table work, so they are used only while the tables are small
(:data:`BAND_WORK_LIMIT`).

[Note: tables past the budget]  The tables cost kept arcs x devices-left vectors each
(:data:`DEFAULT_TABLE_CELLS`).  When a build over every kept arc does not fit in the
table budget left, or exceeds :data:`FULL_TABLE_CELLS`, each table is built from the arcs no other arc *dominates* for it, and
holds the same values.  Arc ``i`` dominates arc ``j`` for a table when both cover the
same layers with the same label, ``i`` uses no more devices of any class, and its value
is smaller (ties: the lower index).  ``i`` then fits wherever ``j`` does and leaves at
least ``j``'s devices, and no table grows with more devices left (each value is the least
over the completions that fit, and more devices admit more of them), so ``j`` never gives
a least value.  The dominated arcs are found on a lattice over the devices-left vectors
per group of arcs with the same layers and label (a running minimum of the arcs' ranks
along each class), counted with the tables.  These builds keep no bands (each band would
need its own lattice).  On 96 layers x 64 devices the first build keeps 214,501 of 703,370
arcs for the pass sums and 17,674, 46,452 and 52,932 for the others: 0.42 billion entries
instead of 3.07 billion.

Passes and the anytime bound
----------------------------
A walk with a bad incumbent (a baseline's plan) would simulate thousands of poor
configurations.  So the walk runs in *passes*, each with a target ``tau`` below the
incumbent: a pass prunes at ``min(tau, incumbent)``.  When a pass ends, every
configuration was simulated or has a bound of at least ``min(tau, incumbent)``, so that
is a proved lower bound (in fact the smallest bound of anything the pass pruned, which
may be higher).  The next target lies a step above it: :data:`STEP` of the bound at
first, doubled after a fast pass and halved after a slow one; when the step would cover
half the gap to the incumbent, the target is the incumbent itself.  Configurations just
above the bound are few, and the best of them are found early.  A pass whose target
reaches the incumbent proves it optimal.  Children are tried cheapest bound first.  A
configuration's bound and optimistic time are remembered across passes, and one
simulated on every placement is not simulated again.  On timeout a pass reports the
smallest bound of the prefixes it had not finished.

The walk reaches the same layer, labels and devices left from many prefixes (16,725
expansions over 1,033 of them at 64 layers x 16 devices), so a child's columns and the
completion tables' values after it are looked up once per table build
(:meth:`_Walk.choices`); only the terms made of the prefix's own state are computed per
prefix.

Where it stops helping: on the largest benchmark instances (96 layers x 32 or 64
devices) the prefixes whose bound lies a few per cent above the proved bound number in
the hundreds of thousands; the walk raises the bound while its budgets last (gaps of
7.8 % and 15.3 % in a default solve with a 60 s limit), then returns its proved bound and
the solvers go on as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from pipeplan.solver.space.arcs import ExactData
from pipeplan.solver.bounds.terms import config_lower_bound, optimistic_time
from pipeplan.solver.exact.search import Search, evaluate
from pipeplan.solver.core.termination import TimeLimit, WorkBudget

CHECK_EVERY = 64
"""Prefixes expanded between two looks at the clock."""

STEP = 0.01
"""A pass's target lies this far (relative) above the bound proved before it, at first."""

MAX_STEP = 0.03
"""The step doubles after a pass of fewer than :data:`FAST_PASS` prefixes, up to this."""

REBUILD_MARGIN = 0.1
"""Completion tables are built for a cutoff this much (relative) above the pass's, and reused until it passes it."""

FAST_PASS, SLOW_PASS = 1_500, 6_000
"""Prefixes: a pass expanding fewer doubles the step, one expanding more halves it (down to
:data:`STEP`).  Counted, not timed, so the passes (and the bound) are the same on any machine."""

DEFAULT_PREFIXES = 50_000
"""Prefixes the walk may expand over all its passes, without an explicit budget: 50,000 took
18 s at 96 layers x 32 devices on the 2-core machine this was measured on (besides the tables,
counted apart: :data:`DEFAULT_TABLE_CELLS`)."""

DEFAULT_TABLE_CELLS = 6_000_000_000
"""Table entries the walk may build over all its passes, without an explicit budget: the shift
table's entries and, at each (re)build, arcs x devices-left vectors x the tables built (four, and
one per delta band), or past the budget the undominated arcs' entries and their lattices
([Note: tables past the budget]).  The tables are built one group of arcs at a time, so this
counts time (about 4 ns an entry on the 2-core machine), not memory.  At 96 layers x 32 devices
(experiments/bench_solvers.py, ``cpsat`` with a 60 s limit, 2026-12-02) a default solve builds
4.03 billion entries over 7 passes and ends on its prefix budget in about 31 s with a gap of
7.8 %; with 1.2 billion it stopped at the third rebuild after 12 s with 10.6 %.  At 96 x 64 and
128 x 64 the prefixes run out first (0.43 and 0.78 billion entries).  The benchmark instances the
walk proves (up to 64 x 16) build at most 0.3 billion, over every arc."""

DELTA_BANDS = 8
"""Bands of the completions' largest ``delta`` that the pass-sum table is kept for (see [Note: delta bands])."""

BAND_WORK_LIMIT = 2.5e8
"""Bands are kept only when arcs x devices-left vectors stays below this (on 64 devices the table
rebuilds would take most of the time, and one band measured best there)."""

SHIFT_SECONDS_PER_ENTRY = 5.5e-8
"""Time the walk's shift table takes per entry (stage compositions x devices-left vectors), before
the walk can check its clock: 14.4 s for 268 million entries (14 devices of distinct speeds)."""

MAX_SHIFT_ENTRIES = 3e8
"""Largest shift table the walk builds (int64: 2.4 GB); 15 devices of distinct speeds would need 8.6 GB."""

FULL_TABLE_CELLS = 1_000_000_000
"""Most entries a build of the four tables over every kept arc may take; a larger one is built from the
undominated arcs ([Note: tables past the budget]), which gives the same tables for fewer entries once the
arcs are many: 0.42 billion instead of 3.07 on the first build at 96 layers x 64 devices
(experiments/bench_solvers.py), where the walk then ends on its prefixes in 30 s instead of 50 s with the
same bound (2026-12-02).  The benchmark instances the walk proves build at most 0.3 billion in all."""

LATTICE_CELLS = 1 << 22
"""Entries of the dominance lattices (:meth:`_Walk._undominated`) built at a time (int64: 32 MB)."""

__all__ = ["EnumerationResult", "enumerate_configurations"]


MAX_CHOICE_ENTRIES = 25_000_000
"""Values the walk keeps in its remembered children (:meth:`_Walk.choices`, 8 bytes each: 200 MB);
past them it forgets them all and starts afresh.  ``bench_solvers``' 64 layers x 16 devices hold
5.0 million at most (1,000 keys, 40 MB)."""


@dataclass(frozen=True)
class _Choices:
    """The children of one ``(layer, labels, devices left)``: their columns and the completion tables' values
    after them.

    What :meth:`_Walk._child_bounds` needs besides the prefix's state, one entry per child.
    """

    arcs: np.ndarray  # the data's arc ids
    final: np.ndarray  # ends at layer L
    hi: np.ndarray
    tau: np.ndarray
    busy: np.ndarray
    allreduce: np.ndarray
    busy_path: np.ndarray
    pass_cost: np.ndarray
    pivot_ar: np.ndarray
    pivot2_ar: np.ndarray
    pivot2_extra: np.ndarray
    pivot_extra: np.ndarray
    work: np.ndarray
    head_f: np.ndarray
    head_fb: np.ndarray
    left: np.ndarray  # devices left after the child (flat index)
    speed: np.ndarray  # summed speed of the child's devices
    rest: np.ndarray  # work of the layers after the child
    later_pass: np.ndarray  # completion tables after the child: least pass_cost sum,
    later_work: np.ndarray  # least work sum,
    later_delta: np.ndarray  # least largest pivot_extra,
    alone: np.ndarray  # largest standalone bound, the child's own and the least of any completion
    ends: np.ndarray | None  # banded pass sums, then later_pass ([Note: delta bands]); None without bands

    @property
    def entries(self) -> int:
        """Values held (for :data:`MAX_CHOICE_ENTRIES`)."""
        return len(self.arcs) * (22 + (0 if self.ends is None else self.ends.shape[1]))


class _Stop(Exception):
    """Raised when the time is up; carries nothing (the frames record their bounds)."""


@dataclass(frozen=True)
class EnumerationResult:
    """What the walk did."""

    complete: bool
    """Whether every configuration was simulated or pruned (the incumbent is then optimal)."""
    bound: float
    """A lower bound on every configuration not simulated (``inf`` when complete)."""
    prefixes: int
    """Prefixes expanded."""
    leaves: int
    """Configurations simulated."""
    passes: int = 1
    """Passes run (each with a higher target)."""
    skipped: bool = False
    """Not started: its tables would not fit in the time left, the table budget or memory (see :data:`MAX_SHIFT_ENTRIES`)."""
    table_cells: int = 0
    """Table entries built (counted against the table budget)."""


class _Walk:
    """The precomputed arrays and the depth-first walk."""

    def __init__(self, data: ExactData, search: Search, clock: TimeLimit, budget: WorkBudget | None = None,
                 cells: WorkBudget | None = None) -> None:
        self.data, self.search, self.clock = data, search, clock
        self.budget = budget or WorkBudget(DEFAULT_PREFIXES, stops=clock.stops)
        self.cells = cells or WorkBudget(DEFAULT_TABLE_CELLS, stops=clock.stops)
        problem = data.problem
        self.L = len(problem.graph)
        self.capped = problem.needs.warmup_per_later_stage and data.max_tau < data.stage_limit - 1
        caps = np.array([c.count for c in data.classes], dtype=np.int64)
        self.size = int(np.prod(caps + 1))
        strides = np.ones(len(caps), dtype=np.int64)
        for k in range(len(caps) - 2, -1, -1):
            strides[k] = strides[k + 1] * (caps[k + 1] + 1)
        self.strides, self.speeds = strides, np.array([c.speed for c in data.classes])
        # every devices-left vector, in flat order
        self.avail = np.stack(np.unravel_index(np.arange(self.size), tuple(caps + 1)), axis=1)
        self.full_index = int(caps @ strides)
        # devices of each class in each stage option
        self.option_comps = np.array([o.composition for o in data.options], dtype=np.int64).reshape(
            len(data.options), len(caps))
        self._shift_table()
        self.total_speed = float(caps @ self.speeds)
        layer_work = [len(problem.split) * (l.fwd[0] + l.bwd[0]) + problem.global_batch * (l.fwd[1] + l.bwd[1])
                      for l in problem.graph.layers]
        self.rest_work = np.concatenate((np.cumsum(layer_work[::-1])[::-1], [0.0]))
        self.built_for = -math.inf  # the cutoff they were built for
        self.bounds: dict[tuple[int, ...], float] = {}  # configuration -> its bound (config_lower_bound)
        self.floors: dict[tuple[int, ...], float] = {}  # configuration -> its optimistic time
        self.settled: set[tuple[int, ...]] = set()  # configurations simulated on every placement
        self.prefixes = self.leaves = self.table_cells = 0
        self.open_bounds: list[float] = []
        self.target = math.inf

    def _shift_table(self) -> None:
        """``shift[r, a]``: the devices left after a stage of composition ``shift_comps[r]`` when ``a`` were left.

        ``self.size`` (the completion tables' inf column) where it does not fit in ``a``.
        Only the compositions of the stage options get a row (``option_shift_row`` maps an
        option to its row): with many device classes the devices-left vectors number in
        the tens of thousands, and a row for each would not fit in memory.
        """
        used, self.option_shift_row = np.unique(self.option_comps @ self.strides, return_inverse=True)
        fits = np.ones((len(used), self.size), dtype=bool)
        for k in range(self.option_comps.shape[1]):  # one class at a time: no (rows, size, classes) temporary
            fits &= self.avail[None, :, k] >= self.avail[used, k][:, None]
        self.shift = np.where(fits, np.arange(self.size)[None, :] - used[:, None], self.size)
        self.shift_comps = used  # flat index of each row's composition

    def cutoff(self) -> float:
        """Prune at the incumbent, or at this pass's target when lower."""
        return min(self.search.cutoff(), self.target)

    # ----------------------------------------------------------- completions
    def prepare(self, cutoff: float) -> None:
        """Keep the arcs whose standalone bound is below ``cutoff``; (re)build the tables from them.

        An arc at or above it cannot be in a configuration below the cutoff, and leaving
        it out of the completion tables makes them tighter.
        """
        if cutoff <= self.built_for:  # the tables hold a superset of the arcs needed: still valid
            return
        cutoff = min(cutoff * (1 + REBUILD_MARGIN), self.search.cutoff())  # reused while the target rises
        alone = self.data.table["standalone"]
        keep = np.flatnonzero(alone < cutoff)
        left_out = alone[alone >= cutoff]
        self.left_out_bound = float(left_out.min()) if len(left_out) else math.inf
        self.built_for = cutoff
        self.ids = keep  # local arc j is arc ids[j] of the data's table
        self.tab = tab = {name: col[keep] for name, col in self.data.table.items()}
        comps = self.option_comps[tab["option"]]
        self.comp = comps  # devices of each class per arc
        self.arc_shift_row = self.option_shift_row[tab["option"]]  # its row of the shift table
        self.comp_index = comps @ self.strides  # the same as a flat offset in the devices-left tables
        self.arc_speed = comps @ self.speeds  # summed speed of an arc's devices
        self.groups: dict[tuple[int, int], np.ndarray] = {}
        order = np.lexsort((tab["tau"], tab["lo"]))
        keys = np.stack((tab["lo"][order], tab["tau"][order]), axis=1)
        if len(order):
            starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)])
            for a, b in zip(starts, np.r_[starts[1:], len(order)]):
                self.groups[(int(keys[a, 0]), int(keys[a, 1]))] = order[a:b]
        self._completion_tables()
        self._children_cache: dict[tuple[int, tuple[int, ...]], tuple[np.ndarray, dict]] = {}
        self._choices: dict[tuple, _Choices | None] = {}  # see choices()
        self._choice_entries = 0

    def next_labels(self, label: int) -> tuple[int, ...]:
        """Labels the stage after a stage labelled ``label`` may carry.

        GPipe's op lists do not depend on the later stages (every label is 0); under 1F1B
        label 0 is the last stage, ending at layer ``L``, whose table row is neutral.
        """
        if label == 0:
            return (0,)
        if self.capped and label == self.data.max_tau:
            return (label, label - 1)
        return (label - 1,)

    def _completion_tables(self) -> None:
        """``best[name][h, t, a]``: the least a path from layer ``h`` starting with label ``t`` can add.

        ``a`` indexes the devices left.  Sums for ``pass_cost`` and ``work``, the smallest
        largest value for ``pivot_extra``; ``inf`` where no path exists.  Also
        ``banded[h, t, a, k]``: the least ``pass_cost`` sum of the paths whose every
        ``pivot_extra`` is at most ``edges[k]`` (see [Note: delta bands]).
        """
        tab, L, T = self.tab, self.L, self.data.max_tau + 1
        fields = {"pass_cost": "sum", "work": "sum", "pivot_extra": "max", "standalone": "max"}
        self._choose_tables(list(fields))
        # one more devices-left column, always inf: where an arc does not fit (see _groups_down)
        self.best = {name: np.full((L + 1, T, self.size + 1), np.inf) for name in fields}
        for name in fields:  # row L: nothing follows the last stage
            self.best[name][L, :, :self.size] = 0.0 if fields[name] == "sum" else -np.inf
        for h, t, ids, source in self._groups_down():
            shared = self._cells(tab["hi"][ids], t, source) if self.useful is None else None
            for name, how in fields.items():
                used, cells = (ids, shared) if shared is not None else self._useful_cells(name, t, ids, source)
                value = tab[name][used][:, None]
                later = self._later(name, cells)  # a new array: updated in place
                (np.add if how == "sum" else np.maximum)(value, later, out=later)
                self.best[name][h, t, :self.size] = later.min(axis=0)
        self.edges = self._band_edges()
        self.band_floors = np.concatenate((self.edges[:1], self.edges))[None, :]  # band k: largest delta above it
        self.banded = np.full((L + 1, T, self.size + 1, len(self.edges)), np.inf)
        self.banded[L, :, :self.size] = 0.0
        if not len(self.edges):
            return
        self._charge(len(self.ids) * (self.size + 1) * len(self.edges))
        for h, t, ids, source in self._groups_down():
            within = tab["pivot_extra"][ids][:, None] <= self.edges[None, :]
            value = np.where(within, tab["pass_cost"][ids][:, None], np.inf)[:, None, :]
            later = self._later("banded", self._cells(tab["hi"][ids], t, source))
            np.add(value, later, out=later)
            self.banded[h, t, :self.size] = later.min(axis=0)

    def _useful_cells(self, name: str, t: int, ids: np.ndarray, source: np.ndarray) -> tuple[np.ndarray, list]:
        """The arcs of ``ids`` that table ``name`` is built from, and their cells (see :meth:`_cells`)."""
        keep = self.useful[name][ids]
        return ids[keep], self._cells(self.tab["hi"][ids[keep]], t, source[keep])

    def _choose_tables(self, names: list[str]) -> None:
        """Pay for the tables ``names``, built from every kept arc when they fit in the table budget left and in
        :data:`FULL_TABLE_CELLS`, else from the undominated ones only (``useful``: a mask of the kept arcs per table; see
        [Note: tables past the budget])."""
        self.useful = None
        width = self.size + 1
        if len(self.ids) * width * len(names) <= min(self.cells.left(), FULL_TABLE_CELLS):
            self._charge(len(self.ids) * width * len(names))
            return
        order, starts = self._lattice_groups()
        self._charge(len(starts) * width * len(names))  # the lattices of _undominated
        self.useful = {name: self._undominated(self.tab[name], order, starts) for name in names}
        self._charge(sum(int(mask.sum()) for mask in self.useful.values()) * width)

    def _lattice_groups(self) -> tuple[np.ndarray, np.ndarray]:
        """The kept arcs ordered by ``(lo, hi, tau)``, and where each such group starts in that order."""
        tab = self.tab
        order = np.lexsort((tab["tau"], tab["hi"], tab["lo"]))
        keys = np.stack((tab["lo"][order], tab["hi"][order], tab["tau"][order]), axis=1)
        starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)]) if len(order) else np.zeros(0, int)
        return order, starts

    def _undominated(self, values: np.ndarray, order: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Mask of the kept arcs that no other arc with the same ``(lo, hi, tau)``, fewer devices of no class and a
        smaller ``values`` (ties: a smaller index) dominates.

        A table built without the dominated arcs holds the same values: the dominating arc fits
        wherever the dominated one does, leaves at least its devices, and the tables never grow
        with more devices left.  Found on a lattice over the devices of each group: each
        vector holds the least rank of the arcs at or below it (a running minimum along each
        class), :data:`LATTICE_CELLS` entries at a time.
        """
        n = len(values)
        rank = np.empty(n, dtype=np.int64)
        rank[np.lexsort((np.arange(n), values))] = np.arange(n)
        group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))  # of order[i]
        shape = tuple(self.avail[self.full_index] + 1)
        useful = np.zeros(n, dtype=bool)
        step = max(1, LATTICE_CELLS // self.size)
        for first in range(0, len(starts), step):
            rows = slice(starts[first], starts[first + step] if first + step < len(starts) else n)
            arcs, local = order[rows], group[rows] - first
            lattice = np.full((int(local[-1]) + 1, self.size), n, dtype=np.int64)
            np.minimum.at(lattice, (local, self.comp_index[arcs]), rank[arcs])
            lattice = lattice.reshape((-1,) + shape)
            for axis in range(1, lattice.ndim):
                lattice = np.minimum.accumulate(lattice, axis=axis)
            lattice = lattice.reshape(len(lattice), self.size)
            useful[arcs] = lattice[local, self.comp_index[arcs]] == rank[arcs]
        return useful

    def _charge(self, cells: int) -> None:
        """Pay for ``cells`` table entries, or stop the walk.

        Counted before they are built, so the walk stops at the same rebuild on any machine.
        """
        if not self.cells.spend(cells):
            self.built_for = -math.inf  # unfinished
            raise _Stop
        self.table_cells += cells

    def _groups_down(self):
        """``(h, t, ids, source)`` for every group of arcs, from the last layer down.

        ``source[j, a]``: the devices left after arc ``ids[j]`` when ``a`` were left before
        it, or the tables' extra column (always ``inf``) when it does not fit in ``a``.
        Stops the walk when the clock has run out.
        """
        for h in range(self.L - 1, -1, -1):
            if self.clock.expired():
                self.built_for = -math.inf  # unfinished
                raise _Stop
            for t in range(self.data.max_tau + 1):
                ids = self.groups.get((h, t))
                if ids is None:
                    continue
                yield h, t, ids, self.shift[self.arc_shift_row[ids]]

    def _band_edges(self) -> np.ndarray:
        """``DELTA_BANDS - 1`` edges, evenly from the least largest ``delta`` of any configuration to the cutoff.

        No configuration has all its ``delta`` below the first edge (the ``pivot_extra``
        table at layer 0 with every device), and one below the cutoff has them all below
        the cutoff, so bands outside are never needed; the last band (no edge) is the
        plain ``pass_cost`` table.
        """
        low = float(self.best["pivot_extra"][0, :, self.full_index].min())
        too_big = len(self.ids) * (self.size + 1) > BAND_WORK_LIMIT or self.useful is not None
        if DELTA_BANDS < 2 or too_big or not low < self.built_for < math.inf:
            return np.zeros(0)
        return np.linspace(low, self.built_for, DELTA_BANDS)[:-1]

    def _cells(self, hi: np.ndarray, label: int, index: np.ndarray) -> list[np.ndarray]:
        """Flat offsets into the completion tables after arcs ending at ``hi`` labelled ``label``.

        One array (shaped like ``index``, the devices left) per label the next stage may
        carry; the tables' values there are combined with :meth:`_later`.
        """
        rows = hi.reshape((-1,) + (1,) * (index.ndim - 1))
        width, labels = self.size + 1, self.data.max_tau + 1
        return [(rows * labels + t) * width + index for t in self.next_labels(label)]

    def _later(self, name: str, cells: list[np.ndarray]) -> np.ndarray:
        """The least value of table ``name`` (``"banded"``: every band, last axis) over ``cells``."""
        if name == "banded":
            flat = self.banded.reshape(-1, self.banded.shape[-1])
            values = [np.take(flat, c, axis=0) for c in cells]
        else:
            flat = self.best[name].reshape(-1)
            values = [np.take(flat, c) for c in cells]
        return np.minimum.reduce(values) if len(values) > 1 else values[0]

    # ---------------------------------------------------------------- walking
    def children(self, h: int, labels: tuple[int, ...]) -> tuple[np.ndarray, dict]:
        key = (h, labels)
        if key not in self._children_cache:
            ids = np.concatenate([self.groups.get((h, t), np.zeros(0, dtype=np.int64)) for t in labels])
            tab = self.tab
            cols = {name: tab[name][ids] for name in ("hi", "tau", "busy", "allreduce", "busy_path", "pass_cost",
                                                      "pivot_ar", "pivot2_ar", "pivot2_extra", "pivot_extra",
                                                      "work", "head_f", "head_fb", "standalone")}
            cols["comp"], cols["comp_index"], cols["speed"] = self.comp[ids], self.comp_index[ids], self.arc_speed[ids]
            self._children_cache[key] = (self.ids[ids], cols)
        return self._children_cache[key]

    def choices(self, h: int, labels: tuple[int, ...], avail: int, last: bool) -> _Choices | None:
        """The children of a prefix ending at layer ``h`` with ``avail`` devices left, with all that the prefix
        does not change.

        ``None`` when no child fits (``last``: only the stages ending the pipeline may
        follow).  Remembered until the tables are rebuilt (see the module docstring) or
        :data:`MAX_CHOICE_ENTRIES` is passed.
        """
        key = (h, labels, avail, last)
        if key in self._choices:
            return self._choices[key]
        ids, c = self.children(h, labels)
        found = None
        if len(ids):
            fits = (c["comp"] <= self.avail[avail]).all(axis=1)
            final = c["hi"] == self.L
            if last:
                fits &= final
            if fits.any():
                sel = np.flatnonzero(fits)
                found = self._choices_of(ids[sel], final[sel], {k: v[sel] for k, v in c.items()}, avail)
        if self._choice_entries > MAX_CHOICE_ENTRIES:  # memory: start afresh (only speed depends on it)
            self._choices.clear()
            self._choice_entries = 0
        self._choices[key] = found
        self._choice_entries += 0 if found is None else found.entries
        return found

    def _choices_of(self, arcs: np.ndarray, final: np.ndarray, c: dict, avail: int) -> _Choices:
        """:class:`_Choices` of the children ``arcs`` (columns ``c``) with ``avail`` devices left."""
        left = avail - c["comp_index"]
        later = {name: np.empty(len(left)) for name in self.best}  # row L of the tables: nothing follows
        banded = np.empty((len(left), len(self.edges)))
        for t in set(c["tau"].tolist()):
            rows = np.flatnonzero(c["tau"] == t)
            cells = self._cells(c["hi"][rows], t, left[rows])
            for name, table in later.items():
                table[rows] = self._later(name, cells)
            if len(self.edges):
                banded[rows] = self._later("banded", cells)
        ends = np.concatenate((banded, later["pass_cost"][:, None]), axis=1) if len(self.edges) else None
        alone = np.maximum(c["standalone"], later["standalone"])
        return _Choices(arcs, final, c["hi"], c["tau"], c["busy"], c["allreduce"], c["busy_path"],
                        c["pass_cost"], c["pivot_ar"], c["pivot2_ar"], c["pivot2_extra"], c["pivot_extra"],
                        c["work"], c["head_f"], c["head_fb"], left, c["speed"], self.rest_work[c["hi"]],
                        later["pass_cost"], later["work"], later["pivot_extra"], alone, ends)

    def expand(self, h: int, labels: tuple[int, ...], state: dict, path: list[int]) -> None:
        self.prefixes += 1
        if not self.budget.spend() or (self.prefixes % CHECK_EVERY == 0 and self.clock.expired()):
            raise _Stop
        avail = state["avail"]
        c = self.choices(h, labels, int(avail), self.data.stage_limit - len(path) <= 1)
        if c is None:
            return
        cutoff = self.cutoff()
        lb, child_state = self._child_bounds(state, c)
        keep = lb < cutoff
        if not keep.all():
            self.pruned(float(lb[~keep].min()))
        keep = np.flatnonzero(keep)
        order = keep[np.argsort(lb[keep], kind="stable")]
        for j in order.tolist():
            if lb[j] >= self.cutoff():
                self.pruned(float(lb[j]))
                break  # sorted: every later child is pruned too
            path.append(int(c.arcs[j]))
            self.open_bounds.append(float(lb[j]))
            if c.final[j]:
                self._leaf(path)
            else:
                nxt = {k: v[j] for k, v in child_state.items()}
                self.expand(int(c.hi[j]), self.next_labels(int(c.tau[j])), nxt, path)
            self.open_bounds.pop()
            path.pop()

    def _child_bounds(self, s: dict, c: _Choices) -> tuple[np.ndarray, dict]:
        """Bounds of every child prefix (vectorised), and the state each child passes on."""
        busy = np.maximum(s["hfb"] + c.busy, s["hf"] + c.busy + c.allreduce)
        busy = np.maximum(np.maximum(busy, c.busy_path), s["busy"])
        sp = s["sp"] + c.pass_cost
        x1 = np.maximum(s["x1"], s["hf"] + c.pivot_ar - sp)
        x2 = np.maximum(s["x2"], s["hf"] + c.pivot2_ar - 2 * sp)
        x3 = np.maximum(s["x3"], c.pivot2_extra - sp)
        md = np.maximum(s["md"], c.pivot_extra)
        work = s["work"] + c.work
        hf, hfb = s["hf"] + c.head_f, s["hfb"] + c.head_fb
        total = sp + c.later_pass
        if c.ends is None:
            pivot = total + np.maximum(md, c.later_delta)
        else:  # [Note: delta bands]: never below the line above (each band adds at least later_pass)
            least = np.maximum(np.maximum(md, c.later_delta)[:, None], self.band_floors)
            pivot = (sp[:, None] + c.ends + least).min(axis=1)
        speed_left = s["speed_left"] - c.speed
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(c.rest > 0, c.rest / np.where(speed_left > 1e-12, speed_left, 0.0), 0.0)
        twice = 2 * total
        lb = np.maximum(busy, pivot)
        for term in (x1 + total, x2 + twice, x3 + twice, work + c.later_work, hf + share, hfb + share, c.alone):
            np.maximum(lb, term, out=lb)
        lb[np.isnan(lb)] = np.inf
        state = {"busy": busy, "sp": sp, "x1": x1, "x2": x2, "x3": x3, "md": md, "work": work, "hf": hf,
                 "hfb": hfb, "avail": c.left, "speed_left": speed_left}
        return lb, state

    def pruned(self, bound: float) -> None:
        """Note the bound of something this pass pruned (it is at least the cutoff)."""
        self.least_pruned = min(self.least_pruned, bound)

    def _leaf(self, path: list[int]) -> None:
        key = tuple(path)
        if key in self.settled:
            return
        if key not in self.bounds:
            self.bounds[key] = config_lower_bound(self.data, path)
        floor = self.bounds[key]
        if floor < self.cutoff():  # the optimistic simulation is tighter, and dearer
            if key not in self.floors:
                self.floors[key] = optimistic_time(self.data, path)
            floor = self.floors[key]
        if floor >= self.search.cutoff():  # never better than the incumbent, which only improves
            self.settled.add(key)
            return
        if floor >= self.cutoff():
            self.pruned(floor)
            return
        self.leaves += 1
        # stopped by the clock: not pooled (the pass ends and reports its open bounds); it stays unsettled
        if evaluate(self.data, self.search, list(path), self.clock, self.target, floor, pool_on_clock=False):
            self.settled.add(key)
        else:
            self.pruned(floor)

    def run_pass(self, target: float) -> float | None:
        """One walk pruning at ``min(target, incumbent)``; the bound it proves, or ``None`` on timeout.

        On timeout :attr:`stopped_bound` holds the smallest bound of the unfinished prefixes.
        """
        self.target, self.open_bounds, self.least_pruned = target, [], math.inf
        state = {"busy": 0.0, "sp": 0.0, "x1": -np.inf, "x2": -np.inf, "x3": -np.inf, "md": -np.inf, "work": 0.0,
                 "hf": 0.0, "hfb": 0.0, "avail": self.full_index, "speed_left": self.total_speed}
        try:
            self.prepare(self.cutoff())
            self.pruned(self.left_out_bound)
            self.expand(0, tuple(range(self.data.max_tau + 1)), state, [])
        except _Stop:
            # unexplored: the subtrees of the children being explored on the stack (later siblings have
            # larger bounds), and what was pruned; before the first child, nothing new is proved
            if self.open_bounds:
                self.stopped_bound = min(min(self.open_bounds), self.cutoff(), self.least_pruned)
            else:
                self.stopped_bound = self.search.bound
            return None
        # everything not simulated was pruned at a bound of at least least_pruned
        return min(self.least_pruned, self.search.cutoff())

    def run(self) -> EnumerationResult:
        passes, step = 0, STEP
        while True:
            passes += 1
            incumbent, proved = self.search.cutoff(), self.search.bound
            target = proved * (1 + step)
            if not math.isfinite(incumbent) or proved <= 0 or target - proved >= 0.5 * (incumbent - proved):
                target = incumbent  # the step would cover half the gap: try to close it
            started = self.prefixes
            reached = self.run_pass(target)
            took = self.prefixes - started
            step = min(MAX_STEP, 2 * step) if took < FAST_PASS else max(STEP, step / 2) if took > SLOW_PASS else step
            if reached is None:
                self.search.raise_bound(self.stopped_bound)
                return EnumerationResult(False, self.search.bound, self.prefixes, self.leaves, passes,
                                        table_cells=self.table_cells)
            self.search.raise_bound(reached)
            if reached >= self.search.cutoff():  # the target reached the incumbent: it is optimal
                return EnumerationResult(True, math.inf, self.prefixes, self.leaves, passes,
                                        table_cells=self.table_cells)
            if self.search.bound < reached or reached <= proved:  # capped by the pool: no pass proves more
                return EnumerationResult(False, self.search.bound, self.prefixes, self.leaves, passes,
                                        table_cells=self.table_cells)


def enumerate_configurations(data: ExactData, search: Search, clock: TimeLimit,
                             budget: WorkBudget | None = None, cells: WorkBudget | None = None) -> EnumerationResult:
    """Simulate every configuration whose bound is below the incumbent, or stop at ``budget`` or ``clock``.

    Parameters
    ----------
    data : ExactData
        The candidate arcs (complete: every arc below the cutoff it was built with).
    search : Search
        The incumbent; improved in place as configurations are simulated.
    clock : TimeLimit
        The wall-clock cap.
    budget : WorkBudget, optional
        Prefixes the walk may expand over all its passes (default :data:`DEFAULT_PREFIXES`):
        the work that decides the result, with ``cells``.
    cells : WorkBudget, optional
        Table entries the walk may build (default :data:`DEFAULT_TABLE_CELLS`): the shift
        table once, then the completion tables at every (re)build, each paid before it is built.

    Returns
    -------
    EnumerationResult
        ``complete`` means the incumbent is optimal (to :data:`pipeplan.solver.exact.search.OPT_TOL`),
        or that no configuration exists if there is none; otherwise ``bound`` bounds
        every configuration left unexplored (also raised in ``search``).
    """
    if not len(data):
        return EnumerationResult(True, math.inf, 0, 0)
    entries = shift_entries(data)
    cells = cells or WorkBudget(DEFAULT_TABLE_CELLS, stops=clock.stops)
    if entries > MAX_SHIFT_ENTRIES or not cells.spend(entries):  # memory, or the table budget (noted)
        return EnumerationResult(False, search.bound, 0, 0, 0, skipped=True)
    if entries * SHIFT_SECONDS_PER_ENTRY > clock.remaining():  # the cap binds before the walk starts
        clock.stops.note("time")
        return EnumerationResult(False, search.bound, 0, 0, 0, skipped=True)
    result = _Walk(data, search, clock, budget, cells).run()
    return replace(result, table_cells=result.table_cells + entries)


def shift_entries(data: ExactData) -> int:
    """Entries of the walk's shift table: distinct stage compositions x devices-left vectors.

    Examples
    --------
    Two classes of 2 and 3 devices: 3 x 4 devices-left vectors, 11 non-empty compositions.

    >>> from types import SimpleNamespace as NS
    >>> data = NS(classes=[NS(count=2), NS(count=3)], options=[NS(composition=(a, b)) for a in range(3)
    ...                                                            for b in range(4) if a + b])
    >>> shift_entries(data)
    132
    """
    vectors = math.prod(c.count + 1 for c in data.classes)
    return len({o.composition for o in data.options}) * vectors
