"""``cpsat-split``: microbatch count and sizes as a CP-SAT scheduling decision.

Decomposition.  The joint model (stages, devices *and* splits) is too large beyond toy
sizes, so the search is split in two: (1) the partition, device mapping and recompute
flags are fixed, taken from the fastest equal-split plan of the baselines
(:data:`pipeplan.solver.baselines.BASELINES`) and of the solvers its caller gives
(the registered ``cpsat-split``: ``group-search`` and ``cpsat``, :mod:`pipeplan.solver.portfolio`);
(2) for that fixed pipeline a CP-SAT scheduling
model chooses the number of microbatches (within :attr:`PlanningProblem.split_counts`)
and their sizes, one split shared by all stages or, with ``per_stage``, one per stage.

Stopping.  Each phase ends on counted work: the baselines run their whole searches,
``group-search`` and the exact solvers their default budgets, the split baselines' warm
split its candidates, the split search its CP-SAT deterministic seconds
(:data:`DEFAULT_BUDGET`, or ``--budget``) on one worker with the given seed.  The time
limit caps them all together and is never divided into shares, so the same problem and
seed give the same plan on an idle and a loaded machine unless the cap fires, which the
record then says (``stopped_by: time``).

The model (one per call of :func:`optimize_splits`):

- ``K`` microbatch *slots* per stage; slot ``k`` is present (``p[s, k]``) with size
  ``n[s, k] >= 1`` or absent with size 0; present slots form a prefix, sizes sum to the
  batch.  Under GPipe and 1F1B the op order of the present ops is the ``K``-slot op list
  restricted to them (1F1B runs ``Fj`` before ``Bi`` iff ``j <= S-1-s+i`` whatever ``m``),
  so one fixed chain per stage serves every count; absent ops last 0.
- Interval variables for every op and transfer, their lengths affine in the sizes
  (``a * p + b * q`` with ``q = ceil(n / r)``); one no-overlap machine per stage and per
  link direction, plus the list order and FIFO order as precedences.
- The spec's sample-overlap waits: ``Fk`` of stage ``s`` waits for the forward transfer
  of every present microbatch ``j`` of stage ``s-1`` that starts before ``Fk``'s last
  sample (``C_{s-1}(j-1) < C_s(k)``, a reified comparison of prefix sums); backwards
  alike.  A split that would deadlock has no schedule, so the model excludes it.
- Memory: the stash after every op of the chain stays within the stage's devices.
- Objective: the makespan, ``max_s`` (end of the stage's last op ``+ AR_s``).

Times are integers (ticks, about ``2**30`` per base-plan iteration).  Every duration
coefficient is rounded *down* and the timeline is monotone in durations, so the
model's optimum, in seconds, is a valid lower bound on the iteration time of every split
of that pipeline (memory coefficients are rounded the permissive way for the same
reason).  The chosen split is then re-simulated by the exact simulator, and that time
is reported; the gap covers the rounding.  The bound is a bound *over splits for this
partition and mapping*, not over all plans: it is reported in ``details`` as
``split_lower_bound`` and the record's ``lower_bound`` stays ``None``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from pipeplan.solver.baselines import BASELINES
from pipeplan.solver.baselines import fastest as fastest_baseline
from pipeplan.solver.baselines.slicing import AutoPipeSlicing
from pipeplan.solver.baselines.umpipe import UmpipeDP, judge_splits
from pipeplan.solver.exact.cpsat_run import solve_counted
from pipeplan.solver.splits.equal_splits import fastest, solve_equal_splits
from pipeplan.solver.bounds.infeasibility import heuristic_no_plan
from pipeplan.solver.formats.plan import Plan, Stage, equal_split
from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult, TracePoint
from pipeplan.solver.schedules.schedule import FORWARD, stage_actions
from pipeplan.solver.evaluation.simulator import Simulation, plan_costs, simulate
from pipeplan.solver.core.termination import Stops, TimeLimit, WorkBudget

__all__ = ["SplitSearch", "optimize_splits", "base_plans", "CpSatSplit"]

TICKS = 2 ** 30
"""Ticks per base-plan iteration time: the integer time resolution."""
OPTIMAL_TOLERANCE = 1e-6
"""Largest relative gap (rounding of the tick scale) still reported as ``optimal``."""

DEFAULT_BUDGET = 2.0
"""CP-SAT deterministic seconds of ``cpsat-split``'s split search (``--budget``).  Small enough that the
whole solve ends on counted work inside the default 60 s limit with both cores of a 2-core machine
busy: on gpt1-14 / two-servers, batch 64, ``--microbatches auto``, seed 5, the solve took 27 s of CPU
with 2 deterministic seconds (20 s with 1), while the 4.5 that prove that split optimal take 50 s of
the search alone (measured 2026-12-01: ``CpSatSplit().solve(problem, time_limit=600, budget=B)``, CPU
seconds by ``time.process_time``)."""


@dataclass(frozen=True)
class SplitSearch:
    """The outcome of the split search for one fixed pipeline."""

    plan: Plan
    """The best plan found (the base plan if nothing better), re-simulated."""
    iteration_time: float
    """Its iteration time under the exact simulator."""
    lower_bound: float | None
    """Proved bound on the iteration time of every split of this pipeline, or ``None``."""
    status: str
    """``optimal`` (proved, up to :data:`OPTIMAL_TOLERANCE`) or ``feasible``."""
    cp_status: str
    """CP-SAT's status name."""
    wall_time: float
    """Seconds spent."""
    details: dict = field(default_factory=dict)
    """Model size and scale facts."""


