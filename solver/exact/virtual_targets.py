"""A bound per group count from linear programs at a target time (:class:`TargetLP`, :func:`target_bound`).

The version-2 model of :mod:`pipeplan.solver.exact.virtual_model` is hard to solve as a MILP for middle
group counts: its linear relaxation lets a group be a fraction of each type, and a fraction ``1/8`` of a
type with 8 replicas runs its share of the layers 8 times faster per sample than one device, for one
device's worth of the device count.  The relaxation then sits near the cluster-wide work bound, and
branch and bound does not raise it in seconds.

For a target ``T*`` the model takes two more kinds of rows (``build_rows(..., capacity=True)``):

- ``T <= T*``;
- for each group ``p`` and type ``tau``, the *capacity row*
  ``sum over p's stages s and units u of (work + tail)[tau, u] x[u, s, tau] + 2 (r - 1) lat z[p, tau]
  <= T* z[p, tau]``.

Proof that every plan with ``R`` groups and iteration time ``T <= T*`` satisfies them (with the columns
the model gives it).  If group ``p`` has type ``tau`` (``z = 1``), the left side is at most ``W_p + AR_p
+ STEP_p``: ``p`` runs every action of its stages one at a time, then all-reduces and steps, all before
``T`` (spec 7.3), and the model's coefficients never exceed the real durations.  So it is at most ``T <=
T*``.  For another type both sides are 0.  Hence, when the linear relaxation (every column continuous) of
the rows at ``T*`` has no solution, every plan with ``R`` groups takes longer than ``T*``.  The rows only
tighten as ``T*`` falls, so a bisection on ``T*`` (:func:`target_bound`) finds the largest target proved
infeasible, within :data:`TOLERANCE`.  With ``z`` fractional, the capacity rows let a fraction ``z`` of a
type carry at most ``z T*`` of that type's time, which the relaxation without them does not see.

The programs are solved by HiGHS's dual simplex, one after another on one model whose target entries
change (a warm start), with times in milliseconds (in seconds, HiGHS answered "unknown" after 40 s on
programs it proves infeasible in 0.6 s in milliseconds).  A program the simplex ends with neither answer
(at :data:`LP_ITERATIONS`, or "unknown") is solved again by HiGHS's interior point method.  A target not
proved infeasible by either counts as not proved, which only lowers the bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pipeplan.solver.core.native_output import quiet_stdout
from pipeplan.solver.exact.linear import LinearModel

TOLERANCE = 2e-3
"""Relative width of the target interval at which the bisection stops: the bound found is at most this far
below the largest target the relaxation proves infeasible (7 or 8 programs per group count from the
cluster-wide bound to a plan 35 % above it)."""

LP_ITERATIONS = 10_000
"""Simplex iterations per program (counted work): a program that reaches them proves nothing.  On
``bench_solvers``' 64 x 16 instance most programs take 60 to 7,000 iterations; near its threshold, a program
with 13 groups of 4 stages ran 17,500 iterations in 7.8 s and ended "unknown"."""

IPM_ITERATIONS = 200
"""Interior-point iterations of the program solved again when the simplex ends with neither answer (counted work).
Near its threshold, the 13-group program above took 19 of them and 0.75 s to prove infeasibility."""

MAX_DOUBLINGS = 6
"""Most doublings of the target, from the cluster-wide bound, in search of one the relaxation does not rule out:
up to 64 times that bound, where the target entries stay of the size of the model's times (at ``1e19`` HiGHS
answered "infeasible" for a model with a plan at 38.5 s, in ``tests/test_virtual_model.py``).  Past it, the
last target proved is the bound, and the group count's model decides the rest."""


def set_target(model: LinearModel, target: float) -> None:
    """Give ``model``'s target entries (:attr:`LinearModel.target_terms`) their coefficient ``constant - target``
    and its objective the upper bound ``target``, in place."""
    for row, column, constant in model.target_terms:
        at = model.starts[row] + model.index[model.starts[row]:model.starts[row + 1]].index(column)
        model.value[at] = constant - target
    model.upper[model.objective] = target


