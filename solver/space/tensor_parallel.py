"""Tensor-parallel degrees and ZeRO levels as planning decisions: the degree-``t`` problem and back.

A plan whose stages all have degree ``t`` (docs/model.md 8.2) is a plan of another
problem: each *replica* of ``t`` devices of one server is one device, and each layer
costs what one device of a degree-``t`` replica costs (8.3, 8.4).  :func:`replica_cluster`
and :func:`degree_graph` build that problem, any solver plans it, and :func:`expand_plan`
writes its plan back as a ``pipeplan.plan/3`` plan of the real cluster, which the exact
simulator times.  :func:`resplit` gives one device group another degree (the per-stage
moves), :func:`with_zero` sets the ZeRO levels.

The degree-``t`` graph folds each layer's collectives into its times at the speed of the
server that makes them longest relative to its devices, so a search over it never sees a
collective cheaper than on any server (docs/solvers.md, "Tensor parallelism and ZeRO").

Examples
--------
>>> from pipeplan.models.graph import load_graph
>>> from pipeplan.solver.formats.cluster import load_cluster
>>> cluster = load_cluster("examples/tp.cluster.json")
>>> layout = replica_cluster(cluster, 2)
>>> [d.id for d in layout.cluster.devices], layout.replicas["g2"]
(['g0', 'g2'], ('g2', 'g3'))
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Sequence

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device
from pipeplan.solver.formats.plan import Plan, Stage


@dataclass(frozen=True)
class ReplicaLayout:
    """The degree-``t`` cluster: each replica of ``t`` devices of one server as one device."""

    degree: int
    """``t``."""
    cluster: Cluster
    """One device per replica, named after the replica's first device, with its server, its smallest speed
    and its smallest memory; the real cluster's name, servers and network."""
    replicas: dict[str, tuple[str, ...]]
    """Replica device id -> the ``t`` real devices it stands for, in order."""


