"""The class-level position model: a MILP whose size grows with device classes and layers, not devices.

:func:`build_position_model` writes it and :meth:`PositionModel.solve` solves it with
HiGHS; :mod:`pipeplan.solver.bounds.class_paths` proves that its optimum (and so HiGHS's
dual bound) never exceeds the iteration time of any version-1 plan of an equal-split
``1f1b`` or ``gpipe`` problem.

The variables
-------------
Stages are counted from the end of the pipeline: *position* ``k`` is the stage with
``k`` later stages, so its 1F1B warm-up ``w = min(k, M)`` is known.  Positions ``k =
0 .. K-1`` are explicit; every earlier stage (``w >= K``) is in the *pool*.

- ``g[k, h]`` (binary, ``k = 1 .. K``, ``h = 1 .. L``): ``b_k >= h``, where ``b_k`` is the
  first layer of position ``k - 1`` (``b_0 = L``); position ``k`` holds ``[b_{k+1},
  b_k)`` and the pool ``[0, b_K)``.  Layer ``i`` is in position ``k`` exactly when
  ``g[k, i+1] - g[k+1, i+1] = 1``, so every sum over a position's layers is linear in
  ``g``.
- ``z[k, t]`` (binary): position ``k`` is a stage of type ``t``
  (:class:`pipeplan.solver.space.class_stages.StageType`: slowest class, replica
  ``q``-class, link, recompute).
- ``X[k, t, a]`` (continuous): the sum of layer attribute ``a`` (``af``, ``bf``, ``ab``,
  ``bb``, ``params``, ``act``) over position ``k``'s layers when its type is ``t``, else 0.
- ``n[t]`` (integer) and ``Y[t, a]``: the pool's stages of type ``t`` and the sum of their
  attributes.

Every op time, all-reduce, transfer bound and memory of a stage is linear in its
attribute sums for a fixed type, so every term is a linear row.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.evaluation.memory import stash_points
from pipeplan.solver.exact.linear import LinearModel
from pipeplan.solver.space.arcs import tau_ops
from pipeplan.solver.space.class_stages import SINGLE, SPREAD, ServerKind, StageType, server_kinds, stage_types
from pipeplan.solver.space.device_classes import DeviceClass, device_classes

ATTRIBUTES = ("af", "bf", "ab", "bb", "params", "act")
"""Additive layer attributes a stage's terms are linear in (``fwd``, ``bwd`` coefficients, parameter and activation bytes)."""

ROUNDING_MARGIN = 1e-6
"""Relative amount a bound from HiGHS is lowered by: HiGHS accepts rows violated by its feasibility
tolerance (1e-7 on rows of seconds) and integers off by its integrality tolerance (1e-6)."""

DEFAULT_POSITIONS = 24
"""Most explicit positions (the rest of the pipeline is the pool); on experiments/bench_scale.py's
instances the best plans known have 17 to 24 stages."""


# ---------------------------------------------------------------------------------------------------- types
@dataclass(frozen=True)
class TypeTerms:
    """A stage type's terms as linear forms over the attribute sums (one coefficient per :data:`ATTRIBUTES`)
    plus a constant that applies when the stage exists."""

    busy: np.ndarray
    """``sum_k (TF_k + TB_k)``."""
    fwd_max: np.ndarray
    """Largest ``TF_k``."""
    bwd_max: np.ndarray
    """Largest ``TB_k``."""
    fwd0: np.ndarray
    """``TF_0``."""
    bwd_last: np.ndarray
    """``TB_{M-1}``."""
    pass_min: np.ndarray
    """``TF + TB`` of a smallest microbatch."""
    allreduce: np.ndarray
    """Per-parameter-byte part of the all-reduce's lower bound."""
    allreduce_fixed: float
    """Its latency part (``2 (r - 1) lat``; 0 for one replica)."""
    send0: float
    """Lower bound on a transfer of microbatch 0 across the stage's outgoing cut."""
    send_last: float
    """The same for the last microbatch."""
    send_min: float
    """The same for a smallest microbatch."""
    replicas: int
    """``r_lo``."""
    speed: float
    """Slowest speed."""
    memory: float
    """Memory of the slowest class."""


def _unit(name: str) -> np.ndarray:
    out = np.zeros(len(ATTRIBUTES))
    out[ATTRIBUTES.index(name)] = 1.0
    return out


