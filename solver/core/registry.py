"""Solver names to solvers: every solver takes one problem and returns one record."""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import replace
from typing import Callable, Protocol

from pipeplan.models.errors import InputError
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import watch
from pipeplan.solver.exact.virtual_search import DEFAULT_SIMULATIONS
from pipeplan.solver.space.virtual_space import empty_space


class Solver(Protocol):
    """What every solver provides."""

    name: str
    """Registry name."""
    source: str
    """Where the method comes from (paper, system), one line."""

    def solve(self, problem: PlanningProblem, *, time_limit: float = 60.0, seed: int = 0,
              budget: float | None = None, warm_start: Plan | None = None) -> SolverResult:
        """Plan ``problem`` within ``time_limit`` seconds and ``budget`` units of work; same seed and budget, same plan."""
        ...


_SOLVERS: dict[str, Callable[[], Solver]] = {}

VERSION1 = ("gpipe", "1f1b")
"""What a solver plans for unless its class says otherwise (``schedules``)."""

ONE_STAGE_PER_DEVICE = ("its method places one stage per device group and has no published form for groups "
                        "holding several stages")
"""Why a solver without a version-2 form refuses a version-2 schedule, unless its class says (``refuses_v2``)."""


def planned_schedules(solver: object) -> tuple[str, ...]:
    """The schedules ``solver`` (an instance or class) plans for (its ``schedules``, else :data:`VERSION1`)."""
    return tuple(getattr(solver, "schedules", VERSION1))


def schedule_refusal(solver: object, schedule: str) -> str:
    """Why ``solver`` refuses ``schedule``, in one line naming the solvers that plan it; ``""`` when it plans it."""
    if schedule in planned_schedules(solver):
        return ""
    why = getattr(solver, "refuses_v2", ONE_STAGE_PER_DEVICE)
    others = [n for n in solver_names() if schedule in planned_schedules(_SOLVERS[n])]
    return f"{getattr(solver, 'name', '?')} does not plan {schedule}: {why}; solvers that do: {', '.join(others)}"

#: Modules that register solvers when imported (a missing one is simply not built yet).
SOLVER_MODULES = ("pipeplan.solver.baselines", "pipeplan.solver.heuristics.group_search", "pipeplan.solver.exact.ilp", "pipeplan.solver.exact.cpsat", "pipeplan.solver.splits.cpsat_split", "pipeplan.solver.heuristics.nsga")


def register(name: str) -> Callable[[Callable[[], Solver]], Callable[[], Solver]]:
    """Class decorator: make a solver available under ``name``."""
    def wrap(factory: Callable[[], Solver]) -> Callable[[], Solver]:
        if name in _SOLVERS:
            raise ValueError(f"solver name {name!r} registered twice")
        _SOLVERS[name] = factory
        solve = getattr(factory, "solve", None)
        if solve is not None and not getattr(solve, "records_stop", False):
            factory.solve = _recording_stop(solve)
        return factory
    return wrap


def _recording_stop(solve: Callable[..., SolverResult]) -> Callable[..., SolverResult]:
    """``solve`` that takes ``budget`` and ``warm_start`` and records why it stopped.

    ``budget`` goes to a solver whose ``solve`` takes one (its unit: the class's
    ``budget_unit``); the others run their whole search and ignore it.  ``warm_start``
    goes to a solver that takes one; for the others the earlier plan is kept when it is
    faster than theirs (:func:`pipeplan.solver.core.warm_start.keep_better`).  The record's
    ``stopped_by`` comes from every clock, budget and interrupt check inside the call
    (:func:`pipeplan.solver.core.termination.watch`).
    """
    takes = inspect.signature(solve).parameters

    @functools.wraps(solve)
    def run(self, problem: PlanningProblem, *, time_limit: float = 60.0, seed: int = 0,
            budget: float | None = None, warm_start: Plan | None = None) -> SolverResult:
        refusal = schedule_refusal(self, problem.schedule)
        if refusal:
            raise InputError("-", "--schedule", refusal)
        empty = empty_space(problem) if problem.is_v2 else ""
        if empty:
            raise InputError("-", "--virtual-stages" if problem.virtual_stages else "--schedule", empty)
        kwargs: dict = {"time_limit": time_limit, "seed": seed}
        if "budget" in takes:
            kwargs["budget"] = budget
        if "warm_start" in takes:
            kwargs["warm_start"] = warm_start
        with watch() as seen:
            result = solve(self, problem, **kwargs)
        if warm_start is not None and "warm_start" not in takes:
            from pipeplan.solver.core.warm_start import keep_better

            result = keep_better(problem, result, warm_start)
        proved = result.status == "optimal" or (result.status == "infeasible" and getattr(self, "proves", False))
        used = budget if "budget" in takes else None
        if used is None and "budget" in takes:
            # a version-2 schedule is searched by simulations (pipeplan.solver.exact.virtual_search), whatever the solver's unit
            used = DEFAULT_SIMULATIONS if problem.is_v2 else getattr(self, "default_budget", None)
        return replace(result, stopped_by=seen.stopped_by(proved), budget=used)

    run.records_stop = True  # type: ignore[attr-defined]
    return run


def _load_all() -> None:
    for module in SOLVER_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def solver_names() -> list[str]:
    """Every registered solver: baselines first, in :data:`SOLVER_MODULES` order, whatever imported them first."""
    _load_all()
    return sorted(_SOLVERS, key=lambda name: _module_rank(_SOLVERS[name]))


def _module_rank(factory: Callable[[], Solver]) -> int:
    module = getattr(factory, "__module__", "")
    ranks = [i for i, prefix in enumerate(SOLVER_MODULES) if module == prefix or module.startswith(prefix + ".")]
    return ranks[0] if ranks else len(SOLVER_MODULES)


def get_solver(name: str) -> Solver:
    """The solver called ``name``.

    Raises
    ------
    InputError
        For an unknown name, listing the valid ones.
    """
    _load_all()
    if name not in _SOLVERS:
        raise InputError("-", "--solver", f"unknown solver {name!r}; valid: {', '.join(solver_names())}")
    return _SOLVERS[name]()
