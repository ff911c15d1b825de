"""cpsat-split: the CP-SAT split search matches brute force over every split of the batch."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.splits.cpsat_split import CpSatSplit, optimize_splits
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.solvers import get_solver
from pipeplan.solver.evaluation.batched import simulate_batch
from pipeplan.solver.evaluation.simulator import simulate
from helpers import split_instance


def compositions(batch: int, counts: range):
    """Every split of ``batch`` into a count of ``counts`` positive sizes."""
    for m in counts:
        for marks in itertools.combinations(range(1, batch), m - 1):
            ends = (0, *marks, batch)
            yield tuple(b - a for a, b in zip(ends[:-1], ends[1:]))


def brute_force(problem: PlanningProblem, base: Plan) -> float:
    """Fastest fitting iteration time over every split (shared or per stage) of the base pipeline.

    The batched simulator times them (its results equal the scalar simulator's to the bit,
    tests/test_batched.py): a 3-stage pipeline split per stage has 262,144 splits of a batch of 8.
    """
    splits = list(compositions(problem.global_batch, problem.split_counts))
    stages = len(base.stages)
    combos = itertools.product(splits, repeat=stages) if problem.per_stage else ((sp,) * stages for sp in splits)
    plans = [Plan("g", "c", base.global_batch, 4.0, base.schedule,
                  tuple(Stage(st.layers, st.devices, combo[s], st.recompute) for s, st in enumerate(base.stages)))
             for combo in combos]
    result = simulate_batch(plans, problem.graph, problem.cluster)  # a deadlock: infinite time
    return float(np.min(result.iteration_time, where=result.fits, initial=np.inf))


class TestOptimizeSplits:
    @pytest.mark.parametrize("seed", range(10))
    def test_matches_brute_force(self, seed):
        problem, base = split_instance(seed)
        best = brute_force(problem, base)
        found = optimize_splits(problem, base, time_limit=20)
        assert found.status == "optimal"
        assert found.iteration_time == pytest.approx(best, rel=1e-6)
        assert found.lower_bound <= best * (1 + 1e-12)
        assert simulate(found.plan, problem.graph, problem.cluster).iteration_time == found.iteration_time
        assert problem.in_split_space(found.plan)

    @pytest.mark.parametrize("seed", [2, 5])
    def test_memory_limits_respected(self, seed):
        problem, base = split_instance(seed)
        # room for the equal split only: the stash of a larger microbatch must not fit
        peak = max(simulate(base, problem.graph, problem.cluster).peak_memory)
        tight = Cluster("c", problem.cluster.servers, problem.cluster.network,
                        tuple(Device(d.id, d.server, d.speed, peak * 1.0001) for d in problem.cluster.devices))
        problem = PlanningProblem(problem.graph, tight, global_batch=problem.global_batch, microbatches=2,
                                  schedule=problem.schedule, auto_microbatches=True,
                                  max_microbatches=max(problem.split_counts), per_stage=problem.per_stage)
        found = optimize_splits(problem, base, time_limit=20)
        assert simulate(found.plan, problem.graph, problem.cluster).fits
        assert found.iteration_time == pytest.approx(brute_force(problem, base), rel=1e-6)

    def test_never_worse_than_equal(self):
        problem, base = split_instance(3)
        found = optimize_splits(problem, base, time_limit=10)
        assert found.iteration_time <= simulate(base, problem.graph, problem.cluster).iteration_time


    def test_times_below_the_tick_scale_keep_the_base_split(self):
        # layer times near 1e-303 s: 2**30 ticks over such a horizon is not a finite scale
        problem, base = split_instance(3)
        tiny = [Layer(l.name, (l.fwd[0] * 1e-300, l.fwd[1] * 1e-300), (l.bwd[0] * 1e-300, l.bwd[1] * 1e-300),
                      0.0, l.act, 0.0) for l in problem.graph.layers]
        graph = LayerGraph.chain("g", tiny, 0.0)
        instant = Cluster("c", (Link(1e9, 0.0, "s0"), Link(1e9, 0.0, "s1")), Link(1e8, 0.0),
                          problem.cluster.devices)
        problem = PlanningProblem(graph, instant, global_batch=base.global_batch, microbatches=2,
                                  schedule=base.schedule, auto_microbatches=True, max_microbatches=3)
        found = optimize_splits(problem, base, time_limit=5)
        assert found.plan == base and found.status == "feasible"


class TestCpSatSplit:
    def test_solver_result(self):
        problem, _ = split_instance(1)
        result = CpSatSplit().solve(problem, time_limit=10, seed=0)
        assert result.status == "feasible" and result.lower_bound is None
        assert result.details["split_lower_bound"] <= result.iteration_time * (1 + 1e-12)
        assert problem.in_split_space(result.plan)
        again = CpSatSplit().solve(problem, time_limit=10, seed=0)
        assert again.plan == result.plan

    def test_no_base_plan_is_not_called_infeasible(self, monkeypatch):
        import pipeplan.solver.splits.cpsat_split as module

        problem, _ = split_instance(0)
        cut = lambda *a, within, **k: within.stops.note("time") or []  # noqa: E731 - the time limit cut the search for a base
        monkeypatch.setattr(module, "base_plans", cut)
        result = get_solver("cpsat-split").solve(problem, time_limit=0.1)
        assert result.status == "timeout-no-solution" and result.details["stopped_by_time_limit"] is True
        assert result.message.startswith("time limit reached before a base plan was found")
        monkeypatch.setattr(module, "base_plans", lambda *a, **k: [])
        result = get_solver("cpsat-split").solve(problem, time_limit=10)
        assert result.status == "timeout-no-solution" and result.details["stopped_by_time_limit"] is False
        assert result.message.startswith("no baseline plan fits to start the split search from; that does not")



class TestStopping:
    """cpsat-split ends every phase on counted work; the time limit caps them together, never in shares.

    With shares (a tenth of the limit for each base search, 5 s for the warm split), an exact
    base search that needed a few seconds more on a loaded machine was cut there and the plan
    changed (gpt1-14 on 6 devices, seed 5: 16.88 ms idle, 18.46 ms with both cores busy)."""

    def test_every_phase_gets_what_is_left_of_the_limit(self, monkeypatch):
        import pipeplan.solver.baselines.umpipe as umpipe
        from pipeplan.solver.baselines import BASELINES
        from pipeplan.solver.exact.cpsat import CpSatSolver
        from pipeplan.solver.heuristics.group_search import GroupSearch

        problem, _ = split_instance(1)
        limit, calls = 50.0, []

        def spy(solve):
            def wrapped(self, sub, *, time_limit, **kw):
                calls.append((type(self).__name__, time_limit, left()))
                return solve(self, sub, time_limit=time_limit, **kw)
            return wrapped

        for cls in {*BASELINES, GroupSearch, CpSatSolver}:
            monkeypatch.setattr(cls, "solve", spy(cls.solve))
        deadlines = []
        options = umpipe.UmpipeDP.options
        monkeypatch.setattr(umpipe.UmpipeDP, "options",
                            lambda self, problem, base, deadline: deadlines.append(deadline) or options(self, problem,
                                                                                                      base, deadline))
        start = time.perf_counter()
        left = lambda: limit - (time.perf_counter() - start)  # noqa: E731
        result = get_solver("cpsat-split").solve(problem, time_limit=limit, seed=0)
        assert result.plan is not None and {name for name, _, _ in calls} >= {"CpSatSolver", "EvenSplit"}
        for name, given, remaining in calls:  # what was left when the call began (a share would be far less)
            assert remaining - 1.0 <= given <= limit, (name, given, remaining)
        assert deadlines and all(d.started + d.seconds == pytest.approx(start + limit, abs=1.0) for d in deadlines)

    def test_the_split_search_runs_its_default_budget(self):
        from pipeplan.solver.splits.cpsat_split import DEFAULT_BUDGET

        problem, _ = split_instance(1)
        result = CpSatSplit().solve(problem, time_limit=600, seed=0)
        assert result.record()["budget"] == DEFAULT_BUDGET == CpSatSplit.default_budget