def type_terms(problem: PlanningProblem, classes: tuple[DeviceClass, ...], kinds: tuple[ServerKind, ...],
               t: StageType, cut_min: float) -> TypeTerms:
    """The linear forms of a type (see :mod:`pipeplan.solver.bounds.class_paths`, terms S1-S4)."""
    sizes = problem.split
    M = len(sizes)
    v = classes[t.cls].speed
    q = np.array(t.q, dtype=float)
    AF, BF, AB, BB, P = (_unit(a) for a in ATTRIBUTES[:5])
    rc = 1.0 if t.recompute else 0.0

    def fwd(qk: float) -> np.ndarray:
        return (AF + qk * BF) / v

    def bwd(qk: float) -> np.ndarray:
        return (AB + qk * BB) / v + rc * fwd(qk)

    busy = sum(fwd(x) + bwd(x) for x in q)
    k_min = int(np.argmin(sizes))
    cluster = problem.cluster
    net = cluster.network
    every = (net, *cluster.servers)
    if t.link == SINGLE:
        ar_bw, ar_lat, bw, lat = math.inf, 0.0, max(l.bandwidth for l in every), min(l.latency for l in every)
    elif t.link == SPREAD:
        ar_bw, ar_lat, bw, lat = net.bandwidth, net.latency, net.bandwidth, net.latency
    else:
        kind = kinds[t.link]
        ar_bw, ar_lat = kind.link.bandwidth, kind.link.latency
        if kind.size > t.r_lo:
            bw, lat = max(kind.link.bandwidth, net.bandwidth), min(kind.link.latency, net.latency)
        else:
            bw, lat = net.bandwidth, net.latency
    r = t.r_lo
    ar = P * (2 * (r - 1) / (r * ar_bw)) if r >= 2 else np.zeros(len(ATTRIBUTES))
    ar_fixed = 2 * (r - 1) * ar_lat if r >= 2 else 0.0

    def send(n: int) -> float:
        return lat + n * cut_min / (t.r_hi * bw)

    return TypeTerms(busy, fwd(q.max()), bwd(q.max()), fwd(q[0]), bwd(q[-1]), fwd(q[k_min]) + bwd(q[k_min]),
                     ar, ar_fixed, send(sizes[0]), send(sizes[-1]), send(min(sizes)), r, v, classes[t.cls].memory)


def _scaled(tt: TypeTerms, scale: np.ndarray) -> TypeTerms:
    """The same terms over attribute sums carried in units of ``scale``."""
    vectors = {name: getattr(tt, name) * scale for name in
               ("busy", "fwd_max", "bwd_max", "fwd0", "bwd_last", "pass_min", "allreduce")}
    return replace(tt, **vectors)


def memory_forms(problem: PlanningProblem, t: StageType, warmup: int, input_min: float) -> tuple[np.ndarray, float]:
    """``(coef, const)``: a lower bound on the stage's peak per device, ``coef . X + const``, at warm-up ``warmup``.

    State ``sf * P`` plus the stash at its largest point (spec 5): without recompute
    ``A * max stash``; with it ``I * stash + A * working`` at the point of largest working
    set, with ``I >= input_min``.
    """
    points = stash_points(tau_ops(problem.schedule, len(t.q), warmup), list(t.q))
    coef = problem.state_factor * _unit("params")
    if not t.recompute:
        return coef + points[:, 0].max() * _unit("act"), 0.0
    j = int(np.argmax(points[:, 1] * 1e12 + points[:, 0]))  # largest working set, then largest stash
    return coef + points[j, 1] * _unit("act"), input_min * points[j, 0]


# ---------------------------------------------------------------------------------------------------- rows
def _add(terms: dict[int, float], var: int, coef: float) -> None:
    terms[var] = terms.get(var, 0.0) + coef


@dataclass
class PositionModel:
    """The position MILP of one problem, its variable indices, and what a solution means."""

    problem: PlanningProblem
    classes: tuple[DeviceClass, ...]
    kinds: tuple[ServerKind, ...]
    types: tuple[StageType, ...]
    positions: int
    """``K``: explicit positions."""
    upper: float
    """Incumbent time the model is cut at (``inf``: none)."""
    model: LinearModel
    T: int
    g: dict[tuple[int, int], int]
    z: dict[tuple[int, int], int]
    n: dict[int, int]
    build_seconds: float = 0.0

    @property
    def size(self) -> tuple[int, int, int]:
        """``(variables, rows, nonzeros)``."""
        return self.model.size


