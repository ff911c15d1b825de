"""``alpa``: Alpa's inter-operator stage-construction DP.

Source: Alpa (Zheng et al., OSDI 2022), ``alpa/pipeline_parallel/stage_construction.py``
(``peers.md`` §1.5).  It minimises the pipeline latency estimate
``sum of stage latencies + (M - 1) * max stage latency``: an outer loop over candidate
``t_max`` (the unique stage costs, ascending, skipping one within :data:`T_MAX_GAP` of
the last tried and stopping once ``M * t_max`` reaches the best: a plan whose slowest
stage takes ``t_max`` costs at least that), and an inner DP ``f[s, k, d]`` (``s`` stages
for layers ``k..L-1`` on ``d`` devices) minimising the sum with every stage at most ``t_max``.  Memory enters as the
number of microbatches a stage must hold given the ``s - 1`` stages after it.

Heterogeneous adaptation: stage device groups ("submeshes") have power-of-two sizes and
are consecutive slices of :func:`~pipeplan.solver.baselines.common.rank_devices` over a pool of
the ``U`` fastest devices (first stage fastest); a stage's latency per microbatch uses its
slowest replica, plus its all-reduce spread over the ``M`` microbatches; the memory test
is the spec's exact peak for its position, with recompute when allowed and needed.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, Iterator

import numpy as np

from pipeplan.solver.baselines.common import Baseline, Proposal, StageModel, rank_devices
from pipeplan.solver.evaluation.memory import StageMemory, group_peak_memory
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.schedules.schedule import stage_actions
from pipeplan.solver.core.termination import TimeLimit, past

T_MAX_GAP = 1e-6
"""Seconds: a ``t_max`` candidate this close to the last one tried is skipped, as in Alpa."""


def _stage_peak(problem: PlanningProblem, model: StageModel, lo: int, hi: int, r: int, after: int,
                recompute: bool) -> float:
    """The spec's peak bytes per device of layers ``[lo, hi)`` on ``r`` replicas with ``after`` stages behind."""
    per_replica = [math.ceil(n / r) for n in problem.split]
    program = stage_actions(problem.schedule, problem.microbatches, 0, after + 1)
    sums = model.sums(lo, hi)
    memory = StageMemory.of(per_replica, sums[5], problem.graph.stage_input_bytes(lo), sums[5], recompute)
    return group_peak_memory(problem.state_factor, sums[4], program, {0: memory})


def _stage_latency(problem: PlanningProblem, model: StageModel, lo: int, hi: int, group: tuple[str, ...],
                   after: int, peak: Callable[[int, int, int, int, bool], float]) -> float:
    """Per-microbatch latency of a stage with ``after`` stages behind it, or inf if it cannot fit.

    ``peak(lo, hi, r, after, recompute)`` is :func:`_stage_peak`, memoised by the caller
    (the peak does not depend on which devices hold the stage).
    """
    r = len(group)
    per_replica = [math.ceil(n / r) for n in problem.split]
    sums = model.sums(lo, hi)
    mem = model.min_memory(group)
    recompute = False
    for rc in ([False, True] if problem.allow_recompute else [False]):
        if peak(lo, hi, r, after, rc) <= mem:
            recompute = rc
            break
    else:
        return math.inf
    speed = min(problem.cluster.device_index[d].speed for d in group)
    af, bf, ab, bb = sums[:4]
    q = max(per_replica)
    t = (af + bf * q) * (2 if recompute else 1) + ab + bb * q
    return t / speed + model.allreduce(lo, hi, group) / problem.microbatches


TABLE_BYTES = 1 << 30
"""Largest stage-latency table the DP allocates (1 GiB: 128 layers on 32 devices); a larger pool
(it grows as ``S L^2 U log U``: 128 layers on 128 devices would need 17 GB) is not tried."""


