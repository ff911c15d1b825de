"""The exact order model: the best programs for one partition, proved by CP-SAT.

Given a :class:`~pipeplan.solver.schedules.synthesis.ScheduleInstance` (a partition's
action times, links, all-reduce and step, memory caps), the model chooses every
group's program so that the iteration time (spec 7.3: the latest group's last action
plus its all-reduce and step) is smallest, each group's stash staying under its cap
(spec 7.4).  The model, in CP-SAT's terms:

- one fixed-size interval per action (``F``, and ``I`` and ``W``, or ``B``); the
  intervals of a group do not overlap;
- one fixed-size interval per transfer, after the action that sends it, on its link
  (an ordered pair of groups), whose intervals do not overlap;
- an order literal "``a`` runs before ``b``" for every pair of a group's actions whose
  order the dependencies leave open (pairs they force are constants).  The spec's
  links are FIFO in the sending group's program order, so when both actions send
  over one link the same literal orders their transfers.  The literals are also the
  search's decisions: without them (``pair_literals=False``, literals only for pairs
  that share a link) CP-SAT proves easy instances faster but finds good orders of
  harder ones much later;
- precedence: ``F`` after the arrival of the activations it needs (or their local
  hand-over), ``B``/``I`` after the gradients it needs (on the last stage, after its
  own ``F``), ``W`` after its own ``I``;
- memory, per group, a reservoir of stash bytes: an ``F`` adds at its end, a ``B``
  removes at its end, an ``I`` trades its stash for ``Aw`` at its end, a ``W`` removes
  ``Aw``, a recomputing ``B``/``I`` holds its working set from its start to its end;
  the level stays within the cap less the state at all times.  Since a group's
  actions take turns, the level at an action's end is the simulator's stash after it
  in program order;
- objective: the makespan ``max_g (end of the group's last action + AR_g + STEP_g)``.

For a fixed order the earliest start times are what the simulator computes, so the
optimum over orders is the best iteration time over programs.  CP-SAT works in
integers: every duration is floored to a multiple of a resolution (a power of two, so
that scaling is exact in floating point).  Floored durations can only shorten every
order's time, so CP-SAT's bound times the resolution is a lower bound on every
program's true time.  The time reported is the simulator's (see
:func:`~pipeplan.solver.schedules.synthesis.evaluate`) of the order returned, which
exceeds its floored time by at most one unit per action, transfer, all-reduce and
step (:func:`floor_slack`).  Bytes are rounded to a unit too, with the cap raised by
the most the roundings of a sum can add, so the model keeps every order that fits;
the returned order is checked with exact bytes.  An action whose duration floors to
zero can share its instant with others and hide a peak or a transfer's place in its
link's queue: the model then relaxes the spec, which keeps the bound valid, and the
returned order's true time, checked, says whether the proof still holds.

Spaces: ``in_order=False`` searches every order (any microbatch order on each stage);
``in_order=True`` only those in which each stage runs its ``F`` s, its ``B``/``I`` s and
its ``W`` s in microbatch order (the space of the fixed schedules and of Zero Bubble's
ILP), which is much smaller.

Microbatches that are alike (the stages split alike, and on every stage two
microbatches have the same samples and action times, on every cut the same transfer
times) can be run in microbatch order among themselves at no loss, so the model
searches only such programs, whichever space is asked: when all microbatches are
alike, the in-order programs; with, say, four microbatches of 5 samples and four of 4,
those running the 5-sample ones in order and the 4-sample ones in order
(:func:`microbatch_classes`).  Proof: take any programs and their timeline, and a class
of alike microbatches ``c_1 < c_2 < ...``; on each stage give the ``i``-th ``F`` of the
class (in program order) microbatch ``c_i``, and likewise the ``i``-th ``B``/``I`` and the
``i``-th ``W`` of the class, keeping every action's position and times.  The ``i``-th ``F``
of the class on stage ``s + 1`` started after ``i`` distinct microbatches of the class had
arrived from stage ``s``, so after the arrival of stage ``s``'s ``i``-th ``F`` of the class: a
link delivers in its sending order (a local hand-over at the end of the action, and a
group's actions end in program order), so the arrivals of one stage's transfers of a
class rise with their order.  In the same way the ``i``-th ``B``/``I`` of the class on a
stage starts after its ``i``-th ``F`` of the class has ended and the ``i``-th gradient of
the class from the next stage has arrived, and the ``i``-th ``W`` after the ``i``-th ``I``.
Every transfer keeps its place and duration on its link (alike microbatches' transfers
take the same time), and the stash after each action depends on the kinds and the
samples in program order only, so the relabelled programs are valid, fit where the
originals fit, and their earliest timeline is no later (:func:`canonical_programs`
relabels the hint so).  (The brute-force tests of ``tests/test_order_model.py``
enumerate every order, so they check this too.)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Sequence

from ortools.sat.python import cp_model

from pipeplan.solver.schedules.programs import (FORWARD, FULL_BACKWARD, INPUT_BACKWARD, WEIGHT_BACKWARD, Action,
                                                format_action)
from pipeplan.solver.schedules.synthesis import (Programs, ProgramDeadlock, ScheduleInstance, Timeline, _timeline,
                                                 evaluate, split_backwards, synthesize)

__all__ = ["OrderProblem", "OrderLimits", "OrderResult", "solve_order", "time_resolution", "floor_slack",
           "microbatch_classes", "canonical_programs"]

TIME_UNITS = 2 ** 24
"""Integer time units the serial work of an instance spans at the default resolution.