def build_position_model(problem: PlanningProblem, upper: float = math.inf,
                         positions: int | None = None) -> PositionModel:
    """The position MILP of the module docstring.

    Parameters
    ----------
    problem : PlanningProblem
        A version-1 problem with equal microbatches under ``1f1b`` or ``gpipe``.
    upper : float
        An incumbent's iteration time; the model only describes plans faster than it
        (``T <= upper``, and the pool's stages each take at most ``upper``).
    positions : int, optional
        ``K``, explicit positions (default ``min(M - 1, stage limit, DEFAULT_POSITIONS)``, at least 1).
    """
    if problem.needs.several_stages or problem.free_sizes:
        raise ValueError("the position model describes version-1 plans with equal microbatches (gpipe or 1f1b)")
    start = time.perf_counter()
    graph = problem.graph
    L, M = len(graph), len(problem.split)
    classes = device_classes(problem.cluster)
    kinds = server_kinds(problem.cluster, classes)
    types = stage_types(problem, classes, kinds)
    K = positions if positions is not None else max(1, min(M - 1, problem.stage_limit, DEFAULT_POSITIONS))
    K = max(1, min(K, problem.stage_limit, L))
    raw = np.array([[l.fwd[0], l.fwd[1], l.bwd[0], l.bwd[1], l.params, l.act] for l in graph.layers])
    # attribute sums are carried in units of their total (seconds next to bytes would span 22 decades,
    # which HiGHS's scaling does not survive): X' = X / total, every coefficient times total
    scale = np.where(raw.sum(axis=0) > 0, raw.sum(axis=0), 1.0)
    layer_attr = raw / scale
    totals = layer_attr.sum(axis=0)
    cut_min = min((graph.cut_bytes(c) for c in range(L - 1)), default=0.0)
    input_min = min(graph.stage_input_bytes(x) for x in range(L))
    terms = [_scaled(type_terms(problem, classes, kinds, t, cut_min), scale) for t in types]
    one_f_one_b = problem.needs.warmup_per_later_stage
    every_layer_has_params = bool(np.all(layer_attr[:, 4] > 0))

    m = LinearModel()
    T = m.objective = m.var("T", 0.0, upper if math.isfinite(upper) else math.inf)
    # boundaries: g[k, h] = [b_k >= h]
    g = {(k, h): m.var(f"g{k},{h}", 0, 1, True) for k in range(1, K + 1) for h in range(1, L + 1)}
    for k in range(1, K + 1):
        for h in range(1, L):
            m.row({g[k, h]: 1, g[k, h + 1]: -1}, lower=0)
        if k > 1:
            for h in range(1, L + 1):
                m.row({g[k - 1, h]: 1, g[k, h]: -1}, lower=0)

    def member(k: int, i: int) -> dict[int, float]:
        """``[layer i in position k]`` (k = K: the pool) as a linear form over g (constant 1 as key -1)."""
        out: dict[int, float] = {}
        if k == 0:
            out[-1] = 1.0
        else:
            out[g[k, i + 1]] = 1.0
        if k < K:
            _add(out, g[k + 1, i + 1], -1.0)
        return out

    # stage types per position: those that fit their memory with the smallest layer at w = min(k, M)
    z: dict[tuple[int, int], int] = {}
    X: dict[tuple[int, int], list[int]] = {}
    mem_forms: dict[tuple[int, int], tuple[np.ndarray, float]] = {}
    smallest = layer_attr.min(axis=0)
    for k in range(K):
        w = min(k, M) if one_f_one_b else 0
        for j, t in enumerate(types):
            coef, const = memory_forms(problem, t, w, input_min)
            coef = coef * scale
            if float(coef @ smallest) + const > terms[j].memory * (1 + 1e-9):
                continue
            mem_forms[k, j] = (coef, const)
            z[k, j] = m.var(f"z{k},{j}", 0, 1, True)
            X[k, j] = [m.var(f"X{k},{j},{a}") for a in ATTRIBUTES]
    pool_w = min(K, M) if one_f_one_b else 0
    n: dict[int, int] = {}
    Y: dict[int, list[int]] = {}
    pool_mem: dict[int, tuple[np.ndarray, float]] = {}
    devices = problem.cluster.devices
    for j, t in enumerate(types):
        coef, const = memory_forms(problem, t, pool_w, input_min)
        coef = coef * scale
        if float(coef @ smallest) + const > terms[j].memory * (1 + 1e-9):
            continue
        capacity = sum(1 for d in devices if d.speed >= t_speed(classes, t)) // t.r_lo
        most = min(capacity, problem.stage_limit)
        if most < 1:
            continue
        pool_mem[j] = (coef, const)
        n[j] = m.var(f"n{j}", 0, float(most), True)
        Y[j] = [m.var(f"Y{j},{a}") for a in ATTRIBUTES]

    # contents: sum over types of X = the position's attribute sums; X <= total * z
    used = {k: m.var(f"u{k}", 0, 1) for k in range(K)}
    for k in range(K):
        js = [j for (kk, j) in z if kk == k]
        row = {used[k]: 1.0}
        for j in js:
            row[z[k, j]] = -1.0
        m.row(row, 0, 0)
        for a in range(len(ATTRIBUTES)):
            row = {}
            const = 0.0
            for i in range(L):
                for var, c in member(k, i).items():
                    if var == -1:
                        const += c * layer_attr[i, a]
                    else:
                        _add(row, var, -c * layer_attr[i, a])
            for j in js:
                row[X[k, j][a]] = 1.0
            m.row(row, const, const)
            for j in js:
                if totals[a] > 0:
                    m.row({X[k, j][a]: 1.0, z[k, j]: -totals[a]}, upper=0)
        # layers in the position: at least one when used, none otherwise
        count: dict[int, float] = {}
        const = 0.0
        for i in range(L):
            for var, c in member(k, i).items():
                if var == -1:
                    const += c
                else:
                    _add(count, var, c)
        m.row({**count, used[k]: -1.0}, lower=-const)
        m.row({**count, used[k]: -float(L)}, upper=-const)
        if k:
            m.row({used[k - 1]: 1, used[k]: -1}, lower=0)
    m.row({used[0]: 1}, 1, 1)
    # the pool: [0, b_K) split among its stages
    pool_layers = {g[K, i + 1]: 1.0 for i in range(L)} if K >= 1 else {}
    for a in range(len(ATTRIBUTES)):
        row = {g[K, i + 1]: -layer_attr[i, a] for i in range(L)}
        for j in n:
            row[Y[j][a]] = 1.0
        m.row(row, 0, 0)
        for j in n:
            if totals[a] > 0:
                m.row({Y[j][a]: 1.0, n[j]: -totals[a]}, upper=0)
    m.row({**{n[j]: 1.0 for j in n}, **{v: -c for v, c in pool_layers.items()}}, upper=0)
    m.row({**{n[j]: 1.0 for j in n}, g[K, 1]: -1.0}, lower=0)
    m.row({used[K - 1]: 1.0, g[K, 1]: -1.0}, lower=0)

    # per-position aggregates (aux variables defined by equalities)
    def form(k: int, vec_of, const_of) -> dict[int, float]:
        out: dict[int, float] = {}
        for (kk, j), zv in z.items():
            if kk != k:
                continue
            vec = vec_of(terms[j])
            for a, var in enumerate(X[k, j]):
                if vec[a]:
                    _add(out, var, vec[a])
            c = const_of(terms[j])
            if c:
                _add(out, zv, c)
        return out

    def pool_form(vec_of, const_of) -> dict[int, float]:
        out: dict[int, float] = {}
        for j, nv in n.items():
            vec = vec_of(terms[j])
            for a, var in enumerate(Y[j]):
                if vec[a]:
                    _add(out, var, vec[a])
            c = const_of(terms[j])
            if c:
                _add(out, nv, c)
        return out

    def aux(name: str, expr: dict[int, float], lower: float = 0.0) -> int:
        v = m.var(name, lower)
        m.row({**{k_: -c for k_, c in expr.items()}, v: 1.0}, 0, 0)
        return v

    zero = lambda tt: 0.0  # noqa: E731
    ar_fixed = (lambda tt: tt.allreduce_fixed) if every_layer_has_params else zero
    busy, fmx, bmx, head, tail, pas, ar, snd = {}, {}, {}, {}, {}, {}, {}, {}
    for k in range(K):
        last = k == 0  # the last stage sends nothing
        busy[k] = aux(f"busy{k}", form(k, lambda tt: tt.busy, zero))
        fmx[k] = aux(f"fmax{k}", form(k, lambda tt: tt.fwd_max, zero))
        bmx[k] = aux(f"bmax{k}", form(k, lambda tt: tt.bwd_max, zero))
        head[k] = aux(f"head{k}", form(k, lambda tt: tt.fwd0, (zero if last else lambda tt: tt.send0)))
        tail[k] = aux(f"tail{k}", form(k, lambda tt: tt.bwd_last, (zero if last else lambda tt: tt.send_last)))
        pas[k] = aux(f"pass{k}", form(k, lambda tt: tt.pass_min, (zero if last else lambda tt: 2 * tt.send_min)))
        ar[k] = aux(f"ar{k}", form(k, lambda tt: tt.allreduce, ar_fixed))
        snd[k] = aux(f"send{k}", form(k, lambda tt: 0 * tt.busy, (zero if last else lambda tt: tt.send_min)))
    head_pool = aux("headP", pool_form(lambda tt: tt.fwd0, lambda tt: tt.send0))
    tail_pool = aux("tailP", pool_form(lambda tt: tt.bwd_last, lambda tt: tt.send_last))
    pass_pool = aux("passP", pool_form(lambda tt: tt.pass_min, lambda tt: 2 * tt.send_min))
    # HF_k, TB_k: heads / tails of every stage before position k; PS_k: passes of positions 0..k
    HF, TB, PS = {}, {}, {}
    for k in range(K - 1, -1, -1):
        if k == K - 1:
            HF[k] = aux(f"HF{k}", {head_pool: 1.0})
            TB[k] = aux(f"TB{k}", {tail_pool: 1.0})
        else:
            HF[k] = aux(f"HF{k}", {HF[k + 1]: 1.0, head[k + 1]: 1.0})
            TB[k] = aux(f"TB{k}", {TB[k + 1]: 1.0, tail[k + 1]: 1.0})
    for k in range(K):
        PS[k] = aux(f"PS{k}", {pas[k]: 1.0, **({PS[k - 1]: 1.0} if k else {})})
    U = aux("U", {PS[K - 1]: 1.0, pass_pool: 1.0})
    # EM_k >= HF_e + AR_e + PS_e for every position e >= k (the stage whose all-reduce ends the path)
    EM = {}
    for k in range(K - 1, -1, -1):
        EM[k] = m.var(f"EM{k}")
        m.row({EM[k]: 1.0, HF[k]: -1.0, ar[k]: -1.0, PS[k]: -1.0}, lower=0)
        if k < K - 1:
            m.row({EM[k]: 1.0, EM[k + 1]: -1.0}, lower=0)

    # an unused position's second-trip row would read T >= 2 U: `big` (twice any time of interest) switches it off
    big = 2.0 * (upper if math.isfinite(upper) else crude_upper(problem))
    for k in range(K):
        prev = {PS[k - 1]: 1.0} if k else {}
        w = min(k, M - 1) if one_f_one_b else 0
        # B1, B2: the stage's ops after microbatch 0's forward path, then its all-reduce or the last backward path
        m.row({T: 1.0, HF[k]: -1.0, busy[k]: -1.0, ar[k]: -1.0}, lower=0)
        m.row({T: 1.0, HF[k]: -1.0, busy[k]: -1.0, TB[k]: -1.0}, lower=0)
        # P0: pivot k, one round trip, ending in the all-reduce of a stage e at or before it (EM), or of stage 0 (U)
        core = {busy[k]: 1.0, fmx[k]: -float(w), snd[k]: 2.0, **{v: c for v, c in prev.items()}}
        m.row({T: 1.0, EM[k]: -1.0, PS[k]: 1.0, **{v: -c for v, c in core.items()}}, lower=0)
        m.row({T: 1.0, U: -1.0, PS[k]: 1.0, **{v: -c for v, c in core.items()}}, lower=0)
        if one_f_one_b and k <= M - 2 and k:
            # PJ: a second round trip (w = k <= M - 2 warm-up forwards: F_{M-1} follows B_0); only for a
            # used position (an unused one would count every pass twice): relaxed by `big` otherwise
            core2 = {busy[k]: 1.0, fmx[k]: -float(k), bmx[k]: -float(k), snd[k]: 4.0,
                     **{v: 2 * c for v, c in prev.items()}}
            gate = {used[k]: -big}
            m.row({T: 1.0, EM[k]: -1.0, PS[k]: 1.0, **gate, **{v: -c for v, c in core2.items()}}, lower=-big)
            m.row({T: 1.0, U: -1.0, PS[k]: 1.0, **gate, **{v: -c for v, c in core2.items()}}, lower=-big)
    # memory per position and type: need <= memory of the class; and the stage's own time within `upper`
    # (both hold with z = 1 for the plan's stage and read 0 <= 0 otherwise: they tie content to z)
    for (k, j), zv in z.items():
        coef, const = mem_forms[k, j]
        cap = terms[j].memory * (1 + 1e-9)  # rows in units of the memory
        m.row({**{X[k, j][a]: coef[a] / cap for a in range(len(ATTRIBUTES)) if coef[a]},
               zv: const / cap - 1.0}, upper=0)
        if math.isfinite(upper):
            tt = terms[j]
            vec = tt.busy + tt.allreduce
            m.row({**{X[k, j][a]: vec[a] for a in range(len(ATTRIBUTES)) if vec[a]},
                   zv: ar_fixed(tt) - upper}, upper=0)
    # the pool: each stage fits and takes at most `upper` (summed over the type's stages)
    for j, nv in n.items():
        coef, const = pool_mem[j]
        cap = terms[j].memory * (1 + 1e-9)
        m.row({**{Y[j][a]: coef[a] / cap for a in range(len(ATTRIBUTES)) if coef[a]},
               nv: const / cap - 1.0}, upper=0)
        if math.isfinite(upper):
            tt = terms[j]
            vec = tt.busy + tt.allreduce
            m.row({**{Y[j][a]: vec[a] for a in range(len(ATTRIBUTES)) if vec[a]},
                   nv: ar_fixed(tt) - upper}, upper=0)
    # devices
    _device_rows(m, problem, classes, kinds, types, z, n)
    m.row({**{used[k]: 1.0 for k in range(K)}, **{n[j]: 1.0 for j in n}}, upper=float(problem.stage_limit))
    # work: T * V >= sum busy r v
    speed_sum = float(sum(d.speed for d in devices))
    work = {T: 1.0}
    for (k, j), zv in z.items():
        tt = terms[j]
        for a, var in enumerate(X[k, j]):
            _add(work, var, -tt.busy[a] * tt.replicas * tt.speed / speed_sum)
    for j in n:
        tt = terms[j]
        for a, var in enumerate(Y[j]):
            _add(work, var, -tt.busy[a] * tt.replicas * tt.speed / speed_sum)
    m.row(work, lower=0)
    model = PositionModel(problem, classes, kinds, types, K, upper, m, T, g, z, n)
    model.build_seconds = time.perf_counter() - start
    return model


