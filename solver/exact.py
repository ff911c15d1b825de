"""Shared machinery of the exact solvers (``ilp`` and ``cpsat``).

Both solvers minimise a *provable lower bound* ``LB(config) <= T(plan)`` over type-level
configurations, simulate the best configuration, keep the best simulated incumbent,
exclude that configuration with a no-good cut and solve again, until the model's
optimum reaches the incumbent (a proof of optimality) or time runs out.

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
   earlier stage (``head``), then runs all its ops one at a time (``busy``), and after
   its last op ``B_{M-1}`` either all-reduces (``AR_s``) or ``B_{M-1}`` still runs on
   every earlier stage (``tail``).  ``head`` and ``tail`` are bounded below by the
   layers ``[0, lo)`` at the largest speed and replication, plus one latency each
   if ``lo > 0``.  Linear form: ``T >= sum over arcs covering layer l of c1 * x`` for
   every layer ``l`` (exactly one chosen arc covers ``l``).
2. **Pivot path** ``U + D``: microbatch 0 (or ``M-1``) crosses every stage ``j != s``
   once forward and once backward, and stage ``s`` runs the ops on its critical path.
   Each stage ``j != s`` contributes at least ``u_j = TF_j(n_min) + TB_j(n_min)``, and
   each cut is crossed once each way, at least ``lat_min + n_min * cut / (r_j *
   bw_max)`` (``min(r_j, r_{j+1}) <= r_j``).  Stage ``s`` contributes ``u_s + delta_s``:
   under GPipe all its ops (``F_{M-1}`` ends, the last forward reaches the last stage,
   ``B0`` comes back, then all backwards run), so ``delta = busy - u``; under 1F1B with
   ``w = min(S-1-s, M)`` warm-up forwards, ``F0``, then after ``B0`` returns every
   backward and ``F_{w+1} .. F_{M-1}``, so ``delta = TF(0) + sum TB + sum_{k>w} TF(k)
   - u``.  The path ends at the end of stage 0's last op, so ``AR_0`` adds on top.
   Linear form: ``T >= U + D`` with ``U = sum u' x`` and ``D >= sum over arcs covering
   l of delta * x`` for every layer ``l``.
3. **All-reduce**: ``AR_s >= 2 (r-1) (lat_lb + P_s / (r bw_ub))`` with ``bw_ub`` the
   network bandwidth when the composition fits on no single server (some pair then
   crosses servers), else the largest link bandwidth; ``lat_lb`` likewise.

4. **Work**: stage ``s`` keeps its ``r_s`` devices busy for ``busy_s <= T``, so
   ``T * sum_s r_s v_s >= sum_s busy_s r_s v_s``; the chosen devices' speeds sum to at
   most ``V``, the sum over the cluster, hence ``T >= sum_s busy_s r_s v_s / V``.

Memory is exact: each arc's peak is :func:`solver.memory.stage_peak_memory` of its op
list, which under 1F1B depends on the stage only through ``w = min(tau, M)``.

Exactness of the loop
---------------------
An arc is dropped when its own terms already reach the incumbent, and a recomputing
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
from dataclasses import dataclass, field
from itertools import product
from typing import Callable, Iterator, Protocol, Sequence

from solver.cluster import Cluster
from solver.memory import stage_peak_memory
from solver.plan import Plan
from solver.problem import PlanningProblem
from solver.result import SolverResult, TracePoint
from solver.schedule import gpipe_ops, one_f_one_b_ops
from solver.simulator import simulate
from solver.termination import TimeLimit

OPT_TOL = 1e-6
"""Relative tolerance of an optimality proof (the model solvers work in floating point)."""

PLACEMENT_LIMIT = 64
"""Most placements simulated per configuration before falling back to the pool bound."""

MAX_MODEL_ARCS = 150_000
"""Above this many candidate arcs the model is not built (building alone would exceed typical limits)."""

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


@dataclass(frozen=True)
class Arc:
    """One candidate stage: layers ``[lo, hi)``, ``tau`` later stages (capped), an option."""

    lo: int
    hi: int
    tau: int
    option: int
    busy_path: float
    """``c1``: head + busy + max(all-reduce, tail) lower bound."""
    pass_cost: float
    """``u'``: one microbatch through the stage, its outgoing cut, and ``AR_0`` if first."""
    pivot_extra: float
    """``delta``: the pivot's critical ops beyond ``u``."""
    work: float = 0.0
    """``busy * r * v / V``: the stage's share of the work bound (``V`` = all speeds summed)."""


