"""Programs built for a plan's own partition (``pipeplan synthesize``, :func:`pipeplan.synthesize`), partitions
searched with them (``--schedule adaptive``, :func:`search_partitions`), and their time-memory front
(:func:`memory_front`).

A plan fixes a partition (stages, device groups, splits, recompute) and a schedule.
:func:`synthesize_plan` keeps the partition and replaces the schedule by ``custom``
programs built from the partition's own action times, links, all-reduce, step and
memory caps (spec section 7): by the list scheduler
(:func:`~pipeplan.solver.schedules.synthesis.synthesize`), or, with ``exact``, by the
CP-SAT order model (:func:`~pipeplan.solver.schedules.order_model.solve_order`) started
from the list scheduler's programs.  The plan's own programs are a candidate too, so
the result is never slower than the plan given when those fit the caps.

Both times are the simulator's (``simulate`` of the plan given and of the plan
written), and the written plan carries what ran in its ``"synthesis"`` field
(:data:`RECORD_FIELDS`): the algorithm, its status (``optimal`` only when proved, and
then only over the orders of this partition's actions), a lower bound, the gap, the
wall time, the seed and the work limits.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

from pipeplan.models.graph import LayerGraph
from pipeplan.solver.evaluation.simulator import Simulation, simulate
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.schedules.order_model import FLOAT_MARGIN, OrderLimits, OrderProblem, solve_order
from pipeplan.solver.schedules.programs import FORWARD, FULL_BACKWARD, Action
from pipeplan.solver.schedules.synthesis import (ProgramDeadlock, ScheduleInstance, custom_plan, evaluate,
                                                 schedule_instance, split_backwards, synthesize)

__all__ = ["SynthesizedPlan", "synthesize_plan", "order_lower_bound", "DEFAULT_WORK", "RECORD_FIELDS",
           "DEFAULT_EVALUATIONS", "partition_key", "Scored", "neighbours", "PartitionSearch", "search_partitions",
           "DEFAULT_FRONT_STEPS", "memory_front", "non_dominated"]

DEFAULT_WORK = 30.0
"""CP-SAT deterministic seconds the exact order model may use by default.  The proofs of
``experiments/bench_synthesis.py`` on 4 groups x 8 microbatches (docs/benchmarks.md) end
well within it; larger partitions stop at it with a bound."""

RECORD_FIELDS = ("algorithm", "status", "iteration_time", "lower_bound", "gap", "wall_time", "seed", "workers",
                 "budget", "work", "stopped_by", "space", "source", "memory_fraction", "before")
"""The fields of the ``"synthesis"`` record a synthesized plan carries."""


@dataclass(frozen=True)
class SynthesizedPlan:
    """What :func:`synthesize_plan` built."""

    plan: Plan
    """The ``custom`` plan on the same partition, its record in ``extra["synthesis"]``."""
    before: Simulation
    """The simulator's result for the plan given."""
    after: Simulation
    """The simulator's result for :attr:`plan`."""
    record: dict[str, Any]
    """What ran and what it proved (:data:`RECORD_FIELDS`), as written into the plan."""
    fits: bool
    """Whether every group's peak memory is within its cap (the device memory times the memory fraction)."""
    reason: str | None = None
    """Why no program fits the caps, when none does."""


def order_lower_bound(instance: ScheduleInstance, split_backward: bool = True) -> float:
    """A lower bound on the iteration time of every program of the partition.

    Each group runs its actions one at a time and then its all-reduce and step, so no
    order ends before ``max_g (sum of g's action times + AR_g + STEP_g)``, lowered by
    :data:`~pipeplan.solver.schedules.order_model.FLOAT_MARGIN` for the simulator's
    floating-point sums (which add in program order).

    Examples
    --------
    See ``tests/test_cmd_synthesize.py``.
    """
    busy = [0.0] * len(instance.groups)
    for st in instance.stages:
        back = (math.fsum(st.input_grad) + math.fsum(st.weight_grad)) if split_backward else math.fsum(st.backward)
        busy[st.group] += math.fsum(st.forward) + back
    return max(b + g.allreduce + g.step for b, g in zip(busy, instance.groups)) * (1 - FLOAT_MARGIN)


