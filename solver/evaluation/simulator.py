"""The exact simulator: what a plan costs (spec sections 4 and 5).

Every stage runs its op list in order; forward activations and gradients cross each
cut on two FIFO links; an op waits for the transfers of every sender microbatch whose
samples overlap its own.  Since each resource (a stage, a link) serves its work in a
fixed order, the timeline is the unique fixed point of "start = latest of the
resource being free and the inputs having arrived", computed here by sweeping the
stages and advancing each as far as its inputs allow.  If a sweep advances no stage
before all ops ran, the dependencies form a cycle: a deadlock.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from typing import TYPE_CHECKING

from pipeplan.models.errors import DeadlockError, InputError
from pipeplan.solver.evaluation.memory import StageMemory, group_peak_memory, stage_peak_memory
from pipeplan.solver.schedules.schedule import BACKWARD, FORWARD, Action, Op, format_action, format_op, stage_ops

if TYPE_CHECKING:
    from pipeplan.models.graph import LayerGraph
    from pipeplan.solver.formats.cluster import Cluster
    from pipeplan.solver.formats.plan import Plan, Stage


@dataclass(frozen=True)
class OpEvent:
    """One forward or backward op on a stage."""

    stage: int
    """Stage index."""
    kind: str
    """``"F"`` or ``"B"``."""
    microbatch: int
    """The stage's microbatch index."""
    samples: int
    """Samples per replica, ``ceil(n / r)``."""
    start: float
    """Start time in seconds from the iteration start."""
    end: float
    """End time in seconds."""
    recompute: float
    """Seconds of the op spent recomputing the forward (at its start); 0 if none."""
    group: int = 0
    """The device group that ran it (the stage itself in a plan of one stage per group)."""

    @property
    def label(self) -> str:
        """The action as torch writes it: ``"2I3"``."""
        return f"{self.stage}{self.kind}{self.microbatch}"


@dataclass(frozen=True)
class TransferEvent:
    """One transfer across a cut."""

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
class AllReduceEvent:
    """The gradient all-reduce of a replicated stage."""

    stage: int
    """Stage index."""
    start: float
    """Start (the end of the stage's last op)."""
    end: float
    """End."""


@dataclass(frozen=True)
class StageCost:
    """Everything the timing of one stage needs, precomputed from plan, graph and cluster."""

    ops: tuple[Op, ...]
    """The op list."""
    fwd: tuple[float, ...]
    """``TF`` per microbatch."""
    bwd: tuple[float, ...]
    """``TB`` per microbatch (recompute included)."""
    recompute: tuple[float, ...]
    """Recompute part of ``TB`` per microbatch (0 without recompute)."""
    per_replica: tuple[int, ...]
    """``ceil(n_k / r)`` per microbatch."""
    sizes: tuple[int, ...]
    """``n_k`` per microbatch."""
    send_fwd: tuple[float, ...]
    """Forward transfer time of each microbatch to the next stage (empty on the last)."""
    send_bwd: tuple[float, ...]
    """Backward transfer time of each microbatch to the previous stage (empty on the first)."""
    wait_fwd: tuple[tuple[int, int], ...]
    """Inclusive range of previous-stage microbatches each ``Fk`` waits for."""
    wait_bwd: tuple[tuple[int, int], ...]
    """Inclusive range of next-stage microbatches each ``Bk`` waits for."""
    allreduce: float
    """``AR_s``."""
    peak_memory: float
    """Peak bytes per device."""
    capacity: float
    """Smallest memory among the stage's devices."""
    step: float = 0.0
    """``STEP_s``: the optimizer step after the all-reduce (spec 7.3; 0 on a version-1 graph)."""


