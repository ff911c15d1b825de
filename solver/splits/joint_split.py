"""Exact joint search over pipelines *and* microbatch splits, for small instances.

``cpsat`` with ``auto_microbatches`` or ``per_stage`` runs ``cpsat-joint`` (:class:`CpSatJoint`):
it must find the best plan over every
partition, device mapping, recompute choice *and* split.  The split model of
:mod:`pipeplan.solver.splits.cpsat_split` is exact for one fixed pipeline, so this module wraps it in a
branch and bound over pipelines:

1. enumerate every pipeline (contiguous stages, ordered disjoint device groups,
   recompute flags) inside the problem's switches, up to symmetry (devices with the
   same server, speed and memory are interchangeable);
2. give each a lower bound :func:`pipeline_bound` valid for *every* split of it;
3. visit pipelines in order of that bound, solving each one's split exactly with
   CP-SAT, until the next bound reaches the incumbent.

The result is ``optimal`` only when every pipeline was either solved to proved
optimality or pruned by its bound.  When there are too many pipelines to enumerate,
:func:`solve_joint` returns ``None`` and the caller falls back to the decomposition of
:mod:`pipeplan.solver.splits.cpsat_split` (whose bound covers one pipeline only).
"""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import combinations, product
from typing import Iterator, Sequence

from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.exact.cpsat import DEFAULT_BUDGET, CpSatSolver
from pipeplan.solver.exact.phases import ExactPhases
from pipeplan.solver.splits.cpsat_split import optimize_splits
from pipeplan.solver.splits.equal_splits import fastest, solve_equal_splits
from pipeplan.solver.bounds.infeasibility import exceeds
from pipeplan.solver.formats.plan import Plan, Stage, equal_split
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult, TracePoint
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.core.termination import TimeLimit, WorkBudget, interrupted

MAX_PIPELINES = 4000
"""Most pipelines the joint search enumerates before handing over to the decomposition."""

Pipeline = tuple[tuple[tuple[int, int], ...], tuple[tuple[str, ...], ...], tuple[bool, ...]]
"""Stage ranges, device groups and recompute flags."""


