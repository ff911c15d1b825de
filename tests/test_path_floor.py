"""path_floor: the fill, busiest stage and drain of a plan never exceed its simulated time."""

from __future__ import annotations

import itertools

import pytest

from pipeplan.solver.baselines.common import finalize
from pipeplan.solver.bounds.path_floor import StageTerms, path_floor, stage_terms
from pipeplan.solver.evaluation.simulator import plan_costs
from helpers import random_problem


class TestStageTerms:
    def test_hand_computed(self):
        problem = random_problem(0, memory=1e12)
        ids = [d.id for d in problem.cluster.devices]
        L = len(problem.graph)
        plan = finalize(problem, ((0, 1), (1, L)), ((ids[0],), (ids[1],))).plan if L > 1 else None
        if plan is None:
            pytest.skip("a one-layer graph")
        costs = plan_costs(plan, problem.graph, problem.cluster)
        (first, second), (out, back) = costs.groups, costs.links
        terms = stage_terms(first, out)
        f0 = first.durations[first.program.index((0, "F", 0))]
        assert terms.head == f0 + out.send_fwd[0]
        assert terms.busy == pytest.approx(sum(first.durations))
        assert terms.back == 0.0 and stage_terms(second, back).back == back.send_bwd[-1]
        assert stage_terms(second, back).head == second.durations[0]  # nothing to send after the last stage

    def test_unknown_op_order_gives_none(self):
        problem = random_problem(1, memory=1e12)
        plan = finalize(problem, ((0, len(problem.graph)),), ((problem.cluster.devices[0].id,),)).plan
        costs = plan_costs(plan, problem.graph, problem.cluster)
        cost = costs.groups[0]
        reordered = type(cost)(**{**cost.__dict__, "program": tuple(reversed(cost.program))})
        assert stage_terms(reordered, costs.links[0]) is None


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
                costs = plan_costs(judged.plan, problem.graph, problem.cluster)
                terms = [stage_terms(g, lk) for g, lk in zip(costs.groups, costs.links)]
                assert path_floor(terms, same_split=True) <= judged.result.iteration_time
                checked += 1
        assert checked or L == 0
