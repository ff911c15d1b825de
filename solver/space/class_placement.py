"""Plans from class-level configurations: :func:`place` gives each stage devices, :func:`split_layers`
balances the layers of stages whose types are known.

A configuration names, per stage, a layer range and a
:class:`pipeplan.solver.space.class_stages.StageType` (slowest class, replicas, link,
recompute).  :func:`place` gives the stages held by one server a server of their kind
(first fit, largest stages first), the single-device and spread stages devices of their
class first and of faster classes after; a stage whose slowest class it cannot honour is
reported by ``None``.  The plan it returns is judged by the simulator like any other.
"""

from __future__ import annotations

import math
from typing import Sequence

from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.space.class_stages import SINGLE, SPREAD, ServerKind, StageType
from pipeplan.solver.space.device_classes import DeviceClass


def place(problem: PlanningProblem, classes: tuple[DeviceClass, ...], kinds: tuple[ServerKind, ...],
          stages: Sequence[tuple[int, int, StageType]]) -> Plan | None:
    """A plan with these ``(lo, hi, type)`` stages (pipeline order), ``r_lo`` replicas each, or ``None``.

    Stages held by one server take a server of their kind, largest first (first fit
    decreasing); single-device and spread stages, fastest class first, take devices of
    their own class, then of faster classes, from the servers with the most free devices
    of that class first (a spread stage then spans few servers).

    Parameters
    ----------
    problem : PlanningProblem
    classes : tuple of DeviceClass
        :func:`pipeplan.solver.space.device_classes.device_classes` of the problem's cluster.
    kinds : tuple of ServerKind
        :func:`pipeplan.solver.space.class_stages.server_kinds` of the same cluster and classes.
    stages : sequence of (int, int, StageType)
        Layer range ``[lo, hi)`` and type of each stage, covering the layers in order.

    Returns
    -------
    Plan or None
        ``None`` when the devices do not suffice: the model's device rows are necessary,
        not sufficient, for a packing.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> graph = LayerGraph.chain("g", [Layer(f"l{i}", (1e-3, 1e-4), (2e-3, 2e-4), 1e6, 1e6, 0.0) for i in range(2)])
    >>> cluster = Cluster("c", (Link(1e11, 1e-6, "a"), Link(1e11, 1e-6, "b")), Link(1e10, 1e-5),
    ...                   tuple(Device(f"{s}{k}", s, 1.0, 8e10) for s in "ab" for k in range(4)))
    >>> problem = PlanningProblem(graph, cluster, global_batch=8, microbatches=2, allow_recompute=False)
    >>> from pipeplan.solver.space.class_stages import server_kinds, stage_types
    >>> from pipeplan.solver.space.device_classes import device_classes
    >>> classes = device_classes(cluster)
    >>> kinds = server_kinds(cluster, classes)
    >>> one_server = next(t for t in stage_types(problem, classes, kinds) if t.link == 0 and t.r_lo == 4)
    >>> plan = place(problem, classes, kinds, [(0, 1, one_server), (1, 2, one_server)])
    >>> [sorted({d[0] for d in st.devices}) for st in plan.stages]
    [['a'], ['b']]
    """
    index = {(c.speed, c.memory): i for i, c in enumerate(classes)}
    free: dict[str, dict[int, list[str]]] = {}
    for d in problem.cluster.devices:
        free.setdefault(d.server, {}).setdefault(index[(d.speed, d.memory)], []).append(d.id)
    server_kind = {sid: j for j, kind in enumerate(kinds) for sid in kind.servers}
    speed = [c.speed for c in classes]
    groups: dict[int, list[str]] = {}

    def adequate(t: StageType) -> list[int]:
        """Classes a stage of type ``t`` may use, its own first, then faster ones slowest first."""
        return sorted((c for c in range(len(classes)) if speed[c] >= speed[t.cls]),
                      key=lambda c: (c != t.cls, speed[c]))

    def take_from(server: str, t: StageType, count: int, need_own: bool) -> list[str] | None:
        pool = free.get(server, {})
        order = adequate(t)
        if need_own and not pool.get(t.cls):
            return None
        if sum(len(pool.get(c, [])) for c in order) < count:
            return None
        out: list[str] = []
        for c in order:
            while pool.get(c) and len(out) < count:
                out.append(pool[c].pop())
        return out

    # one-server stages, largest first (first fit decreasing), on servers of their kind
    on_server = sorted((s for s, (_, _, t) in enumerate(stages) if t.link >= 0),
                       key=lambda s: (-stages[s][2].r_lo, speed[stages[s][2].cls]))
    for s in on_server:
        t = stages[s][2]
        for sid in kinds[t.link].servers:
            got = take_from(sid, t, t.r_lo, True)
            if got is not None:
                groups[s] = got
                break
        else:
            return None
    # single-device and spread stages: their class first, whole servers first, then faster classes
    rest = sorted((s for s, (_, _, t) in enumerate(stages) if t.link in (SINGLE, SPREAD)),
                  key=lambda s: -speed[stages[s][2].cls])
    for s in rest:
        t = stages[s][2]
        got: list[str] = []
        servers_used: set[str] = set()
        for c in adequate(t):
            # servers with the most free devices of this class first, so a spread stage spans few servers
            holders = sorted((sid for sid in free if free[sid].get(c)), key=lambda sid: (-len(free[sid][c]), sid))
            for sid in holders:
                while free[sid][c] and len(got) < t.r_lo:
                    got.append(free[sid][c].pop())
                    servers_used.add(sid)
                if len(got) >= t.r_lo:
                    break
            if len(got) >= t.r_lo:
                break
        if len(got) < t.r_lo:
            return None
        groups[s] = got
    del server_kind
    bounds = [(lo, hi) for lo, hi, _ in stages]
    return problem.make_plan(bounds, [sorted(groups[s]) for s in range(len(stages))],
                             [t.recompute for _, _, t in stages])


