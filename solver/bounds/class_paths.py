"""Paths through the timeline of a pipeline described by class, and the proofs of the class-level model.

:func:`pipeline_time` is the spec's timing (section 4) of a version-1 pipeline given
each stage's op durations, each cut's transfer durations and each stage's all-reduce;
:func:`path_bound` is the largest of the path terms below for such a pipeline.  The
class-level model (:mod:`pipeplan.solver.exact.class_model`) and the known-optimum
search (``experiments/known_optimum.py``) rest on the proofs here.

Setting
-------
A version-1 plan of an equal-split problem: stages ``0 .. S-1``, microbatch ``k`` the
same samples on every stage (so ``Fk``/``Bk`` of a stage wait on microbatch ``k`` of its
neighbour only), ``TF_{s,k}``, ``TB_{s,k}`` (recompute included), ``AR_s``; cut ``s``
(after stage ``s``) carries ``t_{s,k} = lat + n_k cut_s / (min(r_s, r_{s+1}) bw)`` each
way (the two links have the same ``bw``, ``lat`` and sizes).  Under 1F1B stage ``s``
has ``w_s = min(S-1-s, M)`` warm-up forwards; the stage with ``k`` later stages is at
*position* ``k``.  ``n_min`` is the smallest microbatch; ``u'_j = TF_j(n_min) +
TB_j(n_min) + 2 t_j(n_min)`` is a *pass* (``t`` of the last stage is 0);
``hf_j = TF_{j,0} + t_{j,0}`` a *head*; ``tb_j = TB_{j,M-1} + t_{j,M-1}`` a *tail*.

Every op starts no earlier than the end of every op or transfer it waits on, and ops of
a stage run one at a time in their list's order, so the length of any chain of ops and
transfers in which each waits on the previous one is at most ``T``; every duration
below is at most the real one.  That is the whole argument for each path term.

Path terms
----------
**B1 / B2 (busy).**  Stage ``p``'s ``F_0`` waits for microbatch 0's forwards and
transfers through every earlier stage (``sum_{j<p} hf_j``); then ``p`` runs all its ops
(``busy_p``); then either it all-reduces (``AR_p``, B1) or ``B_{M-1}`` goes back
through every earlier cut and stage (``sum_{j<p} tb_j``, B2).

**P (pivot, one round trip, ending at stage e <= p).**  Microbatch 0 reaches ``p``
(``sum_{j<p} hf_j``); ``p`` runs ``F_0``; microbatch 0 goes through every later stage and
back (``R_p = sum_{j>p} u'_j`` and the cut after ``p`` twice, ``2 t_p``); ``p`` runs
``B_0`` and every op after it in its list; its last op ``B_{M-1}``'s gradient goes back
through the stages ``e .. p-1`` (``sum_{e<=j<p} tb_j``) and stage ``e`` all-reduces.  The
ops after ``B_0`` are every ``B_k`` and, under 1F1B, ``F_{w+1} .. F_{M-1}``: so the
pivot contributes ``crit_p = busy_p - sum_{k=1}^{min(w,M-1)} TF_{p,k} >= busy_p -
min(w, M-1) fmax_p`` (under GPipe every op: ``crit = busy``, the round trip then carries
``F_{M-1}`` forward and ``B_0`` back).  With ``hf_j + tb_j >= u'_j``:
``T >= sum_{j<e} hf_j + AR_e + sum_{e<=j<p} u'_j + crit_p + 2 t_p + R_p``.  ``e = 0``
gives ``T >= U - sum_{j>=p} u'_j + crit_p + 2 t_p + R_p`` with ``U = sum_j u'_j``.

**PJ (two round trips).**  Under 1F1B with ``w <= M - 2``, ``F_{M-1}`` follows ``B_0``
in ``p``'s list: the path of P can run ``B_0 .. B_{M-w-2}`` and ``F_{w+1} .. F_{M-1}``,
send ``F_{M-1}`` around the later stages and back (``R_p + 2 t_p`` again), then run
``B_{M-1}``.  It skips ``w`` forwards and ``w`` backwards of ``p``:
``crit2_p >= busy_p - w (fmax_p + bmax_p)``, and
``T >= sum_{j<e} hf_j + AR_e + sum_{e<=j<p} u'_j + crit2_p + 4 t_p + 2 R_p``.

**W (work).**  Each stage keeps ``r_s`` devices of speed ``>= v_s`` busy ``busy_s <=
T``, so ``T sum_d speed_d >= sum_s busy_s r_s v_s``.

Stage terms from a class-level description
------------------------------------------
A stage is described by its layer range, the class ``c`` of a slowest device, the
``q``-class ``[r_lo, r_hi]`` of its replica count, its link (one server of a kind, or
spread over servers) and its recompute flag.

**S1 (op times, exact).**  ``TF_k = (af + bf q_k) / v_c`` and ``TB_k`` likewise are
sums over the stage's layers, linear in its attribute sums; ``q_k`` is the same for
every ``r`` of the ``q``-class.
**S2 (all-reduce).**  ``AR`` grows with ``r`` (``2(r-1) lat`` and ``2 (r-1)/r P / bw``
both do), so ``AR >= 2 (r_lo - 1) (lat + P / (r_lo bw))`` with the stage's link: one
server's link when one server holds it (exact), else some pair crosses servers, so
``bw(D) <= network bandwidth`` and ``lat(D) >= network latency``.
**S3 (transfers).**  ``min(r_s, r_{s+1}) <= r_s <= r_hi``; the pair ``(x, y)`` of a
device of the stage and one of its neighbour talks over the network unless both sit on
the server holding the whole stage, which needs room for one more device: so ``t >=
lat_lb + n cut_min / (r_hi bw_ub)`` with ``bw_ub`` the network's, or the largest of it
and the server's link when that server has room (``cut_min`` the smallest cut of the
graph, ``lat_lb`` likewise).
**S4 (memory).**  The peak of a stage grows with its warm-up; at position ``k`` it is
the peak with ``w = min(k, M)``, at least ``sf P + A max stash`` (with recompute ``I
stash + A working`` at the point of largest working set, ``I >= `` the smallest stage
input), and must be at most the memory of class ``c`` (every device of the stage holds
it).
**D (devices).**  For each speed ``s``, the stages whose slowest speed is ``>= s`` use
only devices of speed ``>= s``: ``sum r_lo <= #{devices of speed >= s}``.  For a
server kind, the stages each held by one server of that kind use at most its devices
(of speed ``>= s``), and a server holds at most ``k`` stages of more than ``C/(k+1)``
devices (``C`` its devices of speed ``>= s``).  At most ``stage_limit`` stages.

Every row of the position model is one of these terms with every stage quantity
replaced by its class-level lower bound (a linear form of the stage's attribute sums),
and the model's variables take, for any plan, the values its stages give (positions from
the end, the pool for ``w >= K``, whose rows are sums of the per-stage ones): so its
optimum, and HiGHS's dual bound below it, is at most that plan's ``T``.
"""