def crude_upper(problem: PlanningProblem) -> float:
    """A time no plan exceeds: every op of every stage one after another on the slowest device (at most
    ``B`` microbatches a stage, each recomputed), every transfer on the slowest link, every all-reduce of all
    the parameters (the ceiling of :func:`pipeplan.solver.core.problem.overflow_cause`), plus one second."""
    graph, cluster = problem.graph, problem.cluster
    B, D = problem.global_batch, len(cluster.devices)
    speed = min(d.speed for d in cluster.devices)
    links = (*cluster.servers, cluster.network)
    bandwidth, latency = min(l.bandwidth for l in links), max(l.latency for l in links)
    work = 2.0 * sum(B * (l.fwd[0] + l.bwd[0]) + B * (l.fwd[1] + l.bwd[1]) for l in graph.layers)
    cut = graph.input_bytes + sum(l.out for l in graph.layers)
    params = sum(l.params for l in graph.layers)
    return (D * work / speed + 2.0 * B * D * (latency + B * cut / bandwidth)
            + 2.0 * D * (latency + params / bandwidth) + 1.0)


def t_speed(classes: tuple[DeviceClass, ...], t: StageType) -> float:
    """Slowest speed of a type."""
    return classes[t.cls].speed


def _device_rows(m: LinearModel, problem: PlanningProblem, classes, kinds, types, z, n) -> None:
    """Nested speed rows, per-server-kind rows and packing cuts over positions and the pool (term D)."""
    devices = problem.cluster.devices
    speeds = sorted({d.speed for d in devices}, reverse=True)
    stage_vars = [(types[j], v) for (_, j), v in z.items()] + [(types[j], v) for j, v in n.items()]
    for s in speeds:
        row = {}
        for t, v in stage_vars:
            if t_speed(classes, t) >= s:
                _add(row, v, float(t.r_lo))
        if row:
            m.row(row, upper=float(sum(1 for d in devices if d.speed >= s)))
    for j, kind in enumerate(kinds):
        for s in speeds:
            per_server = sum(cnt for c, cnt in enumerate(kind.per_class) if classes[c].speed >= s)
            on = [(t, v) for t, v in stage_vars if t.link == j and t_speed(classes, t) >= s]
            if not on or not per_server:
                continue
            m.row(_summed([(v, float(t.r_lo)) for t, v in on]), upper=float(per_server * kind.count))
            # a server holds at most k stages of more than per_server / (k + 1) devices each
            for k in range(1, per_server):
                big = [(v, 1.0) for t, v in on if t.r_lo * (k + 1) > per_server]
                if big:
                    m.row(_summed(big), upper=float(k * kind.count))


