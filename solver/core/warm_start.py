"""Starting a solver from an earlier plan (``pipeplan plan --warm-start PLAN.json``).

The plan is checked against the problem first (:func:`load_warm_start`): a plan for
another batch, schedule or device set, or outside the problem's switches, is refused
with one line naming the rule, never silently changed.  A solver that takes a
``warm_start`` (``nsga`` seeds its population with it) gets it; for every other one
:meth:`pipeplan.solver.core.algorithm.Solver.solve` keeps the earlier plan when it is faster
than the solver's own (:func:`keep_better`), so a warm-started result is never worse than its start.
"""

from __future__ import annotations

from dataclasses import replace

from pipeplan.models.errors import InputError
from pipeplan.solver.formats.plan import Plan, load_plan
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.space.tensor_parallel import outside_options


def load_warm_start(path: str, problem: PlanningProblem) -> Plan:
    """The plan in ``path``, checked to be a fitting plan of ``problem``'s search space (:func:`check_warm_start`).

    Parameters
    ----------
    path : str
        A ``pipeplan.plan/1`` file (its ``"solver"`` record, if any, is ignored).
    problem : PlanningProblem
        The problem to start from it.

    Returns
    -------
    Plan

    Raises
    ------
    InputError
        When the file is not a valid plan of ``problem``'s graph and cluster, or fails
        :func:`check_warm_start`.

    Examples
    --------
    >>> plan = load_warm_start("best.plan.json", problem)  # doctest: +SKIP
    """
    return check_warm_start(load_plan(path, problem.graph, problem.cluster), problem, path)


def check_warm_start(plan: Plan, problem: PlanningProblem, where: str) -> Plan:
    """``plan``, checked to be a fitting plan of ``problem``'s search space.

    Parameters
    ----------
    plan : Plan
        A valid plan of the problem's graph and cluster.
    problem : PlanningProblem
        The problem to start from it.
    where : str
        What the error names as the plan's source (its file).

    Raises
    ------
    InputError
        When the plan has another batch or schedule, lies outside the problem's switches
        (stages, replication, recompute, microbatches) or does not fit in memory, or uses
        degrees or ZeRO levels the problem's ``tensor_parallel`` and ``zero`` do not allow.
    """
    if problem.tensor_search:
        why = outside_options(plan, problem.cluster, problem.tensor_parallel, problem.max_tensor_parallel,
                              problem.zero, problem.max_zero)
        if why:
            raise InputError(where, "stages", f"{why}; give the options it was made with")
    else:
        plan.refuse_tensor_parallel(where, "a solver's warm start without --tensor-parallel or --zero")
    if plan.global_batch != problem.global_batch:
        raise InputError(where, "global_batch", f"the plan is for a batch of {plan.global_batch} samples, the "
                                                f"problem has --batch {problem.global_batch}; plan again or give "
                                                f"its batch")
    if plan.schedule != problem.schedule:
        raise InputError(where, "schedule", f"the plan uses {plan.schedule!r}, the problem --schedule "
                                            f"{problem.schedule!r}")
    inside = problem.in_split_space(plan) if problem.free_sizes else problem.in_search_space(plan)
    if not inside:
        raise InputError(where, "stages", f"the plan lies outside this problem's search space "
                                          f"({_switches(problem)}); give the options it was made with")
    verdict = problem.evaluate(plan)
    if not verdict.fits:
        raise InputError(where, "stages", "the plan does not fit in memory on this cluster (pipeplan simulate "
                                          "shows which device overflows)")
    return plan


def _switches(problem: PlanningProblem) -> str:
    micro = (f"up to {max(problem.split_counts)} microbatches{' per stage' if problem.per_stage else ''}"
             if problem.free_sizes else f"{problem.microbatches} equal microbatches")
    return (f"at most {problem.stage_limit} stages, {micro}"
            f"{'' if problem.allow_replication else ', one device per stage'}"
            f"{'' if problem.allow_recompute else ', no recompute'}")


def keep_better(problem: PlanningProblem, result: SolverResult, start: Plan) -> SolverResult:
    """``result``, or ``start`` in its place when it is faster (``feasible``, the bound kept).

    A proved ``optimal`` result is never replaced (its plan is at least as fast).
    """
    verdict = problem.evaluate(start)
    if not verdict.fits or result.status == "optimal":
        return result
    if result.iteration_time is not None and result.iteration_time <= verdict.iteration_time:
        return result
    lower = result.lower_bound
    return replace(result, status="feasible", plan=start, iteration_time=verdict.iteration_time,
                   message=(result.message + "; " if result.message else "")
                   + "the warm-start plan was faster than any this solver found, so it is returned",
                   lower_bound=lower if lower is None or lower <= verdict.iteration_time else None)