The floors lose at most one unit per action and transfer on a path: with 2**24 units
over the serial work that is under 1e-5 of the iteration time for pipelines of up to
a few hundred actions per path, while CP-SAT's propagation is indifferent to the
horizon's size (no time-indexed variables)."""

MEMORY_UNITS = 2 ** 30
"""Integer units a group's stash budget spans (bytes are rounded to the nearest unit)."""

FLOAT_MARGIN = 2.0 ** -40
"""Relative margin the lower bound is lowered by, for the simulator's floating-point sums."""


@dataclass(frozen=True)
class OrderProblem:
    """What the order model optimises: a partition and the space of programs."""

    instance: ScheduleInstance
    """The partition's costs."""
    split_backward: bool = True
    """Backwards as ``I`` then ``W`` (else whole ``B``)."""
    in_order: bool = False
    """Each stage runs each kind of action in microbatch order (else any order)."""
    resolution: float | None = None
    """Seconds per time unit (best a power of two, which scales exactly); ``None``: :func:`time_resolution`."""
    pair_literals: bool = True
    """One order literal per pair of a group's actions (else only for pairs sharing a link)."""

    def __post_init__(self) -> None:
        if self.resolution is not None and not self.resolution > 0:
            raise ValueError(f"resolution must be > 0 seconds, got {self.resolution}")

    @property
    def space(self) -> str:
        """The space of programs, in words."""
        kinds = "F, I, W" if self.split_backward else "F, B"
        return f"{kinds}; {'in microbatch order per stage and kind' if self.in_order else 'any order'}"


@dataclass(frozen=True)
class OrderLimits:
    """When CP-SAT stops: counted work first, the wall clock only as a cap."""

    work: float = 60.0
    """CP-SAT deterministic seconds (``max_deterministic_time``): what decides the result."""
    wall_clock: float | None = None
    """Seconds of wall clock at most (``max_time_in_seconds``); ``None``: no cap. A result cut by it
    depends on the machine's speed, and says so in :attr:`OrderResult.stopped_by`."""
    workers: int = 1
    """CP-SAT workers. With more than one, the search is interleaved (``interleave_search``), so the
    result still depends only on the inputs, the seed and the work limit."""
    seed: int = 0
    """CP-SAT's random seed."""


