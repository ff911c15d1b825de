"""A lower bound on the best iteration time from device classes alone: :func:`class_bound`.

It needs no table of compositions, so it holds where the exact solvers build no model
(hundreds or thousands of devices).  It holds for every version-1 plan of an
equal-split problem (``problem.split`` on every stage; with ``free_sizes`` only the
work bound is returned): any boundaries, any devices per stage, replicas, recompute
where allowed, under ``gpipe`` or ``1f1b``.

Proof
-----
Notation (spec section 4): stage ``s`` has ``r_s`` devices of smallest speed ``v_s``
and smallest memory ``m_s``; ``q_k = ceil(n_k / r_s)``; ``TF_k``, ``TB_k`` its op times
(``TB`` with the recompute ``TF``); ``busy_s = sum_k (TF_k + TB_k)``; ``n_min``,
``n_0`` the smallest and first microbatch; ``u_s = TF(n_min) + TB(n_min)``.

**Stage type.**  Let ``c`` be a class holding a slowest device of the stage (every
class is tried).  Then ``v_s = v_c``, ``m_s <= m_c``, and all ``r_s`` devices have
speed ``>= v_c``, so ``r_s <= N_c``, the devices of speed ``>= v_c``.  Its times
depend only on ``(lo, hi, r, c, recompute)``.  Among ``r`` with the same ``q``
vector the smallest one is kept: times and memory are equal, and every other
quantity below (all-reduce, device use) does not decrease with ``r``; a plan's
stage is replaced, for the bound, by the stage of the same ``q`` with the smallest
``r`` (this only lowers each term, and keeps the device constraint satisfied).

**(a) Memory.**  Each device of the stage holds ``sf * P_s`` plus the stash peak of its
op list (spec 5); the peak grows with the warm-up ``w`` (a longer prefix of forwards
before the first backward), and ``w >= 1`` unless the stage is the last (``1f1b``),
so a stage whose peak with ``w = 1`` (``w = 0`` for one ending at layer ``L``; the
GPipe list otherwise) exceeds ``m_c >= m_s`` fits in no plan.

**(b) All-reduce.**  If the ``r >= 2`` devices share a server, ``bw``/``lat`` are that
server's, and it holds ``r`` devices of speed ``>= v_c``; otherwise a pair crosses
servers and ``bw <= `` the network's, ``lat >= `` the network's.  So ``AR_s >=
2 (r - 1) (lat_lb + P_s / (r bw_ub))`` with ``bw_ub`` the largest, ``lat_lb`` the
smallest, over the network and those servers (0 when ``P_s = 0``).

**(c) Per stage.**  The stage runs its ops one at a time from time ``>= 0``, so its
last op ends ``>= busy_s`` and ``T >= busy_s + AR_s``.

**(d) Pivot paths** (terms 2 and 2b of :mod:`pipeplan.solver.bounds.terms`).  Pick any stage
``p``.  Under 1F1B it has ``w = min(S - 1 - p, M)`` warm-up forwards and ``w <=
min(L - hi_p, M)`` (each later stage holds a layer); its *critical* ops are
``F_0``, every ``B_k`` and ``F_{w+1} .. F_{M-1}`` (they follow ``B_0`` in its list),
``crit_p >= TF_0 + sum_k TB_k + sum_{k > w_max} TF_k`` with ``w_max = 0`` for the last
stage and ``min(L - hi, M)`` otherwise (fewer forwards for a larger ``w``); under
GPipe ``crit_p = busy_p``.  Microbatch 0 (whose samples are in microbatch 0 of every
stage) runs ``F_0`` on each stage before ``p`` and crosses each cut; on ``p`` it runs
``F_0``, goes to the last stage and back (each later stage runs its ``F_0`` and
``B_0``, ``>= u_j``); ``p`` runs the rest of its critical ops after ``B_0`` arrives;
its last op is ``B_{M-1}``, after which either

1. ``B_{M-1}`` goes back through every earlier stage (``>= u_j`` with its ``F_0``) and
   stage 0 all-reduces: ``T >= sum_{j != p} u_j + crit_p + AR_0``; or
2. ``p`` all-reduces: ``T >= sum_{j < p} TF_j(n_0) + crit_p + AR_p + sum_{j > p} u_j``; or
3. ``B_{M-1}`` goes back through stages ``p - 1, ..., q`` for some ``q < p`` (each ``>= u_j`` with its
   ``F_0``), and ``q`` all-reduces after its last op, which ends no earlier: ``T >= sum_{j < q} TF_j(n_0) +
   sum_{j >= q, j != p} u_j + crit_p + AR_q`` (``q = 0`` is ending 1, ``q = p`` ending 2).

Transfers.  Microbatch 0 crosses each cut ``j`` it passes in both directions, once each
way, so every ``u_j`` above may carry ``2 t_j`` (the pivot's own cut included in ending 1,
where ``T >= AR_0 + sum_{j != p} (u_j + 2 t_j) + crit_p + 2 t_p``), and a stage before the
pivot of ending 2, or before ``q`` in ending 3, its ``t_j``.  A transfer takes ``lat + n cut /
(min(r_j, r_{j+1}) bw)`` over the worst pair of the two groups (spec 4), ``>= t_j = lat_lb + n_min
cut_j / (r_hi bw_ub)`` with ``r_hi`` the largest replica count of the type's ``q`` vector
(``r_j <= r_hi``); the two groups share no device, so a pair talks over the network
unless one server holds the ``r_j >= r`` devices of speed ``>= v_c`` and one more:
``bw_ub``, ``lat_lb`` are over the network and such servers.  The last stage sends
nothing (``t = 0``).

**(e) Devices.**  For each class ``k`` the stages whose slowest speed is ``>= v_k`` use
at most ``N_k`` devices (their devices are all of speed ``>= v_k``).  For weights
``mu_k >= 0``, ``g(v) = sum_{k: v >= v_k} mu_k``: ``sum_s r_s g(v_s) <= G = sum_k mu_k N_k``
(speed weights give ``sum_s r_s v_s <= V``; ``mu`` on the slowest class alone,
``sum_s r_s <= D``).

**Combining.**  Fix ``lambda >= 0`` and a time ``t``.  A *qualifying* stage type on a
range satisfies (a) and ``busy + AR <= t`` (c); each one costs ``lambda r g(v)`` on top
of its path terms.  Two shortest paths over layer boundaries, each minimised over every
sequence of qualifying types covering ``[0, L)`` in order:

- ``f1(t)``, ending 1 with ``p`` the stage of largest ``delta = crit - u``:
  ``T >= U + delta* + AR_0`` with ``U = sum_j (u_j + 2 t_j)`` and ``delta* = max_s delta_s``.
  Put each ``delta`` in the bucket ``ceil(delta K / t)`` clipped to ``1 .. K`` (``K`` =
  :data:`DELTA_STEPS`; monotone in ``delta``).  If ``delta*`` is in bucket ``b``, every
  stage's bucket is ``<= b``, so ``U + AR_0 >= C(b)``, the cheapest cover by types of
  bucket ``<= b`` costing ``u`` (plus ``AR`` on the one starting at layer 0) and the
  Lagrange terms; and ``delta* >= e_b``, the smallest ``delta`` of any type that fits
  with bucket ``>= b`` (with ``w_max`` or at any position told apart below).  So
  ``f1 = min_b (e_b + C(b))``.  *Positions*: a stage's ``delta`` with ``w = min(k, M)``
  for its ``k`` later stages is at least the one with ``w_max`` (``k <= L - hi``), so the
  cover may filter each stage by the former: ``C(b)`` is then a shortest path over (layer
  boundary, stages after it), built from the end, ``k`` told exactly below :data:`POSITIONS`
  (or ``M``) and ``w_max`` used from there on.  A stage *is* at the position the path gives
  it (it counts the stages after it), so the optimal plan's stages, each with its own
  ``delta <= delta*``, still form one such path;
- ``f2(t)``, ending 2: stages before the pivot cost ``TF(n_0) + t``, the pivot ``crit +
  2 t + AR``, stages after it ``u + 2 t``, plus the Lagrange terms;
- ``f3(t)``, endings 1 and 3 with ``q = 1`` at once, both with the pivot ``p*`` the *last* stage of
  the largest bucket ``b`` (every later stage's bucket is ``< b``).  If ``p* >= 1``, both hold, and so
  does their mix with weight ``alpha`` (:data:`STAGE_ONE_SHARE`): ``T >= U + delta* + alpha AR_0 + (1 -
  alpha) (AR_1 - s_0)`` with ``s_0 = u_0 + t_0 - TF_0(n_0)``.  So ``T >= e_b + A(b)``, ``A(b)`` the
  cheapest cover of two stages or more by types of bucket ``<= b``, stage 0 costing ``alpha (u + 2 t + AR)
  + (1 - alpha) (TF(n_0) + t)``, stage 1 ``u + 2 t + (1 - alpha) AR``, any other ``u + 2 t``.  If ``p* =
  0``, ending 1 holds with every later stage of bucket ``<= b - 1``: ``T >= e_b + B(b)``, ``B(b)`` the
  cheapest stage 0 of bucket ``<= b`` costing ``u + 2 t + AR`` followed by such a cover costing ``u + 2 t``
  (or by nothing).  So ``f3 = min_b (e_b + min(A(b), B(b)))`` with the Lagrange terms, positions told
  apart as in ``f1`` (and ``f3`` evaluated only then);

each minus ``lambda G``, and ``f = max(f1, f2, f3)``, maximised over the multipliers.  If
the optimal plan's time ``T*`` is below ``t``, every one of its stages qualifies at
``t`` (``busy + AR <= T* < t``) so the plan (every stage
replaced as above, any stage the pivot of ending 2) is one such sequence: its path
sums are ``<= T*`` and its Lagrange term ``<= 0``, so ``T* >= f(t)``.  Hence ``T* >=
min(t, f(t))`` for every ``t`` (``f(t) = inf`` when no sequence qualifies).  At ``t =
cap``, the longest stage time of any type that fits, every stage of every plan
qualifies whatever ``T*``, so ``T* >= f(cap)`` outright.  The bound is the largest of
these values over the ``t`` tried (a bisection between the work bound and the upper
end; each value holds on its own, the bisection needs no monotonicity), never below
:func:`pipeplan.solver.bounds.terms.work_bound`, lowered by :data:`ROUNDING_MARGIN` for the
float sums.

**Multipliers.**  Any ``mu >= 0`` gives a valid ``f``, so the multipliers are searched, not
derived: one per device class ``k`` (``g`` adds ``mu_k`` for every stage of slowest speed
``>= v_k``, ``G`` adds ``mu_k N_k``) and one on the speed weights (``g(v) = lambda v``,
``G = lambda V``).  The class counts are what binds on clusters with a few fast devices:
the speed weights alone charge a fast device no more per unit of speed than a slow one,
so a bound priced by them lets every stage run on the fastest class.  At each ``t`` a
coordinate ascent (:func:`_ascend`) starts from the best multipliers of the previous
``t``, from none and from the speed weights alone at :data:`SPEED_MULTIPLIER` (the best of the three),
moves one multiplier at a time by a step while ``f`` grows, halves the steps after a
round without a move, and stops after :data:`ASCENT_ROUNDS` rounds or once ``f >= t``:
a fixed sequence of evaluations, so the bound does not depend on the machine's speed.
The ascent evaluates ending 1 without positions (several times cheaper).  Then (with
``refine``) a cutting-plane search (:func:`_cut_search`, Kelley's method in a trust region)
evaluates ``f`` with positions, from the ascent's multipliers and from the previous ``t``'s
best; its cuts model ending 1 alone: a minimum over paths of functions linear in the multipliers,
hence concave, and the cheapest path's device use less the budgets, ``sum_s r_s g_k(v_s) - G_k``, is a
supergradient (read off the path's stage types); the cuts ``f1 <= f1(mu_i) + slope_i (mu -
mu_i)`` make an LP whose maximiser is the next point.  ``f(t)`` is the largest value seen,
ascent included.  The search is a search: the value at any ``mu >= 0`` holds, the cuts only
choose where to look; it makes at most :data:`CUT_STEPS` evaluations (a count, never the
clock), stops once ``f >= t``, once the cuts' maximum over the box is below ``t`` and the
bound so far (no point of the box gets ending 1 there), and once that maximum is at the best
point already (ending 1's maximum over the box).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from pipeplan.solver.space.arcs import tau_ops
from pipeplan.solver.bounds.terms import work_bound
from pipeplan.solver.space.class_stages import q_classes
from pipeplan.solver.space.device_classes import device_classes
from pipeplan.solver.evaluation.memory import stash_points
from pipeplan.solver.core.native_output import quiet_stdout
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit

ROUNDING_MARGIN = 1e-9
"""Relative amount the bound is lowered by: its sums run in another order than the simulator's."""

