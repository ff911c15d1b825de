"""Solver names to solvers: every solver takes one problem and returns one record."""

from __future__ import annotations

import importlib
from typing import Callable, Protocol

from pipeplan.models.errors import InputError
from pipeplan.solver.problem import PlanningProblem
from pipeplan.solver.result import SolverResult


class Solver(Protocol):
    """What every solver provides."""

    name: str
    """Registry name."""
    source: str
    """Where the method comes from (paper, system), one line."""

    def solve(self, problem: PlanningProblem, *, time_limit: float = 60.0, seed: int = 0) -> SolverResult:
        """Plan ``problem`` within ``time_limit`` seconds; same seed, same plan."""
        ...


_SOLVERS: dict[str, Callable[[], Solver]] = {}

#: Modules that register solvers when imported (a missing one is simply not built yet).
SOLVER_MODULES = ("pipeplan.solver.baselines", "pipeplan.solver.group_search", "pipeplan.solver.ilp", "pipeplan.solver.cpsat", "pipeplan.solver.cpsat_split", "pipeplan.solver.nsga")


def register(name: str) -> Callable[[Callable[[], Solver]], Callable[[], Solver]]:
    """Class decorator: make a solver available under ``name``."""
    def wrap(factory: Callable[[], Solver]) -> Callable[[], Solver]:
        if name in _SOLVERS:
            raise ValueError(f"solver name {name!r} registered twice")
        _SOLVERS[name] = factory
        return factory
    return wrap


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
