"""Plans from other solvers for the exact search's incumbent: baselines and greedy plans before it, NSGA-II after it."""

from __future__ import annotations

import math

from pipeplan.solver.baselines import BASELINES
from pipeplan.solver.exact.work import BASELINE_CELLS, GA_GENERATIONS, GA_ROUNDS, GREEDY_AFTER_FIT, SLOW_BASELINES
from pipeplan.solver.heuristics.nsga import run_nsga
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.exact.search import Search
from pipeplan.solver.core.termination import TimeLimit


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


def warm_start_plans(problem: PlanningProblem, seed: int, clock: TimeLimit, slow: bool = False) -> list[Plan]:
    """Baseline plans, cheapest baseline first, and the greedy plans.

    Every baseline the problem is small enough for (:data:`pipeplan.solver.exact.work.BASELINE_CELLS`) runs its whole
    search, with what is left of ``clock`` as its cap (so its plan depends on the machine only
    when that cap fires, which the open watch notes); once ``clock`` has expired the rest are
    skipped.  ``slow=False`` runs every baseline but those
    of :data:`SLOW_BASELINES` (and adds :func:`greedy_plans` after their plans); ``slow=True``
    runs only those.
    """
    plans = []
    cells = len(problem.graph) * len(problem.cluster.devices)
    for cls in BASELINES:
        if (cls.__name__ in SLOW_BASELINES) != slow or cells > BASELINE_CELLS.get(cls.__name__, math.inf):
            continue
        if clock.expired():
            break
        try:
            result = cls().solve(problem, time_limit=clock.remaining(), seed=seed)
        except Exception:  # noqa: BLE001
            continue
        if result.plan is not None:
            plans.append(result.plan)
    # the greedy plans last: simulating them all takes seconds on large clusters (see offer_fast_plans)
    return plans if slow else plans + greedy_plans(problem)


def offer_fast_plans(problem: PlanningProblem, search: Search, seed: int, clock: TimeLimit,
                     greedy_after_fit: int = GREEDY_AFTER_FIT) -> None:
    """Offer ``search`` the fast baselines' and the greedy plans (:func:`warm_start_plans`).

    Once a plan fits, only ``greedy_after_fit`` more are simulated (a count, so the incumbent is
    the same on any machine); the cap ``clock`` stops them too.
    """
    offered_after_fit = 0
    for plan in warm_start_plans(problem, seed, clock):
        if search.best_plan is not None:
            if offered_after_fit >= greedy_after_fit or clock.expired():
                break
            offered_after_fit += 1
        search.offer(plan)


def improve_with_ga(problem: PlanningProblem, search: Search, clock: TimeLimit, seed: int,
                    rounds: int = GA_ROUNDS, generations: int = GA_GENERATIONS) -> None:
    """Run NSGA-II from the incumbent: ``rounds`` runs of ``generations`` each, ``clock`` as the cap.

    With a fixed microbatch count the GA keeps the equal split, so its plans lie in this
    search space; they only improve the incumbent and never touch the bound.  The GA is
    given its own seeds, so it does not call back into the exact solvers.  Each round
    restarts from the best front, with a new seed.
    """
    if search.best_plan is None or problem.free_sizes:
        return
    seeds = [("incumbent", search.best_plan)]
    for round_ in range(rounds):
        if clock.expired():
            return
        run = run_nsga(problem, generations=generations, seed=seed + round_, time_limit=clock.remaining(),
                       seeds=seeds)
        for point in run.front:
            search.offer(point.plan)
        seeds = [("incumbent", search.best_plan)] + [("front", p.plan) for p in run.front[:8]]