def _ceil(x: float) -> int:
    return int(math.ceil(x))


def optimize_splits(problem: PlanningProblem, base: Plan, *, time_limit: float = 30.0, seed: int = 0,
                    workers: int = 1, budget: WorkBudget | None = None, within: TimeLimit | None = None) -> SplitSearch:
    """Best microbatch count and sizes for the pipeline of ``base`` (stages, devices, recompute fixed).

    Parameters
    ----------
    problem : PlanningProblem
        Gives the batch, schedule, :attr:`~PlanningProblem.split_counts` and
        ``per_stage``.
    base : Plan
        A fitting plan whose stages, devices and recompute flags are kept; its split
        is the warm start (hint) and the fallback.
    time_limit : float
        Seconds for CP-SAT.
    seed : int
        CP-SAT's random seed.
    workers : int
        CP-SAT workers (1: deterministic, same seed same plan).
    budget : WorkBudget, optional
        CP-SAT deterministic seconds (spent by the solve); with it, a solve not cut by
        ``time_limit`` gives the same split on any machine.
    within : TimeLimit, optional
        The clock of the solve this is part of: its record notes what cut CP-SAT short.

    Returns
    -------
    SplitSearch
        Never worse than ``base``.

    Notes
    -----
    See the module docstring for the model and what the bound means.
    """
    start = time.perf_counter()
    base_result = simulate(base, problem.graph, problem.cluster)
    if base_result.iteration_time <= 0:  # no split can take less than no time (and the scale divides by it)
        return SplitSearch(base, base_result.iteration_time, 0.0, "optimal", "not needed",
                           time.perf_counter() - start, {"cp_status": "not needed", "gap": 0.0})
    if not math.isfinite(TICKS / base_result.iteration_time):
        # times so small (below ~1e-300 s) that no tick scale represents them: keep the base split, unproved
        return SplitSearch(base, base_result.iteration_time, 0.0, "feasible", "not built: times below the tick scale",
                           time.perf_counter() - start, {"cp_status": "not built", "gap": 1.0})
    builder = _SplitModel(problem, base, base_result)
    builder.build()
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    if workers == 1:  # the split-first depth-first search (see ``_SplitModel.build``)
        solver.parameters.search_branching = solver.parameters.SearchBranching.FIXED_SEARCH
    status = solve_counted(solver, builder.model, time_limit=max(0.1, time_limit), budget=budget,
                           stops=within.stops if within is not None else Stops())
    cp_status = solver.status_name(status)
    best_plan, best_time = base, base_result.iteration_time
    bound = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        plan = builder.plan_from(solver)
        result = simulate(plan, problem.graph, problem.cluster)
        if result.fits and result.iteration_time < best_time:
            best_plan, best_time = plan, result.iteration_time
        bound = solver.best_objective_bound / builder.scale
    elif status == cp_model.INFEASIBLE:
        bound = base_result.iteration_time  # cannot happen with a fitting base; kept honest
    gap = None if bound is None else (best_time - bound) / best_time
    proved = status == cp_model.OPTIMAL and gap is not None and gap <= OPTIMAL_TOLERANCE
    details = {"cp_status": cp_status, "ticks_per_second": builder.scale, "slots": builder.slots,
               "variables": len(builder.model.proto.variables),
               "constraints": len(builder.model.proto.constraints),
               "rounding_bound": builder.rounding / builder.scale, "gap": gap}
    return SplitSearch(best_plan, best_time, bound, "optimal" if proved else "feasible", cp_status,
                       time.perf_counter() - start, details)


