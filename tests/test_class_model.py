"""The class-level model: its timeline and path terms, its types, its MILP bound and plans, against the simulator
and a brute force over every plan."""

from __future__ import annotations

import math
import random

import pytest

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.bounds.class_bound import class_bound
from pipeplan.solver.bounds.class_paths import path_bound, pipeline_time, stage_durations
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.evaluation.simulator import plan_costs
from pipeplan.solver.exact.class_model import (build_position_model, configuration_plan, refine_boundaries,
                                               solve_class_model, solve_position_model)
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.space.class_placement import place, split_layers
from pipeplan.solver.space.class_stages import SINGLE, SPREAD, q_classes, server_kinds, stage_types
from pipeplan.solver.space.device_classes import device_classes
from helpers import REL, brute_force, sized_problem as random_problem


def _random_plan(seed: int):
    """A random problem of test_exact's kind and a random plan of it (any groups, cuts and flags)."""
    rng = random.Random(seed)
    schedule = rng.choice(["1f1b", "gpipe"])
    problem = random_problem(seed, layers=rng.randint(2, 6), devices=rng.randint(2, 5), schedule=schedule)
    L, ids = len(problem.graph), [d.id for d in problem.cluster.devices]
    S = rng.randint(1, min(L, len(ids)))
    edges = [0] + sorted(rng.sample(range(1, L), S - 1)) + [L]
    rng.shuffle(ids)
    groups, rest = [], ids
    for s in range(S):
        take = rng.randint(1, len(rest) - (S - 1 - s))
        groups.append(rest[:take])
        rest = rest[take:]
    plan = problem.make_plan(list(zip(edges, edges[1:])), groups, [rng.random() < 0.3 for _ in range(S)])
    return problem, plan


def _durations(problem, plan):
    return stage_durations(plan_costs(plan, problem.graph, problem.cluster))


class TestPipelineTime:
    def test_hand_computed(self):
        # one stage per layer, 2 microbatches: stage 1 runs F0 B0 F1 B1 over [1, 7], stage 0's B1 ends at 9,
        # a 0.5 s transfer each way adds 2 x 0.5 to the first round trip, and the all-reduce of stage 0 follows
        assert pipeline_time("1f1b", [[1, 1], [1, 1]], [[2, 2], [2, 2]], [[0, 0]], [0, 0]) == 9.0
        assert pipeline_time("1f1b", [[1, 1], [1, 1]], [[2, 2], [2, 2]], [[0, 0]], [3, 0]) == 12.0
        assert pipeline_time("1f1b", [[1, 1], [1, 1]], [[2, 2], [2, 2]], [[0.5, 0.5]], [0, 0]) == 10.0

    @pytest.mark.parametrize("seed", range(12))
    def test_equals_the_simulator(self, seed):
        problem, plan = _random_plan(seed)
        expected = problem.evaluate(plan).iteration_time
        assert pipeline_time(problem.schedule, *_durations(problem, plan)) == pytest.approx(expected, rel=1e-12)


class TestPathBound:
    @pytest.mark.parametrize("seed", range(12))
    def test_never_above_the_timeline(self, seed):
        problem, plan = _random_plan(100 + seed)
        durations = _durations(problem, plan)
        assert path_bound(problem.schedule, *durations) <= pipeline_time(problem.schedule, *durations) * (1 + REL)

    def test_exact_on_a_balanced_pipeline(self):
        # identical stages, no transfers: 1F1B takes (M + S - 1)(f + b), which the pivot path reaches
        fwd, bwd = [[1.0] * 4 for _ in range(3)], [[2.0] * 4 for _ in range(3)]
        assert path_bound("1f1b", fwd, bwd, [[0.0] * 4] * 2, [0.0] * 3) == pytest.approx(18.0)
        assert pipeline_time("1f1b", fwd, bwd, [[0.0] * 4] * 2, [0.0] * 3) == pytest.approx(18.0)


class TestQClasses:
    def test_ranges_with_equal_per_replica_sizes(self):
        assert q_classes((5, 5), 6) == [(1, 1, (5, 5)), (2, 2, (3, 3)), (3, 4, (2, 2)), (5, 6, (1, 1))]

    def test_one_sample_microbatches_have_one_class(self):
        assert q_classes((1, 1, 1), 4) == [(1, 4, (1, 1, 1))]