@dataclass(frozen=True)
class OrderResult:
    """What :func:`solve_order` found."""

    programs: Programs | None
    """The best programs found (``None`` when none was)."""
    iteration_time: float | None
    """Their iteration time by the simulator's arithmetic (:func:`~pipeplan.solver.schedules.synthesis.evaluate`)."""
    lower_bound: float | None
    """A lower bound on every program's iteration time in the space (seconds), or ``None``."""
    status: str
    """``"optimal"`` (CP-SAT proved no order is shorter at the resolution), ``"feasible"``, ``"infeasible"``
    (CP-SAT proved no order fits the caps) or ``"unknown"`` (stopped before finding an order)."""
    gap: float | None
    """``(iteration_time - lower_bound) / iteration_time``."""
    resolution: float
    """Seconds per time unit the model used."""
    space: str
    """The space of programs searched (:attr:`OrderProblem.space`)."""
    wall_time: float
    """Seconds of wall clock (model building and solving)."""
    cpu_time: float
    """Seconds of this process's CPU time over the same (all its threads): the wall time of an idle machine."""
    work: float
    """CP-SAT deterministic seconds used."""
    stopped_by: str
    """``"proof"``, ``"work"`` (the deterministic-time limit) or ``"wall clock"``."""
    hint_time: float | None
    """Iteration time of the hint CP-SAT was given (``None``: none)."""
    timeline: Timeline | None = None
    """The returned programs' timeline."""
    note: str | None = None
    """Anything the numbers do not say (a returned order rejected by the exact memory check, say)."""


def time_resolution(instance: ScheduleInstance, split_backward: bool = True, units: int = TIME_UNITS) -> float:
    """The power of two nearest below ``serial work / units`` seconds (see :data:`TIME_UNITS`)."""
    work = instance.serial_work(split_backward)
    if not work > 0:
        return 1.0
    return 2.0 ** math.floor(math.log2(work / units))


def _floor_units(value: float, resolution: float) -> int:
    """``floor(value / resolution)`` exactly (resolution a power of two, so the division is exact)."""
    units = math.floor(Fraction(value) / Fraction(resolution))
    return max(0, units)


def _integer_instance(instance: ScheduleInstance, resolution: float) -> ScheduleInstance:
    """The instance with every time floored to whole units of ``resolution`` (ints)."""
    def floors(xs: Sequence[float]) -> tuple[int, ...]:
        return tuple(_floor_units(x, resolution) for x in xs)

    stages = tuple(replace(st, forward=floors(st.forward), backward=floors(st.backward),
                           input_grad=floors(st.input_grad), weight_grad=floors(st.weight_grad))
                   for st in instance.stages)
    bounds = tuple(replace(b, forward=floors(b.forward), backward=floors(b.backward)) for b in instance.boundaries)
    groups = tuple(replace(g, allreduce=_floor_units(g.allreduce, resolution), step=_floor_units(g.step, resolution))
                   for g in instance.groups)
    return replace(instance, stages=stages, boundaries=bounds, groups=groups)


def microbatch_classes(instance: ScheduleInstance) -> tuple[tuple[int, ...], ...]:
    """The microbatches that relabelling may swap: classes of microbatches alike in every number.

    With equal splits, microbatches ``j`` and ``k`` are alike when on every stage they have
    the same samples and action times and on every cut the same transfer times; each
    class lists its microbatches in increasing order.  Unequal splits (stage ``s + 1``'s
    microbatch waiting for several of stage ``s``'s) give one class per microbatch: no
    relabelling is known to be a symmetry then.
    """
    count = instance.stages[0].count if instance.stages else 0
    if not instance.equal_splits:
        return tuple((k,) for k in range(count))

    def signature(k: int) -> tuple:
        rows = [(st.samples[k], st.forward[k], st.backward[k], st.input_grad[k], st.weight_grad[k])
                for st in instance.stages]
        return tuple(rows) + tuple((b.forward[k], b.backward[k]) for b in instance.boundaries)

    classes: dict[tuple, list[int]] = {}
    for k in range(count):
        classes.setdefault(signature(k), []).append(k)
    return tuple(tuple(ks) for ks in classes.values())


