"""The batched simulator: many plans at once with numpy (TiDGAP's matrix evaluation).

UMPIPE's TiDGAP (``papers.md`` §1.2) speeds up its genetic search by "simultaneously
calculating the end time for multiple individuals and microbatches using matrix
operations".  Here a *batch* is a set of candidate plans of one *structure*: the same
programs (those a named schedule generates, or a custom plan's own), the same stages
on the same device groups, and the same number of microbatches per stage.  Stage
ranges, devices, recompute flags and microbatch sizes may all differ across the batch.
The timeline is then one loop over the actions in a static order, each step a handful
of numpy operations on vectors of length ``N`` (one entry per plan).

Why a static order works.  For fixed programs the order of every action on its group
is fixed, and so is the order of every transfer on its link: a transfer enters its link
in the sending group's program order.  So every plan whose actions wait for the same
sender microbatches is timed exactly by one pass over any order that puts each action
after what it waits for (:attr:`pipeplan.solver.evaluation.simulator.Wiring.order`).
Plans whose splits differ stage by stage wait for different sender microbatches.  Where
every stage sends its outputs in microbatch order (every named schedule does), the
arrivals over a link rise with the microbatch, so the latest of the overlapping sender
microbatches an action waits for is the last one: the wait is one gather.  An order that
serves the batch's median waits is then checked plan by plan (vectorised position
comparisons); the plans it does not serve are retried with an order of their own, and
small leftovers, plans that deadlock, and custom programs that send out of microbatch
order under waits that differ go to the scalar simulator (:attr:`BatchResult.batched`
says which path served a plan).

Every number is computed with the same floating-point operations in the same order as
:func:`pipeplan.solver.evaluation.simulator.simulate` (range sums are tabulated by the
same running sums; the memory walk is a sequential cumulative sum), so results equal
the scalar simulator's to the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from pipeplan.models.errors import DeadlockError, InputError
from pipeplan.solver.evaluation.simulator import PlanCosts, Wiring, plan_wiring, run_programs, simulate
from pipeplan.solver.schedules.schedule import BACKWARD, FORWARD, INPUT, WEIGHT, Action, format_action

if TYPE_CHECKING:
    from pipeplan.models.graph import LayerGraph
    from pipeplan.solver.formats.cluster import Cluster
    from pipeplan.solver.formats.plan import Plan

__all__ = ["BatchResult", "BatchSimulator", "Candidate", "PlanArrays", "iteration_times", "relative_overuse",
           "simulate_batch", "timeline_arrays"]

_ATTRS = ("af", "bf", "ab", "bb", "params", "act", "step", "aw", "bw", "act_w")
"""Range-sum columns of the table, in order."""
AF, BF, AB, BB, PARAMS, ACT, STEP, AW, BW, ACT_W = range(len(_ATTRS))

_KIND_ROW = {FORWARD: 0, BACKWARD: 1, INPUT: 2, WEIGHT: 3}
"""Where each kind's durations sit in a stage's duration table."""


@dataclass(frozen=True)
class Candidate:
    """A plan reduced to what its cost depends on (the schedule and state factor are the simulator's)."""

    bounds: tuple[tuple[int, int], ...]
    """Half-open layer ranges of the stages."""
    groups: tuple[tuple[str, ...], ...]
    """Device ids of each stage (stages with equal sets share a device group)."""
    recompute: tuple[bool, ...]
    """Recompute flag of each stage."""
    splits: tuple[tuple[int, ...], ...]
    """Microbatch sizes of each stage."""
    programs: tuple[tuple[Action, ...], ...] | None = None
    """A custom plan's programs, one per device group; ``None`` where the schedule generates them."""

    @classmethod
    def from_plan(cls, plan: "Plan") -> "Candidate":
        """The candidate of a plan (its schedule and state factor are not kept).

        Raises
        ------
        ValueError
            For a plan with tensor parallelism, ZeRO or a state split (version 3): a
            candidate cannot express them (:func:`simulate_batch` times such plans with
            the scalar simulator instead).
        """
        if plan.uses_v3:
            raise ValueError("a candidate holds no tensor-parallel degree, ZeRO level or state split; "
                             "simulate this plan with simulate()")
        programs = tuple(tuple(p) for p in plan.actions()) if plan.schedule_class.from_plan else None
        return cls(tuple(st.layers for st in plan.stages), tuple(st.devices for st in plan.stages),
                   tuple(st.recompute for st in plan.stages), tuple(st.microbatches for st in plan.stages), programs)

    @property
    def signature(self) -> tuple[int, ...]:
        """Microbatch count per stage."""
        return tuple(map(len, self.splits))

    @property
    def stage_groups(self) -> tuple[int, ...]:
        """The device group of each stage, numbered by the first stage on each."""
        index: dict[frozenset[str], int] = {}
        return tuple(index.setdefault(frozenset(g), len(index)) for g in self.groups)


@dataclass(frozen=True)
class BatchResult:
    """Iteration time and memory of ``N`` plans."""

    iteration_time: np.ndarray
    """Seconds per iteration, shape ``(N,)``; ``inf`` for a plan that deadlocks."""
    peak_memory: np.ndarray
    """Largest per-device peak over the plan's device groups (bytes), shape ``(N,)``."""
    fits: np.ndarray
    """Whether every group fits its devices, shape ``(N,)`` bool."""
    overuse: np.ndarray
    """Largest ``(peak - capacity) / max(capacity, 1)`` over the groups, ``(N,)`` (``<= 0``: fits).

    The floor of one byte keeps a device with no memory (``"memory": 0``, allowed) finite."""
    batched: np.ndarray
    """Whether the batched path (not the scalar fallback) evaluated the plan, ``(N,)`` bool."""


# --------------------------------------------------------------------------- structures
class _Structure:
    """What the plans of one structure share: the programs, the groups, where each action's numbers come from."""

    def __init__(self, wiring: Wiring) -> None:
        self.wiring = wiring
        counts = [len(split) for split in wiring.sizes]
        self.counts = counts
        self.first = [held[0] for held in wiring.held]
        """The stage whose device list names each group."""
        self.split = [False] * len(counts)
        """Whether each stage splits a backward (its table then also holds ``I`` and ``W``)."""
        for layout in wiring.layouts:
            for s, split in zip(layout.held, layout.split):
                self.split[s] = split
        offsets = np.concatenate(([0], np.cumsum([(4 if split else 2) * m for m, split in zip(counts, self.split)])))
        self.rows = [[int(offsets[s]) + _KIND_ROW[kind] * counts[s] + k for s, kind, k in program]
                     for program in wiring.programs]
        """Per group, the row of each action in the stacked duration table (:func:`_durations`)."""
        sent: dict[tuple[int, bool], list[int]] = {}  # (stage, backward?) -> microbatches in program order
        for program in wiring.programs:
            for s, kind, k in program:
                if kind != WEIGHT:
                    sent.setdefault((s, kind != FORWARD), []).append(k)
        self.monotone = all(ks == sorted(ks) for ks in sent.values())
        """Whether every stage sends its outputs in microbatch order (each wait is then one gather)."""
        self.walks = [layout.walk for layout in wiring.layouts]
        """Each group's memory walk (:class:`pipeplan.solver.evaluation.memory.StashWalk`), timed here as arrays."""
        self._orders: dict[tuple, list | None] = {}

    def order(self, waits: tuple) -> list[tuple[int, int]] | None:
        """An order of every ``(group, position)`` after the slots it waits for (``waits``: per action, a tuple of slots).

        ``None`` if these waits deadlock.
        """
        found = self._orders.get(waits, False)
        if found is not False:
            return found
        wiring = self.wiring
        known = [False] * wiring.slots
        ptr = [0] * len(wiring.programs)
        order: list[tuple[int, int]] | None = []
        total = sum(wiring.lengths)
        while len(order) < total:
            progressed = False
            for g, length in enumerate(wiring.lengths):
                p = ptr[g]
                while p < length and all(known[o] for o in waits[g][p]):
                    if wiring.sends[g][p] >= 0:
                        known[wiring.sends[g][p]] = True
                    order.append((g, p))
                    p += 1
                    progressed = True
                ptr[g] = p
            if not progressed:
                order = None
                break
        if len(self._orders) > 256:  # a long search sees many waits; keep memory bounded
            self._orders.clear()
        self._orders[waits] = order
        return order


# --------------------------------------------------------------------------- the arrays
@dataclass
class PlanArrays:
    """``N`` plans of one structure as arrays: shape ``(N, S)`` per stage or ``(N, G)`` per group unless noted."""

    structure: _Structure
    """What the plans share."""
    sizes: list[np.ndarray]
    """Per stage, its microbatch sizes, shape ``(N, m_s)`` (int)."""
    sums: np.ndarray
    """Range sums of :data:`_ATTRS` of each stage, shape ``(N, S, 10)``."""
    recompute: np.ndarray
    """Recompute flags of the stages (bool)."""
    input_bytes: np.ndarray
    """``I_s``: each stage's input bytes per sample."""
    replicas: np.ndarray
    """``r_g`` of each group (int)."""
    speed: np.ndarray
    """``v_g``: each group's slowest device's speed."""
    capacity: np.ndarray
    """Smallest device memory of each group."""
    ar_lat: np.ndarray
    """``lat(D_g)`` (0 for one device)."""
    ar_bw: np.ndarray
    """``bw(D_g)`` (1 for one device; unused then)."""
    cut: np.ndarray
    """Bytes per sample across the cut after stage ``s``, shape ``(N, S-1)``."""
    fwd_lat: np.ndarray
    """``lat(D_s, D_{s+1})``, shape ``(N, S-1)`` (0 between stages of one group)."""
    fwd_rate: np.ndarray
    """``min(r_s, r_{s+1}) * bw(D_s, D_{s+1})``, shape ``(N, S-1)`` (1 between stages of one group)."""
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


def _ceil_div(n: np.ndarray, r: np.ndarray) -> np.ndarray:
    return -(-n // r)


def _overlap_bounds(mine: np.ndarray, theirs: np.ndarray, first: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """For each of my microbatches, the first (``None`` unless ``first``) and last of theirs sharing a sample, ``(m, N)``.

    ``bisect_right(their_ends, my_start)`` and ``bisect_left(their_ends, my_end)`` of
    :func:`pipeplan.solver.evaluation.simulator.overlaps`, for ``(N, m)`` and ``(N, m')``
    size arrays.
    """
    my_ends = np.cumsum(mine, axis=1)
    their_ends = np.cumsum(theirs, axis=1)
    lo = (their_ends[:, None, :] <= (my_ends - mine)[:, :, None]).sum(axis=2).T if first else None
    hi = (their_ends[:, None, :] < my_ends[:, :, None]).sum(axis=2)
    return lo, hi.T


def _durations(a: PlanArrays) -> tuple[np.ndarray, list[np.ndarray]]:
    """Every stage's durations stacked, ``(rows, N)`` (``F``, ``B``, then ``I`` and ``W`` where split); ``q`` per stage ``(m_s, N)``."""
    st = a.structure
    groups = st.wiring.stage_groups
    tables, per_replica = [], []
    for s in range(len(st.counts)):
        g = groups[s]
        speed = a.speed[:, g]
        q = _ceil_div(a.sizes[s], a.replicas[:, g:g + 1]).T  # (m_s, N)
        af, bf, ab, bb = (a.sums[:, s, j] for j in (AF, BF, AB, BB))
        tf = (af + bf * q) / speed
        rec = np.where(a.recompute[:, s], tf, 0.0)
        tables += [tf, (ab + bb * q) / speed + rec]
        if st.split[s]:
            aw, bw = a.sums[:, s, AW], a.sums[:, s, BW]
            tables += [((ab - aw) + (bb - bw) * q) / speed + rec, (aw + bw * q) / speed]
        per_replica.append(q)
    return np.concatenate(tables), per_replica


def _send_times(a: PlanArrays) -> np.ndarray:
    """Seconds of every slot's transfer, ``(slots, N)`` (0 for hand-overs on one group)."""
    parts = []
    count = len(a.sizes)
    for s in range(count - 1):
        parts.append(a.fwd_lat[:, s] + a.sizes[s].T * a.cut[:, s] / a.fwd_rate[:, s])
    for s in range(1, count):
        parts.append(a.bwd_lat[:, s - 1] + a.sizes[s].T * a.cut[:, s - 1] / a.bwd_rate[:, s - 1])
    return np.concatenate(parts) if parts else np.zeros((0, a.count))


def _group_sum(a: PlanArrays, column: int) -> np.ndarray:
    """Per group, ``column`` summed over its stages in stage order (as the scalar simulator's ``sum``), ``(N, G)``."""
    out = []
    for held in a.structure.wiring.held:
        total = a.sums[:, held[0], column]
        for s in held[1:]:
            total = total + a.sums[:, s, column]
        out.append(total)
    return np.stack(out, axis=1)


def _tails(a: PlanArrays) -> np.ndarray:
    """``AR_g + STEP_g`` added to each group's last end, as two additions (``(end + AR) + STEP``): ``(AR, STEP)``."""
    r = a.replicas
    ar = np.where(r >= 2, 2 * (r - 1) * (a.ar_lat + _group_sum(a, PARAMS) / (r * a.ar_bw)), 0.0)
    return ar, _group_sum(a, STEP) / a.speed


def _group_peaks(a: PlanArrays, per_replica: list[np.ndarray]) -> np.ndarray:
    """Peak bytes per device of every group (spec 7.4), ``(N, G)``: each group's
    :class:`~pipeplan.solver.evaluation.memory.StashWalk` on vectors, its running sum a sequential cumulative sum."""
    st = a.structure
    rc = a.recompute
    stash = np.where(rc, a.input_bytes, a.sums[:, :, ACT])  # (N, S)
    working = np.where(rc, a.sums[:, :, ACT], 0.0)
    params = _group_sum(a, PARAMS)
    peaks = np.empty((a.count, len(st.walks)))
    zero = np.zeros((1, a.count))
    for g, walk in enumerate(st.walks):
        table, held = [], []
        for s in walk.stages:  # the rows as StashWalk lays them out: +qX, -qX, then (split) +qAw, -qAw
            q = per_replica[s]
            added = q * stash[:, s]
            table += [added, -added]
            if walk.split[s]:
                kept = q * a.sums[:, s, ACT_W]
                table += [kept, -kept]
            held.append(q * working[:, s])
        running = np.concatenate([zero, np.cumsum(np.concatenate(table)[walk.deltas], axis=0)])
        during = running[walk.before] + np.concatenate(held)[walk.working]
        peak = np.maximum(np.max(np.concatenate([running[walk.after], during]), axis=0), 0.0)
        peaks[:, g] = a.state_factor * params[:, g] + peak
    return peaks


def timeline_arrays(arrays: PlanArrays, min_batch: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Iteration time, per-group peak memory and capacity of a batch.

    Plans whose waits fit the static action order of the (remaining) batch are timed in
    one vectorised sweep; the others are retried with an order of their own, until fewer
    than ``min_batch`` remain (or none fits any order): their times are ``nan``, for the
    caller to evaluate one by one.

    Parameters
    ----------
    arrays : PlanArrays
        ``N`` plans of one structure.
    min_batch : int
        Smallest leftover worth another vectorised sweep.

    Returns
    -------
    (iteration_time, peak, capacity)
        Shapes ``(N,)``, ``(N, G)``, ``(N, G)``.
    """
    a = arrays
    table, per_replica = _durations(a)
    ends = _group_ends(a.structure, a.sizes, table, _send_times(a), a.count, min_batch)
    ar, step = _tails(a)
    return np.max(ends + ar + step, axis=1), _group_peaks(a, per_replica), a.capacity


# --------------------------------------------------------------------------- the sweep
def _last_overlaps(sizes: list[np.ndarray]) -> tuple[list[np.ndarray | None], list[np.ndarray | None]]:
    """The last sender microbatch each forward and each backward waits for, per stage ``(m_s, N)``: ``(hi_f, hi_b)``."""
    count = len(sizes)
    hi_f = [_overlap_bounds(sizes[s], sizes[s - 1], first=False)[1] if s > 0 else None for s in range(count)]
    hi_b = [_overlap_bounds(sizes[s], sizes[s + 1], first=False)[1] if s < count - 1 else None for s in range(count)]
    return hi_f, hi_b


def _first_overlaps(sizes: list[np.ndarray]) -> tuple[list[np.ndarray | None], list[np.ndarray | None]]:
    """The first sender microbatch each forward and each backward waits for: ``(lo_f, lo_b)``."""
    count = len(sizes)
    lo_f = [_overlap_bounds(sizes[s], sizes[s - 1])[0] if s > 0 else None for s in range(count)]
    lo_b = [_overlap_bounds(sizes[s], sizes[s + 1])[0] if s < count - 1 else None for s in range(count)]
    return lo_f, lo_b


def _wait_of(st: _Structure, action: Action) -> tuple[int, list, bool] | None:
    """``(first slot of the sender's row, the sender's stage, whether forward)`` of what an action waits for."""
    s, kind, _ = action
    wiring, last = st.wiring, len(st.counts) - 1
    if kind == FORWARD and s > 0:
        return wiring.fwd_base[s - 1], s, True
    if kind in (BACKWARD, INPUT) and s < last:
        return wiring.bwd_base[s + 1], s, False
    return None


def _static_waits(st: _Structure, hi_f, hi_b, column: int, lo_f=None, lo_b=None) -> tuple:
    """Per action, the slots plan ``column`` waits for: the last overlapping sender microbatch, or with ``lo_f``
    and ``lo_b`` every one."""
    out = []
    for program in st.wiring.programs:
        row = []
        for action in program:
            wait = _wait_of(st, action)
            if wait is None:
                row.append(())
                continue
            base, s, forward = wait
            k = action.microbatch
            last = base + int((hi_f if forward else hi_b)[s][k, column])
            if lo_f is None:
                row.append((last,))
            else:
                row.append(tuple(range(base + int((lo_f if forward else lo_b)[s][k, column]), last + 1)))
        out.append(tuple(row))
    return tuple(out)


def _same(arrays: list[np.ndarray | None]) -> bool:
    return all(h is None or bool((h == h[:, :1]).all()) for h in arrays)


_NONE, _ONE, _SEVERAL, _EACH = range(4)
"""How a step of the sweep waits: for nothing, one slot, several slots, a slot per plan (flat indices)."""


def _static_steps(st: _Structure, order: list[tuple[int, int]], waits: tuple) -> list[tuple]:
    """The sweep's steps ``(group, duration row, wait code, wait, slot filled, link)`` for static waits."""
    wiring, steps = st.wiring, []
    for g, p in order:
        slots = waits[g][p]
        code, wait = (_NONE, None) if not slots else (_ONE, slots[0]) if len(slots) == 1 else (_SEVERAL, slots)
        o = wiring.sends[g][p]
        steps.append((g, st.rows[g][p], code, wait, o, wiring.slot_link[o] if o >= 0 else -1))
    return steps


def _group_ends(st: _Structure, sizes: list[np.ndarray], table: np.ndarray, send: np.ndarray, n_plans: int,
                min_batch: int) -> np.ndarray:
    """End of every group's last action, ``(N, G)``; ``nan`` for the plans no static order served."""
    ends = np.full((n_plans, len(st.rows)), np.nan)
    hi_f, hi_b = _last_overlaps(sizes)
    if _same(hi_f + hi_b):
        lo_f, lo_b = (None, None) if st.monotone else _first_overlaps(sizes)
        if st.monotone or _same(lo_f + lo_b):  # one order serves them all
            waits = _static_waits(st, hi_f, hi_b, 0, lo_f, lo_b)
            order = st.order(waits)
            if order is not None:
                ends[:] = np.stack(_sweep(st.wiring, _static_steps(st, order, waits), table, send, n_plans), axis=1)
            return ends
    if not st.monotone:  # waits that differ need the last-microbatch gather
        return ends
    todo = np.arange(n_plans)
    while len(todo) >= min_batch or (len(todo) and len(todo) == n_plans):
        order = None
        for pick in (lambda h: np.median(h[:, todo], axis=1), lambda h: h[:, todo[0]]):
            chosen = [None if h is None else pick(h).astype(np.int64)[:, None] for h in hi_f + hi_b]
            order = st.order(_static_waits(st, chosen[:len(sizes)], chosen[len(sizes):], 0))
            if order is not None:
                break
        if order is None:
            break
        ok = _compatible(st, order, hi_f, hi_b, todo)
        if not ok.any():
            break
        cols = todo if ok.all() else todo[ok]
        ends[cols] = np.stack(_sweep(st.wiring, _gather_steps(st, order, hi_f, hi_b, cols), table[:, cols],
                                     send[:, cols], len(cols)), axis=1)
        todo = todo[~ok]
    return ends


def _gather_steps(st: _Structure, order: list[tuple[int, int]], hi_f, hi_b, cols: np.ndarray) -> list[tuple]:
    """The sweep's steps for plans ``cols`` whose waits differ: each wait a flat index per plan into the arrivals."""
    wiring, n = st.wiring, len(cols)
    spread = np.arange(n)
    flat_f = [None if h is None else (wiring.fwd_base[s - 1] + h[:, cols]) * n + spread for s, h in enumerate(hi_f)]
    flat_b = [None if h is None else (wiring.bwd_base[s + 1] + h[:, cols]) * n + spread for s, h in enumerate(hi_b)]
    steps = []
    for g, p in order:
        action = wiring.programs[g][p]
        wait = _wait_of(st, action)
        o = wiring.sends[g][p]
        link = wiring.slot_link[o] if o >= 0 else -1
        if wait is None:
            steps.append((g, st.rows[g][p], _NONE, None, o, link))
        else:
            steps.append((g, st.rows[g][p], _EACH, (flat_f if wait[2] else flat_b)[wait[1]][action.microbatch], o,
                          link))
    return steps


def _compatible(st: _Structure, order: list[tuple[int, int]], hi_f, hi_b, cols: np.ndarray) -> np.ndarray:
    """Which plans ``cols`` find every input already computed when ``order`` reaches an action."""
    wiring = st.wiring
    filled = np.zeros(wiring.slots, dtype=np.int64)  # position in the order of the action that fills each slot
    pos_f = [np.zeros(m, dtype=np.int64) for m in st.counts]  # position of each stage's forwards
    pos_b = [np.zeros(m, dtype=np.int64) for m in st.counts]  # ... and of its B or I
    for i, (g, p) in enumerate(order):
        s, kind, k = wiring.programs[g][p]
        if kind == FORWARD:
            pos_f[s][k] = i
        elif kind != WEIGHT:
            pos_b[s][k] = i
        if wiring.sends[g][p] >= 0:
            filled[wiring.sends[g][p]] = i
    ok = np.ones(len(cols), dtype=bool)
    for s in range(len(st.counts)):
        if hi_f[s] is not None:
            ok &= (filled[wiring.fwd_base[s - 1] + hi_f[s][:, cols]] < pos_f[s][:, None]).all(axis=0)
        if hi_b[s] is not None:
            ok &= (filled[wiring.bwd_base[s + 1] + hi_b[s][:, cols]] < pos_b[s][:, None]).all(axis=0)
    return ok


def _sweep(wiring: Wiring, steps: list[tuple], table: np.ndarray, send: np.ndarray, n_plans: int) -> list[np.ndarray]:
    """End of every group's last action, one vector per group, over ``steps`` (:func:`_static_steps`)."""
    clock = [np.zeros(n_plans) for _ in wiring.programs]
    arrival = np.zeros((wiring.slots, n_plans))
    flat = arrival.ravel()
    free = np.zeros((len(wiring.links), n_plans))
    maximum = np.maximum
    for g, row, code, wait, o, link in steps:
        now = clock[g]
        if code == _NONE:
            ready = now
        elif code == _ONE:
            ready = maximum(now, arrival[wait])
        elif code == _EACH:
            ready = maximum(now, flat[wait])
        else:
            ready = now
            for x in wait:
                ready = maximum(ready, arrival[x])
        end = ready + table[row]
        if o >= 0:
            if link < 0:
                arrival[o] = end
            else:
                t1 = maximum(end, free[link]) + send[o]
                free[link] = t1
                arrival[o] = t1
        clock[g] = end
    return clock


_GROUP_ARRAYS: dict[int, tuple] = {}


def _durations_of(costs: PlanCosts) -> np.ndarray:
    """Every action's seconds of a plan, group after group; each group's array made once (heuristics share groups)."""
    parts = []
    for group in costs.groups:
        found = _GROUP_ARRAYS.get(id(group))
        if found is None or found[0] is not group:
            if len(_GROUP_ARRAYS) > 20_000:
                _GROUP_ARRAYS.clear()
            # the entry holds its group, so the id it is filed under stays that group's while the entry lives
            found = _GROUP_ARRAYS[id(group)] = (group, np.array(group.durations))
        parts.append(found[1])
    return np.concatenate(parts)


def iteration_times(plans: Sequence[PlanCosts], min_batch: int = 4) -> np.ndarray:
    """The iteration time :func:`pipeplan.solver.evaluation.simulator.run_programs` gives each plan's costs, in batches.

    Plans that share one wiring (:func:`pipeplan.solver.evaluation.simulator.plan_wiring`
    gives plans of one structure and split the same object) are timed together; the
    others one by one by ``run_programs`` itself.  The batched numbers come from the same
    floating-point operations in the same order, so they equal ``run_programs``'s exactly.

    Parameters
    ----------
    plans : sequence of PlanCosts
        Each plan's costs (:func:`pipeplan.solver.evaluation.simulator.plan_costs`).
    min_batch : int
        Fewest plans of one wiring timed together.

    Returns
    -------
    numpy.ndarray
        Seconds per iteration, shape ``(N,)``.

    Raises
    ------
    DeadlockError
        As ``run_programs`` does, for a plan whose actions can never all run.

    Examples
    --------
    >>> iteration_times([plan_costs(plan, graph, cluster) for plan in plans])  # doctest: +SKIP
    """
    times = np.full(len(plans), np.nan)
    by_wiring: dict[int, list[int]] = {}
    for i, costs in enumerate(plans):
        by_wiring.setdefault(id(costs.wiring), []).append(i)
    for members in by_wiring.values():
        if len(members) < min_batch:
            continue
        wiring = plans[members[0]].wiring
        try:
            order = wiring.order
        except DeadlockError:
            continue
        batch = [plans[i] for i in members]
        offsets = np.concatenate(([0], np.cumsum(wiring.lengths)))
        table = np.stack([_durations_of(c) for c in batch], axis=1)
        send = np.array([c.send_times for c in batch], dtype=float).reshape(len(batch), wiring.slots).T
        steps = []
        for g, p in order:
            slots = wiring.wait_slots(g, p)
            code, wait = (_NONE, None) if not slots else (_ONE, slots[0]) if len(slots) == 1 else (_SEVERAL, slots)
            o = wiring.sends[g][p]
            steps.append((g, int(offsets[g]) + p, code, wait, o, wiring.slot_link[o] if o >= 0 else -1))
        ends = np.stack(_sweep(wiring, steps, table, send, len(batch)), axis=1)
        ar = np.array([[g.allreduce for g in c.groups] for c in batch])
        step = np.array([[g.step for g in c.groups] for c in batch])
        times[members] = np.max(ends + ar + step, axis=1)
    for i in np.flatnonzero(np.isnan(times)):
        times[i] = run_programs(plans[i]).iteration_time
    return times


# --------------------------------------------------------------------------- building arrays
@dataclass
class BatchSimulator:
    """Evaluates candidates of one graph, cluster, schedule and state factor in batches.

    Parameters
    ----------
    graph, cluster
        What the plans run on.
    schedule : str
        Any schedule; under ``custom`` each candidate carries its programs.
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
    """``table[lo, hi]``: range sums of ``_ATTRS`` over layers ``lo <= i < hi``, ``(L+1, L+1, 10)``."""
    cut_bytes: np.ndarray = field(init=False, repr=False)
    """Bytes per sample across the cut after layer ``c``, padded to ``L`` entries."""
    input_by_lo: np.ndarray = field(init=False, repr=False)
    """Input bytes per sample of a stage starting at layer ``lo``."""
    _groups: dict = field(init=False, repr=False, default_factory=dict)
    _pairs: dict = field(init=False, repr=False, default_factory=dict)
    _structures: dict = field(init=False, repr=False, default_factory=dict)
    _stage_groups: dict = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        layers = self.graph.layers
        n = len(layers)
        rows = [(l.fwd[0], l.fwd[1], l.bwd[0], l.bwd[1], l.params, l.act, l.step_time, *l.weight_bwd, l.act_weight)
                for l in layers]
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
        """``(lat(x, y), min(|x|, |y|) * bw(x, y))`` of a link between groups (cached); ``(0, 1)`` within one group."""
        info = self._pairs.get((x, y))
        if info is None:
            if frozenset(x) == frozenset(y):
                info = (0.0, 1.0)
            else:
                info = (self.cluster.lat(x, y), min(len(x), len(y)) * self.cluster.bw(x, y))
            self._pairs[(x, y)] = info
        return info

    def _key(self, cand: Candidate) -> tuple:
        """What a candidate's structure is made of: its programs (custom), the group of each stage, its counts."""
        stage_groups = self._stage_groups.get(cand.groups)
        if stage_groups is None:
            stage_groups = self._stage_groups[cand.groups] = cand.stage_groups
        return cand.programs, stage_groups, cand.signature

    def structure(self, cand: Candidate) -> _Structure | None:
        """The :class:`_Structure` of a candidate's programs, groups and counts (cached); ``None`` if they are invalid."""
        return self._structure(self._key(cand), cand)

    def _structure(self, key: tuple, cand: Candidate) -> _Structure | None:
        if key not in self._structures:
            try:
                wiring = plan_wiring(self._plan(cand))
            except (InputError, ValueError):
                wiring = None
            if len(self._structures) > 256:  # a long search sees many structures; keep memory bounded
                self._structures.clear()
            self._structures[key] = None if wiring is None else _Structure(wiring)
        return self._structures[key]

    def arrays(self, candidates: Sequence[Candidate], structure: _Structure | None = None) -> PlanArrays:
        """The arrays of candidates of one structure."""
        st = structure or self.structure(candidates[0])
        if st is None:
            raise ValueError("these candidates' programs break a rule of the spec; simulate them one by one")
        n_plans, stages = len(candidates), len(candidates[0].bounds)
        lo = np.array([[b[0] for b in c.bounds] for c in candidates], dtype=np.int64)
        hi = np.array([[b[1] for b in c.bounds] for c in candidates], dtype=np.int64)
        ginfo = np.array([[self.group_info(c.groups[s]) for s in st.first] for c in candidates], dtype=float)
        if stages > 1:
            fwd_pairs = np.array([[self.pair_info(c.groups[s], c.groups[s + 1]) for s in range(stages - 1)]
                                  for c in candidates], dtype=float)
            bwd_pairs = np.array([[self.pair_info(c.groups[s + 1], c.groups[s]) for s in range(stages - 1)]
                                  for c in candidates], dtype=float)
        else:
            fwd_pairs = bwd_pairs = np.zeros((n_plans, 0, 2))
        sizes = [np.array([c.splits[s] for c in candidates], dtype=np.int64) for s in range(stages)]
        return PlanArrays(
            structure=st, sizes=sizes, sums=self.table[lo, hi], recompute=np.array([c.recompute for c in candidates],
                                                                                    dtype=bool),
            input_bytes=self.input_by_lo[lo], replicas=ginfo[:, :, 0].astype(np.int64), speed=ginfo[:, :, 1],
            capacity=ginfo[:, :, 2], ar_lat=ginfo[:, :, 3], ar_bw=ginfo[:, :, 4], cut=self.cut_bytes[hi[:, :-1] - 1],
            fwd_lat=fwd_pairs[:, :, 0], fwd_rate=fwd_pairs[:, :, 1], bwd_lat=bwd_pairs[:, :, 0],
            bwd_rate=bwd_pairs[:, :, 1], state_factor=self.state_factor)

    def evaluate(self, candidates: Sequence[Candidate]) -> BatchResult:
        """Iteration time, peak memory and fit of every candidate.

        Candidates are grouped by structure; each group of two or more runs through
        :func:`timeline_arrays`, the plans it declines (and lone ones) through the scalar
        simulator, one at a time.
        """
        n_plans = len(candidates)
        times, peaks = np.full(n_plans, np.inf), np.zeros(n_plans)
        fits, batched = np.zeros(n_plans, dtype=bool), np.zeros(n_plans, dtype=bool)
        overuse = np.full(n_plans, np.inf)
        groups: dict[tuple, list[int]] = {}
        for i, cand in enumerate(candidates):
            groups.setdefault(self._key(cand), []).append(i)
        for key, members in groups.items():
            st = self._structure(key, candidates[members[0]]) if len(members) >= 2 else None
            if st is None:
                for i in members:
                    times[i], peaks[i], fits[i], overuse[i] = self._scalar(candidates[i])
                continue
            out = timeline_arrays(self.arrays([candidates[i] for i in members], st))
            idx = np.array(members)
            done = ~np.isnan(out[0])
            times[idx], peaks[idx] = out[0], out[1].max(axis=1)
            fits[idx] = (out[1] <= out[2]).all(axis=1)
            overuse[idx] = relative_overuse(out[1], out[2]).max(axis=1)
            batched[idx] = done
            for i in idx[~done]:  # plans no static order served: one by one
                times[i], peaks[i], fits[i], overuse[i] = self._scalar(candidates[i])
        return BatchResult(times, peaks, fits, overuse, batched)

    def _plan(self, cand: Candidate) -> "Plan":
        from pipeplan.solver.formats.plan import Plan, Stage

        programs = None if cand.programs is None else tuple(tuple(format_action(a) for a in p) for p in cand.programs)
        return Plan(self.graph.name, self.cluster.name, sum(cand.splits[0]), self.state_factor, self.schedule,
                    tuple(Stage(b, g, sp, rc) for b, g, sp, rc in
                          zip(cand.bounds, cand.groups, cand.splits, cand.recompute)), custom_programs=programs)

    def _scalar(self, cand: Candidate) -> tuple[float, float, bool, float]:
        try:
            result = simulate(self._plan(cand), self.graph, self.cluster, validate=False)
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

    A plan with tensor parallelism, ZeRO or a state split (version 3) is timed by the
    scalar simulator (its ``batched`` entry is ``False``).

    Parameters
    ----------
    plans : sequence of Plan
        Validated plans (not checked again), of any schedule.
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
        if p.uses_v3:  # tensor parallelism, ZeRO, a state split: candidates cannot hold them, so scalar
            try:
                result = simulate(p, graph, cluster, validate=False)
            except DeadlockError:
                continue  # as BatchSimulator reports one: infinite time, does not fit
            out.iteration_time[i], out.peak_memory[i] = result.iteration_time, max(result.peak_memory)
            out.fits[i] = result.fits
            out.overuse[i] = max(relative_overuse(pk, c) for pk, c in zip(result.peak_memory, result.memory_capacity))
            continue
        by_kind.setdefault((p.schedule, p.state_factor), []).append(i)
    for (schedule, factor), members in by_kind.items():
        sim = BatchSimulator(graph, cluster, schedule, factor)
        res = sim.evaluate([Candidate.from_plan(plans[i]) for i in members])
        idx = np.array(members)
        out.iteration_time[idx], out.peak_memory[idx] = res.iteration_time, res.peak_memory
        out.fits[idx], out.batched[idx], out.overuse[idx] = res.fits, res.batched, res.overuse
    return out
