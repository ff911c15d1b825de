"""Large clusters: every solver holds its time limit on 1,024 devices; the benchmark's instances."""

from __future__ import annotations

import time

import pytest

from pipeplan.experiments.bench_scale import GENERATIONS, scale_cluster, scale_problem
from pipeplan.solver.exact.ilp import quiet_stdout
from pipeplan.solver.solvers import get_solver, solver_names

LIMIT = 1.0
"""The short limit of the test (seconds)."""

GRACE = 0.1 * LIMIT + 1.0
"""Overrun allowed: 10 % of the limit, plus one second for the steps no clock can split (one
simulation of a 1,024-device plan with 32 microbatches, one numpy table of a DP row) on a loaded
2-core machine."""


@pytest.fixture(scope="module")
def problem_1024():
    return scale_problem(1024)


class TestScaleCluster:
    def test_generations_in_equal_shares(self):
        cluster = scale_cluster(64)
        assert len(cluster.devices) == 64 and len(cluster.servers) == 8
        speeds = sorted({d.speed for d in cluster.devices}, reverse=True)
        assert speeds == [g[0] for g in GENERATIONS]
        assert all(sum(d.speed == s for d in cluster.devices) == 16 for s in speeds)

    def test_sizes_that_do_not_divide_are_refused(self):
        with pytest.raises(ValueError, match="multiple of 32"):
            scale_cluster(40)


class TestTimeLimitAt1024Devices:
    @pytest.mark.parametrize("name", solver_names())
    def test_solver_ends_within_its_limit(self, name, problem_1024):
        solver = get_solver(name)
        start = time.perf_counter()
        with quiet_stdout():
            result = solver.solve(problem_1024, time_limit=LIMIT, seed=0)
        wall = time.perf_counter() - start
        assert wall <= LIMIT + GRACE, f"{name}: {wall:.2f} s for a {LIMIT} s limit ({result.status})"
        if result.plan is not None:
            assert problem_1024.evaluate(result.plan).iteration_time == pytest.approx(result.iteration_time)