def alpa_dp(problem: PlanningProblem, pool: list[str], deadline: TimeLimit) -> list[tuple[float, Proposal]]:
    """Alpa's ``t_max`` loop and inner DP on ``pool`` (all of it used).

    Returns ``(estimated latency, proposal)`` pairs, one per ``t_max`` that improved; none when
    the table would exceed :data:`TABLE_BYTES`.
    """
    model = StageModel(problem)
    L, U, M = len(problem.graph), len(pool), problem.microbatches
    # 1F1B holds min(after + 1, M) microbatches in flight: more stages behind share one entry
    peak = lru_cache(maxsize=None)(lambda lo, hi, r, after, rc: _stage_peak(problem, model, lo, hi, r,
                                                                            min(after, M), rc))
    S = min(problem.stage_limit, L, U)
    sizes = [1 << e for e in range(U.bit_length()) if (1 << e) <= U] if problem.allow_replication else [1]
    # C[s, k, hi, d, j]: first of s remaining stages on layers [k, hi) with sizes[j] of the last d devices
    if 8 * (S + 1) * L * (L + 1) * (U + 1) * len(sizes) > TABLE_BYTES:
        return []
    C = np.full((S + 1, L, L + 1, U + 1, len(sizes)), np.inf)
    for s in range(1, S + 1):
        for k in range(L):
            if past(deadline):
                return []
            for hi in range(k + 1, L + 1):
                for d in range(1, U + 1):
                    for j, r in enumerate(sizes):
                        if r <= d:
                            group = tuple(pool[U - d:U - d + r])
                            C[s, k, hi, d, j] = _stage_latency(problem, model, k, hi, group, s - 1, peak)
        if past(deadline):
            return []
    out: list[tuple[float, Proposal]] = []
    best_total, last_t_max = math.inf, -math.inf
    for t_max in np.unique(C[np.isfinite(C)]).tolist():
        # Alpa's exit: a plan whose slowest stage takes t_max costs at least t_max + (M-1) t_max
        if M * t_max >= best_total or past(deadline):
            break
        if t_max - last_t_max < T_MAX_GAP:  # Alpa's skip of nearly equal candidates
            continue
        last_t_max = t_max
        F, arg = _inner_dp(np.where(C <= t_max, C, np.inf), sizes, L, U, S)
        finals = [(float(F[s, 0, U]), s) for s in range(1, S + 1) if math.isfinite(F[s, 0, U])]
        if not finals:
            continue
        total, s = min(finals)
        total += (M - 1) * t_max
        if total < best_total:
            best_total = total
            out.append((total, _rebuild(arg, sizes, pool, s, U)))
    out.sort(key=lambda x: x[0])
    return out


def _inner_dp(C: np.ndarray, sizes: list[int], L: int, U: int, S: int) -> tuple[np.ndarray, np.ndarray]:
    """Alpa's inner DP over stage costs already capped at ``t_max`` (inf above it, and
    wherever a stage would not end after it starts, ``hi <= k``).

    ``F[s, k, d]``: least sum of ``s`` stages on layers ``[k, L)`` using the last ``d``
    devices; ``arg[s, k, d]``: the first stage's ``(hi, size index)`` as one flat index
    over ``(hi, j)``, the first minimum in that order (the scalar loop's tie rule).
    """
    R = len(sizes)
    F = np.full((S + 1, L + 1, U + 1), np.inf)
    F[0, L, 0] = 0.0
    arg = np.zeros((S + 1, L + 1, U + 1), dtype=np.int64)
    for s in range(1, S + 1):
        rest = np.full((L + 1, R, U + 1), np.inf)  # rest[hi, j, d] = F[s-1, hi, d - sizes[j]]
        for j, r in enumerate(sizes):
            rest[:, j, r:] = F[s - 1, :, :U + 1 - r]
        cand = C[s].transpose(0, 1, 3, 2) + rest[None]  # (k, hi, j, d)
        flat = cand.reshape(L, (L + 1) * R, U + 1)
        arg[s, :L] = flat.argmin(axis=1)
        F[s, :L] = np.take_along_axis(flat, arg[s, :L][:, None, :], axis=1)[:, 0, :]
    return F, arg


def _rebuild(arg: np.ndarray, sizes: list[int], pool: list[str], s: int, U: int) -> Proposal:
    """The stages of the DP's best ``s``-stage path from layer 0 on all ``U`` devices."""
    bounds, groups = [], []
    k, d = 0, U
    for stage in range(s, 0, -1):
        hi, j = divmod(int(arg[stage, k, d]), len(sizes))
        bounds.append((k, hi))
        groups.append(tuple(pool[U - d:U - d + sizes[j]]))
        k, d = hi, d - sizes[j]
    return tuple(bounds), tuple(groups)


class Alpa(Baseline):
    """Alpa's stage DP minimising ``sum + (M - 1) * max`` of stage latencies."""

    name = "alpa"
    source = "Alpa (OSDI'22) stage construction: DP minimising sum + (M-1)*max stage latency"

    def proposals(self, problem: PlanningProblem, deadline: TimeLimit, seed: int) -> Iterator[Proposal]:
        ranked = rank_devices(problem)
        D = len(ranked)
        pools = range(1, D + 1) if D <= 8 else sorted({1 << e for e in range(D.bit_length()) if 1 << e <= D} | {D})
        found = []
        for u in pools:
            if past(deadline):
                break
            found.extend(alpa_dp(problem, ranked[:u], deadline))
        for _, proposal in sorted(found, key=lambda x: x[0]):
            yield proposal