class _CostReport:
    """What both kinds of result answer alike from their units: stages (version 1) or groups.

    A subclass gives ``iteration_time``, ``global_batch``, ``_units`` (each with
    ``peak_memory``, ``capacity``, ``allreduce`` and ``step``), ``busy``,
    ``group_end`` and ``_memory_owner``.
    """

    iteration_time: float
    global_batch: int

    @property
    def _units(self) -> tuple:
        raise NotImplementedError

    def _memory_owner(self, i: int) -> tuple[str, str]:
        """``(where, whose)`` naming unit ``i`` in an error about its memory."""
        raise NotImplementedError

    @property
    def throughput(self) -> float:
        """Samples per second."""
        return self.global_batch / self.iteration_time if self.iteration_time > 0 else float("inf")

    @property
    def peak_memory(self) -> tuple[float, ...]:
        """Peak bytes per device, one per stage (version 1) or group."""
        return tuple(u.peak_memory for u in self._units)

    @property
    def memory_capacity(self) -> tuple[float, ...]:
        """The smallest device memory of each stage (version 1) or group."""
        return tuple(u.capacity for u in self._units)

    @property
    def fits(self) -> bool:
        """Whether every peak fits in each device that holds it."""
        return all(u.peak_memory <= u.capacity for u in self._units)

    @property
    def bubble_fraction(self) -> float:
        """Share of unit-time spent idle: ``1 - sum(busy) / (units * T)``."""
        if self.iteration_time <= 0:
            return 0.0
        # each busy / T is at most 1: S * T or the busy sum may overflow where this does not
        return 1.0 - sum(busy / self.iteration_time for busy in self.busy) / len(self._units)

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
        for i, peak in enumerate(self.peak_memory):
            if not math.isfinite(peak):
                where, whose = self._memory_owner(i)
                raise InputError(file, where, f"{whose} peak memory is {peak}: the graph's bytes overflow "
                                              "floating point at this batch")

    def summary(self) -> dict:
        """The JSON object ``pipeplan simulate --json`` prints (lists per stage or group)."""
        return {
            "iteration_time": self.iteration_time,
            "throughput": self.throughput if self.iteration_time > 0 else None,  # JSON has no infinity
            "peak_memory": list(self.peak_memory),
            "memory_capacity": list(self.memory_capacity),
            "fits": self.fits,
            "busy": list(self.busy),
            "group_end": list(self.group_end),
            "allreduce": [u.allreduce for u in self._units],
            "step": [u.step for u in self._units],
            "bubble_fraction": self.bubble_fraction,
        }


@dataclass(frozen=True)
class SimulationResult(_CostReport):
    """What a plan costs: time, throughput, memory and the full timeline."""

    iteration_time: float
    """``T``: seconds per iteration."""
    global_batch: int
    """Samples per iteration."""
    stages: tuple[StageCost, ...]
    """Per-stage costs the timeline was computed from."""
    op_times: tuple[tuple[tuple[float, float], ...], ...]
    """``(start, end)`` of each stage's ops, in op-list order."""
    transfer_times: tuple[tuple[tuple[float, float], ...], ...]
    """Per cut ``c``: ``(start, end)`` of forward transfers by microbatch of stage ``c``."""
    gradient_times: tuple[tuple[tuple[float, float], ...], ...]
    """Per cut ``c``: ``(start, end)`` of backward transfers by microbatch of stage ``c+1``."""

    @property
    def _units(self) -> tuple[StageCost, ...]:
        return self.stages

    def _memory_owner(self, i: int) -> tuple[str, str]:
        return f"stages[{i}]", "its"

    @cached_property
    def busy(self) -> tuple[float, ...]:
        """Seconds each stage spends running ops."""
        return tuple(sum(st.fwd[k] if kind == FORWARD else st.bwd[k] for kind, k in st.ops)
                     for st in self.stages)

    @property
    def stage_end(self) -> tuple[float, ...]:
        """When each stage is done: its last op's end plus its all-reduce and optimizer step."""
        return tuple(times[-1][1] + st.allreduce + st.step for st, times in zip(self.stages, self.op_times))

    @property
    def group_end(self) -> tuple[float, ...]:
        """:attr:`stage_end`: each stage is a group of its own."""
        return self.stage_end

    @cached_property
    def ops(self) -> tuple[OpEvent, ...]:
        """Every op, stage by stage, in op-list order."""
        events = []
        for s, (st, times) in enumerate(zip(self.stages, self.op_times)):
            for (kind, k), (start, end) in zip(st.ops, times):
                rec = st.recompute[k] if kind != FORWARD else 0.0
                events.append(OpEvent(s, kind, k, st.per_replica[k], start, end, rec, s))
        return tuple(events)

    @cached_property
    def transfers(self) -> tuple[TransferEvent, ...]:
        """Every transfer, cut by cut, forward then backward, by microbatch."""
        events = []
        for c, times in enumerate(self.transfer_times):
            for j, (start, end) in enumerate(times):
                events.append(TransferEvent(c, "fwd", j, self.stages[c].sizes[j], start, end, (c, c + 1)))
        for c, times in enumerate(self.gradient_times):
            for j, (start, end) in enumerate(times):
                events.append(TransferEvent(c, "bwd", j, self.stages[c + 1].sizes[j], start, end, (c + 1, c)))
        return tuple(events)

    @cached_property
    def allreduces(self) -> tuple[AllReduceEvent, ...]:
        """The all-reduce of every replicated stage."""
        return tuple(AllReduceEvent(s, times[-1][1], times[-1][1] + st.allreduce)
                     for s, (st, times) in enumerate(zip(self.stages, self.op_times)) if st.allreduce > 0)

    @cached_property
    def syncs(self) -> tuple["SyncEvent", ...]:
        """Each stage's all-reduce and optimizer step, where they take time (a stage is a group here)."""
        events = []
        for s, (st, times) in enumerate(zip(self.stages, self.op_times)):
            events += _sync_events(s, times[-1][1], st.allreduce, st.step)
        return tuple(events)

    def summary(self) -> dict:
        """The JSON object ``pipeplan simulate --json`` prints (lists per stage; ``stage_end`` too)."""
        return {**super().summary(), "stage_end": list(self.stage_end)}


