"""``virtual-bnb``: a best-first search over the candidates of a version-2 schedule, proved by the bounds.

The exact algorithm for ``interleaved-1f1b``, ``interleaved-zb``, ``looped-bfs`` and
``zbv`` (:class:`VirtualBnB`; ``ilp`` and ``cpsat`` run it for those schedules, as their
MILP and CP-SAT models describe one stage per device group, and their records say so).
On a restricted space :func:`solve_v2` is also ``group-search``'s version-2 form, and over
a baseline's proposals its interleaved form.

Method.  Every candidate of :mod:`pipeplan.solver.space.virtual_space` without recompute (``v``,
device groups, stage boundaries) gets its lower bound
:func:`pipeplan.solver.bounds.virtual_bound.candidate_bound`; candidates whose state alone overflows
a device are dropped (:func:`pipeplan.solver.bounds.virtual_bound.state_overflows`).  They are then
simulated in order of increasing bound (ties in enumeration order) from a heap, keeping
the fastest plan that fits.  A candidate that does not fit puts its recompute variants
(:func:`pipeplan.solver.space.virtual_space.recompute_variants`) on the heap with their own bounds.

Exactness.  When the next candidate's bound reaches the incumbent, every candidate left
has a bound at least that, so none is faster: the incumbent is optimal over the whole
space.  A recompute variant's bound is at least its plain candidate's (every duration
only grows), so it is never needed before its plain candidate was simulated; and when
the plain candidate fits its variants cannot be faster: recompute only lengthens
actions, and with the programs and link orders fixed the timeline is a max-plus system,
monotone in the durations.  The same monotony makes a plain candidate's own simulated time a
bound on its variants: they go on the heap with the larger of it and their own bound, and
not at all when it already reaches the incumbent.  Above
:data:`~pipeplan.solver.space.virtual_space.MAX_FLAG_STAGES` stages only no recompute and
recompute everywhere are listed, so the fastest plain candidate that did not fit there bounds
the plans not listed, and the proof needs the incumbent at or below it.  When every candidate is
simulated and none fits, no plan fits: the result is ``infeasible``, a proof.  Stopped earlier
(budget, clock), the reported bound is the smallest of the incumbent, the bounds not yet
passed and that plain candidate's time, or, when the space was too large to list,
:func:`pipeplan.solver.bounds.virtual_bound.space_bound`.

Listing.  The first :data:`MAX_CANDIDATES` candidates are listed and searched first.  A space of
at most :data:`SMALL_SPACE` candidates is then listed whole and the search goes on from where it
stopped, with its incumbent: every candidate whose bound is below the final incumbent is still
simulated, so the proof holds, and a short limit searches the first ones alone.  A larger
space is not listed past :data:`MAX_CANDIDATES`.

With ``v`` left to the search (``virtual_stages`` ``None``), :class:`VirtualBnB` first
solves the problem with one stage per group, as ``--virtual-stages 1`` alone would, and
starts from that plan: the space over every ``v`` is often too large to finish, and its
best-first order can spend the budget before it reaches the one-stage plans.

Fallback.  Before any phase the clock caps, :class:`VirtualBnB` builds a plan from work fixed
by the problem's size (:func:`pipeplan.solver.exact.virtual_fallback.fallback_plan`: a few even
splits over groups, at most 8 simulations, outside the budget).  The best-first search starts
from it when no phase found a plan at least as fast, so a solve that the clock cuts before any
phase finds a plan still returns one whenever a fallback candidate fits (``feasible``, with the
bound that holds); ``timeout-no-solution`` only when none does.

Seeds.  :func:`solve_v2` simulates the candidates it is given as ``seeds`` first (the
version-2 forms of the best version-1 partitions, from ``group-search-virtual``), so its
plan is never slower than any of them that fits.

The model.  Built with ``model`` (``ilp``: ``milp``, ``cpsat``: ``cpsat``),
:class:`VirtualBnB` also solves :mod:`pipeplan.solver.exact.virtual_model` before its
best-first search, on at most :data:`MODEL_SHARE` of the time left (a round of its solves started then runs to its
end under the solve's clock: a solve cut short proves nothing), and after the search,
on what it left, from where it stopped (the group counts not yet bounded, then the raising of
the smallest bound): a bound over every plan of the space, which replaces the search's when higher, and
proves the plan optimal when it reaches it.  No bound above the incumbent is sought.

The work is counted in simulations (:class:`pipeplan.solver.core.termination.WorkBudget`):
same inputs and budget, same plan on any machine.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from pipeplan.models.errors import InputError
from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.problem import VIRTUAL_SCHEDULES, PlanningProblem
from pipeplan.solver.core.result import SolverResult, TracePoint
from pipeplan.solver.evaluation.simulator import Simulation
from pipeplan.solver.core.termination import TimeLimit, WorkBudget, past
from pipeplan.solver.bounds.virtual_bound import Bounder, space_bound
from pipeplan.solver.exact.virtual_fallback import fallback_plan
from pipeplan.solver.exact.virtual_model import ModelBound, virtual_model_bound
from pipeplan.solver.space.virtual_space import (MAX_FLAG_STAGES, Candidate, VirtualSolver, boundary_choices,
                                                candidates, empty_space, flags_exhaustive, group_choices, layer_moves,
                                                plain_count, recompute_variants, to_plan)

MAX_CANDIDATES = 40_000
"""Candidates listed, bounded and searched first; a space larger than :data:`SMALL_SPACE` is not listed further and
not proved (its bound is the cluster-wide one)."""

SMALL_SPACE = 160_000
"""Spaces of at most this many candidates (without recompute) are then listed whole, so that a finished search
proves its plan.  bench_solvers' 16 x 4 instance has 101,429 (``v = 2``) and 150,481 (``interleaved-1f1b``,
``v = 4``) per version-2 schedule; bounding one takes 55 to 85 us on the 2-core machine, 6 to 13 s for such a
space, and ``ilp`` proves each schedule's optimum there in 11 to 27 s (2026-12-03)."""

