"""Joint exact search over pipelines and splits against brute force over everything."""

import random
from itertools import combinations, islice, product

import numpy as np

import pytest

from conftest import make_layer
from pipeplan.models.errors import DeadlockError
from pipeplan.models.graph import LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.core.termination import TimeLimit
from pipeplan.solver.splits.joint_split import _device_groups, fits_some_split, pipeline_bound, pipelines, solve_joint
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.evaluation.batched import simulate_batch
from pipeplan.solver.evaluation.simulator import simulate


def compositions(total, max_parts):
    for parts in range(1, max_parts + 1):
        for cuts in combinations(range(1, total), parts - 1):
            edges = (0, *cuts, total)
            yield tuple(b - a for a, b in zip(edges, edges[1:]))


def every_plan(problem):
    """All plans of the split search space, with no symmetry reduction."""
    n, ids = len(problem.graph), [d.id for d in problem.cluster.devices]
    splits = list(compositions(problem.global_batch, max(problem.split_counts)))
    for stages in range(1, problem.stage_limit + 1):
        for cuts in combinations(range(1, n), stages - 1):
            edges = (0, *cuts, n)
            for labels in product(range(stages + 1), repeat=len(ids)):  # 0 = unused
                groups = [tuple(d for d, lab in zip(ids, labels) if lab == s + 1) for s in range(stages)]
                if any(not g for g in groups) or (not problem.allow_replication and any(len(g) > 1 for g in groups)):
                    continue
                split_sets = product(splits, repeat=stages) if problem.per_stage else ((s,) * stages for s in splits)
                for chosen in split_sets:
                    for rc in product((False, True), repeat=stages):
                        yield Plan("g", "c", problem.global_batch, problem.state_factor, problem.schedule,
                                   tuple(Stage((edges[s], edges[s + 1]), groups[s], chosen[s], rc[s])
                                         for s in range(stages)))


def brute_force(problem, chunk: int = 20_000):
    """Fastest fitting plan of :func:`every_plan`, timed by the batched simulator (bit-equal to the scalar one,
    tests/test_batched.py) ``chunk`` plans at a time; a deadlock is an infinite time."""
    best, plans = float("inf"), every_plan(problem)
    while batch := list(islice(plans, chunk)):
        result = simulate_batch(batch, problem.graph, problem.cluster)
        best = min(best, float(np.min(result.iteration_time, where=result.fits, initial=np.inf)))
    return best


def instance(seed, per_stage, schedule):
    rng = random.Random(seed)
    layers = [make_layer(i, fwd=(rng.choice([0, 0.5, 2]), rng.choice([0.5, 1])),
                         bwd=(rng.choice([0, 1, 3]), rng.choice([1, 2])),
                         params=rng.choice([0, 4]), act=rng.choice([1, 3]), out=rng.choice([1, 4]))
              for i in range(3)]
    graph = LayerGraph.chain("g", layers, input_bytes=1)
    cluster = Cluster("c", (Link(8.0, 0.1, "s0"), Link(4.0, 0.2, "s1")), Link(2.0, 0.3),
                      (Device("d0", "s0", 1.0, rng.choice([40, 1e9])), Device("d1", "s0", 1.0, 1e9),
                       Device("d2", "s1", 0.5, rng.choice([30, 1e9]))))
    return PlanningProblem(graph, cluster, 4, 2, schedule, auto_microbatches=True, max_microbatches=3,
                           per_stage=per_stage)


def walked_device_groups(problem, stages):
    """The reference: every combination of free devices, each pattern kept the first time it is reached."""
    key = {d.id: (d.server, d.speed, d.memory) for d in problem.cluster.devices}
    ids = [d.id for d in problem.cluster.devices]
    max_size = len(ids) if problem.allow_replication else 1
    seen, found = set(), []

    def extend(used, prefix):
        if len(prefix) == stages:
            pattern = tuple(tuple(sorted(key[d] for d in g)) for g in prefix)
            if pattern not in seen:
                seen.add(pattern)
                found.append(prefix)
            return
        free = [d for d in ids if d not in used]
        for size in range(1, min(max_size, len(free) - (stages - len(prefix) - 1)) + 1):
            for group in combinations(free, size):
                extend(used | set(group), prefix + (group,))

    extend(frozenset(), ())
    return found


class TestDeviceGroups:
    @pytest.mark.parametrize("seed", range(12))
    def test_same_sequences_in_the_same_order_as_the_walk_over_combinations(self, seed):
        rng = random.Random(seed)
        devices = tuple(Device(f"d{i}", f"s{rng.randrange(2)}", rng.choice((1.0, 0.5)), rng.choice((1e9, 2e9)))
                        for i in range(rng.randint(1, 6)))
        cluster = Cluster("c", (Link(1e10, 1e-6, "s0"), Link(1e10, 1e-6, "s1")), Link(1e9, 1e-5), devices)
        graph = LayerGraph.chain("g", [make_layer(i) for i in range(4)])
        for replication in (True, False):
            problem = PlanningProblem(graph, cluster, 8, 2, allow_replication=replication)
            for stages in range(1, len(devices) + 1):
                assert list(_device_groups(problem, stages)) == walked_device_groups(problem, stages)


