"""Tensor-parallel degrees and ZeRO levels chosen around any solver: ``--tensor-parallel`` and ``--zero``.

:func:`solve_tensor_parallel` runs a registered solver's algorithm once per *phase*
(:class:`Phase`): a degree ``t`` (every degree of
:func:`~pipeplan.solver.core.problem.tensor_degrees` with ``uniform`` or ``per-stage``,
``t = 1`` alone otherwise) and what the phase's problem assumes: ``full`` (each replica
holds the whole state), ``paired`` (with ZeRO: units of two replicas, each holding the
state of a replica among two, so plans that fit only with ZeRO are in reach) or
``relaxed`` (for the solvers that prove bounds: every cost at most the real one).  Each
phase solves the degree-``t`` problem (each replica of ``t`` devices of one server is one
device: :func:`~pipeplan.solver.space.tensor_parallel.replica_cluster`, ``degree_graph``),
its plan is written back as a ``pipeplan.plan/3`` plan (``expand_plan``), its ZeRO levels
are set (:func:`zero_levels`) and the exact simulator times it.  With ``per-stage`` the
best plan then takes counted moves: one device group to another degree, its devices
re-split into replicas (``with_degree``), kept when the simulator says faster and it fits.

The phase ``t = 1``, ``full`` is the solve the problem gets without the options (same
problem, seed and budget; it comes first and gets the warm start), so the result is
never slower than it.  Each phase gets the whole ``budget``; the time limit is shared
out among the phases left.  The record lists every phase (``details["tensor_parallel"]``).

The lower bound, for a solver that proves one (:func:`combined_bound`), is the smallest
over the degrees of the relaxed phases' bounds under ``1`` and ``uniform``, and the work
bound (``T >= W / V``, valid for every degree and ZeRO level: a layer of time ``T`` on a
replica of ``t`` devices costs ``t (1 - x) T + x T + t C >= T`` device-seconds) under
``per-stage`` (docs/solvers.md).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from pipeplan.models.errors import DeadlockError, InputError
from pipeplan.models.graph import LayerGraph
from pipeplan.solver.bounds.terms import work_bound
from pipeplan.solver.core.problem import PlanningProblem, tensor_degrees
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import TimeLimit
from pipeplan.solver.evaluation.simulator import Simulation, simulate
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.space.tensor_parallel import (degree_graph, expand_plan, homogeneous_servers, paired_graph,
                                                   paired_layout, replica_cluster, with_degree, with_zero)

DEGREE_MOVES = 64
"""Most per-stage moves (exact simulations) after the phases, with ``per-stage``: a few passes over the
groups of a plan of up to ten groups and four degrees."""

OPTIMAL_TOLERANCE = 1e-9
"""Relative slack under which a plan's time equals the bound (the exact solvers' bounds carry rounding)."""

PAIR = 2
"""Replicas per unit of a ``paired`` phase: each holds the sharded state of a replica among two."""

Solve = Callable[..., SolverResult]


@dataclass(frozen=True)
class Candidate:
    """A plan of the real cluster with its ZeRO levels set, and the simulator's verdict."""

    plan: Plan
    """The ``pipeplan.plan/3`` plan (a ``/1`` or ``/2`` plan when it uses no degree above 1 and no ZeRO)."""
    simulation: Simulation
    """Its exact timing and memory."""

    @property
    def time(self) -> float:
        """The iteration time."""
        return self.simulation.iteration_time


def state_hints(problem: PlanningProblem) -> list[tuple[str, float]]:
    """``(name, state_factor)`` per state hint: ``full``, and ``paired`` when ZeRO may shard the state.

    ``paired`` is a replica's state among :data:`PAIR` replicas at the highest level
    allowed: ``w + g + o / 2`` (ZeRO-1) or ``w + (g + o) / 2`` (ZeRO-2), with the default
    split ``w = g = 1``, ``o = state_factor - 2`` (docs/model.md 8.2, 8.4).
    """
    full = problem.state_factor
    top = problem.max_zero if problem.zero == "auto" else int(problem.zero)
    if top == 0 or not problem.allow_replication:  # one replica per stage: ZeRO shards nothing
        return [("full", full)]
    w, g, o = 1.0, 1.0, full - 2.0
    paired = w + g + o / PAIR if top == 1 else w + (g + o) / PAIR
    return [("full", full), ("paired", paired)] if paired < full else [("full", full)]


