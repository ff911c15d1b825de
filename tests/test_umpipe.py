"""UMPIPE's baselines and AutoPipe's slicing: valid split plans, never worse than equal."""

from __future__ import annotations

import pytest

from solver.baselines import best_baseline
from solver.baselines.slicing import sliced
from solver.baselines.umpipe import candidate_splits, judge_splits, stage_estimate
from solver.registry import get_solver
from test_cpsat_split import instance

NAMES = ["umpipe-local", "umpipe-dp", "autopipe-slicing"]


class TestSplitBaselines:
    @pytest.mark.parametrize("name", NAMES)
    @pytest.mark.parametrize("seed", range(4))
    def test_never_worse_than_equal(self, name, seed):
        problem, _ = instance(seed)
        equal = best_baseline(problem, time_limit=5)
        result = get_solver(name).solve(problem, time_limit=5)
        assert get_solver(name).source
        assert result.status == "feasible"
        assert problem.in_split_space(result.plan)
        assert result.iteration_time <= equal.iteration_time


class TestSliced:
    def test_halves_first(self):
        assert sliced((4, 4, 4), 2) == (2, 2, 2, 2, 4)
        assert sliced((1, 3), 1) == (1, 3)


class TestCandidateSplits:
    def test_counts_and_sums(self):
        problem, _ = instance(0)
        for split in candidate_splits(problem):
            assert sum(split) == problem.global_batch and len(split) in problem.split_counts


class TestJudgeSplits:
    def test_base_kept_on_ties(self):
        problem, base = instance(0)
        plan, _, evaluated = judge_splits(problem, base, [[st.microbatches for st in base.stages]])
        assert plan.stages == base.stages and evaluated == 2


class TestStageEstimate:
    def test_positive(self):
        problem, base = instance(0)
        assert stage_estimate(problem, base, 0, 2) > 0
