"""``deepspeed-uniform`` and ``deepspeed-parameters``: DeepSpeed ``PipelineModule``.

Source: DeepSpeed ``deepspeed/runtime/pipe/module.py`` and ``runtime/utils.py``
(``peers.md`` §1.3).  ``partition_method="uniform"`` spreads layer counts
(``partition_uniform``); ``"parameters"`` (DeepSpeed's default) weights each layer by
its parameter count and calls ``partition_balanced``, a DP for the linear partition
problem that minimises ``max - min`` part weight.  Neither knows compute time or memory.

Heterogeneous adaptation: DeepSpeed runs a PP x DP grid with the pipe axis outermost,
so stage ``s`` gets ``r`` consecutive ranks.  We take ranks from the fastest devices
(:func:`~pipeplan.solver.baselines.common.rank_devices`) and try, for every stage count ``S``,
``r = 1`` and (with replication allowed) ``r = D // S``, the largest grid that fits.

Version-2 schedules (:mod:`pipeplan.solver.baselines.interleaved`): the same partition
method over the ``S`` virtual stages, on ``R`` ranks of ``r = 1`` or ``D // R`` devices.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from pipeplan.solver.baselines.common import Baseline, Bounds, Groups, Proposal, bounds_from_cuts, rank_devices, split_groups
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_uniform``: equal counts, the remainder on the first parts.

    Examples
    --------
    >>> partition_uniform(10, 4)
    [0, 3, 6, 8, 10]
    """
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    parts = np.arange(0, (num_parts + 1) * chunk, chunk)
    for i in range(residual):
        parts[i + 1:] += 1
    return parts.tolist()


def partition_balanced(weights: Sequence[float], num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_balanced``: the DP minimising ``max - min`` part weight.

    ``dp[i, j]`` is the best ``(max - min)`` over splits of the first ``i`` items into
    ``j`` parts, carrying that split's max and min part weight (a heuristic DP, as in
    DeepSpeed: the max/min of the best prefix is not always the best to extend).

    Parameters
    ----------
    weights : sequence of float
        Per-item weights (parameter counts for ``partition_method="parameters"``).
    num_parts : int
        Number of parts.

    Returns
    -------
    list of int
        ``num_parts + 1`` cut positions from 0 to ``len(weights)``.

    Examples
    --------
    >>> partition_balanced([4, 1, 1, 1, 1], 2)
    [0, 1, 5]
    """
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(weights, dtype=float))])
    dp_max = np.full((n + 1, m + 1), np.inf)
    dp_min = np.full((n + 1, m + 1), np.inf)
    dp_cost = np.full((n + 1, m + 1), np.inf)
    position = np.zeros((n + 1, m + 1), dtype=int)
    dp_max[0, 0] = dp_cost[0, 0] = 0.0
    for i in range(1, n + 1):
        ks = np.arange(i)
        part = prefix[i] - prefix[ks]
        for j in range(1, min(i, m) + 1):
            hi = np.maximum(dp_max[ks, j - 1], part)
            lo = np.minimum(dp_min[ks, j - 1], part)
            cost = np.where(np.isfinite(dp_cost[ks, j - 1]), hi - lo, np.inf)
            # DeepSpeed keeps the last k reaching the minimum (``>=``): take the last argmin.
            k = int(len(cost) - 1 - np.argmin(cost[::-1]))
            if np.isfinite(cost[k]):
                dp_cost[i, j], dp_max[i, j], dp_min[i, j], position[i, j] = cost[k], hi[k], lo[k], k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(int(position[parts[-1], j]))
    return parts[::-1]


class _DeepSpeed(Baseline):
    """Shared PP x DP grid of both DeepSpeed partition methods."""

    def cuts(self, problem: PlanningProblem, stages: int) -> list[int]:
        raise NotImplementedError

    def v2_bounds(self, problem: PlanningProblem, stages: int) -> Bounds | None:
        cuts = self.cuts(problem, stages)
        return bounds_from_cuts(cuts) if all(a < b for a, b in zip(cuts, cuts[1:])) else None

    def v2_groupings(self, problem: PlanningProblem, groups: int) -> Iterator[Groups]:
        ranked = rank_devices(problem)
        widths = {1, len(ranked) // groups} if problem.allow_replication else {1}
        for r in sorted(widths):
            yield split_groups(ranked, [r] * groups)

    def proposals(self, problem: PlanningProblem, deadline: TimeLimit, seed: int) -> Iterator[Proposal]:
        ranked = rank_devices(problem)
        for stages in range(1, problem.stage_limit + 1):
            bounds = bounds_from_cuts(self.cuts(problem, stages))
            replicas = {1}
            if problem.allow_replication:
                replicas.add(len(ranked) // stages)
            for r in sorted(replicas):
                yield bounds, split_groups(ranked, [r] * stages)


class DeepSpeedUniform(_DeepSpeed):
    """DeepSpeed ``partition_method="uniform"``: equal layer counts."""

    name = "deepspeed-uniform"
    source = "DeepSpeed PipelineModule partition_method='uniform' (partition_uniform)"

    def cuts(self, problem: PlanningProblem, stages: int) -> list[int]:
        return partition_uniform(len(problem.graph), stages)


class DeepSpeedParameters(_DeepSpeed):
    """DeepSpeed ``partition_method="parameters"``: balanced parameter bytes."""

    name = "deepspeed-parameters"
    source = "DeepSpeed PipelineModule partition_method='parameters' (partition_balanced on params)"

    def cuts(self, problem: PlanningProblem, stages: int) -> list[int]:
        return partition_balanced([layer.params for layer in problem.graph.layers], stages)
