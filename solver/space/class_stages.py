"""Stages described by device class, replica count and link, not by devices: :func:`stage_types`.

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

Every stage of a version-1 plan of an equal-split problem has exactly one type (the
class of a slowest device, the ``q``-class of its ``r``, the server kind that holds it
when one server does, else ``SPREAD``, its flag), and every term the class-level model
derives from a type is, for that stage, a lower bound of the quantity it names (or
exact), as :mod:`pipeplan.solver.bounds.class_paths` proves term by term.  The types
grow with classes, ``q``-classes and server kinds, never with devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.formats.cluster import Cluster, Link
from pipeplan.solver.space.device_classes import DeviceClass, device_classes

SINGLE = -2
"""``link`` of a type whose replica range starts at 1: no all-reduce, any placement."""
SPREAD = -1
"""``link`` of a type whose devices span two servers or more: every pair across servers uses the network."""


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


# ------------------------------------------------------------------------------------------------ types
def _faster(classes: tuple[DeviceClass, ...], c: int) -> list[int]:
    """Classes whose speed is at least class ``c``'s (a stage whose slowest class is ``c`` draws from them)."""
    return [k for k, other in enumerate(classes) if other.speed >= classes[c].speed]


def stage_types(problem: PlanningProblem, classes: tuple[DeviceClass, ...],
                kinds: tuple[ServerKind, ...]) -> tuple[StageType, ...]:
    """Every stage type of ``problem``: classes x ``q``-classes x links x recompute flags.

    Their number grows with the device classes, the server kinds and the distinct
    ``ceil(n_k / r)`` (about ``2 sqrt(n)`` of them), not with the devices.

    A server-kind link is offered when one server of the kind holds ``r_lo`` devices at
    least as fast as the class, unless the network is at least as good as the server's
    link and a spread type exists: a stage on one such server then maps to the spread
    type, whose all-reduce and send bounds are no larger and whose only device rows are
    the cluster-wide ones.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Device
    >>> graph = LayerGraph.chain("g", [Layer(f"l{i}", (1e-3, 1e-4), (2e-3, 2e-4), 1e6, 1e6, 0.0) for i in range(2)])
    >>> cluster = Cluster("c", (Link(1e11, 1e-6, "a"), Link(1e11, 1e-6, "b")), Link(1e10, 1e-5),
    ...                   tuple(Device(f"{s}{k}", s, 1.0, 8e10) for s in "ab" for k in range(4)))
    >>> problem = PlanningProblem(graph, cluster, global_batch=8, microbatches=2, allow_recompute=False)
    >>> classes = device_classes(cluster)
    >>> types = stage_types(problem, classes, server_kinds(cluster, classes))
    >>> [(t.r_lo, t.r_hi, t.q, t.link) for t in types]
    [(1, 1, (4, 4), -2), (2, 3, (2, 2), 0), (2, 3, (2, 2), -1), (4, 4, (1, 1), 0), (4, 8, (1, 1), -1)]
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