def canonical_programs(instance: ScheduleInstance, programs: Sequence[Sequence[Action]]) -> Programs:
    """``programs`` relabelled so that each stage runs each class's actions of one kind in microbatch order.

    Per stage and kind, the ``i``-th action of a class of :func:`microbatch_classes` (in
    program order) becomes the class's ``i``-th microbatch; every action keeps its
    position.  By the module's argument the result is valid, keeps every peak and its
    earliest timeline is no later.
    """
    classes = microbatch_classes(instance)
    member = {k: (c, i) for c, ks in enumerate(classes) for i, k in enumerate(ks)}
    seen: dict[tuple[int, str, int], int] = {}
    out = []
    for program in programs:
        relabelled = []
        for a in program:
            c, _ = member[a.microbatch]
            i = seen.get((a.stage, a.kind, c), 0)
            seen[(a.stage, a.kind, c)] = i + 1
            relabelled.append(Action(a.stage, a.kind, classes[c][i]))
        out.append(tuple(relabelled))
    return tuple(out)


class _Model:
    """The CP-SAT model of one :class:`OrderProblem` (see the module docstring)."""

    def __init__(self, problem: OrderProblem, hint: Programs | None) -> None:
        """``hint``: programs that fit the caps, to start from (and whose time bounds the horizon)."""
        inst = problem.instance
        self.problem = problem
        self.resolution = problem.resolution or time_resolution(inst, problem.split_backward)
        self.units = _integer_instance(inst, self.resolution)
        self.back = INPUT_BACKWARD if problem.split_backward else FULL_BACKWARD
        self.model = cp_model.CpModel()
        self.actions = inst.actions(problem.split_backward)
        self.preds = self._dependencies()
        self.ancestors = self._ancestors()
        self.horizon = self._horizon(hint)
        self._intervals()
        self._precedences()
        self._links()
        self._memory()
        self._objective()
        if hint is not None:
            self._hint(hint)

    # ------------------------------------------------------------------ building
    def _duration(self, a: Action) -> int:
        return self.units.stages[a.stage].duration(a.kind, a.microbatch)

    def _send(self, a: Action) -> tuple[int, tuple[int, int] | None] | None:
        """``(transfer units, link)`` of what ``a`` sends (link ``None``: local); ``None`` if it sends nothing."""
        s, kind, k = a
        last = len(self.units.stages) - 1
        if kind == FORWARD and s < last:
            b = self.units.boundaries[s]
            return b.forward[k], b.forward_link
        if kind in (INPUT_BACKWARD, FULL_BACKWARD) and s > 0:
            b = self.units.boundaries[s - 1]
            return b.backward[k], b.backward_link
        return None

    def _horizon(self, hint: Programs | None) -> int:
        if hint is not None:
            return int(_timeline(self.units, hint)[0])
        total = sum(self._duration(a) for acts in self.actions for a in acts)
        total += sum(sum(b.forward) + sum(b.backward) for b in self.units.boundaries)
        return int(total + sum(g.allreduce + g.step for g in self.units.groups))

    def _dependencies(self) -> dict[Action, list[Action]]:
        """Each action's direct predecessors: its data, and the order the space (or a symmetry) imposes."""
        stages = self.units.stages
        last = len(stages) - 1
        back = self.back
        # alike microbatches run in microbatch order: as good as any order (see the module docstring)
        previous = {k: ks[i - 1] for ks in microbatch_classes(self.problem.instance) for i, k in enumerate(ks) if i}
        if self.problem.in_order:
            previous = {k: k - 1 for k in range(1, max(st.count for st in stages))}
        preds: dict[Action, list[Action]] = {a: [] for acts in self.actions for a in acts}
        for s, st in enumerate(stages):
            for k in range(st.count):
                f, b = Action(s, FORWARD, k), Action(s, back, k)
                if s > 0:
                    lo, hi = st.wait_forward[k]
                    preds[f] += [Action(s - 1, FORWARD, j) for j in range(lo, hi + 1)]
                if s < last:
                    lo, hi = st.wait_backward[k]
                    preds[b] += [Action(s + 1, back, j) for j in range(lo, hi + 1)]
                preds[b].append(f)  # implied on every stage but the last
                if back == INPUT_BACKWARD:
                    preds[Action(s, WEIGHT_BACKWARD, k)].append(b)
                if k in previous:
                    for kind in (FORWARD, back) + ((WEIGHT_BACKWARD,) if back == INPUT_BACKWARD else ()):
                        preds[Action(s, kind, k)].append(Action(s, kind, previous[k]))
        return preds

    def _ancestors(self) -> dict[Action, int]:
        """Per action, the bitset (by :attr:`position`, a topological order) of the actions that precede it."""
        order: list[Action] = []
        seen: set[Action] = set()
        for root in self.preds:  # iterative depth-first search; post-order is a topological order
            if root in seen:
                continue
            seen.add(root)
            stack = [(root, iter(self.preds[root]))]
            while stack:
                node, pending = stack[-1]
                nxt = next(pending, None)
                if nxt is None:
                    order.append(node)
                    stack.pop()
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, iter(self.preds[nxt])))
        self.position = {a: i for i, a in enumerate(order)}
        ancestors: dict[Action, int] = {}
        for a in order:
            bits = 0
            for p in self.preds[a]:
                bits |= ancestors[p] | (1 << self.position[p])
            ancestors[a] = bits
        return ancestors

    def _precedes(self, a: Action, b: Action) -> bool:
        """Whether the dependencies force ``a`` before ``b``."""
        return bool(self.ancestors[b] >> self.position[a] & 1)

    def _intervals(self) -> None:
        m, horizon = self.model, self.horizon
        self.start: dict[Action, cp_model.IntVar] = {}
        self.end: dict[Action, cp_model.LinearExpr] = {}
        self.interval: dict[Action, cp_model.IntervalVar] = {}
        self.tx_start: dict[Action, cp_model.IntVar] = {}
        self.arrival: dict[Action, cp_model.LinearExpr] = {}
        self.link_users: dict[tuple[int, int], list[Action]] = {}
        link_intervals: dict[tuple[int, int], list[cp_model.IntervalVar]] = {}
        for acts in self.actions:
            for a in acts:
                d = self._duration(a)
                name = format_action(a)
                start = m.new_int_var(0, horizon, name)
                self.start[a], self.end[a] = start, start + d
                self.interval[a] = m.new_fixed_size_interval_var(start, d, f"{name}.run")
                sent = self._send(a)
                if sent is None:
                    continue
                units, link = sent
                if link is None:
                    self.arrival[a] = start + d
                    continue
                tx = m.new_int_var(0, horizon, f"{name}.tx")
                self.tx_start[a] = tx
                m.add(tx >= start + d)
                self.arrival[a] = tx + units
                link_intervals.setdefault(link, []).append(m.new_fixed_size_interval_var(tx, units, f"{name}.link"))
                self.link_users.setdefault(link, []).append(a)
        for acts in self.actions:
            m.add_no_overlap([self.interval[a] for a in acts])
        for intervals in link_intervals.values():
            m.add_no_overlap(intervals)

    def _precedences(self) -> None:
        m = self.model
        for a, before in self.preds.items():
            for p in before:
                cross = p.stage != a.stage and p.kind == a.kind  # data from the next or previous stage
                m.add(self.start[a] >= (self.arrival[p] if cross else self.end[p]))

    def _links(self) -> None:
        """Order literals: for every pair of a group's actions whose order the dependencies leave open, one
        literal orders their intervals and, when both send over one link, their transfers (FIFO)."""
        m = self.model
        self.literals: list[tuple[Action, Action, cp_model.IntVar]] = []
        link_of = {a: self._send(a)[1] for a in self.tx_start}  # type: ignore[index]
        for acts in self.actions:
            for i, a in enumerate(acts):
                for b in acts[i + 1:]:
                    shared = a in link_of and b in link_of and link_of[a] == link_of[b]
                    if not (shared or self.problem.pair_literals):
                        continue
                    ua = ub = 0
                    if shared:
                        ua, ub = self._send(a)[0], self._send(b)[0]  # type: ignore[index]
                    if self._precedes(a, b):
                        if shared:
                            m.add(self.tx_start[b] >= self.tx_start[a] + ua)
                    elif self._precedes(b, a):
                        if shared:
                            m.add(self.tx_start[a] >= self.tx_start[b] + ub)
                    else:
                        lit = m.new_bool_var(f"{format_action(a)}<{format_action(b)}")
                        self.literals.append((a, b, lit))
                        m.add(self.start[b] >= self.end[a]).only_enforce_if(lit)
                        m.add(self.start[a] >= self.end[b]).only_enforce_if(~lit)
                        if shared:
                            m.add(self.tx_start[b] >= self.tx_start[a] + ua).only_enforce_if(lit)
                            m.add(self.tx_start[a] >= self.tx_start[b] + ub).only_enforce_if(~lit)

    def _memory(self) -> None:
        """Per group, a reservoir of stash bytes: ``F`` adds at its end, ``B``/``I`` remove (and ``I`` leaves
        ``Aw``) at theirs, ``W`` removes ``Aw``, a recomputing backward holds its working set while it runs."""
        inst = self.problem.instance
        m = self.model
        for g, acts in enumerate(self.actions):
            group = inst.groups[g]
            budget = group.cap - group.state
            if budget < 0:
                m.add_bool_or([])  # the state alone exceeds the cap: no program fits
                continue
            # the stash holds, per microbatch and stage, X or Aw (never both), plus one working set
            rises = [inst.stages[a.stage].samples[a.microbatch] * max(inst.stages[a.stage].stash,
                                                                      inst.stages[a.stage].weight_stash)
                     for a in acts if a.kind == FORWARD]
            working = max((inst.stages[a.stage].samples[a.microbatch] * inst.stages[a.stage].working
                           for a in acts if a.kind != FORWARD), default=0.0)
            if math.fsum(rises) + working <= budget * (1 - 1e-9):
                continue  # even every forward first fits: the cap never binds
            unit = 2.0 ** math.ceil(math.log2(max(budget, math.fsum(rises) + working) / MEMORY_UNITS))
            times, changes = [], []
            for a in acts:
                st = inst.stages[a.stage]
                q = st.samples[a.microbatch]
                x, w, r = round(q * st.stash / unit), round(q * st.weight_stash / unit), round(q * st.working / unit)
                if a.kind == FORWARD:
                    times.append(self.end[a]), changes.append(x)
                elif a.kind == WEIGHT_BACKWARD:
                    times.append(self.end[a]), changes.append(-w)
                else:
                    if r:
                        times.append(self.start[a]), changes.append(r)
                    times.append(self.end[a]), changes.append(-r - x + (w if a.kind == INPUT_BACKWARD else 0))
            cap = math.floor(budget / unit) + 2 * len(times) + 1  # at most 1.5 units of rounding per change
            m.add_reservoir_constraint(times, changes, -sum(abs(c) for c in changes) - 1, cap)

    def _objective(self) -> None:
        m = self.model
        sync = [g.allreduce + g.step for g in self.units.groups]
        self.makespan = m.new_int_var(0, self.horizon, "T")
        for g, acts in enumerate(self.actions):
            for a in acts:
                if not any(self._precedes(a, b) for b in acts if b != a):  # only possible last actions
                    m.add(self.makespan >= self.end[a] + sync[g])
            m.add(self.makespan >= sum(self._duration(a) for a in acts) + sync[g])  # redundant: a first bound
        m.minimize(self.makespan)

    def _hint(self, hint: Programs) -> None:
        """Every start, transfer start, literal and the makespan of ``hint``'s earliest schedule in units."""
        sends: dict[Action, int] = {}
        makespan, times, _ = _timeline(self.units, hint, sends)
        m = self.model
        rank = {}
        for g, program in enumerate(hint):
            for i, a in enumerate(program):
                m.add_hint(self.start[a], int(times[g][i][0]))
                rank[a] = i
                if a in self.tx_start:
                    m.add_hint(self.tx_start[a], int(sends[a]))
        for a, b, lit in self.literals:
            m.add_hint(lit, rank[a] < rank[b])
        m.add_hint(self.makespan, int(makespan))

    # ------------------------------------------------------------------ reading a solution
    def programs(self, solver: cp_model.CpSolver) -> Programs:
        """Every group's actions by start time (ties, only between actions that take no time, in the order the
        link literals and the dependencies give)."""
        after: dict[Action, int] = {a: 0 for acts in self.actions for a in acts}
        for a, b, lit in self.literals:
            after[b if solver.boolean_value(lit) else a] += 1
        return tuple(tuple(sorted(acts, key=lambda a: (solver.value(self.start[a]), solver.value(self.end[a]),
                                                       after[a], self.position[a])))
                     for acts in self.actions)


