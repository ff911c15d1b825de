"""``nsga-virtual``: NSGA-II (pymoo) over structures, stage boundaries and recompute, for the version-2 schedules.

What ``nsga`` runs for a schedule whose device groups hold several stages (:class:`VirtualNsga`).

An individual is a vector of ``2L`` reals in ``[0, 1)``, decoded into a candidate of
:mod:`pipeplan.solver.space.virtual_space`:

- gene 0 picks the *structure*: the group count ``R``, the ``v`` and the device groups,
  from every ``R`` and ``v`` the schedule takes on the equal-width groups of the ranked
  devices (:func:`pipeplan.solver.heuristics.virtual_groups.equal_groupings`);
- genes ``1 .. L-1`` are random keys of the cut positions ``1 .. L-1``: the ``S-1``
  positions with the largest keys are the stage boundaries (ties to the lower position);
- genes ``L .. 2L-1`` are the recompute bits of the stages (``> 0.5``), when allowed.

Every vector decodes to a valid candidate, so no repair is needed.  Objectives: the
simulated iteration time and the largest group peak memory; one constraint, ``0`` when
the plan fits and ``1`` when it does not.  The first population holds the even split
(torchtitan's) of every structure, then random vectors from the seed.  The search stops
after ``generations`` (its budget: same seed, same plan) or at the time limit.  It
proves nothing: ``feasible``, no lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.problem import Problem

from pipeplan.solver.bounds.infeasibility import heuristic_no_plan
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult, TracePoint
from pipeplan.solver.core.termination import TimeLimit, WorkBudget, past
from pipeplan.solver.schedules.schedule import num_stages
from pipeplan.solver.heuristics.virtual_groups import equal_groupings
from pipeplan.solver.space.virtual_space import (Candidate, VirtualSolver, even_bounds, group_counts, schedule_accepts,
                                                to_plan, virtual_choices)


@dataclass(frozen=True)
class Structure:
    """What gene 0 chooses: groups and stages per group."""

    virtual: int
    """``v``."""
    groups: tuple[tuple[str, ...], ...]
    """The device groups."""
    stages: int
    """``S``."""


def structures(problem: PlanningProblem) -> list[Structure]:
    """Every structure of the module docstring, in a fixed order."""
    found = []
    for r in group_counts(problem):
        if schedule_accepts(problem.schedule, r, problem.microbatches):
            continue
        for v in virtual_choices(problem, r):
            stages = num_stages(problem.schedule, r, v)
            if problem.max_stages is not None and stages > problem.max_stages:
                continue
            found += [Structure(v, groups, stages) for groups in equal_groupings(problem, r)]
    return found


class Decoder:
    """Vectors to candidates and back (the even split of a structure)."""

    def __init__(self, problem: PlanningProblem) -> None:
        self.problem = problem
        self.layers = len(problem.graph)
        self.structures = structures(problem)

    @property
    def size(self) -> int:
        return 2 * self.layers

    def decode(self, x: np.ndarray) -> Candidate:
        """The candidate of vector ``x``."""
        n = len(self.structures)
        st = self.structures[min(int(x[0] * n), n - 1)]
        keys = x[1:self.layers]
        order = sorted(range(1, self.layers), key=lambda c: (-keys[c - 1], c))
        edges = [0, *sorted(order[:st.stages - 1]), self.layers]
        flags = tuple(bool(b > 0.5) and self.problem.allow_recompute for b in x[self.layers:self.layers + st.stages])
        return Candidate(st.virtual, st.groups, tuple(zip(edges[:-1], edges[1:])), flags)

    def encode_even(self, index: int) -> np.ndarray:
        """The vector of structure ``index`` with the even split and no recompute."""
        x = np.full(self.size, 0.1)
        x[0] = (index + 0.5) / len(self.structures)
        for lo, _ in even_bounds(self.layers, self.structures[index].stages)[1:]:
            x[lo] = 0.9
        return x


class V2Problem(Problem):
    """pymoo's view: time and peak memory to minimise, fitting as the constraint; every simulation kept."""

    def __init__(self, problem: PlanningProblem, decoder: Decoder) -> None:
        super().__init__(n_var=decoder.size, n_obj=2, n_ieq_constr=1, xl=0.0, xu=1.0 - 1e-9)
        self.planning, self.decoder = problem, decoder
        self.archive: dict[Candidate, tuple[float, float, bool]] = {}

    def judge(self, candidate: Candidate) -> tuple[float, float, bool]:
        if candidate not in self.archive:
            result = self.planning.evaluate(to_plan(self.planning, candidate))
            self.archive[candidate] = (result.iteration_time, float(max(result.peak_memory)), bool(result.fits))
        return self.archive[candidate]

    def _evaluate(self, X, out, *args, **kwargs):
        rows = [self.judge(self.decoder.decode(x)) for x in X]
        out["F"] = np.array([[t, m] for t, m, _ in rows])
        out["G"] = np.array([[0.0 if fits else 1.0] for _, _, fits in rows])


