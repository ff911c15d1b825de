"""Equal-split plans at several microbatch counts: the seeds of the searches over splits.

With ``--microbatches auto`` the split-aware solvers ``cpsat`` (beyond its joint search)
and ``cpsat-split`` start from an equal-split plan.  Solved at the largest count alone,
such a start can sit on the wrong pipeline: the best equal split may use fewer
microbatches, and a search over the splits of one pipeline does not change the
pipeline.  :func:`solve_equal_splits` solves the problem's own count and then every other
count of :meth:`PlanningProblem.equal_split_problems`, each on the solver's counted work,
with the time limit only as a cap.
(``nsga`` seeds from the largest count only.)
"""

from __future__ import annotations

from typing import Iterable

from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import TimeLimit


def solve_equal_splits(solver: Solver, problem: PlanningProblem, *, time_limit: float, seed: int,
                       within: TimeLimit | None = None) -> dict[int, SolverResult]:
    """``solver`` on the equal-split problems of ``problem``: its own count first, then every other one.

    Every count is solved on the solver's own counted work (its default budget), each with
    what is left of ``time_limit`` as its cap, never a share of it: a count's solve then
    does not depend on how fast the ones before it ran, and the same problem and seed give
    the same results on an idle and a loaded machine.  Only the cap can change that: a
    solve it cuts, or the counts skipped once it has passed, are noted in ``within``'s
    record (``stopped_by: time``).

    Parameters
    ----------
    solver : Solver
        Solves fixed equal splits (an exact solver or a heuristic).
    problem : PlanningProblem
        The split problem; without ``auto_microbatches`` only its own equal split is solved.
    time_limit : float
        Seconds for all the counts together: a cap.
    seed : int
        Passed to every solve.
    within : TimeLimit, optional
        The clock of the solve this is part of: its record notes what cut a count short.

    Returns
    -------
    dict of int to SolverResult
        Microbatch count -> result for each count solved, the problem's own count first.
    """
    clock = within.within(time_limit) if within is not None else TimeLimit(time_limit)
    first, *others = problem.equal_split_problems()
    results = {first.microbatches: solver.solve(first, time_limit=time_limit, seed=seed, within=clock)}
    for sub in others:
        if clock.expired():  # noted: the counts left out depend on the machine's speed
            break
        results[sub.microbatches] = solver.solve(sub, time_limit=clock.remaining(), seed=seed, within=clock)
    return results


def fastest(results: Iterable[SolverResult]) -> SolverResult:
    """The result with the fastest plan (the first among equals); the first result when none has a plan."""
    results = list(results)
    with_plans = [r for r in results if r.plan is not None and r.iteration_time is not None]
    return min(with_plans, key=lambda r: r.iteration_time) if with_plans else results[0]
