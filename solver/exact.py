"""The exact solvers' search (``ilp`` and ``cpsat``): :func:`solve_exact`.

Both solvers first walk the configurations directly (:mod:`pipeplan.solver.enumeration`, a
branch and bound with the bounds of :mod:`pipeplan.solver.bounds`, which proves small and
medium instances optimal without any model).  If that does not finish, they minimise a
*provable lower bound* ``LB(config) <= T(plan)`` over type-level configurations, simulate
the best configuration, keep the best simulated incumbent, exclude that configuration with
a no-good cut and solve again, until the model's optimum reaches the incumbent (a proof
of optimality) or time runs out.  A configuration is simulated on its placements only
while its :func:`pipeplan.solver.bounds.optimistic_time` (the simulator with the best
conceivable links) is below the incumbent.

The pieces: device classes (:mod:`pipeplan.solver.device_classes`) and what a stage can run
on (:mod:`pipeplan.solver.stage_options`); the candidate stages (:mod:`pipeplan.solver.arcs`)
and their table (:mod:`pipeplan.solver.exact_data`); the bounds
(:mod:`pipeplan.solver.bounds`) and the model made of them (:mod:`pipeplan.solver.bound_model`);
placements (:mod:`pipeplan.solver.placements`); the search state
(:mod:`pipeplan.solver.search`); and the plans of other solvers
(:mod:`pipeplan.solver.incumbents`).  This module runs the loop: :func:`solve_exact`.

Exactness of the loop
---------------------
An arc is dropped when its standalone bound already reaches the incumbent, and a recomputing
arc when the same arc without recompute fits (recompute only lengthens ops, and the
simulator is monotone in durations).  The model also carries the cutoff ``T <=
incumbent * (1 - OPT_TOL)``.  A configuration is cut after all its placements were
simulated; if placements were capped, its lower bound goes to a pool whose minimum
caps the reported bound.  Hence ``min(model bound, incumbent, pool)`` is always a
valid lower bound, and an infeasible model proves the incumbent optimal to within
``OPT_TOL`` (the solvers' numerical tolerance).
"""

from __future__ import annotations

import math
from typing import Callable

from pipeplan.solver.arcs import ExactData
from pipeplan.solver.bound_model import LowerBoundModel
from pipeplan.solver.enumeration import enumerate_configurations
from pipeplan.solver.exact_data import build_data
from pipeplan.solver.group_search import group_search
from pipeplan.solver.incumbents import improve_with_ga, warm_start_plans
from pipeplan.solver.infeasibility import tightest_constraint
from pipeplan.solver.placements import plan_config
from pipeplan.solver.problem import PlanningProblem
from pipeplan.solver.result import SolverResult
from pipeplan.solver.search import Search, evaluate
from pipeplan.solver.termination import TimeLimit

MODEL_TOL = 1e-7
"""Relative amount a model solver's optimum is lowered by before it counts as a bound: a MILP
solver's objective honours its constraints only to its feasibility tolerance (CBC's came out
1.5e-8 above the true minimum), which must not put a bound above the optimum."""

MAX_MODEL_ARCS = 150_000
"""Above this many candidate arcs the model is not built (building alone would exceed typical limits)."""

BUILD_SECONDS_PER_ARC = 4e-5
"""About what building the model takes per arc on the 2-core machine this is measured on (CP-SAT:
106,730 arcs in 4.2 s on 32 layers x 16 devices).  The build cannot be interrupted, and a limit of
0.5 s had turned into a 5 s solve: when the build would outlast the time left by more than
:data:`BUILD_OVERRUN_SECONDS`, no model is built."""

BUILD_OVERRUN_SECONDS = 0.5
"""Overrun of the time left that a model build may cause (so small models, built in milliseconds,
are built as before whatever the machine's speed)."""

GROUP_SEARCH_SHARE = 0.3
"""Most of the time limit :mod:`pipeplan.solver.group_search` may take for the incumbent.  It stops on its own
when done (about 4 s on 96 layers x 64 devices), so the share only binds at short limits, where its
plan is the best the solvers return: with 10 % of a 2 s limit on 48 layers x 14 devices of 6 classes
it was cut short and the exact solvers returned the best baseline (421 ms); with 30 %, 347 ms."""

LARGE_CLUSTER = 128
"""Above this many devices no model of the configurations is built in any usual limit (256 devices
give no complete arc table in 60 s), so :mod:`pipeplan.solver.group_search` gets
:data:`GROUP_SEARCH_SHARE_LARGE` of the limit: its plan is what the solvers return there."""