def synthesize_plan(plan: Plan, graph: LayerGraph, cluster: Cluster, *, exact: bool = False,
                    work: float = DEFAULT_WORK, time_limit: float | None = None, workers: int = 1, seed: int = 0,
                    memory_fraction: float = 1.0, split_backward: bool = True) -> SynthesizedPlan:
    """The best programs found for ``plan``'s partition, as a ``custom`` plan with its record.

    Parameters
    ----------
    plan : Plan
        A validated plan of ``graph`` on ``cluster`` (any schedule): its stages, groups,
        splits and recompute flags are kept, its schedule and programs replaced.
    graph : LayerGraph
    cluster : Cluster
    exact : bool
        Run the CP-SAT order model from the list scheduler's programs (else the list
        scheduler only).
    work : float
        CP-SAT deterministic seconds (only with ``exact``): what decides the result.
    time_limit : float, optional
        Wall-clock seconds CP-SAT may take at most (only with ``exact``); a result it cuts
        short says so in ``stopped_by`` and may differ on another machine.
    workers : int
        CP-SAT workers (interleaved search: the result depends on the seed and work only).
    seed : int
        CP-SAT's random seed.
    memory_fraction : float
        Each group's memory cap as a share of its smallest device's memory, in ``(0, 1]``.
    split_backward : bool
        Let each backward run as ``I`` and a later ``W`` (else whole ``B`` s only).

    Returns
    -------
    SynthesizedPlan
        The plan, both simulations and the record.  Its ``status`` is ``optimal`` when
        the time is proved shortest over every order of the partition's actions (CP-SAT's
        proof, or the list scheduler's time meeting :func:`order_lower_bound`), else
        ``feasible``; when no program found fits the caps, ``infeasible`` if that is
        proved (by CP-SAT, or by the memory-minimal program when the stages split alike),
        else ``unknown``, and :attr:`SynthesizedPlan.reason` says why.

    Raises
    ------
    ValueError
        For a ``memory_fraction`` outside ``(0, 1]``, ``workers < 1``, or a non-positive ``work``
        or ``time_limit``.

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import load_plan
    >>> from pipeplan.models.graph import load_graph
    >>> from pipeplan.solver.formats.cluster import load_cluster
    >>> graph, cluster = load_graph("examples/chain8.graph.json"), load_cluster("examples/two-servers.cluster.json")
    >>> made = synthesize_plan(load_plan("examples/hetero.plan.json", graph, cluster), graph, cluster)
    >>> made.plan.schedule, made.after.iteration_time <= made.before.iteration_time
    ('custom', True)
    """
    if not work > 0 or not math.isfinite(work):
        raise ValueError(f"work must be positive finite deterministic seconds, got {work}")
    if time_limit is not None and (not time_limit > 0 or not math.isfinite(time_limit)):
        raise ValueError(f"time_limit must be positive finite seconds, got {time_limit}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    clock = time.perf_counter()
    before = simulate(plan, graph, cluster, validate=False)
    instance = schedule_instance(plan, graph, cluster, memory_fraction=memory_fraction)
    syn = synthesize(instance, split_backward=split_backward)
    programs, timeline, source = syn.programs, syn.timeline, syn.source
    own = _own_programs(plan, split_backward)
    if own is not None:
        try:
            mine = evaluate(instance, own)
        except ProgramDeadlock:  # a validated plan has none; kept safe for hand-made plans
            mine = None
        if mine is not None and mine.fits and (not timeline.fits or mine.iteration_time < timeline.iteration_time):
            programs, timeline, source = own, mine, f"the plan's own programs ({plan.schedule})"
    bound = order_lower_bound(instance, split_backward)
    record: dict[str, Any] = {"algorithm": "list-scheduler", "seed": seed, "workers": None, "budget": None,
                              "work": None, "stopped_by": "done",
                              "space": "F, I, W; any order" if split_backward else "F, B; any order"}
    proved = ""  # "optimal" or "infeasible" when a proof says so
    if exact:
        result = solve_order(OrderProblem(instance, split_backward=split_backward),
                             OrderLimits(work=work, wall_clock=time_limit, workers=workers, seed=seed),
                             hint=programs if timeline.fits else None)
        record.update(algorithm="cpsat-order", workers=workers, budget=work, work=result.work,
                      stopped_by=result.stopped_by, space=result.space)
        if result.programs is not None and result.timeline is not None and result.timeline.fits and (
                not timeline.fits or result.timeline.iteration_time < timeline.iteration_time):
            programs, timeline, source = result.programs, result.timeline, "cpsat-order"
        if result.lower_bound is not None:
            bound = max(bound, result.lower_bound)
        if result.status in ("optimal", "infeasible"):
            proved = result.status
    if not timeline.fits:
        # with the stages split alike, the memory-minimal program not fitting is a proof (see synthesize)
        proved = "infeasible" if proved == "infeasible" or instance.equal_splits else ""
        status = proved or "unknown"
    elif proved == "optimal" or timeline.iteration_time <= bound * (1 + 4 * FLOAT_MARGIN):  # equal but for rounding
        status = "optimal"
    else:
        status = "feasible"
    time_ = timeline.iteration_time
    record.update(status=status, iteration_time=time_ if timeline.fits else None,
                  lower_bound=min(bound, time_) if timeline.fits else bound,
                  gap=(max(0.0, time_ - bound) / time_) if timeline.fits and time_ > 0 else None,
                  source=source, memory_fraction=memory_fraction,
                  before={"schedule": plan.schedule, "iteration_time": before.iteration_time,
                          **({"solver": {k: plan.extra["solver"].get(k) for k in ("name", "status")}}
                             if isinstance(plan.extra.get("solver"), dict) else {})})
    extra = {k: v for k, v in plan.extra.items() if k not in ("solver", "synthesis")}  # the record is no solver's
    made = custom_plan(replace(plan, extra=extra), programs)
    after = simulate(made, graph, cluster, validate=False)
    record["wall_time"] = time.perf_counter() - clock
    made = made.with_extra(synthesis={k: record[k] for k in RECORD_FIELDS})
    reason = None if timeline.fits else (syn.reason or "no program found fits every group's memory cap")
    return SynthesizedPlan(made, before, after, made.extra["synthesis"], timeline.fits, reason)


def _own_programs(plan: Plan, split_backward: bool) -> tuple[tuple[Action, ...], ...] | None:
    """The plan's own programs in the space searched (``B`` split when backwards split), or None outside it."""
    own = tuple(tuple(program) for program in plan.actions())
    if split_backward:
        return split_backwards(own)
    if any(a.kind not in (FORWARD, FULL_BACKWARD) for p in own for a in p):
        return None
    return own


# --------------------------------------------------------------------------- partitions searched jointly
DEFAULT_EVALUATIONS = 120
"""Partitions the joint search (:func:`search_partitions`) synthesizes programs for by default.  On the six
shapes of ``experiments/bench_synthesis.py`` the boundary walk from the fixed schedules' plans ends within
it (docs/schedules.md, section ``adaptive``)."""


def partition_key(plan: Plan) -> tuple:
    """What a plan's programs depend on: its stages (layers, devices, splits, recompute, tensor parallelism, ZeRO)."""
    return tuple((st.layers, st.devices, st.microbatches, st.recompute, st.tensor_parallel, st.zero)
                 for st in plan.stages)


@dataclass(frozen=True)
class Scored:
    """One partition the joint search synthesized programs for."""

    plan: Plan
    """The ``custom`` plan the list scheduler built for it."""
    iteration_time: float
    """Its iteration time (the list scheduler's, the simulator's arithmetic)."""
    origin: str
    """Where the partition comes from: ``"<schedule>"`` (that schedule's plan) or ``"<schedule> + k moves"`` (its neighbour ``k`` moves away)."""


def neighbours(plan: Plan, allow_recompute: bool = True) -> list[Plan]:
    """The partitions one move away: a stage boundary moved by one layer, one stage's recompute switched,
    or two device groups' devices swapped.

    Every stage keeps at least one layer; the stages per group and the splits are kept.
    Swapping moves every stage of one group onto the other's devices and back, which
    matters on unequal devices and links.

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Stage
    >>> p = Plan("g", "c", 4, 4.0, "custom", (Stage((0, 2), ("a",), (2, 2)), Stage((2, 4), ("b",), (2, 2))))
    >>> [[(st.layers, st.devices) for st in n.stages] for n in neighbours(p, allow_recompute=False)]
    [[((0, 1), ('a',)), ((1, 4), ('b',))], [((0, 3), ('a',)), ((3, 4), ('b',))], [((0, 2), ('b',)), ((2, 4), ('a',))]]
    """
    stages = list(plan.stages)
    out = []
    for c in range(1, len(stages)):
        for step in (-1, 1):
            cut = stages[c].layers[0] + step
            if not stages[c - 1].layers[0] < cut < stages[c].layers[1]:
                continue
            moved = list(stages)
            moved[c - 1] = replace(stages[c - 1], layers=(stages[c - 1].layers[0], cut), ops=None)
            moved[c] = replace(stages[c], layers=(cut, stages[c].layers[1]), ops=None)
            out.append(replace(plan, stages=tuple(moved), extra={}))
    if allow_recompute:
        for s, st in enumerate(stages):
            switched = list(stages)
            switched[s] = replace(st, recompute=not st.recompute)
            out.append(replace(plan, stages=tuple(switched), extra={}))
    groups = list(dict.fromkeys(st.devices for st in stages))
    for i in range(len(groups)):
        for j in range(i + 1, len(groups)):
            swap = {groups[i]: groups[j], groups[j]: groups[i]}
            out.append(replace(plan, stages=tuple(replace(st, devices=swap.get(st.devices, st.devices))
                                                  for st in stages), extra={}))
    return out


@dataclass(frozen=True)
class PartitionSearch:
    """What :func:`search_partitions` found."""

    best: Scored | None
    """The fastest fitting partition with its synthesized programs, or ``None`` when none fits."""
    seeds: tuple[Scored | None, ...]
    """Each seed's synthesized result, in the order given (``None`` where none fits, or the work ran out first)."""
    evaluations: int
    """Partitions synthesized (the counted work)."""
    stopped_by: str
    """``"complete"`` (no move improves the best partitions), ``"budget"`` (the evaluations ran out) or ``"time"``."""
    pruned: int = 0
    """Neighbours left unsynthesized (and uncounted): no program of theirs could beat the current partition
    (:func:`order_lower_bound` not below its time)."""


def search_partitions(seeds: list[tuple[str, Plan]], graph: LayerGraph, cluster: Cluster, *,
                      evaluations: int = DEFAULT_EVALUATIONS, memory_fraction: float = 1.0,
                      allow_recompute: bool = True, deadline: float | None = None) -> PartitionSearch:
    """The fastest partition found with synthesized programs, from ``seeds`` and their neighbours.

    Every seed partition (deduplicated) gets list-scheduled programs
    (:func:`~pipeplan.solver.schedules.synthesis.synthesize`); then, from the fastest
    seeds first, a first-improvement walk over :func:`neighbours` moves to a neighbour
    whose synthesized time is shorter, until no move improves or ``evaluations``
    partitions have been synthesized.  A neighbour none of whose programs can be faster than
    the current partition (:func:`order_lower_bound`, each group's work plus its all-reduce
    and step, not below the current time) is skipped without being synthesized or counted:
    the walk would not move there.  A seed's own programs are a candidate on its
    partition, and the first seed is always synthesized, so with the seeds fastest first
    the result is never slower than any seed.  The result depends on the seeds, the
    budget and the instance only (ties: the first found); ``deadline`` (a
    ``time.perf_counter`` value) is a cap whose hitting ``stopped_by`` reports.

    Parameters
    ----------
    seeds : list of (str, Plan)
        Where each partition comes from (a schedule's name) and the plan.
    graph, cluster
        What the plans run on.
    evaluations : int
        Most partitions synthesized (the seeds included).
    memory_fraction : float
        Each group's cap as a share of its device memory (:func:`synthesize_plan`).
    allow_recompute : bool
        Whether a move may switch a stage's recompute.
    deadline : float, optional
        ``time.perf_counter()`` value past which no partition is started.
    """
    seen: dict[tuple, Scored | None] = {}
    count = 0
    stopped = "complete"

    def score(origin: str, plan: Plan) -> Scored | None:
        nonlocal count
        key = partition_key(plan)
        if key in seen:
            return seen[key]
        count += 1
        try:
            instance = schedule_instance(plan, graph, cluster, memory_fraction=memory_fraction)
            syn = synthesize(instance)
        except (ProgramDeadlock, ValueError):
            seen[key] = None
            return None
        programs, timeline = syn.programs, syn.timeline
        own = None if plan.schedule_class.from_plan else _own_programs(plan, True)
        if own is not None:  # a seed's own programs: the result is never slower than the seed
            try:
                mine = evaluate(instance, own)
            except ProgramDeadlock:
                mine = None
            if mine is not None and mine.fits and (not timeline.fits or mine.iteration_time < timeline.iteration_time):
                programs, timeline = own, mine
        made = Scored(custom_plan(replace(plan, extra={}), programs), timeline.iteration_time, origin) \
            if timeline.fits else None
        seen[key] = made
        return made

    pruned = 0

    def cannot_improve(plan: Plan, time_: float) -> bool:
        """Whether every program of ``plan``'s partition takes ``time_`` or longer (each group's work, all-reduce
        and step, whole or split backwards): synthesizing it cannot give an improving move."""
        nonlocal pruned
        try:
            instance = schedule_instance(plan, graph, cluster, memory_fraction=memory_fraction)
        except ValueError:
            return False  # score() says so
        if min(order_lower_bound(instance, True), order_lower_bound(instance, False)) < time_:
            return False
        pruned += 1
        return True

    def out_of_work() -> str:
        if count >= evaluations:
            return "budget"
        if deadline is not None and time.perf_counter() > deadline:
            return "time"
        return ""

    scored: list[Scored] = []
    per_seed: list[Scored | None] = []
    for origin, plan in seeds:
        # the first seed is always synthesized: the result is then never slower than it
        if per_seed and partition_key(plan) not in seen and (stop := out_of_work()):
            stopped = stop
            per_seed.append(None)
            continue
        made = score(origin, plan)
        per_seed.append(made)
        if made is not None and all(made is not s for s in scored):
            scored.append(made)
    best = min(scored, key=lambda s: s.iteration_time, default=None)
    order = sorted(range(len(scored)), key=lambda i: (scored[i].iteration_time, i))
    for i in order:
        if stopped != "complete":
            break
        current, moves = scored[i], 0
        improved = True
        while improved and stopped == "complete":
            improved = False
            for cand in neighbours(current.plan, allow_recompute):
                if partition_key(cand) in seen or cannot_improve(cand, current.iteration_time):
                    continue
                if (stop := out_of_work()):
                    stopped = stop
                    break
                origin = current.origin.split(" + ")[0]
                made = score(f"{origin} + {moves + 1} move{'s' if moves else ''}", cand)
                if made is not None and made.iteration_time < current.iteration_time:
                    current, moves, improved = made, moves + 1, True
                    break
        if best is None or current.iteration_time < best.iteration_time:
            best = current
    return PartitionSearch(best, tuple(per_seed), count, stopped, pruned)


# --------------------------------------------------------------------------- the time-memory trade-off
DEFAULT_FRONT_STEPS = 8
"""Caps tried per partition by :func:`memory_front` (each below the previous program's peak)."""


def memory_front(plan: Plan, graph: LayerGraph, cluster: Cluster, *, steps: int = DEFAULT_FRONT_STEPS,
                 memory_fraction: float = 1.0) -> list[tuple[float, float, Plan]]:
    """Synthesized programs of ``plan``'s partition at falling memory caps: ``(time, peak, custom plan)`` each.

    The first programs are the list scheduler's under each group's cap; each next run caps
    every group just below the previous programs' largest per-device peak, so the
    synthesizer trades time for memory, until no program fits or ``steps`` runs are done.
    The peaks are the simulator's (largest per-device peak of the group programs).

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import load_plan
    >>> from pipeplan.models.graph import load_graph
    >>> from pipeplan.solver.formats.cluster import load_cluster
    >>> graph, cluster = load_graph("examples/chain8.graph.json"), load_cluster("examples/two-servers.cluster.json")
    >>> front = memory_front(load_plan("examples/hetero.plan.json", graph, cluster), graph, cluster)
    >>> all(a[0] <= b[0] and a[1] > b[1] for a, b in zip(front, front[1:]))
    True
    """
    points: list[tuple[float, float, Plan]] = []
    caps = None
    for _ in range(steps):
        instance = schedule_instance(plan, graph, cluster, memory_fraction=memory_fraction, memory_caps=caps)
        syn = synthesize(instance)
        if not syn.fits:
            break
        made = custom_plan(replace(plan, extra={}), syn.programs)
        sim = simulate(made, graph, cluster, validate=False)
        peak = max(sim.peak_memory)
        points.append((sim.iteration_time, peak, made))
        below = peak * (1 - 1e-6)
        caps = [min(g.cap, below) for g in instance.groups]
    return non_dominated(points)


def non_dominated(points: list[tuple[float, float, Plan]]) -> list[tuple[float, float, Plan]]:
    """The points no other is at least as fast and as small as (one of equals), fastest first.

    Examples
    --------
    >>> [p[:2] for p in non_dominated([(2.0, 5.0, None), (1.0, 9.0, None), (3.0, 5.0, None), (2.0, 4.0, None)])]
    [(1.0, 9.0), (2.0, 4.0)]
    """
    kept: list[tuple[float, float, Plan]] = []
    for point in sorted(points, key=lambda p: (p[0], p[1])):
        if not kept or point[1] < kept[-1][1]:
            kept.append(point)
    return kept
