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
>>> [o.schedule for o in done.outcomes][:3], done.outcomes[-1].schedule, done.plan.schedule
(['gpipe', '1f1b', 'interleaved-1f1b'], 'adaptive', 'custom')
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

from pipeplan.models.errors import DeadlockError, InputError
from pipeplan.models.graph import LayerGraph
from pipeplan.solver.bounds.infeasibility import UNPROVED, memory_bound_verdict
from pipeplan.solver.core.problem import PLANNED_SCHEDULES, VIRTUAL_SCHEDULES, Overflow, PlanningProblem, TooLarge
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.schedule_synthesis import DEFAULT_EVALUATIONS, DEFAULT_WORK, search_partitions, synthesize_plan
from pipeplan.solver.core.termination import interrupted
from pipeplan.solver.core.warm_start import check_warm_start
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.solvers import Registered, get_solver, solver_names

AUTO = "auto"
"""``schedule="auto"`` (``--schedule auto``): every schedule of :data:`COVERED`."""

ADAPTIVE = "adaptive"
"""``schedule="adaptive"``: partitions searched with programs synthesized for each (:func:`plan_adaptive`);
its plans are ``custom`` plans."""

COVERED = PLANNED_SCHEDULES + (ADAPTIVE,)
"""Every schedule a request may name: the named schedules and :data:`ADAPTIVE`."""

DEFAULT_MAX_MICROBATCHES = 8
"""Most microbatches with ``microbatches="auto"`` when no ``max_microbatches`` is given (at most the batch)."""


# --------------------------------------------------------------------------- problems
def schedules_for(schedule: str | Sequence[str]) -> list[str]:
    """The schedules a request names: ``"auto"`` (or ``"all"``) for every one of :data:`COVERED`, else the
    names given, each once.

    Raises
    ------
    ValueError
        For an unknown name, naming the valid ones.

    Examples
    --------
    >>> schedules_for("auto")[-2:], schedules_for(["zbv", "1f1b", "zbv"])
    (['zbv', 'adaptive'], ['zbv', '1f1b'])
    """
    if isinstance(schedule, str):
        names = list(COVERED) if schedule in (AUTO, "all") else [schedule]
    else:
        names = list(schedule)
    unknown = [n for n in names if n not in COVERED]
    if unknown or not names:
        raise ValueError(f"unknown schedule {unknown[0] if unknown else ''!r}; valid: {', '.join(COVERED)}")
    return list(dict.fromkeys(names))