PROBING_LEVEL = 0
"""CP-SAT's ``cp_model_probing_level``.  Probing spends many times its deterministic-time charge in wall
clock on these models (4,000 order literals: 9 s of CPU against 0.7 s without, for the same proof on the
V placement of the first instance of ``experiments/bench_synthesis.py``), and the proofs measured there
came no slower without it."""


def _hint_programs(problem: OrderProblem, hint: Sequence[Sequence[Action]] | None) -> Programs:
    """The hint with the problem's kinds (``B`` split when the space splits), checked; the list scheduler's
    programs when none is given."""
    inst = problem.instance
    if hint is None:
        hint = synthesize(inst, split_backward=problem.split_backward).programs
    programs = split_backwards(hint) if problem.split_backward else tuple(tuple(p) for p in hint)
    wanted = [sorted(acts) for acts in inst.actions(problem.split_backward)]
    if [sorted(p) for p in programs] != wanted:
        raise ValueError("the hint's actions are not the problem's: each group must run exactly its stages' "
                         f"{'F, I and W' if problem.split_backward else 'F and B'} of every microbatch")
    return programs


def floor_slack(problem: OrderProblem, resolution: float) -> float:
    """Seconds the floors can take off an order's time: one unit per action, transfer, all-reduce and step."""
    inst = problem.instance
    actions = sum(len(acts) for acts in inst.actions(problem.split_backward))
    transfers = sum(len(b.forward) + len(b.backward) for b in inst.boundaries if b.forward_link is not None)
    return (actions + transfers + 2 * len(inst.groups)) * resolution