class _SplitModel:
    """Builds the CP-SAT model of :func:`optimize_splits` and reads a split back."""

    def __init__(self, problem: PlanningProblem, base: Plan, base_result: Simulation) -> None:
        self.problem, self.base = problem, base
        self.model = cp_model.CpModel()
        self.stages = len(base.stages)
        self.batch = problem.global_batch
        self.slots = max(problem.split_counts)
        self.horizon_s = base_result.iteration_time
        self.scale = TICKS / self.horizon_s  # ticks per second
        self.horizon = TICKS + 1  # the base split's floored schedule ends by then
        self.rounding = 0.0  # ticks: an upper bound on what flooring removes from any path
        plan = base.with_extra()
        self.costs = plan_costs(plan, problem.graph, problem.cluster).groups  # one stage per group

    # ------------------------------------------------------------------ variables
    def build(self) -> None:
        m, S, K, B = self.model, self.stages, self.slots, self.batch
        rows = S if self.problem.per_stage else 1
        counts = self.problem.split_counts
        # n[row, k]: size of slot k (0 when absent); p[row, k]: slot k is present
        self.n = {(t, k): m.new_int_var(0, B, f"n_{t}_{k}") for t in range(rows) for k in range(K)}
        self.p = {(t, k): m.new_bool_var(f"p_{t}_{k}") for t in range(rows) for k in range(K)}
        for t in range(rows):
            for k in range(K):
                m.add(self.n[t, k] >= self.p[t, k])
                m.add(self.n[t, k] <= B * self.p[t, k])
                if k + 1 < K:
                    m.add_implication(self.p[t, k + 1], self.p[t, k])  # present slots form a prefix
            m.add(sum(self.n[t, k] for k in range(K)) == B)
            if not self.problem.free_sizes:  # --microbatches M without auto/per-stage: M equal
                for k, size in enumerate(self.problem.split):
                    m.add(self.n[t, k] == size)
            m.add_linear_constraint(sum(self.p[t, k] for k in range(K)), counts.start, counts.stop - 1)
        row = (lambda s: s) if self.problem.per_stage else (lambda s: 0)
        self.row = row
        # cum[row, k]: samples in slots 0..k (prefix sum C(k))
        self.cum = {}
        for t in range(rows):
            for k in range(K):
                self.cum[t, k] = m.new_int_var(0, B, f"C_{t}_{k}")
                m.add(self.cum[t, k] == sum(self.n[t, i] for i in range(k + 1)))
        self._hint()
        self._ops()
        self._transfers()
        self._waits()
        self._memory()
        self._objective()
        # Branch on the split first: once sizes are fixed, propagation alone yields the
        # earliest schedule (a longest path), so a depth-first search over splits with
        # the LP bound pruning it is complete and deterministic on one worker.
        sizes = [v for t in range(rows) for k in range(K) for v in (self.p[t, k], self.n[t, k])]
        m.add_decision_strategy(sizes, cp_model.CHOOSE_FIRST, cp_model.SELECT_MAX_VALUE)

    def _hint(self) -> None:
        """Warm start: the base plan's split (every stage's when per stage)."""
        for s, st in enumerate(self.base.stages):
            t = self.row(s)
            if t != s:
                continue
            split = st.microbatches if len(st.microbatches) <= self.slots else equal_split(self.batch, self.slots)
            for k in range(self.slots):
                self.model.add_hint(self.n[t, k], split[k] if k < len(split) else 0)
                self.model.add_hint(self.p[t, k], k < len(split))

    def _q(self, s: int, k: int) -> cp_model.IntVar:
        """Samples per replica, ``ceil(n / r)`` (the size itself for one replica)."""
        r = len(self.base.stages[s].devices)
        n = self.n[self.row(s), k]
        if r == 1:
            return n
        q = self.model.new_int_var(0, self.batch, f"q_{s}_{k}")
        self.model.add(r * q >= n)
        self.model.add(r * q <= n + r - 1)
        return q

    def _length(self, fixed: float, per: float, s: int, k: int, per_var, name: str) -> cp_model.IntVar:
        """A duration variable ``floor(fixed) * p + floor(per) * per_var`` in ticks."""
        a, b = math.floor(fixed * self.scale), math.floor(per * self.scale)
        self.rounding += 1 + self.batch  # < 1 tick on the fixed part, < 1 per sample on the rest
        d = self.model.new_int_var(0, self.horizon, name)
        self.model.add(d == a * self.p[self.row(s), k] + b * per_var)
        return d

    def _interval(self, name: str, length: cp_model.IntVar):
        start = self.model.new_int_var(0, self.horizon, f"{name}_s")
        end = self.model.new_int_var(0, self.horizon, f"{name}_e")
        return start, end, self.model.new_interval_var(start, length, end, name)

    def _ops(self) -> None:
        """Op intervals, one no-overlap machine per stage, the list order as a chain."""
        m, S, K = self.model, self.stages, self.slots
        g = self.problem.graph
        # op[s, kind, k]: (start, end) of op kind∈{F,B} of slot k on stage s
        self.op = {}
        self.q = {(s, k): self._q(s, k) for s in range(S) for k in range(K)}
        self.chain_end = {}
        for s, st in enumerate(self.base.stages):
            lo, hi = st.layers
            speed = min(self.problem.cluster.device_index[d].speed for d in st.devices)
            af, bf, ab, bb = g.range_time(lo, hi)
            intervals = []
            for k in range(K):
                f_len = self._length(af / speed, bf / speed, s, k, self.q[s, k], f"dF_{s}_{k}")
                fa, fb = (ab / speed + af / speed, bb / speed + bf / speed) if st.recompute else (ab / speed, bb / speed)
                b_len = self._length(fa, fb, s, k, self.q[s, k], f"dB_{s}_{k}")
                for kind, length in ((FORWARD, f_len), ("B", b_len)):
                    start, end, iv = self._interval(f"{kind}_{s}_{k}", length)
                    self.op[s, kind, k] = (start, end)
                    intervals.append(iv)
            m.add_no_overlap(intervals)
            ops = stage_actions(self.problem.schedule, K, s, S)
            for prev, nxt in zip(ops, ops[1:]):
                m.add(self.op[tuple(nxt)][0] >= self.op[tuple(prev)][1])
            self.chain_end[s] = self.op[tuple(ops[-1])][1]

    def _transfers(self) -> None:
        """Transfer intervals on one no-overlap machine per link direction, FIFO by slot."""
        m, S, K = self.model, self.stages, self.slots
        c, g = self.problem.cluster, self.problem.graph
        # arrive[dir, s, k]: arrival of the transfer sent by slot k of stage s (dir 'f' or 'b')
        self.arrive = {}
        for s in range(S - 1):
            left = self.base.stages[s]
            cut = g.cut_bytes(left.layers[1] - 1)
            for direction, sender, receiver, kind in (("f", s, s + 1, FORWARD), ("b", s + 1, s, "B")):
                src, dst = self.base.stages[sender].devices, self.base.stages[receiver].devices
                lat = c.lat(src, dst)
                rate = min(len(src), len(dst)) * c.bw(src, dst)
                intervals, prev_end = [], None
                for k in range(K):
                    length = self._length(lat, cut / rate, sender, k, self.n[self.row(sender), k],
                                          f"t{direction}_{sender}_{k}")
                    start, end, iv = self._interval(f"x{direction}_{sender}_{k}", length)
                    m.add(start >= self.op[sender, kind, k][1])
                    if prev_end is not None:
                        m.add(start >= prev_end)
                    prev_end = end
                    intervals.append(iv)
                    self.arrive[direction, sender, k] = end
                m.add_no_overlap(intervals)

    def _waits(self) -> None:
        """The spec's sample-overlap waits (fixed ``j == k`` when the split is shared)."""
        m, S, K = self.model, self.stages, self.slots
        for s in range(S):
            for direction, other, kind in (("f", s - 1, FORWARD), ("b", s + 1, "B")):
                if not 0 <= other < S:
                    continue
                for k in range(K):
                    me = self.p[self.row(s), k]
                    start = self.op[s, kind, k][0]
                    if not self.problem.per_stage:
                        m.add(start >= self.arrive[direction, other, k]).only_enforce_if(me)
                        continue
                    for j in range(K):
                        # z: sender slot j starts before my last sample, so its data is awaited
                        z = m.new_bool_var(f"z{direction}_{s}_{k}_{j}")
                        before = self.cum[self.row(other), j - 1] if j > 0 else 0
                        m.add(self.cum[self.row(s), k] <= before).only_enforce_if(~z)
                        m.add(start >= self.arrive[direction, other, j]).only_enforce_if([z, me])

    def _memory(self) -> None:
        """Stash (plus recompute working set) within the devices after every op of the chain."""
        m, S, K = self.model, self.stages, self.slots
        g = self.problem.graph
        for s, (st, cost) in enumerate(zip(self.base.stages, self.costs)):
            lo, hi = st.layers
            act, inp = g.range_sum("act", lo, hi), g.stage_input_bytes(lo)
            per_sample, working = (inp, act) if st.recompute else (act, 0.0)
            room = cost.capacity - self.problem.state_factor * g.range_sum("params", lo, hi)
            if per_sample * self.batch + working * self.batch <= room:
                continue  # even the whole batch in flight fits: no constraint needed
            unit = max(per_sample, working) / 1e4  # bytes per memory unit; coefficients ~1e4
            sps, wps = math.floor(per_sample / unit), math.floor(working / unit)
            cap = math.ceil(room / unit)
            held = []
            for _, kind, k in stage_actions(self.problem.schedule, K, s, S):
                if kind == FORWARD:
                    held.append(self.q[s, k])
                    m.add(sps * sum(held) <= cap)
                else:
                    m.add(sps * sum(held) + wps * self.q[s, k] <= cap)
                    held = [h for h in held if h is not self.q[s, k]]

    def _objective(self) -> None:
        m = self.model
        self.makespan = m.new_int_var(0, self.horizon, "T")
        for s, cost in enumerate(self.costs):
            m.add(self.makespan >= self.chain_end[s] + math.floor(cost.allreduce * self.scale))
        self.rounding += len(self.costs)
        m.minimize(self.makespan)

    # ------------------------------------------------------------------ reading back
    def plan_from(self, solver: cp_model.CpSolver) -> Plan:
        """The base plan with the solver's split(s)."""
        splits = {}
        for t in range(self.stages if self.problem.per_stage else 1):
            sizes = [solver.value(self.n[t, k]) for k in range(self.slots)]
            splits[t] = tuple(n for n in sizes if n > 0)
        stages = tuple(Stage(st.layers, st.devices, splits[self.row(s)], st.recompute)
                       for s, st in enumerate(self.base.stages))
        return Plan(self.base.graph, self.base.cluster, self.base.global_batch, self.base.state_factor,
                    self.base.schedule, stages)


