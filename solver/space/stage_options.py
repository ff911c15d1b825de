"""What a stage can run on: every composition of device classes, with and without recompute.

Each option carries what the lower bounds need from its devices wherever they are
placed: the smallest speed and memory, and bounds on its links (term 3 of
:mod:`pipeplan.solver.bounds.terms`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product
from typing import Sequence

import numpy as np

from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.space.device_classes import DeviceClass
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit


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



def link_extremes(cluster: Cluster) -> tuple[float, float]:
    links = list(cluster.servers) + [cluster.network]
    return max(link.bandwidth for link in links), min(link.latency for link in links)



class _ServerTable:
    """Per server, its link and how many devices of each class it holds (built once per cluster)."""

    def __init__(self, cluster: Cluster, classes: Sequence[DeviceClass]) -> None:
        self.links = list(cluster.servers)
        held = [dict(c.ids_by_server) for c in classes]
        self.counts = np.array([[len(h.get(s.id, ())) for h in held] for s in self.links], dtype=np.int64).reshape(len(self.links), len(classes))
        self.bandwidth = np.array([s.bandwidth for s in self.links], dtype=float)
        self.latency = np.array([s.latency for s in self.links], dtype=float)
        # per class, the best bandwidth of a server holding it (the network's where none is better)
        self.send = [max([cluster.network.bandwidth] + [s.bandwidth for s, n in zip(self.links, self.counts[:, c]) if n])
                     for c in range(len(classes))]


def _link_bounds(cluster: Cluster, classes: Sequence[DeviceClass], composition: Sequence[int],
                 table: "_ServerTable | None" = None) -> tuple[float, float, float]:
    """``(bw_ub, lat_lb, send_bw_ub)`` for a stage of this composition, wherever it is placed.

    ``bw(D)``/``lat(D)`` of the group: if all its devices share a server ``S`` they are
    ``S``'s link, which must hold the whole composition; otherwise some pair crosses
    servers, so ``bw(D) <= network bandwidth`` and ``lat(D) >= network latency``.
    ``send_bw_ub`` bounds ``bw(D, D')`` for any other group ``D'``: for a device ``x``
    of a class ``c`` in ``D``, every pair ``(x, y)`` is ``x``'s server link or the
    network, so it is at most the best of those over the servers holding class ``c``.
    """
    net = cluster.network
    table = table if table is not None else _ServerTable(cluster, classes)
    holding = np.all(table.counts >= np.asarray(composition, dtype=np.int64)[None, :], axis=1)
    bw_ub = max(net.bandwidth, float(table.bandwidth[holding].max(initial=-math.inf)))
    lat_lb = min(net.latency, float(table.latency[holding].min(initial=math.inf)))
    send = min(table.send[c] for c, n in enumerate(composition) if n)
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
    table = _ServerTable(cluster, classes)
    for count, composition in enumerate(product(*(range(c.count + 1) for c in classes))):
        if clock is not None and count % 256 == 255 and clock.expired():  # 1,024 devices: billions of compositions
            return None
        r = sum(composition)
        if not 1 <= r <= max_r:
            continue
        used = [c for c, n in zip(classes, composition) if n]
        bw_ub, lat_lb, send_bw = _link_bounds(cluster, classes, composition, table)
        ar = (2 * (r - 1) * lat_lb, 2 * (r - 1) / (r * bw_ub)) if r >= 2 else (0.0, 0.0)
        for rc in flags:
            options.append(Option(tuple(composition), rc, r, min(c.speed for c in used),
                                  min(c.memory for c in used), ar, send_bw))
    return tuple(options)