def zero_levels(plan: Plan, graph: LayerGraph, cluster: Cluster, problem: PlanningProblem) -> Candidate:
    """``plan`` with the ZeRO levels ``problem`` asks, timed.

    A fixed level goes to every stage.  ``auto`` gives level 0 to a stage of one replica
    (nothing to shard), level 1 to the others (ZeRO costs no time in the model and divides
    the step and the optimizer state by the replicas: docs/model.md 8.3, 8.4), and level 2,
    when ``max_zero`` allows it, to the stages of each group that does not fit at level 1.
    """
    if problem.zero != "auto":
        z = int(problem.zero)
        made = with_zero(plan, [z] * len(plan.stages)) if z else plan
        return Candidate(made, simulate(made, graph, cluster))
    levels = [1 if st.replicas > 1 else 0 for st in plan.stages]
    made = with_zero(plan, levels)
    found = Candidate(made, simulate(made, graph, cluster))
    if found.simulation.fits or problem.max_zero < 2:
        return found
    owners = plan.stage_groups
    over = {g for g, cost in enumerate(found.simulation.groups) if cost.peak_memory > cost.capacity}
    raised = [2 if z and owners[s] in over else z for s, z in enumerate(levels)]
    if raised == levels:
        return found
    made = with_zero(plan, raised)
    return Candidate(made, simulate(made, graph, cluster))


@dataclass(frozen=True)
class Phase:
    """One solve of the outer loop: a degree and what the degree-``t`` problem assumes."""

    degree: int
    """``t``: every stage's degree."""
    hint: str
    """``full`` (each replica holds the whole state), ``paired`` (units of :data:`PAIR` replicas, each holding
    the state of a replica among two) or ``relaxed`` (every cost at most the real one: the solver's bound holds for
    every degree-``t`` plan)."""
    state_factor: float
    """The degree-``t`` problem's state factor."""

    @property
    def relaxed(self) -> bool:
        """Whether the phase's bound is a bound over the degree's plans."""
        return self.hint == "relaxed"


def relaxed_state(problem: PlanningProblem) -> float:
    """The least state per parameter byte a replica can hold: ``w + g`` under ZeRO-1, ``w`` under ZeRO-2 (any number
    of replicas), the whole ``state_factor`` without ZeRO."""
    top = problem.max_zero if problem.zero == "auto" else int(problem.zero)
    return problem.state_factor if top == 0 else 2.0 if top == 1 else 1.0


def searched_degrees(problem: PlanningProblem) -> list[int]:
    """The degrees the phases try: those of the options, or ``[1]`` when no layer lets tensor parallelism split
    anything (no ``tp_share`` above 0).

    A replica of ``t`` devices that splits nothing runs what one of its devices would run
    alone, with the same memory and collectives of nothing or more: the plan that leaves
    its other devices idle is as fast, and degree 1 holds it.
    """
    if problem.tensor_parallel == "1" or not any(max(l.tp_share or (0.0,)) > 0 for l in problem.graph.layers):
        return [1]
    return tensor_degrees(problem.cluster, problem.max_tensor_parallel)


def phases_for(problem: PlanningProblem, proves: bool) -> list[Phase]:
    """The phases, ``t = 1`` with the full state first (the solve the problem gets without the options).

    A solver that does not prove bounds gets a ``full`` and (with ZeRO) a ``paired`` phase
    per degree.  One that proves them gets, after the first, a ``relaxed`` phase per degree
    (its plan competes too), so the smallest of their bounds holds for every plan with one
    degree (the ``relaxed`` phase of ``t = 1`` is left out where it is the first phase);
    where a relaxed plan does not fit once mapped back, :func:`fallbacks` follow it.
    """
    degrees = searched_degrees(problem)
    first = Phase(1, "full", problem.state_factor)
    if not proves:
        return [Phase(t, hint, factor) for t in degrees for hint, factor in state_hints(problem)]
    relaxed = [Phase(t, "relaxed", relaxed_state(problem)) for t in degrees if t > 1 or problem.zero != "0"]
    return [first, *relaxed]