BISECTION_STEPS = 10
"""Geometric halvings of the bracket on ``t`` (a ratio ``hi / lo`` of 1,000 shrinks to 1.007): a fixed count,
so the bound does not depend on the machine's speed (only an expiring clock cuts it short)."""

SPEED_MULTIPLIER = 1.5
"""The speed weights' ``lambda`` the first ascent also starts from, as a multiple of ``work_bound / V``
(seconds per unit of summed speed): with speed weights alone the Lagrangian peaks near 1.5 on
experiments/bench_scale.py's instances at 256 and 1,024 devices."""

ASCENT_ROUNDS = 3
"""Rounds of the multipliers' coordinate ascent at each ``t``; a round without a move halves the steps.
Three: on experiments/bench_scale.py's 64- and 256-device instances the bound is no smaller than with five
(19.3 % and 25.4 % below the best plans against 20.1 % and 25.6 %) in half the time (2026-12-02)."""

POSITIONS = 16
"""Stage positions from the end told apart in ending 1 (``k = 0 .. POSITIONS - 1`` later stages, at most
``M``; any more share ``w_max``).  On experiments/bench_scale.py's 64- and 256-device instances (8 and 16
microbatches) the bound is 23.5 % and 27.4 % below the best plans with none told apart, 17.2 % and 23.0 %
with 8, 17.2 % and 22.6 % with 16 (2026-12-02); each costs one more table in ending 1's last evaluation at
each ``t``."""

