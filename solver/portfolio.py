"""The portfolio: which searches the registered solvers run inside their own, in order, with their counted budgets.

No solver calls another by name: what a composite solver runs is listed here and passed
in when :mod:`pipeplan.solver.solvers` builds it.

``ilp`` and ``cpsat`` (:data:`EXACT`, the phases of
:func:`pipeplan.solver.exact.solve.solve_exact`):

=================  ====================================================  ===================================
phase              what it runs                                          its counted budget
=================  ====================================================  ===================================
bound              the class bound                                       a fixed number of steps
incumbents         ``group-search``                                      :data:`~pipeplan.solver.heuristics.group_search.EVALUATIONS` patterns
incumbents         the fast baselines (up to :data:`BASELINE_CELLS`),    :data:`GREEDY_AFTER_FIT` plans simulated
                   then the greedy plans                                 once one fits
model              the configuration walk, then the MILP / CP-SAT loop   walk prefixes and table entries;
                                                                         the solver's own budget
late incumbents    the slow baselines (:data:`SLOW_BASELINES`)           their whole DPs (up to their sizes)
improvement        NSGA-II from the incumbent                            :data:`GA_ROUNDS` x :data:`GA_GENERATIONS`
=================  ====================================================  ===================================

``virtual-bnb`` (what ``ilp`` and ``cpsat`` run for the version-2 schedules): with ``v``
left to the search, first its own solve with one stage per group (on the whole budget,
its simulations counted against it); then ``group-search-virtual``, on
:data:`VIRTUAL_START_SHARE` of the simulation budget (at most what is left), then the
best-first search over the whole space from the best plan so far; when that does not prove
its plan, the version-2 model (:mod:`pipeplan.solver.exact.virtual_model`: ``ilp`` its MILP
form with HiGHS, ``cpsat`` its CP-SAT form) on what is left of the time limit, each group
count's model on a counted budget.

``nsga`` (:func:`nsga_seeds`): its first population holds the plans of ``group-search``,
every baseline up to its size (:func:`seeding_cells`), and the exact solvers' plans when
proved (their walk cut to :data:`SEEDING_PREFIXES`, no NSGA-II of their own).

``cpsat-split``: starts from the best of the baselines, ``group-search`` and ``cpsat``.

Every budget is a count, never a share of the clock, so the same inputs, seed and budget
give the same plan on any machine unless the time limit, a cap over all of them, cuts
one short (the record then says ``stopped_by: time``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from pipeplan.solver.baselines import BASELINES, SPLIT_BASELINES
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit
from pipeplan.solver.exact.cpsat import CpSatSolver
from pipeplan.solver.exact.ilp import IlpSolver
from pipeplan.solver.exact.incumbents import greedy_plans
from pipeplan.solver.exact.phases import ClassBoundPhase, ExactPhases, Walk, scaled_count
from pipeplan.solver.exact.search import Search
from pipeplan.solver.exact.virtual_search import StartPhase, VirtualBnB
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.heuristics.group_search import EVALUATIONS, GroupSearch, group_search
from pipeplan.solver.heuristics.nsga import Nsga, run_nsga
from pipeplan.solver.heuristics.virtual_groups import VirtualGroupSearch
from pipeplan.solver.splits.cpsat_split import CpSatSplit
from pipeplan.solver.splits.joint_split import CpSatJoint

GREEDY_AFTER_FIT = 64
"""Plans of the fast baselines and greedy plans still simulated once one fitted: each greedy plan is
simulated on every device, which takes seconds on clusters of thousands, and the first fitting ones
are the best."""

GA_ROUNDS, GA_GENERATIONS = 1, 60
"""NSGA-II runs from an unproved incumbent (:class:`NsgaImprovement`) and generations of each: 20
generations took 3 s at 96 layers x 32 devices on the loaded 2-core machine this was measured on."""

SLOW_BASELINES = ("dapple", "alpa")
"""Baselines with slow pure-Python DPs: run after the model (a proof makes them moot)."""

BASELINE_CELLS = {"deepspeed-parameters": 1024, "autopipe": 1024, "pipedream": 1024, "piper": 1024,
                  "dapple": 256, "alpa": 64}
"""Largest layers x devices on which a baseline runs for the exact search's incumbent (and seeds
NSGA-II); the others run on every problem.  A count, not a time share, so the incumbent does not
depend on the machine: their DPs grow with the square of the layers and with the devices, and these
sizes keep each one to about a second or two on the 2-core machine they were measured on (at 96
layers x 32 devices PipeDream and Piper take 10 s each there, Dapple and Alpa over a minute; Alpa
50 s at 32 x 8)."""

SEEDING_PREFIXES = 20_000
"""Prefixes the exact seeding solvers' configuration walk may expand (and they run no NSGA-II):
their plans are used only when proved, and the walk proves the instances they prove within this."""

VIRTUAL_START_SHARE = 0.3
"""Most of the simulation budget ``virtual-bnb``'s restricted start (``group-search-virtual``) may spend."""


