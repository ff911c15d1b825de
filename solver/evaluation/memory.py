"""Peak memory of a stage (spec section 5).

The stash grows when ``Fk`` ends and shrinks when ``Bk`` ends, and a stage runs its
ops one at a time, so the peak depends on the op order only, not on timing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from pipeplan.models.graph import LayerGraph
from pipeplan.solver.schedules.schedule import FORWARD, Op

ROUNDING = 1e-9
"""Relative band around a memory within which a peak summed in another order is re-checked.

Vectorised searches sum a stage's bytes as differences of prefix sums and multiply
where the simulator adds one layer and one microbatch at a time; the two can differ by
a few units in the last place of the *largest operand* (a prefix sum spanning layers
before the stage's, say), and a peak equal to the memory fits.  Inside this band, scaled
by that operand, :func:`settle_borderline` decides with the simulator's own arithmetic,
so neither an exact solver's arc table nor ``group-search``'s fit table drops a stage
the simulator accepts."""


def stash_peak(ops: Sequence[Op], per_replica: Sequence[int], stash_per_sample: float,
               recompute_per_sample: float) -> float:
    """Largest stash (plus recompute working set while a backward runs) over ``ops``.

    Parameters
    ----------
    ops : sequence of Op
        The stage's op list.
    per_replica : sequence of int
        ``ceil(n_k / r)`` for each microbatch ``k``.
    stash_per_sample : float
        ``I_s`` for a recomputing stage, ``A_s`` otherwise.
    recompute_per_sample : float
        ``A_s`` for a recomputing stage (held while its backward runs), else 0.

    Examples
    --------
    >>> stash_peak([("F", 0), ("F", 1), ("B", 0), ("B", 1)], [2, 2], 10.0, 0.0)
    40.0
    """
    stash = peak = 0.0
    for kind, k in ops:
        if kind == FORWARD:
            stash += per_replica[k] * stash_per_sample
            peak = max(peak, stash)
        else:
            peak = max(peak, stash + per_replica[k] * recompute_per_sample)
            stash -= per_replica[k] * stash_per_sample
    return peak


def stage_peak_memory(state_factor: float, params: float, ops: Sequence[Op], per_replica: Sequence[int],
                      act: float, input_bytes: float, recompute: bool) -> float:
    """Peak bytes on each device of a stage: training state plus the stash peak.

    Parameters
    ----------
    state_factor : float
        Bytes of state per byte of parameters.
    params : float
        ``P_s``, parameter bytes of the stage's layers.
    ops, per_replica
        As in :func:`stash_peak`.
    act : float
        ``A_s``, saved-activation bytes per sample of the stage's layers.
    input_bytes : float
        ``I_s``, the stage's input bytes per sample.
    recompute : bool
        Whether the stage recomputes.
    """
    if recompute:
        return state_factor * params + stash_peak(ops, per_replica, input_bytes, act)
    return state_factor * params + stash_peak(ops, per_replica, act, 0.0)


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
    stash = peak = 0.0
    for s, kind, k in program:
        mem = stages[s]
        q = mem.per_replica[k]
        if kind == FORWARD:
            stash += q * mem.stash
            peak = max(peak, stash)
        elif kind == "W":
            stash -= q * mem.weight
        else:
            peak = max(peak, stash + q * mem.working)
            stash -= q * mem.stash
            if kind == "I":  # no new peak: Aw <= A, and a recomputing I held q * (X + A) while it ran
                stash += q * mem.weight
    return peak


def group_peak_memory(state_factor: float, params: float, program: Sequence[tuple[int, str, int]],
                      stages: Mapping[int, StageMemory]) -> float:
    """Peak bytes on each device of a group: ``state_factor * P_g`` plus its program's stash peak."""
    return state_factor * params + program_stash_peak(program, stages)


def range_peak_memory(graph: LayerGraph, state_factor: float, lo: int, hi: int, ops: Sequence[Op],
                      per_replica: Sequence[int], recompute: bool) -> float:
    """:func:`stage_peak_memory` of layers ``[lo, hi)``, summed exactly as the simulator sums them."""
    return stage_peak_memory(state_factor, graph.range_sum("params", lo, hi), ops, per_replica,
                             graph.range_sum("act", lo, hi), graph.stage_input_bytes(lo), recompute)


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


def stash_points(ops, per_replica: Sequence[int]) -> np.ndarray:
    """``(inputs, working)`` sample counts at every point where the stash may peak.

    The peak of :func:`pipeplan.solver.evaluation.memory.stash_peak` is ``max(a * stash + b * working)``
    over these rows (``stash``, ``working`` per sample), exactly.
    """
    stash, points = 0, set()
    for kind, k in ops:
        if kind == FORWARD:
            stash += per_replica[k]
            points.add((stash, 0))
        else:
            points.add((stash, per_replica[k]))
            stash -= per_replica[k]
    return np.array(sorted(points), dtype=float)