DEFAULT_SIMULATIONS = 20_000
"""Simulations one version-2 solve may run by default (its work budget)."""

MODEL_SHARE = 0.3
"""Most of the time left that the version-2 model's solves may take before the best-first search (a cap: their
work is counted in nodes or deterministic seconds)."""

BOUND_TOL = 1e-9
"""Relative margin a bound must clear the incumbent by to prune: the bound and the simulator
add the same durations in different orders, so their roundings differ by about 1e-15."""

MOVE_GAIN = 1e-12
"""Relative amount a layer move must make a plan faster by to be kept (:func:`move_layers`): more than the
simulator's rounding, so that two splits of equal time do not take turns."""


class _Listing:
    """The candidates without recompute that may fit, bounded and put on the search's heap a batch at a time.

    Candidates whose ``v`` is in ``settled`` are left out; ``count`` is how many were put on the heap, ``done``
    whether every candidate was taken."""

    def __init__(self, problem: PlanningProblem, bounder: Bounder, boundaries, groupings,
                 settled: frozenset[int]) -> None:
        self.bounder, self.settled = bounder, settled
        self.items = enumerate(candidates(problem, boundaries, groupings, flags=False))
        self.waiting: tuple[int, Candidate] | None = None  # taken from ``items``, not yet listed
        self.count, self.done = 0, False

    def fill(self, pool: list, most: int, deadline: TimeLimit) -> None:
        """List the candidates before index ``most`` onto the heap ``pool``, or those the deadline leaves time for."""
        bounder, settled, listed = self.bounder, self.settled, []
        waiting, self.waiting = self.waiting, None
        for index, candidate in itertools.chain((waiting,) if waiting else (), self.items):
            if index >= most or (index % 32 == 0 and past(deadline)):
                self.waiting = (index, candidate)
                break
            if candidate.virtual not in settled and not bounder.overflows(candidate):
                listed.append((bounder.bound(candidate), (index, 0), candidate))
        else:
            self.done = True
        self.count += len(listed)
        pool.extend(listed)
        heapq.heapify(pool)


