"""``group-search-virtual``: ``group-search`` for the version-2 schedules, over a restricted space.

What ``group-search`` runs for a schedule whose device groups hold several stages
(:class:`VirtualGroupSearch`), and the start phase of ``virtual-bnb``.

The space of :mod:`pipeplan.solver.space.virtual_space` restricted the way group-search restricts
version 1: the ``R`` groups are consecutive slices of equal width ``r`` of the devices
ranked fastest first (:func:`equal_groupings`, so a group
keeps a server's devices together), for every ``r`` up to ``D // R``; the ``S`` stages
are the even split of the layers (torchtitan's) and the split that balances the
per-sample work ``b_f + b_b`` (cut where the prefix sum first reaches ``j/S`` of the
total).  Every ``v`` the schedule takes is tried, recompute where it makes a plan fit, by the
best-first search of :func:`pipeplan.solver.exact.virtual_search.solve_v2` (proving
nothing: the space is a part of the whole).
"""

from __future__ import annotations

import bisect
import itertools
from typing import Iterator

from pipeplan.solver.baselines.common import Bounds, Groups, rank_devices, split_groups
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import TimeLimit, WorkBudget
from pipeplan.solver.exact.virtual_search import DEFAULT_SIMULATIONS, solve_v2
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.space.virtual_space import VirtualSolver, even_bounds


def balanced_bounds(work: list[float], stages: int) -> Bounds | None:
    """Cut the layers where the prefix sum of ``work`` first reaches ``j/S`` of the total; ``None`` if a stage is empty.

    Examples
    --------
    >>> balanced_bounds([3.0, 1.0, 1.0, 1.0], 2)
    ((0, 1), (1, 4))
    """
    prefix = list(itertools.accumulate(work))
    total = prefix[-1] if prefix else 0.0
    if total <= 0:
        return None
    cuts = [0] + [bisect.bisect_left(prefix, total * j / stages) + 1 for j in range(1, stages)] + [len(work)]
    if any(a >= b for a, b in zip(cuts, cuts[1:])):
        return None
    return tuple(zip(cuts[:-1], cuts[1:]))


def heuristic_boundaries(problem: PlanningProblem):
    """``boundaries(layers, stages)``: the even and the work-balanced split, each once."""
    work = [l.fwd[1] + l.bwd[1] for l in problem.graph.layers]

    def boundaries(layers: int, stages: int) -> list[Bounds]:
        found = [even_bounds(layers, stages)]
        balanced = balanced_bounds(work, stages)
        if balanced is not None and balanced not in found:
            found.append(balanced)
        return found

    return boundaries


def equal_groupings(problem: PlanningProblem, groups: int) -> Iterator[Groups]:
    """``groups`` consecutive slices of equal width of the ranked devices, every width that fits."""
    ranked = rank_devices(problem)
    widths = range(1, len(ranked) // groups + 1) if problem.allow_replication else range(1, 2)
    for r in widths:
        yield split_groups(ranked, [r] * groups)


class VirtualGroupSearch(VirtualSolver):
    """``group-search-virtual``: the restricted space of the module docstring, searched best first."""

    name = "group-search-virtual"
    source = ("pipeplan's group-search for groups holding several stages: equal-width groups of the ranked "
              "devices, even and work-balanced virtual stages")
    budget_unit = "simulations"
    default_budget = DEFAULT_SIMULATIONS

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """Plan ``problem`` over the restricted space (``feasible`` at best: it proves nothing)."""
        return solve_v2(problem, self.name, clock=clock, seed=seed, budget=budget,
                        boundaries=heuristic_boundaries(problem), groupings=equal_groupings, proves=False)
