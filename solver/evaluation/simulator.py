"""The exact simulator: what a plan costs (spec sections 4, 5 and 7; docs/model.md section 8).

Every plan is a set of device groups, each running its *program* of actions one at a
time (a version-1 plan is the case of one stage per group, its program the stage's op
list).  What one stage sends the next crosses a FIFO link between their groups (or is
handed over at once when both are on one group), and an action waits for the arrivals
of every sender microbatch whose samples overlap its own.  Since each resource (a
group, a link) serves its work in a fixed order, the timeline is the unique fixed
point of "start = latest of the resource being free and the inputs having arrived",
computed here by sweeping the groups and advancing each as far as its inputs allow.
If a sweep advances no group before all actions ran, the dependencies form a cycle: a
deadlock.

Three layers keep the sweep cheap:

* :class:`Wiring`: what waits for what, from the programs and the splits alone (no
  duration): every transfer is a *slot*, numbered once; every action names the slots
  it waits for and the slot it fills; every link between groups has an integer id.
  Plans of one structure share one wiring (:func:`plan_wiring` keeps them).
* :class:`PlanCosts`: the durations, per group (:class:`GroupCost`: every action's
  seconds in program order, the all-reduce, the step, the memory peak) and per stage
  (:class:`StageLinks`: every transfer's seconds).  :func:`plan_costs` computes them,
  and with a cache recomputes only the groups and stages a change touched.
* :func:`run_programs`: the sweep, recording every start, end and arrival in
  preallocated lists; the result (:class:`Simulation`) builds its events from them
  only when asked.  The wiring keeps the order the first sweep of its structure ran
  the actions in, and later plans of that structure run in that order with no check
  of what has arrived (:meth:`Wiring.compiled_runs`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate, chain
from typing import TYPE_CHECKING, Callable, Sequence

from pipeplan.models.errors import DeadlockError, InputError
from pipeplan.solver.evaluation.memory import (StageMemory, StashWalk, by_size, gather, group_peak_memory,
                                               training_state)
from pipeplan.solver.schedules.schedule import BACKWARD, FORWARD, INPUT, WEIGHT, Action, format_action, stage_actions

if TYPE_CHECKING:
    from pipeplan.models.graph import LayerGraph
    from pipeplan.solver.formats.cluster import Cluster
    from pipeplan.solver.formats.plan import Plan, Stage

__all__ = ["GroupCost", "OpEvent", "PlanCosts", "Simulation", "StageLinks", "SyncEvent", "TransferEvent", "Wiring",
           "check_deadlock_free", "one_stage_wiring", "plan_costs", "plan_wiring", "run_programs", "simulate"]


# ------------------------------------------------------------------------- events
@dataclass(frozen=True)
class OpEvent:
    """One action of a group's program, timed."""

    stage: int
    """Stage index."""
    kind: str
    """``"F"``, ``"B"``, ``"I"`` or ``"W"``."""
    microbatch: int
    """The stage's microbatch index."""
    samples: int
    """Samples per replica, ``ceil(n / r)``."""
    start: float
    """Start time in seconds from the iteration start."""
    end: float
    """End time in seconds."""
    recompute: float
    """Seconds of the action spent recomputing the forward (at its start); 0 if none."""
    group: int = 0
    """The device group that ran it."""

    @property
    def label(self) -> str:
        """The action as torch writes it: ``"2I3"``."""
        return f"{self.stage}{self.kind}{self.microbatch}"


@dataclass(frozen=True)
class TransferEvent:
    """One transfer across a cut, over the link between two groups."""

    cut: int
    """The cut after stage ``cut`` (between stages ``cut`` and ``cut + 1``)."""
    direction: str
    """``"fwd"`` (activations, ``cut -> cut+1``) or ``"bwd"`` (gradients, back)."""
    microbatch: int
    """The sending stage's microbatch index."""
    samples: int
    """Samples carried."""
    start: float
    """Start time in seconds."""
    end: float
    """Arrival time in seconds."""
    link: tuple[int, int] = (0, 0)
    """``(sender group, receiver group)``: the FIFO link it used."""

    @property
    def label(self) -> str:
        """``"A2:0"``: the activations of microbatch 0 from stage 2 (``"G2:0"``: its gradients)."""
        sender = self.cut if self.direction == "fwd" else self.cut + 1
        return f"{'A' if self.direction == 'fwd' else 'G'}{sender}:{self.microbatch}"


@dataclass(frozen=True)
class SyncEvent:
    """A group's all-reduce or optimizer step after its last action."""

    group: int
    """Group index."""
    kind: str
    """``"allreduce"`` or ``"step"``."""
    start: float
    """Start, seconds."""
    end: float
    """End, seconds."""


# ------------------------------------------------------------------------- the wiring
NO_WAIT, SEVERAL = -1, -2
"""Codes of :attr:`Wiring.waits` besides a slot number: the action waits for nothing; for several slots."""

CompiledRun = tuple[int, tuple[tuple[int, int, int, int], ...]]
"""``(group, actions)``: consecutive actions of one group, each ``(position, wait, send, before)``
(:meth:`Wiring.compiled_runs`)."""