def with_memory_fraction(cluster: Cluster, fraction: float) -> Cluster:
    """``cluster`` with every device's memory times ``fraction`` (``--memory-fraction``), the same names otherwise.

    A plan made on it is a plan of ``cluster`` too (the same devices, the same speeds and
    links), with every group's peak within ``fraction`` of its memory.

    Raises
    ------
    ValueError
        For a fraction outside ``(0, 1]``.

    Examples
    --------
    >>> from pipeplan.solver.formats.cluster import load_cluster
    >>> c = load_cluster("examples/two-servers.cluster.json")
    >>> with_memory_fraction(c, 0.5).devices[0].memory == c.devices[0].memory / 2
    True
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"memory fraction must be in (0, 1] (a share of each device's memory), got {fraction}")
    if fraction == 1.0:
        return cluster
    return replace(cluster, devices=tuple(replace(d, memory=d.memory * fraction) for d in cluster.devices))


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


ADAPTIVE_TENSOR = ("adaptive synthesizes programs for partitions of degree-1 plans and does not choose "
                   "tensor-parallel degrees or ZeRO levels; give a named schedule, or --tensor-parallel 1 --zero 0")
"""Why :data:`ADAPTIVE` is skipped when the degrees or ZeRO levels are decisions."""


def _tensor_search(options: Mapping[str, Any]) -> bool:
    """Whether the problem options leave the tensor-parallel degrees or ZeRO levels to the solvers."""
    return options.get("tensor_parallel", "1") != "1" or options.get("zero", "0") != "0"


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
                 microbatches: int | str, virtual_stages: int | None = None, memory_fraction: float = 1.0,
                 **options: Any) -> tuple[list[PlanningProblem], list[Skipped]]:
    """One problem per named schedule; with several, ``virtual_stages`` goes to those that take it, and a
    schedule the options rule out is skipped (said in the second list).

    :data:`ADAPTIVE` is no problem of its own: it adds one problem per named schedule (its
    seeds, :func:`plan_adaptive`).  ``memory_fraction`` caps every device's memory at that
    share of it (:func:`with_memory_fraction`) in every problem.

    Raises
    ------
    ValueError
        With one schedule, whatever the problem refuses; with several, when every one is ruled out.
    Overflow, TooLarge
        Numbers beyond what any plan or solver can hold (the graph's or the cluster's fault).
    """
    cluster = with_memory_fraction(cluster, memory_fraction)
    named = [s for s in schedules if s != ADAPTIVE]
    problems, skipped = [], []
    if ADAPTIVE in schedules and _tensor_search(options):
        if not named:
            raise ValueError(ADAPTIVE_TENSOR)
        skipped.append(Skipped(ADAPTIVE, "", ADAPTIVE_TENSOR))
    elif ADAPTIVE in schedules:
        named += [s for s in PLANNED_SCHEDULES if s not in named]
    several = len(named) > 1
    for schedule in named:
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
    bounds_prove = verdict.proved and (verdict.kind == "layer" or not problem.needs.several_stages) and \
        not problem.tensor_search  # the memory bounds count degree 1 and the whole state on every replica
    reasons = tuple(f"{r.name}: {r.message.replace('; ' + UNPROVED, '')}" for r in results
                    if r.message and verdict.sentence not in r.message)
    proved = bounds_prove or any(r.status == "infeasible" and r.stopped_by == "proved" for r in results)
    timed_out = any(r.stopped_by == "time" or r.details.get("stopped_by_time_limit") is True for r in results)
    constraint = verdict.sentence
    if problem.tensor_search and constraint:  # the memory bounds' words are about degree 1 and the whole state
        constraint = f"at tensor-parallel degree 1 without ZeRO, {constraint}"
    return NoPlan("proved" if proved else "not found", constraint, names, timed_out, reasons)


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Outcome:
    """One solver's result on one problem."""

    problem: PlanningProblem
    """The problem (its schedule among those planned); for :data:`ADAPTIVE`, the problem of the schedule
    whose plan the partition search started from."""
    result: SolverResult
    """The solver's record."""
    label: str = ""
    """The schedule planned, when not the problem's (:data:`ADAPTIVE`)."""

    @property
    def schedule(self) -> str:
        """The schedule planned: :attr:`label`, else the problem's."""
        return self.label or self.problem.schedule


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
            rows.append({**row, "schedule": o.schedule} if with_schedule else row)
        return rows

    def __iter__(self) -> Iterator[Any]:
        return iter((self.plan, self.record))