def solve_v2_nsga(problem: PlanningProblem, name: str, *, generations: int, population: int, clock: TimeLimit,
                  seed: int) -> SolverResult:
    """NSGA-II of the module docstring; the fastest fitting plan it simulated (every generation run: noted as a budget spent)."""
    deadline = clock
    decoder = Decoder(problem)
    if not decoder.structures:
        return heuristic_no_plan(problem, name, f"no group count of {problem.schedule} fits the layers and "
                                                f"M = {problem.microbatches}", 0.0, seed)
    rng = np.random.default_rng(seed)
    seeded = [decoder.encode_even(i) for i in range(len(decoder.structures))][:population]
    first = np.vstack(seeded + [rng.random(decoder.size) * (1 - 1e-9) for _ in range(population - len(seeded))])
    pymoo_problem = V2Problem(problem, decoder)
    algorithm = NSGA2(pop_size=population, sampling=first, eliminate_duplicates=True)
    algorithm.setup(pymoo_problem, termination=("n_gen", generations), seed=seed, verbose=False)
    stopped = False
    while algorithm.has_next():
        if past(deadline):
            stopped = True
            break
        algorithm.next()
    if not stopped:
        clock.stops.note("budget")  # every generation ran
    fitting = [(t, c) for c, (t, _, fits) in pymoo_problem.archive.items() if fits and math.isfinite(t)]
    wall = clock.elapsed()
    details = {"generations": max(int(algorithm.n_gen or 1) - 1, 0), "evaluations": len(pymoo_problem.archive),
               "structures": len(decoder.structures), "stopped_by_time_limit": stopped}
    if not fitting:
        why = "time limit reached before any evaluated plan fitted" if stopped else "no evaluated plan fits in memory"
        return heuristic_no_plan(problem, name, why, wall, seed, details=details)
    best_time, best = min(fitting, key=lambda tc: (tc[0], tc[1].bounds, tc[1].groups, tc[1].recompute))
    plan: Plan = to_plan(problem, best)
    return SolverResult(name, "feasible", plan, best_time, None, wall, seed, (TracePoint(wall, best_time, None),),
                        "time limit reached before the last generation" if stopped else "", details)


class VirtualNsga(VirtualSolver):
    """``nsga-virtual``: what ``nsga`` runs for the version-2 schedules; returns the fastest fitting plan."""

    name = "nsga-virtual"
    source = "NSGA-II (Deb et al. 2002, pymoo) over structures, random-key boundaries and recompute bits"
    budget_unit = "generations"
    settings = ("generations", "population")

    def __init__(self, *, generations: int = 60, population: int = 48) -> None:
        self.generations = generations
        """Generations to run (the default budget)."""
        self.population = population
        """Population size."""

    @property
    def default_budget(self) -> int:
        """The generations run without ``budget``."""
        return self.generations

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """Plan ``problem``: status ``feasible`` (nothing is proved), no lower bound."""
        return solve_v2_nsga(problem, self.name, generations=int(budget.units), population=self.population,
                             clock=clock, seed=seed)