class _BestFirst:
    """The search's state: its incumbent, where it stopped and what its proof still lacks."""

    def __init__(self, problem: PlanningProblem, bounder: Bounder, incumbent: tuple[Plan, float] | None,
                 clock: TimeLimit, budget: WorkBudget, evaluate: Callable[[Plan], Simulation]) -> None:
        self.problem, self.bounder, self.clock, self.budget, self.evaluate = problem, bounder, clock, budget, evaluate
        self.best, self.best_time = incumbent if incumbent is not None else (None, math.inf)
        self.trace = [TracePoint(0.0, self.best_time, None)] if incumbent is not None else []
        self.simulated, self.next_bound, self.finished = 0, None, True
        self.unlisted_flags = math.inf
        """Above MAX_FLAG_STAGES stages only none or all recompute are listed: the other flags of a plain
        candidate that did not fit are never faster than it, so the fastest such candidate bounds them all."""

    def offer(self, plan: Plan | None, time: float) -> None:
        """Keep ``plan`` (a fitting plan simulated at ``time`` seconds) when it is faster than the incumbent."""
        if plan is not None and time < self.best_time:
            self.best, self.best_time = plan, time
            self.trace.append(TracePoint(self.clock.elapsed(), time, None))

    def run(self, pool: list) -> None:
        """Simulate the heap's candidates in order until the next bound reaches the incumbent (``finished``),
        or the budget or the clock stops it (``finished`` false); ``next_bound`` is the bound it stopped at."""
        problem, bounder = self.problem, self.bounder
        self.next_bound, self.finished = None, True
        while pool:
            bound, order, candidate = pool[0]
            if bound * (1 - BOUND_TOL) >= self.best_time:
                self.next_bound = bound
                return
            if past(self.clock) or not self.budget.spend():
                self.next_bound, self.finished = bound, False
                return
            heapq.heappop(pool)
            self.simulated += 1
            plan = to_plan(problem, candidate)
            result = self.evaluate(plan)
            if result.fits:
                self.offer(plan, result.iteration_time)
            elif not any(candidate.recompute):
                if not flags_exhaustive(problem, len(candidate.bounds)):
                    self.unlisted_flags = min(self.unlisted_flags, result.iteration_time)
                # its recompute variants: never faster than it, so only worth a look when it does not fit and
                # is faster than the incumbent; its time bounds theirs
                if result.iteration_time * (1 - BOUND_TOL) < self.best_time:
                    for j, variant in enumerate(recompute_variants(problem, candidate), 1):
                        key = max(bounder.bound(variant), result.iteration_time)
                        heapq.heappush(pool, (key, (order[0], j), variant))


def fitting_plan(problem: PlanningProblem, candidate: Candidate, budget: WorkBudget, clock: TimeLimit,
                 evaluate: Callable[[Plan], Simulation] | None = None) -> tuple[Plan | None, float, int]:
    """``candidate``'s plan and simulated time when it fits, else the same with every stage recomputing when the
    problem allows it and that fits; ``(None, inf)`` when neither does or ``budget`` (one unit per simulation) or
    ``clock`` runs out first.  The third value counts the simulations."""
    evaluate = evaluate or problem.evaluate
    flags = [candidate.recompute] + ([(True,) * len(candidate.bounds)] if problem.allow_recompute else [])
    used = 0
    for recompute in dict.fromkeys(flags):  # every stage recomputing only when the plain candidate does not fit
        if past(clock) or not budget.spend():
            break
        used += 1
        plan = to_plan(problem, replace(candidate, recompute=recompute))
        result = evaluate(plan)
        if result.fits:
            return plan, result.iteration_time, used
    return None, math.inf, used