def replica_cluster(cluster: Cluster, t: int) -> ReplicaLayout | None:
    """The real cluster with each server's devices cut into replicas of ``t`` (``None`` when no server has ``t``).

    Within a server the devices are taken fastest first (then by memory, then in file order),
    so a replica joins devices as alike as the server has; ``n mod t`` devices of a server
    of ``n`` are left out (no degree-``t`` replica can use them).
    """
    if t == 1:  # every device a replica: the cluster itself
        return ReplicaLayout(1, cluster, {d.id: (d.id,) for d in cluster.devices})
    by_server: dict[str, list[Device]] = defaultdict(list)
    for d in cluster.devices:
        by_server[d.server].append(d)
    devices, replicas = [], {}
    order = {d.id: i for i, d in enumerate(cluster.devices)}
    for server, here in by_server.items():
        ranked = sorted(here, key=lambda d: (-d.speed, -d.memory, order[d.id]))
        for j in range(len(ranked) // t):
            group = ranked[j * t:(j + 1) * t]
            first = min(group, key=lambda d: order[d.id])
            devices.append(Device(first.id, server, min(d.speed for d in group), min(d.memory for d in group)))
            replicas[first.id] = tuple(sorted((d.id for d in group), key=order.__getitem__))
    if not devices:
        return None
    devices.sort(key=lambda d: order[d.id])
    return ReplicaLayout(t, replace(cluster, devices=tuple(devices)), replicas)


def collective_terms(layout: ReplicaLayout, optimistic: bool = False) -> tuple[float, float]:
    """``(k_lat, k_byte)``: a collective of ``x`` bytes costs ``(k_lat + k_byte * x) / v`` reference seconds on a
    device of speed ``v`` in the degree-``t`` graph.

    A ring all-reduce among a replica's ``t`` devices takes ``2(t-1)(lat + x / (t bw))``
    seconds on its server's link (docs/model.md 8.3), whatever the devices' speed; times in
    a graph are divided by the speed.  Each term is the largest over the servers of that
    cost times the speed of their replicas, so on every server the folded time is at least
    the real one (a search never favours a degree for collectives cheaper than they are).
    ``optimistic`` takes the smallest instead, so that on every server the folded time is
    at most the real one (a relaxation, for lower bounds).
    """
    t, cluster = layout.degree, layout.cluster
    if t == 1:
        return 0.0, 0.0
    links = {s.id: s for s in cluster.servers}
    pick = min if optimistic else max
    lat = [2 * (t - 1) * links[d.server].latency * d.speed for d in cluster.devices]
    byte = [2 * (t - 1) / (t * links[d.server].bandwidth) * d.speed for d in cluster.devices]
    return pick(lat), pick(byte)


def homogeneous_servers(cluster: Cluster) -> bool:
    """Whether every server's devices have one speed and one memory (then any ``t`` of a server's devices make
    the same replica, and :func:`replica_cluster`'s replicas stand for every choice)."""
    seen: dict[str, tuple[float, float]] = {}
    return all(seen.setdefault(d.server, (d.speed, d.memory)) == (d.speed, d.memory) for d in cluster.devices)


def degree_layer(layer: Layer, t: int, k_lat: float, k_byte: float, step_share: float = 1.0) -> Layer:
    """What one device of a degree-``t`` replica runs and holds of ``layer``, as a version-2 layer.

    Times scale by ``tau`` and gain the folded collectives (:func:`collective_terms`: the
    forward's in ``fwd``, the backward's in the input-gradient half, so ``bwd_w`` is written
    out); ``params`` and the step scale by ``pi`` (the step also by ``step_share``),
    ``act`` and ``act_w`` by ``alpha``; ``out`` stays whole (every device of a replica
    holds its output).
    """
    tau, pi, alpha = layer.tp_factors(t)
    c_f, c_b = layer.tp_bytes if t > 1 else (0.0, 0.0)
    a_w, b_w = layer.weight_bwd
    fwd = (layer.fwd[0] * tau + (k_lat if c_f > 0 else 0.0), layer.fwd[1] * tau + k_byte * c_f)
    bwd = (layer.bwd[0] * tau + (k_lat if c_b > 0 else 0.0), layer.bwd[1] * tau + k_byte * c_b)
    return Layer(layer.name, fwd, bwd, layer.params * pi, layer.act * alpha, layer.out, tied_to=layer.tied_to,
                 bwd_w=(a_w * tau, b_w * tau), act_w=layer.act_weight * alpha,
                 step=layer.step_time * pi * step_share)


def degree_graph(graph: LayerGraph, layout: ReplicaLayout, step_share: float = 1.0,
                 optimistic: bool = False) -> LayerGraph:
    """``graph`` as one device of a degree-``t`` replica of ``layout`` runs it (:func:`degree_layer`), same name
    and edges; ``optimistic`` folds the collectives as :func:`collective_terms` does for lower bounds."""
    k_lat, k_byte = collective_terms(layout, optimistic)
    layers = [degree_layer(layer, layout.degree, k_lat, k_byte, step_share) for layer in graph.layers]
    return LayerGraph(graph.name, layers, list(graph.edges) if graph.explicit_edges else None,
                      graph.input_bytes, graph.extra)


def paired_layout(cluster: Cluster, t: int) -> ReplicaLayout | None:
    """Degree ``t`` with each unit two replicas of ``t`` devices of one server (``None`` when no server has ``2t``).

    A plan of it maps back to stages of an even number of replicas (:func:`expand_plan`),
    so a state hint for two replicas or more holds for every stage of its plans.
    """
    layout = replica_cluster(cluster, 2 * t)
    return None if layout is None else replace(layout, degree=t)


def paired_graph(graph: LayerGraph) -> LayerGraph:
    """``graph`` as a unit of two replicas runs it: every per-sample term halved (each replica takes half of a
    microbatch), per-call terms and parameters kept."""
    def half(layer: Layer) -> Layer:
        a_w, b_w = layer.weight_bwd
        return replace(layer, fwd=(layer.fwd[0], layer.fwd[1] / 2), bwd=(layer.bwd[0], layer.bwd[1] / 2),
                       bwd_w=(a_w, b_w / 2), act=layer.act / 2, act_w=layer.act_weight / 2, out=layer.out / 2)

    return LayerGraph(graph.name, [half(layer) for layer in graph.layers],
                      list(graph.edges) if graph.explicit_edges else None, graph.input_bytes / 2, graph.extra)


def expand_plan(plan: Plan, layout: ReplicaLayout) -> Plan:
    """A plan of the degree-``t`` problem as a plan of the real cluster: each replica device becomes its ``t``
    devices, every stage gets ``tensor_parallel = t``.

    Examples
    --------
    >>> from pipeplan.solver.formats.cluster import load_cluster
    >>> layout = replica_cluster(load_cluster("examples/tp.cluster.json"), 2)
    >>> small = Plan("g", "c", 4, 4.0, "gpipe", (Stage((0, 2), ("g0", "g2"), (2, 2)),))
    >>> expand_plan(small, layout).stages[0].devices
    ('g0', 'g1', 'g2', 'g3')
    """
    t = layout.degree
    if all(len(devices) == 1 for devices in layout.replicas.values()):
        return plan
    stages = tuple(replace(st, devices=tuple(d for r in st.devices for d in layout.replicas[r]), tensor_parallel=t)
                   for st in plan.stages)
    return replace(plan, stages=stages)


def resplit(cluster: Cluster, devices: Sequence[str], t: int) -> tuple[str, ...] | None:
    """``devices`` (a device group) cut into replicas of ``t`` devices of one server, replica by replica, or
    ``None`` when some server's share of the group is not a multiple of ``t``.

    Within a server the devices keep their order in ``devices``; servers come in the order
    they first appear.
    """
    by_server: dict[str, list[str]] = {}
    for d in devices:
        by_server.setdefault(cluster.device_index[d].server, []).append(d)
    if any(len(here) % t for here in by_server.values()):
        return None
    return tuple(d for here in by_server.values() for d in here)


def with_degree(plan: Plan, cluster: Cluster, group: int, t: int) -> Plan | None:
    """``plan`` with every stage of device group ``group`` at degree ``t`` (its devices re-split into replicas of
    ``t``, :func:`resplit`), or ``None`` where the group's devices cannot form such replicas."""
    owners = plan.stage_groups
    devices = plan.groups[group]
    made = resplit(cluster, devices, t)
    if made is None:
        return None
    stages = tuple(replace(st, devices=made, tensor_parallel=t) if owners[s] == group else st
                   for s, st in enumerate(plan.stages))
    return replace(plan, stages=stages)


def with_zero(plan: Plan, levels: Sequence[int]) -> Plan:
    """``plan`` with stage ``s`` at ZeRO level ``levels[s]`` (written per stage; the plan's own level 0).

    A single level shared by every stage is written once, as the plan's ``zero``.
    """
    if len(set(levels)) == 1:
        return replace(plan, zero=levels[0], stages=tuple(replace(st, zero=None) for st in plan.stages))
    return replace(plan, zero=0, stages=tuple(replace(st, zero=z or None) for st, z in zip(plan.stages, levels)))