def _two_kind_cluster() -> Cluster:
    """Two fast servers on a fast link, two slow servers on a link slower than the network."""
    servers = (Link(1e11, 1e-6, "a0"), Link(1e11, 1e-6, "a1"), Link(1e9, 1e-5, "b0"), Link(1e9, 1e-5, "b1"))
    devices = tuple(Device(f"{s.id}d{k}", s.id, 1.0 if s.id[0] == "a" else 0.5, 8e9 if s.id[0] == "a" else 4e9)
                    for s in servers for k in range(2))
    return Cluster("two-kinds", servers, Link(1e10, 1e-5), devices)


class TestStageTypes:
    def test_server_kinds_group_interchangeable_servers(self):
        cluster = _two_kind_cluster()
        kinds = server_kinds(cluster, device_classes(cluster))
        assert [k.servers for k in kinds] == [("a0", "a1"), ("b0", "b1")]
        assert [k.per_class for k in kinds] == [(2, 0), (0, 2)]

    def test_links_offered(self):
        cluster = _two_kind_cluster()
        graph = LayerGraph.chain("g", [Layer("l", (0, 1e-3), (0, 2e-3), 1e6, 1e5, 1e4)], input_bytes=1e4)
        problem = PlanningProblem(graph, cluster, global_batch=8, microbatches=2)
        classes = device_classes(cluster)
        types = stage_types(problem, classes, server_kinds(cluster, classes))
        slow = {(t.r_lo, t.link) for t in types if t.cls == 1 and not t.recompute}
        # one slow device: SINGLE; two: spread only (their own server's link is worse than the network);
        # three or more: spread (one slow server holds two)
        assert (1, SINGLE) in slow and (2, SPREAD) in slow and (2, 1) not in slow
        fast = {(t.r_lo, t.link) for t in types if t.cls == 0 and not t.recompute}
        assert (2, 0) in fast and (2, SPREAD) in fast  # a fast server's link beats the network


class TestPositionModel:
    @pytest.mark.parametrize("seed", range(6))
    def test_never_above_the_brute_force_optimum(self, seed):
        rng = random.Random(seed)
        problem = random_problem(5000 + seed, layers=rng.randint(2, 4), devices=rng.randint(2, 3),
                                 schedule=("1f1b", "gpipe")[seed % 2], replication=seed % 3 != 2,
                                 recompute=seed % 2 == 0)
        best = brute_force(problem)
        solution = solve_position_model(build_position_model(problem, positions=1 + seed % 2), 60.0)
        assert solution.status == "Optimal"
        if math.isfinite(best):
            assert solution.bound <= best * (1 + REL)

    def test_bound_is_the_incumbent_when_nothing_beats_it(self):
        # cut below the model's own optimum, the model has no solution: every plan is at least the cut
        problem = random_problem(5001, layers=3, devices=2, schedule="1f1b")
        free = solve_position_model(build_position_model(problem), 60.0)
        cut = free.objective * 0.999
        solution = solve_position_model(build_position_model(problem, upper=cut), 60.0)
        assert solution.status == "Infeasible"
        assert solution.bound == pytest.approx(cut, rel=1e-5)
        assert solution.bound <= brute_force(problem) * (1 + REL)

    def test_its_plan_is_simulated_and_no_faster_than_the_optimum(self):
        problem = random_problem(5002, layers=4, devices=3, schedule="1f1b")
        best = brute_force(problem)
        result = solve_class_model(problem, 60.0)
        assert result.bound <= best * (1 + REL)
        assert result.plan is not None
        assert result.iteration_time == pytest.approx(problem.evaluate(result.plan).iteration_time)
        assert result.iteration_time >= best * (1 - REL)

    def test_size_does_not_grow_with_devices(self):
        graph = LayerGraph.chain("g", [Layer(f"l{i}", (1e-5, 1e-4), (2e-5, 2e-4), 1e8, 1e7, 1e6)
                                       for i in range(6)], input_bytes=1e6)

        def cluster(servers: int) -> Cluster:
            links = tuple(Link(1e11, 1e-6, f"s{s}") for s in range(servers))
            return Cluster("c", links, Link(1e10, 1e-5), tuple(Device(f"s{s}d{k}", f"s{s}", 1.0, 8e10)
                                                                 for s in range(servers) for k in range(8)))

        sizes = [build_position_model(PlanningProblem(graph, cluster(n), global_batch=64, microbatches=4)).size
                 for n in (8, 64)]
        assert sizes[0] == sizes[1]  # 64 and 512 devices, the same replica classes: the same model


