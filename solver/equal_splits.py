"""Equal-split plans at several microbatch counts: the seeds of the searches over splits.

With ``--microbatches auto`` the split-aware solvers (``cpsat`` beyond its joint search,
``cpsat-split``, ``nsga``) start from equal-split plans.  Solved at the largest count
alone, such a start can sit on the wrong pipeline: the best equal split may use fewer
microbatches, and a search over the splits of one pipeline does not change the
pipeline.  :func:`solve_equal_splits` solves one equal-split problem per count of
:meth:`PlanningProblem.equal_split_problems` within one time limit.
"""

from __future__ import annotations

import time
from typing import Iterable, Protocol

from solver.problem import PlanningProblem
from solver.result import SolverResult


class Solver(Protocol):
    def solve(self, problem: PlanningProblem, *, time_limit: float, seed: int) -> SolverResult: ...


def solve_equal_splits(solver: Solver, problem: PlanningProblem, *, time_limit: float,
                       seed: int) -> dict[int, SolverResult]:
    """``solver`` on every equal-split problem of ``problem``, the largest count first.

    Each count gets an equal share of what is left of ``time_limit``, so time a quick
    solve leaves over goes to the counts after it.  Counts still unsolved when the time
    is spent are skipped.

    Parameters
    ----------
    solver : object with ``solve(problem, *, time_limit, seed)``
        Solves fixed equal splits (an exact solver or a heuristic).
    problem : PlanningProblem
        The split problem; without ``auto_microbatches`` only its own equal split is solved.
    time_limit : float
        Seconds for all the counts together.
    seed : int
        Passed to every solve.

    Returns
    -------
    dict of int to SolverResult
        Microbatch count -> result, for each count solved, in the order of
        :meth:`PlanningProblem.equal_split_problems`.
    """
    deadline = time.perf_counter() + time_limit
    problems = problem.equal_split_problems()
    results: dict[int, SolverResult] = {}
    for i, sub in enumerate(problems):
        left = deadline - time.perf_counter()
        if left <= 0 and results:
            break
        results[sub.microbatches] = solver.solve(sub, time_limit=max(left, 0.0) / (len(problems) - i), seed=seed)
    return results


def fastest(results: Iterable[SolverResult]) -> SolverResult:
    """The result with the fastest plan (the first among equals); the first result when none has a plan."""
    results = list(results)
    with_plans = [r for r in results if r.plan is not None and r.iteration_time is not None]
    return min(with_plans, key=lambda r: r.iteration_time) if with_plans else results[0]
