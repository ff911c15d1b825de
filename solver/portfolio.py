"""What ``ilp``, ``cpsat`` and ``group-search`` run for a version-2 schedule.

``ilp`` and ``cpsat`` (:func:`solve_v2_exact`): the search of
:mod:`pipeplan.solver.exact.virtual_search` over the restricted space of
:mod:`pipeplan.solver.heuristics.virtual_groups` first, with up to :data:`HEURISTIC_WORK_SHARE` of the
work budget, for an incumbent; then over the whole space from that incumbent, which the
bounds prove optimal or improve on, with the rest of the budget.  The phases are split by
counted simulations, never by the clock, so the plan does not depend on the machine's
speed; the time limit caps both (``stopped_by: time`` when it cuts either).
``group-search`` (:func:`solve_v2_heuristic`): the restricted space alone.
"""

from __future__ import annotations

import time
from dataclasses import replace

from pipeplan.models.errors import InputError
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import WorkBudget, note, phase_watch
from pipeplan.solver.exact.virtual_search import DEFAULT_SIMULATIONS, solve_v2
from pipeplan.solver.heuristics.virtual_groups import equal_groupings, heuristic_boundaries

HEURISTIC_WORK_SHARE = 0.3
"""Most of the simulation budget the restricted search may spend before the exact search of ``ilp`` and ``cpsat``."""


def solve_v2_exact(name: str, problem: PlanningProblem, time_limit: float, seed: int,
                   budget: float | None) -> SolverResult:
    """A version-2 schedule by the two phases of the module docstring (``budget``: simulations).

    Raises
    ------
    InputError
        With ``auto_microbatches``: the version-2 search plans ``M`` equal microbatches.
    """
    if problem.auto_microbatches:
        raise InputError("-", "--microbatches", f"{name} plans {problem.schedule} for M equal microbatches only "
                                                f"(every stage splits alike); give a number instead of auto")
    start = time.perf_counter()
    total = budget or DEFAULT_SIMULATIONS
    first_work = WorkBudget(max(1.0, HEURISTIC_WORK_SHARE * total))
    with phase_watch() as phase:  # the restricted phase spending its share is not the solve's stop
        first = solve_v2_heuristic(problem, name, time_limit=time_limit, seed=seed, budget=first_work)
    for kind, happened in (("time", phase.time_cut), ("interrupt", phase.interrupted)):
        if happened:
            note(kind)
    incumbent = (first.plan, first.iteration_time) if first.plan is not None else None
    left = max(0.0, time_limit - (time.perf_counter() - start))
    work = WorkBudget(max(1.0, total - first_work.spent))
    full = solve_v2(problem, name, time_limit=left, seed=seed, budget=work, incumbent=incumbent)
    details = dict(full.details, simulations=full.details["simulations"] + first.details["simulations"],
                   restricted_search=[first.status, first.iteration_time])
    return replace(full, wall_time=time.perf_counter() - start, details=details)


def solve_v2_heuristic(problem: PlanningProblem, name: str, *, time_limit: float, seed: int,
                       budget: float | WorkBudget | None = None) -> SolverResult:
    """Plan a version-2 schedule over the restricted space of :mod:`pipeplan.solver.heuristics.virtual_groups` (``budget``: simulations)."""
    work = budget if isinstance(budget, WorkBudget) else WorkBudget(budget or DEFAULT_SIMULATIONS)
    return solve_v2(problem, name, time_limit=time_limit, seed=seed, budget=work,
                    boundaries=heuristic_boundaries(problem), groupings=equal_groupings, proves=False)
