"""The counted work of the exact search's phases (:class:`ExactWork`), and a context that sets it.

Kept apart from :mod:`pipeplan.solver.exact.solve` so that solvers which run the exact ones inside
their own search (NSGA-II's seeding) can set it without importing the exact solver itself.
"""

from __future__ import annotations

import contextlib
import math
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace
from typing import Iterator

from pipeplan.solver.exact.enumeration import DEFAULT_PREFIXES, DEFAULT_TABLE_CELLS
from pipeplan.solver.heuristics.group_search import EVALUATIONS

GREEDY_AFTER_FIT = 64
"""Greedy plans (:func:`greedy_plans`) still simulated once one fitted: each is simulated on every
device, which takes seconds on clusters of thousands, and the first fitting ones are the best."""

GA_ROUNDS, GA_GENERATIONS = 1, 60
"""NSGA-II runs from an unproved incumbent (:func:`improve_with_ga`) and generations of each: 20
generations took 3 s at 96 layers x 32 devices on the loaded 2-core machine this was measured on."""

SLOW_BASELINES = ("Dapple", "Alpa")
"""Baselines (class names) with slow pure-Python DPs: run after the others (a proof makes them moot)."""

BASELINE_CELLS = {"DeepSpeedParameters": 1024, "AutoPipe": 1024, "PipeDream": 1024, "Piper": 1024,
                  "Dapple": 256, "Alpa": 64}
"""Largest layers x devices on which a baseline (class name) runs for the incumbent; the others
run on every problem.  A count, not a time share, so the incumbent does not depend on the machine:
their DPs grow with the square of the layers and with the devices, and these sizes keep each one to
about a second or two on the 2-core machine they were measured on (at 96 layers x 32 devices
PipeDream and Piper take 10 s each there, Dapple and Alpa over a minute; Alpa 50 s at 32 x 8)."""


@dataclass(frozen=True)
class ExactWork:
    """The counted work of the exact search's phases besides the model (whose budget its solver holds).

    Each phase stops on its own count, never on a share of the clock, so an exact solve that the
    time limit does not cut gives the same plan and record on any machine.  The defaults are sized
    from solves of 96 layers x 32 devices of two types (``experiments/bench_solvers.py``), which
    the walk does not prove (see :data:`pipeplan.solver.exact.enumeration.DEFAULT_PREFIXES`).
    """

    patterns: int = EVALUATIONS
    """Patterns group-search builds for the incumbent (see :func:`pipeplan.solver.heuristics.group_search.group_search`)."""
    greedy_after_fit: int = GREEDY_AFTER_FIT
    """Greedy plans still simulated once one fitted (on large clusters each costs seconds)."""
    prefixes: int = DEFAULT_PREFIXES
    """Prefixes the configuration walk expands over all its passes."""
    table_cells: int = DEFAULT_TABLE_CELLS
    """Table entries the configuration walk builds over all its passes (its tables' rebuilds)."""
    ga_rounds: int = GA_ROUNDS
    """NSGA-II runs from the incumbent when the search is not proved (each restarted from the best front)."""
    ga_generations: int = GA_GENERATIONS
    """Generations of each of those runs."""

    def scaled(self, factor: float) -> "ExactWork":
        """Every count times ``factor``, rounded up (at least 1); the NSGA-II rounds stay, their generations scale.

        Examples
        --------
        >>> ExactWork(patterns=400, prefixes=50_000).scaled(0.01).prefixes
        500
        >>> ExactWork().scaled(1e-9).patterns
        1
        """
        if not factor > 0:
            raise ValueError(f"a work factor must be positive, got {factor}")
        counts = {f.name: max(1, math.ceil(getattr(self, f.name) * factor - 1e-9))
                  for f in fields(self) if f.name != "ga_rounds"}
        return replace(self, **counts)


_WORK: ContextVar[ExactWork | None] = ContextVar("pipeplan_exact_work", default=None)


@contextlib.contextmanager
def exact_work(work: ExactWork) -> Iterator[None]:
    """Inside the block, :func:`solve_exact` runs ``work`` unless given its own (for solvers that run exact ones).

    Examples
    --------
    >>> with exact_work(ExactWork(prefixes=1000, ga_rounds=0)):
    ...     pass  # get_solver("cpsat").solve(problem) here walks at most 1000 prefixes
    """
    token = _WORK.set(work)
    try:
        yield
    finally:
        _WORK.reset(token)


def current_work() -> ExactWork:
    """The work set by the innermost :func:`exact_work` block, else the defaults."""
    return _WORK.get() or ExactWork()


def budget_work(budget: float | None, default: float) -> ExactWork:
    """The phases' work for a solve whose model gets ``budget`` of its ``default``: :func:`current_work` scaled alike.

    ``--budget`` thus scales the whole exact solve; without it (``None``) the phases keep
    :func:`current_work`.

    Examples
    --------
    >>> budget_work(12.0, 120.0) == ExactWork().scaled(0.1)
    True
    >>> budget_work(None, 120.0) == ExactWork()
    True
    """
    work = current_work()
    return work if budget is None else work.scaled(budget / default)