def _summed(pairs) -> dict[int, float]:
    out: dict[int, float] = {}
    for v, c in pairs:
        _add(out, v, c)
    return out


# ---------------------------------------------------------------------------------------------------- solve
@dataclass
class PositionSolution:
    """What one HiGHS run on the position model gave."""

    status: str
    """HiGHS's model status as HiGHS names it (``"Optimal"``, ``"Time limit reached"``, ``"Infeasible"``, ...)."""
    bound: float
    """A proved lower bound on every plan faster than the model's ``upper`` (``upper`` itself when none is)."""
    objective: float | None
    """The model's value at the best configuration found (a lower bound for that configuration), if any."""
    configuration: list[tuple[int, int, int]] | None
    """The best configuration found: ``(lo, hi, type index)`` per stage in pipeline order; pool stages come
    first as ``(lo, hi, type)`` with their layers split later (``hi`` of pool stages is -1)."""
    pool: dict[int, int]
    """Pool stages per type index."""
    pool_end: int
    """``b_K``: the pool holds layers ``[0, pool_end)``."""
    seconds: float
    """Wall time of the solve."""
    nodes: int
    """Branch-and-bound nodes HiGHS explored."""


def solve_position_model(pm: PositionModel, time_limit: float, node_limit: int | None = None,
                         seed: int = 0, threads: int = 1) -> PositionSolution:
    """Solve with HiGHS; the bound is HiGHS's dual bound (``mip_dual_bound``) lowered by :data:`ROUNDING_MARGIN`.

    HiGHS's model status, not a label, decides: ``kInfeasible`` proves that nothing beats
    ``upper``; otherwise (optimal within HiGHS's gap, or stopped by time or nodes) the
    dual bound reached is the bound.

    Parameters
    ----------
    pm : PositionModel
        From :func:`build_position_model`.
    time_limit : float
        Seconds: a cap.  With ``node_limit`` the counted work is HiGHS's node count, and
        the result depends on the clock only when the cap is hit.
    node_limit : int, optional
        Branch-and-bound nodes (HiGHS's ``mip_max_nodes``).
    seed : int
        HiGHS's ``random_seed``.
    threads : int
        HiGHS's threads (1: the same run on an idle or a busy machine).

    Returns
    -------
    PositionSolution
        Its ``bound`` never exceeds the iteration time of a plan faster than ``upper``.
    """
    import highspy
    start = time.perf_counter()
    lp = pm.model.highs_lp()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("random_seed", int(seed))
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("time_limit", max(0.0, float(time_limit)))
    if node_limit is not None:
        h.setOptionValue("mip_max_nodes", int(node_limit))
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    name = h.modelStatusToString(status)
    upper = pm.upper
    values = None
    objective = None
    if info.primal_solution_status == 2:  # kSolutionStatusFeasible
        values = np.array(h.getSolution().col_value)
        objective = float(values[pm.T])
    if status == highspy.HighsModelStatus.kInfeasible:
        bound = upper
    else:
        # the dual bound, never the objective: HiGHS calls a solve within its relative gap (1e-4) optimal
        dual = float(info.mip_dual_bound)
        bound = min(upper, dual) if math.isfinite(dual) else 0.0
    bound = max(0.0, bound * (1 - ROUNDING_MARGIN))
    config, pool, pool_end = (None, {}, 0)
    if values is not None:
        config, pool, pool_end = _read_configuration(pm, values)
    return PositionSolution(name, bound, objective, config, pool, pool_end, time.perf_counter() - start,
                            int(info.mip_node_count))


