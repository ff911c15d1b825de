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
from pipeplan.solver.core.problem import PlanningProblem, tensor_degrees
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.core.result import SolverResult


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
    elif plan.tensor_parallel_uses():
        raise InputError(where, "stages", f"{plan.tensor_parallel_uses()[0]}, but a solver's warm start takes only "
                                          f"tensor_parallel 1 and zero 0 unless --tensor-parallel or --zero lets "
                                          f"the solver choose them (docs/solvers.md); give those options or a plan "
                                          f"without them")
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


def outside_options(plan: Plan, cluster: Cluster, mode: str, most: int, zero: str, max_zero: int) -> str:
    """Why ``plan``'s degrees or ZeRO levels lie outside the options (``--tensor-parallel mode``, ``--max-tensor-parallel
    most``, ``--zero zero``, ``--max-zero max_zero``), in words; ``""`` when they lie inside.

    Examples
    --------
    >>> from pipeplan.solver.formats.cluster import load_cluster
    >>> plan, cluster = load_plan("examples/tp.plan.json"), load_cluster("examples/tp.cluster.json")
    >>> outside_options(plan, cluster, "1", 8, "0", 2)
    'stage 0 has tensor_parallel 2, but --tensor-parallel 1 allows only 1'
    >>> outside_options(plan, cluster, "per-stage", 8, "auto", 2)
    ''
    """
    degrees = [st.tensor_parallel for st in plan.stages]
    allowed = set(tensor_degrees(cluster, most)) if mode != "1" else {1}
    for s, t in enumerate(degrees):
        if t not in allowed:
            return (f"stage {s} has tensor_parallel {t}, but --tensor-parallel {mode}"
                    + (f" --max-tensor-parallel {most} allows {', '.join(map(str, sorted(allowed)))}"
                       if mode != "1" else " allows only 1"))
    if mode == "uniform" and len(set(degrees)) > 1:
        return f"its stages have degrees {', '.join(map(str, sorted(set(degrees))))}, but --tensor-parallel uniform " \
               f"gives every stage one"
    for s in range(len(plan.stages)):
        z = plan.stage_zero(s)
        if zero == "auto" and z > max_zero:
            return f"stage {s} has zero {z}, above --max-zero {max_zero}"
        if zero != "auto" and z != int(zero):
            return f"stage {s} has zero {z}, but --zero {zero} gives every stage {zero}"
    return ""