@dataclass
class ExactData:
    """Everything the models need, as plain numbers."""

    problem: PlanningProblem
    classes: tuple[DeviceClass, ...]
    options: tuple[Option, ...]
    arcs: list[Arc]
    max_tau: int
    stage_limit: int
    static_bound: float
    """A lower bound needing no model: ``max_l min over arcs covering l of c1``."""
    complete: bool = True
    """Whether every candidate arc was enumerated (the time limit may stop it early)."""

    def covering(self) -> list[list[int]]:
        """Arc indices covering each layer."""
        cover: list[list[int]] = [[] for _ in range(len(self.problem.graph))]
        for i, arc in enumerate(self.arcs):
            for layer in range(arc.lo, arc.hi):
                cover[layer].append(i)
        return cover


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


def stage_options(problem: PlanningProblem, classes: Sequence[DeviceClass]) -> tuple[Option, ...]:
    """Every composition (respecting ``allow_replication``) times recompute flags."""
    cluster = problem.cluster
    bw_max, lat_min = _link_extremes(cluster)
    max_r = len(cluster.devices) if problem.allow_replication else 1
    flags = (False, True) if problem.allow_recompute else (False,)
    options = []
    for composition in product(*(range(c.count + 1) for c in classes)):
        r = sum(composition)
        if not 1 <= r <= max_r:
            continue
        used = [c for c, n in zip(classes, composition) if n]
        ar = (0.0, 0.0)
        if r >= 2:
            if _fits_one_server(classes, composition):
                bw_ub, lat_lb = bw_max, lat_min
            else:  # some pair crosses servers: the network link bounds the ring
                bw_ub, lat_lb = cluster.network.bandwidth, cluster.network.latency
            ar = (2 * (r - 1) * lat_lb, 2 * (r - 1) / (r * bw_ub))
        for rc in flags:
            options.append(Option(tuple(composition), rc, r, min(c.speed for c in used),
                                  min(c.memory for c in used), ar))
    return tuple(options)


class _Prefix:
    """Prefix sums of the graph's per-layer numbers, for O(1) range queries."""

    def __init__(self, problem: PlanningProblem) -> None:
        layers = problem.graph.layers
        self.cols = {}
        for name, get in (("af", lambda l: l.fwd[0]), ("bf", lambda l: l.fwd[1]), ("ab", lambda l: l.bwd[0]),
                          ("bb", lambda l: l.bwd[1]), ("params", lambda l: l.params), ("act", lambda l: l.act)):
            acc = [0.0]
            for layer in layers:
                acc.append(acc[-1] + get(layer))
            self.cols[name] = acc

    def __call__(self, name: str, lo: int, hi: int) -> float:
        col = self.cols[name]
        return col[hi] - col[lo]


def _op_list(schedule: str, m: int, tau: int):
    # Under 1F1B the list depends on the stage only through w = min(S-1-s, m) = min(tau, m).
    return gpipe_ops(m) if schedule == "gpipe" else one_f_one_b_ops(m, 0, tau + 1)


def work_bound(problem: PlanningProblem) -> float:
    """``T >= W / V``: the whole model's work at full batch over the summed device speeds.

    Each stage keeps ``r_s`` devices of speed ``>= v_s`` busy ``busy_s <= T``, and
    ``busy_s r_s v_s >= M (a_f + a_b) + B (b_f + b_b)`` over its layers (``r q_k >= n_k``).
    """
    graph, sizes = problem.graph, problem.split
    fixed = sum(l.fwd[0] + l.bwd[0] for l in graph.layers) * len(sizes)
    per_sample = sum(l.fwd[1] + l.bwd[1] for l in graph.layers) * problem.global_batch
    return (fixed + per_sample) / sum(d.speed for d in problem.cluster.devices)


