"""The exact search's state (incumbent, bound, pool, trace) and the simulation of a configuration's placements."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from pipeplan.solver.space.arcs import ExactData
from pipeplan.solver.bounds.terms import optimistic_time
from pipeplan.solver.space.placements import placements
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import TracePoint
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.core.termination import TimeLimit


OPT_TOL = 1e-12
"""Relative tolerance of an optimality proof: the float noise of the bounds' sums.

``optimal`` means no plan is faster than the incumbent by more than this (relative),
and the bound reported with it is the one proved, ``incumbent * (1 - OPT_TOL)``, never
the incumbent itself.  At ``1e-6`` (before) a plan 2.3e-7 faster than the one called
optimal was missed on near-ties (devices whose speeds differ by 1e-7), and the
incumbent reported as the bound lay above the true optimum.  The model solvers'
own tolerances do not enter: their optima count as bounds only lowered by
:data:`pipeplan.solver.exact.solve.MODEL_TOL`, and a proof from a model is an infeasible model at the
cutoff."""


@dataclass
class Search:
    """The cut loop's state: incumbent, bounds, trace, and which phase found each."""

    problem: PlanningProblem
    clock: TimeLimit
    best_plan: Plan | None = None
    best_time: float = math.inf
    bound: float = 0.0
    pool: float = math.inf
    trace: list[TracePoint] = field(default_factory=list)
    phase: str = ""
    """The phase running now: what :meth:`offer` and :meth:`raise_bound` credit unless told otherwise."""
    plan_by: str = ""
    """The phase that found the incumbent."""
    bound_by: str = ""
    """The phase that proved the bound."""

    def offer(self, plan: Plan, by: str | None = None) -> None:
        """Simulate ``plan``; it becomes the incumbent when it fits and is faster (credited to ``by``, else :attr:`phase`)."""
        if not self.problem.in_search_space(plan):
            return
        sim = simulate(plan, self.problem.graph, self.problem.cluster, validate=False)
        if sim.fits and sim.iteration_time < self.best_time:
            self.best_plan, self.best_time = plan, sim.iteration_time
            self.plan_by = by or self.phase
            self.record()

    def raise_bound(self, value: float, by: str | None = None) -> None:
        """Raise the bound to ``value`` (capped by the incumbent and the pool), credited to ``by``, else :attr:`phase`."""
        value = min(value, self.best_time, self.pool)
        if value > self.bound:
            self.bound = value
            self.bound_by = by or self.phase
            self.record()

    def record(self) -> None:
        incumbent = self.best_time if self.best_plan is not None else None
        self.trace.append(TracePoint(self.clock.elapsed(), incumbent, self.bound))

    def cutoff(self) -> float:
        return self.best_time * (1 - OPT_TOL) if self.best_plan is not None else math.inf

    def proved(self) -> bool:
        return self.best_plan is not None and self.bound >= self.best_time * (1 - OPT_TOL) * (1 - 1e-12)


def evaluate(data: ExactData, search: Search, arc_ids: Sequence[int], clock: TimeLimit,
             target: float = math.inf, floor: float | None = None, pool_on_clock: bool = True) -> bool:
    """Simulate a configuration's placements while its optimistic time is below the cutoff.

    The cutoff is the incumbent's, or ``target`` when lower (a caller that only claims
    a bound of ``target``).  A configuration whose
    :func:`pipeplan.solver.bounds.terms.optimistic_time` ``floor`` (computed if not given) reaches
    it needs no placement.  With more placements than
    :data:`pipeplan.solver.space.placements.PLACEMENT_LIMIT`, ``floor`` goes to the pool (which
    caps every bound reported).  When the clock stops the placements, it goes to the pool too, unless
    ``pool_on_clock`` is false (a caller that accounts for the configuration itself).

    Returns
    -------
    bool
        Whether the configuration is settled for good: every placement simulated or
        pooled, or ``floor`` at least the incumbent's cutoff.
    """

    def cutoff() -> float:
        return min(search.cutoff(), target)

    problem = data.problem
    lo, hi, opt = data.table["lo"], data.table["hi"], data.table["option"]
    ordered = sorted(arc_ids, key=lambda i: int(lo[i]))
    floor = optimistic_time(data, ordered) if floor is None else floor
    if floor >= cutoff():
        return floor >= search.cutoff()
    bounds = [(int(lo[i]), int(hi[i])) for i in ordered]
    flags = [data.options[int(opt[i])].recompute for i in ordered]
    groups, exhaustive = placements(data, ordered)
    for k, devs in enumerate(groups):
        if floor >= cutoff():
            return floor >= search.cutoff()  # no other placement can beat the cutoff
        if k and clock.remaining() <= 0:
            if not pool_on_clock:
                return False
            search.pool = min(search.pool, floor)
            return True
        search.offer(problem.make_plan(bounds, devs, flags))
    if not exhaustive and floor < search.cutoff():  # placements beyond the limit: pooled
        search.pool = min(search.pool, floor)
    return True
