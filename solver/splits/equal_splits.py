"""Equal-split plans at several microbatch counts: the seeds of the searches over splits.

With ``--microbatches auto`` the split-aware solvers ``cpsat`` (beyond its joint search)
and ``cpsat-split`` start from an equal-split plan.  Solved at the largest count alone,
such a start can sit on the wrong pipeline: the best equal split may use fewer
microbatches, and a search over the splits of one pipeline does not change the
pipeline.  :func:`solve_equal_splits` solves the largest count as before and then, in
the time it leaves, the other counts of :meth:`PlanningProblem.equal_split_problems`.
(``nsga`` keeps one seed at the largest count: its seeds must not depend on how fast
the machine is, and how many counts fit in the time left does.)
"""

from __future__ import annotations

from typing import Iterable

from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import TimeLimit

MIN_PROBE_SECONDS = 0.5
"""Least time a count after the first is given (a model build alone can take seconds); with less
left, the remaining counts are skipped."""


def solve_equal_splits(solver: Solver, problem: PlanningProblem, *, time_limit: float, seed: int,
                       within: TimeLimit | None = None) -> dict[int, SolverResult]:
    """``solver`` on the equal-split problems of ``problem``: its own count first, with all of ``time_limit``.

    The problem's own count (``K`` as the CLI sets it) gets the whole limit, as the
    single equal-split solve always had, so its plan is the one it was; when it
    finishes early (a small instance is proved in a fraction of a second) the other
    counts follow, in the order of :meth:`PlanningProblem.equal_split_problems`, each
    with the same fixed share of ``time_limit`` (at least :data:`MIN_PROBE_SECONDS`),
    while that share is still left.  The share is fixed, not a part of what is left, so
    each count's solve does not depend on how fast the earlier ones ran; a count skipped
    for want of time is noted in ``within``'s record (``stopped_by: time``).

    Parameters
    ----------
    solver : Solver
        Solves fixed equal splits (an exact solver or a heuristic).
    problem : PlanningProblem
        The split problem; without ``auto_microbatches`` only its own equal split is solved.
    time_limit : float
        Seconds for all the counts together.
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
    share = max(time_limit / (len(others) + 1), MIN_PROBE_SECONDS)
    for sub in others:
        if clock.expired(margin=share):
            break
        results[sub.microbatches] = solver.solve(sub, time_limit=share, seed=seed, within=clock)
    return results


def fastest(results: Iterable[SolverResult]) -> SolverResult:
    """The result with the fastest plan (the first among equals); the first result when none has a plan."""
    results = list(results)
    with_plans = [r for r in results if r.plan is not None and r.iteration_time is not None]
    return min(with_plans, key=lambda r: r.iteration_time) if with_plans else results[0]
