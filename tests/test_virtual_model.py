"""The version-2 model's bound (solver/exact/virtual_model.py) against every plan, and its place in ilp/cpsat."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import virtual_brute_force, virtual_problem
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.bounds.virtual_bound import space_bound
from pipeplan.solver.core.termination import TimeLimit
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.exact.virtual_model import (CPSAT_UNIT, MIN_TARGET_STEP, build_rows, coefficients, group_types,
                                                 LP_REACH, MILLI, in_milliseconds, layer_units, solve_cpsat, solve_highs,
                                                 transfer_times, virtual_model_bound)
from pipeplan.solver.exact.virtual_targets import TOLERANCE, TargetLP, target_bound
from pipeplan.solver.solvers import get_solver

VALUES = st.lists(st.floats(0.1, 2.0), min_size=40, max_size=40)
V2 = ("interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv")


def fixed_v(schedule: str, virtual: int = 2) -> int | None:
    return None if schedule == "zbv" else virtual


def four_groups_problem() -> PlanningProblem:
    """Eight layers on four devices of two servers under ``interleaved-1f1b`` (``v = 2``)."""
    values = [0.3 + 0.17 * ((7 * i) % 11) for i in range(80)]
    return virtual_problem(values, "interleaved-1f1b", devices=4, layers=8, batch=4, m=2, virtual=2, servers=2)


@functools.lru_cache(maxsize=1)
def four_groups_case() -> tuple[PlanningProblem, float]:
    """:func:`four_groups_problem` and its optimum by the brute force (about 30 s: computed once for the tests that
    share it)."""
    p = four_groups_problem()
    return p, virtual_brute_force(p)[0]


@functools.lru_cache(maxsize=1)
def made_up_thresholds() -> tuple[PlanningProblem, dict[int, float]]:
    """:func:`four_groups_problem` and a threshold per group count for stand-in models: 1.3 times the real model's
    bound, so that the steps have room to climb."""
    p = four_groups_problem()
    real = virtual_model_bound(p, "milp", TimeLimit(60.0), threads=1)
    return p, {o.groups: 1.3 * o.bound for o in real.outcomes}


class TestVirtualModelBound:
    @settings(max_examples=int(os.environ.get("PIPEPLAN_MODEL_EXAMPLES", "24")), deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(VALUES, st.sampled_from(V2), st.integers(1, 2), st.sampled_from([1e12, 2400.0, 1300.0]),
           st.sampled_from([(2, 4), (3, 4), (2, 5)]))
    def test_never_above_the_optimum(self, values, schedule, servers, memory, shape):
        """Every plan of the space simulated (the brute force): neither form's bound exceeds the best that fits."""
        devices, layers = shape
        p = virtual_problem(values, schedule, devices=devices, layers=layers, batch=4, m=2, servers=servers,
                            memory=memory, virtual=fixed_v(schedule))
        best, _ = virtual_brute_force(p)
        for backend in ("milp", "cpsat"):
            found = virtual_model_bound(p, backend, TimeLimit(60.0))
            assert found.complete
            if math.isfinite(best):
                assert found.bound <= best * (1 + 1e-9), (backend, found)

    @pytest.mark.parametrize("schedule", V2)
    def test_above_the_cluster_wide_bound_where_groups_idle(self, schedule):
        # a slow second device: the cluster-wide bound counts its speed, the model sees the pipeline
        values = [0.3 + 0.17 * ((7 * i) % 11) for i in range(40)]
        p = virtual_problem(values, schedule, devices=2, layers=4, batch=4, m=2, virtual=fixed_v(schedule))
        best, _ = virtual_brute_force(p)
        found = virtual_model_bound(p, "milp", TimeLimit(60.0))
        assert space_bound(p) < found.bound <= best * (1 + 1e-9)

    def test_the_two_forms_agree_up_to_rounding_when_solved(self):
        p = virtual_problem([0.5 + 0.05 * i for i in range(40)], "looped-bfs", devices=2, layers=4, virtual=2)
        types = group_types(p)
        co = coefficients(p, types, layer_units(p))
        for groups in (1, 2):
            status, milp = solve_highs(build_rows(p, groups, 2, types, co), 60.0, 10_000)
            code, units, solution = solve_cpsat(build_rows(p, groups, 2, types, co, unit=CPSAT_UNIT), 60.0, 100.0)
            assert status == code == "optimal" and solution >= units
            # the CP-SAT form is integral (at least the MILP's relaxation), less its rounding
            assert units * CPSAT_UNIT >= milp * (1 - 1e-6) - 4 * len(co.sizes) * 8 * CPSAT_UNIT

    @pytest.mark.parametrize("reach", [math.inf, LP_REACH])
    def test_a_capped_group_count_resumes_its_target_lps(self, monkeypatch, reach):
        """The target LPs of 3 and 4 groups stop at 2 groups' bound; once the model raises that one above them,
        theirs run on: to what they prove without a cap, or ``LP_REACH`` above where they stopped (capped again)."""
        from pipeplan.solver.exact import virtual_model
        monkeypatch.setattr(virtual_model, "LP_REACH", reach)
        values = [0.3 + 0.17 * ((7 * i) % 11) for i in range(80)]
        p = virtual_problem(values, "interleaved-1f1b", devices=4, layers=8, batch=4, m=2, virtual=2, servers=2)
        found = {o.groups: o for o in virtual_model_bound(p, "milp", TimeLimit(60.0), threads=1).outcomes}
        types = group_types(p)
        milli = in_milliseconds(coefficients(p, types, layer_units(p)))
        assert found[2].status == "model"
        for groups in (3, 4):
            lp = TargetLP(build_rows(p, groups, 2, types, milli, capacity=True), lambda: 60.0)
            alone = target_bound(lambda t: lp.infeasible_at(t * MILLI), space_bound(p), math.inf)
            assert found[groups].status == "target" and found[groups].bound > found[2].bound
            assert found[groups].bound <= alone * (1 + 2 * TOLERANCE)  # both within TOLERANCE of the threshold
            if math.isinf(reach):
                assert not found[groups].capped
            if not found[groups].capped:
                assert found[groups].bound == pytest.approx(alone, rel=2 * TOLERANCE)

    @pytest.mark.parametrize("threads", [1, 2, 3])
    def test_rounds_of_threads_give_one_answer(self, threads):
        """Group counts raised ``threads`` at a time: never above the optimum, and the same answer on every call (a
        round ends when all its solves have, so the order they finish in does not count)."""
        p, best = four_groups_case()

        def answer():
            found = virtual_model_bound(p, "milp", TimeLimit(60.0), threads=threads)
            return found.bound, found.complete, [(o.groups, o.status, o.bound, o.step, o.capped, o.ceiling)
                                                 for o in found.outcomes]

        first = answer()
        assert first[1] and first[0] <= best * (1 + 1e-9)
        # a solution of a group count's model is above everything its model proved
        assert all(bound <= ceiling * (1 + 1e-6) for _, _, bound, _, _, ceiling in first[2])
        assert answer() == first

    @pytest.mark.parametrize("threads", [1, 2, 3])
    def test_steps_taken_at_once_keep_only_proved_targets(self, monkeypatch, threads):
        """A model stand-in with a known threshold per group count that also fails below it now and then (as a
        node limit does): whatever steps a round takes at once, hoped-for ones included, the bound is never above
        the smallest threshold, and the steps end within a few of the smallest ones below it."""
        from pipeplan.solver.exact import virtual_model
        p, threshold = made_up_thresholds()
        calls = []

        def stand_in(problem, groups, virtual, types, co, backend, target, clock):
            calls.append((groups, target))
            # one target in three fails, fixed by the target itself: the threads' order does not count
            return target < threshold[groups] and (7919 * groups + round(target * 1e9)) % 3 != 0, math.inf

        monkeypatch.setattr(virtual_model, "model_rules_out", stand_in)
        found = virtual_model_bound(p, "milp", TimeLimit(60.0), threads=threads)
        low = min(threshold.values())
        assert calls and found.complete
        assert low * (1 - 8 * MIN_TARGET_STEP) <= found.bound < low

    @pytest.mark.parametrize("threads", [1, 2])
    def test_no_target_at_or_above_a_solution_of_the_model(self, monkeypatch, threads):
        """A stand-in whose model has a solution at its threshold, found by every step that fails: once one is
        found, its group count is never asked that target or more, and the raising stops within the smallest step
        of the lowest solution, which the answer reports as its limit."""
        from pipeplan.solver.exact import virtual_model
        p, threshold = made_up_thresholds()
        calls = []

        def stand_in(problem, groups, virtual, types, co, backend, target, clock):
            calls.append((groups, target))
            return target < threshold[groups], threshold[groups] if target >= threshold[groups] else math.inf

        monkeypatch.setattr(virtual_model, "model_rules_out", stand_in)
        found = virtual_model_bound(p, "milp", TimeLimit(60.0), threads=threads)
        for groups, limit in threshold.items():
            asked = [target for g, target in calls if g == groups]
            failed = next((i for i, target in enumerate(asked) if target >= limit), len(asked))
            # the steps of the round that found it were chosen before its answer; none after it reaches it
            assert all(target < limit for target in asked[failed + threads * virtual_model.STEPS_PER_THREAD:])
        low = min(threshold.values())
        assert found.complete and found.limit == low
        assert low * (1 - 2 * MIN_TARGET_STEP) <= found.bound < low
        assert all(o.ceiling in (math.inf, threshold[o.groups]) and o.bound < o.ceiling for o in found.outcomes)

    def test_leaves_v_to_the_search_alone(self):
        p = virtual_problem([1.0] * 40, "looped-bfs", devices=2, layers=4)
        found = virtual_model_bound(p, "milp", TimeLimit(60.0))
        assert not found.complete and found.bound == space_bound(p)

    def test_an_expired_clock_gives_the_cluster_wide_bound(self):
        p = virtual_problem([1.0] * 40, "looped-bfs", devices=2, layers=4, virtual=2)
        found = virtual_model_bound(p, "milp", TimeLimit(0.0))
        assert not found.complete and found.bound == space_bound(p)

    def test_resumes_an_earlier_answer(self):
        """One thread: resumed from its first group count, the same bound.  Two: the first pass's batches start
        elsewhere, so the steps differ, and the bound is within a few of the smallest steps of the other."""
        p = virtual_problem([1.0] * 40, "looped-bfs", devices=2, layers=4, virtual=2)
        best, _ = virtual_brute_force(p)
        for threads in (1, 2):
            full = virtual_model_bound(p, "milp", TimeLimit(60.0), threads=threads)
            assert virtual_model_bound(p, "milp", TimeLimit(0.0), earlier=full, threads=threads) == full  # nothing left
            part = replace(full, outcomes=full.outcomes[:1], complete=False)
            again = virtual_model_bound(p, "milp", TimeLimit(60.0), earlier=part, threads=threads).bound
            if threads == 1:
                assert again == full.bound
            assert full.bound * (1 - 4 * MIN_TARGET_STEP) <= again <= best * (1 + 1e-9)

    def test_a_resumed_answer_goes_on_from_its_steps(self):
        """Spent steps are not tried again; a group count with a step left is raised further."""
        p, best = four_groups_case()
        full = virtual_model_bound(p, "milp", TimeLimit(60.0))
        assert virtual_model_bound(p, "milp", TimeLimit(60.0), earlier=full) == full
        low = min(full.outcomes, key=lambda o: o.bound)
        lowered = replace(low, bound=0.9 * low.bound, step=MIN_TARGET_STEP)  # a smaller bound, one step left
        part = replace(full, outcomes=tuple(lowered if o is low else o for o in full.outcomes))
        again = virtual_model_bound(p, "milp", TimeLimit(60.0), earlier=part)
        raised = next(o for o in again.outcomes if o.groups == low.groups)
        assert lowered.bound < raised.bound <= best * (1 + 1e-9)

    def test_a_model_too_large_is_not_built(self, monkeypatch):
        from pipeplan.solver.exact import virtual_model
        monkeypatch.setattr(virtual_model, "MAX_COLUMNS", 1)
        p = virtual_problem([1.0] * 40, "looped-bfs", devices=2, layers=4, virtual=2)
        found = virtual_model_bound(p, "milp", TimeLimit(60.0))
        assert not found.complete and found.outcomes == () and found.bound == space_bound(p)

    def test_refuses_an_unknown_backend(self):
        p = virtual_problem([1.0] * 40, "looped-bfs", devices=2, layers=4, virtual=2)
        with pytest.raises(ValueError, match="backend"):
            virtual_model_bound(p, "cbc", TimeLimit(60.0))


