"""``greedy-speed``: give faster devices heavier stages, in one greedy sweep.

Source: no single paper; the common practice of splitting work in proportion to device
throughput on heterogeneous clusters (not UMPIPE's "local greedy", which chooses
microbatch sizes and is ``umpipe-local``).  It optimises per-stage compute balance only: stage ``s`` runs on
device ``d_s`` and receives layers until its share of the total work reaches
``speed(d_s) / sum of speeds``, so every stage needs about the same time.

Heterogeneous by design: for each stage count ``S`` it takes the ``S`` fastest devices,
orders them server by server (so consecutive stages share fast links) and sweeps the
layers once.  No replication.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from pipeplan.solver.baselines.common import Baseline, Proposal, StageModel, bounds_from_cuts, rank_devices
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit


def proportional_cuts(work: Sequence[float], speeds: Sequence[float]) -> list[int]:
    """Cut ``work`` (per layer) into ``len(speeds)`` non-empty parts sized like ``speeds``.

    Stage ``s`` ends at the first layer where the cumulative work reaches the cumulative
    speed share, leaving at least one layer for each later stage.

    Examples
    --------
    >>> proportional_cuts([1, 1, 1, 1, 1, 1], [2.0, 1.0])
    [0, 4, 6]
    >>> proportional_cuts([1, 1, 1, 1], [1.0, 1.0, 1.0, 1.0])
    [0, 1, 2, 3, 4]
    """
    n, parts = len(work), len(speeds)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} layers into {parts} non-empty stages")
    cum = np.cumsum(np.asarray(work, dtype=float))
    targets = np.cumsum(np.asarray(speeds, dtype=float)) / float(np.sum(speeds)) * cum[-1]
    cuts = [0]
    for s in range(parts - 1):
        # Smallest end index whose prefix reaches the target (with float slack).
        end = int(np.searchsorted(cum, targets[s] * (1 - 1e-12), side="left")) + 1
        end = min(max(end, cuts[-1] + 1), n - (parts - 1 - s))
        cuts.append(end)
    cuts.append(n)
    return cuts


class GreedySpeed(Baseline):
    """Greedy: heavier stages on faster devices, proportional to speed."""

    name = "greedy-speed"
    source = "greedy heterogeneous split: each stage's work proportional to its device's speed"

    def proposals(self, problem: PlanningProblem, deadline: TimeLimit, seed: int) -> Iterator[Proposal]:
        model = StageModel(problem)
        ranked = rank_devices(problem)
        index = problem.cluster.device_index
        server_rank = {s.id: i for i, s in enumerate(problem.cluster.servers)}
        work = [model.compute(i, i + 1, ranked[:1]) for i in range(len(problem.graph))]
        for stages in range(1, problem.stage_limit + 1):
            chosen = sorted(ranked[:stages], key=lambda d: (server_rank.get(index[d].server, 0), -index[d].speed))
            speeds = [index[d].speed for d in chosen]
            groups = tuple((d,) for d in chosen)
            yield bounds_from_cuts(proportional_cuts(work, speeds)), groups
            yield bounds_from_cuts(proportional_cuts(work, speeds[::-1])), groups[::-1]
