"""Programs built for one partition: its costs, its timeline, and a list scheduler.

A partition (stages, device groups, splits, recompute) fixes what every action costs;
what is left to choose is each group's *program*, the order in which it runs the
``F``, ``B``, ``I`` and ``W`` actions of its stages (spec section 7.2).  This module
holds

- :class:`ScheduleInstance`, everything the order of one partition depends on
  (per-action times, transfer times and links, all-reduce and step, memory), built
  from a plan by :func:`schedule_instance`;
- :func:`evaluate`, the iteration time and memory of programs on an instance, equal
  to the simulator's on the ``custom`` plan :func:`custom_plan` makes of them (spec
  sections 7.3 and 7.4, the same arithmetic in the same order);
- :func:`synthesize`, a list scheduler: every group picks, whenever it is idle, among
  the actions whose inputs have arrived, by a rule (:class:`ListRule`) and in-flight
  limits derived from the instance's own costs (:func:`warmup_limits`); some twenty
  rules (:func:`list_rules`), the fixed schedules' programs for the same partition
  (:func:`fixed_programs`) and the memory-minimal programs
  (:func:`sequential_programs`) are timed, and the fastest that respects every
  group's memory cap wins.

The exact order model (CP-SAT) is :mod:`pipeplan.solver.schedules.order_model`.

Only what a plan, a layer graph and a cluster expose publicly is read here (see
:class:`PlanLike`, :class:`GraphCosts`, :class:`ClusterLinks`), so this layer needs
neither the plan module nor the simulator.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any, Iterable, Protocol, Sequence

from pipeplan.solver.schedules.programs import (FORWARD, FULL_BACKWARD, INPUT_BACKWARD, WEIGHT_BACKWARD, Action,
                                                format_action)
from pipeplan.solver.schedules.schedule import (NAMED_V2, ONE_STAGE_PER_GROUP, group_programs, schedule_for,
                                                stage_actions, stage_group)

__all__ = ["StageCosts", "Boundary", "GroupCosts", "ScheduleInstance", "schedule_instance", "Timeline",
           "ProgramDeadlock", "evaluate", "custom_plan", "program_strings", "fixed_programs",
           "sequential_programs", "ListRule", "list_schedule", "list_rules", "Candidate", "Synthesis", "synthesize",
           "split_backwards", "warmup_limits", "minimal_limits", "EFFORTS", "Programs"]

Programs = tuple[tuple[Action, ...], ...]
"""One action list per device group, in group order."""


# --------------------------------------------------------------------- what is read from plan, graph, cluster
class GraphCosts(Protocol):
    """The layer graph's public sums (``pipeplan.models.graph.LayerGraph``)."""

    def range_time(self, lo: int, hi: int) -> tuple[float, float, float, float]: ...

    def range_weight_time(self, lo: int, hi: int) -> tuple[float, float]: ...

    def range_sum(self, attribute: str, lo: int, hi: int) -> float: ...

    def range_act_weight(self, lo: int, hi: int) -> float: ...

    def range_step(self, lo: int, hi: int) -> float: ...

    def cut_bytes(self, c: int) -> float: ...

    def stage_input_bytes(self, lo: int) -> float: ...


class ClusterLinks(Protocol):
    """The cluster's devices and worst links (``pipeplan.solver.formats.cluster.Cluster``)."""

    devices: Sequence[Any]

    def bw(self, xs: Iterable[str], ys: Iterable[str] | None = None) -> float: ...

    def lat(self, xs: Iterable[str], ys: Iterable[str] | None = None) -> float: ...


class PlanLike(Protocol):
    """The plan fields a partition is read from (``pipeplan.solver.formats.plan.Plan``)."""

    stages: Sequence[Any]
    state_factor: float

    @property
    def groups(self) -> list[tuple[str, ...]]: ...

    @property
    def stage_groups(self) -> list[int]: ...


# --------------------------------------------------------------------- the instance
@dataclass(frozen=True)
class StageCosts:
    """One stage: where it runs, its microbatches, what each action costs and stashes (spec 7.3, 7.4)."""

    group: int
    """The device group that runs it."""
    sizes: tuple[int, ...]
    """``n_k``: samples of each microbatch (what a transfer carries)."""
    samples: tuple[int, ...]
    """``q = ceil(n_k / r_g)``: samples per replica of each microbatch."""
    forward: tuple[float, ...]
    """Seconds of ``F`` per microbatch."""
    backward: tuple[float, ...]
    """Seconds of a whole ``B`` per microbatch (recompute included)."""
    input_grad: tuple[float, ...]
    """Seconds of ``I`` per microbatch (recompute included)."""
    weight_grad: tuple[float, ...]
    """Seconds of ``W`` per microbatch."""
    stash: float
    """``X_s``: bytes per sample an ``F`` adds and its ``B`` or ``I`` removes (``I_s`` if it recomputes, else
    ``A_s``)."""
    working: float
    """``A_s`` if the stage recomputes (held while its ``B`` or ``I`` runs), else 0."""
    weight_stash: float
    """``Aw_s``: bytes per sample an ``I`` leaves until its ``W``."""
    wait_forward: tuple[tuple[int, int], ...]
    """Inclusive range of the previous stage's microbatches each ``F`` waits for (empty on stage 0)."""
    wait_backward: tuple[tuple[int, int], ...]
    """Inclusive range of the next stage's microbatches each ``B`` or ``I`` waits for (empty on the last)."""
    first_sample: tuple[int, ...]
    """The index of each microbatch's first sample (its place in the batch)."""

    @property
    def count(self) -> int:
        """``m_s``: its number of microbatches."""
        return len(self.sizes)

    def duration(self, kind: str, k: int) -> float:
        """Seconds of the ``kind`` action of microbatch ``k``."""
        if kind == FORWARD:
            return self.forward[k]
        if kind == FULL_BACKWARD:
            return self.backward[k]
        if kind == INPUT_BACKWARD:
            return self.input_grad[k]
        return self.weight_grad[k]


@dataclass(frozen=True)
class Boundary:
    """The cut between stages ``c`` and ``c + 1``: what crosses it, how long it takes, on which link."""

    forward: tuple[float, ...]
    """Seconds of the activations of each microbatch of stage ``c`` (0 for a local hand-over)."""
    backward: tuple[float, ...]
    """Seconds of the gradients of each microbatch of stage ``c + 1`` (0 for a local hand-over)."""
    forward_link: tuple[int, int] | None
    """``(sender group, receiver group)`` of the activations; ``None`` when both stages share a group."""
    backward_link: tuple[int, int] | None
    """``(sender group, receiver group)`` of the gradients; ``None`` when both stages share a group."""


