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

Before that search it starts from the best version-1 partitions (:func:`partition_seeds`):
``group-search`` plans the problem under ``1f1b`` (one stage per group, its budget of
patterns counted against this solver's simulations), and the device groups and layer
ranges of its best :data:`PARTITION_PLANS` plans become version-2 candidates
(:func:`pipeplan.solver.space.virtual_space.from_partition`: each group's layers in ``v``
work-balanced chunks), simulated first.  So for a fixed ``v`` the plan is never slower than
the version-2 form of any of those partitions that fits (the version-1 plan itself is a
plan of another schedule and may be faster).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import replace
from typing import Iterator

from pipeplan.solver.baselines.common import Bounds, Groups, rank_devices, split_groups
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import TimeLimit, WorkBudget
from pipeplan.solver.exact.virtual_search import DEFAULT_SIMULATIONS, solve_v2
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.heuristics.group_search import EVALUATIONS, group_search
from pipeplan.solver.space.virtual_space import Candidate, VirtualSolver, even_bounds, from_partition, virtual_choices

PARTITION_PLANS = 8
"""Version-1 plans of ``group-search`` whose partitions seed the search (fastest first)."""

AUTO_SEED_V = 4
"""Largest ``v`` the partitions are turned into when ``v`` is left to the search (every ``v`` up to it)."""


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


def partition_seeds(problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget) -> tuple[list[Candidate], int]:
    """The version-2 forms of the best version-1 partitions (see the module docstring), and the work they cost.

    ``group-search`` runs on the problem under ``1f1b`` with at most :data:`EVALUATIONS` patterns (no more
    than ``budget`` has left), and the patterns it built are taken from ``budget``; the partitions of its best
    :data:`PARTITION_PLANS` plans are turned into candidates for each ``v`` the problem takes (with ``v``
    left to the search, those up to :data:`AUTO_SEED_V`), fastest plan first.
    """
    patterns = int(min(EVALUATIONS, budget.left()))
    try:
        one = replace(problem, schedule="1f1b", virtual_stages=None)
    except (TypeError, ValueError):
        return [], 0
    if patterns < 1:
        return [], 0
    run = group_search(one, clock, evaluations=patterns)
    budget.spend(run.evaluated)
    seeds = []
    for judged in run.plans[:PARTITION_PLANS]:
        groups = [stage.devices for stage in judged.plan.stages]
        ranges = [stage.layers for stage in judged.plan.stages]
        choices = virtual_choices(problem, len(groups))
        if problem.virtual_stages is None and problem.needs.stages_per_group is None:
            choices = [v for v in choices if v <= AUTO_SEED_V]
        for v in choices:
            candidate = from_partition(problem, groups, ranges, v)
            if candidate is not None:
                seeds.append(candidate)
    return seeds, run.evaluated


class VirtualGroupSearch(VirtualSolver):
    """``group-search-virtual``: the restricted space of the module docstring, searched best first."""

    name = "group-search-virtual"
    source = ("pipeplan's group-search for groups holding several stages: equal-width groups of the ranked "
              "devices, even and work-balanced virtual stages")
    budget_unit = "simulations"
    default_budget = DEFAULT_SIMULATIONS

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """Plan ``problem`` from :func:`partition_seeds`, then over the restricted space (``feasible`` at best:
        it proves nothing); the version-1 patterns count as simulations in the record."""
        budget = budget or WorkBudget(DEFAULT_SIMULATIONS, stops=clock.stops)
        seeds, spent = partition_seeds(problem, clock, budget)
        found = solve_v2(problem, self.name, clock=clock, seed=seed, budget=budget, seeds=seeds,
                         boundaries=heuristic_boundaries(problem), groupings=equal_groupings, proves=False)
        details = dict(found.details, simulations=found.details["simulations"] + spent, seeds=len(seeds),
                       v1_patterns=spent)
        return replace(found, details=details)
