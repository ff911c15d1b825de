"""Version-2 searches started from version-1 partitions (solver/space/virtual_space.py, virtual_groups.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import owner, virtual_problem
from pipeplan.solver.core.termination import TimeLimit, WorkBudget
from pipeplan.solver.exact.virtual_search import move_layers, solve_v2
from pipeplan.solver.heuristics.group_search import group_search
from pipeplan.solver.heuristics.virtual_groups import (PARTITION_PLANS, POLISH_SIMULATIONS, VirtualGroupSearch,
                                                    equal_groupings, heuristic_boundaries, partition_seeds, polish,
                                                    speed_bounds, speed_starts)
from pipeplan.solver.space.virtual_space import Candidate, from_partition, layer_moves, split_range, to_plan

VALUES = st.lists(st.floats(0.1, 2.0), min_size=40, max_size=40)
V2 = ("interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv")


class TestSplitRange:
    def test_balances_the_work(self):
        assert split_range([1.0, 1.0, 2.0, 1.0, 1.0], 0, 5, 2) == ((0, 3), (3, 5))

    def test_even_split_when_balance_leaves_a_part_empty(self):
        assert split_range([10.0, 0.0, 0.0], 0, 3, 3) == ((0, 1), (1, 2), (2, 3))

    def test_too_few_layers(self):
        assert split_range([1.0] * 4, 1, 3, 3) is None

    @given(st.lists(st.floats(0.0, 5.0), min_size=1, max_size=12), st.integers(1, 4))
    @settings(max_examples=30, deadline=None, derandomize=True)
    def test_covers_the_range_with_non_empty_parts(self, work, parts):
        found = split_range(work, 0, len(work), parts)
        if len(work) < parts:
            assert found is None
            return
        assert len(found) == parts and found[0][0] == 0 and found[-1][1] == len(work)
        assert all(lo < hi for lo, hi in found) and all(a[1] == b[0] for a, b in zip(found, found[1:]))


class TestFromPartition:
    @pytest.mark.parametrize("schedule", V2)
    def test_each_group_keeps_its_layer_count(self, schedule):
        p = virtual_problem([1.0] * 40, schedule, devices=2, layers=8, virtual=None if schedule == "zbv" else 2)
        groups, ranges = [("d0",), ("d1",)], [(0, 3), (3, 8)]
        candidate = from_partition(p, groups, ranges, 2)
        held = [0, 0]
        for s, (lo, hi) in enumerate(candidate.bounds):
            held[owner(schedule, s, 2)] += hi - lo
        assert held == [3, 5] and candidate.bounds[0][0] == 0 and candidate.bounds[-1][1] == 8
        assert candidate.groups == (("d0",), ("d1",)) and candidate.recompute == (False,) * 4

    def test_refuses_a_group_with_fewer_layers_than_chunks(self):
        p = virtual_problem([1.0] * 40, "looped-bfs", devices=2, layers=4, virtual=2)
        assert from_partition(p, [("d0",), ("d1",)], [(0, 1), (1, 4)], 2) is None

    def test_refuses_a_group_count_torch_refuses(self):
        # m = 5 on 2 groups: rounds = 2 does not divide 5
        p = virtual_problem([1.0] * 40, "interleaved-1f1b", devices=2, layers=4, batch=5, m=5, virtual=2)
        assert from_partition(p, [("d0",), ("d1",)], [(0, 2), (2, 4)], 2) is None


class TestSeeds:
    def test_solve_v2_is_never_slower_than_a_fitting_seed(self):
        p = virtual_problem([0.5 + 0.1 * i for i in range(40)], "looped-bfs", devices=2, layers=4, virtual=2)
        seed = Candidate(2, (("d1",), ("d0",)), ((0, 1), (1, 2), (2, 3), (3, 4)), (False,) * 4)
        seeded = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, budget=WorkBudget(1), seeds=[seed])
        assert seeded.details["simulations"] == 1
        assert seeded.iteration_time == p.evaluate(to_plan(p, seed)).iteration_time

    def test_a_seed_that_does_not_fit_is_tried_with_recompute(self):
        p = virtual_problem([0.5 + 0.1 * i for i in range(40)], "looped-bfs", devices=2, layers=4, virtual=2,
                            memory=8000.0)
        seed = Candidate(2, (("d0",), ("d1",)), ((0, 1), (1, 2), (2, 3), (3, 4)), (False,) * 4)
        plain, again = (p.evaluate(to_plan(p, replace(seed, recompute=f))) for f in ((False,) * 4, (True,) * 4))
        assert not plain.fits and again.fits
        seeded = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, budget=WorkBudget(2), seeds=[seed])
        assert seeded.iteration_time == again.iteration_time


class TestPartitionSeeds:
    @settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(VALUES, st.sampled_from(V2), st.integers(1, 2))
    def test_never_slower_than_the_v2_form_of_the_best_v1_partitions(self, values, schedule, servers):
        """For a fixed ``v``: the plan is at most every fitting version-2 form of group-search's best
        version-1 partitions (what :func:`partition_seeds` guarantees; not the version-1 plans' own times)."""
        p = virtual_problem(values, schedule, devices=3, layers=6, batch=4, m=2, servers=servers,
                            virtual=None if schedule == "zbv" else 2)
        found = VirtualGroupSearch().solve(p, time_limit=60, seed=0)
        one = group_search(replace(p, schedule="1f1b", virtual_stages=None), TimeLimit(60.0))
        forms = [from_partition(p, [s.devices for s in j.plan.stages], [s.layers for s in j.plan.stages], 2)
                 for j in one.plans[:PARTITION_PLANS]]
        times = [p.evaluate(to_plan(p, c)) for c in forms if c is not None]
        fitting = [t.iteration_time for t in times if t.fits]
        if fitting:
            assert found.iteration_time <= min(fitting) * (1 + 1e-12)
        assert found.details["v1_patterns"] >= 1 and found.details["seeds"] >= len([c for c in forms if c])

    def test_counts_the_patterns_against_the_budget(self):
        p = virtual_problem([1.0] * 40, "looped-bfs", devices=2, layers=8, virtual=2)
        budget = WorkBudget(1000)
        seeds, spent = partition_seeds(p, TimeLimit(60.0), budget)
        assert spent >= 1 and budget.spent == spent and seeds
        assert partition_seeds(p, TimeLimit(60.0), WorkBudget(1000)) == (seeds, spent)  # deterministic


class TestLayerMoves:
    @given(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    @settings(max_examples=40, deadline=None, derandomize=True)
    def test_every_move_takes_one_layer_from_one_stage_to_another(self, sizes):
        edges = [0]
        for n in sizes:
            edges.append(edges[-1] + n)
        bounds = tuple(zip(edges[:-1], edges[1:]))
        moves = list(layer_moves(bounds))
        givers = sum(1 for n in sizes if n > 1)
        assert len(moves) == givers * (len(sizes) - 1) and len(set(moves)) == len(moves)
        for moved in moves:
            assert moved[0][0] == 0 and moved[-1][1] == edges[-1]
            assert all(a[1] == b[0] for a, b in zip(moved, moved[1:])) and all(lo < hi for lo, hi in moved)
            change = [(hi - lo) - n for (lo, hi), n in zip(moved, sizes)]
            assert sorted(change) == [-1] + [0] * (len(sizes) - 2) + [1]

    def test_a_single_stage_has_none(self):
        assert list(layer_moves(((0, 5),))) == []


class TestMoveLayers:
    @staticmethod
    def unbalanced(schedule: str = "looped-bfs"):
        p = virtual_problem([0.5 + 0.05 * i for i in range(80)], schedule, devices=2, layers=8, virtual=2)
        plan = to_plan(p, Candidate(2, (("d0",), ("d1",)), ((0, 5), (5, 6), (6, 7), (7, 8)), (False,) * 4))
        return p, plan, p.evaluate(plan).iteration_time

    def test_ends_at_a_split_no_single_move_improves(self):
        p, plan, start = self.unbalanced()
        moved = move_layers(p, plan, start, WorkBudget(10_000), TimeLimit(60.0))
        assert moved.kept >= 1 and moved.time < start
        assert moved.time == p.evaluate(moved.plan).iteration_time and p.evaluate(moved.plan).fits
        devices = [st.devices for st in moved.plan.stages]
        for bounds in layer_moves(tuple(st.layers for st in moved.plan.stages)):
            assert p.evaluate(p.make_plan(bounds, devices)).iteration_time >= moved.time * (1 - 1e-12)

    def test_keeps_devices_and_flags(self):
        p, plan, start = self.unbalanced()
        moved = move_layers(p, plan, start, WorkBudget(10_000), TimeLimit(60.0))
        assert [st.devices for st in moved.plan.stages] == [st.devices for st in plan.stages]
        assert [st.recompute for st in moved.plan.stages] == [st.recompute for st in plan.stages]

    @pytest.mark.parametrize("units", [1, 5])
    def test_spends_at_most_its_budget(self, units):
        p, plan, start = self.unbalanced()
        budget = WorkBudget(units)
        moved = move_layers(p, plan, start, budget, TimeLimit(60.0))
        assert moved.simulations == budget.spent <= units and moved.time <= start

    def test_a_spent_budget_leaves_the_plan(self):
        p, plan, start = self.unbalanced()
        budget = WorkBudget(1)
        budget.spend()
        moved = move_layers(p, plan, start, budget, TimeLimit(60.0))
        assert moved.plan is plan and moved.simulations == moved.kept == 0

    def test_is_deterministic(self):
        p, plan, start = self.unbalanced("interleaved-zb")
        first, again = (move_layers(p, plan, start, WorkBudget(10_000), TimeLimit(60.0)) for _ in range(2))
        assert first == again


class TestVirtualGroupSearchMoves:
    @pytest.mark.parametrize("schedule", V2)
    def test_its_plan_is_no_slower_than_the_restricted_search(self, schedule):
        p = virtual_problem([0.4 + 0.07 * i for i in range(80)], schedule, devices=3, layers=8, batch=4, m=2,
                            virtual=None if schedule == "zbv" else 2)
        found = VirtualGroupSearch().solve(p, time_limit=60, seed=0)
        budget = WorkBudget(20_000)
        seeds, _ = partition_seeds(p, TimeLimit(60.0), budget)
        alone = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, budget=budget, seeds=seeds,
                         boundaries=heuristic_boundaries(p), groupings=equal_groupings, proves=False)
        assert found.iteration_time <= alone.iteration_time
        assert found.iteration_time == p.evaluate(found.plan).iteration_time and p.evaluate(found.plan).fits

    def test_the_moves_find_a_faster_plan_on_some_schedule(self):
        found = []
        for schedule in V2:
            p = virtual_problem([0.4 + 0.07 * i for i in range(80)], schedule, devices=3, layers=8, batch=4, m=2,
                                virtual=None if schedule == "zbv" else 2)
            found.append(VirtualGroupSearch().solve(p, time_limit=60, seed=0).details["layer_moves"])
        assert max(found) >= 1


class TestSpeedBounds:
    @staticmethod
    def problem(schedule="looped-bfs", layers=12, speeds=(3.0, 1.0)):
        p = virtual_problem([1.0] * 200, schedule, devices=len(speeds), layers=layers, virtual=2)
        devices = tuple(replace(d, speed=v) for d, v in zip(p.cluster.devices, speeds))
        return replace(p, cluster=replace(p.cluster, devices=devices))

    def test_a_faster_group_gets_more_layers(self):
        p = self.problem()
        bounds = speed_bounds(p, (("d0",), ("d1",)), 2)
        sizes = [hi - lo for lo, hi in bounds]
        # looped-bfs with v = 2: stages 0 and 2 on the fast group, 1 and 3 on the slow one
        assert bounds[0][0] == 0 and bounds[-1][1] == 12 and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert sizes[0] > sizes[1] and sizes[2] > sizes[3]

    def test_every_stage_keeps_a_layer(self):
        p = self.problem(layers=4, speeds=(100.0, 1.0))
        assert [hi - lo for lo, hi in speed_bounds(p, (("d0",), ("d1",)), 2)] == [1, 1, 1, 1]

    def test_too_few_layers(self):
        assert speed_bounds(self.problem(layers=3), (("d0",), ("d1",)), 2) is None


class TestSpeedStarts:
    def test_one_start_per_group_count_on_the_widest_groups(self):
        p = virtual_problem([1.0] * 200, "looped-bfs", devices=4, layers=12, virtual=2)
        starts = speed_starts(p)
        assert [len(c.groups) for c in starts] == sorted({len(c.groups) for c in starts})
        for c in starts:
            assert sum(len(g) for g in c.groups) == 4 - 4 % len(c.groups) and len({len(g) for g in c.groups}) == 1
            assert c.virtual == 2 and not any(c.recompute)


class TestPolish:
    def test_never_slower_and_spends_what_it_says(self):
        p = virtual_problem([0.4 + 0.07 * i for i in range(80)], "zbv", devices=3, layers=8, batch=4, m=2)
        budget = WorkBudget(20_000)
        seeds, _ = partition_seeds(p, TimeLimit(60.0), budget)
        found = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, budget=budget, seeds=seeds)
        before = budget.spent
        polished = polish(p, found, seeds + speed_starts(p), budget, TimeLimit(60.0))
        assert polished.time <= found.iteration_time and polished.time == p.evaluate(polished.plan).iteration_time
        assert budget.spent - before == polished.simulations <= POLISH_SIMULATIONS

    def test_a_spent_budget_leaves_the_plan(self):
        p = virtual_problem([0.4 + 0.07 * i for i in range(80)], "zbv", devices=3, layers=8, batch=4, m=2)
        found = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, budget=WorkBudget(100))
        budget = WorkBudget(1)
        budget.spend()
        polished = polish(p, found, speed_starts(p), budget, TimeLimit(60.0))
        assert polished.plan is found.plan and polished.simulations == 0