CUT_STEPS = 8
"""Evaluations (positions told apart) of the cutting-plane search at each ``t`` (:func:`_cut_search`).  Eight:
on experiments/bench_scale.py's 64-, 256- and 1,024-device instances the bound is 13.8 %, 17.6 % and 23.8 %
below the best plans (16.8 %, 20.9 % and 26.6 % with the ascent alone), with five 14.9 %, 18.7 % and 24.2 %,
with twelve 13.8 %, 17.5 % and 23.8 % (2026-12-02)."""

CUT_BOX = 8.0
"""The cutting-plane search's box: each multiplier at most this many ascent steps (``work_bound / G_k``);
the multipliers of the best bounds on experiments/bench_scale.py's instances stay below 1.2."""

CUT_RADIUS = 0.25
"""The trust region's first half-width in ascent steps (doubled after a step that raises ending 1, halved
after one that does not).  Plain Kelley over the whole box reached 361.9 ms in 15 evaluations at ``t`` = 380
ms on experiments/bench_scale.py's 64-device instance, this region 366.8 ms in 5 and 369.3 ms in 15."""

STAGE_ONE_SHARE = 0.7
"""Ending 3's weight ``alpha`` of ending 1 against the ending at stage 1 (any value in ``[0, 1]`` holds).  On
experiments/bench_scale.py's instances the bound is 13.6, 12.3, 12.0, 12.3 and 13.0 % below the best plan at 64
devices with 0.5, 0.6, 0.7, 0.8 and 0.9, 23.4, 23.5, 23.4, 23.3 and 23.3 % at 1,024 (13.8 and 23.8 % without
ending 3) (2026-12-02)."""

DELTA_STEPS = 32
"""Buckets of the pivot's ``crit - u`` in ending 1 (``ceil(delta K / t)``, clipped to ``1 .. K``)."""


@dataclass(frozen=True)
class StageTypes:
    """Every stage type's terms, one row per type (class, replicas, recompute), one column per layer range."""

    lo: np.ndarray
    """First layer of each range."""
    hi: np.ndarray
    """One past the last layer of each range."""
    stage_time: np.ndarray
    """``busy + AR`` (term c); ``inf`` where the type does not fit in memory (term a)."""
    u: np.ndarray
    """``TF(n_min) + TB(n_min)``."""
    tf0: np.ndarray
    """``TF(n_0)``."""
    crit: np.ndarray
    """The pivot's critical ops (term d)."""
    allreduce: np.ndarray
    """Lower bound on ``AR`` (term b)."""
    send: np.ndarray
    """Lower bound ``t`` on one transfer across the cut after the range (term d, "Transfers"); 0 for the last."""
    replicas: np.ndarray
    """``r`` of each type (a column vector)."""
    speeds: np.ndarray
    """``v_c`` of each type (a column vector)."""
    extra: np.ndarray
    """``crit - u``: what the pivot adds to one microbatch's passes, with ``w_max`` of term (d)."""
    extra_at: np.ndarray
    """``crit - u`` with exactly ``k`` later stages, ``k = 0 .. min(POSITIONS, M) - 1`` (first axis; 1F1B only,
    else empty): the warm-up is ``w = min(k, M)``, so fewer forwards leave the critical ops."""
    fitting_extra: np.ndarray
    """``extra`` and ``extra_at`` of every type and range that fits in memory, sorted."""


def _link_bounds(problem: PlanningProblem, speed: float, r: int, room: int = 0) -> tuple[float, float]:
    """``(bw_ub, lat_lb)`` over the network and the servers holding ``r`` devices of speed ``>= speed`` and
    ``room`` devices more: term b's all-reduce (``room = 0``), a transfer to a neighbour (``room = 1``)."""
    cluster = problem.cluster
    held = Counter(d.server for d in cluster.devices if d.speed >= speed)
    every = Counter(d.server for d in cluster.devices)
    links = [cluster.network] + [s for s in cluster.servers if held[s.id] >= r and every[s.id] >= r + room]
    return max(l.bandwidth for l in links), min(l.latency for l in links)


