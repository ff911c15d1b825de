"""Lower bounds on the iteration time of every plan of a configuration, and its optimistic time.

The lower bound
---------------
Every term is the length of a path in the dependency graph of the simulator's
timeline, with each op and transfer replaced by a duration that is no longer than the
real one; since every op starts no earlier than its predecessors on any such path end,
each term is ``<= T``.  ``n_min`` is the smallest microbatch, ``q = ceil(n / r)``.

1. **Busy path** ``c1``: stage ``s`` cannot start ``F0`` before ``F0`` ran on every
   earlier stage and crossed every earlier cut (``head``), then runs all its ops one at
   a time (``busy``), and after its last op ``B_{M-1}`` either all-reduces (``AR_s``)
   or ``B_{M-1}`` still crosses every earlier cut and runs on every earlier stage
   (``tail``).  Each earlier stage ``j`` adds its exact ``TF_j`` of microbatch 0
   (``head_f``) and ``TB_j`` of microbatch ``M-1`` (``head_fb`` adds both), each cut a
   transfer of at least ``lat_min + n * cut / (r_j * bw_send)`` (``min(r_j, r_{j+1})
   <= r_j``; ``bw_send`` of term 3).  Linear form, for every layer ``l`` (exactly one
   chosen arc covers it; the chosen arcs ending at or before ``l`` are exactly the
   earlier stages): ``T >= sum_{hi <= l} head_fb x + sum_{a covers l} busy x`` and
   ``T >= sum_{hi <= l} head_f x + sum_{a covers l} (busy + AR) x``.  For pruning, a
   standalone form bounds ``head``/``tail`` by the layers ``[0, lo)`` at the largest
   speed and replication plus one latency.
2. **Pivot path** ``U + D``: microbatch 0 (or ``M-1``) crosses every stage ``j != s``
   once forward and once backward, and stage ``s`` runs the ops on its critical path.
   Each stage ``j != s`` contributes at least ``u_j = TF_j(n_min) + TB_j(n_min)``, and
   each cut is crossed once each way, at least ``lat_min + n_min * cut / (r_j *
   bw_send)`` (term 3) (``min(r_j, r_{j+1}) <= r_j``).  Stage ``s`` contributes ``u_s + delta_s``:
   under GPipe all its ops (``F_{M-1}`` ends, the last forward reaches the last stage,
   ``B0`` comes back, then all backwards run), so ``delta = busy - u``; under 1F1B with
   ``w = min(S-1-s, M)`` warm-up forwards, ``F0``, then after ``B0`` returns every
   backward and ``F_{w+1} .. F_{M-1}``, so ``delta = TF(0) + sum TB + sum_{k>w} TF(k)
   - u``.  The path ends at the end of stage 0's last op, so ``AR_0`` adds on top.
   Linear form: ``T >= U + D`` with ``U = sum u' x`` and ``D >= sum over arcs covering
   l of delta * x`` for every layer ``l``.

   **2b. Pivot path ending in the pivot's all-reduce.**  The same path, but after stage
   ``s``'s last op it takes ``AR_s`` instead of carrying ``B_{M-1}`` back to stage 0.
   ``F0`` of stage ``s`` starts after ``F0`` ran on every earlier stage ``j`` and crossed
   its cut (the sample 0 lies in microbatch 0 of every stage): at least ``head_f_j`` each
   (term 1).  Then stage ``s`` runs ``F0``, microbatch 0 goes through every later stage
   and back, each later stage ``j`` adding at least ``u_j`` and its outgoing cut two
   transfers (its ``u'``; never first, so no ``AR_0``), stage ``s`` runs its critical
   ops from ``B0`` on (``delta``, as in term 2; its own outgoing cut is crossed once
   each way), and ``AR_s`` follows its last op.  So ``T >= sum_{j<s} head_f_j + (u_s +
   2 send_s + delta_s + AR_s) + sum_{j>s} u'_j``.  Linear form, for every layer ``l``:
   ``T >= Hf_l + sum_{a covers l} pivot_ar x + R_l`` with ``R_l = sum_{lo > l} u' x``.
   For pruning: the earlier stages' heads are at least ``head_min`` of term 1 and each
   later layer adds its ``u`` at the largest speed and replication.
   **2c. Two round trips.**  Under 1F1B with ``w <= M - 2`` warm-up forwards on the
   pivot, ``F_{w+1} .. F_{M-1}`` come after ``B_0`` in its op list, so the path of term 2
   can leave the pivot a second time: ``F_0`` on the pivot, microbatch 0's round trip
   through every later stage and back (``R``), the pivot's ops from ``B_0`` through
   ``F_{M-1}`` (``B_0 .. B_{M-w-2}`` and ``F_{w+1} .. F_{M-1}``), microbatch ``M-1``'s round
   trip (``R`` again), then ``B_{M-1}``.  It skips the backwards ``B_{M-w-1} .. B_{M-2}``
   that term 2 counts and adds a second ``R``: tighter whenever the later stages take
   longer than ``w`` backwards of the pivot, which is where 1F1B idles between nearly
   equal neighbours.  Each later stage adds at least its ``u'`` per trip, and the pivot's
   own outgoing cut is crossed twice more (``delta2`` carries those two transfers).  Both
   endings of terms 2 and 2b apply: ``T >= U + R_l + sum_{a covers l} delta2 x`` and
   ``T >= Hf_l + sum_{a covers l} pivot2_ar x + 2 R_l``.  An arc without a second trip
   (GPipe, or ``w >= M - 1``) takes its term-2/2b coefficient minus ``R_max(hi)``, the
   longest path of ``u'`` over the arcs from its end to the last layer, which no
   configuration holding it exceeds, so the rows stay valid (the integer model loses
   nothing; only the relaxation is weaker there).
   **2d. On to a later stage's all-reduce.**  The pivot ``s`` runs its ops up to
   ``F_{M-1}`` (under 1F1B with a second trip: ``F_0``, microbatch 0's round trip, then
   ``B_0 .. B_{M-w-2}`` and ``F_{w+1} .. F_{M-1}``; otherwise every forward, relaxed by
   ``R_max`` like 2c), then ``F_{M-1}`` runs forward through the stages ``s+1 .. e`` (each
   adding ``TF(n_last)`` and a transfer: ``chain``), and the end stage ``e >= s`` runs
   ``F_{M-1}``, waits for its round trip through the stages after it (their ``u'``, its own
   cut twice), runs ``B_{M-1}`` (GPipe: every backward) and all-reduces (``end_ar``).  This
   is the critical path when a later stage is replicated on slow links: its all-reduce
   waits for the last microbatch, which the bottleneck stage releases late.  Linear form:
   ``Z_l = Cz_l + R_l + G_l``, ``ZM_l >= Z_l'`` for every ``l' >= l`` and ``T >= Hf_l +
   Cq_l + R_l - G_l + ZM_l``, where ``G_l`` sums ``chain`` over the arcs ending at or before
   ``l`` (so ``G_l' - G_l`` is the pivot and the stages between); with ``l`` and ``l'`` in
   one arc the row is term 2c's path ending in the all-reduce, also valid.
3. **All-reduce and links**: ``AR_s >= 2 (r-1) (lat_lb + P_s / (r bw_ub))``.  If all
   of a group's devices share a server, ``bw(D)``/``lat(D)`` are that server's link,
   and that server holds the whole composition; otherwise some pair crosses servers
   and they are the network's.  So ``bw_ub`` is the largest of the network bandwidth
   and the bandwidths of the servers able to hold the composition, ``lat_lb`` the
   smallest such latency.  Between two groups, for any device ``x`` of class ``c`` in
   the first, each pair ``(x, y)`` is ``x``'s server link or the network: ``bw_send``
   is the smallest over the classes used of the largest such bandwidth.

4. **Work**: stage ``s`` keeps its ``r_s`` devices busy for ``busy_s <= T``, so
   ``T * sum_s r_s v_s >= sum_s busy_s r_s v_s``; the chosen devices' speeds sum to at
   most ``V``, the sum over the cluster, hence ``T >= sum_s busy_s r_s v_s / V``.  For
   pruning: the stages other than an arc use devices of total speed at most ``V -
   V_a`` (``V_a``: the arc's devices' speeds) and need at least ``W_rest = M (a_f +
   a_b) + B (b_f + b_b)`` over the other layers, so ``T >= W_rest / (V - V_a)``.

Pruning (standalone bound of an arc, valid for every configuration holding it): the
maximum of the standalone busy path, ``work + W_rest / V``, ``W_rest / (V - V_a)`` and
the pivot path with the other layers' ``u`` at the largest speed and replication
(communication left out; term 2c counts the later layers twice).  ``max_l min`` over
arcs covering ``l`` of it is the static bound.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from pipeplan.solver.space.arcs import ARC_FIELDS, Arc, ExactData
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.evaluation.simulator import GroupCost, PlanCosts, StageLinks, one_stage_wiring, run_programs
from pipeplan.solver.space.stage_options import Option, link_extremes


def work_bound(problem: PlanningProblem) -> float:
    """``T >= W / V``: the whole model's work at full batch over the summed device speeds.

    Each stage keeps ``r_s`` devices of speed ``>= v_s`` busy ``busy_s <= T``, and
    ``busy_s r_s v_s >= M (a_f + a_b) + B (b_f + b_b)`` over its layers (``r q_k >= n_k``),
    with ``M`` the fewest microbatches the problem allows.  It holds at every
    tensor-parallel degree and ZeRO level too: a replica of ``t`` devices spends at least
    the degree-1 device-seconds on each layer (section 8.3).
    """
    graph = problem.graph
    fixed = sum(l.fwd[0] + l.bwd[0] for l in graph.layers) * min(problem.split_counts)
    per_sample = sum(l.fwd[1] + l.bwd[1] for l in graph.layers) * problem.global_batch
    return (fixed + per_sample) / sum(d.speed for d in problem.cluster.devices)



def covering_bound(best: np.ndarray, cutoff: float) -> float:
    """The static bound: ``max_l min`` over the arcs covering layer ``l`` of their standalone bound.

    ``best[lo, hi]`` is the least standalone bound of the arcs over ``[lo, hi)``.  Every
    configuration holds, for each layer, one arc covering it, so its bound is at
    least the smallest standalone bound of those arcs; an arc left out (``inf``) is one
    whose bound reached ``cutoff``.

    Examples
    --------
    >>> import numpy as np
    >>> best = np.full((3, 3), np.inf); best[0, 1], best[1, 2], best[0, 2] = 2.0, 3.0, 5.0
    >>> covering_bound(best, 10.0), covering_bound(best, 2.5)
    (3.0, 2.5)
    """
    L = best.shape[0] - 1
    bound = 0.0
    for layer in range(L):
        covering = best[:layer + 1, layer + 1:]
        bound = max(bound, min(float(covering.min()) if covering.size else math.inf, cutoff))
    return bound



def _to_end_allreduce(arcs: Sequence[Arc]) -> float:
    """Term 2d of a configuration (arcs in stage order): the best pivot ``s`` and end stage ``e >= s``."""
    after = [0.0] * len(arcs)  # after[k]: passes of the stages after k (R)
    for k in range(len(arcs) - 2, -1, -1):
        after[k] = after[k + 1] + arcs[k + 1].pass_cost
    best, head = 0.0, 0.0
    for s, pivot in enumerate(arcs):
        chain = 0.0  # F_{M-1} through the stages s .. e-1
        for e in range(s, len(arcs)):
            best = max(best, head + pivot.pivot_fwd + after[s] + chain + arcs[e].end_ar + after[e])
            chain += arcs[e].chain
        head += pivot.head_f
    return best



def config_lower_bound(data: ExactData, arc_ids: Sequence[int]) -> float:
    """The model's objective at the configuration made of ``arc_ids`` (every term of the docstring)."""
    arcs = sorted((Arc(*(data.table[name][i].item() for name in ARC_FIELDS)) for i in arc_ids), key=lambda a: a.lo)
    busy = head_f = head_fb = 0.0
    for a in arcs:
        busy = max(busy, head_fb + a.busy, head_f + a.busy + a.allreduce, a.busy_path)
        head_f += a.head_f
        head_fb += a.head_fb
    pivot = sum(a.pass_cost for a in arcs) + max(a.pivot_extra for a in arcs)
    # term 2b: heads of the earlier stages, the pivot with its all-reduce, passes of the later ones
    # term 2c: the same with a second round trip (both endings)
    pivot_ar, before, after = 0.0, 0.0, sum(a.pass_cost for a in arcs)
    total = after
    for a in arcs:
        after -= a.pass_cost
        pivot_ar = max(pivot_ar, before + a.pivot_ar + after, before + a.pivot2_ar + 2 * after,
                       total + a.pivot2_extra + after)
        before += a.head_f
    return max(busy, pivot, pivot_ar, _to_end_allreduce(arcs), sum(a.work for a in arcs))