def fallbacks(problem: PlanningProblem, phase: Phase) -> list[Phase]:
    """The phases that follow a ``relaxed`` phase whose plan does not fit once mapped back: the degree's ``full``
    phase (but for ``t = 1``: it ran first) and, with ZeRO, its ``paired`` one.

    The relaxed state holds for any number of replicas, the step shrinks by all of them:
    a plan of few replicas may need more memory than it assumed.
    """
    return [Phase(phase.degree, hint, factor) for hint, factor in state_hints(problem)
            if phase.relaxed and (hint != "full" or phase.degree > 1)]


def _phase_problem(problem: PlanningProblem, phase: Phase):
    """The phase's degree-``t`` problem and its replica layout, or ``(None, why)``."""
    paired = phase.hint == "paired"
    layout = (paired_layout if paired else replica_cluster)(problem.cluster, phase.degree)
    if layout is None:
        return None, f"no server has {PAIR * phase.degree if paired else phase.degree} devices"
    share = 1.0
    if phase.relaxed and problem.zero != "0":  # a ZeRO stage steps 1/r of its state, r at most every replica
        share = 1.0 / len(layout.cluster.devices)
    elif paired:  # a unit's replicas each step half of the state
        share = 1.0 / PAIR
    if phase.degree == 1 and share == 1.0:  # degree 1, whole step: the graph itself (the plain solve's problem)
        graph = problem.graph
    else:
        graph = degree_graph(problem.graph, layout, share, optimistic=phase.relaxed)
    try:
        made = replace(problem, graph=paired_graph(graph) if paired else graph, cluster=layout.cluster,
                       state_factor=phase.state_factor, tensor_parallel="1", zero="0")
    except ValueError as exc:
        return None, str(exc)
    return (made, layout), ""


def solve_tensor_parallel(solve: Solve, problem: PlanningProblem, *, time_limit: float, seed: int,
                          budget: float | None, warm_start: Plan | None = None, within: TimeLimit | None = None,
                          proves: bool = False, moves: int = DEGREE_MOVES) -> SolverResult:
    """Plan ``problem`` choosing the degrees and ZeRO levels around ``solve`` (an algorithm's ``solve``).

    Parameters
    ----------
    solve : callable
        ``solve(problem, time_limit=, seed=, budget=, warm_start=, within=)`` of the algorithm
        that plans the problem's space.
    problem : PlanningProblem
        With ``tensor_parallel`` or ``zero`` set (:attr:`PlanningProblem.tensor_search`).
    time_limit, seed, budget, warm_start, within
        As :meth:`pipeplan.solver.core.algorithm.Solver.solve` takes them; the budget goes to
        every phase, the time limit is shared out, the warm start goes to the first phase
        (a warm start with degrees above 1 or ZeRO is compared with the result as it is).
    proves : bool
        Whether the algorithm proves bounds (:func:`phases_for`).
    moves : int
        Most per-stage moves (``per-stage`` only).

    Returns
    -------
    SolverResult
        The fastest fitting plan over the phases and moves, timed by the simulator, with
        every phase in ``details["tensor_parallel"]`` and, for a solver that proves bounds,
        a bound over every plan the options allow (:func:`combined_bound`).

    Raises
    ------
    InputError
        When the algorithm refuses the problem (the first phase's refusal).
    """
    started = time.perf_counter()
    clock = within.nested(time_limit) if within is not None else TimeLimit(time_limit)
    phases = phases_for(problem, proves)
    records: list[dict[str, Any]] = []
    results: list[SolverResult | None] = []
    best: Candidate | None = None
    best_phase = -1
    first_start = warm_start if warm_start is not None and not warm_start.uses_v3 else None
    i = -1
    while i + 1 < len(phases):
        i += 1
        phase = phases[i]
        row: dict[str, Any] = {"degree": phase.degree, "state": phase.hint, "state_factor": phase.state_factor}
        records.append(row)
        results.append(None)
        made, why = _phase_problem(problem, phase)
        share = clock.left() / (len(phases) - i)
        if made is None or share <= 0 or clock.expired():
            row["skipped"] = why or "the time limit was spent"
            continue
        sub, layout = made
        result = solve(sub, time_limit=share, seed=seed, budget=budget,
                       warm_start=first_start if i == 0 else None, within=clock)
        results[i] = result
        row.update(status=result.status, model_time=result.iteration_time, lower_bound=result.lower_bound,
                   stopped_by=result.stopped_by, budget=result.budget, wall_time=result.wall_time,
                   plan_by=result.plan_by)
        found = _mapped_back(result, layout, problem, row)
        if found is None or not found.simulation.fits:
            if result.status != "infeasible":
                phases.extend(fallbacks(problem, phase))
            continue
        if best is None or found.time < best.time:
            best, best_phase = found, i
    if warm_start is not None and warm_start.uses_v3:  # degrees above 1 or ZeRO: compared as it is
        start = Candidate(warm_start, simulate(warm_start, problem.graph, problem.cluster))
        records.append({"degree": "warm start", "state": "its own", "iteration_time": start.time,
                        "fits": start.simulation.fits, "plan_by": "warm start"})
        if start.simulation.fits and (best is None or start.time < best.time):
            best, best_phase = start, len(records) - 1
    moved = {"evaluations": 0, "accepted": 0, "budget": moves}
    if best is not None and problem.tensor_parallel == "per-stage":
        best = _improve_degrees(best, problem, clock, moves, moved)
    bound, bound_by = combined_bound(problem, phases, results) if proves else (None, "")
    return _record(problem, best, best_phase, phases, records, results, moved, bound, bound_by, seed,
                   time.perf_counter() - started)