def build_data(problem: PlanningProblem, cutoff: float = math.inf, clock: TimeLimit | None = None) -> ExactData:
    """Enumerate the candidate arcs that fit in memory and whose own bound is below ``cutoff``.

    Parameters
    ----------
    problem : PlanningProblem
    cutoff : float
        Arcs whose busy-path or pivot-path terms alone reach it are dropped (they
        cannot be part of a configuration better than the incumbent).
    """
    graph, cluster = problem.graph, problem.cluster
    classes = device_classes(cluster)
    options = stage_options(problem, classes)
    pre = _Prefix(problem)
    L, K, sizes = len(graph), problem.stage_limit, problem.split
    M, n_min, devices = len(sizes), min(sizes), len(cluster.devices)
    bw_max, lat_min = _link_extremes(cluster)
    v_max = max(d.speed for d in cluster.devices)
    r_max = devices if problem.allow_replication else 1
    q_best = -(-n_min // r_max)
    max_tau = min(K - 1, M) if problem.schedule == "1f1b" else 0
    ops_by_tau = {tau: _op_list(problem.schedule, M, tau) for tau in range(max_tau + 1)}

    def head(lo: int) -> float:  # F0 of the earlier stages, fastest conceivable
        return 0.0 if lo == 0 else lat_min + (pre("af", 0, lo) + pre("bf", 0, lo) * q_best) / v_max

    def tail(lo: int) -> float:  # B_{M-1} of the earlier stages, fastest conceivable
        return 0.0 if lo == 0 else lat_min + (pre("ab", 0, lo) + pre("bb", 0, lo) * q_best) / v_max

    arcs: list[Arc] = []
    for lo in range(L):
        if clock is not None and clock.expired():
            return ExactData(problem, classes, options, arcs, max_tau, K, work_bound(problem), complete=False)
        for hi in range(lo + 1, L + 1):
            af, bf, ab, bb = (pre(k, lo, hi) for k in ("af", "bf", "ab", "bb"))
            params, act = pre("params", lo, hi), pre("act", lo, hi)
            inp = graph.stage_input_bytes(lo)
            cut = graph.cut_bytes(hi - 1) if hi < L else 0.0
            for tau in _taus(problem, lo, hi, max_tau):
                fitting_plain: set[tuple[int, ...]] = set()
                for index, opt in enumerate(options):
                    if opt.replicas + tau > devices:  # every later stage needs a device
                        continue
                    if opt.recompute and opt.composition in fitting_plain:
                        continue  # dominated: the same devices without recompute fit
                    per_replica = [-(-n // opt.replicas) for n in sizes]
                    peak = stage_peak_memory(problem.state_factor, params, ops_by_tau[tau], per_replica,
                                             act, inp, opt.recompute)
                    if peak > opt.memory:
                        continue
                    if not opt.recompute:
                        fitting_plain.add(opt.composition)
                    arc = _arc(problem, lo, hi, tau, index, opt, (af, bf, ab, bb), params, cut,
                               per_replica, head(lo), tail(lo), bw_max, lat_min)
                    if arc.busy_path < cutoff and arc.pass_cost + arc.pivot_extra < cutoff:
                        arcs.append(arc)
    data = ExactData(problem, classes, options, arcs, max_tau, K, 0.0)
    data.static_bound = max(_static_bound(data), work_bound(problem))
    return data


def _taus(problem: PlanningProblem, lo: int, hi: int, max_tau: int) -> range:
    L = len(problem.graph)
    if hi == L:
        return range(0, 1)
    if problem.schedule == "gpipe":
        return range(0, 1)  # GPipe memory and bounds do not depend on the stage index
    # a stage followed by tau stages needs tau layers after it; tau = 0 only for the last stage
    return range(1, min(max_tau, L - hi) + 1)


def _arc(problem, lo, hi, tau, index, opt: Option, coeffs, params, cut, per_replica, head, tail,
         bw_max, lat_min) -> Arc:
    af, bf, ab, bb = coeffs
    sizes = problem.split
    M, n_min = len(sizes), min(sizes)
    fwd = [(af + bf * q) / opt.speed for q in per_replica]
    bwd = [(ab + bb * q) / opt.speed + (f if opt.recompute else 0.0) for q, f in zip(per_replica, fwd)]
    busy = sum(fwd) + sum(bwd)
    q_min = -(-n_min // opt.replicas)
    f_min = (af + bf * q_min) / opt.speed
    u = f_min + (ab + bb * q_min) / opt.speed + (f_min if opt.recompute else 0.0)
    allreduce = opt.allreduce_params_coef[0] + opt.allreduce_params_coef[1] * params if opt.replicas > 1 else 0.0
    if problem.schedule == "gpipe":
        critical = busy
    else:
        w = min(tau, M)
        critical = fwd[0] + sum(bwd) + sum(fwd[w + 1:])
    send = 0.0
    if hi < len(problem.graph):  # the cut after the stage, once each way
        send = 2 * (lat_min + n_min * cut / (opt.replicas * bw_max))
    pass_cost = u + send + (allreduce if lo == 0 else 0.0)
    speed_sum = sum(d.speed for d in problem.cluster.devices)
    work = busy * opt.replicas * opt.speed / speed_sum
    return Arc(lo, hi, tau, index, head + busy + max(allreduce, tail), pass_cost, critical - u, work)


def _static_bound(data: ExactData) -> float:
    bound = 0.0
    for arcs in data.covering():
        if arcs:
            bound = max(bound, min(data.arcs[i].busy_path for i in arcs))
    return bound


def config_lower_bound(data: ExactData, arc_ids: Sequence[int]) -> float:
    """The model's objective at the configuration made of ``arc_ids``."""
    arcs = [data.arcs[i] for i in arc_ids]
    busy = max(a.busy_path for a in arcs)
    pivot = sum(a.pass_cost for a in arcs) + max(a.pivot_extra for a in arcs)
    return max(busy, pivot, sum(a.work for a in arcs))


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
    """``target >= sum coef * x[arc] (+ D if with_pivot)`` in seconds; ``target`` is ``"T"`` or ``"D"``."""

    target: str
    terms: tuple[tuple[int, float], ...]
    with_pivot: bool = False


def model_rows(data: ExactData) -> tuple[list[CountRow], list[TimeRow]]:
    """The lower-bound model as plain rows, for either backend.

    Count rows: a path of arcs from layer 0 to layer ``L`` whose ``tau`` labels count the
    later stages (capped at ``max_tau``), at most ``stage_limit`` stages, and at most
    the available devices of each class.  Time rows: the busy-path and pivot-path
    bounds of the module docstring.
    """
    L, arcs = len(data.problem.graph), data.arcs
    rows: list[CountRow] = [CountRow(tuple((i, 1) for i, a in enumerate(arcs) if a.lo == 0), "==", 1)]
    starts: dict[tuple[int, int], list[int]] = {}  # (layer, label) -> arcs starting there
    ends: dict[tuple[int, int], list[int]] = {}  # (layer, label) -> arcs ending there
    for i, a in enumerate(arcs):
        starts.setdefault((a.lo, a.tau), []).append(i)
        ends.setdefault((a.hi, a.tau), []).append(i)
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
    rows.append(CountRow(tuple((i, 1) for i in range(len(arcs))), "<=", data.stage_limit))
    for c, cls in enumerate(data.classes):
        terms = tuple((i, data.options[a.option].composition[c]) for i, a in enumerate(arcs)
                      if data.options[a.option].composition[c])
        rows.append(CountRow(terms, "<=", cls.count))
    times: list[TimeRow] = []
    for cover in data.covering():
        times.append(TimeRow("T", tuple((i, arcs[i].busy_path) for i in cover)))
        times.append(TimeRow("D", tuple((i, arcs[i].pivot_extra) for i in cover)))
    times.append(TimeRow("T", tuple((i, a.pass_cost) for i, a in enumerate(arcs)), with_pivot=True))
    times.append(TimeRow("T", tuple((i, a.work) for i, a in enumerate(arcs))))
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
    compositions = [data.options[data.arcs[i].option].composition for i in arc_ids]
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


def warm_start_plans(problem: PlanningProblem, seed: int, time_limit: float) -> list[Plan]:
    """The best baseline's plan (if the baselines are available) and a greedy plan."""
    plans = []
    try:
        from solver.baselines import best_baseline  # written separately; may be missing
        result = best_baseline(problem, seed=seed, time_limit=time_limit)
        if result is not None and result.plan is not None:
            plans.append(result.plan)
    except Exception:  # noqa: BLE001 - a broken baseline must not break an exact solver
        pass
    plans.extend(greedy_plans(problem))
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
    index = {(a.lo, a.hi, a.tau, a.option): i for i, a in enumerate(data.arcs)}
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


def solve_exact(problem: PlanningProblem, name: str, make_model: Callable[[ExactData], LowerBoundModel], *,
                time_limit: float, seed: int, details: dict | None = None) -> SolverResult:
    """Run the cut loop described in the module docstring and report the result."""
    clock = TimeLimit(time_limit).start()
    search = _Search(problem, clock)
    for plan in warm_start_plans(problem, seed, min(2.0, 0.1 * time_limit)):
        search.offer(plan)
    data = build_data(problem, search.cutoff(), clock)
    if not data.complete or clock.expired() or len(data.arcs) > MAX_MODEL_ARCS:
        # out of time, or a model too large to build in time: only the model-free bound holds
        search.raise_bound(data.static_bound)
        return _result(name, search, data, clock, seed, "unknown", 0, 0, details or {})
    search.raise_bound(data.static_bound if data.arcs else search.best_time)
    L = len(problem.graph)
    if not any(a.lo == 0 for a in data.arcs) or not any(a.hi == L for a in data.arcs):
        # no candidate stage can start or end the pipeline below the cutoff
        search.raise_bound(search.cutoff() if search.best_plan is not None else math.inf)
        return _result(name, search, data, clock, seed, "infeasible", 0, 0, details or {})
    model = make_model(data)
    iterations = cuts = 0
    hint = plan_config(data, search.best_plan) if search.best_plan is not None else None
    if hint is not None and hasattr(model, "hint"):
        model.hint(hint)
    status = "unknown"
    while not search.proved() and clock.remaining() > 0:
        iterations += 1
        status, arc_ids, model_bound = model.solve(search.cutoff(), clock.remaining())
        if status == "infeasible":
            # no configuration left below the cutoff: the incumbent is optimal
            search.raise_bound(search.cutoff() if search.best_plan is not None else math.inf)
            break
        if model_bound is not None:
            search.raise_bound(model_bound)
        if arc_ids is None:
            break
        _evaluate(data, search, arc_ids, clock)
        model.exclude(arc_ids)  # valid whatever the model's status: the configuration was simulated
        cuts += 1
    return _result(name, search, data, clock, seed, status, iterations, cuts, details or {})


def _evaluate(data: ExactData, search: _Search, arc_ids: Sequence[int], clock: TimeLimit) -> None:
    """Simulate a configuration's placements; pool its bound if not all were tried."""
    problem = data.problem
    ordered = sorted(arc_ids, key=lambda i: data.arcs[i].lo)
    bounds = [(data.arcs[i].lo, data.arcs[i].hi) for i in ordered]
    flags = [data.options[data.arcs[i].option].recompute for i in ordered]
    groups, exhaustive = placements(data, ordered)
    for k, devs in enumerate(groups):
        if k and clock.remaining() <= 0:
            exhaustive = False
            break
        search.offer(problem.make_plan(bounds, devs, flags))
    if not exhaustive:
        search.pool = min(search.pool, config_lower_bound(data, ordered))


def _result(name, search: _Search, data: ExactData, clock: TimeLimit, seed, status, iterations, cuts,
            details) -> SolverResult:
    details = dict(details, iterations=iterations, cuts=cuts, arcs=len(data.arcs), classes=len(data.classes),
                   options=len(data.options), last_model_status=status)
    if search.best_plan is None:
        if data.complete and (status == "infeasible" or not data.arcs):
            search.raise_bound(math.inf)
            return SolverResult(name, "infeasible", None, None, None, clock.elapsed(), seed, tuple(search.trace),
                                _infeasible_message(data), details)
        return SolverResult(name, "timeout-no-solution", None, None, search.bound or None, clock.elapsed(), seed,
                            tuple(search.trace), "time limit reached before a fitting plan was found", details)
    proved = search.proved()
    if proved:  # the proof is up to OPT_TOL; report the incumbent itself as the bound
        search.bound = search.best_time
    search.record()
    message = "" if proved else "time limit reached; the gap is not closed"
    return SolverResult(name, "optimal" if proved else "feasible", search.best_plan, search.best_time,
                        search.bound, clock.elapsed(), seed, tuple(search.trace), message, details)


def _infeasible_message(data: ExactData) -> str:
    problem = data.problem
    graph = problem.graph
    largest = max(d.memory for d in problem.cluster.devices)
    state = max(problem.state_factor * l.params for l in graph.layers)
    worst = max(range(len(graph)), key=lambda i: graph.layers[i].params)
    return (f"no plan fits in memory: layer {graph.layers[worst].name!r} alone needs at least {state:.3g} bytes "
            f"of training state; the largest device has {largest:.3g} bytes")
