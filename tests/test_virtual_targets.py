"""The target LPs and the model's targets (solver/exact/virtual_targets.py) against every plan of small spaces."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import virtual_brute_force, virtual_problem
from pipeplan.solver.bounds.virtual_bound import space_bound
from pipeplan.solver.core.termination import TimeLimit
from pipeplan.solver.exact.linear import LinearModel
from pipeplan.solver.exact.virtual_model import (MILLI, build_rows, coefficients, group_types, in_milliseconds,
                                                 layer_units, model_rules_out, solve_highs)
from pipeplan.solver.exact.virtual_targets import TOLERANCE, TargetLP, set_target, target_bound

VALUES = st.lists(st.floats(0.1, 2.0), min_size=40, max_size=40)
V2 = ("interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv")


def rows_for(problem, groups, capacity=True):
    types = group_types(problem)
    co = in_milliseconds(coefficients(problem, types, layer_units(problem)))
    return build_rows(problem, groups, 2, types, co, capacity=capacity), types, co


def fastest_with(plans, groups: int) -> float:
    """The fastest fitting plan with ``groups`` device groups among the brute force's plans."""
    return min((r.iteration_time for plan, r in plans if r.fits and len(plan.groups) == groups), default=math.inf)


class TestSetTarget:
    def test_sets_each_entry_and_the_objective_bound(self):
        m = LinearModel()
        t, z = m.var("T"), m.var("z", 0, 1)
        m.objective = t
        m.row([(t, 1.0), (z, 1.0)], -math.inf, 0)
        m.target_terms.append((0, z, 3.0))
        set_target(m, 5.0)
        assert list(m.rows()) == [([0, 1], [1.0, -2.0], -math.inf, 0)] and m.upper[t] == 5.0


class TestTargetLP:
    def test_a_program_cut_by_its_time_limit_is_marked(self):
        """bench_solvers' 64 x 16 model of 8 groups: answered with a minute, unanswered (not ruled out, and
        ``timed_out``) with no time at all."""
        from pipeplan.experiments.bench_solvers import schedule_problem

        p = schedule_problem(64, 16, "looped-bfs", 2)
        types = group_types(p)
        rows = build_rows(p, 8, 2, types, in_milliseconds(coefficients(p, types, layer_units(p))), capacity=True)
        answered = TargetLP(rows, lambda: 60.0)
        assert answered.infeasible_at(200.0) and not answered.timed_out  # its bound is 202.4 ms
        cut = TargetLP(rows, lambda: 0.0)
        assert not cut.infeasible_at(200.0) and cut.timed_out

    def test_monotone_in_the_target(self):
        values = [0.3 + 0.17 * ((7 * i) % 11) for i in range(40)]
        p = virtual_problem(values, "looped-bfs", devices=4, layers=8, batch=8, m=4, virtual=2)
        lp = TargetLP(rows_for(p, 2)[0])
        answers = [lp.infeasible_at(t) for t in range(30_000, 60_000, 1_000)]
        assert answers == sorted(answers, reverse=True) and answers[0] and not answers[-1]

    def test_the_capacity_rows_raise_the_relaxation(self):
        """Without them the relaxation lets a group be a fraction of a many-replica type; here it stays below the
        cluster-wide bound, and the target LPs are 10 % above it."""
        values = [0.3 + 0.17 * ((7 * i) % 11) for i in range(40)]
        p = virtual_problem(values, "looped-bfs", devices=4, layers=8, batch=8, m=4, virtual=2)
        plain, _, _ = rows_for(p, 2, capacity=False)
        plain.integer = [False] * len(plain.integer)
        _, relaxed = solve_highs(plain, 60.0, 100)
        proved = target_bound(TargetLP(rows_for(p, 2)[0]).infeasible_at, space_bound(p) * MILLI, math.inf)
        floor_ = space_bound(p) * MILLI
        assert relaxed < floor_ < 1.09 * floor_ < proved

    @settings(max_examples=int(os.environ.get("PIPEPLAN_MODEL_EXAMPLES", "24")), deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(VALUES, st.sampled_from(V2), st.sampled_from([1e12, 2400.0]), st.sampled_from([(2, 4), (3, 4), (2, 5)]))
    def test_never_above_the_fastest_plan_with_as_many_groups(self, values, schedule, memory, shape):
        devices, layers = shape
        p = virtual_problem(values, schedule, devices=devices, layers=layers, batch=4, m=2, memory=memory,
                            virtual=None if schedule == "zbv" else 2)
        _, plans = virtual_brute_force(p)
        for groups in range(1, devices + 1):
            if 2 * groups > layers:
                continue
            rows, types, co = rows_for(p, groups)
            proved = target_bound(TargetLP(rows).infeasible_at, space_bound(p) * MILLI, math.inf) / MILLI
            assert proved <= fastest_with(plans, groups) * (1 + 1e-9)
            # the integral model at the proved target's next steps: never rules out a plan that exists
            best = fastest_with(plans, groups)
            if math.isfinite(best):
                for backend, c in (("milp", co), ("cpsat", coefficients(p, types, layer_units(p)))):
                    ruled_out, solution = model_rules_out(p, groups, 2, types, c, backend, best * (1 + 1e-9),
                                                          TimeLimit(60.0))
                    assert not ruled_out and solution <= best * (1 + 1e-6)
                    if backend == "milp":  # its solution meets the target LP's rows at its own time
                        assert solution >= proved * (1 - 1e-6)


class TestTargetBound:
    @given(st.floats(1.0, 100.0), st.floats(0.0, 1.0))
    def test_within_the_tolerance_below_the_threshold(self, threshold, start):
        found = target_bound(lambda t: t < threshold, start * threshold, 1e3)
        assert threshold * (1 - TOLERANCE) <= found <= threshold

    def test_stops_on_its_clock(self):
        assert target_bound(lambda t: pytest.fail("no program once stopped"), 2.0, 10.0, lambda: True) == 2.0

    def test_the_cap_proved_is_the_answer(self):
        assert target_bound(lambda t: True, 2.0, 10.0) == 10.0