def _ceil_div(n: int, r: int) -> int:
    return -(-n // r)


def _overlaps(mine: tuple[int, ...], theirs: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """For each of my microbatches, the inclusive range of theirs sharing a sample."""
    their_ends = list(accumulate(theirs))
    ranges, start = [], 0
    for end in accumulate(mine):
        ranges.append((bisect_right(their_ends, start), bisect_left(their_ends, end)))
        start = end
    return tuple(ranges)


def _send_times(sender: "Stage", receiver: "Stage", cut_bytes: float, cluster: "Cluster") -> tuple[float, ...]:
    """Seconds each of ``sender``'s microbatches takes across the cut to ``receiver``."""
    lat = cluster.lat(sender.devices, receiver.devices)
    rate = min(len(sender.devices), len(receiver.devices)) * cluster.bw(sender.devices, receiver.devices)
    return tuple(lat + n * cut_bytes / rate for n in sender.microbatches)


STAGE_CACHE_SIZE = 20_000
"""Stage costs a cache given to :func:`stage_costs` holds before it is cleared (tens of MB)."""


def stage_costs(plan: "Plan", graph: "LayerGraph", cluster: "Cluster", cache: dict | None = None
                ) -> tuple[StageCost, ...]:
    """Per-stage durations, transfer times, waits and memory of a validated plan.

    ``cache`` (a dict the caller keeps for one graph and cluster) remembers each stage's
    cost under everything it depends on: the schedule, the stage count and its position,
    its layers, devices, split and recompute flag, the state factor, and its neighbours'
    devices and splits (its transfers and waits).  Heuristics that move one boundary at a
    time then recompute two stages, not all of them.

    Raises
    ------
    InputError
        For a plan that uses version 2: its costs are per group (:func:`group_costs`).
    """
    plan.require_v1("-", "the per-stage cost table (stage_costs)")
    stages = plan.stages
    count = len(stages)
    if cache is not None and plan.schedule != "custom":
        costs = []
        for s, st in enumerate(stages):
            prev, nxt = (stages[s - 1] if s else None), (stages[s + 1] if s < count - 1 else None)
            key = (plan.schedule, plan.state_factor, count, s, st.layers, st.devices, st.microbatches, st.recompute,
                   prev and (prev.devices, prev.microbatches), nxt and (nxt.devices, nxt.microbatches))
            found = cache.get(key)
            if found is None:
                found = _stage_cost(plan, graph, cluster, s, stage_ops(plan.schedule, len(st.microbatches), s, count))
                if len(cache) >= STAGE_CACHE_SIZE:
                    cache.clear()
                cache[key] = found
            costs.append(found)
        return tuple(costs)
    op_lists = plan.op_lists()
    return tuple(_stage_cost(plan, graph, cluster, s, op_lists[s]) for s in range(count))


def _stage_cost(plan: "Plan", graph: "LayerGraph", cluster: "Cluster", s: int, ops: list) -> StageCost:
    """Stage ``s``'s cost, running ``ops``."""
    stages = plan.stages
    count = len(stages)
    st = stages[s]
    lo, hi = st.layers
    r = len(st.devices)
    devices = [cluster.device_index[d] for d in st.devices]
    speed = min(d.speed for d in devices)
    af, bf, ab, bb = graph.range_time(lo, hi)
    per_replica = tuple(_ceil_div(n, r) for n in st.microbatches)
    fwd = tuple((af + bf * q) / speed for q in per_replica)
    recompute = fwd if st.recompute else tuple(0.0 for _ in per_replica)
    bwd = tuple((ab + bb * q) / speed + rec for q, rec in zip(per_replica, recompute))
    send_fwd = _send_times(st, stages[s + 1], graph.cut_bytes(hi - 1), cluster) if s < count - 1 else ()
    send_bwd = _send_times(st, stages[s - 1], graph.cut_bytes(lo - 1), cluster) if s > 0 else ()
    wait_fwd = _overlaps(st.microbatches, stages[s - 1].microbatches) if s > 0 else ()
    wait_bwd = _overlaps(st.microbatches, stages[s + 1].microbatches) if s < count - 1 else ()
    params = graph.range_sum("params", lo, hi)
    peak = stage_peak_memory(plan.state_factor, params, ops, per_replica,
                             graph.range_sum("act", lo, hi), graph.stage_input_bytes(lo), st.recompute)
    return StageCost(tuple(ops), fwd, bwd, recompute, per_replica, st.microbatches,
                     send_fwd, send_bwd, wait_fwd, wait_bwd, _allreduce(cluster, st.devices, params), peak,
                     min(d.memory for d in devices), graph.range_step(lo, hi) / speed)


def _allreduce(cluster: "Cluster", devices: tuple[str, ...], params: float) -> float:
    """``AR = 2*(r-1) * (lat(D) + P / (r * bw(D)))`` of a ring over ``devices``; 0 for one device."""
    r = len(devices)
    if r < 2:
        return 0.0
    return 2 * (r - 1) * (cluster.lat(devices) + params / (r * cluster.bw(devices)))


def simulate(plan: "Plan", graph: "LayerGraph", cluster: "Cluster", *, file: str = "-",
             validate: bool = True) -> "SimulationResult | GroupSimulationResult":
    """Time and memory of one iteration of ``plan``, exactly as the spec defines them.

    A version-1 plan (one stage per device group, no ``I``/``W``) gives a
    :class:`SimulationResult`; a plan that uses version 2 a
    :class:`GroupSimulationResult` (see :func:`simulate_programs`).

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
    SimulationResult or GroupSimulationResult

    Raises
    ------
    InputError
        If the plan breaks a rule of the spec.
    DeadlockError
        If some op can never start; the message names the stage, the op and what it
        waits for.

    Examples
    --------
    See ``tests/test_simulator.py`` and ``tests/test_simulator_v2.py`` for hand-computed cases.
    """
    if validate:
        plan.validate(graph, cluster, file)
    if plan.v2_features():
        return simulate_programs(plan, graph, cluster, file=file, validate=False)
    costs = stage_costs(plan, graph, cluster)
    return run_timeline(costs, plan.global_batch, file)


def run_timeline(costs: tuple[StageCost, ...], global_batch: int, file: str = "-") -> SimulationResult:
    """The timeline of precomputed stage costs; see :func:`simulate`."""
    count = len(costs)
    ptr = [0] * count  # next op position of each stage
    clock = [0.0] * count  # end of each stage's previous op
    op_times: list[list[tuple[float, float]]] = [[] for _ in range(count)]
    fwd_arrival: list[list[float | None]] = [[None] * len(c.sizes) for c in costs]  # per sending stage
    bwd_arrival: list[list[float | None]] = [[None] * len(c.sizes) for c in costs]  # per sending stage
    fwd_link = [0.0] * count  # when the link after stage s is next free, forward direction
    bwd_link = [0.0] * count  # ... and backward direction
    fwd_tx: list[list[tuple[float, float]]] = [[(0.0, 0.0)] * len(c.sizes) for c in costs[:-1]]
    bwd_tx: list[list[tuple[float, float]]] = [[(0.0, 0.0)] * len(c.sizes) for c in costs[1:]]
    remaining = sum(len(c.ops) for c in costs)
    last = count - 1
    while remaining:
        progressed = 0
        for s in range(count):
            cost = costs[s]
            ops, p, now, times = cost.ops, ptr[s], clock[s], op_times[s]
            incoming_fwd = fwd_arrival[s - 1] if s > 0 else None
            incoming_bwd = bwd_arrival[s + 1] if s < last else None
            while p < len(ops):
                kind, k = ops[p]
                ready = now
                if kind == FORWARD:
                    if incoming_fwd is not None:
                        lo, hi = cost.wait_fwd[k]
                        arrivals = incoming_fwd[lo:hi + 1]
                        if None in arrivals:
                            break
                        ready = max(now, max(arrivals))  # type: ignore[type-var]
                    now = ready + cost.fwd[k]
                    if s < last:
                        t0 = now if now > fwd_link[s] else fwd_link[s]
                        t1 = t0 + cost.send_fwd[k]
                        fwd_link[s] = t1
                        fwd_arrival[s][k] = t1
                        fwd_tx[s][k] = (t0, t1)
                else:
                    if incoming_bwd is not None:
                        lo, hi = cost.wait_bwd[k]
                        arrivals = incoming_bwd[lo:hi + 1]
                        if None in arrivals:
                            break
                        ready = max(now, max(arrivals))  # type: ignore[type-var]
                    now = ready + cost.bwd[k]
                    if s > 0:
                        t0 = now if now > bwd_link[s] else bwd_link[s]
                        t1 = t0 + cost.send_bwd[k]
                        bwd_link[s] = t1
                        bwd_arrival[s][k] = t1
                        bwd_tx[s - 1][k] = (t0, t1)
                times.append((ready, now))
                p += 1
            progressed += p - ptr[s]
            ptr[s], clock[s] = p, now
        if not progressed:
            raise _deadlock(costs, ptr, fwd_arrival, bwd_arrival, file)
        remaining -= progressed
    iteration = max(times[-1][1] + c.allreduce + c.step for c, times in zip(costs, op_times))
    return SimulationResult(iteration, global_batch, costs,
                            tuple(tuple(t) for t in op_times),
                            tuple(tuple(t) for t in fwd_tx), tuple(tuple(t) for t in bwd_tx))


def _blocker(costs, ptr, fwd_arrival, bwd_arrival, s: int) -> tuple[int, str, int]:
    """What stage ``s``'s next op waits for: (sending stage, "F"/"B", its microbatch)."""
    kind, k = costs[s].ops[ptr[s]]
    if kind == FORWARD:
        lo, hi = costs[s].wait_fwd[k]
        j = next(j for j in range(lo, hi + 1) if fwd_arrival[s - 1][j] is None)
        return s - 1, "F", j
    lo, hi = costs[s].wait_bwd[k]
    j = next(j for j in range(lo, hi + 1) if bwd_arrival[s + 1][j] is None)
    return s + 1, "B", j


def _deadlock(costs, ptr, fwd_arrival, bwd_arrival, file: str) -> DeadlockError:
    """Follow the chain of waits from the first stuck stage until it closes a cycle."""
    s = next(i for i, c in enumerate(costs) if ptr[i] < len(c.ops))
    start, chain, visited = s, [], set()
    while s not in visited:
        visited.add(s)
        sender, kind, j = _blocker(costs, ptr, fwd_arrival, bwd_arrival, s)
        what = "activations" if kind == "F" else "gradients"
        op = format_op(costs[s].ops[ptr[s]])
        sender_op = format_op(costs[sender].ops[ptr[sender]]) if ptr[sender] < len(costs[sender].ops) else "end"
        chain.append(f"stage {s} op {op} waits for the {what} of microbatch {j} of stage {sender}, "
                     f"whose {kind}{j} has not run (stage {sender} is stuck at its op {sender_op})")
        s = sender
    where = f"stages[{start}].ops[{ptr[start]}]"
    return DeadlockError(file, where, "deadlock: " + "; ".join(chain))


def check_deadlock_free(plan: "Plan", file: str = "-") -> None:
    """Raise :class:`DeadlockError` if ``plan``'s op lists (or programs) and splits can deadlock.

    Whether a plan deadlocks depends on op orders and splits only, not on durations,
    so this needs neither the graph nor the cluster: it runs the timeline with zero
    costs.
    """
    if plan.v2_features():
        _check_programs_deadlock_free(plan, file)
        return
    op_lists = plan.op_lists()
    stages = plan.stages
    costs = []
    for s, st in enumerate(stages):
        zeros = tuple(0.0 for _ in st.microbatches)
        costs.append(StageCost(
            tuple(op_lists[s]), zeros, zeros, zeros, tuple(st.microbatches), st.microbatches,
            zeros if s < len(stages) - 1 else (), zeros if s > 0 else (),
            _overlaps(st.microbatches, stages[s - 1].microbatches) if s > 0 else (),
            _overlaps(st.microbatches, stages[s + 1].microbatches) if s < len(stages) - 1 else (),
            0.0, 0.0, 0.0))
    run_timeline(tuple(costs), plan.global_batch, file)


# --------------------------------------------------------------------- version 2
# Device groups run programs of actions (spec 7.3).  The sweep is the one above, over
# groups instead of stages: a group advances through its program while each action's
# inputs have arrived; local hand-overs arrive when the producing action ends; every
# ordered pair of groups has one FIFO link, which a group fills in its program order.

WEIGHT, INPUT = "W", "I"


@dataclass(frozen=True)
class GroupCost:
    """Everything the timing of one device group needs, precomputed from plan, graph and cluster."""

    devices: tuple[str, ...]
    """The group's devices (as the first stage on it lists them)."""
    stages: tuple[int, ...]
    """The stages it holds, in stage order."""
    program: tuple[tuple[int, str, int], ...]
    """Its actions ``(stage, kind, microbatch)`` in program order."""
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
    """How one stage's outputs travel and what its actions wait for."""

    send_fwd: tuple[float, ...]
    """Seconds of each microbatch's forward transfer to the next stage (0 for a local hand-over; empty on the last)."""
    send_bwd: tuple[float, ...]
    """Seconds of each microbatch's backward transfer to the previous stage (0 if local; empty on the first)."""
    fwd_link: tuple[int, int] | None
    """``(sender group, receiver group)`` of its forward transfers; ``None`` if local or last."""
    bwd_link: tuple[int, int] | None
    """``(sender group, receiver group)`` of its backward transfers; ``None`` if local or first."""
    wait_fwd: tuple[tuple[int, int], ...]
    """Inclusive range of previous-stage microbatches each forward waits for."""
    wait_bwd: tuple[tuple[int, int], ...]
    """Inclusive range of next-stage microbatches each backward (``B`` or ``I``) waits for."""
    sizes: tuple[int, ...]
    """``n_k``: the samples of each microbatch (what a transfer carries)."""


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


def _sync_events(group: int, end: float, allreduce: float, step: float) -> list[SyncEvent]:
    """The all-reduce, then the optimizer step, of a group whose last action ends at ``end``."""
    events = []
    if allreduce > 0:
        events.append(SyncEvent(group, "allreduce", end, end + allreduce))
    if step > 0:
        events.append(SyncEvent(group, "step", end + allreduce, end + allreduce + step))
    return events


@dataclass(frozen=True)
class GroupSimulationResult(_CostReport):
    """What a plan of device groups running programs costs (spec 7.3 and 7.4).

    It answers the questions :class:`SimulationResult` answers, per group: a group is
    the unit that runs one action at a time, holds memory and synchronises.
    """

    iteration_time: float
    """``T``: seconds per iteration."""
    global_batch: int
    """Samples per iteration."""
    groups: tuple[GroupCost, ...]
    """Per-group costs the timeline was computed from."""
    action_times: tuple[tuple[tuple[float, float], ...], ...]
    """``(start, end)`` of each group's actions, in program order."""
    transfers: tuple[TransferEvent, ...]
    """Every transfer over a link between groups, in the order they were sent."""

    @property
    def _units(self) -> tuple[GroupCost, ...]:
        return self.groups

    def _memory_owner(self, i: int) -> tuple[str, str]:
        return f"stages[{self.groups[i].stages[0]}]", f"group {i}'s"

    @cached_property
    def busy(self) -> tuple[float, ...]:
        """Seconds each group spends running actions."""
        return tuple(sum(g.durations) for g in self.groups)

    @property
    def group_end(self) -> tuple[float, ...]:
        """When each group is done: its last action's end plus ``AR_g`` and ``STEP_g``."""
        return tuple(times[-1][1] + g.allreduce + g.step for g, times in zip(self.groups, self.action_times))

    @cached_property
    def ops(self) -> tuple[OpEvent, ...]:
        """Every action, group by group, in program order."""
        return tuple(OpEvent(s, kind, k, q, start, end, rec, gi)
                     for gi, (g, times) in enumerate(zip(self.groups, self.action_times))
                     for (s, kind, k), q, rec, (start, end) in zip(g.program, g.samples, g.recompute, times))

    @cached_property
    def syncs(self) -> tuple[SyncEvent, ...]:
        """Each group's all-reduce and optimizer step, where they take time."""
        events = []
        for gi, (g, times) in enumerate(zip(self.groups, self.action_times)):
            events += _sync_events(gi, times[-1][1], g.allreduce, g.step)
        return tuple(events)



def group_costs(plan: "Plan", graph: "LayerGraph", cluster: "Cluster",
                programs: list[list[tuple[int, str, int]]]) -> tuple[tuple[GroupCost, ...], tuple[StageLinks, ...]]:
    """Per-group durations, all-reduce, step and memory, and per-stage links, of a validated plan."""
    stages = plan.stages
    keys = [frozenset(devices) for devices in plan.groups]
    stage_group = [keys.index(frozenset(st.devices)) for st in stages]
    links = tuple(_stage_links(plan, graph, cluster, s, stage_group) for s in range(len(stages)))
    groups = []
    for gi, devices in enumerate(plan.groups):
        held = tuple(s for s, g in enumerate(stage_group) if g == gi)
        groups.append(_group_cost(plan, graph, cluster, devices, held, programs[gi]))
    return tuple(groups), links


def _stage_links(plan: "Plan", graph: "LayerGraph", cluster: "Cluster", s: int,
                 stage_group: list[int]) -> StageLinks:
    stages = plan.stages
    st, last = stages[s], len(stages) - 1
    lo, hi = st.layers
    send_fwd: tuple[float, ...] = ()
    send_bwd: tuple[float, ...] = ()
    fwd_link = bwd_link = None
    if s < last:
        if stage_group[s + 1] == stage_group[s]:
            send_fwd = tuple(0.0 for _ in st.microbatches)
        else:
            send_fwd = _send_times(st, stages[s + 1], graph.cut_bytes(hi - 1), cluster)
            fwd_link = (stage_group[s], stage_group[s + 1])
    if s > 0:
        if stage_group[s - 1] == stage_group[s]:
            send_bwd = tuple(0.0 for _ in st.microbatches)
        else:
            send_bwd = _send_times(st, stages[s - 1], graph.cut_bytes(lo - 1), cluster)
            bwd_link = (stage_group[s], stage_group[s - 1])
    wait_fwd = _overlaps(st.microbatches, stages[s - 1].microbatches) if s > 0 else ()
    wait_bwd = _overlaps(st.microbatches, stages[s + 1].microbatches) if s < last else ()
    return StageLinks(send_fwd, send_bwd, fwd_link, bwd_link, wait_fwd, wait_bwd, st.microbatches)


def _group_cost(plan: "Plan", graph: "LayerGraph", cluster: "Cluster", devices: tuple[str, ...],
                held: tuple[int, ...], program: list[tuple[int, str, int]]) -> GroupCost:
    r = len(devices)
    found = [cluster.device_index[d] for d in devices]
    speed = min(d.speed for d in found)
    per_stage = {s: _action_times(plan.stages[s], graph, r, speed) for s in held}
    durations, recompute, samples = [], [], []
    for s, kind, k in program:
        times, rec, q = per_stage[s]
        durations.append(times[kind][k])
        recompute.append(rec[k] if kind in (BACKWARD, INPUT) else 0.0)
        samples.append(q[k])
    params = sum(graph.range_sum("params", *plan.stages[s].layers) for s in held)
    step = sum(graph.range_step(*plan.stages[s].layers) for s in held) / speed
    peak = group_peak_memory(plan.state_factor, params, program, {s: _stage_memory(plan, graph, s, r) for s in held})
    return GroupCost(tuple(devices), held, tuple(program), tuple(durations), tuple(recompute), tuple(samples),
                     _allreduce(cluster, devices, params), step, peak, min(d.memory for d in found))


def _action_times(st: "Stage", graph: "LayerGraph", r: int, speed: float
                  ) -> tuple[dict[str, tuple[float, ...]], tuple[float, ...], tuple[int, ...]]:
    """``({kind: duration per microbatch}, recompute per microbatch, samples per replica)`` of a stage."""
    lo, hi = st.layers
    af, bf, ab, bb = graph.range_time(lo, hi)
    aw, bw = graph.range_weight_time(lo, hi)
    q = tuple(_ceil_div(n, r) for n in st.microbatches)
    fwd = tuple((af + bf * n) / speed for n in q)
    rec = fwd if st.recompute else tuple(0.0 for _ in q)
    times = {
        FORWARD: fwd,
        BACKWARD: tuple((ab + bb * n) / speed + x for n, x in zip(q, rec)),
        INPUT: tuple(((ab - aw) + (bb - bw) * n) / speed + x for n, x in zip(q, rec)),
        WEIGHT: tuple((aw + bw * n) / speed for n in q),
    }
    return times, rec, q


def _stage_memory(plan: "Plan", graph: "LayerGraph", s: int, r: int) -> StageMemory:
    st = plan.stages[s]
    lo, hi = st.layers
    act = graph.range_sum("act", lo, hi)
    stash = graph.stage_input_bytes(lo) if st.recompute else act
    return StageMemory(tuple(_ceil_div(n, r) for n in st.microbatches), stash,
                       act if st.recompute else 0.0, graph.range_act_weight(lo, hi))


def simulate_programs(plan: "Plan", graph: "LayerGraph", cluster: "Cluster", *, file: str = "-",
                      validate: bool = True) -> GroupSimulationResult:
    """Time and memory of one iteration of a plan of device groups running programs (spec 7.3, 7.4).

    Any plan may be given (a version-1 plan is one group per stage, each program its
    stage's op list); :func:`simulate` sends version-2 plans here.

    Parameters
    ----------
    plan, graph, cluster
        The plan and what it runs on.
    file : str
        The plan's file, for error messages.
    validate : bool
        Check the plan against the graph and cluster first.

    Returns
    -------
    GroupSimulationResult

    Raises
    ------
    InputError
        If the plan breaks a rule of the spec.
    DeadlockError
        If some action can never start; the message names the group, the action and
        what it waits for.

    Examples
    --------
    See ``tests/test_simulator_v2.py`` for hand-computed cases.
    """
    if validate:
        plan.validate(graph, cluster, file)
    groups, links = group_costs(plan, graph, cluster, plan.actions())
    return run_programs(groups, links, plan.global_batch, file)


def run_programs(groups: tuple[GroupCost, ...], links: tuple[StageLinks, ...], global_batch: int,
                 file: str = "-") -> GroupSimulationResult:
    """The timeline of precomputed group costs; see :func:`simulate_programs`."""
    count, last = len(groups), len(links) - 1
    ptr = [0] * count
    clock = [0.0] * count
    times: list[list[tuple[float, float]]] = [[] for _ in range(count)]
    fwd_arrival: list[list[float | None]] = [[None] * len(lk.sizes) for lk in links]  # per sending stage
    bwd_arrival: list[list[float | None]] = [[None] * len(lk.sizes) for lk in links]
    link_free: dict[tuple[int, int], float] = {}
    transfers: list[TransferEvent] = []
    remaining = sum(len(g.program) for g in groups)
    while remaining:
        progressed = 0
        for gi in range(count):
            group = groups[gi]
            program, p, now, done = group.program, ptr[gi], clock[gi], times[gi]
            while p < len(program):
                s, kind, k = program[p]
                lk = links[s]
                ready = now
                if kind == FORWARD:
                    if s > 0:
                        lo, hi = lk.wait_fwd[k]
                        arrivals = fwd_arrival[s - 1][lo:hi + 1]
                        if None in arrivals:
                            break
                        ready = max(now, max(arrivals))  # type: ignore[type-var]
                    now = ready + group.durations[p]
                    if s < last:
                        fwd_arrival[s][k] = _send(now, lk.send_fwd[k], lk.fwd_link, link_free, transfers,
                                                  s, "fwd", k, lk.sizes[k])
                elif kind == WEIGHT:
                    now = ready + group.durations[p]
                else:
                    if s < last:
                        lo, hi = lk.wait_bwd[k]
                        arrivals = bwd_arrival[s + 1][lo:hi + 1]
                        if None in arrivals:
                            break
                        ready = max(now, max(arrivals))  # type: ignore[type-var]
                    now = ready + group.durations[p]
                    if s > 0:
                        bwd_arrival[s][k] = _send(now, lk.send_bwd[k], lk.bwd_link, link_free, transfers,
                                                  s - 1, "bwd", k, lk.sizes[k])
                done.append((ready, now))
                p += 1
            progressed += p - ptr[gi]
            ptr[gi], clock[gi] = p, now
        if not progressed:
            raise _program_deadlock(groups, links, ptr, fwd_arrival, bwd_arrival, file)
        remaining -= progressed
    iteration = max(done[-1][1] + g.allreduce + g.step for g, done in zip(groups, times))
    return GroupSimulationResult(iteration, global_batch, groups, tuple(tuple(t) for t in times), tuple(transfers))


def _send(end: float, duration: float, link: tuple[int, int] | None, link_free: dict[tuple[int, int], float],
          transfers: list[TransferEvent], cut: int, direction: str, k: int, samples: int) -> float:
    """The arrival of what an action ending at ``end`` sends: at once if local, else after its FIFO link."""
    if link is None:
        return end
    free = link_free.get(link, 0.0)
    start = end if end > free else free
    arrival = start + duration
    link_free[link] = arrival
    transfers.append(TransferEvent(cut, direction, k, samples, start, arrival, link))
    return arrival


def _program_blocker(groups, links, ptr, fwd_arrival, bwd_arrival, gi: int) -> tuple[int, str, int]:
    """What group ``gi``'s next action waits for: (sending stage, "F" or "B", its microbatch)."""
    s, kind, k = groups[gi].program[ptr[gi]]
    if kind == FORWARD:
        lo, hi = links[s].wait_fwd[k]
        return s - 1, FORWARD, next(j for j in range(lo, hi + 1) if fwd_arrival[s - 1][j] is None)
    lo, hi = links[s].wait_bwd[k]
    return s + 1, BACKWARD, next(j for j in range(lo, hi + 1) if bwd_arrival[s + 1][j] is None)


def _program_deadlock(groups, links, ptr, fwd_arrival, bwd_arrival, file: str) -> DeadlockError:
    """Follow the chain of waits from the first stuck group until it closes a cycle."""
    owner = {s: gi for gi, g in enumerate(groups) for s in g.stages}
    gi = next(i for i, g in enumerate(groups) if ptr[i] < len(g.program))
    start, chain, visited = gi, [], set()
    while gi not in visited:
        visited.add(gi)
        sender, kind, j = _program_blocker(groups, links, ptr, fwd_arrival, bwd_arrival, gi)
        what, made_by = ("activations", "F") if kind == FORWARD else ("gradients", "B or I")
        action = format_action(Action(*groups[gi].program[ptr[gi]]))
        h = owner[sender]
        stuck = format_action(Action(*groups[h].program[ptr[h]])) if ptr[h] < len(groups[h].program) else "its end"
        chain.append(f"group {gi} action {action} waits for the {what} of microbatch {j} of stage {sender}, "
                     f"whose {made_by} has not run (group {h} is stuck at {stuck})")
        gi = h
    return DeadlockError(file, f"programs[{start}][{ptr[start]}]", "deadlock: " + "; ".join(chain))


def _check_programs_deadlock_free(plan: "Plan", file: str) -> None:
    """:func:`check_deadlock_free` for a version-2 plan: its programs timed at zero cost.

    A FIFO link always frees, so it cannot close a cycle: every hand-over is taken as local.
    """
    stages, programs, stage_group = plan.stages, plan.actions(file), plan.stage_groups
    groups = []
    for gi, (devices, program) in enumerate(zip(plan.groups, programs)):
        zeros = tuple(0.0 for _ in program)
        held = tuple(s for s, g in enumerate(stage_group) if g == gi)
        groups.append(GroupCost(devices, held, tuple(program), zeros, zeros, tuple(0 for _ in program),
                                0.0, 0.0, 0.0, 0.0))
    links = []
    for s, st in enumerate(stages):
        zeros = tuple(0.0 for _ in st.microbatches)
        last = len(stages) - 1
        links.append(StageLinks(zeros if s < last else (), zeros if s > 0 else (), None, None,
                                _overlaps(st.microbatches, stages[s - 1].microbatches) if s > 0 else (),
                                _overlaps(st.microbatches, stages[s + 1].microbatches) if s < last else (),
                                st.microbatches))
    run_programs(tuple(groups), tuple(links), plan.global_batch, file)
