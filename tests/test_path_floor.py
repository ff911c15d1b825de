"""path_floor: the fill, busiest stage and drain of a plan never exceed its simulated time."""

from __future__ import annotations

import itertools

import pytest

from pipeplan.solver.baselines.common import finalize
from pipeplan.solver.bounds.path_floor import StageTerms, path_floor, stage_terms
from pipeplan.solver.evaluation.simulator import stage_costs
from helpers import random_problem


class TestStageTerms:
    def test_hand_computed(self):
        problem = random_problem(0, memory=1e12)
        ids = [d.id for d in problem.cluster.devices]
        L = len(problem.graph)
        plan = finalize(problem, ((0, 1), (1, L)), ((ids[0],), (ids[1],))).plan if L > 1 else None
        if plan is None:
            pytest.skip("a one-layer graph")
        first, second = stage_costs(plan, problem.graph, problem.cluster)
        terms = stage_terms(first)
        assert terms.head == first.fwd[0] + first.send_fwd[0]
        assert terms.busy == pytest.approx(sum(first.fwd) + sum(first.bwd))
        assert terms.back == 0.0 and stage_terms(second).back == second.send_bwd[-1]
        assert stage_terms(second).head == second.fwd[0]  # nothing to send after the last stage

    def test_unknown_op_order_gives_none(self):
        problem = random_problem(1, memory=1e12)
        plan = finalize(problem, ((0, len(problem.graph)),), ((problem.cluster.devices[0].id,),)).plan
        cost = stage_costs(plan, problem.graph, problem.cluster)[0]
        assert stage_terms(type(cost)(**{**cost.__dict__, "ops": tuple(reversed(cost.ops))})) is None


class TestPathFloor:
    def test_hand_computed(self):
        a = StageTerms(head=1.0, busy=4.0, back=0.0, last_bwd=1.0, tail=0.5)
        b = StageTerms(head=1.0, busy=6.0, back=0.25, last_bwd=1.5, tail=0.0)
        assert path_floor([a, b], True) == pytest.approx(1 + 6 + 0.25 + 1 + 0.5)
        assert path_floor([a, b], False) == pytest.approx(7.0)
        assert path_floor([a, None], True) == 0.0

    @pytest.mark.parametrize("seed", range(40))
    def test_never_above_the_simulated_time(self, seed):
        """Brute force: every split of every random problem onto the first devices, one or two per stage."""
        problem = random_problem(seed, memory=1e12)
        ids = [d.id for d in problem.cluster.devices]
        L = len(problem.graph)
        checked = 0
        for stages in range(1, min(L, len(ids)) + 1):
            for cuts in itertools.combinations(range(1, L), stages - 1):
                ends = list(cuts) + [L]
                bounds = tuple(zip([0] + ends[:-1], ends))
                r = 2 if len(ids) >= 2 * stages else 1
                groups = tuple(tuple(ids[s * r:(s + 1) * r]) for s in range(stages))
                judged = finalize(problem, bounds, groups)
                if judged is None:
                    continue
                terms = [stage_terms(c) for c in stage_costs(judged.plan, problem.graph, problem.cluster)]
                assert path_floor(terms, same_split=True) <= judged.result.iteration_time
                checked += 1
        assert checked or L == 0
