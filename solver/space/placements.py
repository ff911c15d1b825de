"""Concrete device ids for a configuration, up to server symmetry, and a plan's configuration back."""

from __future__ import annotations

from itertools import product
from typing import Iterator, Sequence

from pipeplan.solver.space.arcs import ExactData
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.space.device_classes import DeviceClass
from pipeplan.solver.formats.plan import Plan


PLACEMENT_LIMIT = 64
"""Most placements simulated per configuration before falling back to the pool bound."""


def _server_signature(cluster: Cluster, classes: Sequence[DeviceClass]) -> dict[str, tuple]:
    """Servers with the same link and the same devices per class are interchangeable."""
    links = {s.id: (s.bandwidth, s.latency) for s in cluster.servers}
    counts = {s: tuple(len(dict(c.ids_by_server).get(s, ())) for c in classes) for s in links}
    return {s: (links[s], counts[s]) for s in links}



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