class TargetLP:
    """The linear relaxation of one group count's model with capacity rows, solved at one target after another.

    Parameters
    ----------
    model : LinearModel
        Rows from ``build_rows(..., capacity=True)``; its integrality is dropped.
    seconds : callable, optional
        The seconds each program may take (a clock's remaining time); it ends unproved when they run out.

    Examples
    --------
    >>> m = LinearModel()
    >>> t, z = m.var("T"), m.var("z", 0, 1)
    >>> m.objective = t
    >>> m.row([(z, 1.0)], 1, 1)                      # the group has its one type
    >>> m.row([(z, 1.0)], -math.inf, 0)              # 3 s of work <= target * z
    >>> m.target_terms.append((1, z, 3.0))
    >>> lp = TargetLP(m)
    >>> lp.infeasible_at(2.9), lp.infeasible_at(3.1)
    (True, False)
    """

    def __init__(self, model: LinearModel, seconds: Callable[[], float] = lambda: math.inf) -> None:
        import highspy

        self._highspy = highspy
        with quiet_stdout():
            h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        h.setOptionValue("random_seed", 0)
        h.setOptionValue("simplex_iteration_limit", LP_ITERATIONS)
        h.setOptionValue("ipm_iteration_limit", IPM_ITERATIONS)
        lp = model.highs_lp()
        lp.integrality_ = []
        h.passModel(lp)
        self._h, self._model = h, model
        self.seconds = seconds
        """The seconds each program may take from now (a clock's ``remaining``; replaced to solve on under another)."""
        self.timed_out = False
        """Whether a program ended at its time limit (the clock), unanswered."""

    def infeasible_at(self, target: float) -> bool:
        """Whether the relaxation has no solution with ``T <= target``: then no plan of the group count is that fast."""
        h = self._h
        for row, column, constant in self._model.target_terms:
            h.changeCoeff(row, column, constant - target)
        h.changeColBounds(self._model.objective, 0.0, target)
        h.setOptionValue("time_limit", float(max(0.01, min(self.seconds(), 1e6))))
        h.run()
        status = self._status()
        if status is None:  # the simplex stopped at its iterations, or in numerical trouble: the interior point method
            h.setOptionValue("solver", "ipm")
            h.clearSolver()
            h.run()
            status = self._status()
            h.setOptionValue("solver", "choose")
        self.timed_out |= status is None and h.getModelStatus() == self._highspy.HighsModelStatus.kTimeLimit
        return bool(status)

    def _status(self) -> bool | None:
        """``True`` infeasible (T >= 0 is minimised, so never unbounded), ``False`` solved, ``None`` neither."""
        code = self._h.getModelStatus()
        states = self._highspy.HighsModelStatus
        if code in (states.kInfeasible, states.kUnboundedOrInfeasible):
            return True
        return False if code == states.kOptimal else None


def target_bound(infeasible_at: Callable[[float], bool], proved: float, cap: float,
                 stop: Callable[[], bool] = lambda: False) -> float:
    """The largest target ``infeasible_at`` proves, by bisection between ``proved`` and ``cap``.

    Parameters
    ----------
    infeasible_at : callable
        ``target -> bool``: whether no plan is that fast (:meth:`TargetLP.infeasible_at`); must be monotone.
    proved : float
        A bound already known (the cluster-wide work bound), where the bisection starts.
    cap : float
        No need to prove more (the incumbent plan, or the smallest bound of another group count); ``inf``
        doubles the target from ``proved`` until one is not ruled out.
    stop : callable, optional
        Checked before each program; when true, the target proved so far is returned.

    Returns
    -------
    float
        A target no plan beats: ``cap`` itself when ``infeasible_at(cap)``, else within
        :data:`TOLERANCE` of the threshold.

    Examples
    --------
    >>> found = target_bound(lambda t: t < 3.0, 1.0, 10.0)
    >>> 3.0 * (1 - TOLERANCE) <= found < 3.0
    True
    >>> target_bound(lambda t: t < 30.0, 1.0, 10.0)  # the cap is proved: nothing more is needed
    10.0
    >>> 30.0 * (1 - TOLERANCE) <= target_bound(lambda t: t < 30.0, 1.0, math.inf) < 30.0
    True
    >>> target_bound(lambda t: True, 1.0, math.inf)  # never ruled in: 64 times the start at most
    64.0
    """
    lo, hi = proved, cap
    if math.isinf(hi):
        hi = 2 * max(proved, 1e-9)
        for _ in range(MAX_DOUBLINGS):
            if stop() or not infeasible_at(hi):
                break
            lo, hi = hi, 2 * hi
        else:
            return lo
    elif stop():
        return lo
    elif infeasible_at(hi):
        return hi
    while hi - lo > TOLERANCE * hi and not stop():
        mid = (lo + hi) / 2
        if infeasible_at(mid):
            lo = mid
        else:
            hi = mid
    return lo