from __future__ import annotations

import math
from typing import Sequence

from pipeplan.solver.evaluation.simulator import PlanCosts
from pipeplan.solver.schedules.schedule import FORWARD, schedule_for
from pipeplan.solver.space.arcs import tau_ops

__all__ = ["path_bound", "pipeline_time", "stage_durations"]


def stage_durations(costs: PlanCosts) -> tuple[list[list[float]], list[list[float]], list[list[float]], list[float]]:
    """``(fwd, bwd, send, allreduce)`` of a version-1 plan's costs, in the form :func:`pipeline_time` takes.

    Parameters
    ----------
    costs : PlanCosts
        :func:`pipeplan.solver.evaluation.simulator.plan_costs` of a plan whose every
        group holds one stage (``gpipe``, ``1f1b``, or a ``custom`` plan of that shape).

    Returns
    -------
    fwd, bwd : list of list of float
        ``TF_{s,k}`` and ``TB_{s,k}`` (recompute included) by stage and microbatch.
    send : list of list of float
        ``t_{s,k}``: the forward transfer over cut ``s`` (one list per cut).
    allreduce : list of float
        ``AR_s``.

    Raises
    ------
    ValueError
        If a group holds more than one stage or splits its backward.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.core.problem import PlanningProblem
    >>> from pipeplan.solver.evaluation.simulator import plan_costs
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> graph = LayerGraph.chain("g", [Layer(f"l{i}", (1.0, 0.0), (2.0, 0.0), 0.0, 0.0, 0.0) for i in range(2)],
    ...                         input_bytes=0.0)
    >>> link = Link(1e9, 0.0)
    >>> cluster = Cluster("c", (Link(1e9, 0.0, "s"),), link, (Device("d0", "s", 1.0, 1e9), Device("d1", "s", 1.0, 1e9)))
    >>> problem = PlanningProblem(graph, cluster, global_batch=2, microbatches=2, schedule="1f1b")
    >>> plan = problem.make_plan([(0, 1), (1, 2)], [["d0"], ["d1"]], [False, False])
    >>> fwd, bwd, send, ar = stage_durations(plan_costs(plan, graph, cluster))
    >>> fwd, bwd, ar
    ([[1.0, 1.0], [1.0, 1.0]], [[2.0, 2.0], [2.0, 2.0]], [0.0, 0.0])
    >>> pipeline_time("1f1b", fwd, bwd, send, ar)
    9.0
    """
    fwd: list[list[float]] = []
    bwd: list[list[float]] = []
    for g, group in enumerate(costs.groups):
        if len(group.stages) != 1:
            raise ValueError(f"group {g} holds stages {list(group.stages)}; stage_durations takes one stage per group")
        m = len(costs.links[group.stages[0]].sizes)
        f, b = [0.0] * m, [0.0] * m
        for (_, kind, k), seconds in zip(group.program, group.durations):
            if kind == FORWARD:
                f[k] = seconds
            elif kind == "B":
                b[k] = seconds
            else:
                raise ValueError(f"group {g} runs a split backward ({kind}{k}); stage_durations takes F and B only")
        fwd.append(f)
        bwd.append(b)
    send = [list(link.send_fwd) for link in costs.links[:-1]]
    return fwd, bwd, send, [group.allreduce for group in costs.groups]


