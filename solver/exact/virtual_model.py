"""A model of every version-2 plan with ``R`` groups: its optimum bounds them all (:func:`virtual_model_bound`).

One model per group count ``R`` the schedule takes (``v`` fixed: the problem's ``virtual_stages``, or 2
for ``zbv``), with the rows of :func:`build_rows`; the bound over the whole space is the smallest of the
``R`` models' bounds, never below :func:`pipeplan.solver.bounds.virtual_bound.space_bound`.  Each model is
asked whether a plan reaches a target time (:mod:`pipeplan.solver.exact.virtual_targets`): first by its
linear relaxation with capacity rows, then, for the group count with the smallest bound, as a MILP by
HiGHS (``ilp``) or as a CP-SAT model (``cpsat``).

Notation (spec 7.3, as :mod:`pipeplan.solver.bounds.virtual_bound`): ``S = R v`` stages, stage
``s`` on group ``g(s)`` (:func:`pipeplan.solver.schedules.schedule.stage_group`); ``TF_s(k)``,
``A_s(k)`` (``TB``, or ``TI`` under a split schedule), ``Z_s(k)`` (``TW`` or 0); ``k*`` the
smallest microbatch.  ``W_g = sum over g's stages and k of (TF + A + Z)``; ``AR_g + STEP_g`` its
all-reduce and step.

Group types.  A group's slowest device belongs to some device class ``c`` (speed ``v_c``,
memory ``m_c``); all its ``r`` devices have speed ``>= v_c``.  As in
:mod:`pipeplan.solver.bounds.class_bound`, a group of ``r`` devices is replaced by the
smallest ``r' <= r`` with the same ``q_k = ceil(n_k / r)`` for every ``k``: its times are
equal, its all-reduce and device use not larger.  A *type* ``tau = (c, r')``: every time below
is computed with speed ``v_c``; the all-reduce is at least
``2 (r - 1) (lat_lb + P_g / (r bw_ub))``, ``bw_ub`` the largest and ``lat_lb`` the smallest over
the network and the servers holding ``r`` devices of speed ``>= v_c`` (the group is inside one of
them, or a pair crosses the network).  Recompute only lengthens actions and is left out.

Variables (a real plan gives each its value).  ``z[p, tau]``: group ``p`` has type ``tau``
(one per group).  ``e[l, s]`` in ``[0, 1]``: layer ``l`` lies in stage ``s`` or later (1 for
``s = 0``, 0 for ``s = S``; non-increasing in ``s``, non-decreasing in ``l``; layer 0 in stage 0,
layer ``L-1`` in stage ``S-1``; every stage holds at least one layer:
``sum_l d[l, s] >= 1`` with ``d[l, s] = e[l, s] - e[l, s+1]``).  ``F_s >= TF_s(k*)``,
``B_s >= A_s(k*)``, ``R[g, s] >=`` the work of ``g`` not among the forwards of its stages
before ``s``, ``Y_g >= AR_g + STEP_g``: each as ``>=`` its linear form in ``d`` for the type
``tau`` minus ``M (1 - z[p, tau])`` (``M`` the form's value over every layer, so the row is
void for another type).  Devices: for each class ``k``, the groups whose type has speed
``>= v_k`` use at most ``N_k`` (devices of speed ``>= v_k``): ``sum r' z <= N_k``.  Memory:
the group's state ``state_factor * P_g`` fits its type's memory.

Rows on ``T`` (every plan with ``R`` groups and ``v`` satisfies them):

1. ``T >= sum_{t < s} F_t + R[g(s), s] + Y_{g(s)}`` for every stage ``s``.  Every action of
   group ``g = g(s)`` but the forwards of its stages before ``s`` waits for some microbatch to
   reach stage ``s``: a forward of a stage ``s' >= s`` for the forwards of stages ``0 .. s'-1``,
   a backward (``B``, ``I``) of any stage for the whole forward pass, a ``W`` for its ``I``.
   Microbatch ``k`` reaches stage ``s`` no earlier than ``sum_{t < s} TF_t(k) >= sum_{t < s}
   F_t`` (and the transfers of row 5).  The group runs those actions one at a time, then
   all-reduces and steps.
2. Whole backwards (``interleaved-1f1b``, ``looped-bfs``): ``T >= sum_{t < s} F_t + R[g, s] +
   sum_{t < s_g} B_t + Y_{g(0)}`` for every stage ``s`` on ``g``, ``s_g`` the first stage of
   ``g``.  ``g``'s last action is a ``B`` (each ``F`` on ``g`` has its ``B`` on ``g``, later) of
   some stage ``s' >= s_g`` and microbatch ``k``; ``B_{s'-1}(k) .. B_0(k)`` follow it one after
   another, then group ``g(0)``'s all-reduce and step.  (Under a split schedule the last action
   may be a ``W``: no such row.)

3. *Program pivot.* For each stage ``s`` of group ``p``, take the first backward (``B`` or ``I``) of ``s`` in
   ``p``'s program (``Schedule.programs``), of some microbatch ``k``: ``T >= sum_t F_t + sum_{t > s} B_t +``
   the durations of every action of ``p``'s program from it on ``+ Y_p``.  Microbatch ``k``'s forwards
   through every stage and its backwards above ``s`` come before that backward, the rest of the program
   after it, one action at a time, then ``p``'s all-reduce and step.  With whole backwards and ``s_p > 0``,
   the row also holds with ``sum_{t < s_p} B_t + Y_{g(0)}`` in place of ``Y_p``, as row 2.
4. *The programs' critical paths* (:func:`program_rows`; the MILP form only).  A column ``t_a >= 0`` per
   action ``a`` of the programs, with ``t_b >= t_a + dur_a`` when ``b`` follows ``a`` in its group's program,
   and when ``b`` waits for ``a`` (spec 7.3: ``F`` of stage ``s`` for ``F`` of ``s-1``, a backward of ``s``
   for the backward of ``s+1``, the last stage's backward for its own ``F``, a ``W`` for its ``I``), and
   ``T >= t_a + dur_a + Y_p`` for the last action ``a`` of each program ``p``.  ``dur_a`` is ``F_s``,
   ``B_s`` or ``Z_s`` of its stage.  A real plan satisfies these rows with ``t_a`` its actions' start times:
   each action starts no earlier than the end of the one before it in its program and than the end of the
   action whose output it waits for (plus, across a cut, row 5's transfer; a FIFO link only delays it), every real
   duration is at least the model's (smallest microbatch, smallest unit values, recompute left out), and
   each group ends with its all-reduce and step.  So ``T`` is at least the longest path through the
   programs with the model's durations: for a fixed plan without transfers, all-reduce or recompute, with
   equal layers and microbatches, that path is the simulated iteration time itself.  Rows 1 to 3 are paths
   of this graph; they stay for the CP-SAT form, which does not take row 4: on bench_solvers' 16 x 4
   instance, minimising ``T`` with 60 s, CP-SAT with row 4 left one of the 4 group counts unproved under
   every version-2 schedule, and its bounds were 0.3 % to 5.4 % lower than without row 4 on 4 of the 5
   schedules.

5. *Transfers* (:func:`hop_columns`, :func:`transfer_times`).  A column ``H_c >= 0`` per cut ``c`` between
   stages on two groups ``g`` and ``h``, at least the shortest transfer between groups of their types (either
   way; two stages of one group hand over without one): for each type ``i`` of ``g``,
   ``H_c >= sum_j X[i, j] z[h, j] - max_j X[i, j] (1 - z[g, i])``, and the same with ``g`` and ``h`` swapped.
   Every chain of rows 1 to 4 that passes a cut waits for that transfer (the receiving action waits for its
   arrival, spec 7.3): row 1 adds ``H_t`` for the cuts before ``s``, row 2 those before ``s_g``, row 3
   every cut forward and those from ``s`` on backward, and in row 4 a wait across a cut adds its ``H_c``.
   Where groups of two types cannot share a server (servers of one device class each), the network's
   bandwidth sets ``X``: on bench_solvers' 64 x 16 instance, 2.6 ms against 0.1 ms on NVLink, for each
   microbatch's every hop between a fast and a slow group.

Rows 1 and 2 are the fill and drain of the schedule: for equal stages on equal groups, row 1 at
the last group's first stage is ``(R - 1)`` stage forwards plus the group's work, the
interleaved-1F1B bubble ``(R - 1) (TF + TB)`` with row 2.  So a real plan's values satisfy
every row with its own ``T``, and the model's optimum (or a solver's proved lower bound on it)
is at most the optimum over every plan with ``R`` groups and ``v``.  Fractional ``e`` (layers
split between stages) only widens the model.  The CP-SAT form is integral (``e``
binary: a real plan's cuts) with every coefficient rounded down to units of
:data:`CPSAT_UNIT` seconds (each form's value in units is at most the real one's, as every
``d >= 0``); its bound is lowered by one unit for ``T``'s own rounding.  The float sums are
lowered by :data:`ROUNDING_MARGIN`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from pipeplan.solver.bounds.virtual_bound import space_bound
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.native_output import quiet_stdout
from pipeplan.solver.core.termination import TimeLimit
from pipeplan.solver.exact.linear import LinearModel
from pipeplan.solver.exact.virtual_targets import TargetLP, set_target, target_bound
from pipeplan.solver.schedules.programs import Action
from pipeplan.solver.schedules.schedule import num_stages, stage_group
from pipeplan.solver.space.class_stages import q_classes
from pipeplan.solver.space.device_classes import device_classes
from pipeplan.solver.space.virtual_space import group_counts, schedule_accepts

ROUNDING_MARGIN = 1e-9
"""Relative amount a model's bound is lowered by: its sums run in another order than the simulator's."""

CPSAT_UNIT = 1e-7
"""Seconds per integer unit of the CP-SAT form (0.1 us: a bound of 0.3 s is 3 million units)."""

NODES_PER_MODEL = 2_000
"""HiGHS branch-and-bound nodes per model solve (the MILP form's counted work)."""

DETERMINISTIC_PER_MODEL = 4.0
"""CP-SAT deterministic seconds per model solve (the CP-SAT form's counted work)."""

TARGET_STEP = 0.02
"""How far above a group count's bound the model is asked to rule out plans, relative; halved when it does not."""

MIN_TARGET_STEP = 0.0025
"""The smallest step tried: below it, the group count's bound is left as it is."""

MAX_TARGET_STEP = 0.04
"""The largest step: a target proved doubles the group count's step up to this.  On bench_solvers' 64 x 16
instance (``looped-bfs``, the model alone for 60 s) the bound reached 218.6 ms with 4 %, 215.0 ms with 8 % and
16 %: a larger step's proof takes longer (17 s for 8 % at 7 groups), and the clock cuts the last one.  With two
threads (:data:`MODEL_THREADS`, 2026-12-03), a first step of 4 % and a largest of 8 % raised ``looped-bfs`` to
226.4 ms (223.0 ms with 2 % and 4 %) but lowered ``interleaved-zb`` to 190.6 ms (200.3) and ``zbv`` to 203.7 ms
(207.8); 8 % and 16 % gave 218.3 ms on ``looped-bfs``."""

LP_REACH = 0.16
"""How far above its bound, relative, a capped group count's target LPs go on when its bound is the smallest:
four of the model's largest steps.  Further would spend LPs on bounds the model does not reach in the limit (on
64 x 16, ``interleaved-1f1b`` with ``v = 4``, a bisection up to the plan took 3 to 4 s for each of 9 to 16
groups)."""

MAX_COLUMNS = 100_000
"""Most unit-stage-type columns one model may have; a group count beyond it is not modelled (the answer is then
incomplete), so that building a model never takes long on a large cluster."""

MODEL_THREADS = 2
"""Solves run at once, one per thread (HiGHS and CP-SAT release the GIL while they solve).  A round of steps
ends when every one of them has, so the answers do not depend on which finishes first; the number is fixed,
not read from the machine, so that the same inputs give the same bound anywhere the clock does not cut.  Two,
the cores of the machine the benchmarks run on: on bench_solvers' 64 x 16 instance (``looped-bfs``, the model
alone for 60 s, the 2-core machine otherwise idle, 2026-12-03) the bound is 215.3 ms with one thread and one
step a round, 221.6 ms with two threads and one step each, 223.0 ms with two steps each
(:data:`STEPS_PER_THREAD`); one thread reaches 223.6 ms in 120 s."""

STEPS_PER_THREAD = 2
"""Steps a round takes per thread.  The threads take them in order, each as it ends its last, so that one long
solve does not leave the other threads idle until the round ends: with one step per thread, solves of 0.3 to
13 s made a thread wait 25 s of the 60 s above.  Two and three steps per thread gave the same bound there
(223.0 ms; the measurement of :data:`MODEL_THREADS`)."""

BACKENDS = ("milp", "cpsat")


@dataclass(frozen=True)
class GroupType:
    """A class of the group's slowest device and the fewest replicas with the group's ``q`` vector."""

    speed: float
    """``v_c``: every time is computed at this speed."""
    memory: float
    """``m_c``: the group's smallest memory is at most this."""
    replicas: int
    """``r'``."""
    qs: tuple[int, ...]
    """``q_k = ceil(n_k / r')`` per microbatch."""
    lat: float
    """Smallest all-reduce latency the group can have."""
    bw: float
    """Largest all-reduce bandwidth the group can have."""
    most: int = 0
    """The largest replica count with the same ``q`` vector (``r_hi``): the group's own ``r`` is at most this."""
    servers: frozenset[str] = frozenset()
    """Servers holding a device of the class (the group's slowest device is on one of them)."""


def group_types(problem: PlanningProblem) -> list[GroupType]:
    """Every :class:`GroupType` of the problem (one replica each without ``allow_replication``)."""
    classes = device_classes(problem.cluster)
    servers = {s.id: s for s in problem.cluster.servers}
    net = problem.cluster.network
    types = []
    for c in classes:
        faster = [d for d in problem.cluster.devices if d.speed >= c.speed]
        most = len(faster) if problem.allow_replication else 1
        for r, r_hi, qs in q_classes(problem.split, most):
            # one server holds the whole group only if it holds its slowest device (of class c) too
            own = {server for server, _ in c.ids_by_server}
            links = [net] + [servers[s] for s in servers
                             if s in own and sum(1 for d in faster if d.server == s) >= r]
            types.append(GroupType(c.speed, c.memory, r, qs, min(l.latency for l in links),
                                   max(l.bandwidth for l in links), r_hi, frozenset(own)))
    return types


def transfer_times(problem: PlanningProblem, types: list[GroupType]) -> np.ndarray:
    """``[i, j]``: a lower bound on any transfer between a group of type ``i`` and one of type ``j`` (either way).

    Spec 7.3: a transfer of ``n`` samples across a cut takes ``lat(X, Y) + n cut / (min(r_X, r_Y) bw(X, Y))``.
    Here ``n >= n_min`` (the smallest microbatch), ``cut >=`` the smallest ``cut_bytes`` of any layer, and
    ``min(r_X, r_Y) <= min(most_i, most_j)``.  Unless one server holds both groups, some pair of their devices
    talks over the network (``bw <=`` the network's, ``lat >=`` its); a server holds both only if it holds a
    device of each type's class and ``r_i + r_j`` devices.  So ``bw(X, Y)`` is at most the largest, and
    ``lat(X, Y)`` at least the smallest, over the network and such servers.
    """
    graph = problem.graph
    cut = min((graph.cut_bytes(l) for l in range(len(graph) - 1)), default=0.0)
    samples = min(problem.split)
    held = {s.id: 0 for s in problem.cluster.servers}
    for d in problem.cluster.devices:
        held[d.server] = held.get(d.server, 0) + 1
    servers = {s.id: s for s in problem.cluster.servers}
    net = problem.cluster.network
    out = np.zeros((len(types), len(types)))
    for i, a in enumerate(types):
        for j, b in enumerate(types):
            links = [net] + [servers[s] for s in a.servers & b.servers
                             if s in servers and held[s] >= a.replicas + b.replicas]
            bw, lat = max(l.bandwidth for l in links), min(l.latency for l in links)
            pair = max(1, min(a.most or a.replicas, b.most or b.replicas))
            out[i, j] = lat + samples * cut / (pair * bw) if cut > 0 else lat
    return out


UNITS = 6
"""Buckets the layers other than the first and the last are sorted into (by per-sample work)."""


@dataclass(frozen=True)
class Unit:
    """Layers the model treats alike: each quantity is the smallest over them, so every time the model
    gives a unit's layer is at most that layer's own."""

    layers: tuple[int, ...]
    """The graph's layers in it."""
    af: float
    bf: float
    ab: float
    bb: float
    aw: float
    """Weight-gradient ``a_w`` (0 for a schedule of whole backwards)."""
    bw: float
    params: float
    step: float


def layer_units(problem: PlanningProblem, count: int = UNITS) -> list[Unit]:
    """The first layer, the last layer, and the others in ``count`` buckets of similar ``b_f + b_b``."""
    layers = problem.graph.layers
    split = problem.needs.split_backward

    def unit(ids: list[int]) -> Unit:
        ls = [layers[i] for i in ids]
        w = [l.weight_bwd if split else (0.0, 0.0) for l in ls]
        return Unit(tuple(ids), min(l.fwd[0] for l in ls), min(l.fwd[1] for l in ls),
                    min(l.bwd[0] - x[0] for l, x in zip(ls, w)) + min(x[0] for x in w),
                    min(l.bwd[1] - x[1] for l, x in zip(ls, w)) + min(x[1] for x in w),
                    min(x[0] for x in w), min(x[1] for x in w),
                    min(l.params for l in ls), min(l.step_time for l in ls))

    if len(layers) == 1:
        return [unit([0])]
    middle = sorted(range(1, len(layers) - 1), key=lambda i: (layers[i].fwd[1] + layers[i].bwd[1], i))
    buckets = [middle[len(middle) * j // count:len(middle) * (j + 1) // count] for j in range(count)]
    return [unit([0])] + [unit(b) for b in buckets if b] + [unit([len(layers) - 1])]


@dataclass
class Coefficients:
    """Per type (rows) and unit (columns): one layer's terms in the linear forms of the module docstring."""

    forward: np.ndarray
    """``TF(k*)``."""
    backward: np.ndarray
    """``A(k*)``."""
    weight: np.ndarray
    """``Z(k*)``."""
    forward_all: np.ndarray
    """``sum_k TF(k)``."""
    work: np.ndarray
    """``sum_k (TF + A + Z)``."""
    tail: np.ndarray
    """The layer's share of ``AR + STEP``."""
    tail_const: np.ndarray
    """Per type: ``2 (r - 1) lat``."""
    state: np.ndarray
    """Per unit: ``state_factor * params``."""
    sizes: np.ndarray
    """Per unit: its layers."""
    transfer: np.ndarray | None = None
    """Per pair of types: the shortest transfer between two groups of those types (:func:`transfer_times`)."""


MILLI = 1e3
"""Milliseconds per second: the target LPs and MILPs take their times in milliseconds, for HiGHS's tolerances."""


def in_milliseconds(co: Coefficients) -> Coefficients:
    """``co`` with every time in milliseconds (states and sizes as they are)."""
    names = ("forward", "backward", "weight", "forward_all", "work", "tail", "tail_const") \
        + (("transfer",) if co.transfer is not None else ())
    return replace(co, **{name: getattr(co, name) * MILLI for name in names})


def coefficients(problem: PlanningProblem, types: list[GroupType], units: list[Unit]) -> Coefficients:
    """The :class:`Coefficients` of ``types`` over ``units``."""
    small = int(np.argmin(problem.split))
    shape = (len(types), len(units))
    fwd, back, weight, fwd_all, work, tail = (np.zeros(shape) for _ in range(6))
    for i, t in enumerate(types):
        q = np.array(t.qs, dtype=float)
        r = t.replicas
        for j, u in enumerate(units):
            weight[i, j] = (u.aw + u.bw * q[small]) / t.speed
            # A = TB - TW (whole backwards: aw = bw = 0); the unit's ab, bb are at most every layer's
            fwd[i, j] = (u.af + u.bf * q[small]) / t.speed
            back[i, j] = ((u.ab - u.aw) + (u.bb - u.bw) * q[small]) / t.speed
            fwd_all[i, j] = float(np.sum(u.af + u.bf * q)) / t.speed
            work[i, j] = float(np.sum(u.af + u.ab + (u.bf + u.bb) * q)) / t.speed
            tail[i, j] = (2 * (r - 1) * u.params / (r * t.bw) if r > 1 else 0.0) + u.step / t.speed
    const = np.array([2 * (t.replicas - 1) * t.lat for t in types])
    state = np.array([problem.state_factor * u.params for u in units])
    return Coefficients(fwd, back, weight, fwd_all, work, tail, const, state,
                        np.array([len(u.layers) for u in units]), transfer_times(problem, types))


def build_rows(problem: PlanningProblem, groups: int, virtual: int, types: list[GroupType],
               co: Coefficients, unit: float | None = None, paths: bool = True,
               capacity: bool = False) -> LinearModel:
    """The model of the module docstring for ``groups`` groups of ``virtual`` stages each.

    With ``unit`` (seconds), every time coefficient and constant is rounded down to a whole number of
    units and the state bytes to whole millionths of the graph's state (the integral CP-SAT form):
    each linear form's value for a real plan only drops, so the plan stays feasible.  ``paths`` adds
    row 4 (:func:`program_rows`); with ``unit`` its start columns are whole units, which a real plan's
    start times rounded down satisfy (``floor(x + y) >= floor(x) + floor(y)``).  ``capacity`` adds the
    capacity row of each group and type (:mod:`pipeplan.solver.exact.virtual_targets`), its ``z`` entry in
    :attr:`LinearModel.target_terms`.
    """
    schedule = problem.schedule
    S = num_stages(schedule, groups, virtual)
    owner = [stage_group(schedule, s, groups) for s in range(S)]
    first = [min(s for s in range(S) if owner[s] == g) for g in range(groups)]
    kinds = range(len(types))
    U = len(co.sizes)

    def rounded(w):
        return np.floor(np.asarray(w, dtype=float) / unit) if unit else np.asarray(w, dtype=float)

    total_state = float(np.sum(co.state * co.sizes))
    mem_unit = (total_state / 1e6 if unit else total_state) if total_state > 0 else None
    state = (np.floor(co.state / mem_unit) if unit else co.state / mem_unit) if mem_unit else co.state
    fwd, back, weight, fwd_all, work, tail = (rounded(a) for a in (co.forward, co.backward, co.weight, co.forward_all,
                                                                    co.work, co.tail))
    const = rounded(co.tail_const)

    m = LinearModel()
    T = m.objective = m.var("T")
    z = [[m.var(f"z{p},{i}", 0, 1, True) for i in kinds] for p in range(groups)]
    # x[u, s, i]: layers of unit u in stage s, whose group has type i (the perspective of the stage's layers
    # and its group's type)
    x = {(u, s, i): m.var(f"x{u},{s},{i}", 0, float(co.sizes[u]), bool(unit))
         for u in range(U) for s in range(S) for i in kinds}
    for p in range(groups):
        m.row(zip(z[p], [1.0] * len(types)), 1, 1)
    hops = hop_columns(m, z, owner, None if co.transfer is None else rounded(co.transfer))
    for u in range(U):
        m.row(((x[u, s, i], 1.0) for s in range(S) for i in kinds), co.sizes[u], co.sizes[u])
        for s in range(S):
            for i in kinds:
                m.row([(x[u, s, i], 1.0), (z[owner[s]][i], -float(co.sizes[u]))], -math.inf, 0)
    for s in range(S):
        m.row(((x[u, s, i], 1.0) for u in range(U) for i in kinds), 1, math.inf)
        # contiguity's ends: the first layer (unit 0) in stage 0, the last (unit U-1) in the last stage
        for i in kinds:
            if s > 0:
                m.upper[x[0, s, i]] = 0.0
            if s < S - 1:
                m.upper[x[U - 1, s, i]] = 0.0
    for k in sorted({t.speed for t in types}):
        cap = sum(1 for d in problem.cluster.devices if d.speed >= k)
        chosen = [(z[p][i], float(types[i].replicas)) for p in range(groups) for i in kinds if types[i].speed >= k]
        m.row(chosen, -math.inf, cap)
    for key in sorted({(t.speed, t.memory) for t in types}):
        # each group of a class-c type holds its own device of class c (its slowest)
        cap = sum(1 for d in problem.cluster.devices if (d.speed, d.memory) == key)
        chosen = [z[p][i] for p in range(groups) for i in kinds if (types[i].speed, types[i].memory) == key]
        m.row(((c, 1.0) for c in chosen), -math.inf, cap)

    def total(name: str, stages: list[int], weights: np.ndarray, extra: list[tuple[int, float]] = ()) -> int:
        """A column equal to ``sum over s in stages, l, i of weights[i, l] x[l, s, i]`` plus ``extra``."""
        col = m.var(name)
        cols, coefs = [col], [1.0]
        for s in stages:
            for i in kinds:
                for u in range(U):
                    if weights[i, u]:
                        cols.append(x[u, s, i])
                        coefs.append(-float(weights[i, u]))
        for c, a in extra:
            cols.append(c)
            coefs.append(-a)
        m.row(zip(cols, coefs), 0, 0)
        return col

    F = [total(f"F{s}", [s], fwd) for s in range(S)]
    B = [total(f"B{s}", [s], back) for s in range(S)]
    mine = [[t for t in range(S) if owner[t] == p] for p in range(groups)]
    Y = [total(f"Y{p}", mine[p], tail, [(z[p][i], float(const[i])) for i in kinds]) for p in range(groups)]
    Wk = [total(f"W{p}", mine[p], work) for p in range(groups)]
    Fa = [total(f"Fa{s}", [s], fwd_all) for s in range(S)]
    for p in range(groups):
        for i in kinds:
            memory = (math.floor if unit else float)(types[i].memory / mem_unit) if mem_unit else types[i].memory
            if float(np.sum(state * co.sizes)) > memory:
                m.row([(x[u, t, i], float(state[u])) for t in mine[p] for u in range(U)] + [(z[p][i], -float(memory))],
                      -math.inf, 0)
    if capacity:
        for p in range(groups):
            for i in kinds:
                # sum of (work + tail) x + 2 (r - 1) lat z <= target z; the z entry is set per target
                at = len(m.row_lower)
                m.row([(x[u, t, i], float(work[i, u] + tail[i, u])) for t in mine[p] for u in range(U)]
                      + [(z[p][i], 1.0)], -math.inf, 0)
                m.target_terms.append((at, z[p][i], float(const[i])))
    whole = not problem.needs.split_backward
    Z = [total(f"Z{s}", [s], weight) for s in range(S)]
    programs = problem.needs.programs(groups, problem.microbatches, virtual)
    if paths:
        program_rows(m, programs, F, B, Z, Y, bool(unit), hops)

    def crossed(cuts) -> list[int]:
        """The transfer columns of ``cuts`` (a cut between two stages of one group has none)."""
        return [hops[c] for c in cuts if c in hops]

    for p, program in enumerate(programs):
        for s in mine[p]:
            # row 3: the first backward of stage s in p's program, then every action from it on
            at = next((j for j, a in enumerate(program) if a.stage == s and a.kind not in ("F", "W")), None)
            if at is None:
                continue
            count: dict[int, float] = {}
            for t in range(S):  # microbatch k's forwards through every stage, its backwards above s
                count[F[t]] = count.get(F[t], 0.0) + 1.0
                if t > s:
                    count[B[t]] = count.get(B[t], 0.0) + 1.0
            for c in crossed(range(S - 1)) + crossed(range(s, S - 1)):  # its transfers forward, then back to s
                count[c] = count.get(c, 0.0) + 1.0
            for a in program[at:]:
                col = F[a.stage] if a.kind == "F" else Z[a.stage] if a.kind == "W" else B[a.stage]
                count[col] = count.get(col, 0.0) + 1.0
            cols, coefs = list(count), [-c for c in count.values()]
            m.row(zip([T] + cols + [Y[p]], [1.0] + coefs + [-1.0]), 0, math.inf)
            if whole and first[p] > 0:
                back = B[:first[p]] + crossed(range(first[p]))
                m.row(zip([T] + cols + back + [Y[owner[0]]], [1.0] + coefs + [-1.0] * len(back) + [-1.0]),
                      0, math.inf)
    for s in range(S):
        p = owner[s]
        before = [t for t in mine[p] if t < s]
        reach = F[:s] + crossed(range(s))  # a microbatch's forwards and transfers up to stage s
        # T >= sum_{t<s} (F_t + H_t) + (W_p - sum of p's forwards before s) + Y_p
        m.row(zip([T] + reach + [Wk[p]] + [Fa[t] for t in before] + [Y[p]],
                  [1.0] + [-1.0] * len(reach) + [-1.0] + [1.0] * len(before) + [-1.0]), 0, math.inf)
        if whole and first[p] > 0:
            back = B[:first[p]] + crossed(range(first[p]))
            m.row(zip([T] + reach + [Wk[p]] + [Fa[t] for t in before] + back + [Y[owner[0]]],
                      [1.0] + [-1.0] * len(reach) + [-1.0] + [1.0] * len(before) + [-1.0] * len(back) + [-1.0]),
                  0, math.inf)
    return m


def hop_columns(m: LinearModel, z: list[list[int]], owner: list[int], transfer: np.ndarray | None) -> dict[int, int]:
    """A column ``H_c`` per cut ``c`` between stages on two groups, at most every transfer across it (row 5).

    ``H_c >= sum_j transfer[i, j] z[h, j] - M_i (1 - z[g, i])`` for each type ``i`` of the sender ``g``
    (``M_i = max_j transfer[i, j]``), and the same with the roles of ``g`` and ``h`` swapped: with one
    type per group, each row says ``H_c >=`` the transfer time of the two groups' types, or is void.
    ``transfer`` ``None`` (or all zero) gives no columns.
    """
    hops: dict[int, int] = {}
    if transfer is None or not np.any(transfer > 0):
        return hops
    kinds = range(transfer.shape[0])
    for c in range(len(owner) - 1):
        g, h = owner[c], owner[c + 1]
        if g == h:
            continue  # two stages of one group hand over without a transfer
        col = hops[c] = m.var(f"H{c}")
        for mine, other, table in ((g, h, transfer), (h, g, transfer.T)):
            for i in kinds:
                most = float(table[i].max())
                m.row([(col, 1.0)] + [(z[other][j], -float(table[i, j])) for j in kinds]
                      + [(z[mine][i], -most)], -most, math.inf)
    return hops


def program_rows(m: LinearModel, programs: Sequence[Sequence[Action]], F: list[int], B: list[int], Z: list[int],
                 Y: list[int], integral: bool = False, hops: dict[int, int] | None = None) -> None:
    """Row 4 of the module docstring, added to ``m``: a start column per action of ``programs``, at or after
    the end of the action before it in its group's program and of the action it waits for, and
    ``T >= start + duration + Y_p`` for each program's last action.

    ``F``, ``B`` and ``Z`` are the columns of each stage's forward, backward (``B`` or ``I``) and weight
    durations, ``Y`` each group's all-reduce and step; ``integral`` makes the start columns integer.

    Examples
    --------
    >>> from pipeplan.solver.schedules.programs import Action
    >>> m = LinearModel()
    >>> m.objective = m.var("T")
    >>> F, B, Y = [m.var("F0", 2, 2), m.var("F1", 1, 1)], [m.var("B0", 3, 3), m.var("B1", 4, 4)], [m.var("Y0"), m.var("Y1")]
    >>> programs = [[Action(0, "F", 0), Action(0, "B", 0)], [Action(1, "F", 0), Action(1, "B", 0)]]
    >>> program_rows(m, programs, F, B, [m.var("Z0"), m.var("Z1")], Y)
    >>> solve_highs(m, 10.0, 100)  # 0F0, 1F0, 1B0, 0B0 one after another: 2 + 1 + 4 + 3 s
    ('optimal', 10.0)
    """
    duration = {"F": F, "B": B, "I": B, "W": Z}
    start: dict[tuple[int, str, int], int] = {}
    for p, program in enumerate(programs):
        for a in program:
            start[a.stage, a.kind, a.microbatch] = m.var(f"t{p},{a.stage}{a.kind}{a.microbatch}", integer=integral)
    last = len(F) - 1

    hops = hops or {}

    def after(later: int, earlier: tuple[int, str, int], cut: int | None = None) -> None:
        """``start[later] >= start[earlier] + duration(earlier)``, plus the transfer across ``cut``."""
        stage, kind, _ = earlier
        hop = [(hops[cut], -1.0)] if cut in hops else []
        m.row([(later, 1.0), (start[earlier], -1.0), (duration[kind][stage], -1.0)] + hop, 0, math.inf)

    for program in programs:
        for i, a in enumerate(program):
            me = start[a.stage, a.kind, a.microbatch]
            if i > 0:
                after(me, tuple(program[i - 1]))
            if a.kind == "F" and a.stage > 0:
                after(me, (a.stage - 1, "F", a.microbatch), a.stage - 1)
            elif a.kind in ("B", "I") and a.stage < last:
                after(me, (a.stage + 1, a.kind, a.microbatch), a.stage)
            elif a.kind in ("B", "I"):
                after(me, (a.stage, "F", a.microbatch))
            elif a.kind == "W":
                after(me, (a.stage, "I", a.microbatch))
    for p, program in enumerate(programs):
        if program:
            end = program[-1]
            m.row([(m.objective, 1.0), (start[tuple(end)], -1.0), (duration[end.kind][end.stage], -1.0),
                   (Y[p], -1.0)], 0, math.inf)


@dataclass(frozen=True)
class ModelOutcome:
    """One ``R`` model's solve."""

    groups: int
    status: str
    """``target`` (the bound is the target LPs') or ``model`` (the model proved no plan as fast as the bound)."""
    bound: float
    """A lower bound on every plan with ``R`` groups."""
    elapsed: float = 0.0
    """Seconds since the bound's clock started, when this bound was proved."""
    step: float = TARGET_STEP
    """How far above the bound, relative, the model is asked next (spent below :data:`MIN_TARGET_STEP`)."""
    capped: bool = False
    """Whether the target LPs stopped at a smaller group count's bound: they may prove more."""
    ceiling: float = math.inf
    """The smallest iteration time of a solution of the model found so far (``inf``: none).  No target at or
    above it can be ruled out (each group's work and step are at most ``T`` by row 1, so the solution meets the
    capacity rows of every such target), so none is asked, and the model's steps keep this group count's bound
    below it (its target LPs, with row 4, may prove more than the CP-SAT form's solution: :attr:`ModelBound.limit`)."""


FEASIBILITY_OPTIONS = {"mip_max_improving_sols": 1, "mip_heuristic_effort": 0.0, "mip_heuristic_run_rins": False,
                       "mip_heuristic_run_rens": False, "mip_heuristic_run_root_reduced_cost": False,
                       "mip_heuristic_run_feasibility_jump": False}
"""HiGHS options for asking whether a model at a target has a solution: the first solution answers it, and the
primal heuristics only look for one.  On bench_solvers' 64 x 16 instance (``looped-bfs``, 8 groups) they took
two thirds of the time of the proofs of infeasibility: 9.0 s against 3.2 s at a 215 ms target, 45 s against
17 s at 230 ms.  Other options left at HiGHS's defaults: on three proofs of that instance (6, 7 and 8 groups at
225.4, 223.0 and 223.6 ms, 7 to 13 s each, 2026-12-03), no symmetry detection, no restarts, and 0 to 16 strong
branchings per variable (``mip_pscost_minreliable``) were each faster on some and slower on others, by at most a
quarter; SCIP (OR-Tools' ``model_builder``, defaults) took 3 to 4 times as long."""


def solve_highs(m: LinearModel, time_limit: float, nodes: int, feasibility: bool = False) -> tuple[str, float]:
    """The MILP form with HiGHS: ``(status, bound)``, the status read from HiGHS's model status.

    ``feasibility`` only asks whether a solution exists (:data:`FEASIBILITY_OPTIONS`): ``("infeasible", inf)``,
    ``("solution", T)`` with the objective of the solution found, or ``("cut", 0)``; the bound is not sought.
    """
    import highspy

    with quiet_stdout():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("mip_rel_gap", 1e-6)
    h.setOptionValue("time_limit", float(max(0.01, time_limit)))
    h.setOptionValue("mip_max_nodes", int(nodes))
    for option, value in (FEASIBILITY_OPTIONS.items() if feasibility else ()):
        h.setOptionValue(option, value)
    lp = m.highs_lp()
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    if status == highspy.HighsModelStatus.kInfeasible:
        return "infeasible", math.inf
    if feasibility and info.primal_solution_status == int(highspy.SolutionStatus.kSolutionStatusFeasible):
        return "solution", info.objective_function_value
    integral = any(m.integer)
    if status == highspy.HighsModelStatus.kOptimal:
        # a MILP optimal to within mip_rel_gap: its dual bound is the proved value
        return "optimal", info.mip_dual_bound if integral else info.objective_function_value
    if not integral:
        return "cut", 0.0
    bound = info.mip_dual_bound
    return "cut", bound if math.isfinite(bound) and bound > 0 else 0.0


def solve_cpsat(m: LinearModel, time_limit: float, deterministic: float) -> tuple[str, float, float]:
    """The CP-SAT form (rows of :func:`build_rows` with a ``unit``: whole coefficients, ``e`` binary):
    ``(status, bound in units, the best solution's objective in units)``, the last ``inf`` without one."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    top = 10 ** 13
    cols = [model.new_int_var(int(math.ceil(lo)), top if math.isinf(hi) else int(math.floor(hi)), n)
            for lo, hi, n in zip(m.lower, m.upper, m.names)]
    for columns, coefs, lo, hi in m.rows():
        expr = sum(int(a) * cols[c] for c, a in zip(columns, coefs))
        if not math.isinf(lo):
            model.add(expr >= int(math.ceil(lo)))
        if not math.isinf(hi):
            model.add(expr <= int(math.floor(hi)))
    model.minimize(cols[m.objective])
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    # the full linear relaxation at every node: on bench_solvers' 16 x 4 instance it proves the R = 3 and 4 models
    # in 0.5 and 2.4 s, against 1.8 and 3.0 s with the default level
    solver.parameters.linearization_level = 2
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    solver.parameters.max_deterministic_time = deterministic
    code = solver.solve(model)
    if code == cp_model.INFEASIBLE:
        return "infeasible", math.inf, math.inf
    solution = solver.objective_value if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) else math.inf
    # a real plan's T, in whole units, is at most ceil(T / unit): one unit less is a bound on T
    return ("optimal" if code == cp_model.OPTIMAL else "cut"), max(0.0, solver.best_objective_bound - 1), solution


@dataclass(frozen=True)
class ModelBound:
    """:func:`virtual_model_bound`'s answer."""

    bound: float
    """The bound over every plan of the problem's space (at least :func:`space_bound`)."""
    backend: str
    """``milp`` (HiGHS) or ``cpsat``."""
    outcomes: tuple[ModelOutcome, ...]
    """One per group count, in order."""
    complete: bool
    """Whether every group count has a bound (else the bound is :func:`space_bound`)."""

    @property
    def limit(self) -> float:
        """No bound of the models goes above it, however long they run: the smallest over the group counts of the
        larger of the bound and the :attr:`ModelOutcome.ceiling` (the target LPs may have proved more than the
        CP-SAT form, without row 4, has a solution for); ``inf`` when no group count has a ceiling.

        Examples
        --------
        >>> ModelBound(2.0, "cpsat", (ModelOutcome(1, "target", 2.0, ceiling=1.5),
        ...                           ModelOutcome(2, "model", 1.8, ceiling=2.4)), True).limit
        2.0
        >>> ModelBound(2.0, "milp", (ModelOutcome(1, "model", 2.0),), True).limit
        inf
        """
        return min((max(o.bound, o.ceiling) for o in self.outcomes), default=math.inf)

    @property
    def by_targets(self) -> bool:
        """Whether the bound is a target LP's: no model raised the group count with the smallest bound."""
        low = min(self.outcomes, key=lambda o: (o.bound, o.groups), default=None)
        return self.complete and low is not None and low.status == "target" and low.bound >= self.bound


def fixed_virtual(problem: PlanningProblem) -> int | None:
    """``v`` when the problem fixes it (``virtual_stages``, or the schedule's own), else ``None``."""
    return problem.needs.stages_per_group or problem.virtual_stages


def virtual_model_bound(problem: PlanningProblem, backend: str, clock: TimeLimit,
                        earlier: ModelBound | None = None, cap: float = math.inf,
                        threads: int = MODEL_THREADS, finish: TimeLimit | None = None) -> ModelBound:
    """The smallest bound over every group count (see the module docstring), never below :func:`space_bound`.

    First, each group count gets the bound of its target LPs (:mod:`pipeplan.solver.exact.virtual_targets`),
    proved no higher than ``cap`` or the smallest bound of the group counts before it: a higher one would
    not change the smallest (such a group count is ``capped``; after one, the next is first tried by
    :func:`screened_out`; with ``threads`` above 1 they go in batches that share the bounds before them).  Then the
    group count with the smallest bound is raised: a capped one by its
    target LPs, up to :data:`LP_REACH` above, any other by its model with capacity rows
    (:func:`model_rules_out`, :data:`NODES_PER_MODEL` HiGHS nodes or :data:`DETERMINISTIC_PER_MODEL` CP-SAT
    deterministic seconds), asked to rule out every plan its step above it (:data:`TARGET_STEP` at first); a
    target proved becomes the bound and doubles the step (up to :data:`MAX_TARGET_STEP`), a target not
    proved halves it.  A solution the model is found to have (:attr:`ModelOutcome.ceiling`) caps the next targets
    of its group count halfway to it: no target at or above it can be proved.
    This goes on until the smallest bound's steps fall below :data:`MIN_TARGET_STEP`, it reaches ``cap`` or
    comes within that step of its model's solution (:attr:`ModelBound.limit`), or ``clock`` runs out.
    The steps go in rounds of ``threads`` times :data:`STEPS_PER_THREAD`, run
    ``threads`` at a time: the smallest bound's step first, then each time the step of the group count whose
    bound would be the smallest were every step before it proved (the same one again, from the target it
    hopes for, when the others' bounds are above it).  A step from a hoped-for bound whose own step failed
    still proves its target when it succeeds.  A problem that leaves ``v`` to the search, or a clock
    that runs out before every group count has a bound, gives :func:`space_bound` (``complete`` false).
    ``earlier`` (an answer for the same problem and backend) is resumed: its bounds are kept, the group
    counts it did not reach get their target LPs, and the raising goes on from each group count's step
    and capped target LPs (:class:`ModelOutcome`).  A model cut by the clock leaves its step as it was.

    Parameters
    ----------
    problem : PlanningProblem
    backend : str
        ``milp`` (HiGHS) or ``cpsat`` for the models; the target LPs are HiGHS's for both.
    clock : TimeLimit
    earlier : ModelBound, optional
    cap : float, optional
        A plan's iteration time: no bound above it is sought.
    threads : int, optional
        Solves run at once (:data:`MODEL_THREADS`); the answer depends on it, not on the machine's cores.
    finish : TimeLimit, optional
        A later cap the solves of a round started before ``clock`` runs out may run to (``clock`` itself by
        default): a solve cut by its clock proves nothing, so a phase that ends at ``clock`` and resumes later
        loses no solve's work.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> g = LayerGraph.chain("g", [Layer(f"l{i}", (0, 1), (0, 2), 0, 0, 0) for i in range(2)])
    >>> c = Cluster("c", (Link(1e9, 0, "s0"),), Link(1e9, 0), (Device("d0", "s0", 1, 1e9),))
    >>> p = PlanningProblem(g, c, global_batch=2, microbatches=2, schedule="looped-bfs", virtual_stages=2)
    >>> round(virtual_model_bound(p, "milp", TimeLimit(60.0)).bound, 6)  # one device runs all 12 s of work
    12.0
    """
    floor_ = space_bound(problem)
    v = fixed_virtual(problem)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if v is None:
        return ModelBound(floor_, backend, (), False)
    types = group_types(problem)
    co = coefficients(problem, types, layer_units(problem))
    milli = in_milliseconds(co)
    found = {o.groups: o for o in earlier.outcomes} if earlier is not None and earlier.backend == backend else {}
    proved = {g: o.bound / (1 - ROUNDING_MARGIN) for g, o in found.items()}
    lps: dict[int, TargetLP] = {}  # the target LPs of the capped group counts, kept from the first pass
    rising = False  # whether the last group count's target LPs stopped at a smaller count's bound

    def target_lp(groups: int, within: TimeLimit) -> TargetLP:
        return TargetLP(build_rows(problem, groups, v, types, milli, capacity=True), within.remaining)

    solving = finish if finish is not None else clock  # what a round's solves may run to

    def raisable(bound: float, outcome: ModelOutcome) -> bool:
        # a bound within the smallest step of a solution of its model is as high as that model goes
        return outcome.step >= MIN_TARGET_STEP and bound < cap and bound * (1 + MIN_TARGET_STEP) < outcome.ceiling

    def next_target(start: float, outcome: ModelOutcome) -> float:
        # never at or above a solution of the model: halfway to it at most
        return min(cap, start * (1 + outcome.step), (start + outcome.ceiling) / 2)

    def raise_once(task: tuple[int, float, ModelOutcome]) -> tuple[float, ModelOutcome, TargetLP | None]:
        """One step up for ``groups`` from the bound ``start`` and its ``outcome``: the new proved target, outcome
        and target LPs (``None``: unchanged)."""
        groups, start, outcome = task
        lp = None
        if outcome.capped:  # its target LPs first, on from where they stopped, up to LP_REACH above
            ceiling = min(cap, start * (1 + LP_REACH))
            if ceiling < cap and screened_out(problem, groups, v, types, milli, ceiling, solving):
                bound, capped = ceiling, True
            else:
                lp = lps.get(groups) or target_lp(groups, solving)
                lp.seconds = solving.remaining  # the first pass's, kept, ran under ``clock``
                lp.timed_out = False  # this bisection's own
                # no program starts after ``clock``; one started runs on under ``solving``
                bound = target_bound(lambda t: lp.infeasible_at(t * MILLI), start, ceiling, clock.expired)
                capped = lp.timed_out or (bound >= ceiling and ceiling < cap)
            capped = capped or clock.expired()
            return bound, replace(outcome, bound=bound * (1 - ROUNDING_MARGIN), elapsed=clock.elapsed(),
                                  capped=capped), lp
        target = next_target(start, outcome)
        ruled_out, solution = model_rules_out(problem, groups, v, types, co if backend == "cpsat" else milli,
                                              backend, target, solving)
        if ruled_out:
            return target, replace(outcome, status="model", bound=target * (1 - ROUNDING_MARGIN),
                                   elapsed=clock.elapsed(), step=min(MAX_TARGET_STEP, 2 * outcome.step)), None
        outcome = replace(outcome, ceiling=min(outcome.ceiling, solution))
        if not solving.expired():  # a plan of the model, or its node budget spent: a smaller step
            outcome = replace(outcome, step=outcome.step / 2)
        return start, outcome, None

    def round_of_steps() -> list[tuple[int, float, ModelOutcome]]:
        """The solves of one round: the smallest bound's next step, then, for each further thread, the next step
        of the group count whose bound would be the smallest were every step before it proved (the same count
        again, from its target, when the others' bounds are above that target)."""
        hoped = {g: (proved[g], found[g]) for g in found}
        tasks: list[tuple[int, float, ModelOutcome]] = []
        while len(tasks) < max(1, threads) * STEPS_PER_THREAD:
            live = [g for g, (b, o) in hoped.items() if raisable(b, o)]
            if not live:
                break
            groups = min(live, key=lambda g: (hoped[g][0], g))
            start, outcome = hoped[groups]
            tasks.append((groups, start, outcome))
            if outcome.capped:  # its bisection is not run twice at once: no step is left to hope for
                hoped[groups] = (start, replace(outcome, step=0.0))
            else:
                target = next_target(start, outcome)
                hoped[groups] = (target, replace(outcome, status="model", bound=target * (1 - ROUNDING_MARGIN),
                                                 step=min(MAX_TARGET_STEP, 2 * outcome.step)))
        return tasks

    def first_bound(groups: int, lowest: float, screen: bool) -> tuple[float, TargetLP | None]:
        """``groups``' bound from its target LPs, at most ``lowest``; ``(lowest, None)`` when ``screen`` and
        :func:`screened_out` proves it."""
        if screen and screened_out(problem, groups, v, types, milli, lowest, clock):
            return lowest, None
        lp = target_lp(groups, clock)
        return target_bound(lambda t: lp.infeasible_at(t * MILLI), floor_, lowest, clock.expired), lp

    def incomplete() -> ModelBound:
        return ModelBound(floor_, backend, tuple(found[g] for g in sorted(found)), False)

    pending, too_large = [], False  # the group counts without a bound, in order, up to one too large to model
    for groups in group_counts(problem):
        stages = num_stages(problem.schedule, groups, v)
        if schedule_accepts(problem.schedule, groups, problem.microbatches) or stages > len(problem.graph) \
                or (problem.max_stages is not None and stages > problem.max_stages) or groups in found:
            continue
        if len(co.sizes) * stages * len(types) > MAX_COLUMNS:
            too_large = True
            break
        pending.append(groups)
    with ThreadPoolExecutor(max(1, threads)) as pool:
        for at in range(0, len(pending), max(1, threads)):
            batch = pending[at:at + max(1, threads)]
            if clock.expired():
                return incomplete()
            # the targets proved (before their margin) cap the next ones: group counts proved at one cap share one
            # bound.  The bounds fall with more groups, then rise: once one group count is capped, the next ones are
            # screened first.  A batch shares the cap and the screening of the counts before it.
            lowest = min(cap, min(proved.values(), default=math.inf))
            screen = rising and lowest < cap
            for groups, (bound, lp) in zip(batch, pool.map(lambda g: first_bound(g, lowest, screen), batch)):
                if lp is None:  # screened out at the cap
                    proved[groups] = lowest
                    found[groups] = ModelOutcome(groups, "target", lowest * (1 - ROUNDING_MARGIN), clock.elapsed(),
                                                 capped=True)
                    continue
                if clock.expired() or lp.timed_out:  # the clock cut its bisection short: left to a resumed call
                    return incomplete()
                capped = rising = bound >= lowest and lowest < cap  # another group count's bound stopped it
                proved[groups] = bound
                found[groups] = ModelOutcome(groups, "target", bound * (1 - ROUNDING_MARGIN), clock.elapsed(),
                                             capped=capped)
                if capped:
                    lps[groups] = lp
        if too_large:
            return incomplete()
        while not clock.expired():
            # only the smallest bound counts: once its group count's steps are spent, the others stay as they are
            low = min(found, key=lambda g: (proved[g], g), default=None)
            if low is None or not raisable(proved[low], found[low]):
                break
            # a round ends when all its solves have: the next round's choice depends on their answers alone
            tasks = round_of_steps()
            for (groups, start, _), (bound, outcome, lp) in zip(tasks, pool.map(raise_once, tasks)):
                if start == proved[groups]:  # a step from the bound as it stands (a hoped-for one that was proved)
                    proved[groups], found[groups] = bound, outcome
                    if lp is not None:
                        lps[groups] = lp
                elif bound > start:  # a step from a hoped-for bound that was not proved, whose own target was
                    proved[groups] = bound
                    found[groups] = replace(found[groups], status="model", bound=outcome.bound, elapsed=outcome.elapsed)
                # a solution of the model holds whatever the step's premise
                found[groups] = replace(found[groups], ceiling=min(found[groups].ceiling, outcome.ceiling))
    outcomes = tuple(found[g] for g in sorted(found))
    return ModelBound(max(floor_, min((o.bound for o in outcomes), default=floor_)), backend, outcomes, True)


def screened_out(problem: PlanningProblem, groups: int, virtual: int, types: list[GroupType], co: Coefficients,
                 target: float, clock: TimeLimit) -> bool:
    """Whether the target LP without row 4 proves no plan with ``groups`` groups reaches ``target`` seconds
    (``co`` in milliseconds).  It is a relaxation of the target LP (fewer rows), and half as long to solve: on
    bench_solvers' 64 x 16 instance (``interleaved-1f1b``, ``v = 4``) 0.6 to 1.2 s against 1.2 to 3.4 s for
    9 to 16 groups, where it proves the smallest bound of the smaller group counts at 12 and 16."""
    rows = build_rows(problem, groups, virtual, types, co, paths=False, capacity=True)
    return TargetLP(rows, clock.remaining).infeasible_at(target * MILLI)


def model_rules_out(problem: PlanningProblem, groups: int, virtual: int, types: list[GroupType], co: Coefficients,
                    backend: str, target: float, clock: TimeLimit) -> tuple[bool, float]:
    """Whether the model of ``groups`` groups with capacity rows has no integral solution with ``T <= target``
    seconds: then no plan with that many groups is that fast (:mod:`pipeplan.solver.exact.virtual_targets`).
    Also the iteration time, in seconds, of the solution the solve found (``inf`` without one: ruled out, or cut
    by its work or clock), the :attr:`ModelOutcome.ceiling` it sets.
    ``co`` in milliseconds (:func:`in_milliseconds`) for ``milp``, in seconds for ``cpsat``.

    ``milp``: HiGHS on :data:`NODES_PER_MODEL` nodes; ``cpsat``: CP-SAT on :data:`DETERMINISTIC_PER_MODEL`
    deterministic seconds, in whole :data:`CPSAT_UNIT` units (the target rounded up, every coefficient down:
    a real plan's rounded values still satisfy every row), without row 4.  ``clock`` caps both; ``False``
    unless infeasibility is proved.
    """
    if backend == "milp":  # co in milliseconds
        rows = build_rows(problem, groups, virtual, types, co, capacity=True)
        set_target(rows, target * MILLI)
        status, value = solve_highs(rows, clock.remaining(), NODES_PER_MODEL, feasibility=True)
        solution = value / MILLI if status == "solution" else math.inf
    else:
        rows = build_rows(problem, groups, virtual, types, co, unit=CPSAT_UNIT, paths=False, capacity=True)
        set_target(rows, math.ceil(target / CPSAT_UNIT))
        status, _, units = solve_cpsat(rows, clock.remaining(), DETERMINISTIC_PER_MODEL)
        solution = units * CPSAT_UNIT
    clock.expired()  # notes a cut by the clock in the solve's record (a node or deterministic cap is counted)
    return status == "infeasible", solution
