"""``cpsat``: the exact planner as a CP-SAT model (OR-Tools).

The lower-bound model of :mod:`pipeplan.solver.exact.bound_model` in integers: times are scaled to
``unit`` seconds and every arc's time is floored, so the integer optimum times
``unit`` never exceeds the real lower bound (the rounding only loosens it, by at
most one unit per arc of a path).  The auxiliary time variables of
:func:`pipeplan.solver.exact.bound_model.model_rows` are integers defined by equalities over the same
floored values; a difference row floors the negated value, so it may take away up to
one unit more than the arc once added (values of either sign), and every auxiliary
variable is at most its exact sum.  Since they appear only with a plus sign in the
``>=`` rows (``G`` only as a difference ``G_l' - G_l`` of additions), every row stays
valid.  The greedy or baseline configuration is passed as a
hint; :func:`pipeplan.solver.exact.solve.solve_exact` runs the cut loop.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, replace
from typing import Sequence

import numpy as np
from ortools.sat.python import cp_model

from pipeplan.solver.exact.cpsat_run import solve_counted
from pipeplan.solver.splits.cpsat_split import optimize_splits
from pipeplan.solver.splits.equal_splits import fastest, solve_equal_splits
from pipeplan.solver.space.arcs import ExactData
from pipeplan.solver.exact.bound_model import model_rows
from pipeplan.solver.exact.solve import solve_exact
from pipeplan.solver.exact.work import budget_work, exact_work
from pipeplan.solver.splits.joint_split import solve_joint
from pipeplan.solver.core.problem import PLANNED_SCHEDULES, PlanningProblem
from pipeplan.solver.core.registry import register
from pipeplan.solver.core.result import SolverResult, TracePoint
from pipeplan.solver.core.termination import WorkBudget
from pipeplan.solver.portfolio import solve_v2_exact

DEFAULT_BUDGET = 120.0
"""CP-SAT deterministic seconds per solve of ``cpsat`` (all its CP-SAT calls together)."""

RESOLUTION = 1e7
"""Integer units per reference time: the rounding loosens the bound by about 1e-7 per term."""


class CpSatModel:
    """The lower-bound model in CP-SAT, times in integer units of ``unit`` seconds."""

    def __init__(self, data: ExactData, seed: int = 0, workers: int = 1, budget: WorkBudget | None = None) -> None:
        self.seed, self.workers = seed, workers
        self.budget = budget
        """CP-SAT deterministic seconds for all the solves of the cut loop, or ``None`` (the clock only)."""
        tab = data.table
        reference = max(float(tab["busy_path"].max()) if len(data) else 0.0, data.static_bound, 1e-12)
        self.unit = reference / RESOLUTION
        self.model = cp_model.CpModel()
        # x[i]: candidate stage (arc) i is in the configuration
        self.x = [self.model.new_bool_var(f"x_{i}") for i in range(len(data))]
        count_rows, time_rows = model_rows(data)
        # every time variable is a sum of floored arc times along one path (at most the total of all of them)
        # (pass_cost three times: once in U, twice in term 2c's 2 R_l or term 2d's R_l + R_l')
        horizon = sum(self._floor(float(np.abs(tab[k]).sum())) for k in (
            "busy", "allreduce", "head_fb", "pivot_extra", "work", "pivot_ar", "pivot2_extra", "pivot2_ar",
            "chain", "pivot_fwd", "end_ar")) + 3 * self._floor(float(tab["pass_cost"].sum())) + 1
        self.aux: dict[str, cp_model.IntVar] = {}
        x = self.x
        for row in count_rows:
            expr = sum(coef * x[i] for i, coef in row.terms)
            self.model.add(expr == row.rhs if row.sense == "==" else expr <= row.rhs)
        for row in time_rows:
            # aux combination (>= or ==) floored arc times: ">=" rows stay valid, "==" rows define aux at most exact
            left = sum(coef * self._aux(name, horizon) for name, coef in row.aux)
            right = cp_model.LinearExpr.weighted_sum([x[i] for i, _ in row.terms],
                                                     [self._floor(c) for _, c in row.terms]) if row.terms else 0
            self.model.add(left == right if row.sense == "==" else left >= right)
        # T: the lower bound on the iteration time, in units
        self.T = self._aux("T", horizon)
        self.model.minimize(self.T)
        self.cutoff = None

    def _aux(self, name: str, horizon: int = 0):
        if name not in self.aux:
            self.aux[name] = self.model.new_int_var(-horizon, horizon, name)
        return self.aux[name]

    def _floor(self, seconds: float) -> int:
        """A time in units, floored towards minus infinity (never above it, whatever its sign)."""
        return math.floor(seconds / self.unit)

    def hint(self, arc_ids: Sequence[int]) -> None:
        chosen = set(arc_ids)
        self.model.clear_hints()
        for i, var in enumerate(self.x):
            self.model.add_hint(var, i in chosen)

    def exclude(self, arc_ids: Sequence[int]) -> None:
        self.model.add(sum(self.x[i] for i in arc_ids) <= len(arc_ids) - 1)

    def solve(self, cutoff: float, time_limit: float):
        if math.isfinite(cutoff):
            # T * unit <= cutoff; T is a floored bound, so this keeps every config whose real bound is below
            limit = math.floor(cutoff / self.unit)
            if self.cutoff is None or limit < self.cutoff:  # cutoffs only fall: older rows are implied
                self.model.add(self.T <= limit)
                self.cutoff = limit
        if self.budget is not None and self.budget.exhausted():
            return "unknown", None, None
        solver = cp_model.CpSolver()
        solver.parameters.random_seed = self.seed
        solver.parameters.num_workers = self.workers
        solver.parameters.relative_gap_limit = 0.0
        solver.parameters.absolute_gap_limit = 0.0
        code = solve_counted(solver, self.model, time_limit=time_limit, budget=self.budget)
        if code == cp_model.INFEASIBLE:
            return "infeasible", None, None
        bound = solver.best_objective_bound * self.unit
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            chosen = [i for i, v in enumerate(self.x) if solver.value(v)]
            self.hint(chosen)
            return ("optimal" if code == cp_model.OPTIMAL else "feasible"), chosen, bound
        return "unknown", None, bound


@register("cpsat")
class CpSatSolver:
    """Exact planner: a CP-SAT lower-bound model iterated with no-good cuts."""

    name = "cpsat"
    source = "pipeplan: CP-SAT bound model + simulation + no-good cuts (OR-Tools)"

    budget_unit = "CP-SAT deterministic seconds (version-2 schedules: simulations)"
    default_budget = DEFAULT_BUDGET
    proves = True
    schedules = PLANNED_SCHEDULES

    def __init__(self, workers: int = 1, enumerate_first: bool = True) -> None:
        self.workers = workers
        self.enumerate_first = enumerate_first
        """Walk the configurations before the model (:mod:`pipeplan.solver.exact.enumeration`); off: the model loop only."""

    def solve(self, problem: PlanningProblem, *, time_limit: float = 60.0, seed: int = 0,
              budget: float | None = None) -> SolverResult:
        """Plan ``problem`` exactly; see :mod:`pipeplan.solver.exact.solve` for the method and its proof.

        ``budget``: CP-SAT deterministic seconds for all its CP-SAT solves (default
        :data:`DEFAULT_BUDGET`).  With ``auto_microbatches`` or ``per_stage`` the splits are
        decisions too: see :meth:`solve_splits`.  A version-2 schedule goes to
        :func:`pipeplan.solver.portfolio.solve_v2_exact` (``budget``: simulations).
        """
        if problem.is_v2:
            return solve_v2_exact(self.name, problem, time_limit, seed, budget)
        work = WorkBudget(budget or DEFAULT_BUDGET)
        phases = budget_work(budget, DEFAULT_BUDGET)  # --budget scales every phase alike
        with exact_work(phases):  # for the exact solves the split search runs
            if problem.auto_microbatches or problem.per_stage:
                return self.solve_splits(problem, time_limit=time_limit, seed=seed, budget=work)
            return solve_exact(problem, self.name, lambda data: CpSatModel(data, seed, self.workers, work),
                               time_limit=time_limit, seed=seed, details={"workers": self.workers, "work": asdict(phases)},
                               enumerate_first=self.enumerate_first, work=phases)

    def solve_splits(self, problem: PlanningProblem, *, time_limit: float, seed: int,
                     budget: WorkBudget | None = None) -> SolverResult:
        """Pipelines and microbatch splits together.

        Small instances: the exact branch and bound of :mod:`pipeplan.solver.splits.joint_split`
        (``optimal`` when proved over every pipeline and split).  Larger ones: the
        decomposition of :mod:`pipeplan.solver.splits.cpsat_split`, the best equal-split plan of this
        solver (its own count in half the time, other counts in what that leaves: see
        :func:`pipeplan.solver.splits.equal_splits.solve_equal_splits`) with its split then chosen by
        CP-SAT; that is reported ``feasible`` with no lower bound, since the bound it
        proves covers one pipeline only.
        """
        start = time.perf_counter()
        joint = solve_joint(problem, name=self.name, time_limit=time_limit, seed=seed, budget=budget)
        if joint is not None:
            return joint
        equal = solve_equal_splits(self, problem, time_limit=0.5 * time_limit, seed=seed)
        base, seeded = fastest(equal.values()), time.perf_counter() - start
        if base.plan is None:
            return replace(base, wall_time=time.perf_counter() - start)
        left = max(0.5, time_limit - (time.perf_counter() - start))
        search = optimize_splits(problem, base.plan, time_limit=left, seed=seed, workers=self.workers, budget=budget)
        wall = time.perf_counter() - start
        details = {"method": "decomposition: exact equal-split pipeline, then CP-SAT over its splits",
                   "equal_split_status": base.status, "equal_split_time": base.iteration_time,
                   "equal_splits": {m: [r.status, r.iteration_time] for m, r in equal.items()},
                   "split_status": search.status, "split_lower_bound": search.lower_bound}
        trace = (TracePoint(seeded, base.iteration_time, None), TracePoint(wall, search.iteration_time, None))
        return SolverResult(self.name, "feasible", search.plan, search.iteration_time, None, wall, seed, trace,
                            "too many pipelines for the joint proof; the split is optimised for one pipeline",
                            details)
