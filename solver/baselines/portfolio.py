"""The equal-split baselines as one portfolio: each run with a share of the time, the fastest kept.

Importing this module registers the equal-split baselines, cheapest first
(:data:`BASELINES`); :func:`best_baseline` gives the exact solvers their warm start.
"""

from __future__ import annotations

import time

# Import order is registration order (what ``pipeplan compare`` lists): cheapest first.
from pipeplan.solver.baselines import even, megatron, deepspeed, greedy_speed, autopipe, pipedream, dapple, piper, alpa  # noqa: F401,I001
from pipeplan.solver.baselines.alpa import Alpa
from pipeplan.solver.baselines.autopipe import AutoPipe
from pipeplan.solver.baselines.dapple import Dapple
from pipeplan.solver.baselines.deepspeed import DeepSpeedParameters, DeepSpeedUniform
from pipeplan.solver.baselines.even import EvenSplit
from pipeplan.solver.baselines.greedy_speed import GreedySpeed
from pipeplan.solver.baselines.megatron import Megatron
from pipeplan.solver.baselines.pipedream import PipeDream
from pipeplan.solver.baselines.piper import Piper
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult

BASELINES = (EvenSplit, Megatron, DeepSpeedUniform, DeepSpeedParameters, GreedySpeed, AutoPipe, PipeDream, Dapple, Piper,
             Alpa)
"""Every baseline class, cheapest first (the order :func:`best_baseline` runs them)."""


def best_baseline(problem: PlanningProblem, *, seed: int = 0, time_limit: float = 10.0) -> SolverResult | None:
    """The best fitting plan over all baselines, or ``None`` if none fits.

    Each baseline gets an equal share of what is left of ``time_limit``, cheapest
    first, so the fast ones always run and a slow DP cannot starve them.

    Parameters
    ----------
    problem : PlanningProblem
        The problem.
    seed : int
        Passed to every baseline.
    time_limit : float
        Seconds for all baselines together.

    Returns
    -------
    SolverResult or None
        The result (status ``feasible``) with the smallest simulated iteration time.

    Examples
    --------
    >>> best_baseline(problem)  # doctest: +SKIP
    """
    return fastest(run_baselines(problem, seed=seed, time_limit=time_limit))


def fastest(results: list[SolverResult]) -> SolverResult | None:
    """The result with the smallest iteration time among those with a plan, or ``None``."""
    solved = [r for r in results if r.plan is not None]
    return min(solved, key=lambda r: r.iteration_time) if solved else None


def run_baselines(problem: PlanningProblem, *, seed: int = 0, time_limit: float = 10.0) -> list[SolverResult]:
    """Every baseline's result, each with an equal share of what is left of ``time_limit`` (see :func:`best_baseline`)."""
    end = time.perf_counter() + time_limit
    results = []
    for n, cls in enumerate(BASELINES):
        share = max(0.0, end - time.perf_counter()) / (len(BASELINES) - n)
        results.append(cls().solve(problem, time_limit=share, seed=seed))
    return results
