"""The registered solvers: every name ``pipeplan plan --solver`` takes, and the algorithm it runs on each search space.

:data:`SOLVERS` is the one table, in listing order (the order ``pipeplan compare`` runs
them): for each name, the algorithm (a :class:`~pipeplan.solver.core.algorithm.Solver`)
that plans each search space of :data:`pipeplan.solver.core.problem.SPACES`.  A name
without an algorithm for a problem's space refuses it in one line that names the
solvers that do plan it.  The result's ``name`` is the registered name; its
``algorithm`` says what ran (``cpsat`` on ``zbv`` runs ``virtual-bnb``).

Examples
--------
>>> get_solver("cpsat").algorithms[VIRTUAL].name
'virtual-bnb'
>>> solver_names()[:3]
['even', 'megatron', 'deepspeed-uniform']
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from pipeplan.models.errors import InputError
from pipeplan.solver import portfolio
from pipeplan.solver.baselines.alpa import Alpa
from pipeplan.solver.baselines.autopipe import AutoPipe
from pipeplan.solver.baselines.dapple import Dapple
from pipeplan.solver.baselines.deepspeed import DeepSpeedParameters, DeepSpeedUniform
from pipeplan.solver.baselines.even import EvenSplit
from pipeplan.solver.baselines.greedy_speed import GreedySpeed
from pipeplan.solver.baselines.interleaved import InterleavedForm
from pipeplan.solver.baselines.megatron import Megatron
from pipeplan.solver.baselines.pipedream import PipeDream
from pipeplan.solver.baselines.piper import Piper
from pipeplan.solver.baselines.slicing import AutoPipeSlicing
from pipeplan.solver.baselines.umpipe import UmpipeDP, UmpipeLocal
from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.problem import PIPELINES, SPACES, SPLITS, VIRTUAL, PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import TimeLimit
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.heuristics.group_search import GroupSearch
from pipeplan.solver.heuristics.tensor_search import solve_tensor_parallel
from pipeplan.solver.heuristics.virtual_groups import VirtualGroupSearch
from pipeplan.solver.heuristics.virtual_nsga import VirtualNsga
from pipeplan.solver.schedules.needs import NEEDS

Factory = Callable[[], Solver]


def _one_stage(factory: Factory) -> dict[str, Factory]:
    """An algorithm for one stage per device group, equal splits or not (it plans ``M`` equal microbatches)."""
    return {PIPELINES: factory, SPLITS: factory}


def _interleaved(cls: type) -> dict[str, Factory]:
    """A baseline and its published interleaved form."""
    return {**_one_stage(cls), VIRTUAL: lambda: InterleavedForm(cls())}


SOLVERS: dict[str, dict[str, Factory]] = {
    "even": _interleaved(EvenSplit),
    "megatron": _interleaved(Megatron),
    "deepspeed-uniform": _interleaved(DeepSpeedUniform),
    "deepspeed-parameters": _interleaved(DeepSpeedParameters),
    "greedy-speed": _one_stage(GreedySpeed),
    "autopipe": _one_stage(AutoPipe),
    "pipedream": _one_stage(PipeDream),
    "dapple": _one_stage(Dapple),
    "piper": _one_stage(Piper),
    "alpa": _one_stage(Alpa),
    "umpipe-local": _one_stage(UmpipeLocal),
    "umpipe-dp": _one_stage(UmpipeDP),
    "autopipe-slicing": _one_stage(AutoPipeSlicing),
    "group-search": {**_one_stage(GroupSearch), VIRTUAL: VirtualGroupSearch},
    "ilp": {PIPELINES: portfolio.ilp, VIRTUAL: portfolio.virtual_bnb},
    "cpsat": {PIPELINES: portfolio.cpsat, SPLITS: portfolio.cpsat_joint, VIRTUAL: portfolio.virtual_bnb_cpsat},
    "virtual-bnb": {VIRTUAL: portfolio.virtual_bnb},
    "cpsat-split": _one_stage(portfolio.cpsat_split),
    "nsga": {**_one_stage(portfolio.nsga), VIRTUAL: VirtualNsga},
}
"""Registered name -> search space -> the algorithm that plans it, in listing order."""

ONE_STAGE_PER_DEVICE = ("its method places one stage per device group and has no published form for groups "
                        "holding several stages")
"""Why a solver without an algorithm for several stages per group refuses such a schedule."""

SEVERAL_STAGES_ONLY = ("it searches plans whose device groups hold several stages (the interleaved, looped and "
                       "zero-bubble V schedules) only")
"""Why a solver with an algorithm for several stages per group only refuses ``gpipe`` and ``1f1b``."""


class Registered:
    """A registered solver: one name, the algorithm of each search space it plans (:data:`SOLVERS`).

    :meth:`solve` runs the algorithm of the problem's space and records the registered name.
    """

    def __init__(self, name: str, algorithms: dict[str, Solver]) -> None:
        self.name = name
        """The registered name (``pipeplan plan --solver NAME``)."""
        self.algorithms = algorithms
        """Search space -> the algorithm that plans it."""

    @property
    def source(self) -> str:
        """Where the methods come from: each algorithm's source, in the order of :data:`SPACES`."""
        return "; ".join(dict.fromkeys(self.algorithms[s].source for s in SPACES if s in self.algorithms))

    @property
    def schedules(self) -> tuple[str, ...]:
        """Every named schedule one of its algorithms plans."""
        return tuple(dict.fromkeys(s for algorithm in self.algorithms.values() for s in algorithm.schedules))

    def algorithm(self, problem: PlanningProblem) -> Solver:
        """The algorithm that plans ``problem``'s search space.

        Raises
        ------
        InputError
            When no algorithm of this solver plans it, naming the solvers that do.
        """
        found = self.algorithms.get(problem.space)
        if found is not None:
            return found
        if problem.space == SPLITS:
            choosers = [n for n, spaces in SOLVERS.items() if SPLITS in spaces and spaces[SPLITS]().chooses_splits]
            raise InputError("-", "--solver", f"{self.name} plans M equal microbatches only; for --microbatches auto "
                                              f"or --per-stage use a solver that chooses the splits: "
                                              f"{', '.join(choosers)}")
        raise InputError("-", "--schedule", schedule_refusal(self.name, problem.schedule))

    def solve(self, problem: PlanningProblem, *, time_limit: float = 60.0, seed: int = 0,
              budget: float | None = None, warm_start: Plan | None = None,
              within: TimeLimit | None = None) -> SolverResult:
        """The algorithm of ``problem``'s space, solving it (see :meth:`pipeplan.solver.core.algorithm.Solver.solve`);
        the record carries the registered name, and the algorithm's in ``algorithm``.

        When the problem leaves the tensor-parallel degrees or the ZeRO levels to the solver
        (:attr:`PlanningProblem.tensor_search`), the algorithm runs once per degree and state
        hint and the plans are mapped back and timed exactly
        (:func:`pipeplan.solver.heuristics.tensor_search.solve_tensor_parallel`)."""
        algorithm = self.algorithm(problem)
        if problem.tensor_search:
            result = solve_tensor_parallel(algorithm.solve, problem, time_limit=time_limit, seed=seed, budget=budget,
                                           warm_start=warm_start, within=within, proves=algorithm.proves)
        else:
            result = algorithm.solve(problem, time_limit=time_limit, seed=seed, budget=budget,
                                     warm_start=warm_start, within=within)
        return replace(result, name=self.name)