def _device_groups(problem: PlanningProblem, stages: int) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Ordered disjoint non-empty device groups, one per stage, up to identical devices.

    Devices with the same ``(server, speed, memory)`` are interchangeable, so only one
    group sequence per multiset pattern is produced: each group takes the first free
    devices of each kind (the lexicographically first ids), so a group is a count per
    kind.  The sequences come in the order of a walk over every combination of free
    devices (by group size, then by the combination's positions), yielding each pattern
    the first time it is reached; generating the counts directly makes each sequence cost
    one step, where the walk over combinations visits every interchangeable copy
    (65,535 groups of 16 devices for a one-stage pipeline).
    """
    devices = problem.cluster.devices
    ids = [d.id for d in devices]
    positions: dict[tuple, list[int]] = {}  # each kind's devices, in the cluster's order
    for index, d in enumerate(devices):
        positions.setdefault((d.server, d.speed, d.memory), []).append(index)
    kinds = list(positions.values())
    max_size = len(ids) if problem.allow_replication else 1

    def counts(kind: int, used: tuple[int, ...], cap: int) -> Iterator[tuple[int, ...]]:
        """Every count per kind from ``kind`` on, within the free devices, summing to at most ``cap``."""
        if kind == len(kinds):
            yield ()
            return
        for c in range(min(len(kinds[kind]) - used[kind], cap) + 1):
            for rest in counts(kind + 1, used, cap - c):
                yield (c, *rest)

    def extend(used: tuple[int, ...], prefix: tuple) -> Iterator[tuple]:
        if len(prefix) == stages:
            yield prefix
            return
        room = len(ids) - sum(used) - (stages - len(prefix) - 1)  # leave a device for each later stage
        groups = []
        for taken in counts(0, used, min(max_size, room)):
            picked = sorted(p for k, c in enumerate(taken) for p in kinds[k][used[k]:used[k] + c])
            if picked:
                groups.append((len(picked), picked, taken))
        for _, picked, taken in sorted(groups):
            yield from extend(tuple(u + c for u, c in zip(used, taken)), prefix + (tuple(ids[p] for p in picked),))

    yield from extend((0,) * len(kinds), ())


def pipelines(problem: PlanningProblem, limit: int = MAX_PIPELINES) -> list[Pipeline] | None:
    """Every pipeline of the search space, or ``None`` if there are more than ``limit``."""
    n = len(problem.graph)
    found: list[Pipeline] = []
    for stages in range(1, problem.stage_limit + 1):
        for cuts in combinations(range(1, n), stages - 1):
            edges = (0, *cuts, n)
            bounds = tuple(zip(edges[:-1], edges[1:]))
            for groups in _device_groups(problem, stages):
                flags = product((False, True), repeat=stages) if problem.allow_recompute else [(False,) * stages]
                for recompute in flags:
                    found.append((bounds, groups, tuple(recompute)))
                    if len(found) > limit:
                        return None
    return found


def pipeline_bound(problem: PlanningProblem, pipeline: Pipeline) -> float:
    """A lower bound on the iteration time of ``pipeline`` under *any* split.

    Every stage runs each of its ``m >= 1`` microbatches forward and backward; with
    ``q_k = ceil(n_k / r)`` and ``sum n_k = B`` its busy time is at least
    ``(a + b * B / r) / v`` (``a``, ``b``: the summed fixed and per-sample costs of a
    forward plus a backward, plus a forward again when recomputing).  Before its first
    op, every earlier stage ran one forward (at least its fixed cost), and after its
    last op every earlier stage still runs one backward; a replicated stage also
    all-reduces after its last op.  Each is a path in the simulator's dependency graph.
    """
    graph, cluster = problem.graph, problem.cluster
    best = 0.0
    head = 0.0  # fixed costs of one forward and one backward on the earlier stages
    for (lo, hi), group, recompute in zip(*pipeline):
        af, bf, ab, bb = graph.range_time(lo, hi)
        speed = min(cluster.device_index[d].speed for d in group)
        r = len(group)
        fixed = (af + ab + (af if recompute else 0.0)) / speed
        per = (bf + bb + (bf if recompute else 0.0)) / speed
        busy = fixed + per * problem.global_batch / r
        allreduce = 0.0
        if r > 1:
            allreduce = 2 * (r - 1) * (cluster.lat(group) + graph.range_sum("params", lo, hi) / (r * cluster.bw(group)))
        best = max(best, head + busy, head / 2 + busy + allreduce)
        head += (af + ab) / speed
    return best


def fits_some_split(problem: PlanningProblem, pipeline: Pipeline) -> bool:
    """False when no split of the batch lets ``pipeline`` fit in memory (a proof); True otherwise.

    Each stage's peak is at least its training state plus either of two stashes, per
    replica (``q = ceil(n / r)`` samples of each microbatch ``n``):

    - the largest microbatch (every split of ``B`` into at most ``K`` has one of at
      least ``ceil(B / K)``), stashed between its forward and its backward: ``q * A``,
      or ``q * (I + A)`` while its backward recomputes;
    - the microbatches in flight before ``B_0``: all of them under GPipe, and under 1F1B
      ``min(S - s, m)`` of them.  All of them hold at least ``ceil(B / r)`` samples
      together; ``S - s`` of them (when ``K > S - s``) at least one sample each.  With
      recompute each keeps its input ``I``, and ``B_0`` adds at least one sample's ``A``.
    """
    graph, cluster = problem.graph, problem.cluster
    top = problem.split_counts.stop - 1
    largest = -(-problem.global_batch // top)
    stages = len(pipeline[0])
    for s, ((lo, hi), group, recompute) in enumerate(zip(*pipeline)):
        r = len(group)
        q_big, every = -(-largest // r), -(-problem.global_batch // r)
        in_flight = every if problem.needs.forwards_first or top <= stages - s else min(every, stages - s)
        act, inp = graph.range_sum("act", lo, hi), graph.stage_input_bytes(lo)
        stash = max(q_big * (inp + act), in_flight * inp + act) if recompute else max(q_big, in_flight) * act
        need = problem.state_factor * graph.range_sum("params", lo, hi) + stash
        if exceeds(need, min(cluster.device_index[d].memory for d in group)):
            return False
    return True


def _start_plan(problem: PlanningProblem, pipeline: Pipeline) -> Plan | None:
    """A fitting plan of ``pipeline`` to anchor the split search, or ``None``.

    Tries the equal split of ``microbatches``, then the equal splits of every other
    allowed count, most microbatches first (small microbatches usually hold the least
    memory; with replicas, rounding up per replica can make fewer hold less).
    """
    bounds, groups, recompute = pipeline
    counts = problem.split_counts
    for m in dict.fromkeys((problem.microbatches if problem.microbatches in counts else counts.stop - 1,
                            *reversed(counts))):
        split = equal_split(problem.global_batch, m)
        plan = Plan(problem.graph.name, problem.cluster.name, problem.global_batch, problem.state_factor,
                    problem.schedule, tuple(Stage(b, g, split, rc) for b, g, rc in zip(bounds, groups, recompute)))
        if simulate(plan, problem.graph, problem.cluster, validate=False).fits:
            return plan
    return None


def solve_joint(problem: PlanningProblem, *, name: str, clock: TimeLimit, seed: int = 0,
                budget: WorkBudget | None = None) -> SolverResult | None:
    """Best plan over pipelines and splits, by branch and bound; ``None`` if too large.

    Parameters
    ----------
    problem : PlanningProblem
        With ``auto_microbatches`` and/or ``per_stage``.
    name : str
        The solver name to put in the record.
    clock : TimeLimit
        The cap of the whole search (what cuts it short is noted in its record).
    seed : int
        CP-SAT's seed (one worker: same seed, same plan).
    budget : WorkBudget, optional
        CP-SAT deterministic seconds for every split search together; when it is spent
        the pipelines left stay open (the result is then ``feasible``).

    Returns
    -------
    SolverResult or None
        ``optimal`` when every pipeline was solved or pruned; else ``feasible`` with the
        smallest bound of what is left; ``None`` when the pipelines are too many.
    """
    found = pipelines(problem)
    if found is None:
        return None
    order = sorted((pipeline_bound(problem, p), i) for i, p in enumerate(found))
    best_plan, best_time = None, math.inf
    open_bounds: list[float] = []  # bounds of pipelines not settled (not proved, or skipped)
    settled_bounds: list[float] = []  # proved bounds of the settled ones: "optimal" is up to a tolerance
    trace: list[TracePoint] = []
    solved = unstarted = 0
    timed_out = False
    for position, (bound, i) in enumerate(order):
        if bound >= best_time * (1 - 1e-9):
            settled_bounds.append(bound)  # the least bound of this and every later pipeline
            break  # none of them can beat the incumbent by more than 1e-9
        left = clock.left()
        if left <= 0.05 or interrupted() or (budget is not None and budget.exhausted()):
            open_bounds.extend(b for b, _ in order[position:])
            timed_out = True
            if interrupted():
                clock.stops.note("interrupt")
            if left <= 0.05:
                clock.stops.note("time")
            break
        if not fits_some_split(problem, found[i]):
            continue  # settled: no split fits it
        base = _start_plan(problem, found[i])
        if base is None:
            open_bounds.append(bound)  # no fitting start: not searched, so not settled
            unstarted += 1
            continue
        search = optimize_splits(problem, base, time_limit=left, seed=seed, budget=budget, within=clock)
        solved += 1
        if search.status != "optimal":
            open_bounds.append(max(bound, search.lower_bound or 0.0))
        elif search.lower_bound is not None:
            settled_bounds.append(max(bound, search.lower_bound))
        if search.iteration_time < best_time:
            best_plan, best_time = search.plan, search.iteration_time
            trace.append(TracePoint(clock.elapsed(), best_time, None))
    wall = clock.elapsed()
    details = {"pipelines": len(found), "split_searches": solved, "unsettled": len(open_bounds),
               "unstarted": unstarted}
    why = _unsettled_reason(len(open_bounds), unstarted, timed_out)
    if best_plan is None:
        if not open_bounds:
            return SolverResult(name, "infeasible", None, None, None, wall, seed, tuple(trace),
                                "no pipeline fits in memory under any split", details)
        return SolverResult(name, "timeout-no-solution", None, None, min(open_bounds), wall, seed, tuple(trace),
                            f"no plan found: {why}", details)
    lower = min([best_time, *open_bounds, *settled_bounds])  # never the incumbent when a tolerance proved it
    status = "optimal" if not open_bounds else "feasible"
    trace.append(TracePoint(wall, best_time, lower))
    return SolverResult(name, status, best_plan, best_time, lower, wall, seed, tuple(trace),
                        "" if status == "optimal" else why, details)


def _unsettled_reason(open_count: int, unstarted: int, timed_out: bool) -> str:
    """Why ``open_count`` pipelines stay open: time, or no equal split to start their search from."""
    parts = []
    if timed_out:
        parts.append(f"the time limit, the work budget or an interrupt left {open_count - unstarted} pipelines "
                     f"unsearched or unproved")
    elif open_count > unstarted:
        parts.append(f"{open_count - unstarted} pipelines not proved optimal in time")
    if unstarted:
        parts.append(f"{unstarted} pipelines fit some split by the memory bound but no equal split, which "
                     f"their split search needs to start from")
    return "; ".join(parts)


class CpSatJoint(Solver):
    """``cpsat-joint``: pipelines and microbatch splits together; what ``cpsat`` runs when the splits are decisions.

    Small instances: the exact branch and bound of :func:`solve_joint` (``optimal`` when proved
    over every pipeline and split).  Larger ones: the decomposition of
    :mod:`pipeplan.solver.splits.cpsat_split`, the best equal-split plan of ``cpsat`` (its own
    count in half the time, other counts in what that leaves: see
    :func:`pipeplan.solver.splits.equal_splits.solve_equal_splits`) with its split then chosen
    by CP-SAT; that is reported ``feasible`` with no lower bound, since the bound it proves
    covers one pipeline only.  ``phases`` are those of the equal-split ``cpsat`` solves.
    """

    name = "cpsat-joint"
    source = ("pipeplan: branch and bound over pipelines, each split solved by the CP-SAT scheduling model "
              "(UMPIPE's unequal microbatches, proved); beyond 4,000 pipelines the exact equal-split plan, "
              "then CP-SAT over its split")
    budget_unit = "CP-SAT deterministic seconds"
    default_budget = DEFAULT_BUDGET
    proves = True
    chooses_splits = True

    def __init__(self, workers: int = 1, phases: ExactPhases = ExactPhases()) -> None:
        self.workers = workers
        """CP-SAT workers (1 keeps same seed, same plan)."""
        self.phases = phases
        """The phases of the equal-split ``cpsat`` solves of the decomposition."""

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """Plan ``problem`` (see the class docstring); ``budget`` is shared by every CP-SAT split search
        and scales the equal-split solves' phases by itself over :data:`pipeplan.solver.exact.cpsat.DEFAULT_BUDGET`."""
        joint = solve_joint(problem, name=self.name, clock=clock, seed=seed, budget=budget)
        if joint is not None:
            return joint
        time_limit = clock.seconds
        equal_solver = CpSatSolver(self.workers, phases=self.phases.scaled(budget.units / DEFAULT_BUDGET))
        equal = solve_equal_splits(equal_solver, problem, time_limit=0.5 * time_limit, seed=seed, within=clock)
        base, seeded = fastest(equal.values()), clock.elapsed()
        if base.plan is None:
            return replace(base, name=self.name, wall_time=clock.elapsed())
        left = max(0.5, time_limit - clock.elapsed())
        search = optimize_splits(problem, base.plan, time_limit=left, seed=seed, workers=self.workers, budget=budget,
                                 within=clock)
        wall = clock.elapsed()
        details = {"method": "decomposition: exact equal-split pipeline, then CP-SAT over its splits",
                   "equal_split_status": base.status, "equal_split_time": base.iteration_time,
                   "equal_splits": {m: [r.status, r.iteration_time] for m, r in equal.items()},
                   "split_status": search.status, "split_lower_bound": search.lower_bound}
        trace = (TracePoint(seeded, base.iteration_time, None), TracePoint(wall, search.iteration_time, None))
        return SolverResult(self.name, "feasible", search.plan, search.iteration_time, None, wall, seed, trace,
                            "too many pipelines for the joint proof; the split is optimised for one pipeline",
                            details)
