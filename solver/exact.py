"""Shared machinery of the exact solvers (``ilp`` and ``cpsat``).

Both solvers first walk the configurations directly (:mod:`pipeplan.solver.enumeration`, a
branch and bound with the bounds below, which proves small and medium instances
optimal without any model).  If that does not finish, they minimise a *provable lower
bound* ``LB(config) <= T(plan)`` over type-level configurations, simulate the best
configuration, keep the best simulated incumbent, exclude that configuration with a
no-good cut and solve again, until the model's optimum reaches the incumbent (a proof
of optimality) or time runs out.  A configuration is simulated on its placements only
while its :func:`optimistic_time` (the simulator with the best conceivable links) is
below the incumbent.

Configurations and symmetry
---------------------------
Devices with the same ``(speed, memory)`` form a *class*.  A stage's timing and memory
depend on its devices only through the class counts (its *composition*): ``r`` is their
sum, ``v_s`` the smallest speed, the capacity the smallest memory.  Only transfers and
all-reduces depend on which servers hold the devices, and the lower bound uses
optimistic values for those.  A model decision is therefore an *arc*
``(lo, hi, tau, option)``: layers ``[lo, hi)``, ``tau = min(later stages, M)``, and an
option = (composition, recompute).  A configuration is a path of arcs from layer 0 to
layer ``L``; it is mapped to concrete device ids afterwards by :func:`placements`,
which enumerates placements up to server symmetry (identical devices on one server,
identical servers) and simulates each.

The lower bound
---------------
Every term is the length of a path in the dependency graph of the simulator's
timeline, with each op and transfer replaced by a duration that is no longer than the
real one; since every op starts no earlier than its predecessors on any such path end,
each term is ``<= T``.  ``n_min`` is the smallest microbatch, ``q = ceil(n / r)``.

1. **Busy path** ``c1``: stage ``s`` cannot start ``F0`` before ``F0`` ran on every
   earlier stage and crossed every earlier cut (``head``), then runs all its ops one at
   a time (``busy``), and after its last op ``B_{M-1}`` either all-reduces (``AR_s``)
   or ``B_{M-1}`` still crosses every earlier cut and runs on every earlier stage
   (``tail``).  Each earlier stage ``j`` adds its exact ``TF_j`` of microbatch 0
   (``head_f``) and ``TB_j`` of microbatch ``M-1`` (``head_fb`` adds both), each cut a
   transfer of at least ``lat_min + n * cut / (r_j * bw_send)`` (``min(r_j, r_{j+1})
   <= r_j``; ``bw_send`` of term 3).  Linear form, for every layer ``l`` (exactly one
   chosen arc covers it; the chosen arcs ending at or before ``l`` are exactly the
   earlier stages): ``T >= sum_{hi <= l} head_fb x + sum_{a covers l} busy x`` and
   ``T >= sum_{hi <= l} head_f x + sum_{a covers l} (busy + AR) x``.  For pruning, a
   standalone form bounds ``head``/``tail`` by the layers ``[0, lo)`` at the largest
   speed and replication plus one latency.
2. **Pivot path** ``U + D``: microbatch 0 (or ``M-1``) crosses every stage ``j != s``
   once forward and once backward, and stage ``s`` runs the ops on its critical path.
   Each stage ``j != s`` contributes at least ``u_j = TF_j(n_min) + TB_j(n_min)``, and
   each cut is crossed once each way, at least ``lat_min + n_min * cut / (r_j *
   bw_send)`` (term 3) (``min(r_j, r_{j+1}) <= r_j``).  Stage ``s`` contributes ``u_s + delta_s``:
   under GPipe all its ops (``F_{M-1}`` ends, the last forward reaches the last stage,
   ``B0`` comes back, then all backwards run), so ``delta = busy - u``; under 1F1B with
   ``w = min(S-1-s, M)`` warm-up forwards, ``F0``, then after ``B0`` returns every
   backward and ``F_{w+1} .. F_{M-1}``, so ``delta = TF(0) + sum TB + sum_{k>w} TF(k)
   - u``.  The path ends at the end of stage 0's last op, so ``AR_0`` adds on top.
   Linear form: ``T >= U + D`` with ``U = sum u' x`` and ``D >= sum over arcs covering
   l of delta * x`` for every layer ``l``.

   **2b. Pivot path ending in the pivot's all-reduce.**  The same path, but after stage
   ``s``'s last op it takes ``AR_s`` instead of carrying ``B_{M-1}`` back to stage 0.
   ``F0`` of stage ``s`` starts after ``F0`` ran on every earlier stage ``j`` and crossed
   its cut (the sample 0 lies in microbatch 0 of every stage): at least ``head_f_j`` each
   (term 1).  Then stage ``s`` runs ``F0``, microbatch 0 goes through every later stage
   and back, each later stage ``j`` adding at least ``u_j`` and its outgoing cut two
   transfers (its ``u'``; never first, so no ``AR_0``), stage ``s`` runs its critical
   ops from ``B0`` on (``delta``, as in term 2; its own outgoing cut is crossed once
   each way), and ``AR_s`` follows its last op.  So ``T >= sum_{j<s} head_f_j + (u_s +
   2 send_s + delta_s + AR_s) + sum_{j>s} u'_j``.  Linear form, for every layer ``l``:
   ``T >= Hf_l + sum_{a covers l} pivot_ar x + R_l`` with ``R_l = sum_{lo > l} u' x``.
   For pruning: the earlier stages' heads are at least ``head_min`` of term 1 and each
   later layer adds its ``u`` at the largest speed and replication.
   **2c. Two round trips.**  Under 1F1B with ``w <= M - 2`` warm-up forwards on the
   pivot, ``F_{w+1} .. F_{M-1}`` come after ``B_0`` in its op list, so the path of term 2
   can leave the pivot a second time: ``F_0`` on the pivot, microbatch 0's round trip
   through every later stage and back (``R``), the pivot's ops from ``B_0`` through
   ``F_{M-1}`` (``B_0 .. B_{M-w-2}`` and ``F_{w+1} .. F_{M-1}``), microbatch ``M-1``'s round
   trip (``R`` again), then ``B_{M-1}``.  It skips the backwards ``B_{M-w-1} .. B_{M-2}``
   that term 2 counts and adds a second ``R``: tighter whenever the later stages take
   longer than ``w`` backwards of the pivot, which is where 1F1B idles between nearly
   equal neighbours.  Each later stage adds at least its ``u'`` per trip, and the pivot's
   own outgoing cut is crossed twice more (``delta2`` carries those two transfers).  Both
   endings of terms 2 and 2b apply: ``T >= U + R_l + sum_{a covers l} delta2 x`` and
   ``T >= Hf_l + sum_{a covers l} pivot2_ar x + 2 R_l``.  An arc without a second trip
   (GPipe, or ``w >= M - 1``) takes its term-2/2b coefficient minus ``R_max(hi)``, the
   longest path of ``u'`` over the arcs from its end to the last layer, which no
   configuration holding it exceeds, so the rows stay valid (the integer model loses
   nothing; only the relaxation is weaker there).
   **2d. On to a later stage's all-reduce.**  The pivot ``s`` runs its ops up to
   ``F_{M-1}`` (under 1F1B with a second trip: ``F_0``, microbatch 0's round trip, then
   ``B_0 .. B_{M-w-2}`` and ``F_{w+1} .. F_{M-1}``; otherwise every forward, relaxed by
   ``R_max`` like 2c), then ``F_{M-1}`` runs forward through the stages ``s+1 .. e`` (each
   adding ``TF(n_last)`` and a transfer: ``chain``), and the end stage ``e >= s`` runs
   ``F_{M-1}``, waits for its round trip through the stages after it (their ``u'``, its own
   cut twice), runs ``B_{M-1}`` (GPipe: every backward) and all-reduces (``end_ar``).  This
   is the critical path when a later stage is replicated on slow links: its all-reduce
   waits for the last microbatch, which the bottleneck stage releases late.  Linear form:
   ``Z_l = Cz_l + R_l + G_l``, ``ZM_l >= Z_l'`` for every ``l' >= l`` and ``T >= Hf_l +
   Cq_l + R_l - G_l + ZM_l``, where ``G_l`` sums ``chain`` over the arcs ending at or before
   ``l`` (so ``G_l' - G_l`` is the pivot and the stages between); with ``l`` and ``l'`` in
   one arc the row is term 2c's path ending in the all-reduce, also valid.
3. **All-reduce and links**: ``AR_s >= 2 (r-1) (lat_lb + P_s / (r bw_ub))``.  If all
   of a group's devices share a server, ``bw(D)``/``lat(D)`` are that server's link,
   and that server holds the whole composition; otherwise some pair crosses servers
   and they are the network's.  So ``bw_ub`` is the largest of the network bandwidth
   and the bandwidths of the servers able to hold the composition, ``lat_lb`` the
   smallest such latency.  Between two groups, for any device ``x`` of class ``c`` in
   the first, each pair ``(x, y)`` is ``x``'s server link or the network: ``bw_send``
   is the smallest over the classes used of the largest such bandwidth.

4. **Work**: stage ``s`` keeps its ``r_s`` devices busy for ``busy_s <= T``, so
   ``T * sum_s r_s v_s >= sum_s busy_s r_s v_s``; the chosen devices' speeds sum to at
   most ``V``, the sum over the cluster, hence ``T >= sum_s busy_s r_s v_s / V``.  For
   pruning: the stages other than an arc use devices of total speed at most ``V -
   V_a`` (``V_a``: the arc's devices' speeds) and need at least ``W_rest = M (a_f +
   a_b) + B (b_f + b_b)`` over the other layers, so ``T >= W_rest / (V - V_a)``.

Pruning (standalone bound of an arc, valid for every configuration holding it): the
maximum of the standalone busy path, ``work + W_rest / V``, ``W_rest / (V - V_a)`` and
the pivot path with the other layers' ``u`` at the largest speed and replication
(communication left out; term 2c counts the later layers twice).  ``max_l min`` over
arcs covering ``l`` of it is the static bound.

Model size: each per-layer sum above is an auxiliary variable defined by differences
from layer to layer (``C_l = C_{l-1} + sum_{lo=l} c x - sum_{hi=l} c x``), so every
arc appears in O(1) rows per term; the relaxation is the same as with the expanded
rows.

Memory is exact: each arc's peak is :func:`pipeplan.solver.memory.stage_peak_memory` of its op
list, which under 1F1B depends on the stage only through ``w = min(tau, M)``.  The
vectorised sums (differences of prefix sums) can differ from the simulator's by
rounding, so a peak within rounding of the memory (relative to the prefix sums it came
from) is decided by the simulator's own sum (:func:`pipeplan.solver.memory.settle_borderline`):
a stage whose peak equals the memory fits.

Exactness of the loop
---------------------
An arc is dropped when its standalone bound already reaches the incumbent, and a recomputing
arc when the same arc without recompute fits (recompute only lengthens ops, and the
simulator is monotone in durations).  The model also carries the cutoff ``T <=
incumbent * (1 - OPT_TOL)``.  A configuration is cut after all its placements were
simulated; if placements were capped, its lower bound goes to a pool whose minimum
caps the reported bound.  Hence ``min(model bound, incumbent, pool)`` is always a
valid lower bound, and an infeasible model proves the incumbent optimal to within
``OPT_TOL`` (the solvers' numerical tolerance).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from itertools import product
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from pipeplan.solver.cluster import Cluster
from pipeplan.solver.memory import range_peak_memory, settle_borderline
from pipeplan.solver.plan import Plan
from pipeplan.solver.problem import PlanningProblem
from pipeplan.solver.result import SolverResult, TracePoint
from pipeplan.solver.schedule import FORWARD, gpipe_ops, one_f_one_b_ops
from pipeplan.solver.simulator import StageCost, run_timeline, simulate
from pipeplan.solver.termination import TimeLimit

OPT_TOL = 1e-12
"""Relative tolerance of an optimality proof: the float noise of the bounds' sums.

