"""Running CP-SAT under pipeplan's stopping rules (:mod:`pipeplan.solver.core.termination`).

CP-SAT's ``max_deterministic_time`` is its own work count: with a fixed number of
workers and seed, a solve ended by it returns the same answer on any machine, while one
ended by ``max_time_in_seconds`` does not.  :func:`solve_counted` takes the first from a
:class:`~pipeplan.solver.core.termination.WorkBudget` (and spends what the solve used), keeps
the second as the cap, stops the search at an interrupt, and notes in the solve's record
(:class:`~pipeplan.solver.core.termination.Stops`) which of them ended it.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from pipeplan.solver.core.termination import Stops, WorkBudget, interrupted, on_interrupt

NOT_CUT = (cp_model.OPTIMAL, cp_model.INFEASIBLE, cp_model.MODEL_INVALID)
"""Statuses of a solve that ran to its end (nothing stopped it)."""


def solve_counted(solver: cp_model.CpSolver, model: cp_model.CpModel, *, time_limit: float,
                  budget: WorkBudget | None = None, stops: Stops | None = None) -> int:
    """``solver.solve(model)`` within ``time_limit`` seconds and what is left of ``budget`` (deterministic seconds).

    Parameters
    ----------
    solver : CpSolver
        Its other parameters (workers, seed, strategy) set by the caller.
    model : CpModel
        The model.
    time_limit : float
        The wall-clock cap (at least 0.01 s is given).
    budget : WorkBudget, optional
        Deterministic seconds; what the solve used is spent from it.
    stops : Stops, optional
        Where what ended the solve is noted (the solve's record; default: the budget's, else none).

    Returns
    -------
    int
        CP-SAT's status code.
    """
    solver.parameters.max_time_in_seconds = 0.0 if interrupted() else max(time_limit, 0.01)
    solver.parameters.catch_sigint_signal = False  # interruptible() takes SIGINT; with CP-SAT's own handler the process died of it
    if budget is not None:
        solver.parameters.max_deterministic_time = max(budget.left(), 1e-6)
    with on_interrupt(solver.stop_search):
        code = solver.solve(model)
    used = solver.deterministic_time
    if budget is not None:
        budget.spend(min(used, budget.left()))
    stops = stops if stops is not None else budget.stops if budget is not None else Stops()
    if code not in NOT_CUT:
        if interrupted():
            stops.note("interrupt")
        elif budget is not None and budget.left() <= 1e-6 * max(1.0, budget.units):
            stops.note("budget")
        else:
            stops.note("time")
    return code