@dataclass(frozen=True)
class GroupCosts:
    """One device group: its stages, what follows its last action, its memory."""

    stages: tuple[int, ...]
    """The stages it holds, in stage order."""
    allreduce: float
    """``AR_g``: seconds of the gradient all-reduce after its last action."""
    step: float
    """``STEP_g``: seconds of the optimizer step after the all-reduce."""
    state: float
    """``state_factor * P_g``: bytes of training state per device."""
    memory: float
    """The smallest device memory of the group (what the simulator's ``fits`` compares with)."""
    cap: float
    """The memory a program may use per device (state included), at most :attr:`memory`."""

    @property
    def sync(self) -> float:
        """``AR_g + STEP_g``."""
        return self.allreduce + self.step


@dataclass(frozen=True)
class ScheduleInstance:
    """Everything the order of one partition's actions depends on (spec sections 7.3 and 7.4).

    Built from a plan by :func:`schedule_instance`; tests and models may build one
    directly.  Stage ``s`` emits its activations over ``boundaries[s]`` and its
    gradients over ``boundaries[s - 1]``.
    """

    stages: tuple[StageCosts, ...]
    """Per stage, in pipeline order."""
    boundaries: tuple[Boundary, ...]
    """Per cut, ``len(stages) - 1`` of them."""
    groups: tuple[GroupCosts, ...]
    """Per device group, numbered as the plan numbers them (group 0 holds stage 0)."""

    def __post_init__(self) -> None:
        if len(self.boundaries) != len(self.stages) - 1:
            raise ValueError(f"{len(self.stages)} stages need {len(self.stages) - 1} boundaries, "
                             f"got {len(self.boundaries)}")
        for s, st in enumerate(self.stages):
            if not 0 <= st.group < len(self.groups) or s not in self.groups[st.group].stages:
                raise ValueError(f"stage {s} names group {st.group}, which does not list it")

    @property
    def placement(self) -> tuple[int, ...]:
        """The group of each stage."""
        return tuple(st.group for st in self.stages)

    @property
    def equal_splits(self) -> bool:
        """Whether every stage splits the batch alike (microbatch ``k`` is the same samples everywhere)."""
        return all(st.sizes == self.stages[0].sizes for st in self.stages)

    def actions(self, split_backward: bool = True) -> list[list[Action]]:
        """Every group's actions (in no particular order): ``F`` and ``I``, ``W`` (or ``B``) per microbatch."""
        kinds = (FORWARD, INPUT_BACKWARD, WEIGHT_BACKWARD) if split_backward else (FORWARD, FULL_BACKWARD)
        out: list[list[Action]] = [[] for _ in self.groups]
        for s, st in enumerate(self.stages):
            out[st.group] += [Action(s, kind, k) for k in range(st.count) for kind in kinds]
        return out

    def serial_work(self, split_backward: bool = True) -> float:
        """Seconds of all actions of all groups, summed: the iteration time of one device doing everything."""
        total = 0.0
        for st in self.stages:
            total += math.fsum(st.forward) + (math.fsum(st.input_grad) + math.fsum(st.weight_grad) if split_backward
                                              else math.fsum(st.backward))
        for b in self.boundaries:
            total += math.fsum(b.forward) + math.fsum(b.backward)
        return total + sum(g.sync for g in self.groups)


