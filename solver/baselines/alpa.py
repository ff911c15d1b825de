"""``alpa``: Alpa's inter-operator stage-construction DP.

Source: Alpa (Zheng et al., OSDI 2022), ``alpa/pipeline_parallel/stage_construction.py``
(``peers.md`` §1.5).  It minimises the pipeline latency estimate
``sum of stage latencies + (M - 1) * max stage latency``: an outer loop over candidate
``t_max`` (the unique stage costs, ascending, stopping once ``(M-1) * t_max`` alone beats
the best), and an inner DP ``f[s, k, d]`` (``s`` stages for layers ``k..L-1`` on ``d``
devices) minimising the sum with every stage at most ``t_max``.  Memory enters as the
number of microbatches a stage must hold given the ``s - 1`` stages after it.

Heterogeneous adaptation: stage device groups ("submeshes") have power-of-two sizes and
are consecutive slices of :func:`~solver.baselines.common.rank_devices` over a pool of
the ``U`` fastest devices (first stage fastest); a stage's latency per microbatch uses its
slowest replica, plus its all-reduce spread over the ``M`` microbatches; the memory test
is the spec's exact peak for its position, with recompute when allowed and needed.
"""

from __future__ import annotations

import math
import time
from typing import Iterator

from solver.baselines.common import Baseline, Proposal, StageModel, rank_devices
from solver.memory import stage_peak_memory
from solver.problem import PlanningProblem
from solver.registry import register
from solver.schedule import stage_ops


def _stage_latency(problem: PlanningProblem, model: StageModel, lo: int, hi: int, group: tuple[str, ...],
                   after: int) -> float:
    """Per-microbatch latency of a stage with ``after`` stages behind it, or inf if it cannot fit."""
    r = len(group)
    per_replica = [math.ceil(n / r) for n in problem.split]
    ops = stage_ops(problem.schedule, problem.microbatches, 0, after + 1)
    sums = model.sums(lo, hi)
    mem = model.min_memory(group)
    recompute = False
    for rc in ([False, True] if problem.allow_recompute else [False]):
        peak = stage_peak_memory(problem.state_factor, sums[4], ops, per_replica, sums[5],
                                 problem.graph.stage_input_bytes(lo), rc)
        if peak <= mem:
            recompute = rc
            break
    else:
        return math.inf
    speed = min(problem.cluster.device_index[d].speed for d in group)
    af, bf, ab, bb = sums[:4]
    q = max(per_replica)
    t = (af + bf * q) * (2 if recompute else 1) + ab + bb * q
    return t / speed + model.allreduce(lo, hi, group) / problem.microbatches


def alpa_dp(problem: PlanningProblem, pool: list[str], deadline: float) -> list[tuple[float, Proposal]]:
    """Alpa's ``t_max`` loop and inner DP on ``pool`` (all of it used).

    Returns ``(estimated latency, proposal)`` pairs, one per ``t_max`` that improved.
    """
    model = StageModel(problem)
    L, U, M = len(problem.graph), len(pool), problem.microbatches
    S = min(problem.stage_limit, L, U)
    sizes = [1 << e for e in range(U.bit_length()) if (1 << e) <= U] if problem.allow_replication else [1]
    # cost[(s, k, hi, d, r)]: first of s remaining stages on layers [k, hi) with r of the last d devices.
    cost: dict[tuple[int, int, int, int, int], float] = {}
    for s in range(1, S + 1):
        for k in range(L):
            if time.perf_counter() > deadline:
                return []
            for hi in range(k + 1, L + 1):
                for d in range(1, U + 1):
                    for r in sizes:
                        if r <= d:
                            group = tuple(pool[U - d:U - d + r])
                            cost[(s, k, hi, d, r)] = _stage_latency(problem, model, k, hi, group, s - 1)
        if time.perf_counter() > deadline:
            return []
    out: list[tuple[float, Proposal]] = []
    best_total = math.inf
    for t_max in sorted({c for c in cost.values() if math.isfinite(c)}):
        if (M - 1) * t_max >= best_total or time.perf_counter() > deadline:
            break
        f: dict[tuple[int, int, int], tuple[float, tuple | None]] = {(0, L, 0): (0.0, None)}
        for s in range(1, S + 1):
            if time.perf_counter() > deadline:
                break
            for k in range(L - 1, -1, -1):
                for d in range(1, U + 1):
                    choice = None
                    for hi in range(k + 1, L + 1):
                        for r in sizes:
                            c = cost.get((s, k, hi, d, r), math.inf)
                            rest = f.get((s - 1, hi, d - r))
                            if c <= t_max and rest is not None and (choice is None or c + rest[0] < choice[0]):
                                choice = (c + rest[0], (s - 1, hi, d - r, r))
                    if choice is not None:
                        f[(s, k, d)] = choice
        finals = [(f[(s, 0, U)][0], s) for s in range(1, S + 1) if (s, 0, U) in f]
        if not finals:
            continue
        total, s = min(finals)
        total += (M - 1) * t_max
        if total < best_total:
            best_total = total
            out.append((total, _rebuild(f, pool, s, U)))
    out.sort(key=lambda x: x[0])
    return out


def _rebuild(f: dict, pool: list[str], s: int, U: int) -> Proposal:
    bounds, groups = [], []
    key = (s, 0, U)
    while f[key][1] is not None:
        s_next, hi, d_next, r = f[key][1]
        _, k, d = key
        bounds.append((k, hi))
        groups.append(tuple(pool[U - d:U - d + r]))
        key = (s_next, hi, d_next)
    return tuple(bounds), tuple(groups)


@register("alpa")
class Alpa(Baseline):
    """Alpa's stage DP minimising ``sum + (M - 1) * max`` of stage latencies."""

    name = "alpa"
    source = "Alpa (OSDI'22) stage construction: DP minimising sum + (M-1)*max stage latency"

    def proposals(self, problem: PlanningProblem, deadline: float, seed: int) -> Iterator[Proposal]:
        ranked = rank_devices(problem)
        D = len(ranked)
        pools = range(1, D + 1) if D <= 8 else sorted({1 << e for e in range(D.bit_length()) if 1 << e <= D} | {D})
        found = []
        for u in pools:
            if time.perf_counter() > deadline:
                break
            found.extend(alpa_dp(problem, ranked[:u], deadline))
        for _, proposal in sorted(found, key=lambda x: x[0]):
            yield proposal