def equal_devices_problem(schedule: str, costs: list[float], m: int) -> PlanningProblem:
    """Two equal devices on one server, no bytes across a cut, no parameters, whole microbatches of one sample."""
    g = LayerGraph.chain("g", [Layer(f"l{i}", (0, w), (0, 2 * w), 0, 1, 0, bwd_w=(0, w), act_w=1, step=0)
                               for i, w in enumerate(costs)])
    c = Cluster("c", (Link(1e9, 0.0, "s0"),), Link(1e9, 0.0), tuple(Device(f"d{i}", "s0", 1.0, 1e12) for i in range(2)))
    return PlanningProblem(g, c, global_batch=m, microbatches=m, schedule=schedule, allow_replication=False,
                           virtual_stages=fixed_v(schedule))


class TestProgramRows:
    @pytest.mark.parametrize("schedule, without", [("interleaved-1f1b", 57.0), ("interleaved-zb", 51.0),
                                                   ("looped-bfs", 57.0), ("zbv", 72.0)])
    def test_the_critical_path_is_the_simulated_time(self, schedule, without):
        """Four layers on two groups of one device: one plan, whose transfers, all-reduce and step take no time, so
        the longest path through the programs is its simulated time, which rows 1 to 3 alone fall short of."""
        p = equal_devices_problem(schedule, [3, 1, 1, 3], 4)
        best, _ = virtual_brute_force(p)
        types = group_types(p)
        co = coefficients(p, types, layer_units(p))
        assert solve_highs(build_rows(p, 2, 2, types, co), 60.0, 1_000) == ("optimal", pytest.approx(best, rel=1e-12))
        assert solve_highs(build_rows(p, 2, 2, types, co, paths=False), 60.0, 1_000) == ("optimal",
                                                                                         pytest.approx(without))
        # the model proves targets in steps down to MIN_TARGET_STEP: within twice that of the longest path
        found = virtual_model_bound(p, "milp", TimeLimit(60.0)).bound
        assert best * (1 - 2 * MIN_TARGET_STEP) <= found <= best

    @pytest.mark.parametrize("schedule", V2)
    def test_integral_starts_keep_the_cpsat_form_below_the_optimum(self, schedule):
        p = equal_devices_problem(schedule, [1, 2, 3, 4], 2)
        best, _ = virtual_brute_force(p)
        types = group_types(p)
        co = coefficients(p, types, layer_units(p))
        code, units, _ = solve_cpsat(build_rows(p, 2, 2, types, co, unit=CPSAT_UNIT), 60.0, 100.0)
        assert code == "optimal" and (best - 2 * CPSAT_UNIT) * (1 - 1e-9) <= units * CPSAT_UNIT <= best