def _mapped_back(result: SolverResult, layout, problem: PlanningProblem, row: dict[str, Any]) -> Candidate | None:
    """A phase's plan as a plan of the real cluster with its ZeRO levels, timed (``None`` without one); ``row``
    records the outcome."""
    if result.plan is None:
        return None
    real = replace(expand_plan(result.plan, layout), state_factor=problem.state_factor, extra={})
    try:
        found = zero_levels(real, problem.graph, problem.cluster, problem)
    except (InputError, DeadlockError, ValueError) as exc:  # a degree-t plan the real cluster refuses
        row["refused"] = str(exc)
        return None
    row.update(iteration_time=found.time, fits=found.simulation.fits)
    return found


def combined_bound(problem: PlanningProblem, phases: list[Phase],
                   results: list[SolverResult | None]) -> tuple[float | None, str]:
    """A lower bound over every plan the options allow, and what proved it.

    Under ``tensor_parallel`` ``1`` or ``uniform``, on servers of one kind of device each,
    the smallest over the degrees of the bound of the degree's relaxed problem (the first
    phase's where it is that problem; ``inf`` where it proved no plan fits), and never below
    the work bound.  Otherwise (``per-stage``, mixed servers, a degree without a bound) the
    work bound alone (:func:`work_bound`).
    """
    floor = work_bound(problem)
    if problem.tensor_parallel == "per-stage" or not homogeneous_servers(problem.cluster):
        return floor, "work bound"
    per_degree: dict[int, float | None] = {}
    for phase, result in zip(phases, results):
        if not phase.relaxed and (phase.degree, "relaxed") in {(p.degree, p.hint) for p in phases}:
            continue
        if result is None:
            value = math.inf if phase.degree > 1 and replica_cluster(problem.cluster, phase.degree) is None else None
        elif result.status == "infeasible" and result.stopped_by == "proved":
            value = math.inf
        else:
            value = result.lower_bound
        per_degree[phase.degree] = value
    if any(v is None for v in per_degree.values()) or not per_degree:
        return floor, "work bound"
    lowest = min(v for v in per_degree.values() if v is not None)
    if lowest <= floor:
        return floor, "work bound"
    return lowest, "the smallest over the degrees of the bound of each degree's relaxed problem"