class TestSolveJoint:
    @pytest.mark.parametrize("seed", range(3))
    @pytest.mark.parametrize("per_stage", [False, True])
    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_matches_brute_force(self, seed, per_stage, schedule):
        problem = instance(seed, per_stage, schedule)
        expected = brute_force(problem)
        result = solve_joint(problem, name="cpsat", clock=TimeLimit(60))
        assert result.status == "optimal"
        assert result.iteration_time == pytest.approx(expected, rel=1e-6)
        assert result.lower_bound <= expected * (1 + 1e-9)
        assert problem.in_split_space(result.plan)
        check = simulate(result.plan, problem.graph, problem.cluster)
        assert check.fits and check.iteration_time == pytest.approx(result.iteration_time)

    def test_too_many_pipelines_hands_over(self):
        problem = instance(0, False, "gpipe")
        assert pipelines(problem, limit=5) is None


class TestPipelineBound:
    def test_never_above_any_split(self):
        problem = instance(1, True, "1f1b")
        for pipeline in pipelines(problem)[:40]:
            bound = pipeline_bound(problem, pipeline)
            bounds, groups, rc = pipeline
            for split in compositions(4, 3):
                plan = Plan("g", "c", 4, 4.0, "1f1b", tuple(Stage(b, g, split, r) for b, g, r in zip(bounds, groups, rc)))
                assert simulate(plan, problem.graph, problem.cluster).iteration_time >= bound - 1e-9


def tight_instance(seed, per_stage, schedule, memory):
    """Like :func:`instance`, with every device's memory drawn near the stages' needs."""
    rng = random.Random(seed)
    problem = instance(seed, per_stage, schedule)
    devices = tuple(Device(d.id, d.server, d.speed, rng.choice(memory)) for d in problem.cluster.devices)
    cluster = Cluster("c", problem.cluster.servers, problem.cluster.network, devices)
    return PlanningProblem(problem.graph, cluster, 4, 2, schedule, auto_microbatches=True, max_microbatches=3,
                           per_stage=per_stage)


class TestFitsSomeSplit:
    @pytest.mark.parametrize("seed", range(6))
    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_false_only_when_no_split_fits(self, seed, schedule):
        problem = tight_instance(seed, False, schedule, [6, 9, 12, 16, 24])
        refused = 0
        for pipeline in pipelines(problem):
            if fits_some_split(problem, pipeline):
                continue
            refused += 1
            bounds, groups, rc = pipeline
            for split in compositions(4, 3):
                plan = Plan("g", "c", 4, 4.0, schedule, tuple(Stage(b, g, split, r) for b, g, r in zip(bounds, groups, rc)))
                try:
                    assert not simulate(plan, problem.graph, problem.cluster, validate=False).fits, plan
                except DeadlockError:
                    pass
        assert refused > 0  # the memories are tight enough to exercise the proof

    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_no_fitting_split_anywhere_is_infeasible(self, schedule):
        problem = tight_instance(0, True, schedule, [1, 2])
        assert brute_force(problem) == float("inf")
        result = solve_joint(problem, name="cpsat", clock=TimeLimit(30))
        assert result.status == "infeasible" and result.plan is None


class TestNsgaNearTheJointOptimum:
    @pytest.mark.parametrize("seed", range(2))
    def test_within_two_percent(self, seed):
        from pipeplan.solver.solvers import get_solver

        problem = instance(seed, True, "1f1b")
        exact = solve_joint(problem, name="cpsat", clock=TimeLimit(60))
        ga = get_solver("nsga").solve(problem, time_limit=60, seed=0)
        assert ga.status == "feasible" and problem.in_split_space(ga.plan)
        assert ga.iteration_time <= exact.iteration_time * 1.02


class TestFixedMicrobatchCount:
    """``--microbatches M`` without auto or per-stage means M equal microbatches, for every solver."""

    @pytest.mark.parametrize("name", ["nsga", "cpsat-split", "umpipe-local", "umpipe-dp", "cpsat"])
    def test_split_aware_solvers_keep_the_equal_split(self, name):
        from dataclasses import replace

        from pipeplan.solver.solvers import get_solver

        problem = replace(instance(0, False, "1f1b"), auto_microbatches=False, max_microbatches=None)
        result = get_solver(name).solve(problem, time_limit=30, seed=0)
        assert result.plan is not None
        assert all(st.microbatches == problem.split for st in result.plan.stages)
        assert problem.in_split_space(result.plan)