# --------------------------------------------------------------------------- the exact solvers' phases
def baseline_plans(problem: PlanningProblem, seed: int, clock: TimeLimit, slow: bool) -> list[tuple[str, Plan]]:
    """``(name, plan)`` of every fast baseline (``slow=False``) or every slow one, cheapest first.

    Every baseline the problem is small enough for (:data:`BASELINE_CELLS`) runs its whole
    search, with what is left of ``clock`` as its cap (so its plan depends on the machine only
    when that cap fires, which the clock's record notes); once ``clock`` has expired the rest
    are skipped.
    """
    plans = []
    cells = len(problem.graph) * len(problem.cluster.devices)
    for cls in BASELINES:
        if (cls.name in SLOW_BASELINES) != slow or cells > BASELINE_CELLS.get(cls.name, math.inf):
            continue
        if clock.expired():
            break
        result = cls().solve(problem, time_limit=clock.remaining(), seed=seed, within=clock)
        if result.plan is not None:
            plans.append((cls.name, result.plan))
    return plans


@dataclass(frozen=True)
class GroupSearchPhase:
    """``group-search`` on its counted budget; every plan it refined is offered (an incumbent phase)."""

    patterns: int = EVALUATIONS
    """Patterns it builds (see :func:`pipeplan.solver.heuristics.group_search.group_search`)."""
    name = "group-search"

    def run(self, problem: PlanningProblem, search: Search, clock: TimeLimit, seed: int) -> dict[str, Any]:
        # uncut by the clock, its plans are those the group-search solver returns: the exact solvers are never worse
        found = group_search(problem, clock, evaluations=self.patterns)
        for judged in found.plans:
            search.offer(judged.plan)
        return {"group_search_stopped_by_time_limit": found.stopped_by_time}

    def scaled(self, factor: float) -> "GroupSearchPhase":
        return GroupSearchPhase(scaled_count(self.patterns, factor))

    def counts(self) -> dict[str, int]:
        return {"patterns": self.patterns}


@dataclass(frozen=True)
class FastPlans:
    """The fast baselines' plans, then the greedy plans (an incumbent phase).

    Once a plan fits, only :attr:`after_fit` more are simulated (a count, so the incumbent is
    the same on any machine); the clock stops them too.
    """

    after_fit: int = GREEDY_AFTER_FIT
    """Plans still simulated once one fitted (on large clusters each greedy plan costs seconds)."""
    name = "fast baselines"

    def run(self, problem: PlanningProblem, search: Search, clock: TimeLimit, seed: int) -> dict[str, Any]:
        offered_after_fit = 0
        # the greedy plans last: simulating them all takes seconds on large clusters
        plans = baseline_plans(problem, seed, clock, slow=False) + [("greedy", p) for p in greedy_plans(problem)]
        for by, plan in plans:
            if search.best_plan is not None:
                if offered_after_fit >= self.after_fit or clock.expired():
                    break
                offered_after_fit += 1
            search.offer(plan, by=by)
        return {}

    def scaled(self, factor: float) -> "FastPlans":
        return FastPlans(scaled_count(self.after_fit, factor))

    def counts(self) -> dict[str, int]:
        return {"greedy_after_fit": self.after_fit}


