"""The equal-split baselines as one portfolio: each run with a share of the time, the fastest kept.

:data:`BASELINES` lists the equal-split baselines, cheapest first; :func:`best_baseline`
runs them all and keeps the fastest plan.
"""

from __future__ import annotations

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
from pipeplan.solver.core.termination import TimeLimit

BASELINES = (EvenSplit, Megatron, DeepSpeedUniform, DeepSpeedParameters, GreedySpeed, AutoPipe, PipeDream, Dapple, Piper,
             Alpa)
"""Every baseline class, cheapest first (the order :func:`best_baseline` runs them)."""


def best_baseline(problem: PlanningProblem, *, seed: int = 0, time_limit: float = 10.0,
                  within: TimeLimit | None = None) -> SolverResult | None:
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
    within : TimeLimit, optional
        The clock of the solve this is part of (its record notes what cut a baseline short).

    Returns
    -------
    SolverResult or None
        The result (status ``feasible``) with the smallest simulated iteration time.

    Examples
    --------
    >>> best_baseline(problem)  # doctest: +SKIP
    """
    return fastest(run_baselines(problem, seed=seed, time_limit=time_limit, within=within))


def fastest(results: list[SolverResult]) -> SolverResult | None:
    """The result with the smallest iteration time among those with a plan, or ``None``."""
    solved = [r for r in results if r.plan is not None]
    return min(solved, key=lambda r: r.iteration_time) if solved else None


def run_baselines(problem: PlanningProblem, *, seed: int = 0, time_limit: float = 10.0,
                  within: TimeLimit | None = None) -> list[SolverResult]:
    """Every baseline's result, each with an equal share of what is left of ``time_limit`` (see :func:`best_baseline`)."""
    clock = TimeLimit(time_limit)
    results = []
    for n, cls in enumerate(BASELINES):
        share = clock.left() / (len(BASELINES) - n)
        results.append(cls().solve(problem, time_limit=share, seed=seed, within=within))
    return results