def solve_order(problem: OrderProblem, limits: OrderLimits = OrderLimits(), *,
                hint: Sequence[Sequence[Action]] | None = None) -> OrderResult:
    """The best programs for a partition, with CP-SAT's proof or bound.

    Parameters
    ----------
    problem : OrderProblem
        The instance and the space of programs.
    limits : OrderLimits
        Work (deterministic seconds), wall-clock cap, workers, seed.
    hint : programs, optional
        Programs to start from; by default the list scheduler's
        (:func:`~pipeplan.solver.schedules.synthesis.synthesize`).  ``B`` s are split
        when the space splits backwards; otherwise the hint must use ``F`` and ``B`` only.

    Returns
    -------
    OrderResult
        The best programs found: CP-SAT's, or the hint's when CP-SAT found none better
        (the floors may rank orders slightly differently from the true times) or none
        at all.  ``status`` is ``"optimal"`` only when CP-SAT proved its order shortest
        at the resolution and the returned order's true time is within
        :func:`floor_slack` of the bound (then no program of the space is shorter by
        more than that); ``lower_bound`` bounds every program of the space from below.

    Raises
    ------
    ValueError
        If the hint's actions are not the problem's.

    Examples
    --------
    See ``tests/test_order_model.py``.
    """
    clock, cpu = time.perf_counter(), time.process_time()
    inst = problem.instance
    hint_programs: Programs | None = _hint_programs(problem, hint)
    try:
        hint_timeline: Timeline | None = evaluate(inst, hint_programs)  # type: ignore[arg-type]
    except ProgramDeadlock:
        hint_programs, hint_timeline = None, None
    if hint_timeline is not None and not hint_timeline.fits:
        hint_programs, hint_timeline = None, None
    model_hint = hint_programs
    if hint_programs is not None and not problem.in_order:
        # the model runs alike microbatches in order: the hint relabelled so, no slower (see the module docstring)
        relabelled = canonical_programs(inst, hint_programs)
        try:
            canonical: Timeline | None = evaluate(inst, relabelled)
        except ProgramDeadlock:  # cannot happen by the proof; the hint stays as given then
            canonical = None
        if canonical is not None and canonical.fits \
                and canonical.iteration_time <= hint_timeline.iteration_time:  # type: ignore[union-attr]
            hint_programs, hint_timeline, model_hint = relabelled, canonical, relabelled
    model = _Model(problem, model_hint)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_deterministic_time = limits.work
    if limits.wall_clock is not None:
        params.max_time_in_seconds = limits.wall_clock
    params.num_workers = limits.workers
    params.interleave_search = limits.workers > 1
    params.random_seed = limits.seed
    params.relative_gap_limit = 0.0
    params.absolute_gap_limit = 0.0
    params.cp_model_probing_level = PROBING_LEVEL
    params.catch_sigint_signal = False
    code = solver.solve(model.model)
    work = solver.deterministic_time
    proved = code in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
    stopped_by = "proof" if proved else ("work" if work >= limits.work * (1 - 1e-6) else "wall clock")
    resolution = model.resolution

    def result(programs: Programs | None, timeline: Timeline | None, bound: float | None, status: str,
               note: str | None = None) -> OrderResult:
        t = None if timeline is None else timeline.iteration_time
        if bound is not None and t is not None:
            bound = min(bound, t)
        gap = (t - bound) / t if bound is not None and t else None
        return OrderResult(programs, t, bound, status, gap, resolution, problem.space, time.perf_counter() - clock,
                           time.process_time() - cpu, work, stopped_by,
                           None if hint_timeline is None else hint_timeline.iteration_time, timeline, note)

    if code == cp_model.INFEASIBLE:
        return result(None, None, None, "infeasible")
    bound = None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) or math.isfinite(solver.best_objective_bound):
        # floored durations: a lower bound on every order's true time, less a margin for float sums
        bound = max(0.0, solver.best_objective_bound * resolution * (1 - FLOAT_MARGIN))
    found = None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        found = model.programs(solver)
        timeline = evaluate(inst, found)
        if not timeline.fits:
            found = None
    best, best_timeline = hint_programs, hint_timeline
    if found is not None and (best_timeline is None or timeline.iteration_time <= best_timeline.iteration_time):
        best, best_timeline = found, timeline
    if best is None:
        note = "CP-SAT's order exceeds a cap by a byte rounding" if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) \
            else None
        return result(None, None, bound, "unknown", note)
    status = "feasible"
    if code == cp_model.OPTIMAL and bound is not None \
            and best_timeline.iteration_time - bound <= floor_slack(problem, resolution):  # type: ignore[union-attr]
        status = "optimal"
    return result(best, best_timeline, bound, status)
