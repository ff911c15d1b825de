"""``ilp``: the exact planner as a MILP in PuLP, solved with HiGHS (or CBC).

The model is the lower-bound model of :mod:`solver.exact`: one binary ``x[arc]`` per
candidate stage, a path of arcs over the layers, device counts per class, and the
busy-path and pivot-path bounds; :func:`solver.exact.solve_exact` iterates it with
no-good cuts until its optimum meets the simulated incumbent.
"""

from __future__ import annotations

import math
from typing import Sequence

import pulp

from solver.exact import ExactData, model_rows, solve_exact
from solver.problem import PlanningProblem
from solver.registry import register
from solver.result import SolverResult

BACKENDS = ("highs", "cbc")


class MilpModel:
    """The lower-bound model in PuLP, times scaled by ``unit`` seconds."""

    def __init__(self, data: ExactData, backend: str = "highs", seed: int = 0) -> None:
        self.backend, self.seed = backend, seed
        self.unit = max(data.static_bound, 1e-12)  # scale times to about 1 for the solver's tolerances
        self.prob = pulp.LpProblem("pipeplan_bound", pulp.LpMinimize)
        # x[i]: candidate stage (arc) i is in the configuration
        self.x = {i: pulp.LpVariable(f"x_{i}", cat=pulp.LpBinary) for i in range(len(data.arcs))}
        # T: the lower bound on the iteration time, in units
        self.T = pulp.LpVariable("T", lowBound=0)
        # D: the pivot stage's critical ops beyond one microbatch, in units
        self.D = pulp.LpVariable("D", lowBound=0)
        self.prob += self.T
        count_rows, time_rows = model_rows(data)
        for row in count_rows:
            expr = pulp.lpSum(coef * self.x[i] for i, coef in row.terms)
            self.prob += (expr == row.rhs) if row.sense == "==" else (expr <= row.rhs)
        for row in time_rows:
            target = self.T if row.target == "T" else self.D
            expr = pulp.lpSum((coef / self.unit) * self.x[i] for i, coef in row.terms)
            self.prob += target >= expr + (self.D if row.with_pivot else 0)
        self.cutoff_row = None
        self.cuts = 0

    def exclude(self, arc_ids: Sequence[int]) -> None:
        self.cuts += 1
        self.prob += pulp.lpSum(self.x[i] for i in arc_ids) <= len(arc_ids) - 1, f"nogood_{self.cuts}"

    def solve(self, cutoff: float, time_limit: float):
        if "cutoff" in self.prob.constraints:
            del self.prob.constraints["cutoff"]
        if math.isfinite(cutoff):
            self.prob += self.T <= cutoff / self.unit, "cutoff"
        limit = max(time_limit, 0.01)
        if self.backend == "cbc":
            return self._solve_cbc(limit)
        return self._solve_highs(limit)

    def _chosen(self) -> list[int]:
        return [i for i, v in self.x.items() if (v.value() or 0) > 0.5]

    def _solve_highs(self, limit: float):
        solver = pulp.HiGHS(msg=False, timeLimit=limit, gapRel=0.0, gapAbs=0.0, threads=1,
                            random_seed=self.seed)
        self.prob.solve(solver)
        import highspy
        h = self.prob.solverModel
        status = h.getModelStatus()
        info = h.getInfo()
        has_solution = info.primal_solution_status == 2
        # PuLP reports a time-limited solve as "Optimal": read HiGHS's own status instead
        if status == highspy.HighsModelStatus.kOptimal:
            chosen = self._chosen()
            return "optimal", chosen, self.T.value() * self.unit
        if status in (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible):
            return "infeasible", None, None
        bound = info.mip_dual_bound
        bound = bound * self.unit if math.isfinite(bound) else None
        if has_solution:
            return "feasible", self._chosen(), bound
        return "unknown", None, bound

    def _solve_cbc(self, limit: float):
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=limit, gapRel=0.0, threads=1,
                                   options=[f"randomSeed {self.seed + 1}", "randomCbcSeed 1"])
        self.prob.solve(solver)
        status, sol = self.prob.status, self.prob.sol_status
        if sol == pulp.LpSolutionOptimal:
            return "optimal", self._chosen(), self.T.value() * self.unit
        if status == pulp.LpStatusInfeasible or sol == pulp.LpSolutionInfeasible:
            return "infeasible", None, None
        if sol == pulp.LpSolutionIntegerFeasible:
            return "feasible", self._chosen(), None  # CBC via PuLP does not return its bound
        return "unknown", None, None


@register("ilp")
class IlpSolver:
    """Exact planner: a MILP lower-bound model iterated with no-good cuts (HiGHS or CBC)."""

    name = "ilp"
    source = "pipeplan: MILP bound model + simulation + no-good cuts (PuLP, HiGHS/CBC)"

    def __init__(self, backend: str = "highs") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.backend = backend

    def solve(self, problem: PlanningProblem, *, time_limit: float = 60.0, seed: int = 0) -> SolverResult:
        """Plan ``problem`` exactly; see :mod:`solver.exact` for the method and its proof."""
        return solve_exact(problem, self.name, lambda data: MilpModel(data, self.backend, seed),
                           time_limit=time_limit, seed=seed, details={"backend": self.backend})