def pipeline_time(schedule: str, fwd: Sequence[Sequence[float]], bwd: Sequence[Sequence[float]],
                  send: Sequence[Sequence[float]], allreduce: Sequence[float]) -> float:
    """The iteration time of a version-1 pipeline whose stages split the batch alike (spec section 4).

    Parameters
    ----------
    schedule : {"1f1b", "gpipe"}
    fwd, bwd : per stage, per microbatch
        ``TF`` and ``TB`` (recompute included).
    send : per cut (``S - 1`` of them), per microbatch
        The transfer time across the cut, each way.
    allreduce : per stage
        ``AR_s``.

    Examples
    --------
    Two stages of one layer each, two microbatches, no transfers (the pipeline of
    ``tests/test_class_bound.py``): stage 1 runs F0 B0 F1 B1 from 1 to 7, stage 0's B1 ends at 9.

    >>> pipeline_time("1f1b", [[1, 1], [1, 1]], [[2, 2], [2, 2]], [[0, 0]], [0, 0])
    9.0
    """
    S, M = len(fwd), len(fwd[0])
    ops = [list(tau_ops(schedule, M, min(S - 1 - s, M))) for s in range(S)]
    f_arrive = [[math.nan] * M for _ in range(S)]
    b_arrive = [[math.nan] * M for _ in range(S)]
    f_free = [0.0] * S
    b_free = [0.0] * S
    f_end = [[math.nan] * M for _ in range(S)]
    clock = [0.0] * S
    pos = [0] * S
    done = 0
    total = sum(len(o) for o in ops)
    while done < total:
        progressed = False
        for s in range(S):
            while pos[s] < len(ops[s]):
                _, kind, k = ops[s][pos[s]]
                if kind == FORWARD:
                    ready = 0.0 if s == 0 else f_arrive[s][k]
                else:
                    ready = f_end[s][k] if s == S - 1 else b_arrive[s][k]
                if math.isnan(ready):
                    break
                start = max(clock[s], ready)
                end = start + (fwd[s][k] if kind == FORWARD else bwd[s][k])
                clock[s] = end
                if kind == FORWARD:
                    f_end[s][k] = end
                    if s < S - 1:
                        go = max(end, f_free[s])
                        f_free[s] = go + send[s][k]
                        f_arrive[s + 1][k] = f_free[s]
                elif s > 0:
                    go = max(end, b_free[s - 1])
                    b_free[s - 1] = go + send[s - 1][k]
                    b_arrive[s - 1][k] = b_free[s - 1]
                pos[s] += 1
                done += 1
                progressed = True
        if not progressed:
            raise RuntimeError("the op lists deadlock")  # never for gpipe or 1f1b
    return max(clock[s] + allreduce[s] for s in range(S))