@dataclass(frozen=True)
class SlowBaselines:
    """The slow DP baselines (:data:`SLOW_BASELINES`): an exact solver never returns a plan worse than theirs."""

    name = "slow baselines"

    def run(self, problem: PlanningProblem, search: Search, clock: TimeLimit, seed: int) -> dict[str, Any]:
        for by, plan in baseline_plans(problem, seed, clock, slow=True):
            search.offer(plan, by=by)
        return {}

    def scaled(self, factor: float) -> "SlowBaselines":
        return self

    def counts(self) -> dict[str, int]:
        return {}


@dataclass(frozen=True)
class NsgaImprovement:
    """NSGA-II from the incumbent: :attr:`rounds` runs of :attr:`generations` each (an improvement phase).

    With a fixed microbatch count the GA keeps the equal split, so its plans lie in the
    search space; they only improve the incumbent and never touch the bound.  Each round
    restarts from the best front, with a new seed.
    """

    rounds: int = GA_ROUNDS
    """Runs (each restarted from the best front)."""
    generations: int = GA_GENERATIONS
    """Generations of each run."""
    name = "nsga"

    def run(self, problem: PlanningProblem, search: Search, clock: TimeLimit, seed: int) -> dict[str, Any]:
        if search.best_plan is None or problem.free_sizes:
            return {}
        seeds = [("incumbent", search.best_plan)]
        for round_ in range(self.rounds):
            if clock.expired():
                break
            run = run_nsga(problem, clock, generations=self.generations, seed=seed + round_, seeds=seeds)
            for point in run.front:
                search.offer(point.plan)
            seeds = [("incumbent", search.best_plan)] + [("front", p.plan) for p in run.front[:8]]
        return {}

    def scaled(self, factor: float) -> "NsgaImprovement":
        return NsgaImprovement(self.rounds, scaled_count(self.generations, factor))

    def counts(self) -> dict[str, int]:
        return {"ga_rounds": self.rounds, "ga_generations": self.generations}


EXACT = ExactPhases(bound=(ClassBoundPhase(),), incumbents=(GroupSearchPhase(), FastPlans()), walk=Walk(),
                    late_incumbents=(SlowBaselines(),), improvement=(NsgaImprovement(),))
"""The phases of the registered ``ilp`` and ``cpsat`` (see the module docstring)."""

SEEDING_EXACT = replace(EXACT, walk=Walk(prefixes=SEEDING_PREFIXES), improvement=())
"""The phases of the exact solvers that seed ``nsga``: a shorter walk and no NSGA-II of their own."""


# --------------------------------------------------------------------------- nsga's seeds
def seeding_cells(cls: type) -> float:
    """Largest layers x devices on which baseline ``cls`` seeds NSGA-II (``inf``: every size).

    The equal-split baselines keep the sizes the exact search's incumbent uses them up to
    (:data:`BASELINE_CELLS`).  A split baseline starts from the best of every equal-split
    baseline, each given a share of its time (so the slowest decides whether its clock cuts
    it): it seeds only where every equal-split baseline runs whole.

    Examples
    --------
    >>> seeding_cells(BASELINES[0]), seeding_cells(SPLIT_BASELINES[0])
    (inf, 64)
    """
    if cls in SPLIT_BASELINES:
        return min(BASELINE_CELLS.values())
    return BASELINE_CELLS.get(cls.name, math.inf)


