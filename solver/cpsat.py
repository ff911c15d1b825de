"""``cpsat``: the exact planner as a CP-SAT model (OR-Tools).

The lower-bound model of :mod:`solver.exact` in integers: times are scaled to
``unit`` seconds and every bound coefficient is floored, so the integer optimum
times ``unit`` never exceeds the real lower bound (the rounding only loosens it, by
at most one unit per term).  The greedy or baseline configuration is passed as a
hint; :func:`solver.exact.solve_exact` runs the cut loop.
"""

from __future__ import annotations

import math
from typing import Sequence

from ortools.sat.python import cp_model

from solver.exact import ExactData, model_rows, solve_exact
from solver.problem import PlanningProblem
from solver.registry import register
from solver.result import SolverResult

RESOLUTION = 1e7
"""Integer units per reference time: the rounding loosens the bound by about 1e-7 per term."""


class CpSatModel:
    """The lower-bound model in CP-SAT, times in integer units of ``unit`` seconds."""

    def __init__(self, data: ExactData, seed: int = 0, workers: int = 1) -> None:
        self.seed, self.workers = seed, workers
        arcs = data.arcs
        reference = max(max((a.busy_path for a in arcs), default=0.0), data.static_bound, 1e-12)
        self.unit = reference / RESOLUTION
        self.model = cp_model.CpModel()
        # x[i]: candidate stage (arc) i is in the configuration
        self.x = {i: self.model.new_bool_var(f"x_{i}") for i in range(len(arcs))}
        count_rows, time_rows = model_rows(data)
        horizon = sum(self._floor(a.pass_cost) for a in arcs) + max(self._floor(a.pivot_extra) for a in arcs)
        horizon = max(horizon, max(self._floor(a.busy_path) for a in arcs)) + 1
        # T: the lower bound on the iteration time, in units
        self.T = self.model.new_int_var(0, horizon, "T")
        # D: the pivot stage's critical ops beyond one microbatch, in units
        self.D = self.model.new_int_var(0, horizon, "D")
        for row in count_rows:
            expr = sum(coef * self.x[i] for i, coef in row.terms)
            self.model.add(expr == row.rhs if row.sense == "==" else expr <= row.rhs)
        for row in time_rows:
            target = self.T if row.target == "T" else self.D
            expr = sum(self._floor(coef) * self.x[i] for i, coef in row.terms)
            self.model.add(target >= expr + (self.D if row.with_pivot else 0))
        self.model.minimize(self.T)
        self.cutoff = None

    def _floor(self, seconds: float) -> int:
        return math.floor(seconds / self.unit)

    def hint(self, arc_ids: Sequence[int]) -> None:
        chosen = set(arc_ids)
        self.model.clear_hints()
        for i, var in self.x.items():
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
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(time_limit, 0.01)
        solver.parameters.random_seed = self.seed
        solver.parameters.num_workers = self.workers
        solver.parameters.relative_gap_limit = 0.0
        solver.parameters.absolute_gap_limit = 0.0
        code = solver.solve(self.model)
        if code == cp_model.INFEASIBLE:
            return "infeasible", None, None
        bound = solver.best_objective_bound * self.unit
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            chosen = [i for i, v in self.x.items() if solver.value(v)]
            self.hint(chosen)
            return ("optimal" if code == cp_model.OPTIMAL else "feasible"), chosen, bound
        return "unknown", None, bound


@register("cpsat")
class CpSatSolver:
    """Exact planner: a CP-SAT lower-bound model iterated with no-good cuts."""

    name = "cpsat"
    source = "pipeplan: CP-SAT bound model + simulation + no-good cuts (OR-Tools)"

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers

    def solve(self, problem: PlanningProblem, *, time_limit: float = 60.0, seed: int = 0) -> SolverResult:
        """Plan ``problem`` exactly; see :mod:`solver.exact` for the method and its proof."""
        return solve_exact(problem, self.name, lambda data: CpSatModel(data, seed, self.workers),
                           time_limit=time_limit, seed=seed, details={"workers": self.workers})