def _read_configuration(pm: PositionModel, values: np.ndarray):
    L, K = len(pm.problem.graph), pm.positions
    bounds = [L] + [int(round(sum(values[pm.g[k, h]] for h in range(1, L + 1)))) for k in range(1, K + 1)]
    stages = []
    for k in range(K):
        chosen = [j for (kk, j), v in pm.z.items() if kk == k and values[v] > 0.5]
        if chosen:
            stages.append((bounds[k + 1], bounds[k], chosen[0]))
    stages.reverse()
    pool = {j: int(round(values[v])) for j, v in pm.n.items() if values[v] > 0.5}
    return stages, pool, bounds[K]


# ---------------------------------------------------------------------------------------------------- plans
@dataclass
class ClassModelResult:
    """What :func:`solve_class_model` proves and plans."""

    bound: float
    """A proved lower bound on every plan's iteration time (at least ``upper`` when nothing beats it)."""
    plan: Plan | None
    """The best plan built from the model's configuration, or ``None``."""
    iteration_time: float
    """The simulator's time for :attr:`plan` (``inf`` without one)."""
    status: str
    """HiGHS's model status."""
    nodes: int
    """Branch-and-bound nodes HiGHS explored."""
    model_size: tuple[int, int, int]
    """``(variables, rows, nonzeros)``."""
    seconds: float
    """Wall time, building included."""
    simulations: int
    """Plans simulated while refining the model's configuration."""


