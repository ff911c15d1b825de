"""Baselines: valid fitting plans on random small instances, and each method's known behaviour."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeplan.models.graph import Layer, LayerGraph, load_graph
from pipeplan.solver.baselines import BASELINES, best_baseline
from pipeplan.solver.baselines.alpa import _inner_dp, _rebuild
from pipeplan.solver.baselines.autopipe import balanced_cuts
from pipeplan.solver.baselines.dapple import append_first, fresh_first, scatter_first
from pipeplan.solver.baselines.deepspeed import partition_balanced, partition_uniform
from pipeplan.solver.baselines.even import even_cuts
from pipeplan.solver.baselines.greedy_speed import proportional_cuts
from pipeplan.solver.formats.cluster import Cluster, Device, Link, load_cluster
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.solvers import get_solver, solver_names
from helpers import random_problem

NAMES = ["even", "megatron", "deepspeed-uniform", "deepspeed-parameters", "pipedream", "dapple", "piper", "alpa", "autopipe",
         "greedy-speed"]


def uniform_problem(layers: int = 8, devices: int = 4, memory: float = 1e12, **kw) -> PlanningProblem:
    """Identical layers on identical devices of one server."""
    g = LayerGraph.chain("u", [Layer(f"l{i}", (0.0, 1e-3), (0.0, 2e-3), 1e6, 1e3, 1e3) for i in range(layers)], 1e3)
    c = Cluster("c", (Link(1e12, 0.0, "s0"),), Link(1e10, 0.0),
                tuple(Device(f"g{i}", "s0", 1.0, memory) for i in range(devices)))
    return PlanningProblem(g, c, global_batch=16, microbatches=8, **kw)


class TestRegistry:
    def test_all_registered_with_source(self):
        names = solver_names()
        for name in NAMES:
            assert name in names
            solver = get_solver(name)
            assert solver.name == name and solver.source


    def test_names_in_the_order_of_the_table(self):
        from pipeplan.solver.solvers import SOLVERS

        names = solver_names()
        assert names == list(SOLVERS) and names[0] == "even" and names[-1] == "nsga"
        assert names.index("alpa") < names.index("group-search") < names.index("ilp") < names.index("cpsat")


class TestEveryBaseline:
    @pytest.mark.parametrize("name", NAMES)
    @pytest.mark.parametrize("seed", range(6))
    def test_valid_fitting_plan(self, name, seed):
        switches = [{}, {"allow_replication": False}, {"max_stages": 2}, {"allow_recompute": False}][seed % 4]
        problem = random_problem(seed, **switches)
        result = get_solver(name).solve(problem, time_limit=5.0, seed=seed)
        assert result.status == "feasible" and result.lower_bound is None
        result.plan.validate(problem.graph, problem.cluster)
        sim = problem.evaluate(result.plan)
        assert sim.fits and sim.iteration_time == pytest.approx(result.iteration_time)
        assert problem.in_search_space(result.plan)

    @pytest.mark.parametrize("name", NAMES)
    def test_heterogeneous_example(self, name):
        problem = PlanningProblem(load_graph("examples/chain8.graph.json"),
                                  load_cluster("examples/two-servers.cluster.json"), global_batch=32, microbatches=8)
        result = get_solver(name).solve(problem, time_limit=10.0)
        assert result.status == "feasible"
        result.plan.validate(problem.graph, problem.cluster)
        assert problem.evaluate(result.plan).fits

    @pytest.mark.parametrize("name", NAMES)
    def test_deterministic(self, name):
        problem = random_problem(3)
        a = get_solver(name).solve(problem, time_limit=5.0, seed=1)
        b = get_solver(name).solve(problem, time_limit=5.0, seed=1)
        assert a.plan == b.plan

    @pytest.mark.parametrize("name", NAMES)
    def test_infeasible(self, name):
        result = get_solver(name).solve(random_problem(1, memory=1e3), time_limit=5.0)
        assert result.status == "infeasible" and result.plan is None and result.message

    def test_recompute_used_when_needed(self):
        # 8 stages' worth of microbatches in flight do not fit, one does: 1F1B on one
        # device of a single stage with act 1e3 * 2 samples * 8 microbatches under gpipe.
        problem = uniform_problem(layers=2, devices=1, memory=4 * 2e6 + 2 * 2e3 * 8 - 1, schedule="gpipe")
        result = get_solver("even").solve(problem)
        assert result.status == "feasible" and result.plan.stages[0].recompute
        off = uniform_problem(layers=2, devices=1, memory=4 * 2e6 + 2 * 2e3 * 8 - 1, schedule="gpipe",
                              allow_recompute=False)
        assert get_solver("even").solve(off).status == "infeasible"


class TestBestBaseline:
    def test_best_of_all(self):
        problem = random_problem(2)
        best = best_baseline(problem, time_limit=10.0)
        times = [cls().solve(problem, time_limit=5.0).iteration_time for cls in BASELINES]
        assert best.iteration_time == pytest.approx(min(t for t in times if t is not None))

    def test_none_when_nothing_fits(self):
        assert best_baseline(random_problem(1, memory=1e3), time_limit=2.0) is None


class TestPartitions:
    def test_even_8_on_4(self):
        assert even_cuts(8, 4) == [0, 2, 4, 6, 8]

    def test_even_solver_splits_2_each(self):
        # Memory 4 x 2 layers of state fits, 3 layers do not: only the 4-stage split fits.
        problem = uniform_problem(memory=4 * 1e6 * 2 + 1e6, allow_recompute=False)
        plan = get_solver("even").solve(problem).plan
        assert [st.layers for st in plan.stages] == [(0, 2), (2, 4), (4, 6), (6, 8)]

    def test_deepspeed_uniform(self):
        assert partition_uniform(10, 4) == [0, 3, 6, 8, 10]
        assert partition_uniform(2, 3) == [0, 1, 2, 2]

    def test_deepspeed_parameters_balances_params(self):
        assert partition_balanced([4, 1, 1, 1, 1], 2) == [0, 1, 5]
        assert partition_balanced([1, 1, 1, 1, 4, 4], 3) == [0, 4, 5, 6]

    def test_greedy_speed_proportional(self):
        assert proportional_cuts([1] * 6, [2.0, 1.0]) == [0, 4, 6]
        assert proportional_cuts([1] * 6, [1.0, 2.0]) == [0, 2, 6]

    def test_autopipe_balanced(self):
        assert balanced_cuts([1, 1, 1, 1], [3.0, 1.0]) == [0, 3, 4]
        assert balanced_cuts([3, 1, 1, 1], [1.0, 1.0]) == [0, 1, 4]

    def test_dapple_policies(self):
        servers = [["a", "b"], ["c", "d"]]
        assert fresh_first(servers, frozenset({"a"}), 2) == ["c", "d"]
        assert append_first(servers, frozenset({"a"}), 2) == ["b", "c"]
        assert scatter_first(servers, frozenset(), 3) == ["a", "c", "b"]
        assert fresh_first(servers, frozenset({"a", "b", "c"}), 2) is None

    def test_pipedream_replicates_uniform_model(self):
        # Identical layers and devices, free links: replicating over all 4 devices or
        # pipelining both beat one device; PipeDream must use every device.
        plan = get_solver("pipedream").solve(uniform_problem()).plan
        assert sum(len(st.devices) for st in plan.stages) == 4

    def test_alpa_uses_all_devices_on_uniform_model(self):
        plan = get_solver("alpa").solve(uniform_problem()).plan
        assert sum(len(st.devices) for st in plan.stages) == 4

    def test_greedy_gives_fast_device_more_layers(self):
        g = LayerGraph.chain("u", [Layer(f"l{i}", (0.0, 1e-3), (0.0, 2e-3), 1e3, 1e3, 1e3) for i in range(6)], 1e3)
        c = Cluster("c", (Link(1e12, 0.0, "s0"),), Link(1e10, 0.0),
                    (Device("slow", "s0", 1.0, 1e12), Device("fast", "s0", 2.0, 1e12)))
        problem = PlanningProblem(g, c, global_batch=16, microbatches=8, allow_replication=False)
        plan = get_solver("greedy-speed").solve(problem).plan
        sizes = {st.devices[0]: st.layers[1] - st.layers[0] for st in plan.stages}
        assert sizes == {"fast": 4, "slow": 2}


class TestAlpaInnerDp:
    """The vectorised inner DP against every path, on random capped cost tables."""

    @staticmethod
    def brute(C, sizes, s, k, d, L):
        if s == 0:
            return 0.0 if (k, d) == (L, 0) else math.inf
        best = math.inf
        for hi in range(k + 1, L + 1):
            for j, r in enumerate(sizes):
                if r <= d and k < L:
                    best = min(best, C[s, k, hi, d, j] + TestAlpaInnerDp.brute(C, sizes, s - 1, hi, d - r, L))
        return best

    @pytest.mark.parametrize("seed", range(20))
    def test_matches_every_path(self, seed):
        rng = np.random.default_rng(seed)
        L, U, S, sizes = 4, 4, 3, [1, 2]
        C = np.where(rng.random((S + 1, L, L + 1, U + 1, 2)) < 0.6, rng.integers(1, 9, (S + 1, L, L + 1, U + 1, 2)),
                     np.inf).astype(float)
        for k in range(L):
            C[:, k, :k + 1] = np.inf  # a stage ends after it starts, as in alpa_dp's table
        F, arg = _inner_dp(C, sizes, L, U, S)
        pool = [f"d{i}" for i in range(U)]
        for s in range(1, S + 1):
            expected = self.brute(C, sizes, s, 0, U, L)
            assert F[s, 0, U] == expected
            if math.isfinite(expected):
                bounds, groups = _rebuild(arg, sizes, pool, s, U)
                assert bounds[0][0] == 0 and bounds[-1][1] == L and sum(map(len, groups)) == U
                used = U
                total = 0.0
                for stage, ((k, hi), group) in zip(range(s, 0, -1), zip(bounds, groups)):
                    total += C[stage, k, hi, used, sizes.index(len(group))]
                    used -= len(group)
                assert total == expected