GROUP_SEARCH_SHARE_LARGE = 0.7
"""Most of the time limit group-search may take on clusters above :data:`LARGE_CLUSTER` devices."""

WARM_SHARE_LARGE = 0.15
"""Share of the time limit the fast baselines get before group-search on clusters above
:data:`LARGE_CLUSTER` devices: each of their plans is simulated on thousands of devices (at
4,096 devices ``deepspeed-uniform`` needs 0.5 s for its best plan, which is better than what
group-search finds in 30 s there)."""

GA_SHARE, GA_SHARE_NO_MODEL = 0.2, 0.05
"""Share of the time limit kept for NSGA-II from the incumbent, with and without a model to solve."""

ENUMERATION_SHARE = 0.6
"""Share of the time left that the configuration walk (:mod:`pipeplan.solver.enumeration`) may use before the model."""


def _infeasible_message(data: ExactData) -> str:
    return f"no plan fits in memory: {tightest_constraint(data.problem)}"


def _result(name, search: Search, data: ExactData, clock: TimeLimit, seed, status, iterations, cuts,
            details) -> SolverResult:
    details = dict(details, iterations=iterations, cuts=cuts, arcs=len(data), classes=len(data.classes),
                   options=len(data.options), last_model_status=status)
    if search.best_plan is None:
        if data.complete and (status == "infeasible" or not len(data)):
            search.raise_bound(math.inf)
            return SolverResult(name, "infeasible", None, None, None, clock.elapsed(), seed, tuple(search.trace),
                                _infeasible_message(data), details)
        return SolverResult(name, "timeout-no-solution", None, None, search.bound or None, clock.elapsed(), seed,
                            tuple(search.trace), "time limit reached before a fitting plan was found", details)
    proved = search.proved()  # up to OPT_TOL: the bound stays the proved one (see OPT_TOL)
    search.record()
    message = "" if proved else "time limit reached; the gap is not closed"
    return SolverResult(name, "optimal" if proved else "feasible", search.best_plan, search.best_time,
                        search.bound, clock.elapsed(), seed, tuple(search.trace), message, details)