def configuration_plan(pm: PositionModel, solution: PositionSolution) -> Plan | None:
    """A plan from the model's configuration: the pool's stages (fastest types first) over ``[0, pool_end)``
    with boundaries balancing ``busy + AR``, then the positions' stages, each given devices by
    :func:`pipeplan.solver.space.class_placement.place`.

    Returns
    -------
    Plan or None
        ``None`` without a configuration, when the pool has fewer layers than stages, or
        when the devices cannot be packed.  The plan is not simulated here: the model's
        objective is a lower bound for its configuration, not its time.
    """
    from pipeplan.solver.space.class_placement import place, split_layers
    if solution.configuration is None:
        return None
    pool_types = [pm.types[j] for j in sorted(solution.pool, key=lambda j: (-pm.classes[pm.types[j].cls].speed,
                                                                            -pm.types[j].r_lo))
                  for _ in range(solution.pool[j])]
    stages: list[tuple[int, int, StageType]] = []
    if solution.pool_end > 0:
        split = split_layers(pm.problem, pm.classes, pm.kinds, pool_types, 0, solution.pool_end)
        if split is None:
            return None
        stages.extend((lo, hi, t) for (lo, hi), t in zip(split, pool_types))
    stages.extend((lo, hi, pm.types[j]) for lo, hi, j in solution.configuration)
    return place(pm.problem, pm.classes, pm.kinds, stages)


