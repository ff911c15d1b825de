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
from typing import Sequence

import numpy as np
from ortools.sat.python import cp_model

from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import Stops, TimeLimit, WorkBudget
from pipeplan.solver.exact.bound_model import model_rows
from pipeplan.solver.exact.cpsat_run import solve_counted
from pipeplan.solver.exact.phases import ExactPhases
from pipeplan.solver.exact.solve import refuse_free_sizes, solve_exact
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.space.arcs import ExactData

DEFAULT_BUDGET = 120.0
"""CP-SAT deterministic seconds per solve of ``cpsat`` (all its CP-SAT calls together)."""

RESOLUTION = 1e7
"""Integer units per reference time: the rounding loosens the bound by about 1e-7 per term."""


class CpSatModel:
    """The lower-bound model in CP-SAT, times in integer units of ``unit`` seconds."""

    def __init__(self, data: ExactData, seed: int = 0, workers: int = 1, budget: WorkBudget | None = None,
                 stops: Stops | None = None) -> None:
        self.seed, self.workers = seed, workers
        self.budget = budget
        """CP-SAT deterministic seconds for all the solves of the cut loop, or ``None`` (the clock only)."""
        self.stops = stops if stops is not None else Stops()
        """Where what cut a solve short is noted (the solve's record)."""
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
        code = solve_counted(solver, self.model, time_limit=time_limit, budget=self.budget, stops=self.stops)
        if code == cp_model.INFEASIBLE:
            return "infeasible", None, None
        bound = solver.best_objective_bound * self.unit
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            chosen = [i for i, v in enumerate(self.x) if solver.value(v)]
            self.hint(chosen)
            return ("optimal" if code == cp_model.OPTIMAL else "feasible"), chosen, bound
        return "unknown", None, bound


class CpSatSolver(Solver):
    """Exact planner: a CP-SAT lower-bound model iterated with no-good cuts.

    ``phases`` are the phases run around the model (:class:`pipeplan.solver.exact.phases.ExactPhases`;
    by default the class bound and the walk alone, :mod:`pipeplan.solver.portfolio` lists what
    the registered ``cpsat`` runs).
    """

    name = "cpsat"
    source = "pipeplan: CP-SAT bound model + simulation + no-good cuts (OR-Tools)"
    budget_unit = "CP-SAT deterministic seconds"
    default_budget = DEFAULT_BUDGET
    proves = True

    def __init__(self, workers: int = 1, enumerate_first: bool = True, phases: ExactPhases = ExactPhases()) -> None:
        self.workers = workers
        self.enumerate_first = enumerate_first
        """Walk the configurations before the model (:mod:`pipeplan.solver.exact.enumeration`); off: the model loop only."""
        self.phases = phases
        """The phases run around the model, with their counted budgets."""

    def check(self, problem: PlanningProblem) -> None:
        """As :meth:`Solver.check`, and refuse microbatch sizes as decisions (``cpsat-joint`` plans those).

        Raises
        ------
        InputError
            With ``auto_microbatches`` or ``per_stage``.
        """
        super().check(problem)
        refuse_free_sizes(self.name, problem)

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """Plan ``problem`` exactly; see :mod:`pipeplan.solver.exact.solve` for the method and its proof.

        ``budget``: CP-SAT deterministic seconds for all its CP-SAT solves; it also scales every
        phase's counted budget by itself over :data:`DEFAULT_BUDGET`.
        """
        phases = self.phases.scaled(budget.units / DEFAULT_BUDGET)  # --budget scales every phase alike
        return solve_exact(problem, self.name, lambda data: CpSatModel(data, seed, self.workers, budget, clock.stops),
                           clock=clock, seed=seed, phases=phases,
                           details={"workers": self.workers, "work": phases.counts()},
                           enumerate_first=self.enumerate_first)