def solve_exact(problem: PlanningProblem, name: str, make_model: Callable[[ExactData], LowerBoundModel], *,
                time_limit: float, seed: int, details: dict | None = None, enumerate_first: bool = True,
                build_seconds_per_arc: float = BUILD_SECONDS_PER_ARC) -> SolverResult:
    """Run the configuration walk, then the cut loop described in the module docstring; report the result.

    With ``enumerate_first`` (the default) :func:`pipeplan.solver.enumeration.enumerate_configurations`
    first walks the configurations directly, with up to :data:`ENUMERATION_SHARE` of the
    time left; when it finishes, the incumbent is proved optimal without the model.
    Otherwise the model's cut loop goes on from the improved incumbent, if the model can
    be built and handed to its solver in the time left (``build_seconds_per_arc``: what
    that takes per arc, which no time limit can interrupt).
    """
    details = dict(details or {})
    clock = TimeLimit(time_limit).start()
    search = Search(problem, clock)
    large = len(problem.cluster.devices) > LARGE_CLUSTER
    warm_share = WARM_SHARE_LARGE * time_limit if large else min(1.0, 0.03 * time_limit)
    for plan in warm_start_plans(problem, seed, warm_share):
        # hundreds of greedy plans, each simulated, on large clusters: once one fits, only while the share lasts
        if search.best_plan is not None and clock.elapsed() >= 2 * warm_share:
            break
        search.offer(plan)
    share = GROUP_SEARCH_SHARE_LARGE if large else GROUP_SEARCH_SHARE
    for judged in group_search(problem, min(share * time_limit, clock.remaining())).plans:
        search.offer(judged.plan)
    # The slow DP baselines too: an exact solver must never return a plan worse than a
    # baseline would, even when the model does not reach a solution.  They keep their
    # time share, but run after the model when it is built (a proof makes them moot).
    slow_share = min(5.0, 0.1 * time_limit)
    slow_done = False

    def run_slow(share: float) -> None:
        nonlocal slow_done
        slow_done = True
        for slow_plan in warm_start_plans(problem, seed, share, slow=True):
            search.offer(slow_plan)

    # The build stops early enough to leave the slow baselines their share within the limit.
    data = build_data(problem, search.cutoff(), TimeLimit(max(clock.remaining() - slow_share, 0.0)).start())
    too_big = len(data) > MAX_MODEL_ARCS  # no model; the configuration walk may still run
    if not data.complete or (too_big and not enumerate_first):
        # The model may not run: their plans first (with a larger share, at least what a
        # baseline run on its own usually gets), and a tighter cutoff.
        run_slow(min(max(slow_share, min(0.4 * time_limit, 0.5 * clock.remaining())), clock.remaining()))
        if data.complete and not clock.expired():
            data = build_data(problem, search.cutoff(), clock)
            too_big = len(data) > MAX_MODEL_ARCS
    if not data.complete or clock.expired() or (too_big and not enumerate_first):
        if not slow_done:
            run_slow(min(slow_share, clock.remaining()))
        # out of time, or a model too large to build in time: only the model-free bound holds
        search.raise_bound(data.static_bound)
        improve_with_ga(problem, search, clock, seed)
        return _result(name, search, data, clock, seed, "unknown", 0, 0, details)
    search.raise_bound(data.static_bound if len(data) else search.best_time)
    L = len(problem.graph)
    if not (data.table["lo"] == 0).any() or not (data.table["hi"] == L).any():
        # no candidate stage can start or end the pipeline below the cutoff
        search.raise_bound(search.cutoff() if search.best_plan is not None else math.inf)
        if not search.proved() and not slow_done:
            run_slow(min(slow_share, clock.remaining()))
        return _result(name, search, data, clock, seed, "infeasible", 0, 0, details)
    # When the cut loop cannot prove the incumbent in time, a share of the limit goes to
    # NSGA-II from the incumbent (a slow MILP leaves the loop only a few configurations).
    # Without a model the walk is the only source of bound, and on the instances that big
    # (64 devices) NSGA-II has not improved group-search's plans: the walk gets most of it.
    ga_share = (GA_SHARE_NO_MODEL if too_big else GA_SHARE) * time_limit if time_limit >= 10.0 else 0.0
    reserve = ga_share + (0.0 if slow_done else min(slow_share, 0.5 * clock.remaining()))
    if enumerate_first:
        share = max(clock.remaining() - reserve, 0.0) * (1.0 if too_big else ENUMERATION_SHARE)
        walk = enumerate_configurations(data, search, TimeLimit(share).start())
        details.update(enumeration="complete" if walk.complete else "skipped" if walk.skipped else "stopped",
                       enumeration_prefixes=walk.prefixes,
                       enumeration_leaves=walk.leaves, enumeration_passes=walk.passes)
        if walk.complete:  # every configuration below the cutoff was simulated
            search.raise_bound(search.cutoff() if search.best_plan is not None else math.inf)
        else:
            search.raise_bound(walk.bound)
        if search.proved() or (walk.complete and search.best_plan is None):
            status = "not needed" if search.best_plan is not None else "infeasible"
            return _result(name, search, data, clock, seed, status, 0, 0, details)
    build = max(build_seconds_per_arc * len(data) - BUILD_OVERRUN_SECONDS, 0.0)  # time the build needs
    if too_big or clock.remaining() - reserve <= build:
        # no model: too big to build in time, or not built in the time left; the walk's bound stands
        if not slow_done:
            run_slow(min(slow_share, clock.remaining()))
        improve_with_ga(problem, search, clock, seed)
        return _result(name, search, data, clock, seed, "model not built", 0, 0, details)
    model = make_model(data)
    iterations = cuts = 0
    hint = plan_config(data, search.best_plan) if search.best_plan is not None else None
    if hint is not None and hasattr(model, "hint"):
        model.hint(hint)
    status = "unknown"
    while not search.proved() and clock.remaining() - reserve > 0:
        iterations += 1
        status, arc_ids, model_bound = model.solve(search.cutoff(), clock.remaining() - reserve)
        if status == "infeasible":
            # no configuration left below the cutoff: the incumbent is optimal
            search.raise_bound(search.cutoff() if search.best_plan is not None else math.inf)
            break
        if model_bound is not None:
            search.raise_bound(model_bound * (1 - MODEL_TOL))
        if arc_ids is None:
            break
        evaluate(data, search, arc_ids, clock)
        model.exclude(arc_ids)  # valid whatever the model's status: the configuration was simulated
        cuts += 1
    if not search.proved() and not slow_done:
        run_slow(min(slow_share, max(clock.remaining() - ga_share, 0.0)))
    if not search.proved():
        improve_with_ga(problem, search, clock, seed)
    return _result(name, search, data, clock, seed, status, iterations, cuts, details)