def solve_v2(problem: PlanningProblem, name: str, *, clock: TimeLimit, seed: int,
             budget: WorkBudget | None = None, boundaries=boundary_choices, groupings=group_choices,
             proves: bool = True, evaluate: Callable[[Plan], Simulation] | None = None,
             incumbent: tuple[Plan, float] | None = None, settled: frozenset[int] = frozenset(),
             seeds: Sequence[Candidate] = ()) -> SolverResult:
    """Plan ``problem`` (a version-2 schedule) by the search of the module docstring.

    Parameters
    ----------
    problem : PlanningProblem
        A problem whose schedule is a named version-2 one, with ``M`` equal microbatches.
    name : str
        The solver's name, for the record.
    clock : TimeLimit
        The wall-clock cap (``stopped_by: time`` when it cuts the search).
    seed : int
        Recorded; the search itself is deterministic.
    budget : WorkBudget, optional
        Simulations (default :data:`DEFAULT_SIMULATIONS`, noted in ``clock``'s record when spent).
    boundaries : callable
        ``boundaries(layers, stages)``: the stage ranges to try (all by default).
    groupings : callable
        ``groupings(problem, groups)``: the device groups to try (all by default).
    proves : bool
        Whether a finished search proves optimality (``False`` for a restricted space).
    evaluate : callable, optional
        The judge of a plan (default the problem's simulator).
    incumbent : (Plan, float), optional
        A fitting plan of the space and its simulated time to start from.
    settled : frozenset of int
        Values of ``v`` whose plans a proof has already settled (none fits, or none is faster than
        ``incumbent``): their candidates are not searched again, and the proof still covers the
        whole space.
    seeds : sequence of Candidate
        Candidates simulated first, in order, each on one simulation of the budget (with every stage
        recomputing too when it does not fit and the problem allows it): the search starts from the
        fastest that fits, so its plan is never slower than any fitting seed (the version-2 forms of
        the best version-1 plans, :func:`pipeplan.solver.space.virtual_space.from_partition`).

    Returns
    -------
    SolverResult
        ``optimal`` only when proved; the bound is valid over the whole space.
    """
    budget = budget or WorkBudget(DEFAULT_SIMULATIONS, stops=clock.stops)
    evaluate = evaluate or problem.evaluate
    bounder = Bounder(problem)
    search = _BestFirst(problem, bounder, incumbent, clock, budget, evaluate)
    for start in dict.fromkeys(seeds):
        if bounder.overflows(start):
            continue
        plan, time, used = fitting_plan(problem, start, budget, clock, evaluate)
        search.simulated += used
        search.offer(plan, time)
    # the first MAX_CANDIDATES candidates are searched first, so a short limit searches them alone;
    # then the rest of a small space is listed and the search goes on from where it stopped: every candidate
    # whose bound is below the final incumbent is still simulated, so a finished search is a proof
    listing, pool = _Listing(problem, bounder, boundaries, groupings, settled), []
    listing.fill(pool, MAX_CANDIDATES, clock)
    search.run(pool)
    if not listing.done and search.finished and boundaries is boundary_choices \
            and plain_count(problem, SMALL_SPACE, groupings) <= SMALL_SPACE:
        listing.fill(pool, SMALL_SPACE, clock)
        search.run(pool)
    best, best_time, trace, next_bound = search.best, search.best_time, search.trace, search.next_bound
    finished, unlisted_flags, simulated = search.finished, search.unlisted_flags, search.simulated
    listed, listed_count = listing.done, listing.count
    wall = clock.elapsed()
    details = {"method": "best-first search over v, device groups, boundaries and recompute, pruned by "
                         "the version-2 bounds", "candidates": listed_count, "listed_all": listed,
               "simulations": simulated, "budget_unit": "simulations", "finished": finished}
    flags_cover = best_time <= unlisted_flags  # no plan of the flags not listed is faster than the incumbent
    proved = proves and listed and finished and flags_cover
    # every plan not simulated is at least the next bound on the heap or a plain candidate's time
    rest = min(math.inf if next_bound is None else next_bound, unlisted_flags)
    if best is None:
        if proved:
            return SolverResult(name, "infeasible", None, None, None, wall, seed, tuple(trace),
                                empty_space(problem) or f"no plan of {problem.schedule} fits in memory on this cluster",
                                details)
        bound = rest if listed and proves and rest < math.inf else space_bound(problem)
        return SolverResult(name, "timeout-no-solution", None, None, bound, wall, seed, tuple(trace),
                            "stopped before a fitting plan was found", details)
    if proved:
        trace.append(TracePoint(wall, best_time, best_time))
        return SolverResult(name, "optimal", best, best_time, best_time, wall, seed, tuple(trace), "", details)
    bound = min(best_time, rest) if listed and proves else min(best_time, space_bound(problem))
    trace.append(TracePoint(wall, best_time, bound))
    why = ("a restricted search proves nothing" if not proves else
           "the search space was too large to list" if not listed else
           "the search stopped before the bounds met the incumbent" if not finished else
           f"recompute on some stages only is not listed above {MAX_FLAG_STAGES} stages, and a plan without "
           "recompute that does not fit was faster than the incumbent")
    return SolverResult(name, "feasible", best, best_time, bound, wall, seed, tuple(trace), why, details)


