"""Greedy plans for the exact search's incumbent: for each stage count, the fastest devices with layers split by speed.

The plans of other solvers (baselines, group-search, NSGA-II) reach the exact search as
phases of :mod:`pipeplan.solver.portfolio`.
"""

from __future__ import annotations

from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.formats.plan import Plan


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
