"""``group-search``: pipelines of equal replica groups, the plans large clusters want.

On a large cluster with few microbatches, the best plans are rarely long chains of
single devices: the pipeline bubble grows with the stage count, so the good plans
have a few stages, each data-parallel over a group of equal devices that shares a
fast link (a server's NVLink), and the slow devices are often better left idle than
paid for with a slow all-reduce.  The exact solvers' walk proves bounds on such
instances but may not reach a complete configuration in time, and the generic
baselines and NSGA-II rarely find these plans.  This heuristic searches them directly:

1. **Patterns.**  For every device class (same speed and memory) either nothing, or
   ``n`` stages of ``r`` replicas each (``r`` a power of two or a server's count of the
   class; ``n * r`` at most the class's devices, ``n`` every count up to 16, then powers
   of two and the most that fit); the classes' blocks in every order (fastest first and
   slowest first when there are more than three classes).  With many classes the
   counts are thinned until at most :data:`PATTERN_LIMIT` combinations remain; a sweep
   then changes one class's block at a time, over all of its choices, from the best
   thinned patterns while the estimate improves (:func:`sweep_patterns`), and the
   patterns it finds go through steps 2-5 as a smaller pool of their own, first.
2. **Ranking.**  Each pattern gets a closed-form estimate: the bottleneck of a
   perfectly balanced split times ``(M + S - 1) / M`` (the pipeline's fill and drain),
   plus the exposed part of each stage's all-reduce.  Only the best
   :data:`EVALUATIONS` patterns are built.
3. **Building.**  Replica groups are cut server by server (best link first), so a group
   that fits in one server stays in one.  The layers are split so that the largest
   stage time per microbatch (its replicas' share, at its speed) is as small as it can
   be among the splits whose every stage fits in memory (a dynamic program over the
   spec's exact peak, with recompute where allowed).  Stages that need it recompute
   (:func:`pipeplan.solver.baselines.common.finalize`); the simulator judges.
4. **Refining.**  The best :data:`REFINE` plans move each stage boundary by up to three
   layers while the simulated time improves.
5. **Reshaping.**  The best :data:`RESHAPE` of those then change shape one step at a
   time while that helps: a stage's group halved into two stages, two neighbouring
   groups of one class merged, a stage dropped (its devices left idle), or a stage
   added first or last on idle devices; each new shape is split again by the dynamic
   program over the layers of the stages it changed, and the best are refined.  Blocks of one replica count per
   class cannot give a first stage of 4 replicas before stages of 8, which is what the
   1F1B first stage (it ends last, so its all-reduce is never hidden) often wants, nor
   the short stages of one or two layers that the slow servers take at the end of the
   best plans found on 64 devices: on 96 x 64 this takes the plan from 0.1695 to
   0.1495 s, on 128 x 64 from 0.2182 to 0.1917 s, on 96 x 32 from 0.2523 to 0.2408 s.
6. **Polishing.**  The best :data:`POLISHED` plans of each pool are refined again, now
   also moving single layers between stages far apart (a run of boundaries shifted by
   one layer, the stages between passing one layer along): on 96 x 64 from 0.1495 to
   0.1480 s, on bench_scale's 256-device instance from 0.5220 to 0.5152 s.  It starts
   from the plans steps 1-5 return, so it never gives a slower plan than they do.

The budget is counted in patterns and moves, not seconds, so the same problem gives
the same plan on any machine unless the time limit stops it first (then the record
says so).  It proves nothing: status ``feasible``, no lower bound.  The exact solvers
start from its plans.  On the solver benchmark's chain graphs it finds the proved
optima of 16 x 4, 32 x 8 and 64 x 16 (in under 1 s), and on 96 x 64 a plan 34 %
faster than the best the exact solvers found in 60 s before it existed (0.148 s
against 0.225 s, in about 2 s).
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

import numpy as np

from pipeplan.solver.baselines.common import Bounds, Groups, Judged, finalize, fitting_costs, stage_fits
from pipeplan.solver.evaluation.batched import iteration_times
from pipeplan.solver.space.device_classes import DeviceClass, device_classes
from pipeplan.solver.space.virtual_space import shifted
from pipeplan.solver.bounds.infeasibility import heuristic_no_plan
from pipeplan.solver.evaluation.memory import range_peak_memory, settle_borderline, stash_points
from pipeplan.solver.bounds.path_floor import StageTerms, path_floor, stage_terms
from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult, TracePoint
from pipeplan.solver.schedules.schedule import Action, stage_actions
from pipeplan.solver.evaluation.simulator import GroupCost, PlanCosts, StageLinks
from pipeplan.solver.core.termination import TimeLimit, WorkBudget, past
from pipeplan.solver.formats.plan import Plan

EVALUATIONS = 400
"""Patterns built and simulated, best estimate first."""

REFINE = 8
"""Plans (the best distinct patterns) whose boundaries are refined."""

PATTERN_LIMIT = 20000
"""Combinations of per-class blocks looked at (many device classes would give millions)."""

SWEEP_STARTS = 16
"""Thinned patterns :func:`sweep_patterns` starts from, the best of each set of classes used (four device generations in
``experiments/known_optimum.py``: docs/scale.md, "Where the gap is")."""

SWEEP_STEPS = 8
"""Changes of one class's block made from each start by :func:`sweep_patterns` (fewer when none helps)."""

SWEEP_SHARE = 4
"""The swept patterns are searched as a pool of their own, before the thinned ones (so, within the
budget, the sweep never costs a plan the thinned patterns give), with ``1 / SWEEP_SHARE`` of the
builds and half the refined and reshaped plans (``bench_scale`` at 256 to 4,096 devices: docs/scale.md)."""

RESHAPE = 4
"""Refined plans whose shape is then searched (:func:`reshape`)."""

RESHAPE_TRIES = 4
"""Shapes one step away that are refined per step, fastest (before refining) first."""

MOVES = (-3, -2, -1, 1, 2, 3)
"""Layer shifts of one stage boundary tried while refining."""

POLISHED = 4
"""Plans of each pool polished last: refined again with runs of boundaries (:func:`boundary_moves`).  On
experiments/bench_scale.py's 256-device instance polishing the best 4 gives 515.2 ms, the best one 519.2 ms,
none 522.0 ms (2026-12-03); refining every plan with runs gave 520.0 ms in twice the time."""