def schedule_refusal(name: str, schedule: str) -> str:
    """Why solver ``name`` refuses ``schedule``, in one line naming the solvers that plan it; ``""`` when it plans it."""
    if schedule in get_solver(name).schedules:
        return ""
    others = [n for n in SOLVERS if schedule in get_solver(n).schedules]
    needs = NEEDS.get(schedule)
    why = SEVERAL_STAGES_ONLY if needs is not None and not needs.several_stages else ONE_STAGE_PER_DEVICE
    return f"{name} does not plan {schedule}: {why}; solvers that do: {', '.join(others)}"


def solver_names() -> list[str]:
    """Every registered solver, in listing order (:data:`SOLVERS`)."""
    return list(SOLVERS)


def get_solver(name: str, **options: Any) -> Registered:
    """The solver called ``name``, its algorithms built afresh.

    Parameters
    ----------
    name : str
        A registered name (:func:`solver_names`).
    **options
        Settings for the algorithms that declare them (:attr:`pipeplan.solver.core.algorithm.Solver.settings`:
        ``generations``, ``population``, ``backend``); the others ignore them.

    Raises
    ------
    InputError
        For an unknown name, listing the valid ones.
    """
    if name not in SOLVERS:
        raise InputError("-", "--solver", f"unknown solver {name!r}; valid: {', '.join(solver_names())}")
    algorithms = {space: factory() for space, factory in SOLVERS[name].items()}
    for algorithm in algorithms.values():
        for key, value in options.items():
            if key in algorithm.settings and value is not None:
                setattr(algorithm, key, value)
    return Registered(name, algorithms)
