"""Plans from other solvers for the exact search's incumbent: baselines and greedy plans before it, NSGA-II after it."""

from __future__ import annotations

import time

from pipeplan.solver.baselines import BASELINES
from pipeplan.solver.nsga import run_nsga
from pipeplan.solver.plan import Plan
from pipeplan.solver.problem import PlanningProblem
from pipeplan.solver.search import Search
from pipeplan.solver.termination import TimeLimit


SLOW_BASELINES = ("Dapple", "Alpa")
"""Baselines (class names) with slow pure-Python DPs: run after the others, with their own time share."""


def greedy_plans(problem: PlanningProblem) -> list[Plan]:
    """For each stage count, the fastest devices with layers split by speed."""
    graph, devices = problem.graph, sorted(problem.cluster.devices, key=lambda d: (-d.speed, -d.memory))
    work = [l.fwd[0] + l.bwd[0] + (l.fwd[1] + l.bwd[1]) * problem.global_batch for l in graph.layers]
    total, plans = sum(work), []
    for count in range(1, problem.stage_limit + 1):
        chosen = devices[:count]
        speed_sum = sum(d.speed for d in chosen)
        bounds, lo, acc, target = [], 0, 0.0, 0.0
        for s, d in enumerate(chosen):
            target += total * d.speed / speed_sum
            hi = lo + 1
            while hi < len(work) - (count - 1 - s) and acc + work[hi - 1] + work[hi] / 2 <= target:
                acc += work[hi - 1]
                hi += 1
            acc += work[hi - 1]
            hi = len(work) if s == count - 1 else hi
            bounds.append((lo, hi))
            lo = hi
        groups = [(d.id,) for d in chosen]
        plans.append(problem.make_plan(bounds, groups, [False] * count))
        if problem.allow_recompute:
            plans.append(problem.make_plan(bounds, groups, [True] * count))
    return plans


def warm_start_plans(problem: PlanningProblem, seed: int, time_limit: float, slow: bool = False) -> list[Plan]:
    """Baseline plans within ``time_limit`` seconds, and the greedy plans.

    Like :func:`pipeplan.solver.baselines.best_baseline`, each baseline gets an equal share of
    what is left, cheapest first.  ``slow=False`` runs every baseline but those of
    :data:`SLOW_BASELINES` (and adds :func:`greedy_plans` after their plans); ``slow=True`` runs only those.
    """
    plans = []
    chosen = [cls for cls in BASELINES if (cls.__name__ in SLOW_BASELINES) == slow]
    end = time.perf_counter() + time_limit
    for n, cls in enumerate(chosen):
        share = (end - time.perf_counter()) / (len(chosen) - n)
        if share <= 0.005:
            break
        try:
            result = cls().solve(problem, time_limit=share, seed=seed)
        except Exception:  # noqa: BLE001
            continue
        if result.plan is not None:
            plans.append(result.plan)
    # the greedy plans last: simulating them all takes seconds on large clusters, and a caller may stop early
    return plans if slow else plans + greedy_plans(problem)


def improve_with_ga(problem: PlanningProblem, search: Search, clock: TimeLimit, seed: int) -> None:
    """Spend time no model can use on NSGA-II, seeded with the incumbent.

    With a fixed microbatch count the GA keeps the equal split, so its plans lie in this
    search space; they only improve the incumbent and never touch the bound.  The GA is
    given its own seeds, so it does not call back into the exact solvers.
    """
    if search.best_plan is None or problem.free_sizes or clock.remaining() < 1.0:
        return
    seeds = [("incumbent", search.best_plan)]
    for round_ in range(8):  # restart from the best front (a new seed each time) while time is left
        run = run_nsga(problem, seed=seed + round_, time_limit=0.9 * clock.remaining(), seeds=seeds)
        for point in run.front:
            search.offer(point.plan)
        seeds = [("incumbent", search.best_plan)] + [("front", p.plan) for p in run.front[:8]]
        if clock.remaining() < 2.0:
            break