def stage_types(problem: PlanningProblem, clock: TimeLimit | None = None) -> StageTypes | None:
    """The terms (a)-(d) of every stage type on every layer range (see the module docstring).

    ``None`` when ``clock`` expires first (checked once per class and replica count).
    """
    graph, sizes = problem.graph, problem.split
    layers, L, M = graph.layers, len(graph), len(sizes)
    vals = {"af": [l.fwd[0] for l in layers], "bf": [l.fwd[1] for l in layers], "ab": [l.bwd[0] for l in layers],
            "bb": [l.bwd[1] for l in layers], "par": [l.params for l in layers], "act": [l.act for l in layers]}
    lo, hi = (a.astype(np.int64) for a in np.triu_indices(L + 1, 1))
    # Each range is summed from its own first layer (in triu order), never as a difference of prefix
    # sums: against much larger earlier layers that difference loses more than ROUNDING_MARGIN.
    AF, BF, AB, BB, PAR, ACT = (np.concatenate([np.cumsum(np.array(vals[n][x:], dtype=float)) for x in range(L)])
                                for n in ("af", "bf", "ab", "bb", "par", "act"))
    INP = np.array([graph.stage_input_bytes(x) for x in range(L)])[lo]
    CUT = np.array([graph.cut_bytes(h - 1) if 0 < h < L else 0.0 for h in range(L + 1)])[hi]
    last = hi == L
    speeds_ge = {c.speed: sum(1 for d in problem.cluster.devices if d.speed >= c.speed)
                 for c in device_classes(problem.cluster)}
    flags = (False, True) if problem.allow_recompute else (False,)
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("stage_time", "u", "tf0", "crit", "allreduce", "send")}
    positioned = problem.needs.warmup_per_later_stage and not problem.needs.forwards_first
    at: list[list[np.ndarray]] = [[] for _ in range(min(POSITIONS, M) if positioned else 0)]
    replicas, speeds = [], []
    for c in device_classes(problem.cluster):
        most = speeds_ge[c.speed] if problem.allow_replication else 1
        for r, r_hi, q_vector in q_classes(sizes, most):  # the smallest r of each q vector stands for the class
            if clock is not None and clock.expired():
                return None
            send_bw, send_lat = _link_bounds(problem, c.speed, r, room=1)
            send = np.where(last, 0.0, send_lat + min(sizes) * CUT / (r_hi * send_bw))
            q = np.array(q_vector, dtype=float)
            qm, Q = -(-min(sizes) // r), float(q.sum())
            bw, lat = _link_bounds(problem, c.speed, r)
            ar = np.where(PAR > 0, 2 * (r - 1) * (lat + PAR / (r * bw)), 0.0) if r > 1 else np.zeros_like(PAR)
            # w_max of term d: 0 for the last stage, else min(L - hi, M); suffix sums of q past it
            w = np.where(last, 0, np.minimum(L - hi, M)) if problem.needs.warmup_per_later_stage \
                else np.full_like(hi, M)
            q_after = np.concatenate((np.cumsum(q[::-1])[::-1], [0.0]))  # q_after[k] = sum_{j >= k} q_j
            late_n, late_q = np.maximum(M - 1 - w, 0), q_after[np.minimum(w + 1, M)]
            v = c.speed
            for rc in flags:
                f_all = (M * AF + BF * Q) / v
                b_all = (M * AB + BB * Q) / v + (f_all if rc else 0.0)
                f_min = (AF + BF * qm) / v
                u = f_min + (AB + BB * qm) / v + (f_min if rc else 0.0)
                tf0 = (AF + BF * q[0]) / v
                crit = f_all + b_all if problem.needs.forwards_first else tf0 + b_all + (late_n * AF + BF * late_q) / v
                peak = problem.state_factor * PAR + _stash_peak(problem, q, last, INP, ACT, rc)
                fits = peak <= c.memory * (1 + ROUNDING_MARGIN)
                rows["stage_time"].append(np.where(fits, f_all + b_all + ar, np.inf))
                for name, value in (("u", u), ("tf0", tf0), ("crit", crit), ("allreduce", ar), ("send", send)):
                    rows[name].append(np.broadcast_to(value, lo.shape).astype(float))
                for k, column in enumerate(at):  # k later stages: F_1 .. F_min(k, M-1) run before B_0
                    skipped = min(k, M - 1)
                    early = (skipped * AF + BF * float(q[1:skipped + 1].sum())) / v
                    column.append(f_all + b_all - early - u)
                replicas.append(r)
                speeds.append(c.speed)
    stack = {k: np.vstack(v) for k, v in rows.items()}
    return StageTypes(lo, hi, stack["stage_time"], stack["u"], stack["tf0"], stack["crit"], stack["allreduce"],
                      stack["send"],
                      np.array(replicas, dtype=float)[:, None], np.array(speeds, dtype=float)[:, None],
                      stack["crit"] - stack["u"],
                      np.array([np.vstack(column) for column in at]).reshape(len(at), *stack["u"].shape),
                      _fitting_deltas(stack["crit"] - stack["u"], at, stack["stage_time"]))


def _fitting_deltas(extra: np.ndarray, at: list[list[np.ndarray]], stage_time: np.ndarray) -> np.ndarray:
    """Every ``delta`` a stage that fits can have, ``w_max``'s and each position's, sorted: ``e_b`` is a
    smallest ``delta`` of bucket ``>= b``, and a pivot at ``k < POSITIONS`` later stages has its own."""
    fits = np.isfinite(stage_time)
    return np.sort(np.concatenate([extra[fits]] + [np.vstack(column)[fits] for column in at]))


def _stash_peak(problem: PlanningProblem, q: np.ndarray, last: np.ndarray, inputs: np.ndarray,
                act: np.ndarray, recompute: bool) -> np.ndarray:
    """Stash peak per range with the smallest warm-up a stage there can have (term a)."""
    M = len(q)
    qs = [int(x) for x in q]

    def peak(w: int) -> np.ndarray:
        points = stash_points(tau_ops(problem.schedule, M, w), qs)
        if recompute:
            return np.max(np.outer(inputs, points[:, 0]) + np.outer(act, points[:, 1]), axis=1)
        return act * points[:, 0].max()

    if problem.needs.forwards_first:
        return peak(0)
    return np.where(last, peak(0), peak(min(1, M)))


@dataclass(frozen=True)
class _Allowed:
    """The (type, range) pairs qualifying at one ``t`` (``stage_time <= t``), sorted by range then type, and
    the path terms there that do not depend on the multipliers: every evaluation at ``t`` works on these."""

    rows: np.ndarray
    """Each pair's type."""
    columns: np.ndarray
    """Each pair's range."""
    used: np.ndarray
    """The ranges with a pair, ascending."""
    starts: np.ndarray
    """Where each range of ``used`` starts among the pairs."""
    cells: np.ndarray
    """Each range of ``used`` as a flat index into an ``(L+1) x (L+1)`` matrix."""
    passes: np.ndarray
    """``u + 2 t`` (a pass, both ways across the cut after the stage)."""
    first: np.ndarray
    """``AR`` on a range starting at layer 0, else 0 (ending 1's stage 0 all-reduces)."""
    before: np.ndarray
    """``TF(n_0) + t`` (ending 2, a stage before the pivot)."""
    pivot: np.ndarray
    """``crit + 2 t + AR`` (ending 2's pivot)."""
    allreduce: np.ndarray
    """``AR`` (ending 3's stage 1)."""


def _allowed(types: StageTypes, t: float, L: int) -> _Allowed:
    """The qualifying pairs at ``t`` and their terms (:class:`_Allowed`)."""
    columns, rows = np.nonzero((types.stage_time <= t).T)
    used, starts = np.unique(columns, return_index=True)
    at = (rows, columns)
    return _Allowed(rows, columns, used, starts, types.lo[used] * (L + 1) + types.hi[used],
                    types.u[at] + 2 * types.send[at], (types.lo[columns] == 0) * types.allreduce[at],
                    types.tf0[at] + types.send[at], types.crit[at] + 2 * types.send[at] + types.allreduce[at],
                    types.allreduce[at])


def _best(allowed: _Allowed, cost: np.ndarray, L: int) -> np.ndarray:
    """``(L+1) x (L+1)`` matrix of the cheapest allowed pair's ``cost`` per range (``inf`` if none)."""
    out = np.full((L + 1) * (L + 1), np.inf)
    if len(cost):
        out[allowed.cells] = np.minimum.reduceat(cost, allowed.starts)
    return out.reshape(L + 1, L + 1)


def _shortest(before: np.ndarray, pivot: np.ndarray, after: np.ndarray) -> float:
    """Cheapest cover of ``[0, L)``: stages of ``before`` cost, one ``pivot``, then ``after`` ones."""
    L = before.shape[0] - 1
    head, tail = np.full(L + 1, np.inf), np.full(L + 1, np.inf)
    head[0] = 0.0
    for h in range(1, L + 1):
        head[h] = np.min(head[:h] + before[:h, h])
        tail[h] = min(np.min(head[:h] + pivot[:h, h]), np.min(tail[:h] + after[:h, h]))
    return float(tail[L])


def _bucket_of(delta: np.ndarray, t: float) -> np.ndarray:
    """``ceil(delta K / t)`` clipped to ``1 .. K`` (``K`` = :data:`DELTA_STEPS`): monotone in ``delta``, as a
    float product and ``ceil`` are."""
    return np.clip(np.ceil(delta * (DELTA_STEPS / t)), 1, DELTA_STEPS).astype(np.int64)


def _bucket_tables(types: StageTypes, allowed: _Allowed, t: float,
                   positioned: bool) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per level of ending 1 (positions, then ``w_max``) what depends on ``t`` alone.

    The allowed pairs' buckets; the pairs sorted by range then bucket; where each (range, bucket) group
    starts among them; the group's cell in a (range of ``allowed.used``, bucket) table.
    """
    levels = (list(types.extra_at) if positioned else []) + [types.extra]  # the last level: every other position
    slot = np.searchsorted(allowed.used, allowed.columns)
    out = []
    for deltas in levels:
        bucket = _bucket_of(deltas[allowed.rows, allowed.columns], t)
        order = np.lexsort((bucket, allowed.columns))
        cell = slot[order] * DELTA_STEPS + bucket[order] - 1
        starts = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1]))) if len(cell) else cell
        out.append((bucket, order, starts, cell[starts]))
    return out


def _covers(types: StageTypes, allowed: _Allowed, cost: np.ndarray, t: float, L: int, positioned: bool,
            prepared: dict) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
    """Ending 1's covers ``C(i)`` (module docstring) for the allowed pairs' ``cost``.

    Returns the levels (:func:`_bucket_tables`; they and ``e_i`` are kept in ``prepared`` for one ``t``), the tables of
    :func:`_bucket_matrices`, ``rest`` of :func:`_cover_by_position` (``C(i)`` with ``k`` stages) and ``e_i``.
    With :attr:`StageTypes.extra_at` and ``positioned``, a stage with ``k < POSITIONS`` later stages is filtered
    by its ``delta`` at ``k``, any other by ``w_max``'s; otherwise every stage by ``w_max``'s (a smaller bound,
    one table of ranges instead of ``POSITIONS + 1``).
    """
    if positioned not in prepared:
        prepared[positioned] = _bucket_tables(types, allowed, t, positioned)
    if "e" not in prepared:
        prepared["e"] = _smallest_deltas(types, t)
    levels = prepared[positioned]
    tables = _bucket_matrices(levels, allowed, cost, L, _buffer(prepared, ("tables", positioned), levels, L))
    return levels, tables, _cover_by_position(tables), prepared["e"]


def _buffer(prepared: dict, key: tuple, levels: list, L: int) -> np.ndarray:
    """A ``DELTA_STEPS x levels x (L+1) x (L+1)`` array of ``inf`` kept for one ``t``: :func:`_bucket_matrices`
    writes the same cells at every evaluation there, so the others stay ``inf``."""
    if key not in prepared:
        prepared[key] = np.full((DELTA_STEPS, len(levels), L + 1, L + 1), np.inf)
    return prepared[key]


def _bucket_matrices(levels: list, allowed: _Allowed, cost: np.ndarray, L: int, out: np.ndarray) -> np.ndarray:
    """Per bucket ``i``, level and range the cheapest allowed pair's ``cost`` among those of bucket ``<= i``:
    ``DELTA_STEPS x levels x (L+1) x (L+1)``, ``inf`` where none, written into ``out`` (a :func:`_buffer`)."""
    matrices = out.reshape(DELTA_STEPS, len(levels), (L + 1) * (L + 1))
    for level, (_, order, starts, cells) in enumerate(levels):
        dense = np.full((len(allowed.used), DELTA_STEPS), np.inf)  # (range, bucket): the cheapest type
        if len(order):
            dense.ravel()[cells] = np.minimum.reduceat(cost[order], starts)
        np.minimum.accumulate(dense, axis=1, out=dense)  # of the buckets up to i
        matrices[:, level, allowed.cells] = dense.T
    return out


def _smallest_deltas(types: StageTypes, t: float) -> np.ndarray:
    """``e_i``: the smallest ``delta`` a fitting stage can have among those of bucket ``i`` or later."""
    known = types.fitting_extra
    if not len(known):
        return np.full(DELTA_STEPS, np.inf)
    first = np.searchsorted(_bucket_of(known, t), np.arange(1, DELTA_STEPS + 1), side="left")
    return np.where(first < len(known), known[np.minimum(first, len(known) - 1)], np.inf)


def _largest_pivot(allowed: _Allowed, covers: tuple, cost: np.ndarray, L: int, chosen: list | None = None) -> float:
    """Ending 1 with the pivot the stage of largest ``delta = crit - u``: ``min_i e_i + C(i)`` (module docstring).

    ``covers``: :func:`_covers` of the allowed pairs' ``cost``.  ``chosen``, when given, receives the cheapest
    path's stage types.
    """
    levels, tables, rest, smallest = covers
    total = smallest + rest[:, 0, :].min(axis=1)
    if chosen is not None and np.isfinite(total.min()):
        g = int(np.argmin(total))
        for level, lo, hi in _walk_by_position(tables[g], rest[g]):
            at = np.searchsorted(allowed.used, _range_index(lo, hi, L))
            pairs = np.arange(allowed.starts[at], allowed.starts[at + 1] if at + 1 < len(allowed.used)
                              else len(cost))
            fit = pairs[levels[level][0][pairs] <= g + 1]
            chosen.append(int(allowed.rows[fit[np.argmin(cost[fit])]]))
    return float(np.min(total))


def _stage_one_ending(allowed: _Allowed, covers: tuple, extra: np.ndarray, L: int, prepared: dict) -> float:
    """Ending 3 (module docstring): ``min_i e_i + min(A(i), B(i))``, positions told apart as in ending 1.

    ``covers``: ending 1's (:func:`_covers`); ``extra``: each allowed pair's Lagrange term; ``prepared``: what
    is kept for one ``t``.
    """
    levels, tables, rest, smallest = covers
    share, last = STAGE_ONE_SHARE, rest.shape[2] - 1
    # A(i): stage 0 on [0, h) with k + 1 later stages, stage 1 on [h, h2) with k, C(i)'s cover of [h2, L)
    second = _bucket_matrices(levels, allowed, allowed.passes + (1 - share) * allowed.allreduce + extra, L,
                              _buffer(prepared, ("stage 1",), levels, L))
    after_first = np.full((DELTA_STEPS, last + 1, L + 1), np.inf)  # (i, k, h)
    ahead = rest.transpose(0, 2, 1)
    for h in range(1, L):
        after_first[:, :, h] = np.min(second[:, :, h, h + 1:] + ahead[:, :, h + 1:], axis=2)
    first = _first_stages(levels, allowed, share * (allowed.passes + allowed.first)
                          + (1 - share) * allowed.before + extra, L)
    spread = np.min(first[:, np.minimum(np.arange(last + 1) + 1, last), :] + after_first, axis=(1, 2))
    # B(i): stage 0 the pivot at ending 1's cost, every later stage of a lower bucket (C(i - 1)'s cover)
    lower = np.full_like(rest, np.inf)
    lower[0, L, 0] = 0.0  # no later stage
    lower[1:] = rest[:-1]
    alone = np.min(tables[:, :, 0, :] + lower.transpose(0, 2, 1), axis=(1, 2))
    return float(np.min(smallest + np.minimum(spread, alone)))


def _first_stages(levels: list, allowed: _Allowed, cost: np.ndarray, L: int) -> np.ndarray:
    """Per bucket ``i``, level and ``h`` the cheapest allowed pair's ``cost`` on ``[0, h)`` among those of bucket
    ``<= i``: ``DELTA_STEPS x levels x (L+1)``."""
    head = int(np.searchsorted(allowed.columns, L))  # the ranges [0, h) come first, at column h - 1
    out = np.full((len(levels), L + 1, DELTA_STEPS), np.inf)
    for level, (bucket, *_) in enumerate(levels):
        np.minimum.at(out[level], (allowed.columns[:head] + 1, bucket[:head] - 1), cost[:head])
    np.minimum.accumulate(out, axis=2, out=out)
    return out.transpose(2, 0, 1)


def _range_index(lo: int, hi: int, L: int) -> int:
    """The column of range ``[lo, hi)`` in :class:`StageTypes` (``np.triu_indices(L + 1, 1)`` order)."""
    return lo * L - lo * (lo - 1) // 2 + (hi - lo - 1)


def _walk_by_position(cost: np.ndarray, rest: np.ndarray) -> list[tuple[int, int, int]]:
    """The stages ``(level, lo, hi)`` of the cheapest cover in :func:`_cover_by_position`'s tables of one bucket."""
    L, K = cost.shape[-1] - 1, cost.shape[0]
    lo, after, stages = 0, int(np.argmin(rest[0])), []
    while lo < L:
        # the first stage of a cover of [lo, L) by `after` stages (K-1: that many or more) has after-1 behind it
        levels = sorted({max(after - 1, 0), K - 1} if after == K - 1 else {after - 1})
        level, h = min(((k, lo + 1 + int(np.argmin(cost[k, lo, lo + 1:] + rest[lo + 1:, k]))) for k in levels),
                       key=lambda kh: cost[kh[0], lo, kh[1]] + rest[kh[1], kh[0]])
        stages.append((level, lo, h))
        lo, after = h, level
    return stages


def _cover_by_position(cost: np.ndarray) -> np.ndarray:
    """Cheapest cover of ``[0, L)`` per bucket, a stage costing ``cost[g, k, lo, hi]`` with ``k`` later stages.

    ``k`` runs over the levels ``0 .. K-1`` of the second axis, the last level standing for ``K-1`` or more.
    Built from the end: ``rest[g, h, k]`` covers ``[h, L)`` with ``k`` stages; returns ``rest``.
    """
    groups, K, L = cost.shape[0], cost.shape[1], cost.shape[-1] - 1
    rest = np.full((groups, L + 1, K), np.inf)
    rest[:, L, 0] = 0.0
    for lo in range(L - 1, -1, -1):
        ahead = cost[:, :, lo, lo + 1:] + rest[:, lo + 1:, :].transpose(0, 2, 1)  # (g, k, h)
        stage = ahead.min(axis=2)  # the stage [lo, h) with k stages after it
        rest[:, lo, 1:] = stage[:, :-1]
        rest[:, lo, K - 1] = np.minimum(rest[:, lo, K - 1], stage[:, K - 1])
    return rest


def _path_value(types: StageTypes, t: float, weight: np.ndarray, lam: float, budget: float, L: int,
                positioned: bool = True, prepared: dict | None = None, chosen: list | None = None) -> float:
    """``f(t)`` of the module docstring for one weighting ``lam * weight`` of the stage types: the largest
    ending (ending 3 with ``positioned`` alone), less ``lam * budget``.  ``prepared``: what
    :func:`_covers` keeps for one ``t``, and the qualifying pairs (:func:`_allowed`); ``chosen``: ending 1's
    types, with its value at ``prepared["ending 1"]``."""
    prepared = {} if prepared is None else prepared
    if "allowed" not in prepared:
        prepared["allowed"] = _allowed(types, t, L)
    allowed = prepared["allowed"]
    extra = (lam * types.replicas * weight)[allowed.rows, 0]
    u = allowed.passes + extra
    covers = _covers(types, allowed, u + allowed.first, t, L, positioned, prepared)
    ending_at_stage0 = _largest_pivot(allowed, covers, u + allowed.first, L, chosen)
    ending_at_pivot = _shortest(_best(allowed, allowed.before + extra, L),
                                _best(allowed, allowed.pivot + extra, L), _best(allowed, u, L))
    ending_at_stage1 = _stage_one_ending(allowed, covers, extra, L, prepared) if positioned else -math.inf
    prepared["ending 1"] = ending_at_stage0 - lam * budget
    return max(ending_at_stage0, ending_at_pivot, ending_at_stage1) - lam * budget


def _value_and_slope(types: StageTypes, t: float, weights: list[tuple[np.ndarray, float]], mu: np.ndarray,
                     L: int, prepared: dict | None = None) -> tuple[float, float, np.ndarray]:
    """``f(t)`` at multipliers ``mu`` (positions told apart), ending 1's value and its slope in ``mu``.

    Ending 1 is a minimum over paths of functions linear in ``mu``, so the cheapest path's device use less the
    budgets, ``sum_s r_s g_k(v_s) - G_k`` per constraint, is a supergradient of it (concave in ``mu``).
    """
    prepared = {} if prepared is None else prepared
    weight = sum(m * column for m, (column, _) in zip(mu, weights))
    budget = sum(m * total for m, (_, total) in zip(mu, weights))
    chosen: list[int] = []
    f = _path_value(types, t, weight, 1.0, budget, L, True, prepared, chosen)
    used = np.array([sum(float(types.replicas[row, 0] * column[row, 0]) for row in chosen) for column, _ in weights])
    return f, prepared["ending 1"], used - np.array([total for _, total in weights])


class _CutModel:
    """The cutting-plane model ``max z, z <= f_i + slope_i . (mu - mu_i)``, ``mu = x * scale``,
    ``0 <= x <= CUT_BOX``: one HiGHS LP, a row added per cut."""

    def __init__(self, size: int, scale: np.ndarray) -> None:
        import highspy

        with quiet_stdout():  # HiGHS prints its banner from C++ when a model is created
            self.highs = highspy.Highs()
        self.highs.setOptionValue("output_flag", False)
        self.highs.setOptionValue("threads", 1)
        self.size, self.scale, self.inf = size, scale, highspy.kHighsInf
        for k in range(size):
            self.highs.addVar(0.0, CUT_BOX)
        self.highs.addVar(-self.inf, self.inf)  # z
        self.highs.changeColCost(size, 1.0)
        self.highs.changeObjectiveSense(highspy.ObjSense.kMaximize)
        self.ok = highspy.HighsModelStatus.kOptimal

    def add(self, value: float, mu: np.ndarray, slope: np.ndarray) -> None:
        """The cut at ``mu``: ``z - (slope * scale) . x <= value - slope . mu``."""
        coefficients = np.concatenate((-slope * self.scale, [1.0]))
        self.highs.addRow(-self.inf, float(value - slope @ mu), self.size + 1,
                          np.arange(self.size + 1, dtype=np.int32), coefficients)

    def maximise(self, center: np.ndarray | None = None, radius: float = CUT_BOX) -> tuple[float, np.ndarray | None]:
        """The model's maximum over the box, or over its part within ``radius`` (in ``x``) of ``center`` (in
        ``mu``), and the multipliers reaching it (``None`` if the LP fails)."""
        x0 = np.zeros(self.size) if center is None else center / self.scale
        upper = np.minimum(x0 + radius, CUT_BOX)
        lower = np.minimum(np.maximum(x0 - radius, 0.0), upper)  # a center outside the box: its face
        for k in range(self.size):
            self.highs.changeColBounds(k, float(lower[k]), float(upper[k]))
        self.highs.run()
        if self.highs.getModelStatus() != self.ok:
            return math.inf, None
        x = np.array(self.highs.getSolution().col_value)
        return float(x[self.size]), np.clip(x[:self.size], lower, upper) * self.scale


def _cut_search(types: StageTypes, t: float, weights: list[tuple[np.ndarray, float]], L: int,
                starts: list[tuple[float, ...]], scale: np.ndarray, best_known: float,
                steps: int, prepared: dict | None = None,
                clock: TimeLimit | None = None) -> tuple[float, tuple[float, ...], int]:
    """Kelley's cutting planes on ending 1 over multipliers ``mu = x * scale``, ``0 <= x <= CUT_BOX``.

    Each step evaluates ``f`` at one point (the starts first, then the maximiser of the cuts' model, an LP
    over the box) and adds the cut ``f1(mu') <= f1(mu) + slope . (mu' - mu)``.  Returns the largest ``f``
    seen, its multipliers and the evaluations made: at most ``steps``, fewer once ``f >= t``, once the
    model's maximum over the box (an upper bound on ending 1 there) is below both ``t`` and ``best_known``,
    or once it is no more than ending 1 at the trust region's center (that is ending 1's maximum).  The LP's
    points lie within the trust region, a box around the best point of ending 1 (module docstring).  An
    expiring ``clock`` stops it after any evaluation but the first.
    """
    model = _CutModel(len(scale), scale)
    best, best_mu, made = -math.inf, starts[0], 0
    center, center_f1, radius = None, -math.inf, CUT_RADIUS
    queue = [np.asarray(mu, dtype=float) for mu in starts]
    while made < steps and queue and not (made and clock is not None and clock.expired()):
        mu = queue.pop(0)
        f, f1, slope = _value_and_slope(types, t, weights, mu, L, prepared)
        made += 1
        if f > best:
            best, best_mu = f, tuple(float(m) for m in mu)
        if best >= t or not math.isfinite(f1):
            break
        model.add(f1, mu, slope)
        if f1 > center_f1:  # a serious step: the trust region moves there and grows
            center, center_f1, radius = mu, f1, (2 * radius if center is not None else radius)
        elif not queue:
            radius /= 2  # a null step: the new cut sharpens the model, the region shrinks
        if queue:
            continue
        top, _ = model.maximise()  # over the whole box: an upper bound on ending 1 there
        if top < t and top <= best_known or top <= center_f1 + 1e-9 * abs(center_f1):
            break  # f < t at every point of the box and none raises the bound, or the center is the maximum
        _, proposal = model.maximise(center, radius)
        if proposal is None:
            break
        queue.append(proposal)
    return best, best_mu, made


def device_weights(problem: PlanningProblem, types: StageTypes) -> list[tuple[np.ndarray, float]]:
    """The constraints of term (e) the multipliers price, as ``(g per stage type, G)``.

    One per device class ``k``, fastest first: ``g = 1`` on the types of slowest speed ``>= v_k``
    (``N_k`` devices of speed ``>= v_k`` hold them all); then the speed weights ``g(v) = v``, ``G = V``.
    """
    speeds = sorted({d.speed for d in problem.cluster.devices}, reverse=True)
    counts = [(types.speeds >= v).astype(float) for v in speeds]
    held = [float(sum(1 for d in problem.cluster.devices if d.speed >= v)) for v in speeds]
    total = float(sum(d.speed for d in problem.cluster.devices))
    return list(zip(counts, held)) + [(types.speeds, total)]


def _ascend(evaluate, starts: list[tuple[float, ...]], steps: list[float], t: float,
            clock: TimeLimit | None, rounds: int = ASCENT_ROUNDS) -> tuple[float, tuple[float, ...]] | None:
    """Coordinate ascent of ``evaluate`` over multipliers ``>= 0`` (module docstring, "Multipliers").

    Returns the largest value seen and its multipliers, or ``None`` when ``clock`` expires first.
    Stops early once a value reaches ``t`` (only ``min(t, f)`` is used).
    """
    best, best_mu = -math.inf, starts[0]
    for mu in starts:
        if clock is not None and clock.expired():
            return None
        f = evaluate(mu)
        if f > best:
            best, best_mu = f, mu
    step = list(steps)
    for _ in range(rounds):
        moved = False
        for k in range(len(step)):
            for sign in (1.0, -1.0):
                while best < t:
                    trial = best_mu[:k] + (max(0.0, best_mu[k] + sign * step[k]),) + best_mu[k + 1:]
                    if trial == best_mu:
                        break
                    if clock is not None and clock.expired():
                        return None
                    f = evaluate(trial)
                    if f <= best:
                        break
                    best, best_mu, moved = f, trial, True
        if best >= t:
            break
        if not moved:
            step = [x / 2 for x in step]
    return best, best_mu


def class_bound(problem: PlanningProblem, clock: TimeLimit | None = None, upper: float | None = None,
                refine: bool = True) -> float:
    """A proved lower bound on the iteration time of every plan of ``problem`` (module docstring).

    Parameters
    ----------
    problem : PlanningProblem
        A version-1 problem (``gpipe`` or ``1f1b``).  With free microbatch sizes
        only :func:`pipeplan.solver.bounds.terms.work_bound` is returned.
    clock : TimeLimit, optional
        Checked between evaluations; when it expires the best bound so far is returned.
    upper : float, optional
        A time no bound needs to exceed (an incumbent's): the search's upper end.  Without
        it, the longest stage that fits in memory.
    refine : bool
        Search the multipliers (ascent and cutting planes) and count positions (module
        docstring).  Without, only the two starting multipliers and ``w_max``: a smaller
        bound in a fraction of the time.

    Returns
    -------
    float
        At least ``work_bound(problem)`` (less the rounding margin); ``inf`` when no
        sequence of stages that fit in memory covers the layers (no plan fits).

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> g = LayerGraph.chain("g", [Layer(f"l{i}", (0, 1), (0, 2), 0, 0, 0) for i in range(2)], input_bytes=0)
    >>> two = tuple(Device(f"d{i}", "s0", 1, 1e12) for i in range(2))
    >>> p = PlanningProblem(g, Cluster("c", (Link(1e9, 0, "s0"),), Link(1e9, 0), two), global_batch=2,
    ...                     microbatches=2, allow_replication=False)
    >>> 8.7 < class_bound(p) <= 9.0  # the best plan, a layer per device under 1F1B, takes 9 s
    True
    """
    floor = work_bound(problem)
    if problem.free_sizes or problem.needs.several_stages or (clock is not None and clock.expired()):
        return floor
    types = stage_types(problem, clock)
    if types is None:
        return floor
    L = len(problem.graph)
    weights = device_weights(problem, types)
    steps = [floor / budget if budget > 0 else 0.0 for _, budget in weights]
    none = tuple(0.0 for _ in weights)
    by_speed = none[:-1] + (SPEED_MULTIPLIER * steps[-1],)
    previous: list[tuple[float, ...]] = []
    cut_previous: list[tuple[float, ...]] = []
    scale = np.array(steps)
    bound_so_far = [floor]  # the best min(t, f(t)) so far, read by the cutting planes' stop

    def value(t: float) -> float:
        """``f(t)`` at the best multipliers the ascent finds (each is a valid ``f``); ``-inf`` once out of time."""
        prepared: dict = {}  # what ending 1 needs at this t alone

        def evaluate(mu: tuple[float, ...], positioned: bool = False) -> float:
            weight = sum(m * column for m, (column, _) in zip(mu, weights))
            budget = sum(m * total for m, (_, total) in zip(mu, weights))
            return _path_value(types, t, weight, 1.0, budget, L, positioned, prepared)

        # from where the previous t ended, and from the speed weights alone (so never below that bound)
        found = _ascend(evaluate, list(dict.fromkeys(previous + [none, by_speed])), steps, t, clock,
                        ASCENT_ROUNDS if refine else 0)
        if found is None:
            return -math.inf
        f, mu = found
        previous[:] = [mu]
        if f >= t or not len(types.extra_at) or not refine:
            return f
        # the ascent prices stages by w_max alone; the positions only raise f, at its multipliers and at
        # those the cutting planes find from there and from the previous t's
        starts = list(dict.fromkeys([mu] + cut_previous))
        cut, cut_mu, _ = _cut_search(types, t, weights, L, starts, scale, bound_so_far[0], CUT_STEPS,
                                     prepared, clock)
        cut_previous[:] = [cut_mu]
        return max(f, cut)

    fitting = types.stage_time[np.isfinite(types.stage_time)]
    if not fitting.size:
        return math.inf  # no stage fits in memory (term a): no plan fits
    # from the longest fitting stage on, every fitting type qualifies and f stays at f(cap)
    cap = float(fitting.max())
    if cap <= 0:
        return floor  # nothing costs time (a zero-cost graph): the terms below divide by t
    at_cap = value(cap)
    if at_cap >= cap:
        return max(floor, at_cap) * (1 - ROUNDING_MARGIN)
    best, lo, hi = max(floor, at_cap), floor, cap if upper is None else min(cap, upper)
    bound_so_far[0] = best
    for _ in range(BISECTION_STEPS):
        if clock is not None and clock.expired():
            break  # every min(t, f(t)) so far holds
        t = math.sqrt(lo * hi) if lo > 0 else 0.5 * (lo + hi)  # geometric: the bracket may span decades
        f = value(t)
        best = max(best, min(t, f))
        bound_so_far[0] = best
        lo, hi = (t, hi) if f >= t else (lo, t)
    return best * (1 - ROUNDING_MARGIN)