def path_bound(schedule: str, fwd: Sequence[Sequence[float]], bwd: Sequence[Sequence[float]],
               send: Sequence[Sequence[float]], allreduce: Sequence[float],
               device_speed: Sequence[float] | None = None, total_speed: float | None = None) -> float:
    """The largest path term (B1, B2, P, PJ and, given speeds, W) of the module docstring for one pipeline.

    Every term is at most :func:`pipeline_time` of the same pipeline, so the result is a
    lower bound on that pipeline's iteration time.  It is a bound on one pipeline, not on
    every plan: the class-level model (:mod:`pipeplan.solver.exact.class_model`) takes the
    same terms over every configuration.

    Parameters
    ----------
    schedule : {"1f1b", "gpipe"}
    fwd, bwd : sequence of sequence of float
        ``TF_{s,k}`` and ``TB_{s,k}`` (recompute included) by stage and microbatch.
    send : sequence of sequence of float
        ``t_{s,k}``, one list per cut (``S - 1`` of them).
    allreduce : sequence of float
        ``AR_s``.
    device_speed : sequence of float, optional
        ``r_s v_s``: replicas times the slowest speed of each stage (for the work term W).
    total_speed : float, optional
        The cluster's summed speed (W is left out without it).

    Returns
    -------
    float
        The largest term, in seconds.

    See Also
    --------
    pipeline_time : the exact timing these terms bound.
    stage_durations : these arguments from a plan's costs.

    Examples
    --------
    Identical stages and no transfers: 1F1B takes ``(M + S - 1)(f + b)``, which the pivot
    term of the first stage reaches.

    >>> fwd, bwd = [[1.0] * 4 for _ in range(3)], [[2.0] * 4 for _ in range(3)]
    >>> path_bound("1f1b", fwd, bwd, [[0.0] * 4] * 2, [0.0] * 3)
    18.0
    >>> pipeline_time("1f1b", fwd, bwd, [[0.0] * 4] * 2, [0.0] * 3)
    18.0
    """
    S, M = len(fwd), len(fwd[0])
    cut = [list(send[j]) if j < S - 1 else [0.0] * M for j in range(S)]
    t_min = [min(c) for c in cut]
    passes = [min(f + b for f, b in zip(fwd[j], bwd[j])) + 2 * t_min[j] for j in range(S)]
    heads = [fwd[j][0] + cut[j][0] for j in range(S)]
    tails = [bwd[j][-1] + cut[j][-1] for j in range(S)]
    busy = [sum(fwd[j]) + sum(bwd[j]) for j in range(S)]
    one_f_one_b = schedule_for(schedule).warmup_per_later_stage
    best = 0.0
    for p in range(S):
        w = min(S - 1 - p, M) if one_f_one_b else M
        head = sum(heads[:p])
        best = max(best, head + busy[p] + allreduce[p], head + busy[p] + sum(tails[:p]))
        after = sum(passes[p + 1:])
        if one_f_one_b:
            crit = busy[p] - sum(fwd[p][1:min(w, M - 1) + 1])
        else:
            crit = busy[p]
        core = crit + 2 * t_min[p] + after
        cores = [core]
        if one_f_one_b and w <= M - 2:
            skipped = sum(fwd[p][1:w + 1]) + sum(bwd[p][M - w - 1:M - 1])
            cores.append(busy[p] - skipped + 4 * t_min[p] + 2 * after)
        for e in range(p + 1):
            lead = sum(heads[:e]) + allreduce[e] + sum(passes[e:p])
            for c in cores:
                best = max(best, lead + c)
    if device_speed is not None and total_speed:
        best = max(best, sum(b * d for b, d in zip(busy, device_speed)) / total_speed)
    return best