@dataclass(frozen=True)
class Moved:
    """What :func:`move_layers` made of a plan."""

    plan: Plan | None
    """The plan it ended with (the one it was given when no move helped; ``None`` only from
    :func:`pipeplan.solver.heuristics.virtual_groups.polish` without any plan)."""
    time: float
    """Its simulated iteration time."""
    simulations: int
    """Plans simulated."""
    kept: int
    """Moves kept (each made the plan faster)."""


def move_layers(problem: PlanningProblem, plan: Plan, time: float, budget: WorkBudget, clock: TimeLimit,
                evaluate: Callable[[Plan], Simulation] | None = None) -> Moved:
    """Move single layers between stages while the simulator says it helps (a descent over
    :func:`pipeplan.solver.space.virtual_space.layer_moves`).

    Devices, groups and recompute flags stay.  The moves of the current split are simulated in
    their fixed order; the first that fits and is faster is kept and the moves of the new split
    start again, until none helps, ``budget`` (one unit per simulation) is spent or ``clock``
    passes.  Under a version-2 schedule a move between two stages of one group, or between
    groups far apart, reaches splits that moving single boundaries does not: on bench_solvers'
    64 x 16 instance (``looped-bfs``, ``v = 2``) it took the best-first search's 260.4 ms plan to
    247.1 ms in 195 simulations, where moving single boundaries stopped at 254.4 ms.

    Parameters
    ----------
    problem : PlanningProblem
    plan : Plan
        A plan of the problem that fits, and ``time`` its simulated iteration time.
    time : float
    budget : WorkBudget
        Simulations it may spend.
    clock : TimeLimit
        A cap (``stopped_by: time`` in the record when it cuts the descent).
    evaluate : callable, optional
        The judge of a plan (default the problem's simulator).

    Returns
    -------
    Moved
        The fastest plan found, never slower than ``plan``.
    """
    evaluate = evaluate or problem.evaluate
    devices = [st.devices for st in plan.stages]
    flags = [st.recompute for st in plan.stages]
    best, best_time, simulated, kept = plan, time, 0, 0
    bounds = tuple(st.layers for st in plan.stages)
    improved = True
    while improved:
        improved = False
        for moved in layer_moves(bounds):
            if past(clock) or not budget.spend():
                return Moved(best, best_time, simulated, kept)
            simulated += 1
            trial = problem.make_plan(moved, devices, flags)
            result = evaluate(trial)
            if result.fits and result.iteration_time < best_time * (1 - MOVE_GAIN):
                best, best_time, bounds, kept, improved = trial, result.iteration_time, moved, kept + 1, True
                break
    return Moved(best, best_time, simulated, kept)


@dataclass(frozen=True)
class StartPhase:
    """A search run before :class:`VirtualBnB`'s own, for its incumbent, on a share of the budget."""

    solver: Solver
    """The search (over the same problem; its plan must lie in the space)."""
    share: float
    """Most of the simulation budget it may spend (the rest is the best-first search's)."""