``optimal`` means no plan is faster than the incumbent by more than this (relative),
and the bound reported with it is the one proved, ``incumbent * (1 - OPT_TOL)``, never
the incumbent itself.  At ``1e-6`` (before) a plan 2.3e-7 faster than the one called
optimal was missed on near-ties (devices whose speeds differ by 1e-7), and the
incumbent reported as the bound lay above the true optimum.  The model solvers'
own tolerances do not enter: their optima count as bounds only lowered by
:data:`MODEL_TOL`, and a proof from a model is an infeasible model at the cutoff."""

MODEL_TOL = 1e-7
"""Relative amount a model solver's optimum is lowered by before it counts as a bound: a MILP
solver's objective honours its constraints only to its feasibility tolerance (CBC's came out
1.5e-8 above the true minimum), which must not put a bound above the optimum."""

PLACEMENT_LIMIT = 64
"""Most placements simulated per configuration before falling back to the pool bound."""

FINISH_SECONDS_PER_ARC = 1.5e-6
"""Time :func:`build_data` needs per arc to sort and finish its table, on the large side.

Measured: 0.35 s for 1.9 million arcs once, but 5 s for 4.2 million and 17 s for 13
million (44 layers x 14 devices of distinct speeds: 19 columns of 8 bytes, memory-bound).
At 2.5e-7 a 20 s limit became 31-34 s on that instance; a table that may not be
finished in time is not finished (no model, no bound from it)."""

MAX_MODEL_ARCS = 150_000
"""Above this many candidate arcs the model is not built (building alone would exceed typical limits)."""

BUILD_SECONDS_PER_ARC = 4e-5
"""About what building the model takes per arc on the 2-core machine this is measured on (CP-SAT:
106,730 arcs in 4.2 s on 32 layers x 16 devices).  The build cannot be interrupted, and a limit of
0.5 s had turned into a 5 s solve: when the build would outlast the time left by more than
:data:`BUILD_OVERRUN_SECONDS`, no model is built."""

BUILD_OVERRUN_SECONDS = 0.5
"""Overrun of the time left that a model build may cause (so small models, built in milliseconds,
are built as before whatever the machine's speed)."""

__all__ = ["DeviceClass", "Option", "Arc", "ExactData", "build_data", "placements", "solve_exact",
           "config_lower_bound", "OPT_TOL"]


@dataclass(frozen=True)
class DeviceClass:
    """Interchangeable devices: same speed and memory (on any server)."""

    speed: float
    memory: float
    ids_by_server: tuple[tuple[str, tuple[str, ...]], ...]
    """``(server id, device ids)`` for every server holding devices of this class."""

    @property
    def count(self) -> int:
        return sum(len(ids) for _, ids in self.ids_by_server)


@dataclass(frozen=True)
class Option:
    """What a stage runs on: devices per class, and whether it recomputes."""

    composition: tuple[int, ...]
    """Devices of each class."""
    recompute: bool
    replicas: int
    speed: float
    """Smallest speed of its devices."""
    memory: float
    """Smallest memory of its devices."""
    allreduce_params_coef: tuple[float, float]
    """``(fixed, per param byte)`` of the all-reduce lower bound."""
    send_bandwidth: float = math.inf
    """Upper bound on the bandwidth between this stage's devices and any other group."""


@dataclass(frozen=True)
class Arc:
    """One candidate stage: layers ``[lo, hi)``, ``tau`` later stages (capped), an option."""

    lo: int
    hi: int
    tau: int
    option: int
    busy_path: float
    """Standalone ``c1``: fastest conceivable head + busy + max(all-reduce, tail)."""
    pass_cost: float
    """``u'``: one microbatch through the stage, its outgoing cut, and ``AR_0`` if first."""
    pivot_extra: float
    """``delta``: the pivot's critical ops beyond ``u``."""
    work: float = 0.0
    """``busy * r * v / V``: the stage's share of the work bound (``V`` = all speeds summed)."""
    busy: float = 0.0
    """All the stage's ops, one after the other."""
    allreduce: float = 0.0
    """Lower bound on ``AR_s``."""
    head_f: float = 0.0
    """``F0`` and its forward transfer: what the stage adds to a later stage's head."""
    head_fb: float = 0.0
    """``head_f`` plus ``B_{M-1}`` and the backward transfer reaching this stage."""
    standalone: float = 0.0
    """A bound on every configuration holding this arc (used to prune it)."""
    pivot_ar: float = 0.0
    """The arc as the pivot of term 2b: ``u + its outgoing transfers + delta + AR`` (no ``AR_0``)."""
    pivot2_extra: float = 0.0
    """Term 2c: the pivot's ops on the two-round-trip path beyond ``u``, plus its cut crossed twice more."""
    pivot2_ar: float = 0.0
    """Term 2c ending in the pivot's all-reduce: ``u + 4 transfers + delta2 + AR``."""
    chain: float = 0.0
    """Term 2d: ``TF(n_last)`` and the forward transfer of ``F_{M-1}`` as it passes through the stage."""
    pivot_fwd: float = 0.0
    """Term 2d as the pivot: its ops on the path from ``F_0`` through ``F_{M-1}``, minus ``TF(n_last)``."""
    end_ar: float = 0.0
    """Term 2d as the end stage: ``F_{M-1}``, its round trip's own cut, ``B_{M-1}`` (GPipe: every B) and ``AR``."""


ARC_FIELDS = ("lo", "hi", "tau", "option", "busy_path", "pass_cost", "pivot_extra", "work", "busy", "allreduce",
              "head_f", "head_fb", "standalone", "pivot_ar", "pivot2_extra", "pivot2_ar", "chain", "pivot_fwd",
              "end_ar")


@dataclass
class ExactData:
    """Everything the models need, as plain numbers (one numpy column per arc field)."""

    problem: PlanningProblem
    classes: tuple[DeviceClass, ...]
    options: tuple[Option, ...]
    table: dict[str, np.ndarray]
    """Column ``name`` of every arc, for each name of :data:`ARC_FIELDS`."""
    max_tau: int
    stage_limit: int
    static_bound: float
    """A lower bound needing no model: ``max_l min over arcs covering l`` of their standalone bound."""
    complete: bool = True
    """Whether every candidate arc was enumerated (the time limit may stop it early)."""
    _arcs: list[Arc] | None = None

    def __len__(self) -> int:
        return len(self.table["lo"])

    @property
    def arcs(self) -> list[Arc]:
        """The arcs as objects (built on first use)."""
        if self._arcs is None:
            cols = [self.table[name].tolist() for name in ARC_FIELDS]
            self._arcs = [Arc(*row) for row in zip(*cols)]
        return self._arcs

    def covering(self) -> list[list[int]]:
        """Arc indices covering each layer."""
        lo, hi = self.table["lo"], self.table["hi"]
        return [np.flatnonzero((lo <= layer) & (hi > layer)).tolist() for layer in range(len(self.problem.graph))]


# ---------------------------------------------------------------------------- data
def device_classes(cluster: Cluster) -> tuple[DeviceClass, ...]:
    """Devices grouped by ``(speed, memory)``, fastest class first."""
    groups: dict[tuple[float, float], dict[str, list[str]]] = {}
    for d in cluster.devices:
        groups.setdefault((d.speed, d.memory), {}).setdefault(d.server, []).append(d.id)
    ordered = sorted(groups.items(), key=lambda kv: (-kv[0][0], -kv[0][1]))
    return tuple(DeviceClass(speed, memory, tuple((s, tuple(ids)) for s, ids in by_server.items()))
                 for (speed, memory), by_server in ordered)


def _link_extremes(cluster: Cluster) -> tuple[float, float]:
    links = list(cluster.servers) + [cluster.network]
    return max(link.bandwidth for link in links), min(link.latency for link in links)


def _fits_one_server(classes: Sequence[DeviceClass], composition: Sequence[int]) -> bool:
    servers = {s for c in classes for s, _ in c.ids_by_server}
    for server in servers:
        if all(dict(c.ids_by_server).get(server, ()).__len__() >= n for c, n in zip(classes, composition)):
            return True
    return False


def _link_bounds(cluster: Cluster, classes: Sequence[DeviceClass], composition: Sequence[int]
                 ) -> tuple[float, float, float]:
    """``(bw_ub, lat_lb, send_bw_ub)`` for a stage of this composition, wherever it is placed.

    ``bw(D)``/``lat(D)`` of the group: if all its devices share a server ``S`` they are
    ``S``'s link, which must hold the whole composition; otherwise some pair crosses
    servers, so ``bw(D) <= network bandwidth`` and ``lat(D) >= network latency``.
    ``send_bw_ub`` bounds ``bw(D, D')`` for any other group ``D'``: for a device ``x``
    of a class ``c`` in ``D``, every pair ``(x, y)`` is ``x``'s server link or the
    network, so it is at most the best of those over the servers holding class ``c``.
    """
    net = cluster.network
    links = {s.id: s for s in cluster.servers}
    holding = [s for s in links if all(len(dict(c.ids_by_server).get(s, ())) >= n
                                       for c, n in zip(classes, composition))]
    bw_ub = max([net.bandwidth] + [links[s].bandwidth for s in holding])
    lat_lb = min([net.latency] + [links[s].latency for s in holding])
    send = min(max([net.bandwidth] + [links[s].bandwidth for s, _ in c.ids_by_server])
               for c, n in zip(classes, composition) if n)
    return bw_ub, lat_lb, send


def stage_options(problem: PlanningProblem, classes: Sequence[DeviceClass], clock: TimeLimit | None = None
                  ) -> tuple[Option, ...] | None:
    """Every composition (respecting ``allow_replication``) times recompute flags.

    ``None`` when ``clock`` expires first: with many classes (16 devices of distinct
    speeds have 65,535 compositions, about 1 s) this alone can outlast a short limit.
    """
    cluster = problem.cluster
    max_r = len(cluster.devices) if problem.allow_replication else 1
    flags = (False, True) if problem.allow_recompute else (False,)
    options = []
    for count, composition in enumerate(product(*(range(c.count + 1) for c in classes))):
        if clock is not None and count % 1024 == 1023 and clock.expired():
            return None
        r = sum(composition)
        if not 1 <= r <= max_r:
            continue
        used = [c for c, n in zip(classes, composition) if n]
        bw_ub, lat_lb, send_bw = _link_bounds(cluster, classes, composition)
        ar = (2 * (r - 1) * lat_lb, 2 * (r - 1) / (r * bw_ub)) if r >= 2 else (0.0, 0.0)
        for rc in flags:
            options.append(Option(tuple(composition), rc, r, min(c.speed for c in used),
                                  min(c.memory for c in used), ar, send_bw))
    return tuple(options)


def _op_list(schedule: str, m: int, tau: int):
    # Under 1F1B the list depends on the stage only through w = min(S-1-s, m) = min(tau, m).
    return gpipe_ops(m) if schedule == "gpipe" else one_f_one_b_ops(m, 0, tau + 1)


def stash_points(ops, per_replica: Sequence[int]) -> np.ndarray:
    """``(inputs, working)`` sample counts at every point where the stash may peak.

    The peak of :func:`pipeplan.solver.memory.stash_peak` is ``max(a * stash + b * working)``
    over these rows (``stash``, ``working`` per sample), exactly.
    """
    stash, points = 0, set()
    for kind, k in ops:
        if kind == FORWARD:
            stash += per_replica[k]
            points.add((stash, 0))
        else:
            points.add((stash, per_replica[k]))
            stash -= per_replica[k]
    return np.array(sorted(points), dtype=float)


def work_bound(problem: PlanningProblem) -> float:
    """``T >= W / V``: the whole model's work at full batch over the summed device speeds.

    Each stage keeps ``r_s`` devices of speed ``>= v_s`` busy ``busy_s <= T``, and
    ``busy_s r_s v_s >= M (a_f + a_b) + B (b_f + b_b)`` over its layers (``r q_k >= n_k``).
    """
    graph, sizes = problem.graph, problem.split
    fixed = sum(l.fwd[0] + l.bwd[0] for l in graph.layers) * len(sizes)
    per_sample = sum(l.fwd[1] + l.bwd[1] for l in graph.layers) * problem.global_batch
    return (fixed + per_sample) / sum(d.speed for d in problem.cluster.devices)


def _prefix(values: Sequence[float]) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=float))))