def split_layers(problem: PlanningProblem, classes: tuple[DeviceClass, ...], kinds: tuple[ServerKind, ...],
                 types: Sequence[StageType], lo: int, hi: int) -> list[tuple[int, int]] | None:
    """Boundaries for stages of ``types`` (in order) over layers ``[lo, hi)`` that minimise the largest
    ``busy + AR`` of a stage.

    A DP over the layers, ``O(len(types) (hi - lo)^2)``; each stage has ``r_lo`` replicas of
    its type, its class's speed, and the all-reduce of its type's link.

    Returns
    -------
    list of (int, int) or None
        One ``(lo, hi)`` per type, in order; ``None`` when there are fewer layers than
        stages (``[]`` for no types over no layers).
    """
    count = len(types)
    if count == 0:
        return [] if lo == hi else None
    if hi - lo < count:
        return None
    graph = problem.graph
    sizes = problem.split
    cost_cache: dict[tuple[int, int, int], float] = {}

    def cost(j: int, a: int, b: int) -> float:
        key = (j, a, b)
        if key not in cost_cache:
            t = types[j]
            af, bf, ab, bb = graph.range_time(a, b)
            v = classes[t.cls].speed
            busy = 0.0
            for n in sizes:
                q = -(-n // t.r_lo)
                f = (af + bf * q) / v
                busy += f + (ab + bb * q) / v + (f if t.recompute else 0.0)
            params = graph.range_sum("params", a, b)
            r = t.r_lo
            if r > 1 and params > 0:
                link = problem.cluster.network if t.link < 0 else kinds[t.link].link
                busy += 2 * (r - 1) * (link.latency + params / (r * link.bandwidth))
            cost_cache[key] = busy
        return cost_cache[key]

    # best[j][x]: the smallest max cost placing stages 0..j-1 on [lo, x)
    best = [[math.inf] * (hi + 1) for _ in range(count + 1)]
    cut = [[-1] * (hi + 1) for _ in range(count + 1)]
    best[0][lo] = 0.0
    for j in range(count):
        for x in range(lo + j, hi - (count - j) + 1):
            if not math.isfinite(best[j][x]):
                continue
            for y in range(x + 1, hi - (count - j - 1) + 1):
                value = max(best[j][x], cost(j, x, y))
                if value < best[j + 1][y]:
                    best[j + 1][y] = value
                    cut[j + 1][y] = x
    if not math.isfinite(best[count][hi]):
        return None
    out, y = [], hi
    for j in range(count, 0, -1):
        x = cut[j][y]
        out.append((x, y))
        y = x
    return list(reversed(out))