class TestPlacement:
    def test_place_and_split(self):
        cluster = _two_kind_cluster()
        graph = LayerGraph.chain("g", [Layer(f"l{i}", (0, 1e-3), (0, 2e-3), 1e6, 1e5, 1e4) for i in range(4)],
                                 input_bytes=1e4)
        problem = PlanningProblem(graph, cluster, global_batch=8, microbatches=2)
        classes = device_classes(cluster)
        kinds = server_kinds(cluster, classes)
        types = stage_types(problem, classes, kinds)
        on_fast = next(t for t in types if t.cls == 0 and t.link == 0 and t.r_lo == 2 and not t.recompute)
        spread_slow = next(t for t in types if t.cls == 1 and t.link == SPREAD and t.r_lo == 4 and not t.recompute)
        bounds = split_layers(problem, classes, kinds, [on_fast, spread_slow], 0, 4)
        assert bounds[0][0] == 0 and bounds[-1][1] == 4 and bounds[0][1] == bounds[1][0]
        plan = place(problem, classes, kinds, [(lo, hi, t) for (lo, hi), t in zip(bounds, [on_fast, spread_slow])])
        servers = [{cluster.device_index[d].server for d in st.devices} for st in plan.stages]
        assert len(servers[0]) == 1 and servers[0] <= {"a0", "a1"}
        assert servers[1] == {"b0", "b1"}
        assert problem.evaluate(plan).fits

    def test_place_reports_too_few_devices(self):
        cluster = _two_kind_cluster()
        graph = LayerGraph.chain("g", [Layer(f"l{i}", (0, 1e-3), (0, 2e-3), 1e6, 1e5, 1e4) for i in range(2)],
                                 input_bytes=1e4)
        problem = PlanningProblem(graph, cluster, global_batch=8, microbatches=2)
        classes = device_classes(cluster)
        kinds = server_kinds(cluster, classes)
        types = stage_types(problem, classes, kinds)
        big = next(t for t in types if t.cls == 0 and t.r_lo >= 4)
        assert place(problem, classes, kinds, [(0, 1, big), (1, 2, big)]) is None

    def test_refine_never_returns_a_slower_plan(self):
        problem = random_problem(7, layers=6, devices=3, schedule="1f1b")
        ids = [d.id for d in problem.cluster.devices]
        plan = problem.make_plan([(0, 1), (1, 2), (2, 6)], [[i] for i in ids])
        before = problem.evaluate(plan)
        refined, t, used = refine_boundaries(problem, plan, 50)
        assert used <= 50
        if before.fits:
            assert t <= before.iteration_time
        assert t == problem.evaluate(refined).iteration_time or not math.isfinite(t)


def test_configuration_plan_needs_a_configuration():
    problem = random_problem(8, layers=3, devices=2, schedule="1f1b")
    pm = build_position_model(problem)
    solution = solve_position_model(pm, 60.0)
    plan = configuration_plan(pm, solution)
    assert plan is None or problem.in_search_space(plan)


def test_the_class_bound_and_the_model_see_the_transfers():
    # two stages would exchange 1 GB per sample over a 1 GB/s network, so the best plan is one device's
    # 12 ms: the position model counts the transfers (term S3), the class bound too (its term d;
    # without them it proves 9 ms, two one-layer stages)
    graph = LayerGraph.chain("g", [Layer(f"l{i}", (0, 1e-3), (0, 2e-3), 1e6, 1e5, 1e9) for i in range(2)],
                             input_bytes=0.0)
    devices = (Device("a", "s0", 1.0, 1e7), Device("b", "s1", 1.0, 1e7))  # one layer per device fits
    cluster = Cluster("c", (Link(1e9, 0.0, "s0"), Link(1e9, 0.0, "s1")), Link(1e9, 0.0), devices)
    problem = PlanningProblem(graph, cluster, global_batch=2, microbatches=2, allow_recompute=False)
    best = brute_force(problem)
    model = solve_position_model(build_position_model(problem), 60.0).bound
    assert best * (1 - 1e-6) <= class_bound(problem) <= best * (1 + REL)
    assert best * (1 - 1e-6) <= model <= best * (1 + REL)
