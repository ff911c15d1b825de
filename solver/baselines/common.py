"""What every baseline shares: device ranking, stage cost estimates, the recompute
fallback and the loop that lets the simulator pick the best proposal.

A baseline is a *proposal generator*: it yields ``(bounds, device groups)`` pairs the
way its source system would choose them, and :class:`Baseline` turns each into a plan,
switches on recompute for the stages that do not fit (when allowed), simulates it and
keeps the fastest plan that fits.  The simulator is the only judge, so a baseline's own
cost model only decides *which* plans are proposed, never how they are scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult, TracePoint
from pipeplan.solver.evaluation.simulator import PlanCosts, Simulation, plan_costs, run_programs
from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.termination import TimeLimit, WorkBudget, past
from pipeplan.solver.space.device_classes import fastest_first

Bounds = tuple[tuple[int, int], ...]
"""Half-open layer ranges of the stages, in order."""
Groups = tuple[tuple[str, ...], ...]
"""Device ids of each stage."""
Proposal = tuple[Bounds, Groups]
"""One candidate pipeline: stage ranges and device groups (recompute decided later)."""


# --------------------------------------------------------------------------- devices
def rank_devices(problem: PlanningProblem) -> list[str]:
    """Device ids, fastest first (then most memory), keeping a server's devices together
    (:func:`pipeplan.solver.space.device_classes.fastest_first`): baselines take devices from
    the front of this list."""
    return fastest_first(problem.cluster)


def split_groups(devices: Sequence[str], sizes: Sequence[int]) -> Groups:
    """Consecutive slices of ``devices`` of the given sizes."""
    groups, start = [], 0
    for size in sizes:
        groups.append(tuple(devices[start:start + size]))
        start += size
    return tuple(groups)


def bounds_from_cuts(cuts: Sequence[int]) -> Bounds:
    """``[0, c1, ..., L]`` -> ``((0, c1), (c1, c2), ...)``."""
    return tuple((int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]))


# --------------------------------------------------------------------------- cost estimates
@dataclass
class StageModel:
    """Closed-form per-stage estimates the baselines' own DPs use (not the judge).

    Parameters
    ----------
    problem : PlanningProblem
        The problem whose graph, cluster and batch the estimates use.
    """

    problem: PlanningProblem
    """The problem."""
    prefix: np.ndarray = field(init=False, repr=False)
    """Prefix sums of ``(a_f, b_f, a_b, b_b, params, act)`` per layer, shape ``(L+1, 6)``."""

    def __post_init__(self) -> None:
        rows = [(l.fwd[0], l.fwd[1], l.bwd[0], l.bwd[1], l.params, l.act) for l in self.problem.graph.layers]
        self.prefix = np.vstack([np.zeros(6), np.cumsum(np.array(rows, dtype=float), axis=0)])

    def sums(self, lo: int, hi: int) -> np.ndarray:
        """Summed ``(a_f, b_f, a_b, b_b, params, act)`` over layers ``lo <= i < hi``."""
        return self.prefix[hi] - self.prefix[lo]

    def compute(self, lo: int, hi: int, group: Sequence[str]) -> float:
        """Seconds of forward plus backward work of the whole batch on one replica of ``group``."""
        af, bf, ab, bb = self.sums(lo, hi)[:4]
        r = len(group)
        speed = min(self.problem.cluster.device_index[d].speed for d in group)
        per_replica = [math.ceil(n / r) for n in self.problem.split]
        return sum(af + ab + (bf + bb) * q for q in per_replica) / speed

    def allreduce(self, lo: int, hi: int, group: Sequence[str]) -> float:
        """The spec's ring all-reduce time of the stage's gradients (0 for one replica)."""
        r = len(group)
        if r < 2:
            return 0.0
        c = self.problem.cluster
        return 2 * (r - 1) * (c.lat(group) + self.sums(lo, hi)[4] / (r * c.bw(group)))

    def transfer(self, cut: int, left: Sequence[str], right: Sequence[str]) -> float:
        """Seconds to send the whole batch across the cut after layer ``cut`` (one way)."""
        c, g = self.problem.cluster, self.problem.graph
        if set(left) == set(right) or cut < 0 or cut >= len(g) - 1:
            return 0.0
        rate = min(len(left), len(right)) * c.bw(left, right)
        return self.problem.microbatches * c.lat(left, right) + self.problem.global_batch * g.cut_bytes(cut) / rate

    def min_memory(self, group: Sequence[str]) -> float:
        """The smallest memory among ``group``."""
        return min(self.problem.cluster.device_index[d].memory for d in group)

    def may_fit(self, lo: int, hi: int, group: Sequence[str]) -> bool:
        """A necessary condition for the stage to fit: state plus one microbatch in flight.

        A stage always holds its state and at least the activations of one microbatch
        while that microbatch's backward runs (recompute cannot shrink that), so a stage
        failing this test can never fit, whatever its position or schedule.
        """
        s = self.sums(lo, hi)
        q = math.ceil(max(self.problem.split) / len(group))
        return self.problem.state_factor * s[4] + q * s[5] <= self.min_memory(group)


# --------------------------------------------------------------------------- judging
@dataclass(frozen=True)
class Judged:
    """A proposal turned into a plan and simulated."""

    plan: Plan
    """The plan, recompute flags set."""
    result: Simulation
    """The simulator's verdict."""


