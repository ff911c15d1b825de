"""Planning as a library: a solver over one schedule or several, solvers compared, and why no plan came back.

``pipeplan plan`` and ``pipeplan compare`` are thin layers over :func:`plan` and
:func:`compare` (``pipeplan.plan`` and ``pipeplan.compare`` in Python): this module
decides which problems a request makes (``--schedule auto``: one per schedule, those
the options rule out skipped), runs the solvers, picks the fastest fitting plan, and
says why none came back (:class:`NoPlan`), from the records' typed fields alone.

Examples
--------
>>> from pipeplan.models.graph import load_graph
>>> from pipeplan.solver.formats.cluster import load_cluster
>>> graph, cluster = load_graph("examples/chain8.graph.json"), load_cluster("examples/two-servers.cluster.json")
>>> done = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="auto")
>>> [o.problem.schedule for o in done.outcomes][:3], done.best.problem.schedule in PLANNED_SCHEDULES
(['gpipe', '1f1b', 'interleaved-1f1b'], True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph
from pipeplan.solver.bounds.infeasibility import UNPROVED, memory_bound_verdict
from pipeplan.solver.core.problem import PLANNED_SCHEDULES, VIRTUAL_SCHEDULES, Overflow, PlanningProblem, TooLarge
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import interrupted
from pipeplan.solver.core.warm_start import check_warm_start
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.solvers import Registered, get_solver, solver_names

AUTO = "auto"
"""``schedule="auto"`` (``--schedule auto``): every schedule of :data:`PLANNED_SCHEDULES`."""

DEFAULT_MAX_MICROBATCHES = 8
"""Most microbatches with ``microbatches="auto"`` when no ``max_microbatches`` is given (at most the batch)."""


# --------------------------------------------------------------------------- problems
def schedules_for(schedule: str | Sequence[str]) -> list[str]:
    """The schedules a request names: ``"auto"`` (or ``"all"``) for every one, else the names given, each once.

    Raises
    ------
    ValueError
        For an unknown name, naming the valid ones.

    Examples
    --------
    >>> schedules_for("auto")[-1], schedules_for(["zbv", "1f1b", "zbv"])
    ('zbv', ['zbv', '1f1b'])
    """
    if isinstance(schedule, str):
        names = list(PLANNED_SCHEDULES) if schedule in (AUTO, "all") else [schedule]
    else:
        names = list(schedule)
    unknown = [n for n in names if n not in PLANNED_SCHEDULES]
    if unknown or not names:
        raise ValueError(f"unknown schedule {unknown[0] if unknown else ''!r}; valid: {', '.join(PLANNED_SCHEDULES)}")
    return list(dict.fromkeys(names))


def problem_for(graph: LayerGraph, cluster: Cluster, *, batch: int, microbatches: int | str, schedule: str = "1f1b",
                max_microbatches: int | None = None, **options: Any) -> PlanningProblem:
    """The planning problem of a request: ``microbatches="auto"`` lets split-aware solvers choose the count.

    With ``auto`` the equal split the other solvers use has ``max_microbatches`` (default
    ``min(batch, DEFAULT_MAX_MICROBATCHES)``) microbatches, the most pipelining allowed.

    Parameters
    ----------
    graph, cluster
        The model and the devices.
    batch : int
        Samples per iteration.
    microbatches : int or "auto"
        ``M`` equal microbatches, or ``"auto"``.
    schedule : str
        A name of :data:`PLANNED_SCHEDULES`.
    max_microbatches : int, optional
        ``K`` with ``"auto"``.
    **options
        Further :class:`PlanningProblem` fields (``virtual_stages``, ``per_stage``, ...).

    Raises
    ------
    ValueError
        For numbers the problem refuses (:class:`Overflow` and :class:`TooLarge` among them).
    """
    auto = microbatches == AUTO
    equal = min(batch, max_microbatches or DEFAULT_MAX_MICROBATCHES) if auto else int(microbatches)
    top = max_microbatches if max_microbatches is not None else (equal if auto else None)
    return PlanningProblem(graph, cluster, global_batch=batch, microbatches=equal, schedule=schedule,
                           auto_microbatches=auto, max_microbatches=top, **options)


@dataclass(frozen=True)
class Skipped:
    """A schedule the options rule out, or a solver that refused a problem."""

    schedule: str
    """The schedule."""
    solver: str
    """The solver that refused it, or ``""`` when the options rule the schedule out for every solver."""
    reason: str
    """Why, in one line."""


def problems_for(graph: LayerGraph, cluster: Cluster, schedules: Sequence[str], *, batch: int,
                 microbatches: int | str, virtual_stages: int | None = None,
                 **options: Any) -> tuple[list[PlanningProblem], list[Skipped]]:
    """One problem per schedule; with several, ``virtual_stages`` goes to those that take it, and a
    schedule the options rule out is skipped (said in the second list).

    Raises
    ------
    ValueError
        With one schedule, whatever the problem refuses; with several, when every one is ruled out.
    Overflow, TooLarge
        Numbers beyond what any plan or solver can hold (the graph's or the cluster's fault).
    """
    several = len(schedules) > 1
    problems, skipped = [], []
    for schedule in schedules:
        v = None if several and schedule not in VIRTUAL_SCHEDULES else virtual_stages
        try:
            problems.append(problem_for(graph, cluster, batch=batch, microbatches=microbatches, schedule=schedule,
                                        virtual_stages=v, **options))
        except (Overflow, TooLarge, InputError):
            raise
        except ValueError as exc:
            if not several:
                raise
            skipped.append(Skipped(schedule, "", str(exc)))
    if not problems:
        raise ValueError(f"no schedule of {', '.join(schedules)} can be planned with these options: "
                         + "; ".join(f"{s.schedule}: {s.reason}" for s in skipped))
    return problems, skipped


# --------------------------------------------------------------------------- why no plan
@dataclass(frozen=True)
class NoPlan:
    """Why no plan came back: a proof that none fits, or only that none was found."""

    kind: str
    """``"interrupted"`` (an interrupt came first), ``"proved"`` (no plan fits: the memory bounds or an
    exact solver's search prove it) or ``"not found"`` (none was found, which proves nothing)."""
    constraint: str
    """The tightest memory constraint, in words (:func:`pipeplan.solver.bounds.infeasibility.memory_verdict`)."""
    solvers: tuple[str, ...]
    """The solvers that ran."""
    timed_out: bool
    """Whether a time limit cut a solver short."""
    reasons: tuple[str, ...]
    """The records' own words (``"name: message"``), without the constraint or the note that nothing is proved."""


def why_no_plan(problem: PlanningProblem, results: Sequence[SolverResult]) -> NoPlan:
    """Why ``results`` (on ``problem``, or on its other schedules) hold no plan.

    Proved when the memory bounds rule out every plan (the whole-model bounds only for
    schedules with one stage per device group: they count stages as devices), or when an
    algorithm that proves infeasibility said ``infeasible`` (its record says ``stopped_by:
    proved``).
    """
    names = tuple(r.name for r in results)
    if any(r.stopped_by == "interrupt" for r in results) or not results:
        return NoPlan("interrupted", "", names, False, ())
    verdict = memory_bound_verdict(problem)
    bounds_prove = verdict.proved and (verdict.kind == "layer" or not problem.needs.several_stages)
    reasons = tuple(f"{r.name}: {r.message.replace('; ' + UNPROVED, '')}" for r in results
                    if r.message and verdict.sentence not in r.message)
    proved = bounds_prove or any(r.status == "infeasible" and r.stopped_by == "proved" for r in results)
    timed_out = any(r.stopped_by == "time" or r.details.get("stopped_by_time_limit") is True for r in results)
    return NoPlan("proved" if proved else "not found", verdict.sentence, names, timed_out, reasons)


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Outcome:
    """One solver's result on one problem."""

    problem: PlanningProblem
    """The problem (its schedule among those planned)."""
    result: SolverResult
    """The solver's record."""


@dataclass(frozen=True)
class Planned:
    """What :func:`plan` and :func:`compare` return: every result, the fastest fitting plan, or why none came back.

    Unpacks as ``(plan, record)``: ``plan, record = pipeplan.plan(...)``.
    """

    problems: tuple[PlanningProblem, ...]
    """The problems solved (one per schedule planned)."""
    outcomes: tuple[Outcome, ...]
    """Every result, schedule by schedule, solver by solver, in order."""
    skipped: tuple[Skipped, ...] = ()
    """Schedules the options rule out, and solvers that refused a problem."""
    not_run: str = ""
    """With an interrupt: the first solver that was not run (it and those after it were not)."""

    @property
    def best(self) -> Outcome | None:
        """The outcome with the fastest fitting plan (the first among equals), or ``None``."""
        found = [o for o in self.outcomes if o.result.plan is not None]
        return min(found, key=lambda o: o.result.iteration_time) if found else None

    @property
    def plan(self) -> Plan | None:
        """The fastest fitting plan, or ``None``."""
        return self.best.result.plan if self.best is not None else None

    @property
    def record(self) -> SolverResult | None:
        """The record of the fastest plan's solver; without a plan, the first result (or ``None``)."""
        if self.best is not None:
            return self.best.result
        return self.outcomes[0].result if self.outcomes else None

    @property
    def no_plan(self) -> NoPlan | None:
        """Why no plan came back (``None`` when one did)."""
        if self.best is not None:
            return None
        return why_no_plan(self.problems[0], [o.result for o in self.outcomes])

    def rows(self, with_schedule: bool | None = None) -> list[dict[str, Any]]:
        """One row per result: solver, algorithm, status, time, throughput, ratio to the best (of all),
        bound, gap, wall time, stages, what stopped it, its message, and (``with_schedule``, by default
        with several problems) its schedule."""
        with_schedule = len(self.problems) > 1 if with_schedule is None else with_schedule
        times = [o.result.iteration_time for o in self.outcomes if o.result.iteration_time is not None]
        best = min(times) if times else None
        rows = []
        for o in self.outcomes:
            r, t = o.result, o.result.iteration_time
            row = {"solver": r.name, "algorithm": r.algorithm, "status": r.status, "iteration_time": t,
                   "throughput": o.problem.global_batch / t if t else None,
                   "ratio_to_best": t / best if t and best else None,
                   "lower_bound": r.lower_bound, "gap": r.gap, "wall_time": r.wall_time,
                   "stages": len(r.plan.stages) if r.plan else None, "stopped_by": r.stopped_by,
                   "message": r.message}
            rows.append({**row, "schedule": o.problem.schedule} if with_schedule else row)
        return rows

    def __iter__(self) -> Iterator[Any]:
        return iter((self.plan, self.record))


# --------------------------------------------------------------------------- running
def solve_each(problems: Sequence[PlanningProblem], solvers: Sequence[Registered], *, time_limit: float = 60.0,
               seed: int = 0, budget: float | None = None, warm_start: Plan | None = None,
               skip_refusals: bool = True, on_solve: Callable[[str, str], None] | None = None) -> Planned:
    """Every solver on every problem, in order; an interrupt stops before the next solver.

    Parameters
    ----------
    problems : sequence of PlanningProblem
        One per schedule.
    solvers : sequence of Registered
        From :func:`pipeplan.solver.solvers.get_solver`.
    time_limit, seed, budget, warm_start
        Passed to every solve (:meth:`pipeplan.solver.core.algorithm.Solver.solve`).
    skip_refusals : bool
        Leave out, in :attr:`Planned.skipped`, a solver that refuses a problem; else its
        :class:`InputError` propagates.
    on_solve : callable, optional
        ``on_solve(solver, schedule)`` before each solve (a progress display).
    """
    outcomes, skipped, not_run = [], [], ""
    for problem in problems:
        for solver in solvers:
            if interrupted():
                not_run = not_run or solver.name
                break
            if on_solve is not None:
                on_solve(solver.name, problem.schedule)
            try:
                result = solver.solve(problem, time_limit=time_limit, seed=seed, budget=budget, warm_start=warm_start)
            except InputError as exc:
                if not skip_refusals:
                    raise
                skipped.append(Skipped(problem.schedule, solver.name, exc.what))
                continue
            outcomes.append(Outcome(problem, result))
    return Planned(tuple(problems), tuple(outcomes), tuple(skipped), not_run)


def plan_problems(problems: Sequence[PlanningProblem], solver: str, *, time_limit: float = 60.0, seed: int = 0,
                  budget: float | None = None, warm_start: Plan | None = None,
                  solver_options: Mapping[str, Any] | None = None, skipped: Sequence[Skipped] = (),
                  on_solve: Callable[[str, str], None] | None = None) -> Planned:
    """:func:`plan` on problems already made (:func:`problems_for`); ``skipped`` joins the result's."""
    chosen = get_solver(solver, **dict(solver_options or {}))  # an unknown name fails before any work
    if warm_start is not None:
        if len(problems) > 1:
            raise InputError("-", "--warm-start", "starts one schedule's search; give --schedule NAME with it")
        check_warm_start(warm_start, problems[0], "warm start")
    done = solve_each(problems, [chosen], time_limit=time_limit, seed=seed, budget=budget, warm_start=warm_start,
                      skip_refusals=len(problems) > 1 or bool(skipped), on_solve=on_solve)
    return Planned(done.problems, done.outcomes, (*skipped, *done.skipped), done.not_run)


def plan(graph: LayerGraph, cluster: Cluster, *, batch: int, microbatches: int | str, solver: str = "cpsat",
         schedule: str | Sequence[str] = "1f1b", time_limit: float = 60.0, seed: int = 0,
         budget: float | None = None, warm_start: Plan | None = None,
         solver_options: Mapping[str, Any] | None = None, on_solve: Callable[[str, str], None] | None = None,
         **options: Any) -> Planned:
    """Plan ``graph`` on ``cluster`` with one solver, for one schedule or several (``"auto"``: every one).

    With several schedules the solver plans each one (a schedule the options rule out, or
    the solver refuses, is skipped and said in :attr:`Planned.skipped`) and the fastest
    fitting plan is :attr:`Planned.plan`.

    Parameters
    ----------
    graph, cluster
        The model and the devices.
    batch, microbatches
        As :func:`problem_for` takes them (``microbatches="auto"``: split-aware solvers choose).
    solver : str
        A registered solver (:func:`pipeplan.solver.solvers.solver_names`).
    schedule : str or sequence of str
        A schedule, several, or ``"auto"``.
    time_limit, seed, budget
        As :meth:`pipeplan.solver.core.algorithm.Solver.solve` takes them, per schedule.
    warm_start : Plan, optional
        An earlier plan of the problem (one schedule only), checked against it.
    solver_options : mapping, optional
        Settings of the solver's algorithms (``generations``, ``population``, ``backend``).
    on_solve : callable, optional
        Called before each solve (see :func:`solve_each`).
    **options
        Further problem fields (``virtual_stages``, ``max_microbatches``, ``per_stage``,
        ``allow_replication``, ``allow_recompute``, ``max_stages``, ``state_factor``).

    Returns
    -------
    Planned
        Every result; its ``plan`` and ``record`` (it unpacks as ``(plan, record)``), or its
        ``no_plan`` verdict.

    Raises
    ------
    InputError
        For an unknown solver, a solver that refuses the only schedule, or a warm start
        that is not a plan of the problem.
    ValueError
        For numbers the problem refuses (see :func:`problems_for`).
    """
    problems, skipped = problems_for(graph, cluster, schedules_for(schedule), batch=batch, microbatches=microbatches,
                                     **options)
    return plan_problems(problems, solver, time_limit=time_limit, seed=seed, budget=budget, warm_start=warm_start,
                         solver_options=solver_options, skipped=skipped, on_solve=on_solve)


def compare_problems(problems: Sequence[PlanningProblem], solvers: Sequence[str] | None = None, *,
                     time_limit: float = 60.0, seed: int = 0, budget: float | None = None,
                     solver_options: Mapping[str, Any] | None = None, skipped: Sequence[Skipped] = (),
                     on_solve: Callable[[str, str], None] | None = None) -> Planned:
    """:func:`compare` on problems already made (:func:`problems_for`); ``skipped`` joins the result's."""
    valid = solver_names()
    names = list(solvers) if solvers is not None else \
        [n for n in valid if any(p.schedule in get_solver(n).schedules for p in problems)]
    if not names:
        raise InputError("-", "--solvers", f"names no solver; valid: {', '.join(valid)}")
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise InputError("-", "--solvers", f"unknown solver {unknown[0]!r}; valid: {', '.join(valid)}")
    chosen = [get_solver(n, **dict(solver_options or {})) for n in names]
    done = solve_each(problems, chosen, time_limit=time_limit, seed=seed, budget=budget,
                      skip_refusals=len(problems) > 1 or bool(skipped) or len(chosen) > 1, on_solve=on_solve)
    return Planned(done.problems, done.outcomes, (*skipped, *done.skipped), done.not_run)


def compare(graph: LayerGraph, cluster: Cluster, *, batch: int, microbatches: int | str,
            solvers: Sequence[str] | None = None, schedule: str | Sequence[str] = "1f1b", time_limit: float = 60.0,
            seed: int = 0, budget: float | None = None, solver_options: Mapping[str, Any] | None = None,
            on_solve: Callable[[str, str], None] | None = None, **options: Any) -> Planned:
    """Run several solvers (default: every one that plans one of the schedules) on one schedule or several.

    A solver that refuses a problem is skipped (said in :attr:`Planned.skipped`), unless it is
    the only one on the only schedule.  The arguments are :func:`plan`'s; ``solvers`` names
    the solvers, in the order to run them.

    Raises
    ------
    InputError
        For an empty or unknown solver name (naming the valid ones).
    """
    problems, skipped = problems_for(graph, cluster, schedules_for(schedule), batch=batch, microbatches=microbatches,
                                     **options)
    return compare_problems(problems, solvers, time_limit=time_limit, seed=seed, budget=budget,
                            solver_options=solver_options, skipped=skipped, on_solve=on_solve)


def finite_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows``, refused when a number in one is beyond the float range (JSON, CSV and a table have no infinity).

    The iteration times are finite (the problem's ceiling sees to that); the ratios computed
    from them are not when a time is near 0 (``B / 5e-324``).

    Raises
    ------
    InputError
        Naming the solver, the field and the fix.
    """
    for row in rows:
        for key, value in row.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise InputError("-", f"{row['solver']}: {key}", f"is {value} from the iteration time "
                                                                 f"{row['iteration_time']:g} s: a cost near 1e-308 in "
                                                                 f"the graph or a speed near 1e308 in the cluster "
                                                                 f"makes it overflow; use realistic costs and speeds")
    return rows