def _ceil_div(n: int, r: int) -> int:
    return -(-n // r)


def _overlaps(mine: Sequence[int], theirs: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """For each of my microbatches, the inclusive range of theirs sharing a sample."""
    their_ends = list(accumulate(theirs))
    ranges, start = [], 0
    for end in accumulate(mine):
        ranges.append((bisect_right(their_ends, start), bisect_left(their_ends, end)))
        start = end
    return tuple(ranges)


def _send_times(sender: Any, receiver: Any, cut_bytes: float, cluster: ClusterLinks) -> tuple[float, ...]:
    """Seconds each of ``sender``'s microbatches takes across the cut (spec 7.3), summed as the simulator sums."""
    lat = cluster.lat(sender.devices, receiver.devices)
    rate = min(len(sender.devices), len(receiver.devices)) * cluster.bw(sender.devices, receiver.devices)
    return tuple(lat + n * cut_bytes / rate for n in sender.microbatches)


def _allreduce(cluster: ClusterLinks, devices: tuple[str, ...], params: float) -> float:
    """``AR = 2*(r-1) * (lat(D) + P / (r * bw(D)))``; 0 for one device."""
    r = len(devices)
    if r < 2:
        return 0.0
    return 2 * (r - 1) * (cluster.lat(devices) + params / (r * cluster.bw(devices)))


def schedule_instance(plan: PlanLike, graph: GraphCosts, cluster: ClusterLinks, *,
                      memory_fraction: float = 1.0, memory_caps: Sequence[float] | None = None) -> ScheduleInstance:
    """The costs of ``plan``'s partition, as the simulator computes them (spec sections 7.3, 7.4).

    The plan's schedule and programs are ignored: only its stages, groups, splits and
    recompute flags matter.

    Parameters
    ----------
    plan : Plan
        A validated plan (any schedule).
    graph : LayerGraph
        The graph it was made for.
    cluster : Cluster
        The cluster it was made for.
    memory_fraction : float, optional
        Each group's cap as a share of its smallest device memory (in ``(0, 1]``).
    memory_caps : sequence of float, optional
        Each group's cap in bytes (state included), overriding ``memory_fraction``;
        a cap above the group's device memory is lowered to it.

    Returns
    -------
    ScheduleInstance

    Raises
    ------
    ValueError
        For a ``memory_fraction`` outside ``(0, 1]``, or ``memory_caps`` of another
        length than the plan's groups or with a negative entry.
    """
    if not 0.0 < memory_fraction <= 1.0:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    devices_of = plan.groups
    placement = plan.stage_groups
    if memory_caps is not None and (len(memory_caps) != len(devices_of) or any(not c >= 0 for c in memory_caps)):
        raise ValueError(f"memory_caps needs one cap >= 0 per device group ({len(devices_of)}), got "
                         f"{list(memory_caps)}")
    known = {d.id: d for d in cluster.devices}
    speed = [min(known[d].speed for d in devs) for devs in devices_of]
    replicas = [len(devs) for devs in devices_of]
    stages = tuple(_stage_costs(st, placement[s], s, plan.stages, graph, replicas[placement[s]],
                                speed[placement[s]]) for s, st in enumerate(plan.stages))
    boundaries = tuple(_boundary(plan.stages, placement, c, graph, cluster) for c in range(len(plan.stages) - 1))
    groups = []
    for g, devs in enumerate(devices_of):
        held = tuple(s for s, h in enumerate(placement) if h == g)
        params = sum(graph.range_sum("params", *plan.stages[s].layers) for s in held)
        step = sum(graph.range_step(*plan.stages[s].layers) for s in held) / speed[g]
        memory = min(known[d].memory for d in devs)
        cap = memory * memory_fraction if memory_caps is None else min(float(memory_caps[g]), memory)
        groups.append(GroupCosts(held, _allreduce(cluster, tuple(devs), params), step,
                                 plan.state_factor * params, memory, min(cap, memory)))
    return ScheduleInstance(stages, boundaries, tuple(groups))


def _stage_costs(st: Any, group: int, s: int, stages: Sequence[Any], graph: GraphCosts, r: int,
                 speed: float) -> StageCosts:
    lo, hi = st.layers
    af, bf, ab, bb = graph.range_time(lo, hi)
    aw, bw = graph.range_weight_time(lo, hi)
    q = tuple(_ceil_div(n, r) for n in st.microbatches)
    fwd = tuple((af + bf * n) / speed for n in q)
    rec = fwd if st.recompute else tuple(0.0 for _ in q)
    act = graph.range_sum("act", lo, hi)
    last = len(stages) - 1
    return StageCosts(
        group=group, sizes=tuple(st.microbatches), samples=q, forward=fwd,
        backward=tuple((ab + bb * n) / speed + x for n, x in zip(q, rec)),
        input_grad=tuple(((ab - aw) + (bb - bw) * n) / speed + x for n, x in zip(q, rec)),
        weight_grad=tuple((aw + bw * n) / speed for n in q),
        stash=graph.stage_input_bytes(lo) if st.recompute else act,
        working=act if st.recompute else 0.0,
        weight_stash=graph.range_act_weight(lo, hi),
        wait_forward=_overlaps(st.microbatches, stages[s - 1].microbatches) if s > 0 else (),
        wait_backward=_overlaps(st.microbatches, stages[s + 1].microbatches) if s < last else (),
        first_sample=tuple([0] + list(accumulate(st.microbatches))[:-1]))


def _boundary(stages: Sequence[Any], placement: Sequence[int], c: int, graph: GraphCosts,
              cluster: ClusterLinks) -> Boundary:
    sender, receiver = stages[c], stages[c + 1]
    if placement[c] == placement[c + 1]:
        return Boundary(tuple(0.0 for _ in sender.microbatches), tuple(0.0 for _ in receiver.microbatches),
                        None, None)
    cut = graph.cut_bytes(sender.layers[1] - 1)
    return Boundary(_send_times(sender, receiver, cut, cluster),
                    _send_times(receiver, sender, graph.cut_bytes(receiver.layers[0] - 1), cluster),
                    (placement[c], placement[c + 1]), (placement[c + 1], placement[c]))


# --------------------------------------------------------------------- timing programs
class ProgramDeadlock(ValueError):
    """Programs whose dependencies form a cycle: some action can never start."""


@dataclass(frozen=True)
class Timeline:
    """What programs cost on an instance (the simulator's numbers, bit for bit)."""

    iteration_time: float
    """``T = max over groups of (end of its last action + AR_g + STEP_g)``."""
    times: tuple[tuple[tuple[float, float], ...], ...]
    """``(start, end)`` of each group's actions, in program order."""
    group_end: tuple[float, ...]
    """Each group's last action's end plus its all-reduce and step."""
    peak_memory: tuple[float, ...]
    """Each group's peak bytes per device (state plus the stash's peak over its program)."""
    caps: tuple[float, ...]
    """Each group's memory cap."""

    @property
    def fits(self) -> bool:
        """Whether every group's peak is within its cap."""
        return all(p <= c for p, c in zip(self.peak_memory, self.caps))

    @property
    def excess(self) -> float:
        """The largest ``peak - cap`` over the groups (<= 0 when it fits)."""
        return max(p - c for p, c in zip(self.peak_memory, self.caps))


def evaluate(instance: ScheduleInstance, programs: Sequence[Sequence[Action]]) -> Timeline:
    """Time and memory of ``programs`` on ``instance`` (spec sections 7.3 and 7.4).

    Equal, bit for bit, to ``simulate(custom_plan(plan, programs), graph, cluster)``
    when ``instance`` is ``schedule_instance(plan, graph, cluster)``: the same sums in
    the same order.  The programs are not checked (see
    :func:`pipeplan.solver.schedules.check.check_programs`): a missing action is simply
    not run.

    Parameters
    ----------
    instance : ScheduleInstance
    programs : sequence of sequence of Action
        One program per group.

    Returns
    -------
    Timeline

    Raises
    ------
    ProgramDeadlock
        If some action can never start.

    Examples
    --------
    See ``tests/test_synthesis.py``.
    """
    return Timeline(*_timeline(instance, programs), tuple(_peak(instance, g, p) for g, p in enumerate(programs)),
                    tuple(g.cap for g in instance.groups))


def _timeline(instance: ScheduleInstance, programs: Sequence[Sequence[Action]],
              sends: dict[Action, Any] | None = None):
    """``(T, times, group ends)`` by the simulator's sweep: each group advances while its inputs are in.

    ``sends``, when given, receives the start of every transfer over a link, by the action that sent it
    (as its arrival less its duration: exact in the integer times the order model gives).
    """
    stages, bounds, groups = instance.stages, instance.boundaries, instance.groups
    count, last = len(groups), len(stages) - 1
    ptr = [0] * count
    clock = [0] * count
    times: list[list[tuple[Any, Any]]] = [[] for _ in range(count)]
    fwd_arrival: list[list[Any]] = [[None] * st.count for st in stages]  # by sending stage
    bwd_arrival: list[list[Any]] = [[None] * st.count for st in stages]
    link_free: dict[tuple[int, int], Any] = {}
    remaining = sum(len(p) for p in programs)
    while remaining:
        progressed = 0
        for gi in range(count):
            program, p, now, done = programs[gi], ptr[gi], clock[gi], times[gi]
            while p < len(program):
                s, kind, k = program[p]
                st = stages[s]
                ready = now
                if kind == FORWARD:
                    if s > 0:
                        lo, hi = st.wait_forward[k]
                        arrivals = fwd_arrival[s - 1][lo:hi + 1]
                        if None in arrivals:
                            break
                        ready = max(now, max(arrivals))
                    now = ready + st.forward[k]
                    if s < last:
                        fwd_arrival[s][k] = _send(now, bounds[s].forward[k], bounds[s].forward_link, link_free)
                        if sends is not None and bounds[s].forward_link is not None:
                            sends[Action(s, kind, k)] = fwd_arrival[s][k] - bounds[s].forward[k]
                elif kind == WEIGHT_BACKWARD:
                    now = ready + st.weight_grad[k]
                else:
                    if s < last:
                        lo, hi = st.wait_backward[k]
                        arrivals = bwd_arrival[s + 1][lo:hi + 1]
                        if None in arrivals:
                            break
                        ready = max(now, max(arrivals))
                    now = ready + (st.input_grad[k] if kind == INPUT_BACKWARD else st.backward[k])
                    if s > 0:
                        bwd_arrival[s][k] = _send(now, bounds[s - 1].backward[k], bounds[s - 1].backward_link,
                                                  link_free)
                        if sends is not None and bounds[s - 1].backward_link is not None:
                            sends[Action(s, kind, k)] = bwd_arrival[s][k] - bounds[s - 1].backward[k]
                done.append((ready, now))
                p += 1
            progressed += p - ptr[gi]
            ptr[gi], clock[gi] = p, now
        if not progressed:
            stuck = next(g for g in range(count) if ptr[g] < len(programs[g]))
            raise ProgramDeadlock(f"deadlock: group {stuck} waits forever at action "
                                  f"{format_action(Action(*programs[stuck][ptr[stuck]]))} (position {ptr[stuck]})")
        remaining -= progressed
    ends = tuple(done[-1][1] + g.allreduce + g.step if done else g.allreduce + g.step
                 for g, done in zip(groups, times))
    return max(ends), tuple(tuple(t) for t in times), ends


def _send(end: Any, duration: Any, link: tuple[int, int] | None, link_free: dict[tuple[int, int], Any]) -> Any:
    """The arrival of what an action ending at ``end`` sends: at once if local, else after its FIFO link."""
    if link is None:
        return end
    free = link_free.get(link, 0)
    start = end if end > free else free
    arrival = start + duration
    link_free[link] = arrival
    return arrival


def _peak(instance: ScheduleInstance, g: int, program: Sequence[Action]) -> float:
    """State plus the stash's peak over ``program`` (spec 7.4), summed as the simulator sums."""
    stash = peak = 0.0
    for s, kind, k in program:
        st = instance.stages[s]
        q = st.samples[k]
        if kind == FORWARD:
            stash += q * st.stash
            peak = max(peak, stash)
        elif kind == WEIGHT_BACKWARD:
            stash -= q * st.weight_stash
        else:
            peak = max(peak, stash + q * st.working)
            stash -= q * st.stash
            if kind == INPUT_BACKWARD:
                stash += q * st.weight_stash
    return instance.groups[g].state + peak


# --------------------------------------------------------------------- programs as a plan
def program_strings(programs: Sequence[Sequence[Action]]) -> tuple[tuple[str, ...], ...]:
    """Programs written as torch writes actions (``"0F3"``)."""
    return tuple(tuple(format_action(a) for a in p) for p in programs)


def custom_plan(plan: Any, programs: Sequence[Sequence[Action]], **extra: Any) -> Any:
    """``plan`` with ``programs`` as its ``custom`` schedule (spec 7.2), everything else kept.

    Parameters
    ----------
    plan : Plan
        The partition's plan (any schedule).
    programs : sequence of sequence of Action
        One program per group.
    **extra
        Top-level fields to add to the plan's record (``synthesis={...}``).

    Returns
    -------
    Plan
        ``schedule="custom"``, ``custom_programs`` set, no per-stage ``ops``; a
        ``pipeplan.plan/2`` plan that ``simulate`` times as :func:`evaluate` does.
    """
    stages = tuple(replace(st, ops=None) for st in plan.stages)
    merged = {**plan.extra, **extra} if extra else plan.extra
    return replace(plan, schedule="custom", stages=stages, custom_programs=program_strings(programs), extra=merged)


# --------------------------------------------------------------------- candidate programs
def split_backwards(programs: Sequence[Sequence[Action]]) -> Programs:
    """Every ``B`` written as its ``I`` followed at once by its ``W`` (never slower, same peak memory).

    The ``I`` sends its gradient when it ends, before the ``B`` would have; the stash
    it leaves (``Aw``) is gone when the ``W`` ends, as the ``B``'s is, and while the
    ``I`` runs the same is held.
    """
    out = []
    for program in programs:
        row: list[Action] = []
        for a in program:
            if a.kind == FULL_BACKWARD:
                row += [Action(a.stage, INPUT_BACKWARD, a.microbatch), Action(a.stage, WEIGHT_BACKWARD, a.microbatch)]
            else:
                row.append(a)
        out.append(tuple(row))
    return tuple(out)


def fixed_programs(instance: ScheduleInstance) -> dict[str, Programs]:
    """The programs of every named schedule that applies to the instance's placement and splits.

    ``gpipe`` and ``1f1b`` need one stage per group (each stage's own microbatch
    count); ``interleaved-1f1b``, ``interleaved-zb`` and ``looped-bfs`` the looped
    placement (stage ``s`` on group ``s mod R``) and ``zbv`` the V placement, each with
    equal splits and a microbatch count torch accepts (spec 7.2).

    Returns
    -------
    dict of str to Programs
        By schedule name, in the order of :data:`pipeplan.solver.schedules.schedule.SCHEDULES`.
    """
    groups, count = len(instance.groups), len(instance.stages)
    placement = instance.placement
    found: dict[str, Programs] = {}
    if placement == tuple(range(count)):
        for name in ONE_STAGE_PER_GROUP:
            found[name] = tuple(stage_actions(name, st.count, s, count) for s, st in enumerate(instance.stages))
    if not instance.equal_splits:
        return found
    m = instance.stages[0].count
    for name in NAMED_V2:
        cls = schedule_for(name)
        virtual = cls.stages_per_group or count // groups
        if count != virtual * groups:
            continue
        if any(cls.stage_group(s, groups) != placement[s] for s in range(count)):
            continue
        try:
            cls.check_counts(groups, m, virtual)
        except ValueError:
            continue
        found[name] = tuple(tuple(p) for p in group_programs(name, groups, m, virtual))
    return found


def sequential_programs(instance: ScheduleInstance, split_backward: bool = True) -> Programs:
    """The memory-minimal programs: one microbatch at a time through the whole pipeline and back.

    Actions are taken in the order of a depth-first walk of the dependencies (every
    backward, then its ``W``, as soon as it can run; a new forward only when nothing
    else can), timed at zero cost, each stage holding as few microbatches as the
    splits allow (:func:`minimal_limits`).  With equal splits this holds, on every
    group, only what some program must hold (the stash of one microbatch on each of
    its stages): when it exceeds a group's cap, no program fits.

    Returns
    -------
    Programs
    """
    limits = minimal_limits(instance, split_backward)
    rule = ListRule("sequential", backward_first=True, oldest_first=True, weights="eager", limits=limits,
                    respect_caps=False)
    programs = list_schedule(_zero_cost(instance), rule, split_backward)
    assert programs is not None, "minimal_limits returned limits that stall"
    return programs


def minimal_limits(instance: ScheduleInstance, split_backward: bool = True) -> tuple[int, ...]:
    """Per stage, the fewest microbatches it must be able to hold for the pipeline to drain.

    1 everywhere when the stages split alike.  With unequal splits a backward may wait
    for a later microbatch of the next stage, whose forward needs several of this
    stage's: found by running the depth-first walk at zero cost and raising the limit
    of every stage whose forward the limit held back when the walk stalled.
    """
    limits = [1] * len(instance.stages)
    if instance.equal_splits:
        return tuple(limits)
    zero = _zero_cost(instance)
    while True:
        rule = ListRule("sequential", True, True, "eager", tuple(limits), respect_caps=False)
        programs, held_back = _list_run(zero, rule, split_backward, None)
        if programs is not None:
            return tuple(limits)
        assert held_back, "the zero-cost walk stalled with no stage held back by its limit"
        for s in held_back:
            limits[s] += 1


def _zero_cost(instance: ScheduleInstance) -> ScheduleInstance:
    stages = tuple(replace(st, forward=tuple(0.0 for _ in st.forward), backward=tuple(0.0 for _ in st.backward),
                           input_grad=tuple(0.0 for _ in st.input_grad),
                           weight_grad=tuple(0.0 for _ in st.weight_grad)) for st in instance.stages)
    bounds = tuple(replace(b, forward=tuple(0.0 for _ in b.forward), backward=tuple(0.0 for _ in b.backward))
                   for b in instance.boundaries)
    return replace(instance, stages=stages, boundaries=bounds)


# --------------------------------------------------------------------- the list scheduler
@dataclass(frozen=True)
class ListRule:
    """How an idle group picks its next action in :func:`list_schedule`."""

    name: str
    """A label for reports (``"backward-first oldest W-fill depth+1"``)."""
    backward_first: bool
    """Prefer a ready ``B``/``I`` over a ready ``F`` (1F1B's steady state), else the reverse (fill first)."""
    oldest_first: bool
    """Among ready actions of one kind, take the oldest microbatch (depth first); else the one with the
    longest tail to the end of the iteration (critical path first)."""
    weights: str
    """When a ``W`` runs: ``"eager"`` right after its ``I``; ``"fill"`` whenever nothing else is ready;
    ``"fit"`` only when it ends before the next known arrival for the group (or nothing is in flight
    for it). Under every rule a ``W`` runs when memory blocks the group."""
    limits: tuple[int, ...]
    """Per stage, the most microbatches it may hold between ``F`` and ``B``/``I`` (the warm-up depth)."""
    respect_caps: bool = True
    """Run an ``F`` (or a recomputing backward) only when the group's stash stays within its cap."""


def _tails(instance: ScheduleInstance, split_backward: bool) -> list[dict[str, list[float]]]:
    """Per stage and kind, the longest chain of action and transfer times from the action's start to the end.

    Resources are ignored: this is each action's critical-path priority.  A ``W`` ends
    a chain (its group's all-reduce and step follow); a ``B``/``I`` leads to its ``W`` and
    to the backwards of the previous stage that wait for it; an ``F`` to the forwards of
    the next stage that wait for it, or on the last stage to its own backward.
    """
    stages, bounds = instance.stages, instance.boundaries
    last = len(stages) - 1
    back = INPUT_BACKWARD if split_backward else FULL_BACKWARD
    tails: list[dict[str, list[float]]] = [{} for _ in stages]
    for s, st in enumerate(stages):  # the backward chain runs from the last stage down to stage 0
        sync = instance.groups[st.group].sync
        weights = [st.weight_grad[k] + sync for k in range(st.count)]
        tails[s][WEIGHT_BACKWARD] = weights
        row = []
        for k in range(st.count):
            after = weights[k] if split_backward else sync
            if s > 0:
                prev = stages[s - 1]
                waiting = [tails[s - 1][back][j] for j in range(prev.count)
                           if prev.wait_backward[j][0] <= k <= prev.wait_backward[j][1]]
                if waiting:
                    after = max(after, bounds[s - 1].backward[k] + max(waiting))
            row.append(st.duration(back, k) + after)
        tails[s][back] = row
    for s in range(last, -1, -1):
        st = stages[s]
        row = []
        for k in range(st.count):
            after = tails[s][back][k]
            if s < last:
                nxt = stages[s + 1]
                waiting = [tails[s + 1][FORWARD][j] for j in range(nxt.count)
                           if nxt.wait_forward[j][0] <= k <= nxt.wait_forward[j][1]]
                if waiting:
                    after = max(after, bounds[s].forward[k] + max(waiting))
            row.append(st.forward[k] + after)
        tails[s][FORWARD] = row
    return tails


def list_schedule(instance: ScheduleInstance, rule: ListRule, split_backward: bool = True,
                  tails: list[dict[str, list[float]]] | None = None) -> Programs | None:
    """Programs built by running the pipeline: each idle group picks a ready action by ``rule``.

    Time moves from event to event (an action ends, a transfer arrives); at each, the
    idle groups it concerns pick among the actions whose inputs are in: the next ``F`` of a stage
    (in microbatch order, while the stage holds fewer than its limit and the stash fits
    the cap), its next ``B``/``I`` (in microbatch order), its next ``W``, as ``rule``
    ranks them. Transfers queue on their links in the order their actions end, as the
    simulator has them.

    Parameters
    ----------
    instance : ScheduleInstance
    rule : ListRule
    split_backward : bool
        Backwards as ``I`` then ``W`` (else whole ``B``).
    tails : optional
        The instance's critical-path tails (``_tails``), computed when not given.

    Returns
    -------
    Programs or None
        ``None`` if the rule stalls (every group waits and nothing is in flight): with
        limits of at least :func:`minimal_limits` this happens only when a cap blocks
        a forward that no ``W`` can make room for (limits from :func:`warmup_limits`
        are clipped so that it cannot).
    """
    return _list_run(instance, rule, split_backward, tails)[0]


def _list_run(instance: ScheduleInstance, rule: ListRule, split_backward: bool,
              tails: list[dict[str, list[float]]] | None) -> tuple[Programs | None, set[int]]:
    """:func:`list_schedule`, and when it stalls the stages whose next forward only its limit held back.

    A group decides when it becomes idle and when something arrives for it: each
    action it runs wakes it again at its end, and each transfer wakes the receiving
    group at its arrival (a transfer's arrival is known as soon as its action starts,
    since durations and the link's queue are).
    """
    stages, bounds, groups = instance.stages, instance.boundaries, instance.groups
    count, last = len(stages), len(stages) - 1
    back = INPUT_BACKWARD if split_backward else FULL_BACKWARD
    if not rule.oldest_first and tails is None:
        tails = _tails(instance, split_backward)
    counts = [st.count for st in stages]
    owner = [st.group for st in stages]
    limits, caps = rule.limits, rule.respect_caps
    nf, nb, nw = [0] * count, [0] * count, [0] * count
    f_end: list[list[Any]] = [[None] * c for c in counts]
    fwd_arrival: list[list[Any]] = [[None] * c for c in counts]
    bwd_arrival: list[list[Any]] = [[None] * c for c in counts]
    link_free: dict[tuple[int, int], float] = {}
    level = [0.0] * len(groups)
    free = [0.0] * len(groups)
    programs: list[list[Action]] = [[] for _ in groups]
    remaining = sum(counts) * (3 if split_backward else 2)
    wake: list[tuple[float, int]] = [(0.0, g) for g in range(len(groups))]
    held = [g.stages for g in groups]
    if rule.oldest_first:
        keys = {kind: [[(st.first_sample[k], -s) for k in range(st.count)] for s, st in enumerate(stages)]
                for kind in (FORWARD, back, WEIGHT_BACKWARD)}
    else:
        keys = {kind: [[(-tails[s][kind][k], st.first_sample[k], -s) for k in range(st.count)]  # type: ignore[index]
                       for s, st in enumerate(stages)] for kind in (FORWARD, back, WEIGHT_BACKWARD)}
    f_keys, b_keys, w_keys = keys[FORWARD], keys[back], keys[WEIGHT_BACKWARD]

    def forward_ready(s: int, k: int) -> Any:
        if s == 0:
            return 0.0
        lo, hi = stages[s].wait_forward[k]
        if lo == hi:
            return fwd_arrival[s - 1][lo]
        arrivals = fwd_arrival[s - 1][lo:hi + 1]
        return None if None in arrivals else max(arrivals)

    def backward_ready(s: int, k: int) -> Any:
        if s == last:
            return f_end[s][k]
        lo, hi = stages[s].wait_backward[k]
        if lo == hi:
            return bwd_arrival[s + 1][lo]
        arrivals = bwd_arrival[s + 1][lo:hi + 1]
        return None if None in arrivals else max(arrivals)

    def run(g: int, s: int, kind: str, k: int, start: float) -> None:
        st = stages[s]
        end = start + st.duration(kind, k)
        q = st.samples[k]
        if kind == FORWARD:
            level[g] += q * st.stash
            f_end[s][k] = end
            if s < last:
                arrival = _send(end, bounds[s].forward[k], bounds[s].forward_link, link_free)
                fwd_arrival[s][k] = arrival
                heapq.heappush(wake, (arrival, owner[s + 1]))
            nf[s] += 1
        elif kind == WEIGHT_BACKWARD:
            level[g] -= q * st.weight_stash
            nw[s] += 1
        else:
            level[g] -= q * st.stash
            if kind == INPUT_BACKWARD:
                level[g] += q * st.weight_stash
            if s > 0:
                arrival = _send(end, bounds[s - 1].backward[k], bounds[s - 1].backward_link, link_free)
                bwd_arrival[s][k] = arrival
                heapq.heappush(wake, (arrival, owner[s - 1]))
            nb[s] += 1
        programs[g].append(Action(s, kind, k))
        free[g] = end
        heapq.heappush(wake, (end, g))

    def choose(g: int, t: float) -> tuple[int, str, int] | None:
        backward = forward = None
        blocked = False
        state, cap, stash = groups[g].state, groups[g].cap, level[g]
        for s in held[g]:
            st = stages[s]
            k = nb[s]
            if k < nf[s]:
                ready = backward_ready(s, k)
                if ready is not None and ready <= t:
                    # the peak as evaluate() sums it: state + (stash + working)
                    if caps and st.working and state + (stash + st.samples[k] * st.working) > cap:
                        blocked = True
                    elif backward is None or b_keys[s][k] < backward[0]:
                        backward = (b_keys[s][k], s, back, k)
            k = nf[s]
            if k < counts[s] and k - nb[s] < limits[s]:
                ready = forward_ready(s, k)
                if ready is not None and ready <= t:
                    if caps and state + (stash + st.samples[k] * st.stash) > cap:
                        blocked = True
                    elif forward is None or f_keys[s][k] < forward[0]:
                        forward = (f_keys[s][k], s, FORWARD, k)
        weight = None
        if split_backward:
            for s in held[g]:
                k = nw[s]
                if k < nb[s] and (weight is None or w_keys[s][k] < weight[0]):
                    weight = (w_keys[s][k], s, WEIGHT_BACKWARD, k)
        if weight is not None and (rule.weights == "eager" or (blocked and backward is None and forward is None)):
            return weight[1:]
        first, second = (backward, forward) if rule.backward_first else (forward, backward)
        if first is not None:
            return first[1:]
        if second is not None:
            return second[1:]
        if weight is None:
            return None
        if rule.weights == "fill" or blocked:
            return weight[1:]
        arrival = next_arrival(g, t)
        if arrival is None or t + stages[weight[1]].duration(WEIGHT_BACKWARD, weight[3]) <= arrival:
            return weight[1:]
        return None

    def next_arrival(g: int, t: float) -> float | None:
        """The earliest known time after ``t`` at which an ``F`` or ``B``/``I`` of group ``g`` becomes ready."""
        best = None
        for s in held[g]:
            if nb[s] < nf[s]:
                ready = backward_ready(s, nb[s])
                if ready is not None and ready > t and (best is None or ready < best):
                    best = ready
            if nf[s] < counts[s] and nf[s] - nb[s] < limits[s]:
                ready = forward_ready(s, nf[s])
                if ready is not None and ready > t and (best is None or ready < best):
                    best = ready
        return best

    while remaining:
        if not wake:
            held_back = {s for s in range(count) if nf[s] < counts[s] and nf[s] - nb[s] >= limits[s]
                         and forward_ready(s, nf[s]) is not None}
            return None, held_back
        t, g = heapq.heappop(wake)
        woken = {g}
        while wake and wake[0][0] <= t:
            woken.add(heapq.heappop(wake)[1])
        for g in sorted(woken):
            if free[g] <= t:
                pick = choose(g, t)
                if pick is not None:
                    run(g, *pick, t)
                    remaining -= 1
    return tuple(tuple(p) for p in programs), set()


def _round_trip(instance: ScheduleInstance, split_backward: bool) -> list[float]:
    """Per stage, the mean seconds from the end of an ``F`` to its gradient's arrival, with no queueing."""
    stages, bounds = instance.stages, instance.boundaries
    back = INPUT_BACKWARD if split_backward else FULL_BACKWARD

    def mean(xs: Sequence[float]) -> float:
        return math.fsum(xs) / len(xs) if xs else 0.0

    trips = [0.0] * len(stages)
    for s in range(len(stages) - 2, -1, -1):
        nxt = stages[s + 1]
        down = mean(bounds[s].forward) + mean(nxt.forward)
        up = mean([nxt.duration(back, k) for k in range(nxt.count)]) + mean(bounds[s].backward)
        trips[s] = trips[s + 1] + down + up
    return trips


def _cycle(instance: ScheduleInstance, split_backward: bool) -> float:
    """Seconds per microbatch of the busiest resource (a group or a link): the steady state's period."""
    m = max(st.count for st in instance.stages)
    busy: dict[Any, float] = {}
    for st in instance.stages:
        work = math.fsum(st.forward) + (math.fsum(st.input_grad) + math.fsum(st.weight_grad) if split_backward
                                        else math.fsum(st.backward))
        busy[("group", st.group)] = busy.get(("group", st.group), 0.0) + work
    for b in instance.boundaries:
        for link, times in ((b.forward_link, b.forward), (b.backward_link, b.backward)):
            if link is not None:
                busy[link] = busy.get(link, 0.0) + math.fsum(times)
    return max(busy.values()) / m if busy else 0.0


def warmup_limits(instance: ScheduleInstance, split_backward: bool = True, extra: int = 0,
                  floor: Sequence[int] | None = None) -> tuple[int, ...]:
    """Per stage, how many microbatches it holds before its first backward, from the instance's costs.

    A stage needs as many microbatches in flight as it can start while the first one
    travels to the end of the pipeline and its gradient comes back: ``1 +
    ceil(round trip / period)``, the period being the busiest group's or link's time
    per microbatch. With equal stages and free links this is 1F1B's ``S - s``. The
    result is lowered, from the deepest stage of a group down, until the stash of
    those microbatches on each group (and a recomputing backward's working set) fits
    its cap, and never below 1.

    Parameters
    ----------
    instance : ScheduleInstance
    split_backward : bool
    extra : int
        Added to every stage's depth before the memory clip (``-1``, ``+1``, ...).
    floor : sequence of int, optional
        Per stage, the least limit (:func:`minimal_limits`, computed when not given).
    """
    floor = minimal_limits(instance, split_backward) if floor is None else floor
    trips, period = _round_trip(instance, split_backward), _cycle(instance, split_backward)
    limits = []
    for s, st in enumerate(instance.stages):
        depth = 1 + (math.ceil(trips[s] / period - 1e-9) if period > 0 else len(instance.stages) - 1 - s)
        limits.append(max(floor[s], min(st.count, depth + extra)))
    return _memory_clip(instance, limits, floor)


def _memory_clip(instance: ScheduleInstance, limits: list[int], floor: Sequence[int]) -> tuple[int, ...]:
    """``limits`` lowered until each group's worst stash under them fits its cap (never below ``floor``)."""
    for g, group in enumerate(instance.groups):
        room = group.cap - group.state
        held = group.stages
        working = max((max(instance.stages[s].samples) * instance.stages[s].working for s in held), default=0.0)

        def worst() -> float:
            return working + sum(limits[s] * max(instance.stages[s].samples) * instance.stages[s].stash for s in held)

        while worst() > room:
            deepest = max((s for s in held if limits[s] > floor[s]), key=lambda s: (limits[s], -s), default=None)
            if deepest is None:
                break
            limits[deepest] -= 1
    return tuple(limits)


EFFORTS = ("fast", "full")
"""Rule sets of :func:`list_rules`."""


def list_rules(instance: ScheduleInstance, split_backward: bool = True, effort: str = "fast") -> list[ListRule]:
    """The rules :func:`synthesize` tries: preferences x ``W`` placement x warm-up depths.

    Depths are :func:`warmup_limits` with ``extra`` of 0, +1, -1 (and +2 under
    ``"full"``), and the deepest the memory allows (each stage's limit its microbatch
    count, clipped by memory); equal limits are tried once.

    ``"full"`` tries every combination: backward or forward first, oldest or
    longest-tail first, ``W`` to fill, to fit or eager (60 rules at most).
    ``"fast"`` keeps the 20 that, over the 78 instances of ``python -m
    pipeplan.experiments.bench_synthesis --rules`` (random unequal partitions of 2-4
    groups, a quarter of them under tight caps, and the six shapes of issue 36 in three
    placements), reached the best time of the full set on every one: oldest first
    with ``W`` to fill or to fit at every depth, and longest-tail first with ``W`` to
    fill at the cost-derived and the deepest depths.

    Raises
    ------
    ValueError
        For an ``effort`` not in :data:`EFFORTS`.
    """
    if effort not in EFFORTS:
        raise ValueError(f"effort must be one of {', '.join(EFFORTS)}, got {effort!r}")
    full = effort == "full"
    floor = minimal_limits(instance, split_backward)
    depths: dict[tuple[int, ...], str] = {}
    for extra in (0, 1, -1, 2) if full else (0, 1, -1):
        depths.setdefault(warmup_limits(instance, split_backward, extra, floor), f"depth{extra:+d}")
    depths.setdefault(_memory_clip(instance, [st.count for st in instance.stages], floor), "depth-max")
    weights_all = ("fill", "fit", "eager") if split_backward else ("eager",)
    rules = []
    for limits, depth in depths.items():
        for backward_first in (True, False):
            for oldest in (True, False):
                if full:
                    kinds = weights_all
                elif oldest:
                    kinds = weights_all[:2]
                elif depth in ("depth+0", "depth-max"):
                    kinds = weights_all[:1]
                else:
                    continue
                for weights in kinds:
                    name = (f"{'backward' if backward_first else 'forward'}-first {'oldest' if oldest else 'tail'} "
                            f"W-{weights} {depth}")
                    rules.append(ListRule(name, backward_first, oldest, weights, limits))
    return rules


# --------------------------------------------------------------------- the synthesizer
@dataclass(frozen=True)
class Candidate:
    """One program tried by :func:`synthesize`."""

    source: str
    """Where it comes from: ``"list: <rule>"``, ``"fixed: <schedule>"`` or ``"sequential"``."""
    iteration_time: float | None
    """Its iteration time; ``None`` if it stalled or deadlocked."""
    fits: bool
    """Whether every group's peak is within its cap."""


@dataclass(frozen=True)
class Synthesis:
    """The programs :func:`synthesize` chose for one partition."""

    programs: Programs
    """One program per group."""
    timeline: Timeline
    """Their time and memory (:func:`evaluate`)."""
    source: str
    """Which candidate won (see :attr:`Candidate.source`)."""
    candidates: tuple[Candidate, ...] = field(repr=False)
    """Every candidate tried, in the order tried."""
    reason: str | None = None
    """Why no program fits the caps, when none does (``None`` otherwise)."""

    @property
    def iteration_time(self) -> float:
        return self.timeline.iteration_time

    @property
    def fits(self) -> bool:
        """Whether the programs respect every group's memory cap."""
        return self.timeline.fits


def synthesize(instance: ScheduleInstance, *, split_backward: bool = True, fixed: bool = True,
               rules: Sequence[ListRule] | None = None, effort: str = "fast") -> Synthesis:
    """The fastest programs among the list scheduler's rules, the fixed schedules' and the sequential ones.

    Every candidate is timed by :func:`evaluate` (the simulator's arithmetic); among
    those that respect every group's cap the fastest wins (ties: the first tried, so
    the result depends on the instance only).  The fixed schedules' programs for the
    same partition (:func:`fixed_programs`) are candidates as given and with their
    ``B`` split (:func:`split_backwards`), so the result is never slower than any of
    them that fits.

    Parameters
    ----------
    instance : ScheduleInstance
    split_backward : bool
        Let backwards be ``I`` then ``W`` (else every backward is a whole ``B``, and the
        zero-bubble schedules are not candidates).
    fixed : bool
        Try the fixed schedules' programs too.
    rules : sequence of ListRule, optional
        The list scheduler's rules; :func:`list_rules` of ``effort`` by default.
    effort : {"fast", "full"}
        Which of :func:`list_rules`' sets to try when ``rules`` is not given.

    Returns
    -------
    Synthesis
        The winner. When no candidate fits the caps, the one with the smallest
        excess, with :attr:`Synthesis.fits` false and :attr:`Synthesis.reason` saying
        by how much the memory-minimal program exceeds which group's cap (no program
        can then fit: it holds, on every group, what every program must hold at some
        point, when the stages split alike).
    """
    tried: list[Candidate] = []
    best: tuple | None = None  # (fits rank, time or excess, index, programs, timeline, source)
    seen: set[Programs] = set()

    def consider(source: str, programs: Programs | None) -> None:
        nonlocal best
        if programs is None:
            tried.append(Candidate(source, None, False))
            return
        if programs in seen:
            return
        seen.add(programs)
        try:
            timeline = evaluate(instance, programs)
        except ProgramDeadlock:
            tried.append(Candidate(source, None, False))
            return
        tried.append(Candidate(source, timeline.iteration_time, timeline.fits))
        key = (0, timeline.iteration_time) if timeline.fits else (1, timeline.excess)
        if best is None or key < best[0]:
            best = (key, programs, timeline, source)

    tails = _tails(instance, split_backward)
    for rule in (list_rules(instance, split_backward, effort) if rules is None else rules):
        consider(f"list: {rule.name}", list_schedule(instance, rule, split_backward, tails))
    if fixed:
        for name, programs in fixed_programs(instance).items():
            if not split_backward and any(a.kind != FORWARD and a.kind != FULL_BACKWARD for p in programs for a in p):
                continue  # a zero-bubble schedule splits its backwards
            consider(f"fixed: {name}", programs)
            if split_backward and any(a.kind == FULL_BACKWARD for p in programs for a in p):
                consider(f"fixed: {name}, B split", split_backwards(programs))
    sequential = sequential_programs(instance, split_backward)
    consider("sequential", sequential)
    assert best is not None
    _, programs, timeline, source = best
    reason = None
    if not timeline.fits:
        minimal = evaluate(instance, sequential)
        g = max(range(len(instance.groups)), key=lambda i: minimal.peak_memory[i] - minimal.caps[i])
        how = ("even one microbatch at a time" if instance.equal_splits
               else "even with as few microbatches in flight as the stages' splits allow")
        proof = ", so no program fits" if instance.equal_splits else ""
        reason = (f"group {g} needs {minimal.peak_memory[g]:.6g} bytes per device {how} (state "
                  f"{instance.groups[g].state:.6g}), above its cap {minimal.caps[g]:.6g}{proof}; raise the cap, "
                  f"recompute, or give the group fewer layers")
    return Synthesis(programs, timeline, source, tuple(tried), reason)