def nsga_seeds(problem: PlanningProblem, *, seed: int, time_limit: float, within: TimeLimit) -> list[tuple[str, Plan]]:
    """Seeding plans of ``nsga``: group-search, every equal-split and split baseline, and the exact solvers'.

    Each seeding solver runs its own work budget with ``time_limit`` as its cap: the same
    number for every one of them, never what is left of it, so that no solver's search
    depends on how fast the ones before it ran.  The seeds then depend only on the problem
    and the seed, unless a cap fires or ``time_limit`` passes before all have run (the rest
    are skipped); ``within``'s record notes that, and the GA's record says ``stopped_by:
    time``.  An exact solver's plan is used only when proved optimal (on larger instances
    the others seed it better), so the exact ones run a smaller walk (:data:`SEEDING_PREFIXES`)
    and no NSGA-II, and the second (``ilp``) only when the first (``cpsat``) proved nothing.
    The baselines whose whole search would not fit the cap run only up to a problem size
    (:func:`seeding_cells`), a count, so that no cap decides which seeds there are.
    """
    clock = within.within(time_limit)
    equal = problem.equal_split_problem()
    cells = len(problem.graph) * len(problem.cluster.devices)
    # (name, solver, problem, kind): kind "exact" needs a proof; "exact-equal" too, and one is enough
    runs: list[tuple[str, Any, PlanningProblem, str]] = [("group-search", GroupSearch(), equal, "heuristic")]
    runs.extend((cls.name, cls(), problem, "heuristic") for cls in (*BASELINES, *SPLIT_BASELINES)
                if cells <= seeding_cells(cls))
    if problem.free_sizes:  # on small instances cpsat proves the best plan over every pipeline and split
        runs.append(("cpsat", CpSatJoint(phases=SEEDING_EXACT), problem, "exact"))
    # the largest count only: see solver.splits.equal_splits for why not every count
    runs.append(("cpsat", CpSatSolver(phases=SEEDING_EXACT), equal, "exact-equal"))
    runs.append(("ilp", IlpSolver(phases=SEEDING_EXACT), equal, "exact-equal"))
    out: list[tuple[str, Plan, str]] = []
    for name, solver, sub, kind in runs:
        if kind == "exact-equal" and any(k == "exact-equal" for _, _, k in out):
            continue
        if clock.expired():
            break
        result = solver.solve(sub, time_limit=time_limit, seed=seed, within=clock)
        if result.plan is not None and (kind == "heuristic" or result.status == "optimal"):
            out.append((name, result.plan, kind))
    return [(name, plan) for name, plan, _ in out]


# --------------------------------------------------------------------------- the composite solvers
def ilp() -> IlpSolver:
    """``ilp`` with its phases (:data:`EXACT`)."""
    return IlpSolver(phases=EXACT)


def cpsat() -> CpSatSolver:
    """``cpsat`` with its phases (:data:`EXACT`)."""
    return CpSatSolver(phases=EXACT)


def cpsat_joint() -> CpSatJoint:
    """``cpsat-joint`` (``cpsat`` with microbatch sizes as decisions), its equal-split solves with :data:`EXACT`."""
    return CpSatJoint(phases=EXACT)


def virtual_bnb(model: str | None = "milp") -> VirtualBnB:
    """``virtual-bnb`` from ``group-search-virtual``'s plan, on :data:`VIRTUAL_START_SHARE` of the budget, its bound
    raised by the version-2 model's ``model`` form (``ilp``: ``milp``, ``cpsat``: ``cpsat``)."""
    return VirtualBnB(start=(StartPhase(VirtualGroupSearch(), VIRTUAL_START_SHARE),), model=model)


def virtual_bnb_cpsat() -> VirtualBnB:
    """:func:`virtual_bnb` with the CP-SAT form of the version-2 model (what ``cpsat`` runs)."""
    return virtual_bnb("cpsat")


def nsga() -> Nsga:
    """``nsga`` seeded by :func:`nsga_seeds`."""
    return Nsga(seeding=nsga_seeds)


def cpsat_split() -> CpSatSplit:
    """``cpsat-split`` starting from the baselines', ``group-search``'s and ``cpsat``'s equal-split plans."""
    return CpSatSplit(heuristics=(GroupSearch(),), exact=cpsat())
