"""The solver contract: what every planning algorithm declares, and the one ``solve`` that runs it.

As in pymoo, the problem (:class:`~pipeplan.solver.core.problem.PlanningProblem`), the
algorithm (a :class:`Solver`) and the stopping rule (:mod:`pipeplan.solver.core.termination`)
are separate objects.  A subclass declares what it is in class attributes (its
:attr:`~Solver.name`, :attr:`~Solver.source`, the :attr:`~Solver.schedules` it plans,
whether it :attr:`~Solver.proves` optimality and infeasibility, its
:attr:`~Solver.budget_unit` and :attr:`~Solver.default_budget`, whether it takes a
:attr:`~Solver.warm_start`) and implements :meth:`Solver.run`.  :meth:`Solver.solve`,
the same for every algorithm, checks the problem, starts the clock and the budget,
runs :meth:`~Solver.run` and records what stopped it, the budget it had and which
algorithm ran.

Examples
--------
>>> class Nothing(Solver):
...     name = "nothing"
...     source = "an example"
...     def run(self, problem, clock, budget, seed, warm_start):
...         return SolverResult(self.name, "timeout-no-solution", None, None, None, clock.elapsed(), seed)
>>> Nothing.schedules, Nothing.proves, Nothing.budget_unit
(('gpipe', '1f1b'), False, None)
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from pipeplan.models.errors import InputError
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import TimeLimit, WorkBudget
from pipeplan.solver.core.warm_start import keep_better
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.schedules.needs import NEEDS
from pipeplan.solver.schedules.schedule import ONE_STAGE_PER_GROUP

SEVERAL_STAGES_PER_GROUP = tuple(name for name, needs in NEEDS.items() if needs.several_stages)
"""The schedules whose device groups hold several stages (interleaved, looped, zero-bubble V)."""


class Solver:
    """A planning algorithm: it takes one problem and returns one :class:`SolverResult`.

    Subclasses set the class attributes below and implement :meth:`run`; they never
    override :meth:`solve`.  Same problem, seed and budget: same plan.
    """

    name: ClassVar[str] = ""
    """The algorithm's name (recorded as the result's ``algorithm``)."""
    source: ClassVar[str] = ""
    """Where the method comes from (paper, system), one line."""
    schedules: ClassVar[tuple[str, ...]] = ONE_STAGE_PER_GROUP
    """The named schedules it plans (a problem with another one is refused); by default those with
    one stage per device group (``gpipe``, ``1f1b``)."""
    proves: ClassVar[bool] = False
    """Whether it proves optimality, and infeasibility (its ``infeasible`` is then a proof)."""
    chooses_splits: ClassVar[bool] = False
    """Whether it chooses microbatch counts and sizes (``--microbatches auto``, ``--per-stage``);
    the others plan the problem's ``M`` equal microbatches."""
    budget_unit: ClassVar[str | None] = None
    """What its work budget counts (``None``: it has none and runs its whole search)."""
    default_budget: float | None = None
    """The budget it runs without ``budget`` (in :attr:`budget_unit`); ``None`` without a unit."""
    warm_start: ClassVar[bool] = False
    """Whether :meth:`run` takes a warm start (others: the earlier plan is kept when faster)."""
    settings: ClassVar[tuple[str, ...]] = ()
    """Settings of the instance a caller may change (``pipeplan plan --generations``, ``--backend``)."""

    def solve(self, problem: PlanningProblem, *, time_limit: float = 60.0, seed: int = 0,
              budget: float | None = None, warm_start: Plan | None = None,
              within: TimeLimit | None = None) -> SolverResult:
        """Plan ``problem`` within ``time_limit`` seconds and ``budget`` units of work.

        Parameters
        ----------
        problem : PlanningProblem
            What to plan.
        time_limit : float
            Wall-clock seconds, a cap: a solve it cuts short records ``stopped_by: time``.
        seed : int
            Seed of a randomised search (same seed and budget, same plan).
        budget : float, optional
            Work in :attr:`budget_unit` (default :attr:`default_budget`); ignored by an
            algorithm without a unit.
        warm_start : Plan, optional
            An earlier fitting plan of the problem: given to :meth:`run` when the algorithm
            takes one, else returned in place of the algorithm's plan when faster.
        within : TimeLimit, optional
            The clock of a solve that runs this one as a part of its own: what cuts this
            one short is noted in that solve's record too.

        Returns
        -------
        SolverResult
            With ``stopped_by``, ``budget`` and ``algorithm`` recorded here.

        Raises
        ------
        InputError
            When the algorithm does not plan the problem (:meth:`check`).
        """
        self.check(problem)
        clock = within.nested(time_limit) if within is not None else TimeLimit(time_limit)
        work = None
        if self.budget_unit is not None:
            work = WorkBudget(budget if budget is not None else self.default_budget, stops=clock.stops)
        result = self.run(problem, clock, work, seed, warm_start if self.warm_start else None)
        if warm_start is not None and not self.warm_start:
            result = keep_better(problem, result, warm_start)
        proved = result.status == "optimal" or (result.status == "infeasible" and self.proves)
        return replace(result, stopped_by=clock.stops.stopped_by(proved), budget=None if work is None else work.units,
                       algorithm=self.name,
                       plan_by=(result.plan_by or self.name) if result.plan is not None else "",
                       bound_by=(result.bound_by or self.name) if result.lower_bound is not None else "")

    def check(self, problem: PlanningProblem) -> None:
        """Refuse a problem this algorithm does not plan, in one line.

        Raises
        ------
        InputError
            For a schedule outside :attr:`schedules`.
        """
        if problem.schedule not in self.schedules:
            raise InputError("-", "--schedule", f"{self.name} does not plan {problem.schedule}: it plans "
                                                f"{', '.join(self.schedules)}")

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """The algorithm itself: plan ``problem`` until ``clock`` or ``budget`` stops it.

        Parameters
        ----------
        problem : PlanningProblem
            A problem :meth:`check` accepted.
        clock : TimeLimit
            Started; what cuts the search short is noted in ``clock.stops`` (pass it, or a
            clock made from it, to every part of the search).
        budget : WorkBudget or None
            In :attr:`budget_unit`; ``None`` for an algorithm without one.
        seed : int
            The seed.
        warm_start : Plan or None
            An earlier plan, for an algorithm that takes one (:attr:`warm_start`).
        """
        raise NotImplementedError
