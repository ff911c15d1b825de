"""``pipedream``: PipeDream's partitioning DP with per-stage replication.

Source: PipeDream (Narayanan et al., SOSP 2019), ``optimizer_graph_hierarchical.py``
(``papers.md`` §5.3, ``peers.md`` §1.1).  It minimises the slowest stage of the
pipeline (steady-state throughput):

``A(j, m) = min_{i<j, m'<=m} max(A(i, m-m'), 2*C_i, T(i+1..j, m'))``

where ``T`` is a stage's compute time on ``m'`` replicas plus its weight
synchronisation and ``C_i`` the activation transfer across the cut.

Heterogeneous adaptation: the ``m`` devices of ``A(j, m)`` are the first ``m`` of
:func:`~pipeplan.solver.baselines.common.rank_devices` (fastest first) and a stage with ``m'``
replicas gets the next ``m'`` of them, so ``T`` uses their real (slowest) speed, the
spec's ring all-reduce and the real link of the cut, instead of PipeDream's per-level
homogeneous machines.  Stages that cannot fit even with one microbatch in flight are
excluded (PipeDream's optional memory check, made exact for the state).  Every device
count ``m`` gives one plan; the simulator picks among them.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from pipeplan.solver.baselines.common import Baseline, Proposal, StageModel, rank_devices
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit, past


class _Vectors:
    """Per-stage quantities for every start layer ``i < j`` at once (numpy)."""

    def __init__(self, problem: PlanningProblem, model: StageModel) -> None:
        self.problem, self.model = problem, model
        p = model.prefix
        self.fb_fixed = p[:, 0] + p[:, 2]          # a_f + a_b prefix
        self.fb_sample = p[:, 1] + p[:, 3]         # b_f + b_b prefix
        self.params, self.act = p[:, 4], p[:, 5]
        g = problem.graph
        self.cut = np.array([0.0] + [g.cut_bytes(c) for c in range(len(g) - 1)])  # cut[i] = before layer i

    def stage(self, j: int, group: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(time, fits)`` of stages ``[i, j)`` on ``group`` for ``i = 0 .. j-1``."""
        pr, c = self.problem, self.problem.cluster
        r = len(group)
        speed = min(c.device_index[d].speed for d in group)
        qs = [math.ceil(n / r) for n in pr.split]
        i = np.arange(j)
        fixed = self.fb_fixed[j] - self.fb_fixed[i]
        sample = self.fb_sample[j] - self.fb_sample[i]
        params = self.params[j] - self.params[i]
        t = (fixed * len(qs) + sample * sum(qs)) / speed
        if r > 1:
            t = t + 2 * (r - 1) * (c.lat(group) + params / (r * c.bw(group)))
        fits = pr.state_factor * params + max(qs) * (self.act[j] - self.act[i]) <= self.model.min_memory(group)
        return t, fits

    def comm(self, j: int, left: str, group: list[str]) -> np.ndarray:
        """Seconds to move the batch's activations into a stage starting at ``i`` (both ways)."""
        pr, c = self.problem, self.problem.cluster
        # The previous stage's replica count is not part of the DP state: assume one
        # sender (the conservative rate of the spec's min(r_s, r_s+1) factor).
        rate = c.bw([left], group)
        i = np.arange(j)
        return 2 * (pr.microbatches * c.lat([left], group) + pr.global_batch * self.cut[i] / rate)


def pipedream_dp(problem: PlanningProblem, deadline: TimeLimit) -> list[tuple[float, Proposal]]:
    """PipeDream's DP: ``(estimated bottleneck, proposal)`` for every reachable device count.

    With ``max_stages`` binding, the table gains a stage-count dimension so that every
    proposal respects it.  Stops early (returning what is complete) at ``deadline``.
    """
    model = StageModel(problem)
    vec = _Vectors(problem, model)
    ranked = rank_devices(problem)
    L, D = len(problem.graph), len(ranked)
    counting = problem.stage_limit < min(L, D)
    K = problem.stage_limit if counting else 1
    A = np.full((K + 1, L + 1, D + 1), np.inf)
    back = np.zeros((K + 1, L + 1, D + 1, 3), dtype=int)
    A[0, 0, 0] = 0.0
    layers_k = range(1, K + 1) if counting else [0]
    for j in range(1, L + 1):
        if past(deadline):
            return []
        for m in range(1, D + 1):
            if past(deadline):
                return []
            widths = range(1, m + 1) if problem.allow_replication else [1]
            for mp in widths:
                if mp % 64 == 0 and past(deadline):  # thousands of devices: one row takes seconds
                    return []
                group = ranked[m - mp:m]
                t, fits = vec.stage(j, group)
                cost = np.where(fits, t, np.inf)
                if m - mp > 0:
                    cost = np.maximum(cost, vec.comm(j, ranked[m - mp - 1], group))
                for k in layers_k:
                    kp = k - 1 if counting else 0
                    cand = np.maximum(A[kp, :j, m - mp], cost)
                    i = int(np.argmin(cand))
                    if cand[i] < A[k, j, m]:
                        A[k, j, m] = cand[i]
                        back[k, j, m] = (kp, i, m - mp)
    out = []
    for k in layers_k:
        for m in range(1, D + 1):
            if np.isfinite(A[k, L, m]):
                out.append((float(A[k, L, m]), _rebuild(back, ranked, k, L, m)))
    out.sort(key=lambda x: x[0])
    return out


def _rebuild(back: np.ndarray, ranked: list[str], k: int, j: int, m: int) -> Proposal:
    bounds, groups = [], []
    while j > 0:
        kp, i, mprev = (int(x) for x in back[k, j, m])
        bounds.append((i, j))
        groups.append(tuple(ranked[mprev:m]))
        k, j, m = kp, i, mprev
    return tuple(bounds[::-1]), tuple(groups[::-1])


class PipeDream(Baseline):
    """PipeDream's min-bottleneck DP over stages and replication."""

    name = "pipedream"
    source = "PipeDream (SOSP'19) optimizer: DP minimising the slowest (replicated) stage"

    def proposals(self, problem: PlanningProblem, deadline: TimeLimit, seed: int) -> Iterator[Proposal]:
        for _, proposal in pipedream_dp(problem, deadline):
            yield proposal
