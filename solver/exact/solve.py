"""The exact solvers' search (``ilp`` and ``cpsat``): :func:`solve_exact`.

Both solvers first walk the configurations directly (:mod:`pipeplan.solver.exact.enumeration`, a
branch and bound with the bounds of :mod:`pipeplan.solver.bounds.terms`, which proves small and
medium instances optimal without any model).  If that does not finish, they minimise a
*provable lower bound* ``LB(config) <= T(plan)`` over type-level configurations, simulate
the best configuration, keep the best simulated incumbent, exclude that configuration with
a no-good cut and solve again, until the model's optimum reaches the incumbent (a proof
of optimality) or the model's work budget is spent.  A configuration is simulated on its placements only
while its :func:`pipeplan.solver.bounds.terms.optimistic_time` (the simulator with the best
conceivable links) is below the incumbent.

The pieces: device classes (:mod:`pipeplan.solver.space.device_classes`) and what a stage can run
on (:mod:`pipeplan.solver.space.stage_options`); the candidate stages (:mod:`pipeplan.solver.space.arcs`)
and their table (:mod:`pipeplan.solver.exact.data`); the bounds
(:mod:`pipeplan.solver.bounds.terms`) and the model made of them (:mod:`pipeplan.solver.exact.bound_model`);
placements (:mod:`pipeplan.solver.space.placements`); the search state
(:mod:`pipeplan.solver.exact.search`); and the phases that run around the model
(:mod:`pipeplan.solver.exact.phases`, passed in: :mod:`pipeplan.solver.portfolio` lists
those of the registered solvers).  This module runs the loop: :func:`solve_exact`.

Work, not time
--------------
Every phase stops on counted work (:class:`pipeplan.solver.exact.phases.ExactPhases`, and
the model's own budget), so a solve gives the same plan and record on any machine; the
time limit is only a cap over all of them, and when it cuts a phase the solve's clock
notes it (``stopped_by: time``).

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

from pipeplan.models.errors import InputError
from pipeplan.solver.space.arcs import ExactData
from pipeplan.solver.exact.bound_model import LowerBoundModel
from pipeplan.solver.exact.enumeration import enumerate_configurations
from pipeplan.solver.exact.data import build_data
from pipeplan.solver.exact.phases import ExactPhases, Phase
from pipeplan.solver.bounds.infeasibility import tightest_constraint
from pipeplan.solver.space.placements import plan_config
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.exact.search import Search, evaluate
from pipeplan.solver.core.termination import TimeLimit, WorkBudget

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

CBC_RESERVE = 0.3
"""Share of the time limit a model solver without a work budget (CBC) leaves to the late incumbents
and the improvement phases: its cut loop runs on the clock alone (so its record says ``time`` unless proved)."""


def refuse_free_sizes(name: str, problem: PlanningProblem) -> None:
    """Refuse a problem whose microbatch sizes are decisions: the exact models plan ``M`` equal microbatches.

    Raises
    ------
    InputError
        With ``auto_microbatches`` or ``per_stage``, in one line.
    """
    if problem.free_sizes:
        raise InputError("-", "--solver", f"{name} plans M equal microbatches only; for --microbatches auto or "
                                          f"--per-stage use a solver that chooses the splits (pipeplan plan --help)")


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
                            tuple(search.trace), "time limit reached before a fitting plan was found", details,
                            bound_by=search.bound_by if search.bound else "")
    proved = search.proved()  # up to OPT_TOL: the bound stays the proved one (see OPT_TOL)
    search.record()
    message = "" if proved else "time limit reached; the gap is not closed"
    return SolverResult(name, "optimal" if proved else "feasible", search.best_plan, search.best_time,
                        search.bound, clock.elapsed(), seed, tuple(search.trace), message, details,
                        plan_by=search.plan_by, bound_by=search.bound_by)


def _run_phases(phases: tuple[Phase, ...], problem: PlanningProblem, search: Search, clock: TimeLimit, seed: int,
                details: dict) -> None:
    """Run ``phases`` in order, each credited for what it finds; their facts go to ``details``."""
    for phase in phases:
        search.phase = phase.name
        details.update(phase.run(problem, search, clock, seed))


def solve_exact(problem: PlanningProblem, name: str, make_model: Callable[[ExactData], LowerBoundModel], *,
                clock: TimeLimit, seed: int, phases: ExactPhases, details: dict | None = None,
                enumerate_first: bool = True, build_seconds_per_arc: float = BUILD_SECONDS_PER_ARC) -> SolverResult:
    """Run the phases, the configuration walk, then the cut loop described in the module docstring; report the result.

    Every phase runs its counted budget (``phases``; the model's own budget is held by
    ``make_model``'s model); ``clock`` is only the cap over all of them.  The bound phases run
    first, then the incumbent phases.  With ``enumerate_first`` (the default)
    :func:`pipeplan.solver.exact.enumeration.enumerate_configurations` then walks the
    configurations directly; when it finishes, the incumbent is proved optimal without the
    model.  Otherwise the model's cut loop goes on from the improved incumbent, unless the model
    is too large (:data:`MAX_MODEL_ARCS`), or its build, which no clock can interrupt
    (``build_seconds_per_arc``), would outlast the cap.  The late incumbent phases run when
    the model cannot settle the problem, and the improvement phases after an unproved one.
    The record names the phases that found the plan (``plan_by``) and the bound (``bound_by``).
    """
    details = dict(details or {})
    search = Search(problem, clock)
    # first the bounds: at scale the plans' phases spend the whole clock; their steps are counted
    _run_phases(phases.bound, problem, search, clock, seed, details)
    # then the incumbents, each with its own counted budget: uncut by the clock, their plans are those
    # the solvers they run return, so the exact solvers are never worse than those
    _run_phases(phases.incumbents, problem, search, clock, seed, details)
    # The slow incumbents too: an exact solver must never return a plan worse than such a search
    # would, even when the model does not reach a solution.  They run after the model when it is
    # built (a proof makes them moot).
    slow_done = False

    def run_slow() -> None:
        nonlocal slow_done
        if not slow_done:
            slow_done = True
            _run_phases(phases.late_incumbents, problem, search, clock, seed, details)

    def improve() -> None:
        _run_phases(phases.improvement, problem, search, clock, seed, details)

    search.phase = "static bound"
    data = build_data(problem, search.cutoff(), clock)
    too_big = len(data) > MAX_MODEL_ARCS  # no model; the configuration walk may still run
    if not data.complete or (too_big and not enumerate_first):
        run_slow()  # the model may not run: their plans first, and a tighter cutoff
        if data.complete and not clock.expired():
            data = build_data(problem, search.cutoff(), clock)
            too_big = len(data) > MAX_MODEL_ARCS
    if not data.complete or clock.expired() or (too_big and not enumerate_first):
        run_slow()
        # out of time, or a model too large to build: only the model-free bound holds
        search.raise_bound(data.static_bound, by="static bound")
        improve()
        return _result(name, search, data, clock, seed, "unknown", 0, 0, details)
    search.raise_bound(data.static_bound if len(data) else search.best_time, by="static bound")
    L = len(problem.graph)
    if not (data.table["lo"] == 0).any() or not (data.table["hi"] == L).any():
        # no candidate stage can start or end the pipeline below the cutoff
        search.raise_bound(search.cutoff() if search.best_plan is not None else math.inf, by="candidate stages")
        if not search.proved():
            run_slow()
        return _result(name, search, data, clock, seed, "infeasible", 0, 0, details)
    if enumerate_first:
        search.phase = phases.walk.name
        walk = enumerate_configurations(data, search, clock, WorkBudget(phases.walk.prefixes, stops=clock.stops),
                                        WorkBudget(phases.walk.table_cells, stops=clock.stops))
        details.update(enumeration="complete" if walk.complete else "skipped" if walk.skipped else "stopped",
                       enumeration_prefixes=walk.prefixes,
                       enumeration_leaves=walk.leaves, enumeration_passes=walk.passes,
                       enumeration_table_cells=walk.table_cells)
        if walk.complete:  # every configuration below the cutoff was simulated
            search.raise_bound(search.cutoff() if search.best_plan is not None else math.inf)
        else:
            search.raise_bound(walk.bound)
        if search.proved() or (walk.complete and search.best_plan is None):
            status = "not needed" if search.best_plan is not None else "infeasible"
            return _result(name, search, data, clock, seed, status, 0, 0, details)
    build = max(build_seconds_per_arc * len(data) - BUILD_OVERRUN_SECONDS, 0.0)  # time the build needs
    if too_big or clock.remaining() <= build:
        # no model: too big to build, or the build would outlast the cap; the walk's bound stands
        if not too_big:
            clock.stops.note("time")
        run_slow()
        improve()
        return _result(name, search, data, clock, seed, "model not built", 0, 0, details)
    search.phase = f"{name} model"
    model = make_model(data)
    # a model without a work budget (CBC) runs on the clock: leave the late incumbents and improvement a share
    reserve = CBC_RESERVE * clock.seconds if model.budget is None else 0.0
    iterations = cuts = 0
    hint = plan_config(data, search.best_plan) if search.best_plan is not None else None
    if hint is not None:
        model.hint(hint)
    status = "unknown"
    while not search.proved():
        if clock.remaining() <= reserve:
            clock.stops.note("time")
            break
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
    if not search.proved():
        run_slow()
        improve()
    return _result(name, search, data, clock, seed, status, iterations, cuts, details)