class VirtualBnB(VirtualSolver):
    """``virtual-bnb``: the best-first search of the module docstring, from the plans of its start phases.

    The phases (:class:`StartPhase`, listed by :mod:`pipeplan.solver.portfolio`) are split by
    counted simulations, never by the clock, so the plan does not depend on the machine's
    speed; the time limit caps them all (``stopped_by: time`` when it cuts any).  The
    record's ``plan_by`` names the phase that found the plan; ``bound_by`` is this search.
    """

    name = "virtual-bnb"
    source = ("pipeplan: best-first search over v, device groups, stage boundaries and recompute, pruned and "
              "proved by the version-2 bounds")
    proves = True
    budget_unit = "simulations"
    default_budget = DEFAULT_SIMULATIONS
    solves_one_stage_per_group = True
    """With ``v`` left to the search, its plan is never slower than its own ``v = 1`` solve's
    (:meth:`_one_stage_per_group`): a planner need not solve ``v = 1`` again."""

    def __init__(self, start: tuple[StartPhase, ...] = (), model: str | None = None, fallback: bool = True) -> None:
        self.start = start
        """The phases run first for an incumbent, in order."""
        self.model = model
        """The form of :mod:`pipeplan.solver.exact.virtual_model` solved for the bound when the search does not
        prove its plan (``milp``: HiGHS, ``cpsat``: CP-SAT), or ``None``."""
        self.fallback = fallback
        """Whether the solve starts from :func:`pipeplan.solver.exact.virtual_fallback.fallback_plan` (``False``
        only for the ``v = 1`` solve inside one whose fallback already covers ``v = 1``)."""

    def check(self, problem: PlanningProblem) -> None:
        """As :meth:`VirtualSolver.check`, and refuse ``auto_microbatches``.

        Raises
        ------
        InputError
            With ``auto_microbatches``: the search plans ``M`` equal microbatches.
        """
        super().check(problem)
        if problem.auto_microbatches:
            raise InputError("-", "--microbatches", f"{self.name} plans {problem.schedule} for M equal microbatches "
                                                    f"only (every stage splits alike); give a number instead of auto")

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """First the fallback plan (fixed work, no clock); with ``v`` left to the search, the solve with one stage
        per group (:meth:`_one_stage_per_group`); then the start phases, each on its share of what is left of
        ``budget``, then the search over the whole space from the best of their plans and the fallback's."""
        total, spent = budget.units, 0
        incumbent, plan_by, ran = None, self.name, []
        # before any phase the clock caps: a plan from fixed work, so that a short limit still returns one
        fallback = fallback_plan(problem) if self.fallback else None
        one = self._one_stage_per_group(problem, clock, total, seed)
        if one is not None:
            spent += one.details.get("simulations", 0)
            ran.append([f"{self.name} (v=1)", one.status, one.iteration_time])
            if one.plan is not None:
                incumbent, plan_by = (one.plan, one.iteration_time), f"{one.plan_by or self.name} (v=1)"
        for phase in self.start:
            if spent >= total:
                break
            # the phase spending its share is not the solve's stop: its clock and interrupts are
            within = clock.phase(clock.left())
            found = phase.solver.solve(problem, time_limit=clock.left(), seed=seed,
                                       budget=max(1.0, min(phase.share * total, total - spent)), within=within)
            spent += found.details["simulations"]
            ran.append([phase.solver.name, found.status, found.iteration_time])
            if found.plan is not None and (incumbent is None or found.iteration_time < incumbent[1]):
                incumbent, plan_by = (found.plan, found.iteration_time), phase.solver.name
        # the model before the search, on a share of the time left, so that a short limit still gets a bound
        if fallback is not None and fallback.plan is not None and (incumbent is None or
                                                                   fallback.iteration_time < incumbent[1]):
            incumbent, plan_by = (fallback.plan, fallback.iteration_time), f"{self.name} (fallback)"
        cap = incumbent[1] if incumbent is not None else math.inf  # no bound above a plan is needed
        model = virtual_model_bound(problem, self.model, clock.within(MODEL_SHARE * clock.left()), cap=cap,
                                    finish=clock) \
            if self.model is not None else None
        work = WorkBudget(max(1.0, total - spent), stops=clock.stops)
        # a proved v = 1 solve settles every one-stage candidate: none is faster than its plan, which the
        # incumbent is or beats
        settled = frozenset({1}) if one is not None and one.status in ("optimal", "infeasible") else frozenset()
        full = solve_v2(problem, self.name, clock=clock, seed=seed, budget=work, incumbent=incumbent,
                        settled=settled)
        details = dict(full.details, simulations=full.details["simulations"] + spent, start_phases=ran)
        if fallback is not None:
            details.update(fallback_simulations=fallback.simulations, fallback_time=fallback.iteration_time)
        improved = incumbent is None or full.plan is not incumbent[0]
        full = replace(full, details=details, plan_by=self.name if improved else plan_by)
        if model is not None and full.status in ("feasible", "timeout-no-solution"):
            if not past(clock) and model.bound < cap:  # the search left time: the models go on where they stopped
                model = virtual_model_bound(problem, self.model, clock, earlier=model, cap=cap)
            full = self._model_bound(model, clock, full)
        return replace(full, wall_time=clock.elapsed())

    def _model_bound(self, model: ModelBound, clock: TimeLimit, found: SolverResult) -> SolverResult:
        """``found`` with ``model``'s bound where it is higher (``optimal`` when it reaches the plan)."""
        details = dict(found.details, bound_model=self.model, model_complete=model.complete,
                       model_groups=" ".join(f"R={o.groups}:{o.status}" for o in model.outcomes))
        if math.isfinite(model.limit):  # no bound above it, whatever the time: the rest of the gap is not time's
            details["model_limit"] = model.limit
        bound = found.lower_bound if found.lower_bound is not None else 0.0
        if not model.complete or model.bound <= bound:
            return replace(found, details=details)
        by = "version-2 target LPs (HiGHS)" if model.by_targets else \
            "version-2 MILP (HiGHS)" if self.model == "milp" else "version-2 CP-SAT model"
        if found.plan is not None and model.bound >= found.iteration_time * (1 - BOUND_TOL):
            trace = found.trace + (TracePoint(clock.elapsed(), found.iteration_time, found.iteration_time),)
            return replace(found, status="optimal", lower_bound=found.iteration_time, trace=trace, details=details,
                           bound_by=by, message="")
        if found.plan is not None:
            bound = min(found.iteration_time, model.bound)
            trace = found.trace + (TracePoint(clock.elapsed(), found.iteration_time, bound),)
            return replace(found, lower_bound=bound, trace=trace, details=details, bound_by=by)
        return replace(found, lower_bound=model.bound, details=details, bound_by=by)

    def _one_stage_per_group(self, problem: PlanningProblem, clock: TimeLimit, total: float,
                             seed: int) -> SolverResult | None:
        """The solve of ``problem`` with ``virtual_stages=1``, on the whole ``total`` budget, when ``v`` is left to
        the search and one stage per group is a plan of the schedule (else ``None``).

        It is the search ``--virtual-stages 1`` runs alone (same budget and seed; the time limit is the solve's,
        it runs first; without the version-2 model, whose bound covers ``v = 1`` only and would take the time
        the phases after it need), so the search over every ``v`` starts from its plan and is never slower than it: the best-first search over every ``v``
        can run out of budget before it reaches the one-stage plans that the smaller ``v = 1`` space proves (on
        issue 36's two-server instance, ``interleaved-zb``: 126.52 ms over every ``v``, 115.40 ms, proved, with
        ``v = 1``).  Its simulations count against ``total``; the phases after it share what is left.
        """
        if problem.virtual_stages is not None or problem.schedule not in VIRTUAL_SCHEDULES:
            return None
        try:
            one = replace(problem, virtual_stages=1)
            self.check(one)
        except (InputError, ValueError):
            return None
        # its budget running out ends this phase, not the solve; its clock and interrupts are the solve's.  No
        # version-2 model: its bound covers v = 1 only, and it would take the time the phases after it need
        search = VirtualBnB(self.start, model=None, fallback=False)  # this solve's fallback covers v = 1
        return search.solve(one, time_limit=clock.left(), seed=seed, budget=total, within=clock.phase(clock.left()))
