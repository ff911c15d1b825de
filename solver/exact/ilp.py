"""``ilp``: the exact planner as a MILP in PuLP, solved with HiGHS (or CBC).

The model is the lower-bound model of :mod:`pipeplan.solver.exact.bound_model`: one binary ``x[arc]`` per
candidate stage, a path of arcs over the layers, device counts per class, and the
busy-path, pivot-path and work bounds (:func:`pipeplan.solver.exact.bound_model.model_rows`);
:func:`pipeplan.solver.exact.solve.solve_exact` iterates it with no-good cuts until its optimum meets
the simulated incumbent.

The model is written once in PuLP.  With HiGHS it is handed to an in-process
``highspy.Highs`` once (PuLP's own translation), and every later iteration only adds
its no-good row and moves the cutoff (the upper bound of ``T``) in that HiGHS model,
instead of rebuilding it.  With CBC, PuLP solves the whole model each iteration.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import pulp

from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.native_output import quiet_stdout
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import Stops, TimeLimit, WorkBudget, on_interrupt
from pipeplan.solver.exact.bound_model import SIGNED_AUX, model_rows
from pipeplan.solver.exact.phases import ExactPhases
from pipeplan.solver.exact.solve import refuse_free_sizes, solve_exact
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.space.arcs import ExactData

DEFAULT_NODES = 200_000
"""HiGHS branch-and-bound nodes per ``ilp`` solve (all its MILP solves together)."""

BACKENDS = ("highs", "cbc")

BUILD_SECONDS_PER_ARC = 1.2e-4
"""What writing the model in PuLP and handing it to the solver take per arc, on the 2-core machine.