def build_data(problem: PlanningProblem, cutoff: float = math.inf, clock: TimeLimit | None = None) -> ExactData:
    """Enumerate the candidate arcs that fit in memory and whose standalone bound is below ``cutoff``.

    Vectorised over the layer ranges ``[lo, hi)``; one pass per (option, ``tau``).

    Parameters
    ----------
    problem : PlanningProblem
    cutoff : float
        Arcs whose standalone bound (any term of the module docstring that holds for
        every configuration holding the arc) reaches it are dropped.
    clock : TimeLimit, optional
        Enumeration stops (``complete = False``) when it expires.
    """
    graph, cluster = problem.graph, problem.cluster
    classes = device_classes(cluster)
    found = stage_options(problem, classes, clock)
    if found is None:  # out of time already
        return _unfinished(problem, classes, (), 0)
    options = found
    layers = graph.layers
    L, K, sizes = len(graph), problem.stage_limit, problem.split
    M, devices = len(sizes), len(cluster.devices)
    n_min, n_first, n_last = min(sizes), sizes[0], sizes[-1]
    bw_max, lat_min = _link_extremes(cluster)
    v_max = max(d.speed for d in cluster.devices)
    V = sum(d.speed for d in cluster.devices)
    r_max = devices if problem.allow_replication else 1
    q_best = -(-n_min // r_max)
    max_tau = min(K - 1, M) if problem.schedule == "1f1b" else 0
    sf = problem.state_factor
    # per-layer prefix sums
    P_af, P_bf = _prefix([l.fwd[0] for l in layers]), _prefix([l.fwd[1] for l in layers])
    P_ab, P_bb = _prefix([l.bwd[0] for l in layers]), _prefix([l.bwd[1] for l in layers])
    P_par, P_act = _prefix([l.params for l in layers]), _prefix([l.act for l in layers])
    lo_all, hi_all = np.triu_indices(L + 1, 1)
    lo_all, hi_all = lo_all.astype(np.int64), hi_all.astype(np.int64)
    AF, BF = P_af[hi_all] - P_af[lo_all], P_bf[hi_all] - P_bf[lo_all]
    AB, BB = P_ab[hi_all] - P_ab[lo_all], P_bb[hi_all] - P_bb[lo_all]
    PAR, ACT = P_par[hi_all] - P_par[lo_all], P_act[hi_all] - P_act[lo_all]
    PAR_END, ACT_END = sf * P_par[hi_all], P_act[hi_all]  # what rounding in sf * PAR and ACT scales with
    inputs = np.array([graph.stage_input_bytes(lo) for lo in range(L)] + [0.0])
    cuts = np.array([graph.cut_bytes(c) for c in range(L - 1)] + [0.0])
    INP, CUT = inputs[lo_all], cuts[hi_all - 1]
    last = hi_all == L
    first = lo_all == 0
    # fastest conceivable head / tail / pass of a layer range (other stages, unknown devices)
    head_min = np.where(first, 0.0, lat_min + (P_af[lo_all] + P_bf[lo_all] * q_best) / v_max)
    tail_min = np.where(first, 0.0, lat_min + (P_ab[lo_all] + P_bb[lo_all] * q_best) / v_max)
    u_layer = _prefix([(l.fwd[0] + l.bwd[0] + (l.fwd[1] + l.bwd[1]) * q_best) / v_max for l in layers])
    rest_pass = u_layer[L] - (u_layer[hi_all] - u_layer[lo_all])
    after_pass = u_layer[L] - u_layer[hi_all]
    w_layer = _prefix([M * (l.fwd[0] + l.bwd[0]) + problem.global_batch * (l.fwd[1] + l.bwd[1]) for l in layers])
    rest_work = w_layer[L] - (w_layer[hi_all] - w_layer[lo_all])
    if problem.schedule == "gpipe":
        tau_of = [np.zeros_like(lo_all)]
        tau_ok = [np.ones_like(last)]
    else:  # a stage followed by tau stages needs tau layers after it; tau = 0 only for the last stage
        tau_of = [np.full_like(lo_all, t) for t in range(max_tau + 1)]
        tau_ok = [last if t == 0 else (~last) & (L - hi_all >= t) for t in range(max_tau + 1)]
    ops_by_tau = {t: _op_list(problem.schedule, M, t) for t in range(max_tau + 1)}
    speed_of = [c.speed for c in classes]
    columns: dict[str, list[np.ndarray]] = {name: [] for name in ARC_FIELDS}
    plain_fits: dict[tuple, np.ndarray] = {}
    complete = True
    for index, opt in enumerate(options):
        if clock is not None and clock.expired():
            complete = False
            break
        r, v = opt.replicas, opt.speed
        q = [-(-n // r) for n in sizes]
        Q, q0, ql, qm = sum(q), q[0], q[-1], -(-n_min // r)
        fwd_sum = (M * AF + BF * Q) / v
        bwd_sum = (M * AB + BB * Q) / v + (fwd_sum if opt.recompute else 0.0)
        busy = fwd_sum + bwd_sum
        f_min = (AF + BF * qm) / v
        u = 2 * f_min + (AB + BB * qm) / v if opt.recompute else f_min + (AB + BB * qm) / v
        f0 = (AF + BF * q0) / v
        b_last = (AB + BB * ql) / v + ((AF + BF * ql) / v if opt.recompute else 0.0)
        ar = np.where(PAR > 0, opt.allreduce_params_coef[0] + opt.allreduce_params_coef[1] * PAR, 0.0) \
            if r > 1 else np.zeros_like(PAR)
        def send(n):  # one transfer of n samples across the stage's outgoing cut, fastest conceivable
            return np.where(last, 0.0, lat_min + n * CUT / (r * min(bw_max, opt.send_bandwidth)))
        pass_cost = u + 2 * send(n_min) + np.where(first, ar, 0.0)
        pass_plain = u + 2 * send(n_min)
        head_f = f0 + send(n_first)
        head_fb = head_f + b_last + send(n_last)
        work = busy * r * v / V
        busy_path = head_min + busy + np.maximum(ar, tail_min)
        vsum = sum(n * s for n, s in zip(opt.composition, speed_of))
        rest_share = np.where(rest_work > 0, rest_work / max(V - vsum, 1e-300), 0.0) if V - vsum > 1e-12 * V \
            else np.where(rest_work > 0, np.inf, 0.0)
        base = np.maximum.reduce([busy_path, rest_share, work + rest_work / V])
        for t in range(max_tau + 1):
            if r + t > devices:
                continue
            ok = tau_ok[t]
            points = stash_points(ops_by_tau[t], q)
            if opt.recompute:
                peak = sf * PAR + np.max(np.outer(INP, points[:, 0]) + np.outer(ACT, points[:, 1]), axis=1)
                scale = PAR_END + INP * points[:, 0].max() + ACT_END * points[:, 1].max()
            else:
                peak = sf * PAR + ACT * points[:, 0].max()
                scale = PAR_END + ACT_END * points[:, 0].max()
            fits = settle_borderline(ok & (peak <= opt.memory), peak, opt.memory, ok, lambda i: range_peak_memory(
                graph, sf, int(lo_all[i]), int(hi_all[i]), ops_by_tau[t], q, opt.recompute), scale=scale)
            key = (opt.composition, t)
            if opt.recompute:
                fits &= ~plain_fits.get(key, np.zeros_like(fits))  # dominated: the same devices without recompute fit
            else:
                plain_fits[key] = fits
            if problem.schedule == "gpipe":
                critical = busy
            else:
                w = min(t, M)
                tail_q = sum(q[w + 1:])
                critical = f0 + bwd_sum + ((M - 1 - w) * AF + BF * tail_q) / v if w + 1 < M else f0 + bwd_sum
            delta = critical - u
            standalone = np.maximum(base, pass_cost + delta + rest_pass)
            pivot_ar = pass_plain + delta + ar
            standalone = np.maximum(standalone, head_min + pivot_ar + after_pass)
            twice = two_round_trips(problem.schedule, M, t)
            if twice:  # term 2c: a second round trip (of the last microbatch)
                critical2 = _two_trip_ops(q, t, AF, BF, AB, BB, v, opt.recompute)
                delta2 = critical2 - u + (pass_plain - u)  # the own cut is crossed twice more
                pivot2_ar = pass_plain + delta2 + ar
                standalone = np.maximum.reduce([standalone, pass_cost + delta2 + rest_pass + after_pass,
                                                head_min + pivot2_ar + 2 * after_pass])
            else:  # placeholders, made valid once the largest later round trip is known (see below)
                delta2, pivot2_ar = delta, pivot_ar
            # term 2d: the pivot's path to F_{M-1}, which then runs on to a later stage's all-reduce
            f_last = (AF + BF * ql) / v
            chain = f_last + send(n_last)
            end_ar = f_last + (b_last if problem.schedule == "1f1b" else bwd_sum) + ar + 2 * send(n_min)
            if twice:  # F_0, microbatch 0's round trip (own cut here, the rest in R_l), B_0 .. F_{M-1}
                pivot_fwd = critical2 - b_last - f_last + 2 * send(n_min)
                standalone = np.maximum(standalone, head_min + pivot_fwd + end_ar + 2 * after_pass)
            else:  # every forward precedes B_0 (relaxed by R_max below, like term 2c)
                pivot_fwd = fwd_sum - f_last
                standalone = np.maximum(standalone, head_min + pivot_fwd + end_ar + after_pass)
            keep = np.flatnonzero(fits & (standalone < cutoff))
            if not len(keep):
                continue
            for name, col in (("lo", lo_all), ("hi", hi_all), ("busy_path", busy_path), ("pass_cost", pass_cost),
                              ("pivot_extra", delta), ("work", work), ("busy", busy), ("allreduce", ar),
                              ("head_f", head_f), ("head_fb", head_fb), ("standalone", standalone),
                              ("pivot_ar", pivot_ar), ("pivot2_extra", delta2), ("pivot2_ar", pivot2_ar),
                              ("chain", chain), ("pivot_fwd", pivot_fwd), ("end_ar", end_ar)):
                columns[name].append(col[keep])
            columns["tau"].append(np.full(len(keep), t, dtype=np.int64))
            columns["option"].append(np.full(len(keep), index, dtype=np.int64))
    arcs = sum(len(col) for col in columns["lo"])
    if complete and (clock is None or clock.remaining() > FINISH_SECONDS_PER_ARC * arcs):
        table = {name: np.concatenate(cols) if cols else _empty(name) for name, cols in columns.items()}
        order = np.lexsort((table["option"], table["tau"], table["hi"], table["lo"]))
        table = {name: col[order] for name, col in table.items()}
        _relax_single_trip_arcs(table, problem, L, M)
        data = ExactData(problem, classes, options, table, max_tau, K, 0.0, True)
        data.static_bound = max(_static_bound(data, cutoff), work_bound(problem))
        return data
    # Out of time, or too little left to sort and finish the table (its time is estimated
    # from the arcs): an unfinished table serves no model and no bound.
    return _unfinished(problem, classes, options, max_tau)


def _unfinished(problem: PlanningProblem, classes, options, max_tau: int) -> ExactData:
    """Data without arcs (``complete = False``): only the model-free work bound holds."""
    data = ExactData(problem, classes, options, {name: _empty(name) for name in ARC_FIELDS}, max_tau,
                     problem.stage_limit, 0.0, False)
    data.static_bound = work_bound(problem)
    return data


def _empty(name: str) -> np.ndarray:
    """An empty column of the arc table."""
    return np.zeros(0, dtype=np.int64 if name in ("lo", "hi", "tau", "option") else float)


def two_round_trips(schedule: str, m: int, tau: int) -> bool:
    """Whether a pivot with ``tau`` later stages runs ``F_{M-1}`` after ``B_0`` (term 2c applies).

    Under 1F1B with ``w = tau <= M - 2`` warm-up forwards, ``F_{w+1} .. F_{M-1}`` follow
    ``B_0``; under GPipe, or with ``w >= M - 1``, every forward precedes ``B_0``.
    """
    return schedule == "1f1b" and tau <= m - 2


def _two_trip_ops(q: Sequence[int], w: int, AF, BF, AB, BB, v: float, recompute: bool):
    """The pivot's ops on the path of term 2c, per layer range.

    ``F_0``, then everything from ``B_0`` through ``F_{M-1}`` (``B_0 .. B_{M-w-2}`` and
    ``F_{w+1} .. F_{M-1}``), then ``B_{M-1}``; the warm-up forwards ``F_1 .. F_w`` and the
    backwards ``B_{M-w-1} .. B_{M-2}`` run while the microbatch makes its round trips.
    """
    m = len(q)
    forwards = [0] + list(range(w + 1, m))
    backwards = list(range(0, m - w - 1)) + [m - 1]
    qf, qb = sum(q[k] for k in forwards), sum(q[k] for k in backwards)
    fwd = (len(forwards) * AF + BF * qf) / v
    bwd = (len(backwards) * AB + BB * qb) / v + ((len(backwards) * AF + BF * qb) / v if recompute else 0.0)
    return fwd + bwd


def _relax_single_trip_arcs(table: dict[str, np.ndarray], problem: PlanningProblem, L: int, M: int) -> None:
    """Term 2c coefficients for arcs whose pivot path has one round trip only.

    The rows of term 2c add ``2 R_l`` (or ``R_l`` once more): for an arc without a second
    round trip they hold if its coefficient is its term-2/2b value minus the largest
    ``R`` any configuration holding it can have, ``R_max(hi)``: the longest path of
    ``pass_cost`` over the arcs from layer ``hi`` to ``L`` (tau and devices ignored, so
    it is an upper bound).
    """
    lo, hi, tau, cost = table["lo"], table["hi"], table["tau"], table["pass_cost"]
    one_trip = [t for t in np.unique(tau).tolist() if not two_round_trips(problem.schedule, M, t)]
    single = np.isin(tau, one_trip)
    if not single.any():
        return
    # the table is sorted by lo: the arcs starting at layer l are first[l]:first[l+1]
    first = np.searchsorted(lo, np.arange(L + 1))
    longest = np.zeros(L + 1)
    for start in range(L - 1, -1, -1):
        mine = slice(first[start], first[start + 1])
        longest[start] = float(np.max(cost[mine] + longest[hi[mine]])) if first[start + 1] > first[start] else -np.inf
    reach = np.where(np.isfinite(longest), longest, 0.0)[hi]
    table["pivot2_extra"] = np.where(single, table["pivot_extra"] - reach, table["pivot2_extra"])
    table["pivot2_ar"] = np.where(single, table["pivot_ar"] - reach, table["pivot2_ar"])
    table["pivot_fwd"] = np.where(single, table["pivot_fwd"] - reach, table["pivot_fwd"])


def _static_bound(data: ExactData, cutoff: float) -> float:
    """``max_l min`` over arcs covering layer ``l`` of their standalone bound (``cutoff`` for pruned ones)."""
    L = len(data.problem.graph)
    lo, hi, value = data.table["lo"], data.table["hi"], data.table["standalone"]
    best = np.full((L + 1, L + 1), np.inf)
    np.minimum.at(best, (lo, hi), value)
    bound = 0.0
    for layer in range(L):
        covering = best[:layer + 1, layer + 1:]
        bound = max(bound, min(float(covering.min()) if covering.size else math.inf, cutoff))
    return bound


def config_lower_bound(data: ExactData, arc_ids: Sequence[int]) -> float:
    """The model's objective at the configuration made of ``arc_ids`` (every term of the docstring)."""
    arcs = sorted((Arc(*(data.table[name][i].item() for name in ARC_FIELDS)) for i in arc_ids), key=lambda a: a.lo)
    busy = head_f = head_fb = 0.0
    for a in arcs:
        busy = max(busy, head_fb + a.busy, head_f + a.busy + a.allreduce, a.busy_path)
        head_f += a.head_f
        head_fb += a.head_fb
    pivot = sum(a.pass_cost for a in arcs) + max(a.pivot_extra for a in arcs)
    # term 2b: heads of the earlier stages, the pivot with its all-reduce, passes of the later ones
    # term 2c: the same with a second round trip (both endings)
    pivot_ar, before, after = 0.0, 0.0, sum(a.pass_cost for a in arcs)
    total = after
    for a in arcs:
        after -= a.pass_cost
        pivot_ar = max(pivot_ar, before + a.pivot_ar + after, before + a.pivot2_ar + 2 * after,
                       total + a.pivot2_extra + after)
        before += a.head_f
    return max(busy, pivot, pivot_ar, _to_end_allreduce(arcs), sum(a.work for a in arcs))


def _to_end_allreduce(arcs: Sequence[Arc]) -> float:
    """Term 2d of a configuration (arcs in stage order): the best pivot ``s`` and end stage ``e >= s``."""
    after = [0.0] * len(arcs)  # after[k]: passes of the stages after k (R)
    for k in range(len(arcs) - 2, -1, -1):
        after[k] = after[k + 1] + arcs[k + 1].pass_cost
    best, head = 0.0, 0.0
    for s, pivot in enumerate(arcs):
        chain = 0.0  # F_{M-1} through the stages s .. e-1
        for e in range(s, len(arcs)):
            best = max(best, head + pivot.pivot_fwd + after[s] + chain + arcs[e].end_ar + after[e])
            chain += arcs[e].chain
        head += pivot.head_f
    return best


# ------------------------------------------------------------------- model rows
@dataclass(frozen=True)
class CountRow:
    """``sum coef * x[arc] (sense) rhs`` with integer coefficients."""

    terms: tuple[tuple[int, int], ...]
    sense: str
    """``"<="`` or ``"=="``."""
    rhs: int


@dataclass(frozen=True)
class TimeRow:
    """``sum coef * aux (sense) sum seconds * x[arc]``: aux are time variables (``T``, ``D``, ...).

    ``aux`` holds ``(name, integer coefficient)``; ``terms`` holds ``(arc, seconds)``;
    ``sense`` is ``">="`` or ``"=="``.  A backend that floors the seconds (CP-SAT) keeps
    every ``>=`` row valid and every ``==`` row an exact definition of its aux variable.
    """

    aux: tuple[tuple[str, int], ...]
    terms: tuple[tuple[int, float], ...]
    sense: str = ">="


SIGNED_AUX = ("Ce", "Cs", "Cq")
"""Prefixes of the aux variables of :func:`model_rows` that may be negative (term 2c's relaxed sums)."""


def model_rows(data: ExactData) -> tuple[list[CountRow], list[TimeRow]]:
    """The lower-bound model as plain rows, for either backend.

    Count rows: a path of arcs from layer 0 to layer ``L`` whose ``tau`` labels count the
    later stages (capped at ``max_tau``), at most ``stage_limit`` stages, and at most
    the available devices of each class.  Time rows: terms 1, 2 (2b, 2c) and 4 of the
    module docstring, with auxiliary time variables so that each arc appears in O(1) rows per
    term: ``C{k}_l = sum over arcs covering l of c_k x`` (defined by differences from
    layer to layer), ``H{k}_l = sum over arcs ending at or before l of h_k x``,
    ``R_l = sum over arcs starting after l of u' x`` (defined from the last layer down);
    term 2c reuses ``R_l`` twice (``E >= Ce_l + R_l``, ``T >= U + E``).
    """
    L, tab = len(data.problem.graph), data.table
    n = len(data)
    lo, hi, tau, opt = (tab[k].tolist() for k in ("lo", "hi", "tau", "option"))
    rows: list[CountRow] = [CountRow(tuple((i, 1) for i in range(n) if lo[i] == 0), "==", 1)]
    starts: dict[tuple[int, int], list[int]] = {}  # (layer, label) -> arcs starting there
    ends: dict[tuple[int, int], list[int]] = {}  # (layer, label) -> arcs ending there
    by_lo: list[list[int]] = [[] for _ in range(L + 1)]
    by_hi: list[list[int]] = [[] for _ in range(L + 1)]
    for i in range(n):
        starts.setdefault((lo[i], tau[i]), []).append(i)
        ends.setdefault((hi[i], tau[i]), []).append(i)
        by_lo[lo[i]].append(i)
        by_hi[hi[i]].append(i)
    capped = data.problem.schedule == "1f1b" and data.max_tau < data.stage_limit - 1
    for b in range(1, L):
        if data.problem.schedule == "gpipe":
            rows.append(_balance(ends.get((b, 0), []), starts.get((b, 0), [])))
            continue
        for label in range(0, data.max_tau + 1):
            inflow = ends.get((b, label + 1), [])
            outflow = list(starts.get((b, label), []))
            if capped and label == data.max_tau - 1:
                outflow += starts.get((b, data.max_tau), [])  # a capped stage may follow a capped one
            elif capped and label == data.max_tau:
                continue
            rows.append(_balance(inflow, outflow))
    rows.append(CountRow(tuple((i, 1) for i in range(n)), "<=", data.stage_limit))
    comps = [o.composition for o in data.options]
    for c, cls in enumerate(data.classes):
        terms = tuple((i, comps[opt[i]][c]) for i in range(n) if comps[opt[i]][c])
        rows.append(CountRow(terms, "<=", cls.count))
    times: list[TimeRow] = []
    cover = {"Cb": tab["busy"].tolist(), "Ca": (tab["busy"] + tab["allreduce"]).tolist(),
             "Cd": tab["pivot_extra"].tolist(), "Cr": tab["pivot_ar"].tolist(),
             "Ce": tab["pivot2_extra"].tolist(), "Cs": tab["pivot2_ar"].tolist(),
             "Cq": tab["pivot_fwd"].tolist(), "Cz": tab["end_ar"].tolist()}
    heads = {"Hf": tab["head_f"].tolist(), "Hb": tab["head_fb"].tolist(), "G": tab["chain"].tolist()}
    for name, c in cover.items():  # C_l - C_{l-1} = sum_{lo=l} c x - sum_{hi=l} c x
        for layer in range(L):
            aux = ((f"{name}{layer}", 1),) + (((f"{name}{layer - 1}", -1),) if layer else ())
            terms = tuple((i, c[i]) for i in by_lo[layer]) + tuple((i, -c[i]) for i in by_hi[layer])
            times.append(TimeRow(aux, terms, "=="))
    for name, h in heads.items():  # H_l - H_{l-1} = sum_{hi=l} h x, H_0 = 0
        for layer in range(1, L):
            aux = ((f"{name}{layer}", 1),) + (((f"{name}{layer - 1}", -1),) if layer > 1 else ())
            times.append(TimeRow(aux, tuple((i, h[i]) for i in by_hi[layer]), "=="))
    pass_cost = tab["pass_cost"].tolist()
    for layer in range(L - 2, -1, -1):  # R_l - R_{l+1} = sum_{lo=l+1} pass_cost x, R_{L-1} = 0
        aux = ((f"R{layer}", 1),) + (((f"R{layer + 1}", -1),) if layer < L - 2 else ())
        times.append(TimeRow(aux, tuple((i, pass_cost[i]) for i in by_lo[layer + 1]), "=="))
    for layer in range(L):
        hf = ((f"Hf{layer}", -1),) if layer else ()
        rr = ((f"R{layer}", -1),) if layer < L - 1 else ()
        times.append(TimeRow((("T", 1), (f"Cr{layer}", -1)) + hf + rr, ()))  # term 2b: pivot + all-reduce
        rr2 = ((f"R{layer}", -2),) if layer < L - 1 else ()
        times.append(TimeRow((("T", 1), (f"Cs{layer}", -1)) + hf + rr2, ()))  # term 2c, ending in the all-reduce
        times.append(TimeRow((("E", 1), (f"Ce{layer}", -1)) + rr, ()))  # term 2c: second trip + pivot's ops
    for layer in range(L - 1, -1, -1):  # term 2d: Z_l = Cz_l + R_l + G_l, ZM_l = max over l' >= l of Z_l'
        rr = ((f"R{layer}", -1),) if layer < L - 1 else ()
        gg = ((f"G{layer}", -1),) if layer else ()
        times.append(TimeRow(((f"ZM{layer}", 1), (f"Cz{layer}", -1)) + rr + gg, ()))
        if layer < L - 1:
            times.append(TimeRow(((f"ZM{layer}", 1), (f"ZM{layer + 1}", -1)), ()))
        hf = ((f"Hf{layer}", -1),) if layer else ()
        g_back = ((f"G{layer}", 1),) if layer else ()
        times.append(TimeRow((("T", 1), (f"Cq{layer}", -1), (f"ZM{layer}", -1)) + hf + rr + g_back, ()))
    for layer in range(L):
        hb = ((f"Hb{layer}", -1),) if layer else ()
        hf = ((f"Hf{layer}", -1),) if layer else ()
        times.append(TimeRow((("T", 1), (f"Cb{layer}", -1)) + hb, ()))  # head + busy + tail
        times.append(TimeRow((("T", 1), (f"Ca{layer}", -1)) + hf, ()))  # head + busy + all-reduce
        times.append(TimeRow((("D", 1), (f"Cd{layer}", -1)), ()))  # the pivot's extra ops
    times.append(TimeRow((("T", 1), ("D", -1)), tuple((i, c) for i, c in enumerate(tab["pass_cost"].tolist()))))
    times.append(TimeRow((("T", 1), ("E", -1)), tuple((i, c) for i, c in enumerate(tab["pass_cost"].tolist()))))
    times.append(TimeRow((("T", 1),), tuple((i, c) for i, c in enumerate(tab["work"].tolist()))))
    return [r for r in rows if r.terms or r.rhs], times


def _balance(inflow: list[int], outflow: list[int]) -> CountRow:
    return CountRow(tuple((i, 1) for i in inflow) + tuple((i, -1) for i in outflow), "==", 0)


# ---------------------------------------------------------------------- placements
def _server_signature(cluster: Cluster, classes: Sequence[DeviceClass]) -> dict[str, tuple]:
    """Servers with the same link and the same devices per class are interchangeable."""
    links = {s.id: (s.bandwidth, s.latency) for s in cluster.servers}
    counts = {s: tuple(len(dict(c.ids_by_server).get(s, ())) for c in classes) for s in links}
    return {s: (links[s], counts[s]) for s in links}


def placements(data: ExactData, arc_ids: Sequence[int], limit: int = PLACEMENT_LIMIT
               ) -> tuple[list[list[tuple[str, ...]]], bool]:
    """Concrete device groups for a configuration, distinct up to server symmetry.

    Returns
    -------
    groups : list of list of tuple of str
        Up to ``limit`` placements, each one device tuple per stage; the first keeps
        stages on as few servers as possible.
    exhaustive : bool
        Whether every placement (up to symmetry) is in ``groups``.
    """
    classes, cluster = data.classes, data.problem.cluster
    compositions = [data.options[int(data.table['option'][i])].composition for i in arc_ids]
    signature = _server_signature(cluster, classes)
    pools = {(c, s): list(ids) for c, cls in enumerate(classes) for s, ids in cls.ids_by_server}
    servers = [s.id for s in cluster.servers]
    found: list[list[tuple[str, ...]]] = []
    seen: set[tuple] = set()
    truncated = False

    def canonical(choice: list[list[tuple[int, str, int]]]) -> tuple:
        names: dict[str, tuple] = {}
        per_sig: dict[tuple, int] = {}
        out = []
        for stage in choice:
            row = []
            for c, s, k in stage:
                if s not in names:
                    sig = signature[s]
                    names[s] = (sig, per_sig.setdefault(sig, 0))
                    per_sig[sig] += 1
                row.append((c, names[s], k))
            out.append(tuple(sorted(row)))
        return tuple(out)

    def stage_choices(composition, used, previous):
        order = sorted(servers, key=lambda s: (s not in previous, -sum(
            len(pools.get((c, s), ())) - used.get((c, s), 0) for c in range(len(classes))), servers.index(s)))
        per_class = [list(_spreads(n, [(s, len(pools.get((c, s), ())) - used.get((c, s), 0)) for s in order]))
                     for c, n in enumerate(composition)]
        for combo in product(*per_class):
            yield [(c, s, k) for c, spread in enumerate(combo) for s, k in spread]

    def dfs(stage: int, used: dict, choice: list, previous: set) -> None:
        nonlocal truncated
        if truncated:
            return
        if stage == len(compositions):
            key = canonical(choice)
            if key in seen:
                return
            if len(found) >= limit:
                truncated = True
                return
            seen.add(key)
            found.append(_materialise(choice, pools))
            return
        for picks in stage_choices(compositions[stage], used, previous):
            for c, s, k in picks:
                used[(c, s)] = used.get((c, s), 0) + k
            dfs(stage + 1, used, choice + [picks], {s for _, s, _ in picks})
            for c, s, k in picks:
                used[(c, s)] -= k

    dfs(0, {}, [], set())
    return found, not truncated


def _spreads(n: int, room: list[tuple[str, int]]) -> Iterator[tuple[tuple[str, int], ...]]:
    """Ways to take ``n`` devices from servers with the given free counts, in order."""
    if n == 0:
        yield ()
        return
    if not room:
        return
    (server, free), rest = room[0], room[1:]
    for take in range(min(n, free), -1, -1):
        for tail in _spreads(n - take, rest):
            yield (((server, take),) if take else ()) + tail


def _materialise(choice, pools) -> list[tuple[str, ...]]:
    taken: dict[tuple[int, str], int] = {}
    groups = []
    for picks in choice:
        ids: list[str] = []
        for c, s, k in picks:
            start = taken.get((c, s), 0)
            ids.extend(pools[(c, s)][start:start + k])
            taken[(c, s)] = start + k
        groups.append(tuple(ids))
    return groups


# --------------------------------------------------------------------- the cut loop
class LowerBoundModel(Protocol):
    """What a backend (MILP or CP-SAT) offers the cut loop."""

    def solve(self, cutoff: float, time_limit: float) -> tuple[str, list[int] | None, float | None]:
        """Minimise the bound subject to ``T <= cutoff``.

        Returns ``(status, arc ids or None, proved bound or None)`` with status
        ``"optimal"``, ``"feasible"`` (stopped early with a solution), ``"infeasible"``
        or ``"unknown"`` (stopped early without one).
        """
        ...

    def exclude(self, arc_ids: Sequence[int]) -> None:
        """Add the no-good cut ``sum x[arc_ids] <= len(arc_ids) - 1``."""
        ...


@dataclass
class _Search:
    """The cut loop's state: incumbent, bounds, trace."""

    problem: PlanningProblem
    clock: TimeLimit
    best_plan: Plan | None = None
    best_time: float = math.inf
    bound: float = 0.0
    pool: float = math.inf
    trace: list[TracePoint] = field(default_factory=list)

    def offer(self, plan: Plan) -> None:
        if not self.problem.in_search_space(plan):
            return
        sim = simulate(plan, self.problem.graph, self.problem.cluster, validate=False)
        if sim.fits and sim.iteration_time < self.best_time:
            self.best_plan, self.best_time = plan, sim.iteration_time
            self.record()

    def raise_bound(self, value: float) -> None:
        value = min(value, self.best_time, self.pool)
        if value > self.bound:
            self.bound = value
            self.record()

    def record(self) -> None:
        incumbent = self.best_time if self.best_plan is not None else None
        self.trace.append(TracePoint(self.clock.elapsed(), incumbent, self.bound))

    def cutoff(self) -> float:
        return self.best_time * (1 - OPT_TOL) if self.best_plan is not None else math.inf

    def proved(self) -> bool:
        return self.best_plan is not None and self.bound >= self.best_time * (1 - OPT_TOL) * (1 - 1e-12)


SLOW_BASELINES = ("Dapple", "Alpa")
"""Baselines (class names) with slow pure-Python DPs: run after the others, with their own time share."""


def warm_start_plans(problem: PlanningProblem, seed: int, time_limit: float, slow: bool = False) -> list[Plan]:
    """Baseline plans within ``time_limit`` seconds, and the greedy plans.

    Like :func:`pipeplan.solver.baselines.best_baseline`, each baseline gets an equal share of
    what is left, cheapest first.  ``slow=False`` runs every baseline but those of
    :data:`SLOW_BASELINES` (and adds :func:`greedy_plans`); ``slow=True`` runs only those.
    """
    plans = [] if slow else greedy_plans(problem)
    try:
        from pipeplan.solver.baselines import BASELINES  # written separately; may be missing
    except Exception:  # noqa: BLE001 - a broken baseline must not break an exact solver
        return plans
    chosen = [cls for cls in BASELINES if (cls.__name__ in SLOW_BASELINES) == slow]
    end = time.perf_counter() + time_limit
    for n, cls in enumerate(chosen):
        share = (end - time.perf_counter()) / (len(chosen) - n)
        if share <= 0.005:
            break
        try:
            result = cls().solve(problem, time_limit=share, seed=seed)
        except Exception:  # noqa: BLE001
            continue
        if result.plan is not None:
            plans.append(result.plan)
    return plans


def greedy_plans(problem: PlanningProblem) -> list[Plan]:
    """For each stage count, the fastest devices with layers split by speed."""
    graph, devices = problem.graph, sorted(problem.cluster.devices, key=lambda d: (-d.speed, -d.memory))
    work = [l.fwd[0] + l.bwd[0] + (l.fwd[1] + l.bwd[1]) * problem.global_batch for l in graph.layers]
    total, plans = sum(work), []
    for count in range(1, problem.stage_limit + 1):
        chosen = devices[:count]
        speed_sum = sum(d.speed for d in chosen)
        bounds, lo, acc, target = [], 0, 0.0, 0.0
        for s, d in enumerate(chosen):
            target += total * d.speed / speed_sum
            hi = lo + 1
            while hi < len(work) - (count - 1 - s) and acc + work[hi - 1] + work[hi] / 2 <= target:
                acc += work[hi - 1]
                hi += 1
            acc += work[hi - 1]
            hi = len(work) if s == count - 1 else hi
            bounds.append((lo, hi))
            lo = hi
        groups = [(d.id,) for d in chosen]
        plans.append(problem.make_plan(bounds, groups, [False] * count))
        if problem.allow_recompute:
            plans.append(problem.make_plan(bounds, groups, [True] * count))
    return plans


def plan_config(data: ExactData, plan: Plan) -> list[int] | None:
    """Arc ids of ``plan``'s configuration, if all its arcs are in the model."""
    tab = data.table
    index = {key: i for i, key in enumerate(zip(tab["lo"].tolist(), tab["hi"].tolist(), tab["tau"].tolist(),
                                                 tab["option"].tolist()))}
    class_of = {d: c for c, cls in enumerate(data.classes) for _, ids in cls.ids_by_server for d in ids}
    option_of = {(o.composition, o.recompute): i for i, o in enumerate(data.options)}
    S, ids = len(plan.stages), []
    for s, st in enumerate(plan.stages):
        comp = [0] * len(data.classes)
        for d in st.devices:
            comp[class_of[d]] += 1
        opt = option_of.get((tuple(comp), st.recompute))
        tau = min(S - 1 - s, data.max_tau)
        arc = index.get((st.layers[0], st.layers[1], tau, opt))
        if arc is None:
            return None
        ids.append(arc)
    return ids


def improve_with_ga(problem: PlanningProblem, search: "_Search", clock: TimeLimit, seed: int) -> None:
    """Spend time no model can use on NSGA-II, seeded with the incumbent.

    With a fixed microbatch count the GA keeps the equal split, so its plans lie in this
    search space; they only improve the incumbent and never touch the bound.  The GA is
    given its own seeds, so it does not call back into the exact solvers.
    """
    if search.best_plan is None or problem.free_sizes or clock.remaining() < 1.0:
        return
    from pipeplan.solver.nsga import run_nsga  # the GA imports the registry; import it only when needed

    seeds = [("incumbent", search.best_plan)]
    for round_ in range(8):  # restart from the best front (a new seed each time) while time is left
        run = run_nsga(problem, seed=seed + round_, time_limit=0.9 * clock.remaining(), seeds=seeds)
        for point in run.front:
            search.offer(point.plan)
        seeds = [("incumbent", search.best_plan)] + [("front", p.plan) for p in run.front[:8]]
        if clock.remaining() < 2.0:
            break


GROUP_SEARCH_SHARE = 0.3
"""Most of the time limit :mod:`pipeplan.solver.group_search` may take for the incumbent.  It stops on its own
when done (about 4 s on 96 layers x 64 devices), so the share only binds at short limits, where its
plan is the best the solvers return: with 10 % of a 2 s limit on 48 layers x 14 devices of 6 classes
it was cut short and the exact solvers returned the best baseline (421 ms); with 30 %, 347 ms."""

GA_SHARE, GA_SHARE_NO_MODEL = 0.2, 0.05
"""Share of the time limit kept for NSGA-II from the incumbent, with and without a model to solve."""

ENUMERATION_SHARE = 0.6
"""Share of the time left that the configuration walk (:mod:`pipeplan.solver.enumeration`) may use before the model."""


def solve_exact(problem: PlanningProblem, name: str, make_model: Callable[[ExactData], LowerBoundModel], *,
                time_limit: float, seed: int, details: dict | None = None, enumerate_first: bool = True,
                build_seconds_per_arc: float = BUILD_SECONDS_PER_ARC) -> SolverResult:
    """Run the configuration walk, then the cut loop described in the module docstring; report the result.

    With ``enumerate_first`` (the default) :func:`pipeplan.solver.enumeration.enumerate_configurations`
    first walks the configurations directly, with up to :data:`ENUMERATION_SHARE` of the
    time left; when it finishes, the incumbent is proved optimal without the model.
    Otherwise the model's cut loop goes on from the improved incumbent, if the model can
    be built and handed to its solver in the time left (``build_seconds_per_arc``: what
    that takes per arc, which no time limit can interrupt).
    """
    details = dict(details or {})
    clock = TimeLimit(time_limit).start()
    search = _Search(problem, clock)
    for plan in warm_start_plans(problem, seed, min(1.0, 0.03 * time_limit)):
        search.offer(plan)
    from pipeplan.solver.group_search import group_search  # it imports the baselines, which import this module

    for judged in group_search(problem, min(GROUP_SEARCH_SHARE * time_limit, clock.remaining())).plans:
        search.offer(judged.plan)
    # The slow DP baselines too: an exact solver must never return a plan worse than a
    # baseline would, even when the model does not reach a solution.  They keep their
    # time share, but run after the model when it is built (a proof makes them moot).
    slow_share = min(5.0, 0.1 * time_limit)
    slow_done = False

    def run_slow(share: float) -> None:
        nonlocal slow_done
        slow_done = True
        for slow_plan in warm_start_plans(problem, seed, share, slow=True):
            search.offer(slow_plan)

    # The build stops early enough to leave the slow baselines their share within the limit.
    data = build_data(problem, search.cutoff(), TimeLimit(max(clock.remaining() - slow_share, 0.0)).start())
    too_big = len(data) > MAX_MODEL_ARCS  # no model; the configuration walk may still run
    if not data.complete or (too_big and not enumerate_first):
        # The model may not run: their plans first (with a larger share, at least what a
        # baseline run on its own usually gets), and a tighter cutoff.
        run_slow(min(max(slow_share, min(0.4 * time_limit, 0.5 * clock.remaining())), clock.remaining()))
        if data.complete and not clock.expired():
            data = build_data(problem, search.cutoff(), clock)
            too_big = len(data) > MAX_MODEL_ARCS
    if not data.complete or clock.expired() or (too_big and not enumerate_first):
        if not slow_done:
            run_slow(min(slow_share, clock.remaining()))
        # out of time, or a model too large to build in time: only the model-free bound holds
        search.raise_bound(data.static_bound)
        improve_with_ga(problem, search, clock, seed)
        return _result(name, search, data, clock, seed, "unknown", 0, 0, details)
    search.raise_bound(data.static_bound if len(data) else search.best_time)
    L = len(problem.graph)
    if not (data.table["lo"] == 0).any() or not (data.table["hi"] == L).any():
        # no candidate stage can start or end the pipeline below the cutoff
        search.raise_bound(search.cutoff() if search.best_plan is not None else math.inf)
        if not search.proved() and not slow_done:
            run_slow(min(slow_share, clock.remaining()))
        return _result(name, search, data, clock, seed, "infeasible", 0, 0, details)
    # When the cut loop cannot prove the incumbent in time, a share of the limit goes to
    # NSGA-II from the incumbent (a slow MILP leaves the loop only a few configurations).
    # Without a model the walk is the only source of bound, and on the instances that big
    # (64 devices) NSGA-II has not improved group-search's plans: the walk gets most of it.
    ga_share = (GA_SHARE_NO_MODEL if too_big else GA_SHARE) * time_limit if time_limit >= 10.0 else 0.0
    reserve = ga_share + (0.0 if slow_done else min(slow_share, 0.5 * clock.remaining()))
    if enumerate_first:
        from pipeplan.solver.enumeration import enumerate_configurations  # it imports this module

        share = max(clock.remaining() - reserve, 0.0) * (1.0 if too_big else ENUMERATION_SHARE)
        walk = enumerate_configurations(data, search, TimeLimit(share).start())
        details.update(enumeration="complete" if walk.complete else "skipped" if walk.skipped else "stopped",
                       enumeration_prefixes=walk.prefixes,
                       enumeration_leaves=walk.leaves, enumeration_passes=walk.passes)
        if walk.complete:  # every configuration below the cutoff was simulated
            search.raise_bound(search.cutoff() if search.best_plan is not None else math.inf)
        else:
            search.raise_bound(walk.bound)
        if search.proved() or (walk.complete and search.best_plan is None):
            status = "not needed" if search.best_plan is not None else "infeasible"
            return _result(name, search, data, clock, seed, status, 0, 0, details)
    build = max(build_seconds_per_arc * len(data) - BUILD_OVERRUN_SECONDS, 0.0)  # time the build needs
    if too_big or clock.remaining() - reserve <= build:
        # no model: too big to build in time, or not built in the time left; the walk's bound stands
        if not slow_done:
            run_slow(min(slow_share, clock.remaining()))
        improve_with_ga(problem, search, clock, seed)
        return _result(name, search, data, clock, seed, "model not built", 0, 0, details)
    model = make_model(data)
    iterations = cuts = 0
    hint = plan_config(data, search.best_plan) if search.best_plan is not None else None
    if hint is not None and hasattr(model, "hint"):
        model.hint(hint)
    status = "unknown"
    while not search.proved() and clock.remaining() - reserve > 0:
        iterations += 1
        status, arc_ids, model_bound = model.solve(search.cutoff(), clock.remaining() - reserve)
        if status == "infeasible":
            # no configuration left below the cutoff: the incumbent is optimal
            search.raise_bound(search.cutoff() if search.best_plan is not None else math.inf)
            break
        if model_bound is not None:
            search.raise_bound(model_bound * (1 - MODEL_TOL))
        if arc_ids is None:
            break
        _evaluate(data, search, arc_ids, clock)
        model.exclude(arc_ids)  # valid whatever the model's status: the configuration was simulated
        cuts += 1
    if not search.proved() and not slow_done:
        run_slow(min(slow_share, max(clock.remaining() - ga_share, 0.0)))
    if not search.proved():
        improve_with_ga(problem, search, clock, seed)
    return _result(name, search, data, clock, seed, status, iterations, cuts, details)


def optimistic_time(data: ExactData, arc_ids: Sequence[int]) -> float:
    """The simulated iteration time of a configuration with every link at its best conceivable value.

    Ops take their exact durations (they depend on the composition only); each transfer
    takes ``lat_min + n * cut / (min(r_s, r_{s+1}) * bw)`` with ``bw`` the smallest of
    the two stages' ``send_bandwidth`` (and the fastest link), each all-reduce its lower
    bound of term 3.  Every duration is at most its value under any placement, and the
    timeline is monotone in its durations (a max-plus system: op and link orders are
    fixed by the op lists), so the result bounds every placement's iteration time.
    """
    problem = data.problem
    graph, sizes = problem.graph, problem.split
    tab = data.table
    ordered = sorted(arc_ids, key=lambda i: int(tab["lo"][i]))
    options = [data.options[int(tab["option"][i])] for i in ordered]
    bw_max, lat_min = _link_extremes(problem.cluster)
    S, same = len(ordered), tuple((k, k) for k in range(len(sizes)))
    costs = []
    for s, (i, opt) in enumerate(zip(ordered, options)):
        lo, hi = int(tab["lo"][i]), int(tab["hi"][i])
        af, bf, ab, bb = graph.range_time(lo, hi)
        q = tuple(-(-n // opt.replicas) for n in sizes)
        fwd = tuple((af + bf * k) / opt.speed for k in q)
        rec = fwd if opt.recompute else tuple(0.0 for _ in q)
        bwd = tuple((ab + bb * k) / opt.speed + x for k, x in zip(q, rec))

        def sends(other: Option, cut: float) -> tuple[float, ...]:
            rate = min(opt.replicas, other.replicas) * min(bw_max, opt.send_bandwidth, other.send_bandwidth)
            return tuple(lat_min + n * cut / rate for n in sizes)

        send_fwd = sends(options[s + 1], graph.cut_bytes(hi - 1)) if s < S - 1 else ()
        send_bwd = sends(options[s - 1], graph.cut_bytes(lo - 1)) if s > 0 else ()
        params = graph.range_sum("params", lo, hi)
        fixed, per_byte = opt.allreduce_params_coef
        allreduce = fixed + per_byte * params if opt.replicas > 1 and params > 0 else 0.0
        ops = tuple(_op_list(problem.schedule, len(sizes), min(S - 1 - s, len(sizes))))
        costs.append(StageCost(ops, fwd, bwd, rec, q, tuple(sizes), send_fwd, send_bwd, same if s else (),
                               same if s < S - 1 else (), allreduce, 0.0, math.inf))
    return run_timeline(tuple(costs), problem.global_batch).iteration_time


def _evaluate(data: ExactData, search: _Search, arc_ids: Sequence[int], clock: TimeLimit,
              target: float = math.inf, floor: float | None = None, pool_on_clock: bool = True) -> bool:
    """Simulate a configuration's placements while its optimistic time is below the cutoff.

    The cutoff is the incumbent's, or ``target`` when lower (a caller that only claims
    a bound of ``target``).  A configuration whose :func:`optimistic_time` ``floor``
    (computed if not given) reaches it needs no placement.  With more placements than
    :data:`PLACEMENT_LIMIT`, ``floor`` goes to the pool (which caps every bound
    reported).  When the clock stops the placements, it goes to the pool too, unless
    ``pool_on_clock`` is false (a caller that accounts for the configuration itself).

    Returns
    -------
    bool
        Whether the configuration is settled for good: every placement simulated or
        pooled, or ``floor`` at least the incumbent's cutoff.
    """

    def cutoff() -> float:
        return min(search.cutoff(), target)

    problem = data.problem
    lo, hi, opt = data.table["lo"], data.table["hi"], data.table["option"]
    ordered = sorted(arc_ids, key=lambda i: int(lo[i]))
    floor = optimistic_time(data, ordered) if floor is None else floor
    if floor >= cutoff():
        return floor >= search.cutoff()
    bounds = [(int(lo[i]), int(hi[i])) for i in ordered]
    flags = [data.options[int(opt[i])].recompute for i in ordered]
    groups, exhaustive = placements(data, ordered)
    for k, devs in enumerate(groups):
        if floor >= cutoff():
            return floor >= search.cutoff()  # no other placement can beat the cutoff
        if k and clock.remaining() <= 0:
            if not pool_on_clock:
                return False
            search.pool = min(search.pool, floor)
            return True
        search.offer(problem.make_plan(bounds, devs, flags))
    if not exhaustive and floor < search.cutoff():  # placements beyond the limit: pooled
        search.pool = min(search.pool, floor)
    return True


def _result(name, search: _Search, data: ExactData, clock: TimeLimit, seed, status, iterations, cuts,
            details) -> SolverResult:
    details = dict(details, iterations=iterations, cuts=cuts, arcs=len(data), classes=len(data.classes),
                   options=len(data.options), last_model_status=status)
    if search.best_plan is None:
        if data.complete and (status == "infeasible" or not len(data)):
            search.raise_bound(math.inf)
            return SolverResult(name, "infeasible", None, None, None, clock.elapsed(), seed, tuple(search.trace),
                                _infeasible_message(data), details)
        return SolverResult(name, "timeout-no-solution", None, None, search.bound or None, clock.elapsed(), seed,
                            tuple(search.trace), "time limit reached before a fitting plan was found", details)
    proved = search.proved()  # up to OPT_TOL: the bound stays the proved one (see OPT_TOL)
    search.record()
    message = "" if proved else "time limit reached; the gap is not closed"
    return SolverResult(name, "optimal" if proved else "feasible", search.best_plan, search.best_time,
                        search.bound, clock.elapsed(), seed, tuple(search.trace), message, details)


def _infeasible_message(data: ExactData) -> str:
    from pipeplan.solver.infeasibility import tightest_constraint

    return f"no plan fits in memory: {tightest_constraint(data.problem)}"