def overlaps(mine: Sequence[int], theirs: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """For each of my microbatches, the inclusive range of theirs sharing a sample.

    Examples
    --------
    >>> overlaps((2, 2), (1, 3))
    ((0, 1), (1, 1))
    """
    if mine == theirs:
        return tuple((k, k) for k in range(len(mine)))
    their_ends = list(accumulate(theirs))
    ranges, start = [], 0
    for end in accumulate(mine):
        ranges.append((bisect_right(their_ends, start), bisect_left(their_ends, end)))
        start = end
    return tuple(ranges)


class Wiring:
    """What waits for what in a set of programs: the dataflow, without any duration.

    A *slot* is one transfer: the forward output of microbatch ``k`` of stage ``s <
    S-1`` (slot ``fwd_base[s] + k``) or the backward output of microbatch ``k`` of stage
    ``s > 0`` (slot ``bwd_base[s] + k``).  It arrives over the link between the two
    stages' groups (:attr:`slot_link`, an integer id into :attr:`links`), or at once
    when both stages are on one group (id ``-1``).

    Parameters
    ----------
    programs : sequence of sequences of Action
        Every group's program, in group order (checked already).
    stage_groups : sequence of int
        The group of each stage.
    sizes : sequence of sequences of int
        Each stage's microbatch sizes.
    by_stage : bool
        Whether the plan writes its programs as per-stage op lists (deadlocks are then
        reported at ``stages[s].ops[i]``, else at ``programs[g][i]``).
    """

    def __init__(self, programs: Sequence[Sequence[Action]], stage_groups: Sequence[int],
                 sizes: Sequence[Sequence[int]], by_stage: bool = False) -> None:
        self.programs: tuple[tuple[Action, ...], ...] = tuple(tuple(p) for p in programs)
        """Every group's actions in program order."""
        self.stage_groups: tuple[int, ...] = tuple(stage_groups)
        """The group of each stage."""
        self.sizes: tuple[tuple[int, ...], ...] = tuple(tuple(n) for n in sizes)
        """Each stage's microbatch sizes."""
        self.by_stage = by_stage
        """Whether the programs are per-stage op lists (where deadlocks are reported)."""
        count, last = len(self.sizes), len(self.sizes) - 1
        self.held: tuple[tuple[int, ...], ...] = tuple(
            tuple(s for s, g in enumerate(self.stage_groups) if g == group) for group in range(len(self.programs)))
        """The stages of each group, in stage order."""
        self.fwd_base, self.bwd_base, slots = [], [], 0
        for s in range(count):
            self.fwd_base.append(slots)
            slots += len(self.sizes[s]) if s < last else 0
        for s in range(count):
            self.bwd_base.append(slots)
            slots += len(self.sizes[s]) if s > 0 else 0
        self.slots: int = slots
        """Number of slots (transfers and local hand-overs)."""
        self._link_slots()
        self._action_slots()

    def _link_slots(self) -> None:
        ids: dict[tuple[int, int], int] = {}
        self.slot_link: list[int] = [NO_WAIT] * self.slots
        """The link id of each slot, ``-1`` for a hand-over on one group."""
        self.slot_meta: list[tuple[int, str, int, int]] = [(0, "", 0, 0)] * self.slots
        """``(cut, direction, microbatch, sending stage)`` of each slot."""
        groups, last = self.stage_groups, len(self.sizes) - 1
        for s in range(last + 1):
            for direction, other, base in (("fwd", s + 1, self.fwd_base[s]), ("bwd", s - 1, self.bwd_base[s])):
                if not 0 <= other <= last:
                    continue
                pair = (groups[s], groups[other])
                link = NO_WAIT if pair[0] == pair[1] else ids.setdefault(pair, len(ids))
                cut = s if direction == "fwd" else s - 1
                for k in range(len(self.sizes[s])):
                    self.slot_link[base + k] = link
                    self.slot_meta[base + k] = (cut, direction, k, s)
        self.links: tuple[tuple[int, int], ...] = tuple(ids)
        """``(sender group, receiver group)`` of every link, by id."""

    def _action_slots(self) -> None:
        sizes, last = self.sizes, len(self.sizes) - 1
        wait_f = [overlaps(sizes[s], sizes[s - 1]) if s > 0 else () for s in range(last + 1)]
        wait_b = [overlaps(sizes[s], sizes[s + 1]) if s < last else () for s in range(last + 1)]
        self.waits: list[list[int]] = []
        """Per group, per action: the slot it waits for, ``-1`` for none, ``-2`` for several (:attr:`several`)."""
        self.several: list[dict[int, tuple[int, ...]]] = []
        """Per group: the slots of each action that waits for several."""
        self.sends: list[list[int]] = []
        """Per group, per action: the slot it fills, or ``-1``."""
        for program in self.programs:
            waits, several, sends = [], {}, []
            for p, (s, kind, k) in enumerate(program):
                if kind == FORWARD:
                    span = (self.fwd_base[s - 1], wait_f[s][k]) if s > 0 else None
                    sends.append(self.fwd_base[s] + k if s < last else NO_WAIT)
                elif kind == WEIGHT:
                    span = None
                    sends.append(NO_WAIT)
                else:
                    span = (self.bwd_base[s + 1], wait_b[s][k]) if s < last else None
                    sends.append(self.bwd_base[s] + k if s > 0 else NO_WAIT)
                if span is None:
                    waits.append(NO_WAIT)
                    continue
                base, (lo, hi) = span
                if lo == hi:
                    waits.append(base + lo)
                else:
                    waits.append(SEVERAL)
                    several[p] = tuple(range(base + lo, base + hi + 1))
            self.waits.append(waits)
            self.several.append(several)
            self.sends.append(sends)
        self.lengths: list[int] = [len(p) for p in self.programs]
        """Actions per group."""
        self._recorded: list[tuple[int, int, int]] | None = None  # the first sweep's order (record_order)
        self._runs: tuple[CompiledRun, ...] | None = None  # compiled from it (compiled_runs)

    @cached_property
    def layouts(self) -> tuple["GroupLayout", ...]:
        """Per group, where each action's duration and samples sit in its stages' tables (:func:`plan_costs`)."""
        out = []
        for program, held in zip(self.programs, self.held):
            weighted = {s for s, kind, _ in program if kind == WEIGHT}
            split = tuple(s in weighted for s in held)
            duration_at, sample_at, d, q = {}, {}, 0, 0
            for s in held:
                duration_at[s], sample_at[s] = d, q
                d += (4 if s in weighted else 2) * len(self.sizes[s])
                q += len(self.sizes[s])
            durations = [duration_at[s] + _KIND_ROW[kind] * len(self.sizes[s]) + k for s, kind, k in program]
            samples = [sample_at[s] + k for s, _, k in program]
            out.append(GroupLayout(held, split, gather(durations), gather(samples), StashWalk(program)))
        return tuple(out)

    def wait_slots(self, group: int, position: int) -> tuple[int, ...]:
        """The slots the action at ``position`` of ``group``'s program waits for."""
        w = self.waits[group][position]
        return () if w == NO_WAIT else self.several[group][position] if w == SEVERAL else (w,)

    @cached_property
    def order(self) -> tuple[tuple[int, int], ...]:
        """Every action as ``(group, position)`` in an order that puts each after what it waits for.

        The sweep of :func:`run_programs` with every duration 0: whatever the durations,
        this order computes every start after its inputs (batched timelines use it).

        Raises
        ------
        DeadlockError
            If the dependencies form a cycle.
        """
        return tuple(self.sweep_order("-"))

    def record_order(self, runs: list[tuple[int, int, int]]) -> None:
        """Keep the order a sweep ran every action in, as runs ``(group, first, stop)`` of program positions."""
        if self._runs is None:
            self._recorded = runs

    def compiled_runs(self) -> tuple[CompiledRun, ...] | None:
        """The recorded order (:meth:`record_order`) compiled for :func:`run_programs`; ``None`` before one is kept.

        Each run is ``(group, actions)``, each action ``(position, wait, send, before)``:
        its program position, :attr:`waits` entry, :attr:`sends` entry and, for a
        transfer over a link, the slot sent over that link just before it (:attr:`slots`
        for the link's first, whose link is free from 0), else ``-1``.  Timing the
        actions in this order needs no check of what has arrived, and any order that
        puts each action after what it waits for gives the same floating-point numbers:
        each start is the same maximum, each end the same sum, and each link carries one
        sender group's transfers in that group's program order.
        """
        if self._runs is None and self._recorded is not None:
            self._runs = self._compile(self._recorded)
            self._recorded = None
            _WIRED[0] += sum(self.lengths)  # the cache's budget counts the compiled actions too
        return self._runs

    def _compile(self, runs: list[tuple[int, int, int]]) -> tuple[CompiledRun, ...]:
        before, last_on = [NO_WAIT] * self.slots, [self.slots] * len(self.links)
        for g, first, stop in runs:  # each link's transfers in the order its (one) sender group sends them
            for o in self.sends[g][first:stop]:
                if o >= 0 and self.slot_link[o] >= 0:
                    link = self.slot_link[o]
                    before[o], last_on[link] = last_on[link], o
        out = []
        for g, first, stop in runs:
            waits, sends = self.waits[g], self.sends[g]
            out.append((g, tuple((p, waits[p], sends[p], before[sends[p]] if sends[p] >= 0 else NO_WAIT)
                                 for p in range(first, stop))))
        return tuple(out)

    def sweep_order(self, file: str = "-") -> list[tuple[int, int]]:
        """:attr:`order`, reporting a deadlock against ``file``."""
        known: list[float | None] = [None] * self.slots
        ptr = [0] * len(self.programs)
        order: list[tuple[int, int]] = []
        remaining = sum(self.lengths)
        while remaining:
            progressed = 0
            for g, (waits, sends, length) in enumerate(zip(self.waits, self.sends, self.lengths)):
                p = first = ptr[g]
                while p < length:
                    w = waits[p]
                    if w >= 0 and known[w] is None:
                        break
                    if w == SEVERAL and any(known[o] is None for o in self.several[g][p]):
                        break
                    if sends[p] >= 0:
                        known[sends[p]] = 0.0
                    order.append((g, p))
                    p += 1
                progressed += p - first
                ptr[g] = p
            if not progressed:
                raise self.deadlock(ptr, known, file)
            remaining -= progressed
        return order

    def deadlock(self, ptr: Sequence[int], arrival: Sequence[float | None], file: str) -> DeadlockError:
        """The error of a sweep stuck at ``ptr``: the chain of waits from the first stuck group until it closes."""
        g = next(i for i, p in enumerate(self.programs) if ptr[i] < len(p))
        start, chain_, visited = g, [], set()
        while g not in visited:
            visited.add(g)
            s, kind, k = self.programs[g][ptr[g]]
            missing = next(o for o in self.wait_slots(g, ptr[g]) if arrival[o] is None)
            _, _, j, sender = self.slot_meta[missing]
            h = self.stage_groups[sender]
            stuck = self.programs[h][ptr[h]] if ptr[h] < len(self.programs[h]) else None
            what = "activations" if kind == FORWARD else "gradients"
            if self.by_stage:
                made = FORWARD if kind == FORWARD else self._backward_kind(sender, j)
                chain_.append(f"stage {s} op {kind}{k} waits for the {what} of microbatch {j} of stage {sender}, "
                              f"whose {made}{j} has not run (stage {sender} is stuck at its op "
                              f"{'end' if stuck is None else f'{stuck.kind}{stuck.microbatch}'})")
            else:
                made = "F" if kind == FORWARD else "B or I"
                chain_.append(f"group {g} action {format_action(Action(s, kind, k))} waits for the {what} of "
                              f"microbatch {j} of stage {sender}, whose {made} has not run (group {h} is stuck at "
                              f"{'its end' if stuck is None else format_action(stuck)})")
            g = h
        where = (f"stages[{self.programs[start][0].stage}].ops[{ptr[start]}]" if self.by_stage
                 else f"programs[{start}][{ptr[start]}]")
        return DeadlockError(file, where, "deadlock: " + "; ".join(chain_))

    def _backward_kind(self, stage: int, k: int) -> str:
        """``"I"`` if the stage splits microbatch ``k``'s backward, else ``"B"``."""
        program = self.programs[self.stage_groups[stage]]
        return INPUT if Action(stage, INPUT, k) in program else BACKWARD


_KIND_ROW = {FORWARD: 0, BACKWARD: 1, INPUT: 2, WEIGHT: 3}
"""Where each kind's durations sit in a stage's table: forwards, backwards, then (a stage that splits its
backwards only) input-gradient halves and weight halves."""


@dataclass(frozen=True)
class GroupLayout:
    """How a group's per-action numbers are gathered from its stages' per-microbatch tables."""

    held: tuple[int, ...]
    """The group's stages, in stage order."""
    split: tuple[bool, ...]
    """Whether each of them splits a backward (``I`` and ``W``)."""
    durations: Callable
    """Gathers every action's entry, in program order, from the stages' tables (``F``, ``B``, ``I``, ``W`` each)."""
    samples: Callable
    """Gathers every action's entry from the stages' per-microbatch lists."""
    walk: StashWalk
    """The program's memory walk."""


WIRING_CACHE_ACTIONS = 2_000_000
"""Actions the wirings :func:`plan_wiring` keeps may hold in all before the cache is cleared; a wiring whose
order is compiled (:meth:`Wiring.compiled_runs`) counts its actions twice.  A wiring with its layouts takes about
150 bytes an action and a compiled order about 100 more (tracemalloc, bench_simulator's 8 x 64 1F1B plan): some
300 MB in all."""

_WIRINGS: dict[tuple, Wiring] = {}
_WIRED = [0]  # actions held by _WIRINGS


def plan_wiring(plan: "Plan", file: str = "-") -> Wiring:
    """The :class:`Wiring` of a plan's programs and splits; plans of one structure share it.

    Raises
    ------
    InputError
        If the plan's programs (or per-stage ops) break a rule of the spec.
    """
    stage_groups = tuple(plan.stage_groups)
    sizes = tuple(tuple(st.microbatches) for st in plan.stages)
    by_stage = plan.programs_by_stage
    ops = (tuple(None if st.ops is None else tuple(st.ops) for st in plan.stages)
           if by_stage and plan.schedule_class.from_plan else None)
    programs = None if plan.custom_programs is None else tuple(tuple(p) for p in plan.custom_programs)
    key = (plan.schedule, programs, ops, stage_groups, sizes)
    found = _WIRINGS.get(key)
    if found is None:
        found = _keep(key, Wiring(plan.actions(file), stage_groups, sizes, by_stage))
    return found


def one_stage_wiring(schedule: str, splits: Sequence[tuple[int, ...]]) -> Wiring:
    """The wiring of ``gpipe`` or ``1f1b`` on stages with these splits, each on a group of its own.

    The one :func:`plan_wiring` gives such plans (and keeps).
    """
    stage_groups, sizes = tuple(range(len(splits))), tuple(splits)
    key = (schedule, None, None, stage_groups, sizes)
    found = _WIRINGS.get(key)
    if found is None:
        programs = [stage_actions(schedule, len(split), s, len(splits)) for s, split in enumerate(splits)]
        found = _keep(key, Wiring(programs, stage_groups, sizes, by_stage=True))
    return found


def _keep(key: tuple, wiring: Wiring) -> Wiring:
    if _WIRED[0] > WIRING_CACHE_ACTIONS:
        _WIRINGS.clear()
        _WIRED[0] = 0
    _WIRINGS[key] = wiring
    _WIRED[0] += sum(wiring.lengths)
    return wiring


# ------------------------------------------------------------------------- costs
@dataclass(frozen=True)
class GroupCost:
    """Everything the timing of one device group needs, precomputed from plan, graph and cluster."""

    devices: tuple[str, ...]
    """The group's devices (as the first stage on it lists them)."""
    stages: tuple[int, ...]
    """The stages it holds, in stage order."""
    program: tuple[Action, ...]
    """Its actions in program order."""
    durations: tuple[float, ...]
    """Seconds of each action (``TF``, ``TB``, ``TI`` or ``TW``, recompute included)."""
    recompute: tuple[float, ...]
    """Recompute part of each action's duration (0 if none)."""
    samples: tuple[int, ...]
    """Samples per replica, ``ceil(n / r_g)``, of each action's microbatch."""
    allreduce: float
    """``AR_g``."""
    step: float
    """``STEP_g``."""
    peak_memory: float
    """Peak bytes per device of the group."""
    capacity: float
    """Smallest memory among its devices."""


@dataclass(frozen=True)
class StageLinks:
    """How long each of one stage's outgoing transfers takes."""

    send_fwd: tuple[float, ...]
    """Seconds of each microbatch's forward transfer to the next stage (0 for a hand-over on one group; empty on the last)."""
    send_bwd: tuple[float, ...]
    """Seconds of each microbatch's backward transfer to the previous stage (0 if on one group; empty on the first)."""
    sizes: tuple[int, ...]
    """``n_k``: the samples of each microbatch (what a transfer carries)."""


@dataclass(frozen=True, eq=False)
class PlanCosts:
    """What the timeline of one plan needs: its wiring, and every duration."""

    wiring: Wiring
    """What waits for what."""
    groups: tuple[GroupCost, ...]
    """Per group, in group order."""
    links: tuple[StageLinks, ...]
    """Per stage, in stage order."""
    global_batch: int
    """Samples per iteration."""

    @cached_property
    def send_times(self) -> list[float]:
        """Seconds of every slot's transfer, by slot (:class:`Wiring`)."""
        last = len(self.links) - 1
        return list(chain(*(lk.send_fwd for lk in self.links[:last]), *(lk.send_bwd for lk in self.links[1:])))


COST_CACHE_SIZE = 20_000
"""Group and stage costs a cache given to :func:`plan_costs` holds before it is cleared (tens of MB)."""


def plan_costs(plan: "Plan", graph: "LayerGraph", cluster: "Cluster", cache: dict | None = None,
               file: str = "-") -> PlanCosts:
    """Per-group durations, all-reduce, step and memory, and per-stage transfer times, of a validated plan.

    ``cache`` (a dict the caller keeps for one graph and cluster) remembers each group's
    cost under everything it depends on (the wiring, the group's position, its stages'
    layers, devices and recompute flags, the state factor) and each stage's transfer
    times under theirs (its layers, devices and split, its neighbours' devices).
    Heuristics that move one boundary at a time then recompute two groups, not all.

    Raises
    ------
    InputError
        If the plan's programs break a rule of the spec.
    """
    wiring = plan_wiring(plan, file)
    stages = plan.stages
    layouts = wiring.layouts
    if cache is None:
        groups = tuple(_group_cost(plan, graph, cluster, wiring.programs[g], layouts[g])
                       for g in range(len(layouts)))
        links = tuple(_stage_links(plan, graph, cluster, s) for s in range(len(stages)))
        return PlanCosts(wiring, groups, links, plan.global_batch)
    if len(cache) >= COST_CACHE_SIZE:
        cache.clear()
    group_list = []
    for g, held in enumerate(wiring.held):
        key = (wiring, g, plan.state_factor, plan.state, plan.zero,
               tuple((stages[s].layers, stages[s].devices, stages[s].recompute, stages[s].tensor_parallel,
                      stages[s].zero) for s in held))
        found = cache.get(key)
        if found is None:
            found = cache[key] = _group_cost(plan, graph, cluster, wiring.programs[g], layouts[g])
        group_list.append(found)
    link_list, last = [], len(stages) - 1
    for s, st in enumerate(stages):
        key = (st.layers, st.devices, st.microbatches, stages[s - 1].devices if s else None,
               stages[s + 1].devices if s < last else None,
               tuple(stages[i].tensor_parallel for i in range(max(0, s - 1), min(last, s + 1) + 1)))
        found = cache.get(key)
        if found is None:
            found = cache[key] = _stage_links(plan, graph, cluster, s)
        link_list.append(found)
    return PlanCosts(wiring, tuple(group_list), tuple(link_list), plan.global_batch)


def _ceil_div(n: int, r: int) -> int:
    return -(-n // r)


def _send_times(sender: "Stage", receiver: "Stage", cut_bytes: float, cluster: "Cluster") -> tuple[float, ...]:
    """Seconds each of ``sender``'s microbatches takes across the cut to ``receiver``."""
    lat = cluster.lat(sender.devices, receiver.devices)
    rate = min(sender.replicas, receiver.replicas) * cluster.bw(sender.devices, receiver.devices)
    return by_size({n: (lat + n * cut_bytes / rate,) for n in set(sender.microbatches)}, sender.microbatches)[0]


def _stage_links(plan: "Plan", graph: "LayerGraph", cluster: "Cluster", s: int) -> StageLinks:
    stages = plan.stages
    st, last = stages[s], len(stages) - 1
    lo, hi = st.layers
    mine = frozenset(st.devices)
    send_fwd: tuple[float, ...] = ()
    send_bwd: tuple[float, ...] = ()
    if s < last:
        if frozenset(stages[s + 1].devices) == mine:
            send_fwd = (0.0,) * len(st.microbatches)
        else:
            send_fwd = _send_times(st, stages[s + 1], graph.cut_bytes(hi - 1), cluster)
    if s > 0:
        if frozenset(stages[s - 1].devices) == mine:
            send_bwd = (0.0,) * len(st.microbatches)
        else:
            send_bwd = _send_times(st, stages[s - 1], graph.cut_bytes(lo - 1), cluster)
    return StageLinks(send_fwd, send_bwd, st.microbatches)


def _group_cost(plan: "Plan", graph: "LayerGraph", cluster: "Cluster", program: tuple[Action, ...],
                layout: GroupLayout) -> GroupCost:
    """A group's cost: each action's duration (spec 7.3), the all-reduce, the step and the memory peak (7.4)."""
    stages, held = plan.stages, layout.held
    if stages[held[0]].tensor_parallel > 1 or any(plan.stage_zero(s) for s in held):
        return _sharded_group_cost(plan, graph, cluster, program, layout)
    devices = stages[held[0]].devices
    r = len(devices)
    found = [cluster.device_index[d] for d in devices]
    speed = min(d.speed for d in found)
    durations: list[float] = []
    recompute: list[float] = []  # filled only if a stage recomputes: else every entry is 0.0
    recomputes = any(stages[s].recompute for s in held)
    samples: list[int] = []
    memory = {}
    for s, split in zip(held, layout.split):
        st = stages[s]
        lo, hi = st.layers
        af, bf, ab, bb = graph.range_time(lo, hi)
        aw, bw = graph.range_weight_time(lo, hi) if split else (0.0, 0.0)  # unused unless split
        rows = {}
        for n in set(st.microbatches):
            q = -(-n // r)
            f = (af + bf * q) / speed
            x = f if st.recompute else 0.0
            b = (ab + bb * q) / speed + x
            rows[n] = q, f, b, ((ab - aw) + (bb - bw) * q) / speed + x, (aw + bw * q) / speed
        q, fwd, bwd, inp, wgt = by_size(rows, st.microbatches)
        durations += fwd
        durations += bwd
        if split:
            durations += inp
            durations += wgt
        if recomputes:
            _recompute_rows(recompute, fwd if st.recompute else (0.0,) * len(q), split)
        samples += q
        memory[s] = StageMemory.of(q, graph.range_sum("act", lo, hi), graph.stage_input_bytes(lo),
                                   graph.range_act_weight(lo, hi) if split else 0.0, st.recompute)
    params = sum(graph.range_sum("params", *stages[s].layers) for s in held)
    step = sum(graph.range_step(*stages[s].layers) for s in held) / speed
    peak = group_peak_memory(plan.state_factor, params, layout.walk, memory)
    return GroupCost(tuple(devices), held, program, layout.durations(durations),
                     layout.durations(recompute) if recomputes else (0.0,) * len(program),
                     layout.samples(samples), _allreduce(cluster, devices, params), step, peak,
                     min(d.memory for d in found))


def _recompute_rows(table: list[float], rec: tuple[float, ...], split: bool) -> None:
    """Append a stage's recompute seconds in the rows of its durations: none in ``F``, ``rec`` in ``B`` (and
    ``I``), none in ``W``."""
    table += (0.0,) * len(rec)
    table += rec
    if split:
        table += rec
        table += (0.0,) * len(rec)


def _allreduce(cluster: "Cluster", devices: tuple[str, ...], params: float, replicas: int | None = None) -> float:
    """``AR = 2*(r-1) * (lat(D) + P / (r * bw(D)))`` of a ring over ``r`` replicas (default: every device); 0 for one.

    With tensor parallelism each device holds ``P`` (its share) and synchronises with its
    rank in the other replicas: ``t`` such rings side by side (docs/model.md 8.3).  Under
    ZeRO 1 or 2 the reduce-scatter and the all-gather together cost the same.
    """
    r = len(devices) if replicas is None else replicas
    if r < 2:
        return 0.0
    return 2 * (r - 1) * (cluster.lat(devices) + params / (r * cluster.bw(devices)))


def _sharded_group_cost(plan: "Plan", graph: "LayerGraph", cluster: "Cluster", program: tuple[Action, ...],
                        layout: GroupLayout) -> GroupCost:
    """A group's cost under tensor parallelism or ZeRO (docs/model.md 8.3 and 8.4).

    Each layer's time, parameters and activations are scaled by its factors before they
    are summed; each action adds its layers' collectives (not overlapped); the state is
    split into weights, gradients and optimizer state, sharded by the ZeRO level.
    """
    stages, held = plan.stages, layout.held
    first = stages[held[0]]
    devices, t = first.devices, first.tensor_parallel
    r = len(devices) // t
    found = [cluster.device_index[d] for d in devices]
    speed = min(d.speed for d in found)
    if t > 1:
        replicas = first.replica_devices
        lat_t = max(cluster.lat(rep) for rep in replicas)
        bw_t = min(cluster.bw(rep) for rep in replicas)

    def collective(calls: int, nbytes: float) -> float:  # calls ring all-reduces moving nbytes in all (8.3)
        return 2 * (t - 1) * (calls * lat_t + nbytes / (t * bw_t)) if t > 1 and nbytes > 0 else 0.0

    split_state = plan.state_split
    durations: list[float] = []
    recompute: list[float] = []
    samples: list[int] = []
    memory = {}
    params = step = state = 0.0
    for s, split in zip(held, layout.split):
        st = stages[s]
        lo, hi = st.layers
        tp = graph.tensor_parallel_sums(lo, hi, t)
        q = tuple(-(-n // r) for n in st.microbatches)
        zeros = (0.0,) * len(q)
        fwd = tuple((tp.af + tp.bf * n) / speed + collective(tp.fwd_calls, n * tp.fwd_bytes) for n in q)
        rec = fwd if st.recompute else zeros
        back = tuple(collective(tp.bwd_calls, n * tp.bwd_bytes) for n in q)
        bwd = tuple((tp.ab + tp.bb * n) / speed + c + x for n, c, x in zip(q, back, rec))
        durations += fwd + bwd
        if split:
            durations += tuple(((tp.ab - tp.aw) + (tp.bb - tp.bw) * n) / speed + c + x
                               for n, c, x in zip(q, back, rec))
            durations += tuple((tp.aw + tp.bw * n) / speed for n in q)
        _recompute_rows(recompute, rec, split)
        samples += q
        memory[s] = StageMemory.of(q, tp.act, graph.stage_input_bytes(lo), tp.act_w if split else 0.0, st.recompute)
        zero = plan.stage_zero(s)
        params += tp.params
        step += tp.step / (r if zero else 1)
        state += training_state(tp.params, plan.state_factor, split_state, zero, r)
    peak = state + layout.walk.peak(memory)
    return GroupCost(tuple(devices), held, program, layout.durations(durations), layout.durations(recompute),
                     layout.samples(samples), _allreduce(cluster, devices, params, r), step / speed, peak,
                     min(d.memory for d in found))


# ------------------------------------------------------------------------- the result
@dataclass(frozen=True, eq=False)
class Simulation:
    """What a plan costs: time, throughput, memory, and the timeline its events are built from.

    Everything is per device group, the unit that runs one action at a time, holds
    memory and synchronises (in a plan of one stage per group, a group is its stage).
    """

    iteration_time: float
    """``T``: seconds per iteration."""
    costs: PlanCosts
    """The durations the timeline was computed from."""
    starts: tuple[list[float], ...]
    """Per group, the start of each action in program order."""
    ends: tuple[list[float], ...]
    """Per group, the end of each action in program order."""
    transfer_starts: list[float]
    """Per slot (:class:`Wiring`), when its transfer started (unused for a hand-over on one group)."""
    arrivals: list[float]
    """Per slot, when what it carries arrived."""

    @property
    def global_batch(self) -> int:
        """Samples per iteration."""
        return self.costs.global_batch

    @property
    def groups(self) -> tuple[GroupCost, ...]:
        """Per-group costs."""
        return self.costs.groups

    @property
    def throughput(self) -> float:
        """Samples per second."""
        return self.global_batch / self.iteration_time if self.iteration_time > 0 else float("inf")

    @property
    def peak_memory(self) -> tuple[float, ...]:
        """Peak bytes per device, one per group."""
        return tuple(g.peak_memory for g in self.groups)

    @property
    def memory_capacity(self) -> tuple[float, ...]:
        """The smallest device memory of each group."""
        return tuple(g.capacity for g in self.groups)

    @property
    def fits(self) -> bool:
        """Whether every group's peak fits in each of its devices."""
        return all(g.peak_memory <= g.capacity for g in self.groups)

    @cached_property
    def busy(self) -> tuple[float, ...]:
        """Seconds each group spends running actions."""
        return tuple(sum(g.durations) for g in self.groups)

    @property
    def group_end(self) -> tuple[float, ...]:
        """When each group is done: its last action's end plus ``AR_g`` and ``STEP_g``."""
        return tuple(ends[-1] + g.allreduce + g.step for g, ends in zip(self.groups, self.ends))

    @property
    def stage_end(self) -> tuple[float, ...]:
        """When each stage is done: its group's end (its gradients are synchronised and stepped with the group's)."""
        ends = self.group_end
        return tuple(ends[g] for g in self.costs.wiring.stage_groups)

    @property
    def bubble_fraction(self) -> float:
        """Share of group-time spent idle: ``1 - sum(busy) / (groups * T)``."""
        if self.iteration_time <= 0:
            return 0.0
        # each busy / T is at most 1: G * T or the busy sum may overflow where this does not
        return 1.0 - sum(busy / self.iteration_time for busy in self.busy) / len(self.groups)

    @cached_property
    def action_times(self) -> tuple[tuple[tuple[float, float], ...], ...]:
        """``(start, end)`` of each group's actions, in program order."""
        return tuple(tuple(zip(starts, ends)) for starts, ends in zip(self.starts, self.ends))

    @cached_property
    def ops(self) -> tuple[OpEvent, ...]:
        """Every action, group by group, in program order."""
        return tuple(OpEvent(s, kind, k, q, start, end, rec, gi)
                     for gi, (g, starts, ends) in enumerate(zip(self.groups, self.starts, self.ends))
                     for (s, kind, k), q, rec, start, end in zip(g.program, g.samples, g.recompute, starts, ends))

    @cached_property
    def transfers(self) -> tuple[TransferEvent, ...]:
        """Every transfer over a link between groups: cut by cut, forward first, by microbatch."""
        wiring = self.costs.wiring
        events = []
        for slot, (link, (cut, direction, k, sender)) in enumerate(zip(wiring.slot_link, wiring.slot_meta)):
            if link >= 0:
                events.append(TransferEvent(cut, direction, k, wiring.sizes[sender][k], self.transfer_starts[slot],
                                            self.arrivals[slot], wiring.links[link]))
        return tuple(events)

    @cached_property
    def syncs(self) -> tuple[SyncEvent, ...]:
        """Each group's all-reduce and then optimizer step, where they take time."""
        events = []
        for gi, (g, ends) in enumerate(zip(self.groups, self.ends)):
            end = ends[-1]
            if g.allreduce > 0:
                events.append(SyncEvent(gi, "allreduce", end, end + g.allreduce))
            if g.step > 0:
                events.append(SyncEvent(gi, "step", end + g.allreduce, end + g.allreduce + g.step))
        return tuple(events)

    def check_finite(self, file: str = "-") -> None:
        """Refuse a result whose time or memory overflowed floating point (before it is reported).

        Every number :meth:`summary` reports is then finite: the busy times, ends and
        all-reduces are at most the iteration time, and :attr:`bubble_fraction` is
        computed as a mean of ratios at most 1.

        Raises
        ------
        InputError
            When the iteration time or a peak memory is not finite, or the iteration
            time is so short that the throughput ``B / T`` is not.
        """
        if not math.isfinite(self.iteration_time):
            raise InputError(file, "plan", f"its simulated iteration time is {self.iteration_time}: a duration "
                                           "overflows floating point (a device speed or link bandwidth near 0, or "
                                           "a cost near 1e308 in the graph)")
        if not math.isfinite(self.throughput) and self.iteration_time > 0:
            raise InputError(file, "plan", f"its simulated iteration time is {self.iteration_time:g} s, so short "
                                           f"that the throughput {self.global_batch} / {self.iteration_time:g} "
                                           f"overflows floating point (a cost near 1e-308 in the graph, or a speed "
                                           f"near 1e308 in the cluster); use realistic costs and speeds")
        for i, (group, peak) in enumerate(zip(self.groups, self.peak_memory)):
            if not math.isfinite(peak):
                whose = "its" if len(group.stages) == 1 else f"group {i}'s"
                raise InputError(file, f"stages[{group.stages[0]}]", f"{whose} peak memory is {peak}: the graph's "
                                                                     f"bytes overflow floating point at this batch")

    def summary(self) -> dict:
        """The JSON object ``pipeplan simulate --json`` prints (lists per group; ``stage_end`` per stage)."""
        return {
            "iteration_time": self.iteration_time,
            "throughput": self.throughput if self.iteration_time > 0 else None,  # JSON has no infinity
            "peak_memory": list(self.peak_memory),
            "memory_capacity": list(self.memory_capacity),
            "fits": self.fits,
            "busy": list(self.busy),
            "group_end": list(self.group_end),
            "stage_end": list(self.stage_end),
            "allreduce": [g.allreduce for g in self.groups],
            "step": [g.step for g in self.groups],
            "bubble_fraction": self.bubble_fraction,
        }


# ------------------------------------------------------------------------- the sweep
def simulate(plan: "Plan", graph: "LayerGraph", cluster: "Cluster", *, file: str = "-",
             validate: bool = True) -> Simulation:
    """Time and memory of one iteration of ``plan``, exactly as the spec defines them.

    Parameters
    ----------
    plan, graph, cluster
        The plan and what it runs on.
    file : str
        The plan's file, for error messages.
    validate : bool
        Check the plan against the graph and cluster first (skip only for plans a
        solver built and already checked).

    Returns
    -------
    Simulation

    Raises
    ------
    InputError
        If the plan breaks a rule of the spec.
    DeadlockError
        If some action can never start; the message names the stage or group, the
        action and what it waits for.

    Examples
    --------
    See ``tests/test_simulator.py`` for hand-computed cases.
    """
    if validate:
        plan.validate(graph, cluster, file)
    return run_programs(plan_costs(plan, graph, cluster, file=file), file)


def run_programs(costs: PlanCosts, file: str = "-") -> Simulation:
    """The timeline of precomputed costs; see :func:`simulate`.

    The first timeline of a plan structure sweeps the groups, advancing each as far as
    its inputs allow, and its wiring keeps the order the actions ran in; later ones run
    the actions in that order (:meth:`Wiring.compiled_runs`), with no check of what has
    arrived.  Both give the same numbers, bit for bit.

    Raises
    ------
    DeadlockError
        If some action can never start.
    """
    wiring, groups = costs.wiring, costs.groups
    runs = wiring.compiled_runs()
    if runs is None:
        return _sweep(costs, file)
    arrival: list = [None] * wiring.slots + [0.0]  # the last entry: when each link is first free
    tx_start = [0.0] * wiring.slots
    send_time = costs.send_times
    all_starts = tuple([0.0] * n for n in wiring.lengths)
    all_ends = tuple([0.0] * n for n in wiring.lengths)
    per_group = tuple(zip(wiring.several, (g.durations for g in groups), all_starts, all_ends))
    clock = [0.0] * len(groups)
    for g, actions in runs:
        several, durations, starts, ends = per_group[g]
        now = clock[g]
        for p, w, o, before in actions:
            if w >= 0:
                a = arrival[w]
                if a > now:
                    now = a
            elif w != NO_WAIT:
                for x in several[p]:
                    a = arrival[x]
                    if a > now:
                        now = a
            starts[p] = now
            now += durations[p]
            ends[p] = now
            if before >= 0:  # over a link, free when what it carried before has arrived
                free = arrival[before]
                t0 = now if now > free else free
                tx_start[o] = t0
                arrival[o] = t0 + send_time[o]
            elif o >= 0:  # a hand-over on the group
                arrival[o] = now
        clock[g] = now
    del arrival[-1]
    return _simulation(costs, all_starts, all_ends, tx_start, arrival)


def _sweep(costs: PlanCosts, file: str) -> Simulation:
    """:func:`run_programs` by sweeping the groups until every action ran; keeps the order on the wiring."""
    wiring, groups = costs.wiring, costs.groups
    count, lengths = len(groups), wiring.lengths
    arrival: list = [None] * wiring.slots
    tx_start = [0.0] * wiring.slots
    link_free = [0.0] * len(wiring.links)
    send_time, slot_link = costs.send_times, wiring.slot_link
    all_starts = tuple([0.0] * n for n in lengths)
    all_ends = tuple([0.0] * n for n in lengths)
    ptr, clock = [0] * count, [0.0] * count
    runs: list[tuple[int, int, int]] = []
    remaining = sum(lengths)
    while remaining:
        progressed = 0
        for g in range(count):
            p, n = ptr[g], lengths[g]
            if p == n:
                continue
            waits, sends, several = wiring.waits[g], wiring.sends[g], wiring.several[g]
            durations, starts, ends = groups[g].durations, all_starts[g], all_ends[g]
            now, first = clock[g], p
            while p < n:
                w = waits[p]
                if w >= 0:
                    a = arrival[w]
                    if a is None:
                        break
                    ready = a if a > now else now
                elif w == NO_WAIT:
                    ready = now
                else:
                    ready = now
                    for o in several[p]:
                        a = arrival[o]
                        if a is None:
                            break
                        if a > ready:
                            ready = a
                    if a is None:
                        break
                now = ready + durations[p]
                starts[p] = ready
                ends[p] = now
                o = sends[p]
                if o >= 0:
                    link = slot_link[o]
                    if link < 0:
                        arrival[o] = now
                    else:
                        free = link_free[link]
                        t0 = now if now > free else free
                        t1 = t0 + send_time[o]
                        link_free[link] = t1
                        tx_start[o] = t0
                        arrival[o] = t1
                p += 1
            if p > first:
                runs.append((g, first, p))
                progressed += p - first
            ptr[g], clock[g] = p, now
        if not progressed:
            raise wiring.deadlock(ptr, arrival, file)
        remaining -= progressed
    wiring.record_order(runs)
    return _simulation(costs, all_starts, all_ends, tx_start, arrival)


def _simulation(costs: PlanCosts, starts: tuple[list[float], ...], ends: tuple[list[float], ...],
                transfer_starts: list[float], arrivals: list) -> Simulation:
    iteration = max(e[-1] + g.allreduce + g.step for g, e in zip(costs.groups, ends))
    return Simulation(iteration, costs, starts, ends, transfer_starts, arrivals)


def check_deadlock_free(plan: "Plan", file: str = "-") -> None:
    """Raise :class:`DeadlockError` if ``plan``'s programs (or op lists) and splits can deadlock.

    Whether a plan deadlocks depends on action orders and splits only, not on
    durations, so this needs neither the graph nor the cluster: it sweeps the
    programs with every duration 0 (a FIFO link always frees, so it cannot close a
    cycle).
    """
    plan_wiring(plan, file).sweep_order(file)
