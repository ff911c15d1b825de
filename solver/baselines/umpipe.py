"""``umpipe-local`` and ``umpipe-dp``: UMPIPE's two baselines for unequal microbatches.

Source: UMPIPE (Zhou, Tian, Buyya, Wu; IEEE TPDS 36(2), 2025; ``papers.md`` §1), which
compares its genetic search (DGAP/TiDGAP) with "the local greedy algorithm" and "global
greedy-based dynamic programming".  Only the abstract is public, so both are the
reconstruction of ``papers.md`` §1.3:

- *local greedy*: every stage picks, on its own, the microbatch size that minimises its
  GPipe-style estimate ``(m + S - 1) * (TF(b) + TB(b))`` with ``m = ceil(B / b)``: as
  if every stage were like it (a large size saves per-call costs, a small one fills the
  pipeline sooner).
- *global greedy DP*: stages are decided in pipeline order; a beam of the best partial
  choices (the DP states) is extended by every candidate split of the next stage and the
  prefixes are ranked by the simulated makespan of the prefix pipeline.

Both keep the pipeline (stages, devices, recompute) of the best equal-split baseline
and only choose splits, within :attr:`PlanningProblem.split_counts`; one split shared
by all stages unless ``per_stage``.  The simulator (batched) judges every candidate,
and the equal split of the baseline is always a candidate, so neither is ever worse
than that baseline.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from pipeplan.solver.baselines.portfolio import fastest, run_baselines
from pipeplan.solver.evaluation.batched import BatchSimulator, Candidate
from pipeplan.solver.formats.plan import Plan, Stage, equal_split
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult, TracePoint
from pipeplan.solver.core.algorithm import Solver
from pipeplan.solver.core.termination import TimeLimit, WorkBudget, past

Split = tuple[int, ...]
"""Microbatch sizes of one stage."""


def with_splits(plan: Plan, splits: Sequence[Split]) -> Plan:
    """``plan`` with stage ``s`` using ``splits[s]``."""
    stages = tuple(Stage(st.layers, st.devices, tuple(sp), st.recompute) for st, sp in zip(plan.stages, splits))
    return Plan(plan.graph, plan.cluster, plan.global_batch, plan.state_factor, plan.schedule, stages)


def judge_splits(problem: PlanningProblem, base: Plan, options: Iterable[Sequence[Split]]
                 ) -> tuple[Plan, float, int]:
    """The fastest fitting plan among ``base`` and ``base`` with each split assignment.

    Assignments outside the problem's split space (:meth:`PlanningProblem.in_split_space`:
    with ``--microbatches M`` alone, only the equal split) are left out.

    Returns
    -------
    (plan, iteration_time, evaluated)
    """
    sim = BatchSimulator(problem.graph, problem.cluster, problem.schedule, problem.state_factor)
    base_c = Candidate.from_plan(base)
    inside = [o for o in options if problem.in_split_space(with_splits(base, o))]
    cands = [base_c] + [Candidate(base_c.bounds, base_c.groups, base_c.recompute, tuple(map(tuple, o)))
                        for o in inside]
    res = sim.evaluate(cands)
    times = np.where(res.fits, res.iteration_time, np.inf)
    best = int(np.argmin(times))  # first minimum: the base wins ties
    return with_splits(base, cands[best].splits), float(times[best]), len(cands)


def stage_estimate(problem: PlanningProblem, plan: Plan, s: int, m: int) -> float:
    """GPipe-style time of stage ``s`` with ``m`` equal microbatches: ``(m + S - 1) * (TF + TB)``."""
    st = plan.stages[s]
    lo, hi = st.layers
    af, bf, ab, bb = problem.graph.range_time(lo, hi)
    speed = min(problem.cluster.device_index[d].speed for d in st.devices)
    q = math.ceil(max(equal_split(problem.global_batch, m)) / len(st.devices))
    tf = (af + bf * q) / speed
    tb = (ab + bb * q) / speed + (tf if st.recompute else 0.0)
    return (m + len(plan.stages) - 1) * (tf + tb)


def _base(problem: PlanningProblem, seed: int, time_limit: float, within: TimeLimit) -> tuple[SolverResult | None, bool]:
    """The best equal-split baseline, and whether any baseline was cut short by its share of the time."""
    results = run_baselines(problem, seed=seed, time_limit=time_limit, within=within)
    return fastest(results), any(r.details["stopped_by_time_limit"] for r in results)


class _SplitBaseline(Solver):
    """Shared solve loop: best equal-split pipeline, then :meth:`options` judged by the simulator."""

    chooses_splits = True

    def options(self, problem: PlanningProblem, base: Plan, deadline: TimeLimit) -> list[list[Split]]:
        raise NotImplementedError

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """Plan ``problem``: status ``feasible``, no bound (a heuristic proves nothing)."""
        base, cut = _base(problem, seed, 0.5 * clock.seconds, clock)
        if base is None:
            return SolverResult(self.name, "timeout-no-solution" if cut else "infeasible", None, None, None,
                                clock.elapsed(), seed,
                                message="no equal-split baseline plan fits to start from",
                                details={"stopped_by_time_limit": cut})
        options = self.options(problem, base.plan, clock)
        plan, best, evaluated = judge_splits(problem, base.plan, options)
        wall = clock.elapsed()
        # cut short anywhere (a baseline, or the options at the deadline): the plan depends on the machine's speed
        cut = cut or past(clock)
        trace = (TracePoint(0.0, base.iteration_time, None), TracePoint(wall, best, None))
        return SolverResult(self.name, "feasible", plan, best, None, wall, seed, trace,
                            "time limit reached; best split so far" if cut else "",
                            {"base_solver": base.name, "base_iteration_time": base.iteration_time,
                             "evaluated": evaluated, "stopped_by_time_limit": cut})


class UmpipeLocal(_SplitBaseline):
    """UMPIPE's local greedy: each stage picks its own best microbatch size."""

    name = "umpipe-local"
    source = "UMPIPE (TPDS'25) local greedy baseline, reconstructed (papers.md §1.3)"

    def options(self, problem: PlanningProblem, base: Plan, deadline: TimeLimit) -> list[list[Split]]:
        counts = problem.split_counts
        picks = [min(counts, key=lambda m: (stage_estimate(problem, base, s, m), m))
                 for s in range(len(base.stages))]
        if problem.per_stage:
            return [[equal_split(problem.global_batch, m) for m in picks]]
        # one split for all: each stage's pick is a candidate, the simulator chooses
        return [[equal_split(problem.global_batch, m)] * len(base.stages) for m in sorted(set(picks))]