def stage_fits(problem: PlanningProblem, bounds: Bounds, groups: Groups, cache: dict | None = None
               ) -> tuple[Plan, PlanCosts, list[bool]]:
    """The plan of a proposal, recompute on the stages that need it, its costs, and whether each stage fits.

    Every stage has its device group to itself, and its cost depends only on its own
    recompute flag (and its neighbours' devices and splits), so each stage is decided
    alone: without recompute when it fits so, else with recompute when the problem
    allows it and that fits.  With a ``cache`` (:func:`pipeplan.solver.evaluation.simulator.plan_costs`)
    the stages a proposal shares with earlier ones cost nothing.
    """
    plan = problem.make_plan(bounds, groups)
    costs = plan_costs(plan, problem.graph, problem.cluster, cache)
    over = [g.peak_memory > g.capacity for g in costs.groups]
    if any(over) and problem.allow_recompute:
        plan = problem.make_plan(bounds, groups, over)
        costs = plan_costs(plan, problem.graph, problem.cluster, cache)
    return plan, costs, [g.peak_memory <= g.capacity for g in costs.groups]


def fitting_costs(problem: PlanningProblem, bounds: Bounds, groups: Groups, cache: dict | None = None
                  ) -> tuple[Plan, PlanCosts] | None:
    """The plan of a proposal, recompute on the stages that need it, and its costs; or ``None``.

    Everything :func:`finalize` does but the timeline, for callers that time many plans
    at once (:func:`pipeplan.solver.evaluation.batched.iteration_times`).
    """
    if len(bounds) > problem.stage_limit or len(bounds) != len(groups):
        return None
    if not problem.allow_replication and any(len(g) > 1 for g in groups):
        return None
    plan, costs, fits = stage_fits(problem, bounds, groups, cache)
    return (plan, costs) if all(fits) else None


def finalize(problem: PlanningProblem, bounds: Bounds, groups: Groups, cache: dict | None = None) -> Judged | None:
    """The plan of a proposal, with recompute on the stages that need it, or ``None``.

    Recompute is switched on only for stages whose peak memory exceeds their smallest
    device (it costs a forward pass), and only when the problem allows it.  Returns
    ``None`` when the proposal leaves the search space or still does not fit.
    ``cache``: the costs of earlier proposals on this problem
    (:func:`pipeplan.solver.evaluation.simulator.plan_costs`).
    """
    fitted = fitting_costs(problem, bounds, groups, cache)
    if fitted is None:
        return None
    plan, costs = fitted
    return Judged(plan, run_programs(costs))


class Baseline(Solver):
    """Base class: subclasses set ``name`` and ``source`` and implement :meth:`proposals`.

    :meth:`run` judges every proposal with the simulator and returns the fastest
    fitting plan with status ``feasible`` (a baseline proves nothing, so it never
    claims ``optimal`` and gives no lower bound), or ``infeasible`` when none fits.
    It runs the method's whole search (no work budget); the clock is its only cap.
    """

    def proposals(self, problem: PlanningProblem, deadline: TimeLimit, seed: int) -> Iterator[Proposal]:
        """Candidate pipelines in the order the method would consider them (``deadline``: the solve's clock)."""
        raise NotImplementedError

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """Plan ``problem``; see the class docstring."""
        deadline = clock
        best: Judged | None = None
        seen: set[Proposal] = set()
        trace: list[TracePoint] = []
        timed_out = False
        for proposal in self.proposals(problem, deadline, seed):
            if proposal in seen:
                continue
            seen.add(proposal)
            judged = finalize(problem, *proposal)
            if judged is not None and (best is None or judged.result.iteration_time < best.result.iteration_time):
                best = judged
                trace.append(TracePoint(clock.elapsed(), best.result.iteration_time, None))
            if past(deadline):
                timed_out = True
                break
        # A DP cut short by the deadline yields nothing: that is a timeout, not infeasibility.
        timed_out = timed_out or past(deadline)
        wall = clock.elapsed()
        details = {"proposals": len(seen), "stopped_by_time_limit": timed_out}
        if best is None:
            why = "time limit reached before any proposal fitted" if timed_out else \
                "no proposal of this method fits in memory"
            status = "timeout-no-solution" if timed_out else "infeasible"
            return SolverResult(self.name, status, None, None, None, wall, seed, tuple(trace), why, details)
        message = "time limit reached; best proposal so far" if timed_out else ""
        return SolverResult(self.name, "feasible", best.plan, best.result.iteration_time, None, wall, seed,
                            tuple(trace), message, details)