def two_server_problem(schedule: str, costs: list[float], network: Link) -> PlanningProblem:
    """Two equal devices, one per server, one byte per sample across every cut, four microbatches of one sample."""
    g = LayerGraph.chain("g", [Layer(f"l{i}", (0, w), (0, 2 * w), 0, 1, 1, bwd_w=(0, w), act_w=1, step=0)
                               for i, w in enumerate(costs)], input_bytes=0)
    c = Cluster("c", (Link(1e9, 0.0, "s0"), Link(1e9, 0.0, "s1")), network,
                tuple(Device(f"d{i}", f"s{i}", 1.0, 1e12) for i in range(2)))
    return PlanningProblem(g, c, global_batch=4, microbatches=4, schedule=schedule, allow_replication=False,
                           virtual_stages=fixed_v(schedule))


class TestHopColumns:
    @pytest.mark.parametrize("schedule, without", [("interleaved-1f1b", 63.0), ("interleaved-zb", 60.0),
                                                   ("looped-bfs", 75.0)])
    def test_transfers_on_the_critical_path_are_counted(self, schedule, without):
        """Two groups on two servers: every hop takes 0.25 s + 1 byte / 2 B/s; with them the model's optimum is
        the simulated time of the best plan, without them it falls short."""
        p = two_server_problem(schedule, [3, 1, 1, 3], Link(2.0, 0.25))
        best, _ = virtual_brute_force(p)
        types = group_types(p)
        co = coefficients(p, types, layer_units(p))
        assert co.transfer.tolist() == [[0.75]]
        assert solve_highs(build_rows(p, 2, 2, types, co), 60.0, 1_000) == ("optimal", pytest.approx(best, rel=1e-12))
        assert solve_highs(build_rows(p, 2, 2, types, replace(co, transfer=None)), 60.0, 1_000) == (
            "optimal", pytest.approx(without))
        assert without < best

    def test_no_bytes_no_columns(self):
        p = equal_devices_problem("looped-bfs", [1, 2, 3, 4], 2)
        types = group_types(p)
        co = coefficients(p, types, layer_units(p))
        assert not any(name.startswith("H") for name in build_rows(p, 2, 2, types, co).names)


