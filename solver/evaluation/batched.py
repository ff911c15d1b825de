"""The batched simulator: many plans at once with numpy (TiDGAP's matrix evaluation).

UMPIPE's TiDGAP (``papers.md`` §1.2) speeds up its genetic search by "simultaneously
calculating the end time for multiple individuals and microbatches using matrix
operations".  Here a *batch* is a set of candidate plans with one op structure: the
same schedule (``gpipe`` or ``1f1b``), stage count and number of microbatches per
stage.  Plans of the version-2 schedules (device groups holding several stages,
split backwards) are evaluated by the scalar simulator, one at a time, so they too
get exactly its numbers.  Stage ranges, devices, recompute flags and microbatch sizes may all differ
across the batch.  The timeline is then one loop over the ops in a static order, each
step a handful of numpy operations on vectors of length ``N`` (one entry per plan).

Why a static order works.  A stage's forward transfers leave in the order ``F0, F1,
...`` and its backward transfers in the order ``B0, B1, ...`` (true for ``gpipe`` and
``1f1b``), and a FIFO link makes arrival times non-decreasing in that order.  So the
latest-arriving of the overlapping sender microbatches that ``Fk`` (or ``Bk``) waits
for is always the last one, ``hi``: the wait is one gather, ``arrival[hi]``.  The
scalar simulator's sweep over the batch's median waits gives an op order; every plan
whose inputs all come earlier in that order (checked with vectorised position
comparisons) is timed exactly by one pass over it.  The rest are retried with an order
of their own; small leftovers, plans that deadlock and ``custom`` schedules go to the
scalar simulator (:attr:`BatchResult.batched` says which path served a plan).

Every number is computed with the same floating-point operations in the same order as
:func:`pipeplan.solver.evaluation.simulator.simulate` (range sums are tabulated by the same running sums),
so results agree with the scalar simulator to rounding, far inside the promised
``1e-9`` relative.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from pipeplan.models.errors import DeadlockError
from pipeplan.solver.schedules.schedule import FORWARD, stage_ops
from pipeplan.solver.evaluation.simulator import run_timeline, simulate

if TYPE_CHECKING:
    from pipeplan.models.graph import LayerGraph
    from pipeplan.solver.formats.cluster import Cluster
    from pipeplan.solver.formats.plan import Plan
    from pipeplan.solver.evaluation.simulator import StageCost

__all__ = ["Candidate", "BatchResult", "StageArrays", "BatchSimulator", "StageRow", "iteration_times", "simulate_batch", "stage_row", "timeline_arrays"]

_ATTRS = ("af", "bf", "ab", "bb", "params", "act", "step")
"""Range-sum columns of the table, in order."""


@dataclass(frozen=True)
class Candidate:
    """A plan reduced to what its cost depends on (the schedule is the simulator's)."""

    bounds: tuple[tuple[int, int], ...]
    """Half-open layer ranges of the stages."""
    groups: tuple[tuple[str, ...], ...]
    """Device ids of each stage."""
    recompute: tuple[bool, ...]
    """Recompute flag of each stage."""
    splits: tuple[tuple[int, ...], ...]
    """Microbatch sizes of each stage."""

    @classmethod
    def from_plan(cls, plan: "Plan") -> "Candidate":
        """The candidate of a plan (its schedule and state factor are not kept)."""
        return cls(tuple(st.layers for st in plan.stages), tuple(st.devices for st in plan.stages),
                   tuple(st.recompute for st in plan.stages), tuple(st.microbatches for st in plan.stages))

    @property
    def signature(self) -> tuple[int, ...]:
        """Microbatch count per stage: candidates with equal signatures batch together."""
        return tuple(len(split) for split in self.splits)


@dataclass(frozen=True)
class BatchResult:
    """Iteration time and memory of ``N`` plans."""

    iteration_time: np.ndarray
    """Seconds per iteration, shape ``(N,)``; ``inf`` for a plan that deadlocks."""
    peak_memory: np.ndarray
    """Largest per-device peak over the plan's stages (bytes), shape ``(N,)``."""
    fits: np.ndarray
    """Whether every stage fits its devices, shape ``(N,)`` bool."""
    overuse: np.ndarray
    """Largest ``(peak - capacity) / max(capacity, 1)`` over the stages, ``(N,)`` (``<= 0``: fits).

    The floor of one byte keeps a device with no memory (``"memory": 0``, allowed) finite."""
    batched: np.ndarray
    """Whether the batched path (not the scalar fallback) evaluated the plan, ``(N,)`` bool."""


@dataclass
class StageArrays:
    """``N`` plans of one op structure as arrays: shape ``(N, S)`` unless noted."""

    schedule: str
    """``"gpipe"`` or ``"1f1b"``."""
    sizes: list[np.ndarray]
    """Per stage, its microbatch sizes, shape ``(N, m_s)`` (int)."""
    replicas: np.ndarray
    """``r_s`` (int)."""
    speed: np.ndarray
    """``v_s``: the slowest device's speed."""
    sums: np.ndarray
    """Range sums ``(a_f, b_f, a_b, b_b, params, act, step)`` of each stage, shape ``(N, S, 7)``."""
    recompute: np.ndarray
    """Recompute flags (bool)."""
    input_bytes: np.ndarray
    """``I_s``: input bytes per sample."""
    capacity: np.ndarray
    """Smallest device memory of each stage."""
    ar_lat: np.ndarray
    """``lat(D_s)`` (0 for one replica)."""
    ar_bw: np.ndarray
    """``bw(D_s)`` (1 for one replica; unused then)."""
    cut: np.ndarray
    """Bytes per sample across the cut after stage ``s``, shape ``(N, S-1)``."""
    fwd_lat: np.ndarray
    """``lat(D_s, D_{s+1})``, shape ``(N, S-1)``."""
    fwd_rate: np.ndarray
    """``min(r_s, r_{s+1}) * bw(D_s, D_{s+1})``, shape ``(N, S-1)``."""
    bwd_lat: np.ndarray
    """``lat(D_{s+1}, D_s)``, shape ``(N, S-1)``."""
    bwd_rate: np.ndarray
    """``min(r_{s+1}, r_s) * bw(D_{s+1}, D_s)``, shape ``(N, S-1)``."""
    state_factor: float = 4.0
    """Bytes of state per parameter byte."""

    @property
    def count(self) -> int:
        """``N``."""
        return self.replicas.shape[0]


# --------------------------------------------------------------------------- the core
def _ceil_div(n: np.ndarray, r: np.ndarray) -> np.ndarray:
    return -(-n // r)


def _last_overlap(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """For each of my microbatches, the index of the last of theirs sharing a sample.

    ``bisect_left(their_ends, my_end)`` of the scalar simulator, for ``(N, m)`` and
    ``(N, m')`` size arrays; returns ``(N, m)``.
    """
    my_ends = np.cumsum(mine, axis=1)
    their_ends = np.cumsum(theirs, axis=1)
    return (their_ends[:, None, :] < my_ends[:, :, None]).sum(axis=2)


_ORDER_CACHE: dict[tuple, list[tuple[int, str, int]] | None] = {}


def _static_order(schedule: str, counts: tuple[int, ...], need_f: tuple[tuple[int, ...], ...],
                  need_b: tuple[tuple[int, ...], ...]) -> list[tuple[int, str, int]] | None:
    """The scalar simulator's sweep order for waits ``need_f``/``need_b``, or ``None``.

    ``need_f[s][k]``: the last sender microbatch ``Fk`` of stage ``s`` waits for;
    ``need_b`` likewise for backwards.  ``None`` if these waits deadlock.
    """
    key = (schedule, counts, need_f, need_b)
    if key in _ORDER_CACHE:
        return _ORDER_CACHE[key]
    stages = len(counts)
    ops = [stage_ops(schedule, m, s, stages) for s, m in enumerate(counts)]
    ptr = [0] * stages  # next op position per stage
    done_f = [0] * stages  # forwards finished per stage (they finish in order F0, F1, ...)
    done_b = [0] * stages  # backwards finished per stage (B0, B1, ...)
    order: list[tuple[int, str, int]] | None = []
    total = sum(len(o) for o in ops)
    while len(order) < total:
        progressed = False
        for s in range(stages):
            while ptr[s] < len(ops[s]):
                kind, k = ops[s][ptr[s]]
                if kind == FORWARD and s > 0 and done_f[s - 1] <= need_f[s][k]:
                    break
                if kind != FORWARD and s < stages - 1 and done_b[s + 1] <= need_b[s][k]:
                    break
                order.append((s, kind, k))
                if kind == FORWARD:
                    done_f[s] += 1
                else:
                    done_b[s] += 1
                ptr[s] += 1
                progressed = True
        if not progressed:
            order = None
            break
    if len(_ORDER_CACHE) > 4096:  # a long search sees many structures; keep memory bounded
        _ORDER_CACHE.clear()
    _ORDER_CACHE[key] = order
    return order


@dataclass
class _Durations:
    """Per-op durations and waits of a batch, each per stage ``(m_s, N)``."""

    fwd: list[np.ndarray]
    """``TF`` per microbatch."""
    bwd: list[np.ndarray]
    """``TB`` per microbatch."""
    send_f: list[np.ndarray | None]
    """Forward transfer times (``None`` on the last stage)."""
    send_b: list[np.ndarray | None]
    """Backward transfer times (``None`` on the first stage)."""
    hi_f: list[np.ndarray | None]
    """Last previous-stage microbatch each ``Fk`` waits for (``None`` on stage 0)."""
    hi_b: list[np.ndarray | None]
    """Last next-stage microbatch each ``Bk`` waits for (``None`` on the last stage)."""


def _durations(a: StageArrays, q: list[np.ndarray]) -> _Durations:
    stages = a.replicas.shape[1]
    d = _Durations([], [], [], [], [], [])
    for s in range(stages):
        af, bf, ab, bb = (a.sums[:, s, j] for j in range(4))
        speed = a.speed[:, s]
        tf = (af + bf * q[s]) / speed
        d.fwd.append(tf)
        d.bwd.append((ab + bb * q[s]) / speed + np.where(a.recompute[:, s], tf, 0.0))
        sizes_t = a.sizes[s].T
        d.send_f.append(a.fwd_lat[:, s] + sizes_t * a.cut[:, s] / a.fwd_rate[:, s] if s < stages - 1 else None)
        d.send_b.append(a.bwd_lat[:, s - 1] + sizes_t * a.cut[:, s - 1] / a.bwd_rate[:, s - 1] if s > 0 else None)
        d.hi_f.append(_last_overlap(a.sizes[s], a.sizes[s - 1]).T if s > 0 else None)
        d.hi_b.append(_last_overlap(a.sizes[s], a.sizes[s + 1]).T if s < stages - 1 else None)
    return d


def _order_for(schedule: str, d: _Durations, cols: np.ndarray) -> list[tuple[int, str, int]] | None:
    """A static op order for plans ``cols``: that of their median waits, else of the first plan."""
    counts = tuple(f.shape[0] for f in d.fwd)
    for pick in (lambda h: np.median(h[:, cols], axis=1), lambda h: h[:, cols[0]]):
        need_f = tuple(() if h is None else tuple(int(v) for v in pick(h)) for h in d.hi_f)
        need_b = tuple(() if h is None else tuple(int(v) for v in pick(h)) for h in d.hi_b)
        order = _static_order(schedule, counts, need_f, need_b)
        if order is not None:
            return order
    return None


def _compatible(order: list[tuple[int, str, int]], d: _Durations, cols: np.ndarray) -> np.ndarray:
    """Which plans ``cols`` find every input already computed when ``order`` reaches an op."""
    counts = [f.shape[0] for f in d.fwd]
    pos_f = [np.zeros(m, dtype=np.int64) for m in counts]  # position of Fk of stage s in the order
    pos_b = [np.zeros(m, dtype=np.int64) for m in counts]
    for i, (s, kind, k) in enumerate(order):
        (pos_f if kind == FORWARD else pos_b)[s][k] = i
    ok = np.ones(len(cols), dtype=bool)
    for s in range(len(counts)):
        if d.hi_f[s] is not None:
            ok &= (pos_f[s - 1][d.hi_f[s][:, cols]] < pos_f[s][:, None]).all(axis=0)
        if d.hi_b[s] is not None:
            ok &= (pos_b[s + 1][d.hi_b[s][:, cols]] < pos_b[s][:, None]).all(axis=0)
    return ok


def _sweep(order: list[tuple[int, str, int]], d: _Durations, cols: np.ndarray) -> list[np.ndarray]:
    """End of every stage's last op for plans ``cols`` (exact for compatible plans)."""
    n_plans, stages = len(cols), len(d.fwd)
    counts = [f.shape[0] for f in d.fwd]
    full = len(cols) == d.fwd[0].shape[1]
    pick = (lambda x: x) if full else (lambda x: x[:, cols])
    fwd, bwd = [pick(x) for x in d.fwd], [pick(x) for x in d.bwd]
    send_f = [None if x is None else pick(x) for x in d.send_f]
    send_b = [None if x is None else pick(x) for x in d.send_b]
    base = np.arange(n_plans)
    idx_f = [None if h is None else pick(h) * n_plans + base for h in d.hi_f]  # flat index into arrivals
    idx_b = [None if h is None else pick(h) * n_plans + base for h in d.hi_b]
    last = stages - 1
    clock = [np.zeros(n_plans) for _ in range(stages)]  # end of each stage's previous op
    arr_f = [np.zeros((m, n_plans)) for m in counts]  # forward arrivals, by sending stage
    arr_b = [np.zeros((m, n_plans)) for m in counts]  # backward arrivals, by sending stage
    link_f = [np.zeros(n_plans) for _ in range(stages)]  # forward link after stage s: next free
    link_b = [np.zeros(n_plans) for _ in range(stages)]  # backward link before stage s: next free
    for s, kind, k in order:
        if kind == FORWARD:
            ready = np.maximum(clock[s], arr_f[s - 1].ravel()[idx_f[s][k]]) if s > 0 else clock[s]
            end = ready + fwd[s][k]
            if s < last:
                t1 = np.maximum(end, link_f[s]) + send_f[s][k]
                link_f[s] = t1
                arr_f[s][k] = t1
        else:
            ready = np.maximum(clock[s], arr_b[s + 1].ravel()[idx_b[s][k]]) if s < last else clock[s]
            end = ready + bwd[s][k]
            if s > 0:
                t1 = np.maximum(end, link_b[s]) + send_b[s][k]
                link_b[s] = t1
                arr_b[s][k] = t1
        clock[s] = end
    return clock


def timeline_arrays(arrays: StageArrays, min_batch: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Iteration time, per-stage peak memory and capacity of a batch.

    Plans whose waits fit the static op order of the (remaining) batch are timed in one
    vectorised sweep; the others are retried with an order of their own, until fewer
    than ``min_batch`` remain (or none fits any order): their times are ``nan``, for
    the caller to evaluate one by one.

    Parameters
    ----------
    arrays : StageArrays
        ``N`` plans with one op structure.
    min_batch : int
        Smallest leftover worth another vectorised sweep.

    Returns
    -------
    (iteration_time, peak, capacity)
        Shapes ``(N,)``, ``(N, S)``, ``(N, S)``.
    """
    a = arrays
    n_plans, stages = a.replicas.shape
    counts = tuple(sz.shape[1] for sz in a.sizes)
    q = [_ceil_div(a.sizes[s], a.replicas[:, s:s + 1]).T for s in range(stages)]  # (m_s, N)
    ends = _stage_ends(a.schedule, _durations(a, q), n_plans, min_batch)
    iteration = np.max(ends + _allreduce(a) + a.sums[:, :, 6] / a.speed, axis=1)
    return iteration, _peaks(a, q, counts), a.capacity


def _stage_ends(schedule: str, d: _Durations, n_plans: int, min_batch: int) -> np.ndarray:
    """End of every stage's last op, ``(N, S)``; ``nan`` for the plans no static order served."""
    ends = np.full((n_plans, len(d.fwd)), np.nan)
    if _same_waits(d):  # one order serves them all: no search for it
        need_f = tuple(() if h is None else tuple(h[:, 0].tolist()) for h in d.hi_f)
        need_b = tuple(() if h is None else tuple(h[:, 0].tolist()) for h in d.hi_b)
        order = _static_order(schedule, tuple(f.shape[0] for f in d.fwd), need_f, need_b)
        if order is not None:
            ends[:] = np.stack(_sweep(order, d, np.arange(n_plans)), axis=1)
        return ends
    todo = np.arange(n_plans)
    while len(todo) >= min_batch or (len(todo) and len(todo) == n_plans):
        order = _order_for(schedule, d, todo)
        if order is None:
            break
        ok = _compatible(order, d, todo)
        if not ok.any():
            break
        cols = todo if ok.all() else todo[ok]
        ends[cols] = np.stack(_sweep(order, d, cols), axis=1)
        todo = todo[~ok]
    return ends


def _same_waits(d: _Durations) -> bool:
    """Whether every plan of the batch waits for the same sender microbatches (equal splits, say)."""
    return all(h is None or bool((h == h[:, :1]).all()) for h in d.hi_f + d.hi_b)


@dataclass(frozen=True)
class StageRow:
    """One stage's cost as arrays, for timing many plans at once (:func:`iteration_times`)."""

    cost: "StageCost"
    """The stage cost it was made from (:func:`stage_row`)."""
    fwd: np.ndarray
    """``TF`` per microbatch."""
    bwd: np.ndarray
    """``TB`` per microbatch, recompute included."""
    send_fwd: np.ndarray
    """Forward transfer time per microbatch (empty on the last stage)."""
    send_bwd: np.ndarray
    """Backward transfer time per microbatch (empty on the first stage)."""
    hi_fwd: np.ndarray
    """Last previous-stage microbatch each ``Fk`` waits for (empty on the first stage)."""
    hi_bwd: np.ndarray
    """Last next-stage microbatch each ``Bk`` waits for (empty on the last stage)."""


def stage_row(cost: "StageCost") -> StageRow:
    """The :class:`StageRow` of a stage cost (:func:`pipeplan.solver.evaluation.simulator.stage_costs`)."""
    return StageRow(cost, np.array(cost.fwd, dtype=float), np.array(cost.bwd, dtype=float),
                    np.array(cost.send_fwd, dtype=float), np.array(cost.send_bwd, dtype=float),
                    np.array([hi for _, hi in cost.wait_fwd], dtype=np.int64),
                    np.array([hi for _, hi in cost.wait_bwd], dtype=np.int64))


def _row_durations(plans: Sequence[Sequence[StageRow]]) -> _Durations:
    """The :class:`_Durations` of plans with one stage count and one microbatch count per stage."""
    stages = len(plans[0])
    inner, before_last = range(1, stages), range(stages - 1)
    if len({len(r.fwd) for r in plans[0]}) == 1:  # one microbatch count: one array per field, (S, m, N)
        def column(field: str, present=range(stages)) -> list[np.ndarray | None]:
            if not present:
                return [None] * stages
            table = np.array([[getattr(rows[s], field) for s in present] for rows in plans]).transpose(1, 2, 0)
            at = dict(zip(present, table))
            return [at.get(s) for s in range(stages)]
    else:
        def column(field: str, present=range(stages)) -> list[np.ndarray | None]:
            return [np.stack([getattr(rows[s], field) for rows in plans], axis=1) if s in present else None
                    for s in range(stages)]
    return _Durations(column("fwd"), column("bwd"), column("send_fwd", before_last), column("send_bwd", inner),
                      column("hi_fwd", inner), column("hi_bwd", before_last))


def iteration_times(plans: Sequence[Sequence[StageRow]], schedule: str, min_batch: int = 4) -> np.ndarray:
    """The iteration time :func:`pipeplan.solver.evaluation.simulator.run_timeline` gives each plan's stage costs, in batches.

    Plans with one stage count and one microbatch count per stage are timed together
    (``gpipe`` and ``1f1b``); the others, and those no static op order serves, one by
    one by ``run_timeline`` itself.  The batched numbers come from the same floating-point
    operations in the same order, so they equal ``run_timeline``'s exactly.

    Parameters
    ----------
    plans : sequence of sequences of StageRow
        Each plan's stage costs (:func:`pipeplan.solver.evaluation.simulator.stage_costs`), as :func:`stage_row`
        gives them.
    schedule : str
        The schedule of every plan.
    min_batch : int
        Fewest plans of one structure timed together.

    Returns
    -------
    numpy.ndarray
        Seconds per iteration, shape ``(N,)``.

    Raises
    ------
    DeadlockError
        As ``run_timeline`` does, for a plan whose ops can never all run.

    Examples
    --------
    >>> rows = [[stage_row(c) for c in stage_costs(plan, graph, cluster)] for plan in plans]  # doctest: +SKIP
    >>> iteration_times(rows, "1f1b")  # doctest: +SKIP
    """
    times = np.full(len(plans), np.nan)
    structures: dict[tuple[int, ...], list[int]] = {}
    for i, rows in enumerate(plans):
        structures.setdefault(tuple(len(r.fwd) for r in rows), []).append(i)
    for members in structures.values():
        if schedule in ("gpipe", "1f1b") and len(members) >= min_batch:
            group = [plans[i] for i in members]
            ends = _stage_ends(schedule, _row_durations(group), len(group), min_batch)
            tails = np.array([[r.cost.allreduce for r in rows] for rows in group])
            steps = np.array([[r.cost.step for r in rows] for rows in group])
            times[members] = np.max(ends + tails + steps, axis=1)
    for i in np.flatnonzero(np.isnan(times)):
        times[i] = run_timeline(tuple(r.cost for r in plans[i]), 0).iteration_time
    return times


def _allreduce(a: StageArrays) -> np.ndarray:
    """``AR_s`` of the spec, ``(N, S)``; 0 for one replica."""
    r = a.replicas
    ar = 2 * (r - 1) * (a.ar_lat + a.sums[:, :, 4] / (r * a.ar_bw))
    return np.where(r >= 2, ar, 0.0)


def _peaks(a: StageArrays, q: list[np.ndarray], counts: tuple[int, ...]) -> np.ndarray:
    """Per-stage peak bytes per device (spec section 5), ``(N, S)``."""
    n_plans, stages = a.replicas.shape
    peaks = np.empty((n_plans, stages))
    for s, m in enumerate(counts):
        ops = stage_ops(a.schedule, m, s, stages)
        rc = a.recompute[:, s]
        per_sample = np.where(rc, a.input_bytes[:, s], a.sums[:, s, 5])
        working = np.where(rc, a.sums[:, s, 5], 0.0)
        ks = np.array([k for _, k in ops])
        is_f = np.array([kind == FORWARD for kind, _ in ops])
        delta = q[s][ks] * per_sample
        stash = np.cumsum(np.where(is_f[:, None], delta, -delta), axis=0)
        before = np.vstack([np.zeros((1, n_plans)), stash[:-1]])
        cand = np.where(is_f[:, None], stash, before + q[s][ks] * working)
        peak = np.maximum(cand.max(axis=0), 0.0)
        peaks[:, s] = a.state_factor * a.sums[:, s, 4] + peak
    return peaks


# --------------------------------------------------------------------------- building arrays
@dataclass
class BatchSimulator:
    """Evaluates candidates of one graph, cluster, schedule and state factor in batches.

    Parameters
    ----------
    graph, cluster
        What the plans run on.
    schedule : str
        ``"gpipe"``, ``"1f1b"`` (batched), or ``"custom"`` and the version-2 names (always scalar).
    state_factor : float
        Bytes of state per parameter byte.

    Examples
    --------
    >>> sim = BatchSimulator(graph, cluster, "1f1b")  # doctest: +SKIP
    >>> sim.evaluate([Candidate(((0, 4),), (("g0",),), (False,), ((2, 2),))])  # doctest: +SKIP
    """

    graph: "LayerGraph"
    """The model."""
    cluster: "Cluster"
    """The devices."""
    schedule: str = "1f1b"
    """The schedule every candidate uses."""
    state_factor: float = 4.0
    """Bytes of state per parameter byte."""
    table: np.ndarray = field(init=False, repr=False)
    """``table[lo, hi]``: range sums of ``_ATTRS`` over layers ``lo <= i < hi``, ``(L+1, L+1, 7)``."""
    cut_bytes: np.ndarray = field(init=False, repr=False)
    """Bytes per sample across the cut after layer ``c``, padded to ``L`` entries."""
    input_by_lo: np.ndarray = field(init=False, repr=False)
    """Input bytes per sample of a stage starting at layer ``lo``."""
    _groups: dict = field(init=False, repr=False, default_factory=dict)
    _pairs: dict = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        layers = self.graph.layers
        n = len(layers)
        rows = [(l.fwd[0], l.fwd[1], l.bwd[0], l.bwd[1], l.params, l.act, l.step_time) for l in layers]
        # Running sums from every start, added in the scalar simulator's order, so that a
        # range sum here is bit-identical to ``range_time`` / ``range_sum`` there.
        self.table = np.zeros((n + 1, n + 1, len(_ATTRS)))
        for lo in range(n):
            acc = [0.0] * len(_ATTRS)
            for hi in range(lo + 1, n + 1):
                acc = [x + y for x, y in zip(acc, rows[hi - 1])]
                self.table[lo, hi] = acc
        self.cut_bytes = np.array([self.graph.cut_bytes(c) for c in range(n - 1)] + [0.0])
        self.input_by_lo = np.array([self.graph.stage_input_bytes(lo) for lo in range(n)] + [0.0])

    def group_info(self, group: tuple[str, ...]) -> tuple[int, float, float, float, float]:
        """``(r, speed, capacity, lat(D), bw(D))`` of a device group (cached)."""
        info = self._groups.get(group)
        if info is None:
            devs = [self.cluster.device_index[d] for d in group]
            multi = len(group) >= 2
            info = (len(group), min(d.speed for d in devs), min(d.memory for d in devs),
                    self.cluster.lat(group) if multi else 0.0, self.cluster.bw(group) if multi else 1.0)
            self._groups[group] = info
        return info

    def pair_info(self, x: tuple[str, ...], y: tuple[str, ...]) -> tuple[float, float]:
        """``(lat(x, y), min(|x|, |y|) * bw(x, y))`` of a link between groups (cached)."""
        info = self._pairs.get((x, y))
        if info is None:
            info = (self.cluster.lat(x, y), min(len(x), len(y)) * self.cluster.bw(x, y))
            self._pairs[(x, y)] = info
        return info

    def arrays(self, candidates: Sequence[Candidate]) -> StageArrays:
        """The arrays of candidates that share one signature."""
        n_plans, stages = len(candidates), len(candidates[0].bounds)
        lo = np.array([[b[0] for b in c.bounds] for c in candidates], dtype=np.int64)
        hi = np.array([[b[1] for b in c.bounds] for c in candidates], dtype=np.int64)
        ginfo = np.array([[self.group_info(g) for g in c.groups] for c in candidates], dtype=float)
        if stages > 1:
            fwd_pairs = np.array([[self.pair_info(c.groups[s], c.groups[s + 1]) for s in range(stages - 1)]
                                  for c in candidates], dtype=float)
            bwd_pairs = np.array([[self.pair_info(c.groups[s + 1], c.groups[s]) for s in range(stages - 1)]
                                  for c in candidates], dtype=float)
        else:
            fwd_pairs = bwd_pairs = np.zeros((n_plans, 0, 2))
        sizes = [np.array([c.splits[s] for c in candidates], dtype=np.int64) for s in range(stages)]
        return StageArrays(
            schedule=self.schedule, sizes=sizes, replicas=ginfo[:, :, 0].astype(np.int64), speed=ginfo[:, :, 1],
            sums=self.table[lo, hi], recompute=np.array([c.recompute for c in candidates], dtype=bool),
            input_bytes=self.input_by_lo[lo], capacity=ginfo[:, :, 2], ar_lat=ginfo[:, :, 3], ar_bw=ginfo[:, :, 4],
            cut=self.cut_bytes[hi[:, :-1] - 1], fwd_lat=fwd_pairs[:, :, 0], fwd_rate=fwd_pairs[:, :, 1],
            bwd_lat=bwd_pairs[:, :, 0], bwd_rate=bwd_pairs[:, :, 1], state_factor=self.state_factor)

    def evaluate(self, candidates: Sequence[Candidate]) -> BatchResult:
        """Iteration time, peak memory and fit of every candidate.

        Candidates are grouped by :attr:`Candidate.signature`; each group runs through
        :func:`timeline_arrays`, and a group it declines (or a ``custom`` schedule)
        through the scalar simulator, one plan at a time.
        """
        n_plans = len(candidates)
        times, peaks = np.full(n_plans, np.inf), np.zeros(n_plans)
        fits, batched = np.zeros(n_plans, dtype=bool), np.zeros(n_plans, dtype=bool)
        overuse = np.full(n_plans, np.inf)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, cand in enumerate(candidates):
            groups.setdefault(cand.signature, []).append(i)
        for members in groups.values():
            if self.schedule not in ("gpipe", "1f1b") or len(members) < 2:
                for i in members:
                    times[i], peaks[i], fits[i], overuse[i] = self._scalar(candidates[i])
                continue
            out = timeline_arrays(self.arrays([candidates[i] for i in members]))
            idx = np.array(members)
            done = ~np.isnan(out[0])
            times[idx], peaks[idx] = out[0], out[1].max(axis=1)
            fits[idx] = (out[1] <= out[2]).all(axis=1)
            overuse[idx] = relative_overuse(out[1], out[2]).max(axis=1)
            batched[idx] = done
            for i in idx[~done]:  # plans no static order served: one by one
                times[i], peaks[i], fits[i], overuse[i] = self._scalar(candidates[i])
        return BatchResult(times, peaks, fits, overuse, batched)

    def _scalar(self, cand: Candidate) -> tuple[float, float, bool, float]:
        from pipeplan.solver.formats.plan import Plan, Stage

        plan = Plan(self.graph.name, self.cluster.name, sum(cand.splits[0]), self.state_factor, self.schedule,
                    tuple(Stage(b, g, sp, rc) for b, g, sp, rc in
                          zip(cand.bounds, cand.groups, cand.splits, cand.recompute)))
        try:
            result = simulate(plan, self.graph, self.cluster, validate=False)
        except DeadlockError:
            return float("inf"), 0.0, False, float("inf")
        over = max(relative_overuse(p, c) for p, c in zip(result.peak_memory, result.memory_capacity))
        return result.iteration_time, max(result.peak_memory), result.fits, over


def relative_overuse(peak, capacity):
    """``(peak - capacity) / max(capacity, 1)``: how far a peak exceeds its memory, relatively (``<= 0``: fits).

    Works on floats and numpy arrays alike.  The floor of one byte keeps a device with
    no memory finite (its overuse is the peak in bytes).

    Examples
    --------
    >>> relative_overuse(3.0, 2.0), relative_overuse(5.0, 0.0), relative_overuse(0.0, 0.0)
    (0.5, 5.0, 0.0)
    """
    over = (peak - capacity) / np.maximum(capacity, 1.0)
    return float(over) if np.ndim(over) == 0 else over


def simulate_batch(plans: Sequence["Plan"], graph: "LayerGraph", cluster: "Cluster") -> BatchResult:
    """Evaluate many plans at once; plans of one schedule and state factor batch together.

    Parameters
    ----------
    plans : sequence of Plan
        Validated plans (not checked again).
    graph, cluster
        What they run on.

    Returns
    -------
    BatchResult
        In the order of ``plans``.
    """
    n_plans = len(plans)
    out = BatchResult(np.full(n_plans, np.inf), np.zeros(n_plans), np.zeros(n_plans, dtype=bool),
                      np.full(n_plans, np.inf), np.zeros(n_plans, dtype=bool))
    by_kind: dict[tuple[str, float], list[int]] = {}
    for i, p in enumerate(plans):
        by_kind.setdefault((p.schedule, p.state_factor), []).append(i)
    for (schedule, factor), members in by_kind.items():
        if schedule == "custom":
            for i in members:
                res = simulate(plans[i], graph, cluster, validate=False)
                out.iteration_time[i], out.peak_memory[i], out.fits[i] = \
                    res.iteration_time, max(res.peak_memory), res.fits
                out.overuse[i] = max(relative_overuse(p, c) for p, c in zip(res.peak_memory, res.memory_capacity))
            continue
        sim = BatchSimulator(graph, cluster, schedule, factor)
        res = sim.evaluate([Candidate.from_plan(plans[i]) for i in members])
        idx = np.array(members)
        out.iteration_time[idx], out.peak_memory[idx] = res.iteration_time, res.peak_memory
        out.fits[idx], out.batched[idx], out.overuse[idx] = res.fits, res.batched, res.overuse
    return out
