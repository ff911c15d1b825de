"""The published baselines: one module per method, all judged by the simulator.

Importing this package registers the equal-split baselines ``even``,
``deepspeed-uniform``, ``deepspeed-parameters``, ``pipedream``, ``dapple``, ``alpa``,
``autopipe``, ``greedy-speed``, ``megatron`` and ``piper`` (:data:`BASELINES`), and the split baselines that
start from the best of them, ``umpipe-local``, ``umpipe-dp`` and ``autopipe-slicing``
(see each module's docstring for its source and its heterogeneous adaptation).
:func:`best_baseline` gives the exact solvers their warm start.
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
from pipeplan.solver.problem import PlanningProblem
from pipeplan.solver.result import SolverResult

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

# Split-aware baselines (unequal microbatches on the best equal-split pipeline): they
# return plans outside the equal-split search space, so they stay out of BASELINES.
from pipeplan.solver.baselines import umpipe, slicing  # noqa: E402,F401,I001
from pipeplan.solver.baselines.slicing import AutoPipeSlicing  # noqa: E402
from pipeplan.solver.baselines.umpipe import UmpipeDP, UmpipeLocal  # noqa: E402

SPLIT_BASELINES = (UmpipeLocal, UmpipeDP, AutoPipeSlicing)
"""Baselines that choose microbatch splits (``umpipe-local``, ``umpipe-dp``, ``autopipe-slicing``)."""
