"""The search space of a version-2 schedule (spec section 7): device groups, virtual stages, boundaries.

A *candidate* fixes everything a plan/2 needs besides the split (every stage uses the
problem's equal split, as torch's chunks do): the schedule, ``v`` (stages per group
for the looped and interleaved schedules, 2 for ``zbv``), the ``R`` device groups in
group order, the ``S`` contiguous layer ranges and each stage's recompute flag.
Stage ``s`` runs on group :func:`pipeplan.solver.schedules.schedule.stage_group`.

Devices with the same speed, memory and server are interchangeable (timing, memory,
links and all-reduces depend only on those), so a group is enumerated as a number of
devices per such class, and the concrete devices are taken in id order from what the
earlier groups left.  Hence enumerating class counts enumerates every plan up to a
renaming of interchangeable devices, which changes no simulated number.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterator, Sequence

from pipeplan.models.errors import InputError
from pipeplan.solver.core.algorithm import SEVERAL_STAGES_PER_GROUP, Solver
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.schedules.needs import NEEDS
from pipeplan.solver.schedules.schedule import check_counts, num_stages, stage_group

@dataclass(frozen=True)
class Candidate:
    """One point of the version-2 search space."""

    virtual: int
    """``v``: stages per group (2 for ``zbv``)."""
    groups: tuple[tuple[str, ...], ...]
    """The device ids of each group, in group order (group 0 holds stage 0)."""
    bounds: tuple[tuple[int, int], ...]
    """Half-open layer range of each stage, in stage order."""
    recompute: tuple[bool, ...]
    """Whether each stage recomputes its activations."""


def schedule_accepts(schedule: str, groups: int, microbatches: int) -> str:
    """Why ``schedule`` cannot run ``microbatches`` on ``groups`` groups (torch's refusal), or ``""`` when it can.

    Examples
    --------
    >>> "rounds = max(1, m // R) = 3" in schedule_accepts("interleaved-1f1b", 2, 7)
    True
    >>> schedule_accepts("looped-bfs", 2, 7)
    ''
    """
    try:
        check_counts(schedule, groups, microbatches, NEEDS[schedule].stages_per_group or 1)
    except ValueError as exc:
        return str(exc)
    return ""


def virtual_choices(problem: PlanningProblem, groups: int) -> list[int]:
    """The ``v`` to try with ``groups`` groups: the problem's own, or with ``auto`` every ``v`` whose stages fit the layers.

    A schedule with a fixed count (``zbv``: ``v = 2``) tries that one; a problem with
    ``virtual_stages`` set tries that one alone.
    """
    layers = len(problem.graph)
    fixed = problem.needs.stages_per_group
    if fixed is not None:
        return [fixed] if fixed * groups <= layers else []
    if problem.virtual_stages is not None:
        return [problem.virtual_stages] if problem.virtual_stages * groups <= layers else []
    return [v for v in range(1, layers // groups + 1)]


def device_kinds(problem: PlanningProblem) -> list[tuple[str, ...]]:
    """Interchangeable devices (same speed, memory and server), each list in id order, in cluster order."""
    kinds: dict[tuple[float, float, str], list[str]] = {}
    for d in problem.cluster.devices:
        kinds.setdefault((d.speed, d.memory, d.server), []).append(d.id)
    return [tuple(ids) for ids in kinds.values()]


def group_choices(problem: PlanningProblem, groups: int) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every ordered choice of ``groups`` disjoint non-empty device groups, up to interchangeable devices.

    One device per group without ``allow_replication``.  Not every device need be used.
    """
    kinds = device_kinds(problem)
    most = 1 if not problem.allow_replication else len(problem.cluster.devices)

    def counts(left: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        for c in itertools.product(*(range(n + 1) for n in left)):
            if 1 <= sum(c) <= most:
                yield c

    def rec(left: tuple[int, ...], k: int) -> Iterator[tuple[tuple[int, ...], ...]]:
        if k == 0:
            yield ()
            return
        for c in counts(left):
            rest = tuple(n - x for n, x in zip(left, c))
            for tail in rec(rest, k - 1):
                yield (c, *tail)

    total = tuple(len(ids) for ids in kinds)
    for choice in rec(total, groups):
        used = [0] * len(kinds)
        out = []
        for c in choice:
            devices: list[str] = []
            for i, n in enumerate(c):
                devices += kinds[i][used[i]:used[i] + n]
                used[i] += n
            out.append(tuple(devices))
        yield tuple(out)


def boundary_choices(layers: int, stages: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Every split of ``layers`` layers into ``stages`` non-empty contiguous ranges.

    Examples
    --------
    >>> list(boundary_choices(3, 2))
    [((0, 1), (1, 3)), ((0, 2), (2, 3))]
    """
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        edges = (0, *cuts, layers)
        yield tuple(zip(edges[:-1], edges[1:]))


MAX_FLAG_STAGES = 10
"""Most stages whose recompute flags are enumerated in every combination; above it, none or all."""


def recompute_choices(problem: PlanningProblem, stages: int) -> Iterator[tuple[bool, ...]]:
    """Recompute flags: none first, then (when allowed) every other combination, or all of them above
    :data:`MAX_FLAG_STAGES` stages (see :func:`flags_exhaustive`)."""
    if not problem.allow_recompute:
        yield (False,) * stages
        return
    if stages > MAX_FLAG_STAGES:
        yield from ((False,) * stages, (True,) * stages)
        return
    yield from itertools.product((False, True), repeat=stages)


def flags_exhaustive(problem: PlanningProblem, stages: int) -> bool:
    """Whether :func:`recompute_choices` gives every combination of recompute flags for ``stages`` stages."""
    return not problem.allow_recompute or stages <= MAX_FLAG_STAGES


def group_counts(problem: PlanningProblem) -> range:
    """``R`` values to try: 1 up to the devices, the layers (``S >= R``) and ``max_stages``."""
    devices, layers = len(problem.cluster.devices), len(problem.graph)
    per_group = problem.needs.stages_per_group or 1  # the least stages a group holds
    top = min(devices, layers // per_group)
    if problem.max_stages is not None:
        top = min(top, problem.max_stages // per_group)
    return range(1, top + 1)


def to_plan(problem: PlanningProblem, candidate: Candidate) -> Plan:
    """The plan/2 of ``candidate`` under the problem's schedule (each stage on its group's devices, the equal split)."""
    devices = stage_devices(problem.schedule, candidate.groups, len(candidate.bounds))
    return problem.make_plan(candidate.bounds, devices, candidate.recompute)


def stage_groups(schedule: str, candidate: Candidate) -> tuple[int, ...]:
    """The group of each of ``candidate``'s stages under ``schedule``."""
    return tuple(stage_group(schedule, s, len(candidate.groups)) for s in range(len(candidate.bounds)))


def recompute_variants(problem: PlanningProblem, candidate: Candidate) -> Iterator[Candidate]:
    """``candidate`` with every other recompute choice of :func:`recompute_choices` (none of them all-off)."""
    for flags in recompute_choices(problem, len(candidate.bounds)):
        if any(flags):
            yield Candidate(candidate.virtual, candidate.groups, candidate.bounds, flags)


def candidates(problem: PlanningProblem, boundaries=boundary_choices, groupings=group_choices,
               flags: bool = True) -> Iterator[Candidate]:
    """Every candidate of the problem's schedule, in a fixed order (without ``flags``: only those without recompute).

    ``boundaries(layers, stages)`` gives the layer ranges to try and
    ``groupings(problem, groups)`` the device groups (all of them by default; a
    heuristic passes a few).  Group counts the schedule refuses for the problem's ``m``
    (:func:`schedule_accepts`) are left out.
    """
    for groups, v, stages in layouts(problem):
        for devs in groupings(problem, groups):
            for bounds in boundaries(len(problem.graph), stages):
                choices = recompute_choices(problem, stages) if flags else ((False,) * stages,)
                for chosen in choices:
                    yield Candidate(v, devs, tuple(bounds), chosen)


def layouts(problem: PlanningProblem) -> Iterator[tuple[int, int, int]]:
    """``(groups, v, stages)`` of every shape :func:`candidates` lists, in its order: the group counts the
    schedule takes for the problem's ``m``, each ``v`` of :func:`virtual_choices`, within ``max_stages``."""
    for groups in group_counts(problem):
        if schedule_accepts(problem.schedule, groups, problem.microbatches):
            continue
        for v in virtual_choices(problem, groups):
            stages = num_stages(problem.schedule, groups, v)
            if problem.max_stages is None or stages <= problem.max_stages:
                yield groups, v, stages


def plain_count(problem: PlanningProblem, cap: int, groupings=group_choices) -> int:
    """How many candidates ``candidates(problem, groupings=groupings, flags=False)`` yields (every split of the
    layers), counted up to the first total above ``cap``: one binomial per device grouping, so the count costs
    what listing the groupings costs, not the candidates.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> g = LayerGraph.chain("g", [Layer(f"l{i}", (0, 1), (0, 2), 0, 0, 0) for i in range(4)])
    >>> c = Cluster("c", (Link(1e9, 0, "s0"),), Link(1e9, 0), (Device("d0", "s0", 1, 1e9),))
    >>> p = PlanningProblem(g, c, global_batch=2, microbatches=2, schedule="looped-bfs", virtual_stages=2)
    >>> plain_count(p, 100) == sum(1 for _ in candidates(p, flags=False)) == 3  # one group: 2 stages
    True
    """
    total = 0
    for groups, _, stages in layouts(problem):
        splits = math.comb(len(problem.graph) - 1, stages - 1)  # boundary_choices' count
        for _ in groupings(problem, groups):
            total += splits
            if total > cap:
                return total
    return total


def even_bounds(layers: int, stages: int) -> tuple[tuple[int, int], ...]:
    """``stages`` ranges of ``layers // stages`` or one more layers, the larger ones first (torchtitan's even split).

    Examples
    --------
    >>> even_bounds(5, 2)
    ((0, 3), (3, 5))
    """
    size, extra = divmod(layers, stages)
    edges = [0]
    for s in range(stages):
        edges.append(edges[-1] + size + (1 if s < extra else 0))
    return tuple(zip(edges[:-1], edges[1:]))


def shifted(ends: Sequence[int], first: int, last: int, shift: int, start: int = 0) -> list[int] | None:
    """The stages' ends (exclusive) after boundaries ``first .. last`` move by ``shift``; ``None`` when a stage
    would lose its last layer.

    Moving a run of boundaries by one layer moves one layer between the stages at its two ends, the stages
    between passing one layer along (:func:`layer_moves`).

    Parameters
    ----------
    ends : sequence of int
        Where each stage ends (exclusive), ascending; the last never moves.
    first, last, shift : int
        Boundaries ``first <= last < len(ends) - 1`` and how far they move.
    start : int
        Where the first stage starts.

    Returns
    -------
    list of int or None

    Examples
    --------
    >>> shifted([4, 7, 9], 0, 1, -1)  # stage 0's last layer goes to stage 2
    [3, 6, 9]
    >>> shifted([4, 7, 9], 1, 1, 2) is None  # stage 2 would hold no layer
    True
    """
    trial = list(ends[:first]) + [e + shift for e in ends[first:last + 1]] + list(ends[last + 1:])
    before = trial[first - 1] if first else start
    return trial if before < trial[first] and trial[last] < trial[last + 1] else None


def layer_moves(bounds: Sequence[tuple[int, int]]) -> Iterator[tuple[tuple[int, int], ...]]:
    """Every split one layer away from ``bounds``: a layer leaves stage ``i`` for stage ``j``, in the order of ``(i, j)``.

    The stages between them pass one layer along, so every boundary between ``i`` and ``j``
    moves by one (:func:`shifted`); stage ``i`` keeps at least one layer.  Under a version-2
    schedule the two stages may sit on one group (its work stays, its balance between stages
    changes) or on groups far apart, which moving single boundaries reaches only through worse
    splits.

    Examples
    --------
    >>> for moved in layer_moves(((0, 2), (2, 4), (4, 5))):
    ...     print(moved)
    ((0, 1), (1, 4), (4, 5))
    ((0, 1), (1, 3), (3, 5))
    ((0, 3), (3, 4), (4, 5))
    ((0, 2), (2, 3), (3, 5))
    """
    start, ends = bounds[0][0], [hi for _, hi in bounds]
    for i, j in itertools.permutations(range(len(bounds)), 2):
        # a layer from i to a later j moves boundaries i .. j-1 back; to an earlier j, boundaries j .. i-1 on
        trial = shifted(ends, i, j - 1, -1, start) if i < j else shifted(ends, j, i - 1, 1, start)
        if trial is not None:
            yield tuple(zip([start] + trial[:-1], trial))


def stage_devices(schedule: str, groups: Sequence[Sequence[str]], stages: int) -> list[tuple[str, ...]]:
    """Each stage's devices when stage ``s`` runs on group :func:`pipeplan.solver.schedules.schedule.stage_group`."""
    return [tuple(groups[stage_group(schedule, s, len(groups))]) for s in range(stages)]


def empty_space(problem: PlanningProblem) -> str:
    """Why the problem's space holds no plan at all (an options problem, not a memory verdict), or ``""``."""
    if any(True for _ in candidates(problem, flags=False)):
        return ""
    v = "" if problem.virtual_stages is None else f" with {problem.virtual_stages} stages per group"
    return (f"no {problem.schedule} plan{v} exists for these options: every group count needs more stages than "
            f"the {len(problem.graph)} layers, or torch refuses M = {problem.microbatches} for it; use fewer "
            f"--virtual-stages or another --microbatches")


class VirtualSolver(Solver):
    """Base class of the algorithms that plan schedules whose device groups hold several stages.

    Beyond :meth:`Solver.check` it refuses a problem whose space holds no plan at all
    (:func:`empty_space`: the options rule every group count out), in one line.
    """

    schedules = SEVERAL_STAGES_PER_GROUP

    def check(self, problem: PlanningProblem) -> None:
        """Refuse another schedule, or a space with no plan (:func:`empty_space`).

        Raises
        ------
        InputError
            Naming ``--virtual-stages`` when it was given, else ``--schedule``.
        """
        super().check(problem)
        empty = empty_space(problem)
        if empty:
            raise InputError("-", "--virtual-stages" if problem.virtual_stages else "--schedule", empty)


def split_range(work: Sequence[float], lo: int, hi: int, parts: int) -> tuple[tuple[int, int], ...] | None:
    """``parts`` contiguous non-empty ranges of layers ``lo .. hi-1`` balancing ``work`` (a cut where the prefix
    sum first reaches ``j / parts`` of the range's total), the even split where that leaves a range empty;
    ``None`` when the range has fewer than ``parts`` layers.

    Examples
    --------
    >>> split_range([1.0, 1.0, 2.0, 1.0, 1.0], 1, 5, 2)
    ((1, 3), (3, 5))
    >>> split_range([1.0, 1.0], 0, 2, 3) is None
    True
    """
    if hi - lo < parts:
        return None
    total = sum(work[lo:hi])
    cuts, running, j = [lo], 0.0, 1
    for layer in range(lo, hi):
        running += work[layer]
        while j < parts and running >= total * j / parts - 1e-12 * total:
            cuts.append(layer + 1)
            j += 1
    cuts = (cuts + [hi] * parts)[:parts] + [hi]
    if total > 0 and all(a < b for a, b in zip(cuts, cuts[1:])):
        return tuple(zip(cuts[:-1], cuts[1:]))
    size, extra = divmod(hi - lo, parts)
    edges = [lo]
    for s in range(parts):
        edges.append(edges[-1] + size + (1 if s < extra else 0))
    return tuple(zip(edges[:-1], edges[1:]))


def from_partition(problem: PlanningProblem, groups: Sequence[Sequence[str]],
                   ranges: Sequence[tuple[int, int]], virtual: int) -> Candidate | None:
    """The version-2 form of a version-1 partition: group ``g`` (devices ``groups[g]``, layers ``ranges[g]``) keeps
    its layers' share, split into ``virtual`` work-balanced chunks (:func:`split_range` over ``b_f + b_b``) that
    become its stages in the schedule's stage-to-group order; ``None`` when a group holds fewer layers than
    chunks, the schedule refuses the group count for ``M`` or the stages exceed ``max_stages``.

    Stage ``s`` on group ``g = stage_group(s)``, the ``j``-th of ``g``'s stages, takes as many layers as
    chunk ``j`` of ``ranges[g]``; the stages' ranges follow one another from layer 0.  Each group thus runs
    the same amount of layers as in the version-1 plan, with its fill and drain cut by the interleaving.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> g = LayerGraph.chain("g", [Layer(f"l{i}", (0, 1), (0, 2), 0, 0, 0) for i in range(6)])
    >>> c = Cluster("c", (Link(1e9, 0, "s0"),), Link(1e9, 0), (Device("a", "s0", 1, 1e9), Device("b", "s0", 1, 1e9)))
    >>> p = PlanningProblem(g, c, global_batch=2, microbatches=2, schedule="interleaved-1f1b", virtual_stages=2)
    >>> from_partition(p, [("a",), ("b",)], [(0, 2), (2, 6)], 2).bounds  # a: 1 + 1 layers, b: 2 + 2
    ((0, 1), (1, 3), (3, 4), (4, 6))
    """
    count = len(groups)
    if count != len(ranges) or schedule_accepts(problem.schedule, count, problem.microbatches):
        return None
    stages = num_stages(problem.schedule, count, virtual)
    if problem.max_stages is not None and stages > problem.max_stages:
        return None
    work = [l.fwd[1] + l.bwd[1] for l in problem.graph.layers]
    chunks = [split_range(work, lo, hi, virtual) for lo, hi in ranges]
    if any(c is None for c in chunks):
        return None
    taken = [0] * count
    edges = [0]
    for s in range(stages):
        g = stage_group(problem.schedule, s, count)
        lo, hi = chunks[g][taken[g]]
        taken[g] += 1
        edges.append(edges[-1] + hi - lo)
    if edges[-1] != len(problem.graph):
        return None
    return Candidate(virtual, tuple(tuple(d) for d in groups), tuple(zip(edges[:-1], edges[1:])),
                     (False,) * stages)
