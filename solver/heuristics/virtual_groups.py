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

Last, layers move between stages while that helps (:func:`polish`, with
:func:`pipeplan.solver.exact.virtual_search.move_layers`): from its plan, from every seed and
from one speed-balanced split per group count (:func:`speed_starts`), fastest start first, on
at most :data:`POLISH_SIMULATIONS` of the budget.  Neither the even nor the work-balanced split
balances groups of different speeds whose stages interleave.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import replace
from typing import Iterator

import numpy as np

from pipeplan.solver.baselines.common import Bounds, Groups, rank_devices, split_groups
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult, TracePoint
from pipeplan.solver.core.termination import TimeLimit, WorkBudget, past
from pipeplan.solver.exact.virtual_search import (DEFAULT_SIMULATIONS, MOVE_GAIN, Moved, fitting_plan, move_layers,
                                                 solve_v2)
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.heuristics.group_search import EVALUATIONS, group_search
from pipeplan.solver.heuristics.group_search import balanced_bounds as least_bottleneck_bounds
from pipeplan.solver.schedules.schedule import num_stages, stage_group
from pipeplan.solver.space.virtual_space import (Candidate, VirtualSolver, even_bounds, from_partition, group_counts,
                                                schedule_accepts, virtual_choices)

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
    than ``budget`` has left) and without its polishing, and the patterns it built are taken from ``budget``;
    the partitions of its best :data:`PARTITION_PLANS` plans are turned into candidates for each ``v`` the
    problem takes (with ``v`` left to the search, those up to :data:`AUTO_SEED_V`), fastest plan first.
    """
    patterns = int(min(EVALUATIONS, budget.left()))
    try:
        one = replace(problem, schedule="1f1b", virtual_stages=None)
    except (TypeError, ValueError):
        return [], 0
    if patterns < 1:
        return [], 0
    # unpolished: polishing pulls the best plans onto one partition (four copies of one on bench_solvers' 64 x 16),
    # and the version-2 search wants distinct ones (interleaved-1f1b, v = 4: 269.4 ms from polished seeds, 258.4 ms)
    run = group_search(one, clock, evaluations=patterns, polish_top=0)
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


POLISH_SIMULATIONS = 3_000
"""Most simulations :func:`polish` spends, starts and descents together.  On bench_solvers' 64 x 16 instance
the descents from the plan and every partition seed took 800 to 1,700 simulations under each version-2
schedule, and 8,000 simulations over every start found no faster plan than 3,000 (2026-12-03)."""


def speed_bounds(problem: PlanningProblem, groups: Groups, virtual: int) -> Bounds | None:
    """Stage ranges with the least bottleneck when each stage's per-sample work ``b_f + b_b`` runs at its group's
    devices times their slowest speed (:func:`pipeplan.solver.heuristics.group_search.balanced_bounds`);
    ``None`` when the layers are too few.

    The even and the work-balanced splits ignore the groups' speeds: with fast and slow groups whose stages
    interleave they leave the slow groups as much work as the fast ones.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> graph = LayerGraph.chain("g", [Layer(f"l{i}", (0, 1), (0, 2), 0, 0, 0) for i in range(6)])
    >>> devices = (Device("fast", "s", 2.0, 1e12), Device("slow", "s", 1.0, 1e12))
    >>> p = PlanningProblem(graph, Cluster("c", (Link(1e9, 0, "s"),), Link(1e9, 0), devices), global_batch=2,
    ...                     microbatches=2, schedule="looped-bfs", virtual_stages=1)
    >>> speed_bounds(p, (("fast",), ("slow",)), 1)
    ((0, 4), (4, 6))
    """
    speed = {d.id: d.speed for d in problem.cluster.devices}
    R = len(groups)
    work = np.concatenate(([0.0], np.cumsum([l.fwd[1] + l.bwd[1] for l in problem.graph.layers])))
    rate = [len(g) * min(speed[d] for d in g) for g in groups]
    prefixes = [work / rate[stage_group(problem.schedule, s, R)]
                for s in range(num_stages(problem.schedule, R, virtual))]
    bounds = least_bottleneck_bounds(prefixes)
    return None if bounds is None else tuple(bounds)


def speed_starts(problem: PlanningProblem) -> list[Candidate]:
    """For each group count and ``v`` (up to :data:`AUTO_SEED_V` when ``v`` is left to the search), the widest
    equal-width groups of the ranked devices with :func:`speed_bounds`: starts for :func:`polish`."""
    ranked = rank_devices(problem)
    out = []
    for R in group_counts(problem):
        if schedule_accepts(problem.schedule, R, problem.microbatches):
            continue
        width = len(ranked) // R if problem.allow_replication else 1
        groups = split_groups(ranked, [width] * R)
        choices = virtual_choices(problem, R)
        if problem.virtual_stages is None and problem.needs.stages_per_group is None:
            choices = [v for v in choices if v <= AUTO_SEED_V]
        for v in choices:
            bounds = speed_bounds(problem, groups, v)
            if bounds is not None:
                out.append(Candidate(v, groups, bounds, (False,) * len(bounds)))
    return out


def polish(problem: PlanningProblem, found: SolverResult, starts: list[Candidate], budget: WorkBudget,
           clock: TimeLimit) -> Moved:
    """Move layers (:func:`pipeplan.solver.exact.virtual_search.move_layers`) from ``found``'s plan and from each
    of ``starts`` that fits (with every stage recomputing when it does not fit plain and the problem allows it),
    fastest start first, on at most :data:`POLISH_SIMULATIONS` of ``budget``; the fastest plan reached.

    Descents from different starts end at different splits: on bench_solvers' 64 x 16 instance the descent
    from the best seed is not the best one under ``interleaved-1f1b`` with ``v = 4`` (269.4 ms against 258.4
    ms from another seed) nor under ``interleaved-zb`` (260.0 ms against 251.6 ms); on 16 x 4 under ``zbv``
    the best plan (203.3 ms, against 207.7 ms from the seeds) comes from the speed-balanced split of four
    single-device groups, whose start (212.1 ms) is slower than the seeds' plan (2026-12-03).

    Returns
    -------
    Moved
        The fastest plan (``found``'s when no descent beats it, ``None`` when there is none); ``kept``
        counts the moves that led to it, ``simulations`` every plan simulated here (all spent from
        ``budget``).
    """
    best = Moved(found.plan, found.iteration_time if found.plan is not None else math.inf, 0, 0)
    share = int(min(POLISH_SIMULATIONS, budget.left()))
    if share < 1:
        return best
    mine = WorkBudget(share)  # the cap is this phase's rule, not the solve's stop
    timed = [(found.iteration_time, 0, found.plan)] if found.plan is not None else []
    for order, candidate in enumerate(dict.fromkeys(starts), 1):
        if past(clock) or mine.left() < 1:
            break
        plan, time, _ = fitting_plan(problem, candidate, mine, clock)
        if plan is not None and plan != found.plan:
            timed.append((time, order, plan))
    for time, _, plan in sorted(timed, key=lambda t: t[:2]):
        if past(clock) or mine.left() < 1:
            break
        moved = move_layers(problem, plan, time, mine, clock)
        if moved.time < best.time * (1 - MOVE_GAIN):
            best = Moved(moved.plan, moved.time, 0, moved.kept)
    budget.spend(mine.spent)
    return replace(best, simulations=int(mine.spent))


class VirtualGroupSearch(VirtualSolver):
    """``group-search-virtual``: the restricted space of the module docstring, searched best first."""

    name = "group-search-virtual"
    source = ("pipeplan's group-search for groups holding several stages: equal-width groups of the ranked "
              "devices, even and work-balanced virtual stages")
    budget_unit = "simulations"
    default_budget = DEFAULT_SIMULATIONS

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """Plan ``problem`` from :func:`partition_seeds`, then over the restricted space, then move layers
        between the stages of its plan (``feasible`` at best: it proves nothing); the version-1 patterns count
        as simulations in the record."""
        budget = budget or WorkBudget(DEFAULT_SIMULATIONS, stops=clock.stops)
        seeds, spent = partition_seeds(problem, clock, budget)
        found = solve_v2(problem, self.name, clock=clock, seed=seed, budget=budget, seeds=seeds,
                         boundaries=heuristic_boundaries(problem), groupings=equal_groupings, proves=False)
        details = dict(found.details, simulations=found.details["simulations"] + spent, seeds=len(seeds),
                       v1_patterns=spent)
        polished = polish(problem, found, seeds + speed_starts(problem), budget, clock)
        details.update(simulations=details["simulations"] + polished.simulations, layer_moves=polished.kept)
        if polished.plan is not found.plan:
            bound = None if found.lower_bound is None else min(found.lower_bound, polished.time)
            trace = found.trace + (TracePoint(clock.elapsed(), polished.time, bound),)
            found = replace(found, plan=polished.plan, iteration_time=polished.time, trace=trace, lower_bound=bound)
        return replace(found, details=details)