def _improve_degrees(start: Candidate, problem: PlanningProblem, clock: TimeLimit, moves: int,
                     moved: dict[str, Any]) -> Candidate:
    """``start`` after passes of one-group degree changes, each kept when faster and fitting (``moves`` at most)."""
    degrees = searched_degrees(problem)
    best = start
    improved = True
    while improved and moved["evaluations"] < moves and not clock.expired():
        improved = False
        for g in range(len(best.plan.groups)):
            current = best.plan.stages[best.plan.stage_groups.index(g)].tensor_parallel
            for t in degrees:
                if t == current or moved["evaluations"] >= moves or clock.expired():
                    continue
                plan = with_degree(best.plan, problem.cluster, g, t)
                if plan is None or not _inside(problem, plan):
                    continue
                moved["evaluations"] += 1
                try:
                    found = zero_levels(plan, problem.graph, problem.cluster, problem)
                except (InputError, DeadlockError, ValueError):
                    continue
                if found.simulation.fits and found.time < best.time:
                    best, current, improved = found, t, True
                    moved["accepted"] += 1
    return best


def _inside(problem: PlanningProblem, plan: Plan) -> bool:
    """Whether ``plan`` respects the problem's switches (replication, stages, splits)."""
    return problem.in_split_space(plan) if problem.free_sizes else problem.in_search_space(plan)


def _record(problem: PlanningProblem, best: Candidate | None, best_phase: int, phases: list[Phase],
            records: list[dict[str, Any]], results: list[SolverResult | None], moved: dict[str, Any],
            bound: float | None, bound_by: str, seed: int, wall: float) -> SolverResult:
    """The one record of the phases and moves."""
    inner = [r for r in results if r is not None]
    stops = [r.stopped_by for r in inner]
    stopped = next((s for s in ("interrupt", "time") if s in stops), None)
    if stopped is None and any(r.get("skipped") == "the time limit was spent" for r in records):
        stopped = "time"
    stopped = stopped or ("budget" if "budget" in stops else "complete")
    summary = {"mode": problem.tensor_parallel, "zero": problem.zero, "max_zero": problem.max_zero,
               "degrees": sorted({p.degree for p in phases}), "phases": records, "moves": moved}
    algorithm = inner[0].algorithm if inner else ""
    budget = inner[0].budget if inner else None
    what = (f"tensor parallel {problem.tensor_parallel} (degrees {', '.join(map(str, summary['degrees']))}), "
            f"zero {problem.zero}")
    bound_note = f"; bound: {bound_by}" if bound is not None else ""
    if best is None:
        proved = bound == math.inf
        return SolverResult("", "infeasible" if proved else "timeout-no-solution", None, None,
                            None if proved else bound, wall, seed,
                            message=f"{what}: " + ("every degree's relaxed problem is proved infeasible"
                                                   if proved else "no phase found a fitting plan (phases in details), "
                                                                  "which proves nothing"),
                            details={"tensor_parallel": summary}, stopped_by="proved" if proved else stopped,
                            algorithm=algorithm, budget=budget, bound_by="" if proved or bound is None else bound_by)
    row = records[best_phase]
    proved = bound is not None and best.time <= bound * (1 + OPTIMAL_TOLERANCE)
    moves = f"; {moved['accepted']} of {moved['evaluations']} per-stage moves kept" \
        if problem.tensor_parallel == "per-stage" else ""
    message = f"{what}: best from the phase t={row['degree']} ({row['state']} state){moves}{bound_note}"
    return SolverResult("", "optimal" if proved else "feasible", best.plan, best.time,
                        None if bound is None else min(bound, best.time), wall, seed,
                        message=message, details={"tensor_parallel": summary},
                        stopped_by="proved" if proved else stopped, algorithm=algorithm,
                        plan_by=f"{row.get('plan_by') or algorithm} at t={row['degree']}, {row['state']} state",
                        bound_by=bound_by if bound is not None else "", budget=budget)
