"""Stages described by device class, replica count and link, not by devices: :func:`class_arcs`.

Servers of one kind (the same link, the same devices) are interchangeable, and so are
devices of one class (the same speed and memory).  A stage's op times and memory depend
on its devices only through its replica count ``r`` and its slowest speed; its
all-reduce and its transfers depend on which servers hold it.  So a *stage type* is

- ``cls``: the device class of a slowest device of the stage (speed ``v``, memory ``m``);
- ``[r_lo, r_hi]``: the replica counts that give the same per-replica sizes
  ``q_k = ceil(n_k / r)`` (so the same op times and memory);
- ``link``: :data:`SINGLE` (``r_lo = 1``, no all-reduce), the index of a server kind
  whose one server holds the whole stage, or :data:`SPREAD` (the stage spans servers);
- ``recompute``.

An *arc* is a stage type on a layer range ``[lo, hi)``.  Every version-1 plan of an
equal-split problem maps each of its stages to exactly one arc (its range, the class of
a slowest device, the ``q``-class of its ``r``, the server kind that holds it when one
server does, else ``SPREAD``, its flag), and every column of the table is, for that
plan's stage, a lower bound of the quantity it names (or exact), as
:mod:`pipeplan.solver.bounds.class_paths` proves term by term.  The table's size grows
with layers squared times classes, ``q``-classes and server kinds, never with devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.evaluation.memory import stash_points
from pipeplan.solver.formats.cluster import Cluster, Link
from pipeplan.solver.space.arcs import tau_ops
from pipeplan.solver.space.device_classes import DeviceClass, device_classes

SINGLE = -2
"""``link`` of a type whose replica range starts at 1: no all-reduce, any placement."""
SPREAD = -1
"""``link`` of a type whose devices span two servers or more: every pair across servers uses the network."""

MEMORY_MARGIN = 1e-9
"""Relative slack on a device's memory when testing a stage's peak: the table sums bytes in another order
than the simulator, and an arc kept by mistake only weakens a bound, one dropped by mistake breaks it."""


@dataclass(frozen=True)
class ServerKind:
    """Interchangeable servers: the same link and, per device class, the same number of devices."""

    link: Link
    """The link inside each of these servers (its ``id`` is the first server's)."""
    servers: tuple[str, ...]
    """Ids of the servers of this kind."""
    per_class: tuple[int, ...]
    """Devices of each device class (indices of :func:`device_classes`) on one server of this kind."""

    @property
    def count(self) -> int:
        """Servers of this kind."""
        return len(self.servers)

    @property
    def size(self) -> int:
        """Devices on one server of this kind."""
        return sum(self.per_class)


@dataclass(frozen=True)
class StageType:
    """A stage up to interchangeable devices and servers (see the module docstring)."""

    cls: int
    """Index into :attr:`ClassArcs.classes` of a slowest device's class."""
    r_lo: int
    """Smallest replica count of the type's ``q``-class."""
    r_hi: int
    """Largest replica count of the ``q``-class that the type's placement allows."""
    q: tuple[int, ...]
    """``ceil(n_k / r)`` per microbatch, the same for every ``r`` in ``[r_lo, r_hi]``."""
    link: int
    """:data:`SINGLE`, :data:`SPREAD` or the index of the server kind that holds the stage."""
    recompute: bool
    """Whether the stage recomputes its activations."""


def server_kinds(cluster: Cluster, classes: tuple[DeviceClass, ...]) -> tuple[ServerKind, ...]:
    """Servers grouped by link and devices per class, in the order of their first server.

    Examples
    --------
    >>> from pipeplan.solver.formats.cluster import Device
    >>> c = Cluster("c", (Link(1e9, 0, "a"), Link(1e9, 0, "b")), Link(1e8, 0),
    ...             (Device("x", "a", 1, 1e9), Device("y", "b", 1, 1e9)))
    >>> [k.servers for k in server_kinds(c, device_classes(c))]
    [('a', 'b')]
    """
    index = {(c.speed, c.memory): i for i, c in enumerate(classes)}
    counts: dict[str, list[int]] = {s.id: [0] * len(classes) for s in cluster.servers}  # type: ignore[misc]
    for d in cluster.devices:
        counts[d.server][index[(d.speed, d.memory)]] += 1
    kinds: dict[tuple, list[str]] = {}
    links: dict[tuple, Link] = {}
    for s in cluster.servers:
        key = (s.bandwidth, s.latency, tuple(counts[s.id]))  # type: ignore[index]
        kinds.setdefault(key, []).append(s.id)  # type: ignore[arg-type]
        links.setdefault(key, s)
    return tuple(ServerKind(links[k], tuple(ids), k[2]) for k, ids in kinds.items() if sum(k[2]))


def q_classes(sizes: tuple[int, ...], most: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """``(r_lo, r_hi, q)`` for every distinct ``q = ceil(n_k / r)`` with ``1 <= r <= most``.

    Examples
    --------
    >>> q_classes((4, 4), 8)
    [(1, 1, (4, 4)), (2, 3, (2, 2)), (4, 8, (1, 1))]
    """
    out: list[tuple[int, int, tuple[int, ...]]] = []
    for r in range(1, most + 1):
        q = tuple(-(-n // r) for n in sizes)
        if out and out[-1][2] == q:
            out[-1] = (out[-1][0], r, q)
        else:
            out.append((r, r, q))
        if max(q) == 1:  # every larger r gives the same q: jump to the end
            out[-1] = (out[-1][0], most, q)
            break
    return out


@dataclass
class ClassArcs:
    """Every arc that may be in a plan better than ``upper``, with its terms (one numpy column each).

    Times are seconds, one entry per arc.  ``n_0``, ``n_last`` and ``n_min`` are the first,
    last and smallest microbatch sizes.
    """

    problem: PlanningProblem
    """The problem the arcs describe."""
    classes: tuple[DeviceClass, ...]
    """Device classes, fastest first."""
    kinds: tuple[ServerKind, ...]
    """Server kinds."""
    types: tuple[StageType, ...]
    """Stage types; ``type`` indexes them."""
    upper: float
    """Arcs every configuration of which has a lower bound at or above this were left out (``inf``: none)."""
    lo: np.ndarray
    """First layer."""
    hi: np.ndarray
    """One past the last layer."""
    type: np.ndarray
    """Index into :attr:`types`."""
    busy: np.ndarray
    """``sum_k (TF_k + TB_k)``: every op of the stage (exact)."""
    allreduce: np.ndarray
    """Lower bound on ``AR`` (exact for a stage on one server)."""
    fwd0: np.ndarray
    """``TF`` of microbatch 0 (exact)."""
    fwd_max: np.ndarray
    """Largest ``TF_k`` (exact)."""
    fwd_sum: np.ndarray
    """``sum_k TF_k`` (exact)."""
    op_max: np.ndarray
    """Largest ``TF_k + TB_k`` (exact)."""
    bwd_last: np.ndarray
    """``TB`` of the last microbatch (exact)."""
    bwd_max: np.ndarray
    """Largest ``TB_k`` (exact)."""
    pass_min: np.ndarray
    """``TF(n_min) + TB(n_min)`` (exact; at most any microbatch's pair)."""
    send0: np.ndarray
    """Lower bound on a transfer of microbatch 0 across the cut after the arc (0 on the last layer)."""
    send_last: np.ndarray
    """The same for the last microbatch."""
    send_min: np.ndarray
    """The same for a microbatch of ``n_min`` samples (at most any microbatch's)."""
    need: np.ndarray
    """Peak bytes per device with the smallest warm-up the arc can have (its devices need at least this)."""
    warmup_fit: np.ndarray
    """Largest warm-up ``w`` (forwards before the first backward) with which the stage fits its class's
    memory; ``M`` or more: any."""
    standalone: np.ndarray
    """A lower bound on every configuration holding the arc (its pruning value)."""

    def __len__(self) -> int:
        return len(self.lo)

    @property
    def replicas(self) -> np.ndarray:
        """``r_lo`` of each arc's type."""
        return np.array([t.r_lo for t in self.types], dtype=np.int64)[self.type]

    @property
    def speeds(self) -> np.ndarray:
        """Slowest speed of each arc's type."""
        return np.array([self.classes[t.cls].speed for t in self.types])[self.type]

    @property
    def passes(self) -> np.ndarray:
        """``u' = TF(n_min) + TB(n_min) + 2 send_min``: one microbatch through the stage and its cut, both ways."""
        return self.pass_min + 2 * self.send_min

    @property
    def heads(self) -> np.ndarray:
        """``TF_0 + send0``: microbatch 0 through the stage and on across its cut."""
        return self.fwd0 + self.send0

    @property
    def tails(self) -> np.ndarray:
        """``TB_{M-1} + send_last``: the last microbatch's gradient across the cut after the stage, then its backward."""
        return self.bwd_last + self.send_last

    def subset(self, keep: np.ndarray) -> "ClassArcs":
        """The arcs where ``keep`` is true (a boolean mask), same types."""
        cols = {name: getattr(self, name)[keep] for name in ARC_COLUMNS}
        return ClassArcs(self.problem, self.classes, self.kinds, self.types, self.upper, **cols)


ARC_COLUMNS = ("lo", "hi", "type", "busy", "allreduce", "fwd0", "fwd_max", "fwd_sum", "op_max", "bwd_last",
               "bwd_max", "pass_min", "send0", "send_last", "send_min", "need", "warmup_fit", "standalone")


# ------------------------------------------------------------------------------------------------ types
def _faster(classes: tuple[DeviceClass, ...], c: int) -> list[int]:
    """Classes whose speed is at least class ``c``'s (a stage whose slowest class is ``c`` draws from them)."""
    return [k for k, other in enumerate(classes) if other.speed >= classes[c].speed]


def stage_types(problem: PlanningProblem, classes: tuple[DeviceClass, ...],
                kinds: tuple[ServerKind, ...]) -> tuple[StageType, ...]:
    """Every stage type of ``problem``: classes x ``q``-classes x links x recompute flags.

    A server-kind link is offered when one server of the kind holds ``r_lo`` devices at
    least as fast as the class, unless the network is at least as good as the server's
    link and a spread type exists: a stage on one such server then maps to the spread
    type, whose all-reduce and send bounds are no larger and whose only device rows are
    the cluster-wide ones.
    """
    sizes = problem.split
    flags = (False, True) if problem.allow_recompute else (False,)
    net = problem.cluster.network
    out: list[StageType] = []
    for c in range(len(classes)):
        faster = _faster(classes, c)
        total = sum(classes[k].count for k in faster)
        most = total if problem.allow_replication else 1
        per_kind = [sum(kind.per_class[k] for k in faster) for kind in kinds]
        servers = sum(kind.count for kind, n in zip(kinds, per_kind) if n)
        for r_lo, r_hi, q in q_classes(sizes, most):
            links: list[tuple[int, int]] = []
            if r_lo == 1:
                links.append((SINGLE, r_hi))
            else:
                for j, (kind, n) in enumerate(zip(kinds, per_kind)):
                    better = kind.link.bandwidth > net.bandwidth or kind.link.latency < net.latency
                    # the server holds a device of the class (a slowest one) and r_lo at least as fast
                    if kind.per_class[c] and n >= r_lo and (better or servers < 2):
                        links.append((j, min(r_hi, n)))
                if servers >= 2:
                    links.append((SPREAD, r_hi))
            for link, top in links:
                for rc in flags:
                    out.append(StageType(c, r_lo, top, q, link, rc))
    return tuple(out)


# ------------------------------------------------------------------------------------------------ ranges
@dataclass(frozen=True)
class _Ranges:
    """Per-range sums of the graph, every range ``[lo, hi)`` once (``np.triu_indices`` order)."""

    lo: np.ndarray
    hi: np.ndarray
    af: np.ndarray
    bf: np.ndarray
    ab: np.ndarray
    bb: np.ndarray
    params: np.ndarray
    act: np.ndarray
    inputs: np.ndarray
    cut: np.ndarray


def _ranges(problem: PlanningProblem) -> _Ranges:
    graph = problem.graph
    layers, L = graph.layers, len(graph)
    lo, hi = (a.astype(np.int64) for a in np.triu_indices(L + 1, 1))
    cols = {"af": [l.fwd[0] for l in layers], "bf": [l.fwd[1] for l in layers], "ab": [l.bwd[0] for l in layers],
            "bb": [l.bwd[1] for l in layers], "params": [l.params for l in layers], "act": [l.act for l in layers]}
    # each range summed from its own first layer: a difference of prefix sums loses precision
    # against much larger earlier layers (tests/test_class_bound.py's regression)
    sums = {n: np.concatenate([np.cumsum(np.array(v[x:], dtype=float)) for x in range(L)]) for n, v in cols.items()}
    inputs = np.array([graph.stage_input_bytes(x) for x in range(L)])[lo]
    cuts = np.array([graph.cut_bytes(c) for c in range(L - 1)] + [0.0])[hi - 1]
    return _Ranges(lo, hi, inputs=inputs, cut=cuts, **sums)


# ------------------------------------------------------------------------------------------------ terms
def _links(problem: PlanningProblem, classes, kinds, t: StageType) -> tuple[float, float, float, float]:
    """``(ar_bw, ar_lat, send_bw, send_lat)``: the all-reduce's link and the best conceivable send link."""
    cluster = problem.cluster
    net = cluster.network
    every = (net, *cluster.servers)
    if t.link == SINGLE:
        return math.inf, 0.0, max(l.bandwidth for l in every), min(l.latency for l in every)
    if t.link == SPREAD:
        return net.bandwidth, net.latency, net.bandwidth, net.latency
    kind = kinds[t.link]
    # the next stage shares the server only if it has room for one more device
    if kind.size > t.r_lo:
        return (kind.link.bandwidth, kind.link.latency, max(kind.link.bandwidth, net.bandwidth),
                min(kind.link.latency, net.latency))
    return kind.link.bandwidth, kind.link.latency, net.bandwidth, net.latency


def _peaks(problem: PlanningProblem, q: tuple[int, ...], ranges: _Ranges, recompute: bool) -> np.ndarray:
    """``(W, ranges)`` stash peak per device for each warm-up ``w = 0 .. W-1`` (state excluded)."""
    M = len(q)
    warmups = range(M + 1) if problem.schedule == "1f1b" else range(1)
    rows = []
    for w in warmups:
        points = stash_points(tau_ops(problem.schedule, M, w), list(q))
        if recompute:
            rows.append(np.max(np.outer(ranges.inputs, points[:, 0]) + np.outer(ranges.act, points[:, 1]), axis=1))
        else:
            rows.append(ranges.act * points[:, 0].max())
    return np.array(rows)


def _type_columns(problem: PlanningProblem, classes, kinds, t: StageType, ranges: _Ranges,
                  peaks: np.ndarray) -> dict[str, np.ndarray]:
    """Every column of :class:`ClassArcs` but ``standalone`` for type ``t`` on every range."""
    sizes = problem.split
    M = len(sizes)
    v = classes[t.cls].speed
    q = np.array(t.q, dtype=float)
    # (M, ranges) op times: TF_k = (af + bf q_k) / v, TB_k likewise plus TF_k when recomputing
    fwd = (ranges.af[None, :] + np.outer(q, ranges.bf)) / v
    bwd = (ranges.ab[None, :] + np.outer(q, ranges.bb)) / v + (fwd if t.recompute else 0.0)
    k_min = int(np.argmin(sizes))
    ar_bw, ar_lat, send_bw, send_lat = _links(problem, classes, kinds, t)
    r = t.r_lo
    if r >= 2:
        allreduce = np.where(ranges.params > 0, 2 * (r - 1) * (ar_lat + ranges.params / (r * ar_bw)), 0.0)
    else:
        allreduce = np.zeros_like(ranges.params)
    last = ranges.hi == len(problem.graph)

    def send(n: int) -> np.ndarray:
        return np.where(last, 0.0, send_lat + n * ranges.cut / (t.r_hi * send_bw))

    state = problem.state_factor * ranges.params
    if problem.schedule == "1f1b":
        smallest = np.where(last, 0, min(1, M))
        need = state + np.where(last, peaks[0], peaks[min(1, M)])
        fits = state[None, :] + peaks <= classes[t.cls].memory * (1 + MEMORY_MARGIN)
        # the largest w such that every warm-up up to it fits (peaks grow with w; tests check it)
        leading = np.cumprod(fits, axis=0).sum(axis=0) - 1
        warmup_fit = np.where(leading >= smallest, leading, -1)
    else:
        need = state + peaks[0]
        warmup_fit = np.where(need <= classes[t.cls].memory * (1 + MEMORY_MARGIN), M, -1)
    return {"busy": fwd.sum(axis=0) + bwd.sum(axis=0), "allreduce": allreduce, "fwd0": fwd[0],
            "fwd_max": fwd.max(axis=0), "fwd_sum": fwd.sum(axis=0), "op_max": (fwd + bwd).max(axis=0),
            "bwd_last": bwd[-1], "bwd_max": bwd.max(axis=0), "pass_min": fwd[k_min] + bwd[k_min],
            "send0": send(sizes[0]), "send_last": send(sizes[-1]), "send_min": send(min(sizes)),
            "need": need, "warmup_fit": warmup_fit.astype(np.int64)}


def _cover_min(L: int, lo: np.ndarray, hi: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(P, Q)``: cheapest cover of ``[0, h)`` and of ``[h, L)`` by consecutive ranges, per ``h``."""
    best = np.full((L + 1, L + 1), np.inf)
    np.minimum.at(best, (lo, hi), cost)
    head, tail = np.full(L + 1, np.inf), np.full(L + 1, np.inf)
    head[0], tail[L] = 0.0, 0.0
    for h in range(1, L + 1):
        head[h] = np.min(head[:h] + best[:h, h])
    for h in range(L - 1, -1, -1):
        tail[h] = np.min(best[h, h + 1:] + tail[h + 1:])
    return head, tail


def class_arcs(problem: PlanningProblem, upper: float = math.inf) -> ClassArcs:
    """The arcs of every configuration that might beat ``upper``, with their terms.

    Parameters
    ----------
    problem : PlanningProblem
        A version-1 problem with equal microbatches (``gpipe`` or ``1f1b``).
    upper : float
        An incumbent's iteration time: an arc whose :attr:`ClassArcs.standalone` bound is
        at least this is left out (every plan holding it is no faster).

    Returns
    -------
    ClassArcs
        Arcs that fit in memory with their smallest warm-up and whose stage time
        ``busy + AR`` and standalone bound are below ``upper``.

    Raises
    ------
    ValueError
        For a version-2 schedule or free microbatch sizes.
    """
    if problem.is_v2 or problem.free_sizes:
        raise ValueError("class arcs describe version-1 plans with equal microbatches (gpipe or 1f1b)")
    classes = device_classes(problem.cluster)
    kinds = server_kinds(problem.cluster, classes)
    types = stage_types(problem, classes, kinds)
    ranges = _ranges(problem)
    L = len(problem.graph)
    peak_cache: dict[tuple, np.ndarray] = {}
    parts: dict[str, list[np.ndarray]] = {name: [] for name in ARC_COLUMNS}
    for index, t in enumerate(types):
        key = (t.q, t.recompute)
        if key not in peak_cache:
            peak_cache[key] = _peaks(problem, t.q, ranges, t.recompute)
        cols = _type_columns(problem, classes, kinds, t, ranges, peak_cache[key])
        keep = (cols["warmup_fit"] >= 0) & (cols["busy"] + cols["allreduce"] < upper)
        if not keep.any():
            continue
        parts["lo"].append(ranges.lo[keep])
        parts["hi"].append(ranges.hi[keep])
        parts["type"].append(np.full(int(keep.sum()), index, dtype=np.int64))
        for name, col in cols.items():
            parts[name].append(col[keep])
        parts["standalone"].append(np.zeros(int(keep.sum())))
    if not parts["lo"]:
        empty = {name: np.zeros(0, dtype=np.int64 if name in ("lo", "hi", "type", "warmup_fit") else float)
                 for name in ARC_COLUMNS}
        return ClassArcs(problem, classes, kinds, types, upper, **empty)
    arcs = ClassArcs(problem, classes, kinds, types, upper,
                     **{name: np.concatenate(cols) for name, cols in parts.items()})
    arcs.standalone = standalone_bounds(arcs)
    return arcs.subset(arcs.standalone < upper) if math.isfinite(upper) else arcs


def standalone_bounds(arcs: ClassArcs) -> np.ndarray:
    """A lower bound on every configuration holding each arc (terms B1, P0 and P2 of
    :mod:`pipeplan.solver.bounds.class_paths` with the other stages at their cheapest, capacity ignored)."""
    problem = arcs.problem
    L, M = len(problem.graph), len(problem.split)
    heads_before, _ = _cover_min(L, arcs.lo, arcs.hi, arcs.heads)
    pass_before, pass_after = _cover_min(L, arcs.lo, arcs.hi, arcs.passes)
    later = np.minimum(L - arcs.hi, problem.stage_limit - 1)
    if problem.schedule == "1f1b":
        core = arcs.busy - arcs.fwd_max * np.minimum(later, M - 1) + 2 * arcs.send_min
    else:
        core = arcs.busy + 2 * arcs.send_min
    busy_path = heads_before[arcs.lo] + arcs.busy + arcs.allreduce
    pivot = pass_before[arcs.lo] + core + pass_after[arcs.hi]
    pivot_ar = heads_before[arcs.lo] + core + arcs.allreduce + pass_after[arcs.hi]
    return np.maximum.reduce([busy_path, pivot, pivot_ar])