def refine_boundaries(problem: PlanningProblem, plan: Plan, budget: int) -> tuple[Plan, float, int]:
    """Move single boundaries by one layer while the simulator says it helps; at most ``budget`` simulations.

    Devices and recompute flags stay; the first move that lowers the simulated time is
    kept and the sweep starts again, until a sweep finds none or the budget is spent.

    Returns
    -------
    plan : Plan
        ``plan`` or a faster one.
    time : float
        Its simulated iteration time (``inf`` if it does not fit).
    simulations : int
        Plans simulated, ``plan`` itself included.
    """
    def timed(candidate) -> float:
        sim = problem.evaluate(candidate)
        return sim.iteration_time if sim.fits else math.inf

    best, best_t, used = plan, timed(plan), 1
    improved = True
    while improved and used < budget:
        improved = False
        bounds = [st.layers for st in best.stages]
        for b in range(len(bounds) - 1):
            for step in (-1, 1):
                cut = bounds[b][1] + step
                if not bounds[b][0] < cut < bounds[b + 1][1] or used >= budget:
                    continue
                moved = list(bounds)
                moved[b] = (bounds[b][0], cut)
                moved[b + 1] = (cut, bounds[b + 1][1])
                candidate = problem.make_plan(moved, [st.devices for st in best.stages],
                                              [st.recompute for st in best.stages])
                t = timed(candidate)
                used += 1
                if t < best_t:
                    best, best_t, improved = candidate, t, True
                    bounds = moved
    return best, best_t, used


def solve_class_model(problem: PlanningProblem, time_limit: float, upper: float = math.inf,
                      positions: int | None = None, node_limit: int | None = None, seed: int = 0,
                      refine_budget: int = 200) -> ClassModelResult:
    """Build and solve the position model, and turn its configuration into a refined plan.

    Parameters
    ----------
    problem : PlanningProblem
        A version-1 equal-split problem (``gpipe`` or ``1f1b``).
    time_limit : float
        Seconds for HiGHS (a cap: HiGHS's node count is the counted work when ``node_limit`` is set).
    upper : float
        An incumbent's time: the model describes only faster plans, and the bound returned is
        ``upper`` when none exists.
    positions : int, optional
        Explicit positions of the model (:func:`build_position_model`).
    node_limit : int, optional
        HiGHS's node limit (the counted work).
    seed : int
        HiGHS's random seed.
    refine_budget : int
        Simulations :func:`refine_boundaries` may spend on the model's plan.

    Returns
    -------
    ClassModelResult
        The bound (never above any plan's time) and, when the configuration packs and
        fits, a plan simulated by the project's simulator.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> graph = LayerGraph.chain("g", [Layer(f"l{i}", (1e-3, 1e-4), (2e-3, 2e-4), 1e6, 1e6, 0.0) for i in range(2)])
    >>> cluster = Cluster("c", (Link(1e11, 1e-6, "a"), Link(1e11, 1e-6, "b")), Link(1e10, 1e-5),
    ...                   tuple(Device(f"{s}{k}", s, 1.0, 8e10) for s in "ab" for k in range(4)))
    >>> problem = PlanningProblem(graph, cluster, global_batch=8, microbatches=2)
    >>> result = solve_class_model(problem, time_limit=60.0)
    >>> result.status, result.bound <= result.iteration_time
    ('Optimal', True)
    """
    start = time.perf_counter()
    pm = build_position_model(problem, upper, positions)
    left = max(0.0, time_limit - (time.perf_counter() - start))
    solution = solve_position_model(pm, left, node_limit, seed)
    plan, t, used = None, math.inf, 0
    candidate = configuration_plan(pm, solution)
    if candidate is not None:
        plan, t, used = refine_boundaries(problem, candidate, refine_budget)
        if not math.isfinite(t):
            plan = None
    return ClassModelResult(solution.bound, plan, t, solution.status, solution.nodes, pm.size,
                            time.perf_counter() - start, used)