# --------------------------------------------------------------------------- running
def solve_each(problems: Sequence[PlanningProblem], solvers: Sequence[Registered], *, time_limit: float = 60.0,
               seed: int = 0, budget: float | None = None, warm_start: Plan | None = None,
               skip_refusals: bool = True, on_solve: Callable[[str, str], None] | None = None) -> Planned:
    """Every solver on every problem, in order; an interrupt stops before the next solver.

    With several problems, a schedule whose stages per group are left to the search
    (``virtual_stages`` ``None``) is solved with one stage per group too, and the faster
    plan kept (:func:`_with_one_stage_per_group`).  Each solver's result on each schedule
    is then compared with its
    plans for the other schedules relabelled to this one (:func:`relabelled`: a 1F1B
    plan's partition is a ZB1P plan, ``interleaved-zb`` with one stage per group), and the
    faster kept (:func:`keep_relabelled`).  Every solve is the one the schedule alone
    gets (same problem, time limit, budget and seed), so each schedule's result is never
    slower than that solve's, and a version-2 result never slower than a version-1 plan's
    partition it can hold.

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
            if len(problems) > 1:
                result = _with_one_stage_per_group(solver, problem, result, time_limit=time_limit, seed=seed,
                                                   budget=budget)
            outcomes.append(Outcome(problem, result))
    if len(problems) > 1:
        outcomes = [Outcome(o.problem, keep_relabelled(o.problem, o.result,
                                                       [(p.problem.schedule, p.result.plan) for p in outcomes
                                                        if p.result.name == o.result.name and p is not o
                                                        and p.result.plan is not None]))
                    for o in outcomes]
    return Planned(tuple(problems), tuple(outcomes), tuple(skipped), not_run)


def _with_one_stage_per_group(solver: Registered, problem: PlanningProblem, result: SolverResult, *,
                              time_limit: float, seed: int, budget: float | None) -> SolverResult:
    """``result``, or the plan of the same solve with ``virtual_stages=1`` when that one is faster.

    A search over every ``v`` can miss the best plan with one stage per group, which the
    one-``v`` search finds.  An algorithm whose search over every ``v`` starts from its own
    ``v = 1`` solve (``solves_one_stage_per_group``: ``virtual-bnb``, which ``cpsat`` and ``ilp``
    run) is left alone; for the others (the heuristics, the baselines' interleaved forms)
    the ``v = 1`` solve runs here.  The record keeps its bound, says ``feasible`` and adds
    both solves' wall times.
    """
    if problem.schedule not in VIRTUAL_SCHEDULES or problem.virtual_stages is not None or \
            result.status == "optimal" or interrupted():
        return result
    if getattr(solver.algorithm(problem), "solves_one_stage_per_group", False):
        return result  # its search started from its own v = 1 solve (cpsat, ilp: virtual-bnb)
    try:
        one = replace(problem, virtual_stages=1)
        found = solver.solve(one, time_limit=time_limit, seed=seed, budget=budget)
    except (InputError, ValueError):
        return result
    wall = result.wall_time + found.wall_time
    if found.plan is None or (result.plan is not None and result.iteration_time <= found.iteration_time):
        return replace(result, wall_time=wall)
    lower = result.lower_bound
    return replace(result, status="feasible", plan=found.plan, iteration_time=found.iteration_time, wall_time=wall,
                   plan_by=f"{found.plan_by or found.algorithm} (v=1)",
                   stopped_by=found.stopped_by if found.stopped_by in ("time", "interrupt") else result.stopped_by,
                   message=(result.message + "; " if result.message else "")
                   + f"the search with one stage per group (v=1) found a faster {problem.schedule} plan, so it is "
                     f"returned",
                   lower_bound=lower if lower is None or lower <= found.iteration_time else None)


def relabelled(plan: Plan, problem: PlanningProblem) -> Plan | None:
    """``plan``'s partition as a plan of ``problem``'s schedule, or ``None`` where it is none.

    The stages, devices, splits and recompute flags are kept and the schedule renamed: a
    ``1f1b`` plan is an ``interleaved-zb`` (ZB1P) or ``interleaved-1f1b`` plan with one
    stage per group, an ``interleaved-1f1b`` plan an ``interleaved-zb`` one.  It must hold
    the stages per group the problem asks (``virtual_stages``, the schedule's own), lie in
    the problem's search space, pass the plan checks and fit in memory.

    Examples
    --------
    >>> from pipeplan.models.graph import load_graph
    >>> from pipeplan.solver.formats.cluster import load_cluster
    >>> graph, cluster = load_graph("examples/chain8.graph.json"), load_cluster("examples/two-servers.cluster.json")
    >>> one = problem_for(graph, cluster, batch=8, microbatches=4, schedule="1f1b")
    >>> zb = problem_for(graph, cluster, batch=8, microbatches=4, schedule="interleaved-zb")
    >>> made = one.make_plan([(0, 4), (4, 8)], [("g0",), ("g1",)])
    >>> relabelled(made, zb).schedule
    'interleaved-zb'
    """
    if plan.schedule == problem.schedule or plan.schedule_class.from_plan:
        return None
    made = replace(plan, schedule=problem.schedule, custom_programs=None, extra={})
    per_group = set(Counter(made.stage_groups).values())
    want = problem.virtual_stages if problem.virtual_stages is not None else problem.needs.stages_per_group
    if len(per_group) != 1 or (want is not None and per_group != {want}):
        return None
    inside = problem.in_split_space(made) if problem.free_sizes else problem.in_search_space(made)
    if not inside:
        return None
    try:
        verdict = simulate(made, problem.graph, problem.cluster)
    except (InputError, DeadlockError, ValueError):
        return None
    return made if verdict.fits else None


def keep_relabelled(problem: PlanningProblem, result: SolverResult,
                    others: Sequence[tuple[str, Plan]]) -> SolverResult:
    """``result``, or the fastest of ``others`` relabelled to ``problem``'s schedule when faster than its plan.

    A proved ``optimal`` result is kept (nothing in its space is faster).  The record then
    says ``feasible``, keeps the bound and tells where the plan came from.
    """
    if result.status == "optimal":
        return result
    best: tuple[float, str, Plan] | None = None
    for schedule, plan in others:
        made = relabelled(plan, problem)
        if made is None:
            continue
        t = simulate(made, problem.graph, problem.cluster, validate=False).iteration_time
        if best is None or t < best[0]:
            best = (t, schedule, made)
    if best is None or (result.iteration_time is not None and result.iteration_time <= best[0]):
        return result
    t, schedule, made = best
    lower = result.lower_bound
    return replace(result, status="feasible", plan=made, iteration_time=t,
                   plan_by=f"{schedule} plan relabelled",
                   message=(result.message + "; " if result.message else "")
                   + f"its {schedule} plan's partition, relabelled {problem.schedule}, was faster than any "
                     f"{problem.schedule} plan found, so it is returned",
                   lower_bound=lower if lower is None or lower <= t else None)


# --------------------------------------------------------------------------- adaptive
POLISH_SHARE = 0.5
"""Share of the time limit the partition walk leaves to the exact order polish (a cap on each, not their
budgets: the walk's is ``evaluations``, the polish's ``work``).  The walk may use the rest; when it ends
sooner, the polish gets all that is left.  Half: a walk cut by the clock still hands over its best
partition, while a polish cut before it starts proves nothing, and the two took wall times of the same
order on the README's ``--schedule auto`` example (gpt-tiny on two-servers, batch 32 in 8, ``cpsat``:
19 partitions synthesized in 3.0 s, the proof in 1.4 s, on the shared 2-core machine, 2026-12-02)."""


@dataclass(frozen=True)
class AdaptiveOptions:
    """How :data:`ADAPTIVE` searches (``pipeplan plan --schedule adaptive``)."""

    evaluations: int = DEFAULT_EVALUATIONS
    """Most partitions the list scheduler builds programs for (the counted work of the partition search)."""
    work: float = DEFAULT_WORK
    """CP-SAT deterministic seconds of the exact order model on the final partition."""
    exact: bool = True
    """Polish the final partition's programs with the exact order model."""
    memory_fraction: float = 1.0
    """The share of each device's memory the plans may use, as recorded (:func:`plan` sets it from its
    ``memory_fraction``; the problems' clusters hold the caps)."""

    def __post_init__(self) -> None:
        if self.evaluations < 1:
            raise ValueError(f"adaptive evaluations must be at least 1, got {self.evaluations}")
        if not 0 < self.work < math.inf:
            raise ValueError(f"order work must be positive finite deterministic seconds, got {self.work}")


def plan_adaptive(outcomes: Sequence[Outcome], solver: str, *, time_limit: float, seed: int,
                  options: AdaptiveOptions = AdaptiveOptions()) -> Outcome | None:
    """:data:`ADAPTIVE` for one solver: partitions searched with synthesized programs, from its plans.

    The seeds are ``solver``'s plans for the named schedules (``outcomes``, each the
    solve the schedule alone gets).  Every seed partition gets list-scheduled programs,
    then a walk moves stage boundaries, recompute flags and groups' devices while the synthesized time
    falls (:func:`~pipeplan.solver.core.schedule_synthesis.search_partitions`, at most
    ``options.evaluations`` partitions), and the fastest partition's programs are polished
    by the exact order model (``options.work`` deterministic seconds;
    :func:`~pipeplan.solver.core.schedule_synthesis.synthesize_plan`).
    The synthesizer tries every fixed schedule's programs on a partition too, so the plan
    is never slower than any seed that fits.

    Each phase has its own counted budget; ``time_limit`` caps them, split explicitly: the
    walk stops at ``(1 - POLISH_SHARE) * time_limit``, and the polish may use what is left,
    at least ``POLISH_SHARE * time_limit`` (:data:`POLISH_SHARE`), so a tight limit still
    polishes.  ``details["phases"]`` lists each phase (the seeds' solves, the walk, the
    polish) with its unit, budget, work used, time cap, wall and CPU seconds and what
    stopped it.

    Returns
    -------
    Outcome or None
        Labelled :data:`ADAPTIVE`, its plan a ``custom`` plan; its status is ``feasible``
        (no partition is proved best), and its ``details["synthesis"]`` say which
        synthesizer built the programs and whether their order is proved optimal *for
        that partition*.  ``None`` when ``solver`` ran on no schedule.
    """
    mine = [o for o in outcomes if o.result.name == solver]
    if not mine:
        return None
    clock, cpu = time.perf_counter(), time.process_time()
    spent = sum(o.result.wall_time for o in mine)
    first = mine[0].problem
    seeds = sorted(((o.problem.schedule, o.result.plan, o.result.iteration_time, i) for i, o in enumerate(mine)
                    if o.result.plan is not None), key=lambda x: (x[2], x[3]))
    limit = max(0.0, time_limit)
    deadline = clock + limit
    walk_cap = limit * (1 - POLISH_SHARE) if options.exact else limit
    found = search_partitions([(sch, plan) for sch, plan, _, _ in seeds], first.graph, first.cluster,
                              evaluations=options.evaluations, allow_recompute=first.allow_recompute,
                              deadline=clock + walk_cap)
    walk = {"phase": "partition walk", "unit": "partitions synthesized", "budget": options.evaluations,
            "used": found.evaluations, "time_cap": walk_cap, "wall_time": time.perf_counter() - clock,
            "cpu_time": time.process_time() - cpu, "stopped_by": found.stopped_by}
    phases = [{"phase": "seeds", "unit": None, "budget": None, "used": len(mine), "time_cap": None,
               "wall_time": spent, "cpu_time": None, "stopped_by": None}, walk]
    synthesized = {sch: made.iteration_time for (sch, *_), made in zip(seeds, found.seeds) if made is not None}
    seeds_record = [{"schedule": o.problem.schedule, "status": o.result.status,
                     "iteration_time": o.result.iteration_time,
                     "synthesized": synthesized.get(o.problem.schedule)} for o in mine]
    search = {"evaluations": found.evaluations, "pruned": found.pruned, "budget": options.evaluations,
              "stopped_by": found.stopped_by,
              "origin": found.best.origin if found.best else None, "seeds": seeds_record}
    if found.best is None:
        result = SolverResult(solver, "timeout-no-solution", None, None, None, spent + time.perf_counter() - clock,
                              seed, message="no seed plan's partition fits with synthesized programs either"
                              if seeds else "the solver found no plan of any named schedule to start from",
                              details={"partitions": search, "phases": phases}, stopped_by=found.stopped_by,
                              budget=options.evaluations, algorithm=ADAPTIVE)
        return Outcome(first, result, ADAPTIVE)
    # the polish's own share, even when the walk's last partition ran past its cap
    left = max(deadline - time.perf_counter(), limit * POLISH_SHARE)
    exact = options.exact and left > 0
    polish_clock, polish_cpu = time.perf_counter(), time.process_time()
    made = synthesize_plan(found.best.plan, first.graph, first.cluster, exact=exact, work=options.work,
                           time_limit=left if exact else None, seed=seed)
    record = dict(made.record, memory_fraction=options.memory_fraction)
    phases.append({"phase": "order polish" if exact else "programs (list scheduler)",
                   "unit": "CP-SAT deterministic seconds" if exact else None, "budget": options.work if exact else None,
                   "used": record["work"], "time_cap": left if exact else None,
                   "wall_time": time.perf_counter() - polish_clock, "cpu_time": time.process_time() - polish_cpu,
                   "stopped_by": record["stopped_by"]})
    origin = found.best.origin.split(" + ")[0]
    base = next(o.problem for o in mine if o.problem.schedule == origin)
    proved = record["status"] == "optimal"
    stopped = "time" if found.stopped_by == "time" or record["stopped_by"] == "wall clock" else found.stopped_by
    message = (f"programs by {record['algorithm']}; their order is "
               f"{'proved optimal' if proved else 'not proved optimal'} for this partition "
               f"(gap {100 * (record['gap'] or 0):.2f}% to the order bound); the partition, from the {origin} plan "
               f"after {found.evaluations} partitions synthesized, is not proved best")
    result = SolverResult(solver, "feasible", made.plan.with_extra(synthesis=record), made.after.iteration_time, None,
                          spent + time.perf_counter() - clock, seed, message=message,
                          details={"synthesis": record, "partitions": search, "phases": phases}, stopped_by=stopped,
                          budget=options.evaluations, algorithm=ADAPTIVE,
                          plan_by=record["algorithm"])
    return Outcome(base, result, ADAPTIVE)


def with_adaptive(done: Planned, schedules: Sequence[str], *, time_limit: float, seed: int,
                  options: AdaptiveOptions | None, solvers: Sequence[str] = ()) -> Planned:
    """``done`` with an :data:`ADAPTIVE` outcome per solver when ``schedules`` name it, and only the outcomes
    of the schedules named (the seeds' own outcomes are in the adaptive record's ``details``).

    A solver of ``solvers`` that planned none of the named schedules (it refused every one)
    cannot plan :data:`ADAPTIVE`: it is skipped, the reason said in :attr:`Planned.skipped`.
    """
    if ADAPTIVE not in schedules or any(p.tensor_search for p in done.problems):
        return done
    names = list(dict.fromkeys([*solvers, *(o.result.name for o in done.outcomes)]))
    adaptive, refused = [], []
    for name in names:
        if interrupted():
            break
        made = plan_adaptive(done.outcomes, name, time_limit=time_limit, seed=seed,
                             options=options or AdaptiveOptions())
        if made is not None:
            adaptive.append(made)
            continue
        why = "; ".join(dict.fromkeys(s.reason for s in done.skipped if s.solver == name)) or "no schedule planned"
        refused.append(Skipped(ADAPTIVE, name, f"{name} does not plan adaptive: it starts from the solver's plans of "
                                               f"the named schedules, and {name} plans none of them here ({why})"))
    kept = tuple(o for o in done.outcomes if o.problem.schedule in schedules) + tuple(adaptive)
    problems = tuple(p for p in done.problems if p.schedule in schedules) or done.problems[:1]
    skipped = tuple(s for s in done.skipped if s.schedule in schedules or not s.solver) + tuple(refused)
    return Planned(problems, kept, skipped, done.not_run)


def plan_problems(problems: Sequence[PlanningProblem], solver: str, *, time_limit: float = 60.0, seed: int = 0,
                  budget: float | None = None, warm_start: Plan | None = None,
                  solver_options: Mapping[str, Any] | None = None, skipped: Sequence[Skipped] = (),
                  on_solve: Callable[[str, str], None] | None = None, schedules: Sequence[str] | None = None,
                  adaptive: AdaptiveOptions | None = None) -> Planned:
    """:func:`plan` on problems already made (:func:`problems_for`); ``skipped`` joins the result's.

    ``schedules`` are the names requested (default: the problems' own); with :data:`ADAPTIVE`
    among them, the problems are its seeds too (:func:`with_adaptive`).
    """
    chosen = get_solver(solver, **dict(solver_options or {}))  # an unknown name fails before any work
    if warm_start is not None:
        if len(problems) > 1:
            raise InputError("-", "--warm-start", "starts one schedule's search; give --schedule NAME with it")
        check_warm_start(warm_start, problems[0], "warm start")
    names = list(schedules) if schedules is not None else [p.schedule for p in problems]
    done = solve_each(problems, [chosen], time_limit=time_limit, seed=seed, budget=budget, warm_start=warm_start,
                      skip_refusals=len(problems) > 1 or bool(skipped), on_solve=on_solve)
    done = Planned(done.problems, done.outcomes, (*skipped, *done.skipped), done.not_run)
    done = with_adaptive(done, names, time_limit=time_limit, seed=seed, options=adaptive, solvers=[chosen.name])
    refused = [s for s in done.skipped if s.schedule == ADAPTIVE and s.solver]
    if names == [ADAPTIVE] and refused and not done.outcomes:
        raise InputError("-", "--schedule", refused[0].reason)
    return done


def plan(graph: LayerGraph, cluster: Cluster, *, batch: int, microbatches: int | str, solver: str = "cpsat",
         schedule: str | Sequence[str] = "1f1b", time_limit: float = 60.0, seed: int = 0,
         budget: float | None = None, warm_start: Plan | None = None,
         solver_options: Mapping[str, Any] | None = None, on_solve: Callable[[str, str], None] | None = None,
         adaptive: AdaptiveOptions | None = None, **options: Any) -> Planned:
    """Plan ``graph`` on ``cluster`` with one solver, for one schedule or several (``"auto"``: every one).

    With several schedules the solver plans each one (a schedule the options rule out, or
    the solver refuses, is skipped and said in :attr:`Planned.skipped`) and the fastest
    fitting plan is :attr:`Planned.plan`.  Each schedule's result is the solve it gets
    alone, or faster (:func:`solve_each`), so ``"auto"`` is never slower than any
    schedule it covers.  ``"adaptive"`` (:func:`plan_adaptive`) plans every named
    schedule as its seeds and writes a ``custom`` plan; ``"auto"`` covers it.

    Parameters
    ----------
    graph, cluster
        The model and the devices.
    batch, microbatches
        As :func:`problem_for` takes them (``microbatches="auto"``: split-aware solvers choose).
    solver : str
        A registered solver (:func:`pipeplan.solver.solvers.solver_names`).
    schedule : str or sequence of str
        A schedule of :data:`COVERED`, several, or ``"auto"``.
    time_limit, seed, budget
        As :meth:`pipeplan.solver.core.algorithm.Solver.solve` takes them, per schedule
        (:data:`ADAPTIVE`: its partition search and exact polish get ``time_limit`` too,
        after its seeds).
    warm_start : Plan, optional
        An earlier plan of the problem (one schedule only), checked against it.
    solver_options : mapping, optional
        Settings of the solver's algorithms (``generations``, ``population``, ``backend``).
    on_solve : callable, optional
        Called before each solve (see :func:`solve_each`).
    adaptive : AdaptiveOptions, optional
        How :data:`ADAPTIVE` searches (partitions synthesized, the exact model's work).
    **options
        Further problem fields (``virtual_stages``, ``max_microbatches``, ``per_stage``,
        ``allow_replication``, ``allow_recompute``, ``max_stages``, ``state_factor``,
        ``tensor_parallel``, ``max_tensor_parallel``, ``zero``, ``max_zero``: the degrees and
        ZeRO levels the solver chooses, docs/solvers.md), and ``memory_fraction`` (each
        device's memory usable, a share in ``(0, 1]``).

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
    names = schedules_for(schedule)
    problems, skipped = problems_for(graph, cluster, names, batch=batch, microbatches=microbatches, **options)
    adaptive = replace(adaptive or AdaptiveOptions(), memory_fraction=options.get("memory_fraction", 1.0))
    return plan_problems(problems, solver, time_limit=time_limit, seed=seed, budget=budget, warm_start=warm_start,
                         solver_options=solver_options, skipped=skipped, on_solve=on_solve, schedules=names,
                         adaptive=adaptive)


def compare_problems(problems: Sequence[PlanningProblem], solvers: Sequence[str] | None = None, *,
                     time_limit: float = 60.0, seed: int = 0, budget: float | None = None,
                     solver_options: Mapping[str, Any] | None = None, skipped: Sequence[Skipped] = (),
                     on_solve: Callable[[str, str], None] | None = None, schedules: Sequence[str] | None = None,
                     adaptive: AdaptiveOptions | None = None) -> Planned:
    """:func:`compare` on problems already made (:func:`problems_for`); ``skipped`` joins the result's;
    ``schedules`` and ``adaptive`` as :func:`plan_problems` takes them."""
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
    done = Planned(done.problems, done.outcomes, (*skipped, *done.skipped), done.not_run)
    names = list(schedules) if schedules is not None else [p.schedule for p in problems]
    return with_adaptive(done, names, time_limit=time_limit, seed=seed, options=adaptive,
                         solvers=[c.name for c in chosen])


def compare(graph: LayerGraph, cluster: Cluster, *, batch: int, microbatches: int | str,
            solvers: Sequence[str] | None = None, schedule: str | Sequence[str] = "1f1b", time_limit: float = 60.0,
            seed: int = 0, budget: float | None = None, solver_options: Mapping[str, Any] | None = None,
            on_solve: Callable[[str, str], None] | None = None, adaptive: AdaptiveOptions | None = None,
            **options: Any) -> Planned:
    """Run several solvers (default: every one that plans one of the schedules) on one schedule or several.

    A solver that refuses a problem is skipped (said in :attr:`Planned.skipped`), unless it is
    the only one on the only schedule.  The arguments are :func:`plan`'s; ``solvers`` names
    the solvers, in the order to run them.

    Raises
    ------
    InputError
        For an empty or unknown solver name (naming the valid ones).
    """
    names = schedules_for(schedule)
    problems, skipped = problems_for(graph, cluster, names, batch=batch, microbatches=microbatches, **options)
    adaptive = replace(adaptive or AdaptiveOptions(), memory_fraction=options.get("memory_fraction", 1.0))
    return compare_problems(problems, solvers, time_limit=time_limit, seed=seed, budget=budget,
                            solver_options=solver_options, skipped=skipped, on_solve=on_solve, schedules=names,
                            adaptive=adaptive)


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