def optimistic_time(data: ExactData, arc_ids: Sequence[int]) -> float:
    """The simulated iteration time of a configuration with every link at its best conceivable value.

    Ops take their exact durations (they depend on the composition only); each transfer
    takes ``lat_min + n * cut / (min(r_s, r_{s+1}) * bw)`` with ``bw`` the smallest of
    the two stages' ``send_bandwidth`` (and the fastest link), each all-reduce its lower
    bound of term 3.  Every duration is at most its value under any placement, and the
    timeline is monotone in its durations (a max-plus system: op and link orders are
    fixed by the op lists), so the result bounds every placement's iteration time.
    """
    problem = data.problem
    graph, sizes = problem.graph, problem.split
    tab = data.table
    ordered = sorted(arc_ids, key=lambda i: int(tab["lo"][i]))
    options = [data.options[int(tab["option"][i])] for i in ordered]
    bw_max, lat_min = link_extremes(problem.cluster)
    S = len(ordered)
    wiring = one_stage_wiring(problem.schedule, (tuple(sizes),) * S)
    groups, links = [], []
    for s, (i, opt) in enumerate(zip(ordered, options)):
        lo, hi = int(tab["lo"][i]), int(tab["hi"][i])
        af, bf, ab, bb = graph.range_time(lo, hi)
        q = tuple(-(-n // opt.replicas) for n in sizes)
        fwd = tuple((af + bf * k) / opt.speed for k in q)
        rec = fwd if opt.recompute else tuple(0.0 for _ in q)
        bwd = tuple((ab + bb * k) / opt.speed + x for k, x in zip(q, rec))

        def sends(other: Option, cut: float) -> tuple[float, ...]:
            rate = min(opt.replicas, other.replicas) * min(bw_max, opt.send_bandwidth, other.send_bandwidth)
            return tuple(lat_min + n * cut / rate for n in sizes)

        send_fwd = sends(options[s + 1], graph.cut_bytes(hi - 1)) if s < S - 1 else ()
        send_bwd = sends(options[s - 1], graph.cut_bytes(lo - 1)) if s > 0 else ()
        params = graph.range_sum("params", lo, hi)
        fixed, per_byte = opt.allreduce_params_coef
        allreduce = fixed + per_byte * params if opt.replicas > 1 and params > 0 else 0.0
        program = wiring.programs[s]
        groups.append(GroupCost((), (s,), program, tuple(fwd[k] if kind == "F" else bwd[k] for _, kind, k in program),
                                tuple(0.0 if kind == "F" else rec[k] for _, kind, k in program),
                                tuple(q[k] for _, _, k in program), allreduce, 0.0, 0.0, math.inf))
        links.append(StageLinks(send_fwd, send_bwd, tuple(sizes)))
    return run_programs(PlanCosts(wiring, tuple(groups), tuple(links), problem.global_batch)).iteration_time