# --------------------------------------------------------------------------- the solver
def base_plans(problem: PlanningProblem, *, time_limit: float, seed: int, heuristics: tuple[Solver, ...] = (),
               exact: Solver | None = None, within: TimeLimit | None = None) -> list[tuple[str, SolverResult]]:
    """Fitting equal-split plans to start from: the best baseline, then ``heuristics``' and ``exact``'s.

    Every search runs on its own counted work (the baselines their whole search, the
    others their default budgets), each with what is left of ``time_limit`` as its cap,
    never a share of it: the plans found depend on the problem and the seed, unless the
    cap fires, which ``within``'s record notes.  The ``heuristics`` run on the problem's
    own equal split, ``exact`` on every count worth trying
    (:func:`pipeplan.solver.splits.equal_splits.solve_equal_splits`).  Sorted fastest first.
    """
    clock = within.within(time_limit) if within is not None else TimeLimit(time_limit)
    found: list[tuple[str, SolverResult]] = []
    baselines = []
    for cls in BASELINES:
        if clock.expired():
            break
        baselines.append(cls().solve(problem, time_limit=clock.remaining(), seed=seed, within=clock))
    baseline = fastest_baseline(baselines)
    if baseline is not None:
        found.append((baseline.name, baseline))
    for solver in heuristics:  # group-search: the large clusters' plans
        if clock.expired():
            break
        result = solver.solve(problem.equal_split_problem(), time_limit=clock.remaining(), seed=seed, within=clock)
        if result.plan is not None:
            found.append((solver.name, result))
    if exact is not None and not clock.expired():
        result = fastest(solve_equal_splits(exact, problem, time_limit=clock.remaining(), seed=seed,
                                            within=clock).values())
        if result.plan is not None and result.iteration_time is not None:
            found.append((exact.name, result))
    return sorted(found, key=lambda item: item[1].iteration_time)