Measured on 179,819 arcs (31 layers x 7 devices of distinct speeds): 9.4-14.9 s to write
the model, 10.1-11.0 s for PuLP's translation into HiGHS; neither can be interrupted.
With :data:`pipeplan.solver.exact.solve.BUILD_SECONDS_PER_ARC` (CP-SAT's 4e-5) a 3 s limit on 40,918
arcs became 4.1-4.3 s: the model was built, then its translation overran the limit."""


class MilpModel:
    """The lower-bound model in PuLP, times scaled by ``unit`` seconds."""

    def __init__(self, data: ExactData, backend: str = "highs", seed: int = 0,
                 budget: WorkBudget | None = None, stops: Stops | None = None) -> None:
        self.backend, self.seed = backend, seed
        self.budget = budget
        """HiGHS branch-and-bound nodes for all the solves of the cut loop (HiGHS only), or ``None``."""
        self.stops = stops if stops is not None else Stops()
        """Where what cut a solve short is noted (the solve's record)."""
        self.unit = max(data.static_bound, 1e-12)  # scale times to about 1 for the solver's tolerances
        self.prob = pulp.LpProblem("pipeplan_bound", pulp.LpMinimize)
        # x[i]: candidate stage (arc) i is in the configuration
        self.x = [pulp.LpVariable(f"x_{i}", cat=pulp.LpBinary) for i in range(len(data))]
        # T: the lower bound on the iteration time, in units; D: the pivot's extra ops; others: see model_rows
        self.aux: dict[str, pulp.LpVariable] = {}
        self.T = self._aux("T")
        self.prob += self.T
        count_rows, time_rows = model_rows(data)
        x, unit = self.x, self.unit
        for k, row in enumerate(count_rows):
            expr = pulp.LpAffineExpression([(x[i], coef) for i, coef in row.terms])
            sense = pulp.LpConstraintEQ if row.sense == "==" else pulp.LpConstraintLE
            self.prob.addConstraint(pulp.LpConstraint(expr, sense, f"count_{k}", row.rhs))
        for k, row in enumerate(time_rows):
            # sum aux - sum (seconds / unit) x  (sense) 0
            items = [(self._aux(name), coef) for name, coef in row.aux] + [(x[i], -c / unit) for i, c in row.terms]
            expr = pulp.LpAffineExpression(items)
            sense = pulp.LpConstraintEQ if row.sense == "==" else pulp.LpConstraintGE
            self.prob.addConstraint(pulp.LpConstraint(expr, sense, f"time_{k}", 0))
        self.cuts = 0
        self.highs = None
        self.lp_bound: float | None = None
        """The LP relaxation's optimum (seconds), solved once before the first MIP: a valid bound."""

    def _aux(self, name: str) -> pulp.LpVariable:
        if name not in self.aux:
            # times are >= 0 (a bound HiGHS profits from); term 2c's per-layer sums may be negative
            signed = name.startswith(SIGNED_AUX)
            self.aux[name] = pulp.LpVariable(name, lowBound=None if signed else 0)
        return self.aux[name]

    def hint(self, arc_ids: Sequence[int]) -> None:
        """No warm start: the cut loop's cutoff already holds the incumbent's time."""

    def exclude(self, arc_ids: Sequence[int]) -> None:
        self.cuts += 1
        row = pulp.LpConstraint(pulp.LpAffineExpression([(self.x[i], 1) for i in arc_ids]), pulp.LpConstraintLE,
                                f"nogood_{self.cuts}", len(arc_ids) - 1)
        self.prob.addConstraint(row)
        if self.highs is not None:
            self.highs.addRow(-math.inf, len(arc_ids) - 1, len(arc_ids), [self.x[i].index for i in arc_ids],
                              [1.0] * len(arc_ids))

    def solve(self, cutoff: float, time_limit: float):
        limit = max(time_limit, 0.01)
        upper = cutoff / self.unit if math.isfinite(cutoff) else None
        if self.backend == "cbc":
            self.T.upBound = upper
            return self._solve_cbc(limit)
        return self._solve_highs(limit, upper)

    def _chosen(self) -> list[int]:
        return [i for i, v in enumerate(self.x) if (v.value() or 0) > 0.5]

    def _solve_highs(self, limit: float, upper: float | None):
        import highspy
        if self.highs is None:
            started = time.perf_counter()
            with quiet_stdout():
                h = highspy.Highs()
            h.setOptionValue("output_flag", False)
            self.prob.solverModel = h
            pulp.HiGHS(msg=False).buildSolverModel(self.prob)  # PuLP's translation, once
            limit -= time.perf_counter() - started  # the limit counts from the call, not from the run
            h.setOptionValue("mip_rel_gap", 0.0)
            h.setOptionValue("mip_abs_gap", 0.0)
            h.setOptionValue("threads", 1)
            h.setOptionValue("random_seed", self.seed)
            h.HandleUserInterrupt = True  # cancelSolve() at an interrupt (see termination.on_interrupt)
            self.highs = h
            if limit <= 0.05:  # the translation took the time left: no run, no result
                return "unknown", None, None
        h = self.highs
        h.changeColBounds(self.T.index, 0.0, highspy.kHighsInf if upper is None else upper)
        if self.lp_bound is None and limit > 3.0:
            # The LP relaxation first (about a second where the MIP's root takes tens): its
            # optimum bounds the MIP's, and stays valid as no-good rows and a lower cutoff only
            # shrink the feasible set; LP infeasible proves the MIP infeasible.
            self.lp_bound = 0.0
            h.setOptionValue("solve_relaxation", True)
            h.setOptionValue("time_limit", float(max(0.01, 0.25 * limit)))
            started = time.perf_counter()
            self._run(h)
            h.setOptionValue("solve_relaxation", False)
            lp_status = h.getModelStatus()
            if lp_status == highspy.HighsModelStatus.kInfeasible:
                return "infeasible", None, None
            if lp_status == highspy.HighsModelStatus.kOptimal:
                self.lp_bound = h.getInfo().objective_function_value * self.unit
            limit -= time.perf_counter() - started
        h.setOptionValue("time_limit", float(max(0.01, 0.9 * limit - 0.05)))  # HiGHS overruns a little
        if self.budget is not None:
            if self.budget.exhausted():
                return "unknown", None, None
            h.setOptionValue("mip_max_nodes", int(max(1, self.budget.left())))
        self._run(h)
        status = h.getModelStatus()
        info = h.getInfo()
        if self.budget is not None:
            self.budget.spend(min(max(info.mip_node_count, 0), self.budget.left()))
        has_solution = info.primal_solution_status == 2
        chosen = None
        if has_solution:
            values = h.getSolution().col_value
            chosen = [i for i, v in enumerate(self.x) if values[v.index] > 0.5]
        if status == highspy.HighsModelStatus.kOptimal and chosen is not None:
            return "optimal", chosen, info.objective_function_value * self.unit
        if status in (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible):
            return "infeasible", None, None
        bound = info.mip_dual_bound
        bound = bound * self.unit if math.isfinite(bound) else None
        if self.lp_bound:
            bound = self.lp_bound if bound is None else max(bound, self.lp_bound)
        if chosen is not None:
            return "feasible", chosen, bound
        return "unknown", None, bound

    def _run(self, h) -> None:
        """``h.run()``, cancelled at an interrupt; notes in :attr:`stops` what cut it short (HiGHS's own model status)."""
        import highspy

        with on_interrupt(h.cancelSolve):
            h.run()
        cut = {highspy.HighsModelStatus.kTimeLimit: "time", highspy.HighsModelStatus.kInterrupt: "interrupt",
               highspy.HighsModelStatus.kSolutionLimit: "budget", highspy.HighsModelStatus.kIterationLimit: "budget"}
        reason = cut.get(h.getModelStatus())
        if reason is not None:
            self.stops.note(reason)

    def _solve_cbc(self, limit: float):
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=limit, gapRel=0.0, threads=1,
                                   options=[f"randomSeed {self.seed + 1}", "randomCbcSeed 1"])
        self.prob.solve(solver)
        status, sol = self.prob.status, self.prob.sol_status
        if sol == pulp.LpSolutionOptimal:
            return "optimal", self._chosen(), self.T.value() * self.unit
        if status == pulp.LpStatusInfeasible or sol == pulp.LpSolutionInfeasible:
            return "infeasible", None, None
        self.stops.note("time")  # neither proved nor refuted: CBC's only limit is the clock
        if sol == pulp.LpSolutionIntegerFeasible:
            return "feasible", self._chosen(), None  # CBC via PuLP does not return its bound
        return "unknown", None, None


class IlpSolver(Solver):
    """Exact planner: a MILP lower-bound model iterated with no-good cuts (HiGHS or CBC).

    ``phases`` are the phases run around the model (:class:`pipeplan.solver.exact.phases.ExactPhases`;
    by default the class bound and the walk alone, :mod:`pipeplan.solver.portfolio` lists what
    the registered ``ilp`` runs).
    """

    name = "ilp"
    source = "pipeplan: MILP bound model + simulation + no-good cuts (PuLP, HiGHS/CBC)"
    budget_unit = "HiGHS branch-and-bound nodes"
    default_budget = DEFAULT_NODES
    proves = True
    settings = ("backend",)

    def __init__(self, backend: str = "highs", enumerate_first: bool = True, phases: ExactPhases = ExactPhases()) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.backend = backend
        self.enumerate_first = enumerate_first
        """Walk the configurations before the model (:mod:`pipeplan.solver.exact.enumeration`); off: the model loop only."""
        self.phases = phases
        """The phases run around the model, with their counted budgets."""

    def check(self, problem: PlanningProblem) -> None:
        """As :meth:`Solver.check`, and refuse microbatch sizes as decisions (the MILP plans ``M`` equal ones).

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

        ``budget``: HiGHS branch-and-bound nodes over all the MILP solves (CBC takes no budget,
        only the time limit); it also scales every phase's counted budget by itself over
        :data:`DEFAULT_NODES`.
        """
        work = budget if self.backend == "highs" else None
        phases = self.phases.scaled(budget.units / DEFAULT_NODES)  # --budget scales every phase alike (CBC: only them)
        return solve_exact(problem, self.name, lambda data: MilpModel(data, self.backend, seed, work, clock.stops),
                           clock=clock, seed=seed, phases=phases,
                           details={"backend": self.backend, "work": phases.counts()},
                           enumerate_first=self.enumerate_first, build_seconds_per_arc=BUILD_SECONDS_PER_ARC)