class TestTransferTimes:
    def test_a_shared_server_or_the_network(self):
        """Fast devices share server s0 (NVLink); the slow ones are on s1 and s2: fast with fast may talk over s0,
        a slow group with any other over the network (s1 holds one slow device, too few for two groups)."""
        g = LayerGraph.chain("g", [Layer(f"l{i}", (0, 1), (0, 2), 0, 1, 10) for i in range(3)], input_bytes=0)
        devices = (Device("f0", "s0", 1.0, 1e12), Device("f1", "s0", 1.0, 1e12),
                   Device("w0", "s1", 0.5, 1e12), Device("w1", "s2", 0.5, 1e12))
        c = Cluster("c", (Link(1e3, 0.001, "s0"), Link(1e3, 0.001, "s1"), Link(1e3, 0.001, "s2")), Link(10.0, 0.1),
                    devices)
        p = PlanningProblem(g, c, global_batch=4, microbatches=2, schedule="looped-bfs", virtual_stages=2,
                            allow_replication=False)
        types = group_types(p)
        assert [(t.speed, t.replicas) for t in types] == [(1.0, 1), (0.5, 1)]
        # 2 samples of 10 bytes: 0.001 + 20 / 1e3 over s0, 0.1 + 20 / 10 over the network
        assert transfer_times(p, types).ravel().tolist() == pytest.approx([0.021, 2.1, 2.1, 2.1])

    def test_replicas_share_the_bytes(self):
        """Groups of up to ``most`` replicas (the same ``q``) split the bytes: the bound divides by the largest."""
        p = two_server_problem("looped-bfs", [1, 1, 1, 1], Link(2.0, 0.25))
        p = replace(p, allow_replication=True)
        types = group_types(p)
        times = transfer_times(p, types)
        for i, a in enumerate(types):
            for j, b in enumerate(types):
                assert times[i, j] == pytest.approx(0.25 + 1 / (2.0 * min(a.most, b.most)))


class TestExactSolversRunTheModel:
    @pytest.mark.parametrize("name, form", [("ilp", "milp"), ("cpsat", "cpsat")])
    def test_record_names_the_form(self, name, form):
        values = [0.3 + 0.17 * ((7 * i) % 11) for i in range(40)]
        p = virtual_problem(values, "interleaved-1f1b", devices=3, layers=6, batch=4, m=2, virtual=2)
        result = get_solver(name).solve(p, time_limit=60, seed=0, budget=3)
        assert result.algorithm == "virtual-bnb"
        assert result.details["bound_model"] == form and result.details["model_complete"]
        assert result.lower_bound <= result.iteration_time
