"""The phases of an exact solve, as listed objects with their own counted budgets (:class:`ExactPhases`).

An exact solve (:func:`pipeplan.solver.exact.solve.solve_exact`) runs, in order: its
**bound** phases (the class bound), its **incumbent** phases (searches whose plans start
the search), the **model** (the configuration walk, :class:`Walk`, then the MILP or
CP-SAT cut loop, whose budget its solver holds), the **late incumbents** (slow searches
run only when the model cannot settle the problem) and the **improvement** phases (run
from an unproved incumbent).  Each phase stops on its own count, never on a share of
the clock, so an exact solve that the time limit does not cut gives the same plan and
record on any machine; the time limit is one cap over all of them.

This module holds the phases that need nothing above the exact layer; the searches of
other solvers (group-search, the baselines, NSGA-II) are phases of
:mod:`pipeplan.solver.portfolio`, which lists the registered solvers' phases.  The
counts are sized from solves of 96 layers x 32 devices of two types
(``experiments/bench_solvers.py``), which the walk does not prove (see
:data:`pipeplan.solver.exact.enumeration.DEFAULT_PREFIXES`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Protocol

from pipeplan.solver.bounds.class_bound import class_bound
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit
from pipeplan.solver.exact.enumeration import DEFAULT_PREFIXES, DEFAULT_TABLE_CELLS
from pipeplan.solver.exact.search import Search

CLASS_BOUND_SHARE = 0.4
"""Most of the time limit :func:`pipeplan.solver.bounds.class_bound.class_bound` may take (it runs a fixed number of
steps: 6 to 10 s of CPU at 64 to 4,096 devices on experiments/bench_scale.py's instances, 2-core machine, 2026-12-02).
With a fifth of a 60 s limit it was cut at 1,024 and 4,096 devices (gaps 27.2 % and 31.4 % against 26.6 % and
26.6 % uncut); group-search, which runs after it, finds its plans there in its first seconds (docs/scale.md)."""


REFINED_BOUND_DEVICES = 64
"""Clusters of at least this many devices get the refined class bound (``refine``).  From 64 devices on the
configuration walk and the model do not finish in a minute and the class bound is the bound the exact solvers
return (experiments/bench_scale.py, docs/scale.md).  Below, the walk proves the optimum of
experiments/bench_solvers.py's instances, and the refined bound only costs time: 0.2 s at 16 x 4 (of a 0.34 s
solve) and 0.9 s at 64 x 16, against 0.02 s and 0.1 s unrefined (2026-12-02)."""


def scaled_count(count: int, factor: float) -> int:
    """``count`` times ``factor``, rounded up, at least 1.

    Examples
    --------
    >>> scaled_count(50_000, 0.01), scaled_count(400, 1e-9), scaled_count(64, 1.0)
    (500, 1, 64)
    """
    if not factor > 0:
        raise ValueError(f"a work factor must be positive, got {factor}")
    return max(1, math.ceil(count * factor - 1e-9))


class Phase(Protocol):
    """One phase of an exact solve: it offers plans to the search, or raises its bound."""

    name: str
    """What the record calls it (``plan_by`` / ``bound_by`` when it found the plan or the bound)."""

    def run(self, problem: PlanningProblem, search: Search, clock: TimeLimit, seed: int) -> dict[str, Any]:
        """Run the phase on ``search`` within ``clock``; returns facts for the record's ``details``."""

    def scaled(self, factor: float) -> "Phase":
        """The phase with its counted budget times ``factor`` (``--budget`` scales every phase alike)."""

    def counts(self) -> dict[str, int]:
        """Its counted budgets, by name (the record's ``details["work"]``)."""


@dataclass(frozen=True)
class ClassBoundPhase:
    """The class bound (:func:`pipeplan.solver.bounds.class_bound.class_bound`, refined from
    :data:`REFINED_BOUND_DEVICES` devices on): a fixed number of steps."""

    share: float = CLASS_BOUND_SHARE
    """Most of the time limit it may take (a cap: only short limits cut it)."""
    name = "class bound"

    def run(self, problem: PlanningProblem, search: Search, clock: TimeLimit, seed: int) -> dict[str, Any]:
        cap = clock.within(self.share * clock.seconds)
        refine = len(problem.cluster.devices) >= REFINED_BOUND_DEVICES
        search.raise_bound(class_bound(problem, cap, refine=refine), by=self.name)
        cap.expired()  # the cap cut the bound's counted steps: noted, the bound depends on the machine
        return {}

    def scaled(self, factor: float) -> "ClassBoundPhase":
        return self

    def counts(self) -> dict[str, int]:
        return {}


@dataclass(frozen=True)
class Walk:
    """The configuration walk's counted budgets (:func:`pipeplan.solver.exact.enumeration.enumerate_configurations`)."""

    prefixes: int = DEFAULT_PREFIXES
    """Prefixes the walk expands over all its passes."""
    table_cells: int = DEFAULT_TABLE_CELLS
    """Table entries the walk builds over all its passes (its tables' rebuilds)."""
    name = "configuration walk"

    def scaled(self, factor: float) -> "Walk":
        return Walk(scaled_count(self.prefixes, factor), scaled_count(self.table_cells, factor))

    def counts(self) -> dict[str, int]:
        return {"prefixes": self.prefixes, "table_cells": self.table_cells}


@dataclass(frozen=True)
class ExactPhases:
    """Every phase of an exact solve but the model's own cut loop, in the order they run.

    The default is the exact algorithm alone: the class bound and the walk before the
    model, no other solver's search.  :mod:`pipeplan.solver.portfolio` lists what the
    registered ``ilp`` and ``cpsat`` run.

    Examples
    --------
    >>> ExactPhases(walk=Walk(prefixes=50_000)).scaled(0.01).walk.prefixes
    500
    """

    bound: tuple[Phase, ...] = (ClassBoundPhase(),)
    """Run first: lower bounds that need no model."""
    incumbents: tuple[Phase, ...] = ()
    """Run next: searches whose plans start the walk and the model."""
    walk: Walk = Walk()
    """The model phase's walk over configurations (before the cut loop)."""
    late_incumbents: tuple[Phase, ...] = ()
    """Run when the model cannot settle the problem (too large, cut short, or not proved)."""
    improvement: tuple[Phase, ...] = ()
    """Run from an unproved incumbent, last."""

    def scaled(self, factor: float) -> "ExactPhases":
        """Every phase's counted budget times ``factor``."""
        return replace(self, bound=tuple(p.scaled(factor) for p in self.bound),
                       incumbents=tuple(p.scaled(factor) for p in self.incumbents), walk=self.walk.scaled(factor),
                       late_incumbents=tuple(p.scaled(factor) for p in self.late_incumbents),
                       improvement=tuple(p.scaled(factor) for p in self.improvement))

    def counts(self) -> dict[str, int]:
        """The counted budgets of every phase, by name (the record's ``details["work"]``)."""
        found: dict[str, int] = {}
        for phase in (*self.bound, *self.incumbents, self.walk, *self.late_incumbents, *self.improvement):
            found.update(phase.counts())
        return found
