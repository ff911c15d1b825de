"""The exact solvers' table of candidate arcs (:func:`build_data`), with the bound terms of each.

Memory is exact: each arc's peak is :func:`pipeplan.solver.evaluation.memory.range_peak_memory` of its
program, which under 1F1B depends on the stage only through ``w = min(tau, M)``.  The
vectorised sums (differences of prefix sums) can differ from the simulator's by
rounding, so a peak within rounding of the memory (relative to the prefix sums it came
from) is decided by the simulator's own sum (:func:`pipeplan.solver.evaluation.memory.settle_borderline`):
a stage whose peak equals the memory fits.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from pipeplan.solver.space.arcs import ARC_FIELDS, ExactData, tau_ops, two_round_trips
from pipeplan.solver.bounds.terms import covering_bound, work_bound
from pipeplan.solver.space.device_classes import device_classes
from pipeplan.solver.evaluation.memory import range_peak_memory, settle_borderline, stash_points
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.space.stage_options import link_extremes, stage_options
from pipeplan.solver.core.termination import TimeLimit


FINISH_SECONDS_PER_ARC = 1.5e-6
"""Time :func:`build_data` needs per arc to sort and finish its table, on the large side.

Measured: 0.35 s for 1.9 million arcs once, but 5 s for 4.2 million and 17 s for 13
million (44 layers x 14 devices of distinct speeds: 19 columns of 8 bytes, memory-bound).
At 2.5e-7 a 20 s limit became 31-34 s on that instance; a table that may not be
finished in time is not finished (no model, no bound from it)."""

MAX_TABLE_ARCS = 8_000_000
"""Most arcs :func:`build_data` keeps: 19 columns of 8 bytes make 1.2 GB, and finishing the table
holds one more column at a time.  Uncapped, the arcs grow with the time the table gets: at
``bench_scale``'s 64 devices (four device classes, 128 layers) the unfinished table held 5.2 GB
after 60 s on the idle 2-core machine and 13 GB after 650 s, with no end in sight.  No model is
built above :data:`pipeplan.solver.exact.solve.MAX_MODEL_ARCS` (150,000) arcs, and the
configuration walk's tables over this many arcs would exceed its table budget on any cluster
of more than 37 devices-left vectors, so past it the table is dropped and only its
static bound is kept (counted, so the same on any machine)."""


def _prefix(values: Sequence[float]) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=float))))



def _empty(name: str) -> np.ndarray:
    """An empty column of the arc table."""
    return np.zeros(0, dtype=np.int64 if name in ("lo", "hi", "tau", "option") else float)



def _unfinished(problem: PlanningProblem, classes, options, max_tau: int) -> ExactData:
    """Data without arcs (``complete = False``): only the model-free work bound holds."""
    data = ExactData(problem, classes, options, {name: _empty(name) for name in ARC_FIELDS}, max_tau,
                     problem.stage_limit, 0.0, False)
    data.static_bound = work_bound(problem)
    return data



def _two_trip_ops(q: Sequence[int], w: int, AF, BF, AB, BB, v: float, recompute: bool):
    """The pivot's ops on the path of term 2c, per layer range.

    ``F_0``, then everything from ``B_0`` through ``F_{M-1}`` (``B_0 .. B_{M-w-2}`` and
    ``F_{w+1} .. F_{M-1}``), then ``B_{M-1}``; the warm-up forwards ``F_1 .. F_w`` and the
    backwards ``B_{M-w-1} .. B_{M-2}`` run while the microbatch makes its round trips.
    """
    m = len(q)
    forwards = [0] + list(range(w + 1, m))
    backwards = list(range(0, m - w - 1)) + [m - 1]
    qf, qb = sum(q[k] for k in forwards), sum(q[k] for k in backwards)
    fwd = (len(forwards) * AF + BF * qf) / v
    bwd = (len(backwards) * AB + BB * qb) / v + ((len(backwards) * AF + BF * qb) / v if recompute else 0.0)
    return fwd + bwd


def _relax_single_trip_arcs(table: dict[str, np.ndarray], problem: PlanningProblem, L: int, M: int) -> None:
    """Term 2c coefficients for arcs whose pivot path has one round trip only.

    The rows of term 2c add ``2 R_l`` (or ``R_l`` once more): for an arc without a second
    round trip they hold if its coefficient is its term-2/2b value minus the largest
    ``R`` any configuration holding it can have, ``R_max(hi)``: the longest path of
    ``pass_cost`` over the arcs from layer ``hi`` to ``L`` (tau and devices ignored, so
    it is an upper bound).
    """
    lo, hi, tau, cost = table["lo"], table["hi"], table["tau"], table["pass_cost"]
    one_trip = [t for t in np.unique(tau).tolist() if not two_round_trips(problem.schedule, M, t)]
    single = np.isin(tau, one_trip)
    if not single.any():
        return
    # the table is sorted by lo: the arcs starting at layer l are first[l]:first[l+1]
    first = np.searchsorted(lo, np.arange(L + 1))
    longest = np.zeros(L + 1)
    for start in range(L - 1, -1, -1):
        mine = slice(first[start], first[start + 1])
        longest[start] = float(np.max(cost[mine] + longest[hi[mine]])) if first[start + 1] > first[start] else -np.inf
    reach = np.where(np.isfinite(longest), longest, 0.0)[hi]
    table["pivot2_extra"] = np.where(single, table["pivot_extra"] - reach, table["pivot2_extra"])
    table["pivot2_ar"] = np.where(single, table["pivot_ar"] - reach, table["pivot2_ar"])
    table["pivot_fwd"] = np.where(single, table["pivot_fwd"] - reach, table["pivot_fwd"])


def build_data(problem: PlanningProblem, cutoff: float = math.inf, clock: TimeLimit | None = None,
               max_arcs: int = MAX_TABLE_ARCS) -> ExactData:
    """Enumerate the candidate arcs that fit in memory and whose standalone bound is below ``cutoff``.

    Vectorised over the layer ranges ``[lo, hi)``; one pass per (option, ``tau``).

    Parameters
    ----------
    problem : PlanningProblem
    cutoff : float
        Arcs whose standalone bound (any term of :mod:`pipeplan.solver.bounds.terms` that holds
        for every configuration holding the arc) reaches it are dropped.
    clock : TimeLimit, optional
        Enumeration stops (``complete = False``) when it expires.
    max_arcs : int
        Most arcs kept (:data:`MAX_TABLE_ARCS`): past them the table is dropped
        (``complete = False``, no arcs), but the enumeration goes on for the static bound,
        which then holds if the enumeration ends before the clock.
    """
    graph, cluster = problem.graph, problem.cluster
    classes = device_classes(cluster)
    found = stage_options(problem, classes, clock)
    if found is None:  # out of time already
        return _unfinished(problem, classes, (), 0)
    options = found
    layers = graph.layers
    L, K, sizes = len(graph), problem.stage_limit, problem.split
    M, devices = len(sizes), len(cluster.devices)
    n_min, n_first, n_last = min(sizes), sizes[0], sizes[-1]
    bw_max, lat_min = link_extremes(cluster)
    v_max = max(d.speed for d in cluster.devices)
    V = sum(d.speed for d in cluster.devices)
    r_max = devices if problem.allow_replication else 1
    q_best = -(-n_min // r_max)
    max_tau = min(K - 1, M) if problem.needs.warmup_per_later_stage else 0
    sf = problem.state_factor
    # per-layer prefix sums
    P_af, P_bf = _prefix([l.fwd[0] for l in layers]), _prefix([l.fwd[1] for l in layers])
    P_ab, P_bb = _prefix([l.bwd[0] for l in layers]), _prefix([l.bwd[1] for l in layers])
    P_par, P_act = _prefix([l.params for l in layers]), _prefix([l.act for l in layers])
    lo_all, hi_all = np.triu_indices(L + 1, 1)
    lo_all, hi_all = lo_all.astype(np.int64), hi_all.astype(np.int64)
    AF, BF = P_af[hi_all] - P_af[lo_all], P_bf[hi_all] - P_bf[lo_all]
    AB, BB = P_ab[hi_all] - P_ab[lo_all], P_bb[hi_all] - P_bb[lo_all]
    PAR, ACT = P_par[hi_all] - P_par[lo_all], P_act[hi_all] - P_act[lo_all]
    PAR_END, ACT_END = sf * P_par[hi_all], P_act[hi_all]  # what rounding in sf * PAR and ACT scales with
    inputs = np.array([graph.stage_input_bytes(lo) for lo in range(L)] + [0.0])
    cuts = np.array([graph.cut_bytes(c) for c in range(L - 1)] + [0.0])
    INP, CUT = inputs[lo_all], cuts[hi_all - 1]
    last = hi_all == L
    first = lo_all == 0
    # fastest conceivable head / tail / pass of a layer range (other stages, unknown devices)
    head_min = np.where(first, 0.0, lat_min + (P_af[lo_all] + P_bf[lo_all] * q_best) / v_max)
    tail_min = np.where(first, 0.0, lat_min + (P_ab[lo_all] + P_bb[lo_all] * q_best) / v_max)
    u_layer = _prefix([(l.fwd[0] + l.bwd[0] + (l.fwd[1] + l.bwd[1]) * q_best) / v_max for l in layers])
    rest_pass = u_layer[L] - (u_layer[hi_all] - u_layer[lo_all])
    after_pass = u_layer[L] - u_layer[hi_all]
    w_layer = _prefix([M * (l.fwd[0] + l.bwd[0]) + problem.global_batch * (l.fwd[1] + l.bwd[1]) for l in layers])
    rest_work = w_layer[L] - (w_layer[hi_all] - w_layer[lo_all])
    if problem.needs.forwards_first:
        tau_of = [np.zeros_like(lo_all)]
        tau_ok = [np.ones_like(last)]
    else:  # a stage followed by tau stages needs tau layers after it; tau = 0 only for the last stage
        tau_of = [np.full_like(lo_all, t) for t in range(max_tau + 1)]
        tau_ok = [last if t == 0 else (~last) & (L - hi_all >= t) for t in range(max_tau + 1)]
    ops_by_tau = {t: tau_ops(problem.schedule, M, t) for t in range(max_tau + 1)}
    speed_of = [c.speed for c in classes]
    columns: dict[str, list[np.ndarray]] = {name: [] for name in ARC_FIELDS}
    plain_fits: dict[tuple, np.ndarray] = {}
    complete, kept = True, 0
    least = np.full((L + 1, L + 1), np.inf)  # least standalone bound per layer range, for the static bound
    for index, opt in enumerate(options):
        if clock is not None and clock.expired():
            complete = False
            break
        r, v = opt.replicas, opt.speed
        q = [-(-n // r) for n in sizes]
        Q, q0, ql, qm = sum(q), q[0], q[-1], -(-n_min // r)
        fwd_sum = (M * AF + BF * Q) / v
        bwd_sum = (M * AB + BB * Q) / v + (fwd_sum if opt.recompute else 0.0)
        busy = fwd_sum + bwd_sum
        f_min = (AF + BF * qm) / v
        u = 2 * f_min + (AB + BB * qm) / v if opt.recompute else f_min + (AB + BB * qm) / v
        f0 = (AF + BF * q0) / v
        b_last = (AB + BB * ql) / v + ((AF + BF * ql) / v if opt.recompute else 0.0)
        ar = np.where(PAR > 0, opt.allreduce_params_coef[0] + opt.allreduce_params_coef[1] * PAR, 0.0) \
            if r > 1 else np.zeros_like(PAR)
        def send(n):  # one transfer of n samples across the stage's outgoing cut, fastest conceivable
            return np.where(last, 0.0, lat_min + n * CUT / (r * min(bw_max, opt.send_bandwidth)))
        pass_cost = u + 2 * send(n_min) + np.where(first, ar, 0.0)
        pass_plain = u + 2 * send(n_min)
        head_f = f0 + send(n_first)
        head_fb = head_f + b_last + send(n_last)
        work = busy * r * v / V
        busy_path = head_min + busy + np.maximum(ar, tail_min)
        vsum = sum(n * s for n, s in zip(opt.composition, speed_of))
        rest_share = np.where(rest_work > 0, rest_work / max(V - vsum, 1e-300), 0.0) if V - vsum > 1e-12 * V \
            else np.where(rest_work > 0, np.inf, 0.0)
        base = np.maximum.reduce([busy_path, rest_share, work + rest_work / V])
        for t in range(max_tau + 1):
            if r + t > devices:
                continue
            ok = tau_ok[t]
            points = stash_points(ops_by_tau[t], q)
            if opt.recompute:
                peak = sf * PAR + np.max(np.outer(INP, points[:, 0]) + np.outer(ACT, points[:, 1]), axis=1)
                scale = PAR_END + INP * points[:, 0].max() + ACT_END * points[:, 1].max()
            else:
                peak = sf * PAR + ACT * points[:, 0].max()
                scale = PAR_END + ACT_END * points[:, 0].max()
            fits = settle_borderline(ok & (peak <= opt.memory), peak, opt.memory, ok, lambda i: range_peak_memory(
                graph, sf, int(lo_all[i]), int(hi_all[i]), ops_by_tau[t], q, opt.recompute), scale=scale)
            key = (opt.composition, t)
            if opt.recompute:
                fits &= ~plain_fits.get(key, np.zeros_like(fits))  # dominated: the same devices without recompute fit
            else:
                plain_fits[key] = fits
            if problem.needs.forwards_first:
                critical = busy
            else:
                w = min(t, M)
                tail_q = sum(q[w + 1:])
                critical = f0 + bwd_sum + ((M - 1 - w) * AF + BF * tail_q) / v if w + 1 < M else f0 + bwd_sum
            delta = critical - u
            standalone = np.maximum(base, pass_cost + delta + rest_pass)
            pivot_ar = pass_plain + delta + ar
            standalone = np.maximum(standalone, head_min + pivot_ar + after_pass)
            twice = two_round_trips(problem.schedule, M, t)
            if twice:  # term 2c: a second round trip (of the last microbatch)
                critical2 = _two_trip_ops(q, t, AF, BF, AB, BB, v, opt.recompute)
                delta2 = critical2 - u + (pass_plain - u)  # the own cut is crossed twice more
                pivot2_ar = pass_plain + delta2 + ar
                standalone = np.maximum.reduce([standalone, pass_cost + delta2 + rest_pass + after_pass,
                                                head_min + pivot2_ar + 2 * after_pass])
            else:  # placeholders, made valid once the largest later round trip is known (see below)
                delta2, pivot2_ar = delta, pivot_ar
            # term 2d: the pivot's path to F_{M-1}, which then runs on to a later stage's all-reduce
            f_last = (AF + BF * ql) / v
            chain = f_last + send(n_last)
            end_ar = f_last + (b_last if problem.needs.warmup_per_later_stage else bwd_sum) + ar + 2 * send(n_min)
            if twice:  # F_0, microbatch 0's round trip (own cut here, the rest in R_l), B_0 .. F_{M-1}
                pivot_fwd = critical2 - b_last - f_last + 2 * send(n_min)
                standalone = np.maximum(standalone, head_min + pivot_fwd + end_ar + 2 * after_pass)
            else:  # every forward precedes B_0 (relaxed by R_max below, like term 2c)
                pivot_fwd = fwd_sum - f_last
                standalone = np.maximum(standalone, head_min + pivot_fwd + end_ar + after_pass)
            keep = np.flatnonzero(fits & (standalone < cutoff))
            if not len(keep):
                continue
            np.minimum.at(least, (lo_all[keep], hi_all[keep]), standalone[keep])
            kept += len(keep)
            if kept > max_arcs:  # too many to keep (see MAX_TABLE_ARCS): the static bound only
                columns = {name: [] for name in ARC_FIELDS}
                continue
            for name, col in (("lo", lo_all), ("hi", hi_all), ("busy_path", busy_path), ("pass_cost", pass_cost),
                              ("pivot_extra", delta), ("work", work), ("busy", busy), ("allreduce", ar),
                              ("head_f", head_f), ("head_fb", head_fb), ("standalone", standalone),
                              ("pivot_ar", pivot_ar), ("pivot2_extra", delta2), ("pivot2_ar", pivot2_ar),
                              ("chain", chain), ("pivot_fwd", pivot_fwd), ("end_ar", end_ar)):
                columns[name].append(col[keep])
            columns["tau"].append(np.full(len(keep), t, dtype=np.int64))
            columns["option"].append(np.full(len(keep), index, dtype=np.int64))
    if complete and kept > max_arcs:  # every arc seen, too many kept: the static bound holds, no table
        data = _unfinished(problem, classes, options, max_tau)
        data.static_bound = max(covering_bound(least, cutoff), data.static_bound)
        return data
    if complete and (clock is None or clock.remaining() > FINISH_SECONDS_PER_ARC * kept):
        table = {}
        for name in list(columns):  # one column at a time: the lists go as their column is made
            cols = columns.pop(name)
            table[name] = np.concatenate(cols) if cols else _empty(name)
        order = np.lexsort((table["option"], table["tau"], table["hi"], table["lo"]))
        for name in list(table):
            table[name] = table[name][order]
        _relax_single_trip_arcs(table, problem, L, M)
        data = ExactData(problem, classes, options, table, max_tau, K, 0.0, True)
        data.static_bound = max(covering_bound(least, cutoff), work_bound(problem))
        return data
    # Out of time, or too little left to sort and finish the table (its time is estimated
    # from the arcs): an unfinished table serves no model and no bound.
    return _unfinished(problem, classes, options, max_tau)