RUN_MOVES = (-1, 1)
"""Layer shifts of a run of two or more boundaries tried while refining (:func:`boundary_moves`)."""

BUILD_BATCH = 32
"""Patterns split and simulated together (:func:`_build_patterns`); the plans are those of one at a time."""

REFINE_BATCH = 48
"""Boundary moves simulated together (:func:`refine`); the plans are those of one at a time."""

__all__ = ["GroupSearch", "GroupSearchRun", "Block", "balanced_bounds", "compute_floor", "group_search", "pattern_level",
           "patterns", "refine", "replica_groups", "reshape", "reshapes", "sweep_patterns"]


@dataclass(frozen=True)
class Block:
    """``stages`` consecutive stages of ``replicas`` devices of one device class."""

    cls: int
    """Index of the device class (see :func:`_classes`)."""
    replicas: int
    """Devices per stage."""
    stages: int
    """Stages in the block."""


@dataclass(frozen=True)
class GroupSearchRun:
    """What :func:`group_search` found."""

    plans: tuple[Judged, ...]
    """The best plans found (fastest first), one per refined pattern."""
    patterns: int
    """Patterns enumerated."""
    evaluated: int
    """Patterns built and simulated."""
    stopped_by_time: bool
    """Whether the time limit, not the budget, ended the search."""
    trace: tuple[TracePoint, ...]
    """Incumbents over time."""


def _classes(problem: PlanningProblem) -> list[DeviceClass]:
    """The exact solvers' device classes (fastest first), each one's servers by best link (bandwidth, then latency)."""
    links = {s.id: s for s in problem.cluster.servers}

    def rank(server: tuple[str, tuple[str, ...]]) -> tuple[float, float]:
        link = links.get(server[0])
        return (-link.bandwidth, link.latency) if link is not None else (0.0, 0.0)

    return [replace(cls, ids_by_server=tuple(sorted(cls.ids_by_server, key=rank)))
            for cls in device_classes(problem.cluster)]


def _servers(cls: DeviceClass) -> list[tuple[str, ...]]:
    """The class's device ids, server by server, in :func:`_classes`' order."""
    return [ids for _, ids in cls.ids_by_server]


