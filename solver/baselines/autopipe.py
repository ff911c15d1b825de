"""``autopipe``: AutoPipe's balanced partition with its critical-stage search.

Source: AutoPipe (Liu et al., CLUSTER 2022) and its public partitioner
(``Merak/cpp/autopipe.cpp``, torchtitan ``experiments/autopartition``; ``papers.md``
§2.2).  It optimises the 1F1B iteration time: a min-max DP on per-block forward plus
backward cost gives a balanced seed; a simulator finds the *critical stage*; the search
then moves one block from the critical stage to its neighbours ("move one block to
front" / "to back") and keeps a move when the simulated time improves, with a visited
set, until no move helps.

Heterogeneous adaptation: a pure pipeline (as the partitioner) on the ``S`` fastest
devices; the DP divides each stage's work by its device's speed, and the exact
simulator of the spec replaces AutoPipe's fixed-``M = 2P`` 1F1B estimate.  The critical
stage is the one with the most busy time plus all-reduce.

Simpler than AutoPipe's search: a move shifts one layer to the neighbouring stage
without re-partitioning the stages before it (AutoPipe re-runs its DP on them), the
rebalancing of the stages after the critical one is not done, the search climbs from
strict improvements instead of exploring breadth-first, and devices are tried fastest
first only.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from pipeplan.solver.baselines.common import (Baseline, Bounds, Groups, Proposal, StageModel, bounds_from_cuts,
                                     finalize, rank_devices, split_groups)
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit, past


def balanced_cuts(work: Sequence[float], speeds: Sequence[float]) -> list[int]:
    """Min-max contiguous partition of ``work`` where stage ``s`` costs ``sum / speeds[s]``.

    ``dp[s][j] = min_i max(dp[s-1][i], (W[j] - W[i]) / speeds[s])``: AutoPipe's seed DP,
    with per-stage speeds for heterogeneous devices.

    Examples
    --------
    >>> balanced_cuts([1, 1, 1, 1], [1.0, 1.0])
    [0, 2, 4]
    >>> balanced_cuts([1, 1, 1, 1], [3.0, 1.0])
    [0, 3, 4]
    """
    n, parts = len(work), len(speeds)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} layers into {parts} non-empty stages")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(work, dtype=float))])
    dp = np.full((parts + 1, n + 1), np.inf)
    back = np.zeros((parts + 1, n + 1), dtype=int)
    dp[0, 0] = 0.0
    for s in range(1, parts + 1):
        for j in range(s, n + 1):
            i = np.arange(s - 1, j)
            cand = np.maximum(dp[s - 1, i], (prefix[j] - prefix[i]) / speeds[s - 1])
            k = int(np.argmin(cand))
            dp[s, j], back[s, j] = cand[k], i[k]
    cuts = [n]
    for s in range(parts, 0, -1):
        cuts.append(int(back[s, cuts[-1]]))
    return cuts[::-1]


def _moves(bounds: Bounds, critical: int) -> list[Bounds]:
    """Bounds with one block moved out of the critical stage, to the front or the back."""
    out = []
    lo, hi = bounds[critical]
    if hi - lo < 2:
        return out
    if critical > 0:   # move one block to the front: the critical stage gives its first layer away
        b = list(bounds)
        b[critical - 1], b[critical] = (b[critical - 1][0], lo + 1), (lo + 1, hi)
        out.append(tuple(b))
    if critical < len(bounds) - 1:   # move one block to the back
        b = list(bounds)
        b[critical], b[critical + 1] = (lo, hi - 1), (hi - 1, b[critical + 1][1])
        out.append(tuple(b))
    return out


def critical_search(problem: PlanningProblem, bounds: Bounds, groups: Groups, deadline: TimeLimit) -> Bounds:
    """AutoPipe's heuristic search from ``bounds``: the best bounds found by critical-stage moves."""
    judged = finalize(problem, bounds, groups)
    best_time = judged.result.iteration_time if judged else float("inf")
    best, frontier, visited = bounds, [bounds], {bounds}
    while frontier and not past(deadline):
        current = frontier.pop(0)
        j = finalize(problem, current, groups)
        if j is None:
            continue
        load = [b + c.allreduce for b, c in zip(j.result.busy, j.result.groups)]
        critical = max(range(len(load)), key=lambda s: (load[s], s))
        for nb in _moves(current, critical):
            if nb in visited:
                continue
            visited.add(nb)
            cand = finalize(problem, nb, groups)
            if cand is not None and cand.result.iteration_time < best_time - 1e-15:
                best, best_time = nb, cand.result.iteration_time
                frontier.append(nb)
    return best


class AutoPipe(Baseline):
    """Balanced min-max DP seed plus AutoPipe's critical-stage block moves."""

    name = "autopipe"
    source = "AutoPipe (CLUSTER'22), Merak autopipe.cpp: balanced DP + critical-stage search"

    def proposals(self, problem: PlanningProblem, deadline: TimeLimit, seed: int) -> Iterator[Proposal]:
        model = StageModel(problem)
        ranked = rank_devices(problem)
        speeds_all = [problem.cluster.device_index[d].speed for d in ranked]
        work = [model.compute(i, i + 1, ranked[:1]) * speeds_all[0] for i in range(len(problem.graph))]
        for stages in range(1, problem.stage_limit + 1):
            groups = split_groups(ranked, [1] * stages)
            seed_bounds = bounds_from_cuts(balanced_cuts(work, speeds_all[:stages]))
            yield seed_bounds, groups
            if not past(deadline):
                yield critical_search(problem, seed_bounds, groups, deadline), groups
