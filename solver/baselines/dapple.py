"""``dapple``: DAPPLE's planner DP with its three device-placement policies.

Source: DAPPLE (Fan et al., PPoPP 2021), planner ``HPGO`` ``orchestrate.rs``
(``papers.md`` §5.1).  Its DP over (layers, GPUs used, occupancy) minimises the pipeline's
"block time": ``max(A[k][m - m'], compute(k+1..j) / m', transfer(2 * act_k))``; the GPUs
of each new stage come from a placement policy: **FreshFirst** (prefer an unused
server), **AppendFirst** (fill the partly used server first) or **ScatterFirst**
(round-robin over servers).

Heterogeneous adaptation: each policy visits servers fastest-first and takes a server's
fastest free devices first; a stage's compute uses its slowest replica's speed, its
all-reduce the spec's ring formula and its transfers the real links.

Simpler than DAPPLE's planner (HPGO ``orchestrate.rs``), in three ways: one placement
policy serves the whole pipeline (DAPPLE tries all three for every new stage), each DP
state keeps one best predecessor and the occupancy it implies (DAPPLE keeps an entry per
occupied-device set), and entries are ranked by block time (DAPPLE by its pipeline
length estimate); DAPPLE's replication of the whole pipeline is not searched.  Every
policy and device count gives one plan; the simulator picks among them.
"""

from __future__ import annotations

from typing import Callable, Iterator

from pipeplan.solver.baselines.common import Baseline, Proposal, StageModel
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit, past

Policy = Callable[[list[list[str]], frozenset[str], int], "list[str] | None"]


def _servers(problem: PlanningProblem) -> list[list[str]]:
    """Each server's devices fastest first; servers ordered by their fastest device."""
    by_server: dict[str, list[str]] = {}
    for d in problem.cluster.devices:
        by_server.setdefault(d.server, []).append(d.id)
    index = problem.cluster.device_index
    servers = [sorted(ds, key=lambda d: (-index[d].speed, -index[d].memory)) for ds in by_server.values()]
    return sorted(servers, key=lambda ds: (-index[ds[0]].speed, -index[ds[0]].memory))


def _take(order: list[list[str]], used: frozenset[str], count: int) -> list[str] | None:
    picked = [d for server in order for d in server if d not in used][:count]
    return picked if len(picked) == count else None


def fresh_first(servers: list[list[str]], used: frozenset[str], count: int) -> list[str] | None:
    """FreshFirst: devices of untouched servers first, then of partly used ones.

    Examples
    --------
    >>> fresh_first([["a", "b"], ["c", "d"]], frozenset({"a"}), 1)
    ['c']
    """
    fresh = [s for s in servers if not used.intersection(s)]
    return _take(fresh + [s for s in servers if s not in fresh], used, count)


def append_first(servers: list[list[str]], used: frozenset[str], count: int) -> list[str] | None:
    """AppendFirst: free devices of partly used servers first, then fresh servers.

    Examples
    --------
    >>> append_first([["a", "b"], ["c", "d"]], frozenset({"a"}), 1)
    ['b']
    """
    partly = [s for s in servers if used.intersection(s)]
    return _take(partly + [s for s in servers if s not in partly], used, count)


def scatter_first(servers: list[list[str]], used: frozenset[str], count: int) -> list[str] | None:
    """ScatterFirst: one free device from each server in turn.

    Examples
    --------
    >>> scatter_first([["a", "b"], ["c", "d"]], frozenset(), 2)
    ['a', 'c']
    """
    free = [[d for d in s if d not in used] for s in servers]
    picked: list[str] = []
    while len(picked) < count and any(free):
        for s in free:
            if s and len(picked) < count:
                picked.append(s.pop(0))
    return picked if len(picked) == count else None


POLICIES: dict[str, Policy] = {"fresh-first": fresh_first, "append-first": append_first,
                               "scatter-first": scatter_first}
"""DAPPLE's device-allocation strategies by name."""


def dapple_dp(problem: PlanningProblem, policy: Policy, deadline: TimeLimit) -> list[tuple[float, Proposal]]:
    """DAPPLE's DP under one placement policy: ``(block time, proposal)`` per device count.

    ``best[(k, j, m)]`` holds ``(block time, occupancy, previous key, group)`` for the
    first ``j`` layers on ``m`` devices (``k`` stages when ``max_stages`` binds, else 0).
    """
    model = StageModel(problem)
    servers = _servers(problem)
    L, D = len(problem.graph), len(problem.cluster.devices)
    counting = problem.stage_limit < min(L, D)
    ks = range(1, problem.stage_limit + 1) if counting else [0]
    best: dict[tuple[int, int, int], tuple[float, frozenset[str], tuple | None, tuple[str, ...]]] = {
        (0, 0, 0): (0.0, frozenset(), None, ())}
    for j in range(1, L + 1):
        if past(deadline):
            return []
        for m in range(1, D + 1):
            for mp in (range(1, m + 1) if problem.allow_replication else [1]):
                if past(deadline):  # thousands of devices: one row takes minutes
                    return []
                for i in range(j):
                    for k in ks:
                        prev_key = (k - 1 if counting else 0, i, m - mp)
                        prev = best.get(prev_key)
                        if prev is None:
                            continue
                        group = policy(servers, prev[1], mp)
                        if group is None or not model.may_fit(i, j, group):
                            continue
                        block = model.compute(i, j, group) + model.allreduce(i, j, group)
                        if i > 0:
                            block = max(block, 2 * model.transfer(i - 1, prev[3], group))
                        value = max(prev[0], block)
                        key = (k, j, m)
                        if key not in best or value < best[key][0]:
                            best[key] = (value, prev[1] | set(group), prev_key, tuple(group))
    out = []
    for (k, j, m), entry in best.items():
        if j == L and m > 0:
            out.append((entry[0], _rebuild(best, (k, j, m))))
    out.sort(key=lambda x: x[0])
    return out


def _rebuild(best: dict, key: tuple[int, int, int]) -> Proposal:
    bounds, groups = [], []
    while best[key][2] is not None:
        _, _, prev_key, group = best[key]
        bounds.append((prev_key[1], key[1]))
        groups.append(group)
        key = prev_key
    return tuple(bounds[::-1]), tuple(groups[::-1])


class Dapple(Baseline):
    """DAPPLE's DP under FreshFirst, AppendFirst and ScatterFirst placement."""

    name = "dapple"
    source = "DAPPLE (PPoPP'21) HPGO planner: block-time DP with Fresh/Append/Scatter-First placement"

    def proposals(self, problem: PlanningProblem, deadline: TimeLimit, seed: int) -> Iterator[Proposal]:
        for policy in POLICIES.values():
            for _, proposal in dapple_dp(problem, policy, deadline):
                yield proposal
