"""Peak memory of a device group (spec sections 5 and 7.4): one walk over its program.

The stash grows when an ``F`` ends and shrinks when a ``B`` (or a ``W``) ends, and a
group runs its actions one at a time, so the peak depends on the program's order only,
not on timing.  A stage with its group to itself is the version-1 case (spec section 5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate, chain
from operator import add, itemgetter, neg
from typing import Callable, Mapping, Sequence

import numpy as np

from pipeplan.models.graph import LayerGraph
from pipeplan.solver.schedules.schedule import BACKWARD, FORWARD, INPUT, WEIGHT, Action

ROUNDING = 1e-9
"""Relative band around a memory within which a peak summed in another order is re-checked.

Vectorised searches sum a stage's bytes as differences of prefix sums and multiply
where the simulator adds one layer and one microbatch at a time; the two can differ by
a few units in the last place of the *largest operand* (a prefix sum spanning layers
before the stage's, say), and a peak equal to the memory fits.  Inside this band, scaled
by that operand, :func:`settle_borderline` decides with the simulator's own arithmetic,
so neither an exact solver's arc table nor ``group-search``'s fit table drops a stage
the simulator accepts."""


@dataclass(frozen=True)
class StageMemory:
    """What one stage adds to its group's stash (spec 7.4), per device."""

    per_replica: tuple[int, ...]
    """``q = ceil(n_k / r_g)`` for each microbatch ``k``."""
    stash: float
    """``X_s``: bytes per sample kept from ``F`` to ``B`` or ``I`` (``I_s`` if it recomputes, else ``A_s``)."""
    working: float
    """``A_s`` if the stage recomputes (held while a ``B`` or ``I`` runs), else 0."""
    weight: float
    """``Aw_s``: bytes per sample kept from ``I`` to ``W``."""

    @classmethod
    def of(cls, per_replica: Sequence[int], act: float, input_bytes: float, act_weight: float,
           recompute: bool) -> "StageMemory":
        """A stage's memory from its sums: ``A_s``, ``I_s``, ``Aw_s`` and its recompute flag.

        Examples
        --------
        >>> StageMemory.of([2, 2], 10.0, 1.0, 4.0, True)
        StageMemory(per_replica=(2, 2), stash=1.0, working=10.0, weight=4.0)
        """
        return cls(tuple(per_replica), input_bytes if recompute else act, act if recompute else 0.0, act_weight)


class StashWalk:
    """A program's stash walk (spec 7.4), compiled once: its peak is then a gather, a running sum and a max.

    An ``F`` adds ``q X`` when it ends, a ``B`` removes it, an ``I`` removes it and adds
    ``q Aw`` (kept for its ``W``), a ``W`` removes ``q Aw``; while a ``B`` or an ``I`` runs,
    ``q A`` more is held on a recomputing stage (``working``).  The running sum adds the
    changes in program order, one at a time, so it rounds as a loop over the program does.

    Parameters
    ----------
    program : sequence of (stage, kind, microbatch)
        A group's actions in order.

    Examples
    --------
    >>> walk = StashWalk([(0, "F", 0), (0, "F", 1), (0, "I", 0), (0, "W", 0), (0, "B", 1)])
    >>> walk.peak({0: StageMemory((2, 2), 10.0, 0.0, 4.0)})
    40.0
    """

    def __init__(self, program: Sequence[tuple[int, str, int]]) -> None:
        self.counts: dict[int, int] = {}
        """Microbatches of each stage the program runs."""
        self.split: dict[int, bool] = {}
        """Whether each stage splits a backward (its table then holds ``q Aw``)."""
        for s, kind, k in program:
            if k >= self.counts.get(s, 0):
                self.counts[s] = k + 1
            if kind == WEIGHT:
                self.split[s] = True
        self.stages = tuple(sorted(self.counts))
        """The stages the program runs, in order."""
        self.split = {s: self.split.get(s, False) for s in self.stages}
        offset, at = 0, {}
        for s in self.stages:  # per stage: +qX, -qX, then (split only) +qAw, -qAw, each over its microbatches
            at[s] = offset
            offset += (4 if self.split[s] else 2) * self.counts[s]
        held_at, held = {}, 0
        for s in self.stages:
            held_at[s] = held
            held += self.counts[s]
        deltas, after_f, before_b, working = [], [], [], []
        for s, kind, k in program:
            m, base = self.counts[s], at[s]
            if kind == FORWARD:
                deltas.append(base + k)
                after_f.append(len(deltas))  # in the walk with a leading 0: the stash after this action
            elif kind == WEIGHT:
                deltas.append(base + 3 * m + k)
            else:
                before_b.append(len(deltas))  # in the walk with a leading 0: the stash before this action
                working.append(held_at[s] + k)
                deltas.append(base + m + k)
                if kind == INPUT:
                    deltas.append(base + 2 * m + k)
        self.deltas, self.after, self.before, self.working = deltas, after_f, before_b, working
        """The walk as indices: the change each action makes (into :meth:`table`'s rows), the points after an
        ``F`` and before a ``B`` or ``I`` (into the running sum with a leading 0), and the working set held
        during each of the latter (into the stages' microbatches, one after another)."""
        self._deltas, self._after_f = gather(deltas), gather(after_f)
        self._before_b, self._working = gather(before_b), gather(working)

    def peak(self, stages: Mapping[int, StageMemory]) -> float:
        """The largest stash of the program (plus the working set of a running ``B`` or ``I``), per device."""
        table: list[float] = []
        held: list[float] = []
        for s in self.stages:  # the layout of the rows: see __init__ (a batched walk builds the same)
            mem = stages[s]
            per_replica = mem.per_replica[:self.counts[s]]
            rows = {q: (q * mem.stash, q * mem.weight, q * mem.working) for q in set(per_replica)}
            added, kept, working = by_size(rows, per_replica)
            table += added
            table += map(neg, added)
            if self.split[s]:
                table += kept
                table += map(neg, kept)
            held += working
        walk = [0.0, *accumulate(self._deltas(table))]
        after = self._after_f(walk)
        during = map(add, self._before_b(walk), self._working(held))
        return max(chain((0.0,), after, during))


def by_size(rows: Mapping[int, tuple], sizes: Sequence[int]) -> tuple[tuple, ...]:
    """The row of each size in ``sizes``, as columns: one tuple per entry of a row, one item per size.

    Callers compute a row once per distinct microbatch size (a split repeats a size or
    two), so every item of a column is the same float its own computation would give.

    Examples
    --------
    >>> by_size({2: (2, 0.5), 3: (3, 0.75)}, (2, 3, 2))
    ((2, 3, 2), (0.5, 0.75, 0.5))
    """
    if len(rows) == 1:  # one size (an equal split): each column repeats one value
        (row,) = rows.values()
        return tuple((value,) * len(sizes) for value in row)
    return tuple(zip(*map(rows.__getitem__, sizes)))


def gather(index: list[int]):
    """``items(seq)``: the entries of ``seq`` at ``index``, as a tuple (of any length)."""
    if len(index) > 1:
        return itemgetter(*index)
    return (lambda seq: (seq[index[0]],)) if index else (lambda seq: ())


def program_stash_peak(program: Sequence[tuple[int, str, int]], stages: Mapping[int, StageMemory]) -> float:
    """Largest stash of a group over its program (spec 7.4): ``F`` adds, ``B`` removes, ``I`` trades for ``W``'s.

    Parameters
    ----------
    program : sequence of (stage, kind, microbatch)
        The group's actions in order.
    stages : mapping of stage index to StageMemory
        Every stage the program names.

    Examples
    --------
    >>> m = {0: StageMemory((2, 2), 10.0, 0.0, 4.0)}
    >>> program_stash_peak([(0, "F", 0), (0, "F", 1), (0, "I", 0), (0, "W", 0), (0, "B", 1)], m)
    40.0
    """
    return StashWalk(program).peak(stages)


def group_peak_memory(state_factor: float, params: float, program: Sequence[tuple[int, str, int]] | StashWalk,
                      stages: Mapping[int, StageMemory]) -> float:
    """Peak bytes on each device of a group: ``state_factor * P_g`` plus its program's stash peak.

    ``program`` may be given compiled (a :class:`StashWalk`), for a caller that walks it often.
    """
    walk = program if isinstance(program, StashWalk) else StashWalk(program)
    return state_factor * params + walk.peak(stages)


def training_state(params: float, state_factor: float, split: tuple[float, float, float], zero: int,
                   replicas: int) -> float:
    """Bytes of training state on each device of a stage (docs/model.md 8.4).

    ``params`` is what one device holds (``P'``, after tensor parallelism's split) and
    ``split`` the weights, gradients and optimizer state per byte of it.  ZeRO 0 keeps
    all of it, ``state_factor * P'`` (sections 5 and 7.4); ZeRO 1 shards the optimizer
    state across the ``replicas``; ZeRO 2 the gradients too.

    Examples
    --------
    >>> [training_state(100.0, 4.0, (1.0, 1.0, 2.0), zero, 4) for zero in (0, 1, 2)]
    [400.0, 250.0, 175.0]
    """
    w, g, o = split
    if zero == 0:
        return state_factor * params
    if zero == 1:
        return (w + g + o / replicas) * params
    return (w + (g + o) / replicas) * params


def range_peak_memory(graph: LayerGraph, state_factor: float, lo: int, hi: int, program: Sequence[Action],
                      per_replica: Sequence[int], recompute: bool) -> float:
    """The peak of a stage of layers ``[lo, hi)`` that has its group to itself, summed exactly as the simulator sums it.

    ``program`` holds the stage's actions (one stage index throughout).
    """
    stage = StageMemory.of(per_replica, graph.range_sum("act", lo, hi), graph.stage_input_bytes(lo),
                           graph.range_act_weight(lo, hi), recompute)
    return group_peak_memory(state_factor, graph.range_sum("params", lo, hi), program,
                             {a.stage: stage for a in program[:1]})


def settle_borderline(fits: np.ndarray, peak: np.ndarray, memory: float, candidates: np.ndarray,
                      exact_peak: Callable[[int], float], *, scale: np.ndarray | float) -> np.ndarray:
    """``fits`` with every candidate whose ``peak`` is within rounding of ``memory`` re-decided.

    Parameters
    ----------
    fits : ndarray of bool
        ``peak <= memory`` as computed by the caller (changed in place).
    peak : ndarray of float
        The caller's peaks, same shape.
    memory : float
        The capacity they are compared with.
    candidates : ndarray of bool
        Entries that may fit at all (the others are left as they are).
    exact_peak : callable
        The simulator's peak of the entry at a flat (C-order) index, for instance
        through :func:`range_peak_memory`; called only for borderline entries.
    scale : ndarray or float
        The largest magnitude the caller's sum went through for each entry (its
        prefix sums at the stage's end, say): the band is :data:`ROUNDING` times the
        larger of it and ``memory``.  An entry whose scale is 0 summed only zeros,
        exactly, and is left as it is.

    Returns
    -------
    ndarray of bool
        ``fits`` itself.

    Examples
    --------
    >>> fits = np.array([False, True])
    >>> settle_borderline(fits, np.array([0.7000000000000001, 0.2]), 0.7, np.array([True, True]),
    ...                   lambda i: 0.7, scale=0.7).tolist()
    [True, True]
    """
    if not math.isfinite(memory):
        return fits
    band = ROUNDING * np.maximum(abs(memory), scale)
    near = (np.abs(peak - memory) <= band) & candidates & (np.asarray(scale) > 0)
    for index in np.flatnonzero(near):
        fits[np.unravel_index(index, fits.shape)] = exact_peak(int(index)) <= memory
    return fits


def stash_points(program: Sequence[Action], per_replica: Sequence[int]) -> np.ndarray:
    """``(inputs, working)`` sample counts at every point where the stash of one stage's ``F``/``B`` program may peak.

    The peak of :func:`program_stash_peak` for that stage is ``max(a * stash + b * working)``
    over these rows (``stash``, ``working`` per sample), exactly.

    Raises
    ------
    ValueError
        For a split backward (``I``, ``W``): its peak needs ``Aw`` as a third term.
    """
    stash, points = 0, set()
    for _, kind, k in program:
        if kind == FORWARD:
            stash += per_replica[k]
            points.add((stash, 0))
        elif kind == BACKWARD:
            points.add((stash, per_replica[k]))
            stash -= per_replica[k]
        else:
            raise ValueError(f"stash_points takes F and B actions, got {kind}{k}")
    return np.array(sorted(points), dtype=float)