def _warm_split(problem: PlanningProblem, base: Plan, deadline: TimeLimit) -> Plan:
    """``base`` with the best split the ``umpipe-dp`` and ``autopipe-slicing`` candidates give (``deadline``: a cap)."""
    options = UmpipeDP().options(problem, base, deadline) + AutoPipeSlicing().options(problem, base, deadline)
    return judge_splits(problem, base, options)[0]


class CpSatSplit(Solver):
    """Fixed pipeline from the baselines and the solvers given, then CP-SAT over microbatch splits.

    ``status`` is ``feasible`` (the partition and mapping are not optimised jointly);
    ``details`` carries ``split_status`` (``optimal`` when the split search proved
    optimality for that pipeline) and ``split_lower_bound``.
    """

    name = "cpsat-split"
    source = "UMPIPE (TPDS'25) unequal microbatches, solved exactly with a CP-SAT scheduling model"
    budget_unit = "CP-SAT deterministic seconds"
    default_budget = DEFAULT_BUDGET
    chooses_splits = True

    def __init__(self, *, workers: int = 1, heuristics: tuple[Solver, ...] = (), exact: Solver | None = None) -> None:
        self.workers = workers
        """CP-SAT workers (1 keeps same seed, same plan)."""
        self.heuristics = heuristics
        """Solvers whose equal-split plans may start the split search (beyond the baselines)."""
        self.exact = exact
        """An exact solver whose equal-split plans, at every count worth trying, may start it."""

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """Plan ``problem``; see the class and module docstrings (``budget``: of the split search).

        Every phase (the base plans, the warm split, the split search) ends on counted work;
        ``clock`` caps them all together, and only when it fires (``stopped_by: time``)
        may the plan differ between an idle and a loaded machine.
        """
        based = _part(clock)
        bases = base_plans(problem, time_limit=clock.left(), seed=seed, heuristics=self.heuristics, exact=self.exact,
                           within=based)
        based = based.stops
        if not bases:
            wall = clock.elapsed()
            why = ("time limit reached before a base plan was found" if based.time_cut
                   else "no baseline plan fits to start the split search from")
            return heuristic_no_plan(problem, self.name, why, wall, seed,
                                     details={"stopped_by_time_limit": based.time_cut})
        source, base = bases[0]
        warm = _warm_split(problem, base.plan, clock)  # the split baselines' best: hint and fallback
        if clock.expired():  # the limit went on the base plans: no split model is built past it (noted as a cut)
            return self._unsearched(problem, source, base, warm, clock.elapsed(), seed)
        left = clock.left()
        searching = _part(clock)
        search = optimize_splits(problem, warm, time_limit=left, seed=seed, workers=self.workers, budget=budget,
                                 within=searching)
        searched = searching.stops
        wall = clock.elapsed()
        details = {"base_solver": source, "base_iteration_time": base.iteration_time,
                   "split_status": search.status, "split_lower_bound": search.lower_bound, **search.details}
        trace = (TracePoint(0.0, base.iteration_time, None), TracePoint(wall, search.iteration_time, None))
        message = "" if search.status == "optimal" else (
            "split search not proved optimal: the time limit cut it" if searched.time_cut
            else "split search not proved optimal within its budget")
        return SolverResult(self.name, "feasible", search.plan, search.iteration_time, None, wall, seed, trace,
                            message, details)

    def _unsearched(self, problem: PlanningProblem, source: str, base: SolverResult, warm: Plan, wall: float,
                    seed: int) -> SolverResult:
        """The warm split's plan when the time limit ended before the split search could start."""
        timed = problem.evaluate(warm)
        plan, took = (warm, timed.iteration_time) if timed.fits else (base.plan, base.iteration_time)
        details = {"base_solver": source, "base_iteration_time": base.iteration_time, "split_status": "not run",
                   "split_lower_bound": None, "stopped_by_time_limit": True}
        trace = (TracePoint(0.0, base.iteration_time, None), TracePoint(wall, took, None))
        return SolverResult(self.name, "feasible", plan, took, None, wall, seed, trace,
                            "split search not run: the time limit was spent on the base plans", details)

def _part(clock: TimeLimit) -> TimeLimit:
    """``clock`` with a record of its own for one part of the solve, whose cuts still reach ``clock``'s."""
    return TimeLimit(clock.seconds, started=clock.started, stops=clock.stops.nested())