def replica_groups(servers: Sequence[Sequence[str]], replicas: int, count: int) -> list[tuple[str, ...]]:
    """``count`` groups of ``replicas`` devices, inside one server wherever possible.

    Groups are cut from each server in turn (the servers' order is kept); the devices
    left over in the servers are then pooled for groups that must span servers.

    Examples
    --------
    >>> replica_groups([("a", "b", "c"), ("d", "e", "f")], 2, 3)
    [('a', 'b'), ('d', 'e'), ('c', 'f')]
    """
    groups, left = [], []
    for ids in servers:
        whole = len(ids) // replicas
        groups.extend(tuple(ids[k * replicas:(k + 1) * replicas]) for k in range(whole))
        left.extend(ids[whole * replicas:])
    groups.extend(tuple(left[k * replicas:(k + 1) * replicas]) for k in range(len(left) // replicas))
    if len(groups) < count:
        raise ValueError(f"{count} groups of {replicas} need {count * replicas} devices; only {len(groups)} groups fit")
    return groups[:count]


def _replica_counts(cls: DeviceClass, allow: bool) -> list[int]:
    if not allow:
        return [1]
    counts = {1 << k for k in range(cls.count.bit_length()) if 1 << k <= cls.count}
    counts |= {len(ids) for ids in _servers(cls)}
    return sorted(counts)


def _stage_counts(most: int, limit: int, level: int) -> list[int]:
    """Stage counts tried for a block of at most ``most`` stages, in a pipeline of at most ``limit``.

    Level 0: every count up to 16, then powers of two; level 1: powers of two; level 2:
    one stage.  Every level also tries the most stages that fit (``min(most, limit)``).
    """
    top = min(most, limit)
    counts = {top, 1}
    if level <= 1:
        counts |= {1 << k for k in range(top.bit_length())}
    if level == 0:
        counts |= set(range(1, min(top, 16) + 1))
    return sorted(counts)


def _block_options(problem: PlanningProblem, classes: Sequence[DeviceClass], level: int) -> list[list[Block | None]]:
    """Per class, the blocks it may contribute (``None``: the class stays idle), idle last."""
    uses = []
    for c, cls in enumerate(classes):
        counts = _replica_counts(cls, problem.allow_replication)
        if level >= 2:  # one device, a server's worth, all of them
            counts = sorted({1, max(len(ids) for ids in _servers(cls)), counts[-1]} & set(counts))
        options: list[Block | None] = [Block(c, r, n) for r in counts
                                       for n in _stage_counts(cls.count // r, problem.stage_limit, level)]
        uses.append(options + [None])
    return uses


def pattern_level(problem: PlanningProblem, classes: Sequence[DeviceClass]) -> int:
    """How thinned the per-class choices of :func:`patterns` are: 0 (every choice) to 2.

    The first level whose combinations number at most :data:`PATTERN_LIMIT`, else the last.
    """
    for level in range(2):
        if math.prod(len(u) for u in _block_options(problem, classes, level)) <= PATTERN_LIMIT:
            return level
    return 2


def _orders(blocks: Sequence[Block]) -> Iterator[tuple[Block, ...]]:
    """The orders a pattern's blocks are tried in: all of them up to three blocks, else as given and reversed."""
    orders = (itertools.permutations(blocks) if len(blocks) <= 3
              else (tuple(blocks), tuple(reversed(blocks))))
    return iter(dict.fromkeys(tuple(o) for o in orders))


def patterns(problem: PlanningProblem, classes: Sequence[DeviceClass]) -> Iterator[tuple[Block, ...]]:
    """Pipelines of class blocks within the problem's stage limit (see the module docstring).

    With many device classes the combinations of blocks number in the millions: the
    stage counts (and at the last level the replica counts) tried per class are thinned
    until at most :data:`PATTERN_LIMIT` combinations remain (:func:`pattern_level`), and
    beyond that only the first :data:`PATTERN_LIMIT` are looked at (slower classes are
    dropped first).  :func:`sweep_patterns` then searches the full choices around the best.
    """
    uses = _block_options(problem, classes, pattern_level(problem, classes))
    for choice in itertools.islice(itertools.product(*uses), PATTERN_LIMIT):
        blocks = [b for b in choice if b is not None]
        if not blocks or sum(b.stages for b in blocks) > problem.stage_limit:
            continue
        yield from _orders(blocks)


def sweep_patterns(problem: PlanningProblem, costs: "_Costs", starts: Sequence[tuple[Block, ...]],
                   clock: TimeLimit | None = None, known: dict[tuple[Block, ...], float] | None = None
                   ) -> dict[tuple[Block, ...], float]:
    """Patterns near ``starts`` with every per-class choice open, and their estimates.

    When :func:`patterns` thins the choices (many device classes), a stage of 16 to 64
    devices of a middle class may be in no pattern at all.  From each start, every
    change of one class's block to any of its unthinned blocks (:func:`_block_options`
    at level 0) is estimated (:func:`_estimate`, over the orders of :func:`_orders`) and
    the best change is made, while it improves the estimate and at most
    :data:`SWEEP_STEPS` times.  Every pattern looked at is returned, so the builder
    ranks them with the thinned ones.  The work is counted: at most
    ``len(starts) * SWEEP_STEPS * sum(options per class)`` choices; ``clock``, when given,
    ends it early (after a step), with what it found so far.  ``known``: estimates already
    made (the thinned patterns'), used instead of estimating again and returned too.
    """
    options = _block_options(problem, costs.classes, 0)
    seen: dict[tuple[Block, ...], float] = dict(known or {})

    def best_order(choice: Sequence[Block | None]) -> float:
        blocks = [b for b in choice if b is not None]
        if not blocks or sum(b.stages for b in blocks) > problem.stage_limit:
            return math.inf
        best = math.inf
        for order in _orders(blocks):
            if order not in seen:
                seen[order] = _estimate(problem, costs, order)
            best = min(best, seen[order])
        return best

    for start in starts:
        choice: list[Block | None] = [None] * len(costs.classes)
        for b in start:
            choice[b.cls] = b
        value = best_order(choice)
        for _ in range(SWEEP_STEPS):
            if clock is not None and past(clock):
                return seen
            trials = [choice[:c] + [option] + choice[c + 1:] for c, class_options in enumerate(options)
                      for option in class_options]
            estimate, trial = min(((best_order(t), k) for k, t in enumerate(trials)), default=(math.inf, -1))
            if estimate >= value:
                break
            choice, value = trials[trial], estimate
    return seen


class _Costs:
    """Per-layer sums the estimate and the split need, cached per ``(replicas, speed)``."""

    def __init__(self, problem: PlanningProblem, classes: Sequence[DeviceClass]) -> None:
        layers = problem.graph.layers
        self.problem, self.classes = problem, classes
        self.a = np.array([l.fwd[0] + l.bwd[0] for l in layers])
        self.b = np.array([l.fwd[1] + l.bwd[1] for l in layers])
        self.params = float(sum(l.params for l in layers))
        self._prefix: dict[tuple[int, float], np.ndarray] = {}
        self._ring: dict[tuple[int, int], tuple[float, float]] = {}
        self._fits: dict[tuple, np.ndarray] = {}
        self.stage_cache: dict = {}
        """Group and stage costs of the plans simulated so far (:func:`pipeplan.solver.evaluation.simulator.plan_costs`)."""
        graph = problem.graph
        self.state = problem.state_factor * np.array([l.params for l in layers])
        self.act = np.array([l.act for l in layers])
        self.inputs = np.array([graph.stage_input_bytes(lo) for lo in range(len(layers))] + [0.0])
        self._state_sums = np.concatenate(([0.0], np.cumsum(self.state)))
        self._act_sums = np.concatenate(([0.0], np.cumsum(self.act)))

    def prefix(self, r: int, v: float, smallest: bool = False) -> np.ndarray:
        """Prefix sums of each layer's forward plus backward time per microbatch (averaged) on ``r`` replicas.

        With ``smallest``, of the smallest microbatch instead of the average.
        """
        key = (r, v, smallest)
        if key not in self._prefix:
            per_replica = [math.ceil(n / r) for n in self.problem.split]
            q = min(per_replica) if smallest else np.mean(per_replica)
            self._prefix[key] = np.concatenate(([0.0], np.cumsum((self.a + self.b * q) / v)))
        return self._prefix[key]

    def fits(self, r: int, memory: float, ops: Sequence[Action]) -> np.ndarray:
        """``fits[lo, hi]``: whether layers ``[lo, hi)`` fit on a replica of ``r`` devices of ``memory`` bytes.

        The spec's peak (:func:`pipeplan.solver.evaluation.memory.range_peak_memory`) for a stage running
        ``ops`` on the equal split, without recompute or, when the problem allows it,
        with: a split that fits stage by stage here fits as a plan
        (:func:`pipeplan.solver.baselines.common.finalize` switches recompute on where needed).
        """
        key = (r, memory, tuple(ops))
        if key not in self._fits:
            per_replica = [math.ceil(n / r) for n in self.problem.split]
            state = self._state_sums[None, :] - self._state_sums[:, None]  # [lo, hi]
            act = self._act_sums[None, :] - self._act_sums[:, None]
            ranges = np.triu(np.ones_like(state, dtype=bool), 1)  # lo < hi

            def exact(recompute: bool) -> Callable[[int], float]:
                n = state.shape[1]
                return lambda i: range_peak_memory(self.problem.graph, self.problem.state_factor, i // n, i % n,
                                                   ops, per_replica, recompute)
            stashed = float(stash_points(ops, per_replica)[:, 0].max())  # the stash's peak in samples
            plain = state + act * stashed
            # the prefix sums at each range's end: what rounding in ``state`` and ``act`` scales with
            ends = self._state_sums[None, :] + self._act_sums[None, :] * stashed
            ok = settle_borderline(plain <= memory, plain, memory, ranges, exact(False), scale=ends)
            if self.problem.allow_recompute:
                peak = np.zeros_like(state)
                points = _recompute_points(ops, per_replica)
                for inputs, working in points:
                    np.maximum(peak, inputs * self.inputs[:, None] + working * act, out=peak)
                peak += state
                ends = (self._state_sums[None, :] + max(i for i, _ in points) * self.inputs[:, None]
                        + max(w for _, w in points) * self._act_sums[None, :])
                ok |= settle_borderline(peak <= memory, peak, memory, ranges & ~ok, exact(True), scale=ends)
            self._fits[key] = ok
        return self._fits[key]

    def ring(self, c: int, r: int) -> tuple[float, float]:
        """``(latency, bandwidth)`` of a group of ``r`` devices of class ``c`` (as :func:`replica_groups` cuts it)."""
        key = (c, r)
        if key not in self._ring:
            ids = replica_groups(_servers(self.classes[c]), r, 1)[0]
            self._ring[key] = (self.problem.cluster.lat(ids), self.problem.cluster.bw(ids))
        return self._ring[key]


def _recompute_points(ops: Sequence[Action], per_replica: Sequence[int]) -> list[tuple[int, int]]:
    """``(stashed samples, working samples)`` after every forward and during every backward of a recomputing stage.

    Its peak is the largest ``stashed * I + working * A`` over these points (as
    :func:`pipeplan.solver.evaluation.memory.program_stash_peak` walks the program); only the points not dominated
    in both counts are kept (usually one: the stash when the first backward starts).

    Examples
    --------
    >>> _recompute_points(stage_actions("1f1b", 3, 0, 2), [2, 2, 2])
    [(4, 2)]
    """
    points = [(int(i), int(a)) for i, a in stash_points(ops, per_replica)]
    # I, A >= 0: a point no larger in both counts than another never gives the peak
    return sorted(p for p in points if not any(o != p and o[0] >= p[0] and o[1] >= p[1] for o in points))


def _stages(blocks: Sequence[Block], classes: Sequence[DeviceClass]) -> list[tuple[int, float, int]]:
    """``(replicas, speed, class)`` of every stage, in order."""
    return [(b.replicas, classes[b.cls].speed, b.cls) for b in blocks for _ in range(b.stages)]


def _estimate(problem: PlanningProblem, costs: _Costs, blocks: Sequence[Block]) -> float:
    """A closed-form guess of the iteration time, only to rank patterns (never reported).

    A perfectly balanced split gives every stage the same time per microbatch ``t``;
    the pipeline then takes about ``(M + S - 1) t``, and stage ``s`` ends about
    ``s t / 2`` before the first (its all-reduce is hidden that long).
    """
    S = sum(b.stages for b in blocks)
    if S > len(problem.graph) or not _may_fit(costs, blocks):
        return math.inf
    if costs.prefix(1, 1.0)[-1] <= 0.0:  # layers that take no time: only fewer stages can matter
        return float(S)
    speed = {b: costs.classes[b.cls].speed for b in blocks}
    rate = {b: 1.0 / costs.prefix(b.replicas, speed[b])[-1] for b in blocks}  # whole graphs per second, per stage
    t = 1.0 / sum(rate[b] * b.stages for b in blocks)  # every stage busy t per microbatch
    exposed, s = 0.0, 0
    for b in blocks:
        if b.replicas > 1:
            lat, bw = costs.ring(b.cls, b.replicas)
            ar = 2 * (b.replicas - 1) * (lat + costs.params * rate[b] * t / (b.replicas * bw))
            exposed = max(exposed, ar - (s + b.stages - 1) * t / 2)  # the block's last stage hides the most
        s += b.stages
    return (len(problem.split) + S - 1) * t + exposed


def _may_fit(costs: _Costs, blocks: Sequence[Block]) -> bool:
    """Necessary for any split to fit: the stages' memory holds all the training state, and
    every block's devices hold some layer with one microbatch stashed."""
    memory = [costs.classes[b.cls].memory for b in blocks]
    if sum(m * b.stages for m, b in zip(memory, blocks)) < costs.state.sum():
        return False
    q = max(costs.problem.split)
    return all(float(np.min(costs.state + costs.act * math.ceil(q / b.replicas))) <= m
               for m, b in zip(memory, blocks))


def balanced_bounds(prefixes: Sequence[np.ndarray], allowed: Sequence[np.ndarray] | None = None
                    ) -> list[tuple[int, int]] | None:
    """The layer ranges with the least bottleneck: the largest stage time is as small as it can be.

    ``prefixes[s]`` holds the prefix sums of stage ``s``'s per-layer times; ``allowed[s]``,
    if given, which ranges ``[lo, hi)`` stage ``s`` may take (``allowed[s][lo, hi]``:
    those that fit in its memory).  A dynamic program over (stage, last layer) keeps,
    for every end layer, the least bottleneck of the stages so far (every stage
    non-empty).  Stages of different speeds make a greedy sweep wrong: filling a fast
    stage up can leave a slow one a heavy layer.  ``None`` when no split exists (more
    stages than layers, or no allowed ranges that cover every layer).

    Examples
    --------
    >>> import numpy as np
    >>> p = np.concatenate(([0.0], np.cumsum([1.0, 1.0, 1.0, 1.0])))
    >>> balanced_bounds([p, p / 3])  # the second stage runs three times as fast
    [(0, 1), (1, 4)]
    """
    S, L = len(prefixes), len(prefixes[0]) - 1
    if S > L:
        return None
    ends = np.arange(L + 1)
    empty = ends[None, :] <= ends[:, None]  # [start, end]: a stage needs one layer at least
    reach = np.full(L + 1, np.inf)  # least bottleneck of the stages so far, by the layer they end at
    reach[0] = 0.0
    starts = []
    for s, p in enumerate(prefixes):
        cand = np.maximum(reach[:, None], p[None, :] - p[:, None])
        cand[empty] = np.inf
        if allowed is not None:
            cand[~allowed[s]] = np.inf
        cand[:, L - (S - 1 - s) + 1:] = np.inf  # leave one layer for every later stage
        start = cand.argmin(axis=0)
        reach = cand[start, ends]
        starts.append(start)
    if not np.isfinite(reach[L]):
        return None
    bounds, hi = [], L
    for start in reversed(starts):
        lo = int(start[hi])
        bounds.append((lo, hi))
        hi = lo
    return bounds[::-1]


def compute_floor(problem: PlanningProblem, prefixes: Sequence[np.ndarray], bounds: Sequence[tuple[int, int]],
                  smallest: Sequence[np.ndarray] | None = None) -> float:
    """A lower bound on the simulated time of any plan with these stages: a stage's compute and the fill before it.

    ``prefixes[s]`` is :meth:`_Costs.prefix` of stage ``s``'s replicas and speed.  A stage
    runs the forward and backward of each of its ``M`` microbatches one after another on
    each replica, and its slowest replica (the group's least speed ``v``) takes
    ``(a + b q_i) / v`` for microbatch ``i`` of ``q_i = ceil(n_i / r)`` samples, so it is
    busy at least ``busy_s = sum_i (a + b q_i) / v = M (a + b mean(q)) / v``: ``M`` times
    the prefix difference.  With ``smallest`` (the prefixes of the smallest microbatch,
    ``prefix(r, v, smallest=True)``), the path of the exact bound's term 1 is added: stage
    ``s`` starts ``F_0`` only after ``F_0`` ran on every earlier stage, and its last op
    ``B_{M-1}`` must still run on every earlier stage, each earlier stage ``j`` adding at
    least ``t_j(q_min)``, its forward plus backward of the smallest microbatch; so ``T >=
    max_s (sum_{j<s} t_j(q_min) + busy_s)``.  Recompute, transfers and all-reduces only add to
    it.  The result is lowered by ``1e-9`` relative, for the rounding of the prefix sums.

    Examples
    --------
    >>> import numpy as np
    >>> from types import SimpleNamespace
    >>> p = np.array([0.0, 1.0, 3.0])
    >>> compute_floor(SimpleNamespace(split=(4, 4)), [p, p], [(0, 1), (1, 2)]) > 3.99
    True
    >>> compute_floor(SimpleNamespace(split=(4, 4)), [p, p], [(0, 1), (1, 2)], [p, p]) > 4.99  # 1 + 2 * 2
    True
    """
    M, best, head = len(problem.split), 0.0, 0.0
    for s, (p, (lo, hi)) in enumerate(zip(prefixes, bounds)):
        best = max(best, head + M * (p[hi] - p[lo]))
        if smallest is not None:
            head += smallest[s][hi] - smallest[s][lo]
    return float(best) * (1 - 1e-9)


def _pattern_split(problem: PlanningProblem, costs: _Costs, blocks: Sequence[Block]
                   ) -> tuple[Bounds, Groups, float] | None:
    """The pattern's server-aligned groups, its balanced split and the split's :func:`compute_floor`.

    ``None`` when no split fits.
    """
    groups = []  # one block per class: no device is used twice
    for b in blocks:
        groups.extend(replica_groups(_servers(costs.classes[b.cls]), b.replicas, b.stages))
    stages = _stages(blocks, costs.classes)
    prefixes = [costs.prefix(r, v) for r, v, _ in stages]
    allowed = [costs.fits(r, costs.classes[c].memory, _ops(problem, s, len(stages)))
               for s, (r, _, c) in enumerate(stages)]
    bounds = balanced_bounds(prefixes, allowed)
    if bounds is None:
        return None
    smallest = [costs.prefix(r, v, smallest=True) for r, v, _ in stages]
    return tuple(bounds), tuple(groups), compute_floor(problem, prefixes, bounds, smallest)


def _judge_all(problem: PlanningProblem, costs: _Costs, proposals: Sequence[tuple[Bounds, Groups]]) -> list[float]:
    """The simulated time :func:`finalize` gives each proposal (``inf``: it does not fit), timed in batches.

    The numbers are the scalar simulator's exactly (:func:`pipeplan.solver.evaluation.batched.iteration_times`),
    so judging proposals together never changes which one wins.
    """
    fitted = [fitting_costs(problem, bounds, groups, costs.stage_cache) for bounds, groups in proposals]
    fits = [i for i, f in enumerate(fitted) if f is not None]
    times = [math.inf] * len(proposals)
    if fits:
        for i, t in zip(fits, iteration_times([fitted[i][1] for i in fits]).tolist()):
            times[i] = t
    return times


def _build_patterns(problem: PlanningProblem, costs: _Costs, ranked: Sequence[tuple[float, int, tuple[Block, ...]]],
                    keep: int, deadline: TimeLimit, on_best: Callable[[float], None]
                    ) -> tuple[list[tuple[float, int, tuple[Bounds, Groups]]], bool]:
    """Build and time the ranked patterns, best estimate first: ``(time, rank, proposal)`` sorted, and whether time ran out.

    A pattern is timed only while its :func:`compute_floor` is below the ``keep``-th best time
    so far (it could not be kept otherwise).  :data:`BUILD_BATCH` patterns are split and timed
    together; the floors are then checked one by one in rank order, against the times kept
    before each, so the result is that of building them one at a time.  ``on_best`` hears
    every new best time.
    """
    built: list[tuple[float, int, tuple[Bounds, Groups]]] = []
    todo = [(k, blocks) for k, (guess, _, blocks) in enumerate(ranked) if math.isfinite(guess)]
    for first in range(0, len(todo), BUILD_BATCH):
        if past(deadline):
            return built, True
        cutoff = built[keep - 1][0] if len(built) >= keep else math.inf
        splits = [(k, _pattern_split(problem, costs, blocks)) for k, blocks in todo[first:first + BUILD_BATCH]]
        splits = [(k, split) for k, split in splits if split is not None and split[2] < cutoff]
        times = _judge_all(problem, costs, [split[:2] for _, split in splits])
        for (k, (bounds, groups, floor)), t in zip(splits, times):
            cutoff = built[keep - 1][0] if len(built) >= keep else math.inf
            if floor >= cutoff or not math.isfinite(t):
                continue
            if not built or t < built[0][0]:
                on_best(t)
            bisect.insort(built, (t, k, (bounds, groups)), key=lambda x: x[:2])
    return built, False


def _ops(problem: PlanningProblem, s: int, count: int) -> tuple[Action, ...]:
    """Stage ``s``'s program in a pipeline of ``count`` stages (one per group) on the problem's equal split.

    Written as stage 0 of the last ``count - s`` stages: the program depends on the stage
    only through that count, so the memory tables of :meth:`_Costs.fits` are shared by every
    stage with the same program.
    """
    return stage_actions(problem.schedule, len(problem.split), 0, count - s)


_Row = tuple[GroupCost, StageLinks, StageTerms | None]


class _GroupTable:
    """Stage costs and :func:`pipeplan.solver.bounds.path_floor.stage_terms` of the plans on one list of device groups.

    A stage's cost depends on its position, layers and recompute flag and on its
    neighbours' devices (:func:`pipeplan.solver.evaluation.simulator.plan_costs`), so with the groups
    fixed it is known by ``(stage, layer range)``; recompute is decided per stage as
    :func:`pipeplan.solver.baselines.common.finalize` decides it.
    """

    def __init__(self, problem: PlanningProblem, groups: Groups, cache: dict | None) -> None:
        self.problem, self.groups, self.cache = problem, groups, cache
        self.rows: dict[tuple[int, tuple[int, int]], _Row | None] = {}
        self.wiring = None

    def stages(self, bounds: Bounds) -> list[_Row | None]:
        """Per stage, its group cost, transfer times and terms; ``None`` for a stage that does not fit."""
        if any((s, b) not in self.rows for s, b in enumerate(bounds)):
            _, costs, fits = stage_fits(self.problem, bounds, self.groups, self.cache)
            self.wiring = costs.wiring  # one stage per group on the equal split: every trial shares it
            for s, (b, group, links, fit) in enumerate(zip(bounds, costs.groups, costs.links, fits)):
                if (s, b) not in self.rows:
                    self.rows[(s, b)] = (group, links, stage_terms(group, links)) if fit else None
        return [self.rows[(s, b)] for s, b in enumerate(bounds)]

    def costs(self, rows: Sequence[_Row]) -> PlanCosts:
        """The costs of the plan whose stages have these rows."""
        return PlanCosts(self.wiring, tuple(r[0] for r in rows), tuple(r[1] for r in rows),
                         self.problem.global_batch)


def refine(problem: PlanningProblem, judged: Judged, deadline: TimeLimit, costs: "_Costs | None" = None,
           runs: bool = False) -> Judged:
    """Move stage boundaries while the simulated time improves: each by :data:`MOVES` layers and, with
    ``runs``, runs of them by one layer (:func:`boundary_moves`: a layer moved between stages far apart).

    Sweeps the moves in order, keeping every move that helps, until a whole sweep
    changes nothing (or the deadline passes).  A move whose
    :func:`pipeplan.solver.bounds.path_floor.path_floor` (or, with ``costs``, whose
    :func:`compute_floor`) already reaches the best time is not simulated: it cannot help.
    The next :data:`REFINE_BATCH` moves left are timed together; the first of them that
    helps is kept and the sweep goes on after it, so the moves kept are those of trying
    them one at a time.
    """
    groups = tuple(st.devices for st in judged.plan.stages)
    ends = [st.layers[1] for st in judged.plan.stages]
    best_time, best_bounds = judged.result.iteration_time, None
    table = _GroupTable(problem, groups, costs.stage_cache if costs is not None else None)
    prefixes = None
    if costs is not None:
        speed = {d.id: d.speed for d in problem.cluster.devices}
        prefixes = [costs.prefix(len(g), min(speed[d] for d in g)) for g in groups]
        smallest = [costs.prefix(len(g), min(speed[d] for d in g), smallest=True) for g in groups]
    moves = boundary_moves(len(ends) - 1, runs)
    improved = True
    while improved and not past(deadline):
        improved = False
        at = 0
        while at < len(moves) and not past(deadline):  # long pipelines: one sweep takes seconds
            trials = []
            while at < len(moves) and len(trials) < REFINE_BATCH:
                trial = shifted(ends, *moves[at])
                at += 1
                if trial is None:
                    continue
                bounds = tuple(zip([0] + trial[:-1], trial))
                if prefixes is not None and compute_floor(problem, prefixes, bounds, smallest) >= best_time:
                    continue
                stages = table.stages(bounds)
                if None in stages or path_floor([t for *_, t in stages], same_split=True) >= best_time:
                    continue
                trials.append((at, trial, bounds, table.costs(stages)))
            times = iteration_times([c for *_, c in trials]).tolist() if trials else []
            for (n, trial, bounds, _), t in zip(trials, times):
                if t < best_time * (1 - 1e-12):
                    best_time, best_bounds, ends, improved, at = t, bounds, trial, True, n
                    break
    return judged if best_bounds is None else finalize(problem, best_bounds, groups, table.cache)


def boundary_moves(boundaries: int, runs: bool = True) -> list[tuple[int, int, int]]:
    """The moves :func:`refine` tries, in order: ``(first, last, shift)`` moves boundaries ``first .. last`` by ``shift``.

    First each single boundary by every shift of :data:`MOVES`; then every run of two or more
    boundaries by one layer either way.  Moving boundaries ``i .. j`` by ``+1`` moves the first
    layer of stage ``j + 1`` to the end of stage ``i`` (the stages between keep their sizes and
    pass one layer along); ``-1`` moves the last layer of stage ``i`` to stage ``j + 1``.  A
    bottleneck two or more stages away from a short stage needs such a move: each single
    boundary move on the way makes a stage between them the bottleneck.

    Parameters
    ----------
    boundaries : int
        The movable boundaries: the stages less one.

    Returns
    -------
    list of (int, int, int)

    Examples
    --------
    >>> boundary_moves(2)[-4:]  # after the single moves, the one run of two boundaries
    [(1, 1, 2), (1, 1, 3), (0, 1, -1), (0, 1, 1)]
    >>> len(boundary_moves(16))  # 16 x 6 single moves, 120 runs x 2 shifts
    336
    """
    single = [(i, i, move) for i, move in itertools.product(range(boundaries), MOVES)]
    if not runs:
        return single
    return single + [(i, j, move) for i in range(boundaries) for j in range(i + 1, boundaries) for move in RUN_MOVES]


Stages = list[tuple[tuple[int, int], tuple[str, ...]]]
"""``(layer range, device group)`` of every stage, in order."""


def reshapes(stages: Stages, class_of: dict[str, int], idle: Sequence[Sequence[Sequence[str]]] = ()
             ) -> Iterator[tuple[list[tuple[str, ...]], int, int]]:
    """Pipelines one change of shape away: ``(groups, i, j)``, new stages ``i .. j-1`` replacing some old ones.

    The changed stages cover the same layers as the stages they replace; the stages
    before them are the same, and so are those after them (shifted).  In a fixed
    order: every group of two or more devices halved into two stages (first half
    first); every two neighbouring groups of one class merged into one stage; every
    stage dropped (its devices left idle, its layers given to its neighbours), while
    one stays; and, from ``idle`` (per class, the idle devices of each server), a new
    first or last stage on the most idle devices of one server of a class (all of
    them, or one).

    Examples
    --------
    >>> cls = {"a": 0, "b": 0, "c": 0, "d": 1}
    >>> stages = [((0, 2), ("a", "b")), ((2, 3), ("c",)), ((3, 4), ("d",))]
    >>> for groups, i, j in reshapes(stages, cls):
    ...     print(groups, i, j)
    [('a',), ('b',), ('c',), ('d',)] 0 2
    [('a', 'b', 'c'), ('d',)] 0 1
    [('c',), ('d',)] 0 1
    [('a', 'b'), ('d',)] 0 2
    [('a', 'b'), ('c',)] 1 2
    """
    groups = [g for _, g in stages]
    for i, (bounds, g) in enumerate(stages):
        if len(g) >= 2 and bounds[1] - bounds[0] >= 2:
            yield groups[:i] + [g[:len(g) // 2], g[len(g) // 2:]] + groups[i + 1:], i, i + 2
    for i in range(len(groups) - 1):
        if {class_of[d] for d in groups[i] + groups[i + 1]} == {class_of[groups[i][0]]}:
            yield groups[:i] + [groups[i] + groups[i + 1]] + groups[i + 2:], i, i + 1
    for i in range(len(groups) if len(groups) > 1 else 0):
        yield groups[:i] + groups[i + 1:], max(i - 1, 0), min(i + 1, len(groups) - 1)
    for servers in idle:
        most = max(servers, key=len, default=())
        for new in dict.fromkeys((tuple(most), tuple(most[:1]))) if most else ():
            if stages[0][0][1] - stages[0][0][0] >= 2:
                yield [new] + groups, 0, 2
            if stages[-1][0][1] - stages[-1][0][0] >= 2:
                yield groups + [new], len(groups) - 1, len(groups) + 1


def _reshaped_bounds(problem: PlanningProblem, costs: _Costs, stages: Stages, groups: list[tuple[str, ...]], i: int,
                     j: int, speed: dict[str, float], memory: dict[str, float]) -> Bounds | None:
    """The layer ranges of a shape from :func:`reshapes`: its new stages split by :func:`balanced_bounds`.

    Only the layers of the replaced stages are split again; every other stage keeps
    its layers.  ``None`` when the new stages have no split that fits (or too many stages).
    """
    if len(groups) > problem.stage_limit:
        return None
    kept_after = len(groups) - j  # stages after the change, the same as the old ones' last
    lo = stages[i - 1][0][1] if i else 0
    hi = stages[len(stages) - kept_after - 1][0][1]
    window = [costs.prefix(len(g), min(speed[d] for d in g))[lo:hi + 1] for g in groups[i:j]]
    allowed = [costs.fits(len(g), min(memory[d] for d in g), _ops(problem, s, len(groups)))[lo:hi + 1, lo:hi + 1]
               for s, g in enumerate(groups[i:j], start=i)]
    inner = balanced_bounds([p - p[0] for p in window], allowed)
    if inner is None:
        return None
    return tuple([b for b, _ in stages[:i]] + [(lo + a, lo + b) for a, b in inner]
                 + [b for b, _ in stages[len(stages) - kept_after:]])


def reshape(problem: PlanningProblem, judged: Judged, deadline: TimeLimit, costs: "_Costs | None" = None) -> Judged:
    """Change the plan's shape one step at a time (:func:`reshapes`) while the simulated time improves.

    Every shape one step away is split (:func:`_reshaped_bounds`) and simulated; the
    :data:`RESHAPE_TRIES` fastest are refined (:func:`refine`), and the best of them
    replaces the plan if it is faster; the search then starts again from it.
    ``costs`` (the caller's, with its cached splits and memory tables) is built if not given.
    """
    costs = costs if costs is not None else _Costs(problem, _classes(problem))
    classes = costs.classes
    class_of = {d: c for c, cls in enumerate(classes) for ids in _servers(cls) for d in ids}
    speed = {d.id: d.speed for d in problem.cluster.devices}
    memory = {d.id: d.memory for d in problem.cluster.devices}
    best, improved = judged, True
    while improved and not past(deadline):
        stages = [(st.layers, st.devices) for st in best.plan.stages]
        used = {d for _, g in stages for d in g}
        idle = [[[d for d in ids if d not in used] for ids in _servers(cls)] for cls in classes]
        shapes = []
        for k, (groups, i, j) in enumerate(reshapes(stages, class_of, idle)):
            bounds = _reshaped_bounds(problem, costs, stages, groups, i, j, speed, memory)
            if bounds is not None:
                shapes.append((k, (bounds, tuple(groups))))
            if past(deadline):
                break
        times = _judge_all(problem, costs, [shape for _, shape in shapes])
        built = sorted((t, k, shape) for t, (k, shape) in zip(times, shapes) if math.isfinite(t))
        step = best
        for _, _, shape in built[:RESHAPE_TRIES]:
            cand = refine(problem, finalize(problem, *shape, costs.stage_cache), deadline, costs)
            if cand.result.iteration_time < step.result.iteration_time * (1 - 1e-12):
                step = cand
        best, improved = step, step is not best
    return best


def _swept(problem: PlanningProblem, costs: "_Costs", ranked: Sequence[tuple[float, int, tuple[Block, ...]]],
           clock: TimeLimit | None = None) -> list[tuple[float, int, tuple[Block, ...]]]:
    """The patterns :func:`sweep_patterns` finds around the best of ``ranked`` that ``ranked`` lacks, best estimate first."""
    best_per_set: dict[frozenset[int], tuple[Block, ...]] = {}
    for guess, _, blocks in ranked:  # best first: a sweep changes one class at a time, so starts must differ in the
        if math.isfinite(guess):     # classes they use (adding one class often needs another's stages given back)
            best_per_set.setdefault(frozenset(b.cls for b in blocks), blocks)
    starts = list(best_per_set.values())[:SWEEP_STARTS]
    known = {blocks: guess for guess, _, blocks in ranked}
    found = sweep_patterns(problem, costs, starts, clock, known)
    extra = [(guess, len(ranked) + k, blocks) for k, (blocks, guess) in enumerate(
        (blocks, guess) for blocks, guess in found.items() if blocks not in known)]
    return sorted(extra, key=lambda x: x[:2])


def group_search(problem: PlanningProblem, clock: TimeLimit, *, evaluations: int = EVALUATIONS,
                 refine_top: int = REFINE, reshape_top: int = RESHAPE, polish_top: int = POLISHED) -> GroupSearchRun:
    """Search pipelines of equal replica groups (see the module docstring).

    Parameters
    ----------
    problem : PlanningProblem
        The problem (its equal split is used; the plans are in every solver's space).
    clock : TimeLimit
        The cap; the search stops early when it runs out (noted in its record).
    evaluations, refine_top, reshape_top, polish_top : int
        Patterns built, plans refined, reshaped and polished (the budget that makes the result
        machine-independent).

    Returns
    -------
    GroupSearchRun
        The refined plans, fastest first (empty when no pattern fits).

    Examples
    --------
    >>> run = group_search(problem, TimeLimit(5.0))  # doctest: +SKIP
    >>> run.plans[0].result.iteration_time  # doctest: +SKIP
    """
    classes = _classes(problem)
    costs = _Costs(problem, classes)
    ranked, stopped = [], False
    for k, p in enumerate(patterns(problem, classes)):
        if k % 256 == 255 and past(clock):  # many device classes: many patterns
            stopped = True
            break
        ranked.append((_estimate(problem, costs, p), k, p))
    ranked.sort(key=lambda x: x[:2])
    trace: list[TracePoint] = []
    pools = [(ranked, evaluations, refine_top, reshape_top, polish_top)]
    if pattern_level(problem, classes) > 0 and not stopped:  # the smaller swept pool first: under a clock, at
        sweep_clock = clock.within(clock.left() / 2)          # 1,024 devices and more its plans are the better ones;
        swept = _swept(problem, costs, ranked, sweep_clock)   # half the time left at most, so a short cap still builds
        stopped = past(sweep_clock)
        pools.insert(0, (swept, max(1, evaluations // SWEEP_SHARE), max(1, refine_top // 2), max(1, reshape_top // 2),
                         polish_top))
    plans, built = [], 0
    for pool, builds, refines, reshapes_, polishes in pools:
        if past(clock):
            stopped = True
            break
        found, count, cut = _search_pool(problem, costs, pool[:builds], refines, reshapes_, polishes, clock, trace)
        plans.extend(found)
        built += count
        stopped = stopped or cut
    plans.sort(key=lambda j: j.result.iteration_time)
    return GroupSearchRun(tuple(plans), sum(len(pool) for pool, *_ in pools), built, stopped, tuple(trace))


def _search_pool(problem: PlanningProblem, costs: "_Costs", ranked: Sequence[tuple[float, int, tuple[Block, ...]]],
                 refine_top: int, reshape_top: int, polish_top: int, clock: TimeLimit, trace: list[TracePoint]
                 ) -> tuple[list[Judged], int, bool]:
    """Build ``ranked``, refine the best ``refine_top``, reshape the best ``reshape_top`` of those and polish the
    best ``polish_top`` of those.

    Returns the refined plans (fastest first), the patterns built and whether the clock cut
    the work; ``trace`` hears every time better than all it holds.
    """
    def improves(t: float) -> None:
        if not trace or t < trace[-1].incumbent:
            trace.append(TracePoint(clock.elapsed(), t, None))

    built, stopped = _build_patterns(problem, costs, ranked, refine_top, clock, improves)
    refined = []
    for _, _, proposal in built[:refine_top]:
        judged = finalize(problem, *proposal, costs.stage_cache)
        if past(clock):  # out of time: the built plans as they are
            stopped = True
            refined.append(judged)
            continue
        refined.append(refine(problem, judged, clock, costs))
        improves(refined[-1].result.iteration_time)
    refined.sort(key=lambda j: j.result.iteration_time)
    for k, judged in enumerate(refined[:reshape_top]):
        if past(clock):
            stopped = True
            break
        refined[k] = reshape(problem, judged, clock, costs)
        improves(refined[k].result.iteration_time)
    refined.sort(key=lambda j: j.result.iteration_time)
    for k, judged in enumerate(refined[:polish_top]):
        if past(clock):
            stopped = True
            break
        refined[k] = refine(problem, judged, clock, costs, runs=True)
        improves(refined[k].result.iteration_time)
    refined.sort(key=lambda j: j.result.iteration_time)
    return refined, len(built), stopped or past(clock)


class GroupSearch(Solver):
    """Pipelines of equal replica groups: ranked patterns, balanced splits, refined boundaries."""

    name = "group-search"
    source = ("pipeplan's own heuristic: server-aligned replica groups per device class "
              "(AutoPipe-H's server-aware mapping, Hippie's pipeline + data parallelism)")
    budget_unit = "patterns built"
    default_budget = EVALUATIONS

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """Plan ``problem``; status ``feasible`` (no proof), or ``infeasible`` when no pattern fits."""
        run = group_search(problem, clock, evaluations=int(budget.units))
        wall = clock.elapsed()
        details = {"patterns": run.patterns, "evaluated": run.evaluated, "stopped_by_time_limit": run.stopped_by_time}
        if not run.plans:
            why = ("time limit reached before any pattern fitted" if run.stopped_by_time
                   else "none of the pipelines group-search builds (one block of equal replica groups per "
                        "device class) fits in memory")
            return heuristic_no_plan(problem, self.name, why, wall, seed, run.trace, details)
        best = run.plans[0]
        message = "time limit reached; best plan so far" if run.stopped_by_time else ""
        return SolverResult(self.name, "feasible", best.plan, best.result.iteration_time, None, wall, seed,
                            run.trace, message, details)