def candidate_splits(problem: PlanningProblem) -> list[Split]:
    """Per-stage choices of the DP: the equal split of every allowed count and, where
    sizes are decisions (:attr:`PlanningProblem.free_sizes`), also its smaller-first
    order and its front-halved variant (a small first microbatch fills the pipeline sooner)."""
    out: list[Split] = []
    batch = problem.global_batch
    for m in problem.split_counts:
        split = equal_split(batch, m)
        if not problem.free_sizes:
            out.append(split)  # M equal microbatches: the only split there is
            continue
        out.append(split)  # the equal split itself (larger first, as M equal microbatches are)
        out.append(split[::-1])  # smaller microbatches first
        if split[-1] >= 2 and m + 1 in problem.split_counts:
            out.append((split[-1] // 2, split[-1] - split[-1] // 2) + split[:-1][::-1])
    return list(dict.fromkeys(out))


class UmpipeDP(_SplitBaseline):
    """UMPIPE's global greedy-based DP: stage by stage, a beam of prefixes ranked by simulation."""

    name = "umpipe-dp"
    source = "UMPIPE (TPDS'25) global greedy-based DP baseline, reconstructed (papers.md §1.3)"

    def __init__(self, beam: int = 4) -> None:
        self.beam = beam
        """DP states kept per stage."""

    def options(self, problem: PlanningProblem, base: Plan, deadline: TimeLimit) -> list[list[Split]]:
        choices = candidate_splits(problem)
        stages = len(base.stages)
        shared = [[sp] * stages for sp in choices]  # one split for every stage: in every search space
        if not problem.per_stage or stages == 1:
            return shared
        sim = BatchSimulator(problem.graph, problem.cluster, problem.schedule, problem.state_factor)
        full = Candidate.from_plan(base)
        states: list[tuple[Split, ...]] = [()]
        for s in range(stages):
            prefixes = [st + (sp,) for st in states for sp in choices]
            n = s + 1
            cands = [Candidate(full.bounds[:n], full.groups[:n], full.recompute[:n], p) for p in prefixes]
            res = sim.evaluate(cands)
            score = np.where(res.fits, res.iteration_time, np.inf)
            keep = np.argsort(score, kind="stable")[:self.beam]
            states = [prefixes[i] for i in keep if np.isfinite(score[i])] or states
            if past(deadline):
                break
        # the beam adds per-stage splits; with the shared ones a larger space never gives a worse plan
        return shared + [list(st) for st in states if len(st) == stages and len(set(st)) > 1]
