"""The exact solvers against a brute force over every plan, on every schedule.

``ilp`` and ``cpsat`` (with the phases the registered solvers run) on the schedules of one
stage per device group, their parts (arcs, bounds, placements, the model's rows), and
``virtual-bnb`` (what they run for the schedules whose device groups hold several stages),
its space and its bounds, checked against a reference timing of spec 7 written in
``tests/helpers.py`` and against the simulator.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from pathlib import Path

import pytest

from pipeplan.models.graph import Layer, LayerGraph, load_graph
from pipeplan.solver.formats.cluster import Cluster, Device, Link, load_cluster
from pipeplan.solver.exact.cpsat import CpSatSolver
from pipeplan.solver.space.arcs import two_round_trips
from pipeplan.solver.exact.bound_model import model_rows
from pipeplan.solver.bounds.terms import config_lower_bound, optimistic_time, work_bound
from pipeplan.solver.space.device_classes import device_classes, fastest_first
from pipeplan.solver.exact.data import build_data
from pipeplan.solver.exact.incumbents import greedy_plans
from pipeplan.solver.space.placements import placements, plan_config
from pipeplan.solver.exact.search import OPT_TOL
from pipeplan.solver.space.stage_options import stage_options
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeplan.models.errors import InputError
from pipeplan.solver.bounds.virtual_bound import Bounder, candidate_bound, space_bound
from pipeplan.solver.exact.ilp import IlpSolver
from pipeplan.solver.exact.virtual_fallback import FALLBACK_TRIES, fallback_candidates, fallback_plan
import pipeplan.solver.exact.virtual_search as virtual_search
import pipeplan.solver.space.virtual_space as virtual_space
from pipeplan.solver.exact.virtual_search import solve_v2
from pipeplan.solver.core.problem import PLANNED_SCHEDULES, PlanningProblem
from pipeplan.solver.core.termination import TimeLimit, WorkBudget
from pipeplan.solver.portfolio import EXACT
from pipeplan.solver.schedules.needs import NEEDS
from pipeplan.solver.solvers import get_solver, schedule_refusal
from pipeplan.solver.space.virtual_space import Candidate, candidates, plain_count, to_plan
from conftest import cpu_past
from helpers import (REL, brute_force, owner, reference, sized_problem, virtual_brute_force, virtual_problem)


def ilp(**kw) -> IlpSolver:
    """``ilp`` with the phases of the registered solver."""
    return IlpSolver(phases=EXACT, **kw)


def cpsat(**kw) -> CpSatSolver:
    """``cpsat`` with the phases of the registered solver."""
    return CpSatSolver(phases=EXACT, **kw)



# ------------------------------------------------------------------ instances
CASES = [
    # (seed, layers, devices, schedule, replication, recompute, max_stages)
    (1, 4, 2, "gpipe", True, True, None),
    (2, 5, 3, "1f1b", True, True, None),
    (3, 6, 4, "1f1b", True, False, None),
    (4, 6, 4, "gpipe", False, True, None),
    (5, 5, 4, "1f1b", False, False, None),
    (6, 6, 3, "gpipe", True, True, 2),
    (7, 8, 3, "1f1b", True, True, None),
    (8, 5, 4, "gpipe", True, True, None),
    (9, 6, 4, "1f1b", True, True, 3),
    (10, 4, 4, "1f1b", True, True, None),
]
_RNG = random.Random(2024)
CASES += [(_RNG.randrange(10 ** 6), _RNG.randint(4, 8), _RNG.randint(3, 4), _RNG.choice(["gpipe", "1f1b"]),
           _RNG.random() < 0.6, _RNG.random() < 0.6, _RNG.choice([None, None, 2, 3])) for _ in range(20)]
_BRUTE: dict = {}


def case_problem(case) -> tuple[PlanningProblem, float]:
    seed, layers, devices, schedule, replication, recompute, max_stages = case
    problem = sized_problem(seed, layers=layers, devices=devices, schedule=schedule, replication=replication,
                             recompute=recompute, max_stages=max_stages)
    if case not in _BRUTE:
        _BRUTE[case] = brute_force(problem)
    return problem, _BRUTE[case]


def check_against_brute_force(solver, case) -> None:
    problem, best = case_problem(case)
    result = solver.solve(problem, time_limit=60, seed=0)
    if math.isinf(best):
        assert result.status == "infeasible" and result.plan is None
        return
    assert result.plan is not None and problem.in_search_space(result.plan)
    sim = problem.evaluate(result.plan)
    assert sim.fits
    assert sim.iteration_time == pytest.approx(result.iteration_time, rel=REL)
    assert result.iteration_time == pytest.approx(best, rel=1e-7)
    assert result.lower_bound is not None and result.lower_bound <= best * (1 + REL)
    assert result.status == "optimal"
    for point in result.trace:
        assert point.bound is None or point.bound <= best * (1 + REL)


# ---------------------------------------------------------------------- tests
class TestIlpSolve:
    @pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c[0]}-{c[3]}")
    def test_matches_brute_force(self, case):
        check_against_brute_force(ilp(), case)

    @pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c[0]}-{c[3]}")
    def test_model_loop_alone_matches_brute_force(self, case):
        """Without the configuration walk the MILP cut loop proves the same optimum."""
        check_against_brute_force(ilp(enumerate_first=False), case)

    def test_cbc_backend(self):
        check_against_brute_force(ilp(backend="cbc", enumerate_first=False), CASES[1])

    @pytest.mark.parametrize("seed, batch, m, schedule, state", [(279, 3, 1, "1f1b", 1.0), (243, 7, 2, "gpipe", 4.0)])
    def test_cbc_bounds_stay_below_the_optimum(self, seed, batch, m, schedule, state):
        # CBC's objective honours its rows to a feasibility tolerance: read as a bound it came
        # out 1.5e-8 above the optimum on these instances (found by a randomized check).
        from pathlib import Path

        from pipeplan.models.graph import load_graph
        from pipeplan.solver.formats.cluster import load_cluster

        data = Path(__file__).parent / "data" / "cbc_bound"
        problem = PlanningProblem(load_graph(str(data / f"seed{seed}.graph.json")),
                                  load_cluster(str(data / f"seed{seed}.cluster.json")), batch, m,
                                  schedule=schedule, state_factor=state)
        best = brute_force(problem)
        result = ilp(backend="cbc", enumerate_first=False).solve(problem, time_limit=60)
        assert result.iteration_time == pytest.approx(best, rel=1e-7)
        assert all(p.bound is None or p.bound <= best * (1 + 1e-12) for p in result.trace)

    def test_unknown_backend(self):
        with pytest.raises(ValueError, match="backend"):
            ilp(backend="gurobi")

    def test_infeasible(self):
        problem = infeasible_problem()
        result = ilp().solve(problem, time_limit=10)
        assert result.status == "infeasible" and result.plan is None and result.message

    def test_infeasible_message_names_the_layer_that_does_not_fit(self):
        # The heaviest layer by parameters fits; the one with huge activations does not.
        layers = [Layer("weights", (1e-3, 1e-4), (2e-3, 2e-4), 1e6, 10.0, 10.0),
                  Layer("activations", (1e-3, 1e-4), (2e-3, 2e-4), 10.0, 1e9, 10.0)]
        cluster = Cluster("c", (Link(1e9, 1e-5, "s0"),), Link(1e8, 1e-4),
                          (Device("d0", "s0", 1.0, 1e8), Device("d1", "s0", 1.0, 1e8)))
        problem = PlanningProblem(LayerGraph.chain("g", layers, 10.0), cluster, 4, 2)
        result = ilp().solve(problem, time_limit=10)
        assert result.status == "infeasible" and "layer 'activations' alone needs" in result.message

    def test_time_limit(self):
        check_time_limit(ilp())

    def test_same_seed_same_plan(self):
        problem = sized_problem(11, layers=7, devices=4, schedule="1f1b")
        assert ilp().solve(problem, seed=3).plan == ilp().solve(problem, seed=3).plan


class TestCpSatSolve:
    @pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c[0]}-{c[3]}")
    def test_matches_brute_force(self, case):
        check_against_brute_force(cpsat(), case)

    @pytest.mark.parametrize("case", CASES[::2], ids=lambda c: f"seed{c[0]}-{c[3]}")
    def test_model_loop_alone_matches_brute_force(self, case):
        check_against_brute_force(cpsat(enumerate_first=False), case)

    def test_infeasible(self):
        result = cpsat().solve(infeasible_problem(), time_limit=10)
        assert result.status == "infeasible" and result.plan is None

    def test_time_limit(self):
        check_time_limit(cpsat())

    def test_same_seed_same_plan(self):
        problem = sized_problem(12, layers=7, devices=4, schedule="gpipe")
        assert cpsat().solve(problem, seed=5).plan == cpsat().solve(problem, seed=5).plan


def infeasible_problem() -> PlanningProblem:
    problem = sized_problem(13, layers=4, devices=2, schedule="1f1b")
    tiny = tuple(Device(d.id, d.server, d.speed, 1.0) for d in problem.cluster.devices)
    cluster = Cluster("c", problem.cluster.servers, problem.cluster.network, tiny)
    return PlanningProblem(problem.graph, cluster, 4, 2)


def check_time_limit(solver) -> None:
    """A large instance with a tiny limit returns soon, with an honest status and bound."""
    problem = sized_problem(14, layers=40, devices=8, schedule="1f1b")
    with cpu_past(0.5) as over:  # CPU past the limit: the work done there, the same idle or loaded
        result = solver.solve(problem, time_limit=0.5, seed=0)
    assert over.seconds < 14.5  # arc enumeration and one placement may overrun a little
    assert result.status in ("feasible", "optimal", "timeout-no-solution")
    if result.plan is not None:
        assert problem.evaluate(result.plan).iteration_time == pytest.approx(result.iteration_time)
        assert result.lower_bound is None or result.lower_bound <= result.iteration_time * (1 + REL)


@pytest.mark.parametrize("solver", [ilp(), cpsat()], ids=["ilp", "cpsat"])
def test_time_limit_holds_when_the_arc_table_takes_longer(solver):
    # 48 layers on 14 devices of 6 classes: the arc table alone takes 2-3 s here.  The
    # solvers once sorted it to the end (2.8-5.8 s at a 2 s limit).
    data = Path(__file__).parent / "data" / "time_limit"
    problem = PlanningProblem(load_graph(str(data / "big48.graph.json")),
                              load_cluster(str(data / "hetero14.cluster.json")), 64, 8)
    for _ in range(2):  # the second run finds warm caches and finishes the table sooner
        with cpu_past(1.5) as over:
            result = solver.solve(problem, time_limit=1.5, seed=0)
        assert over.seconds < 0.3 and result.plan is not None


def test_time_limit_holds_when_pulp_hands_the_model_to_highs():
    # 31 layers on 7 devices of distinct speeds, 40,918 arcs: PuLP writes the MILP in
    # about 1.3 s and translates it for HiGHS in another 1.2 s, neither interruptible;
    # a 3 s limit on the model loop alone took 4.1-4.3 s before both counted
    data = Path(__file__).parent / "data" / "time_limit"
    problem = PlanningProblem(load_graph(str(data / "chain31.graph.json")),
                              load_cluster(str(data / "near7.cluster.json")), 41, 16)
    solver = ilp(enumerate_first=False)
    solver.solve(problem, time_limit=0.5, seed=0)  # first call: lazy imports
    with cpu_past(3.0) as over:
        result = solver.solve(problem, time_limit=3.0, seed=0)
    assert over.seconds < 0.3 and result.plan is not None


@pytest.mark.parametrize("solver", [ilp(), cpsat()], ids=["ilp", "cpsat"])
def test_time_limit_holds_with_many_device_classes(solver):
    # 16 devices of distinct speeds: 65,535 compositions, about 1 s to list before the
    # first clock check (a 0.05 s limit became 1.05 s)
    rng = random.Random(3)
    layers = [Layer(f"l{i}", (1e-4, 1e-5), (2e-4, 2e-5), 1e6, 1e5, 1e4) for i in range(30)]
    devs = tuple(Device(f"d{i}", f"s{i % 4}", 1.0 + 0.01 * i, 1e9) for i in range(16))
    cluster = Cluster("c", tuple(Link(rng.choice([5e9, 5e10]), 1e-6, f"s{j}") for j in range(4)), Link(1e9, 1e-5),
                      devs)
    problem = PlanningProblem(LayerGraph.chain("g", layers, 1e3), cluster, 32, 4)
    solver.solve(problem, time_limit=0.05, seed=0)  # first call: lazy imports
    with cpu_past(0.05) as over:
        result = solver.solve(problem, time_limit=0.05, seed=0)
    assert over.seconds < 0.3 and result.plan is not None


@pytest.mark.parametrize("solver", ["ilp", "cpsat"])
def test_time_limit_holds_with_v_left_to_the_search(solver):
    # experiments/bench_solvers.py's 64 layers on 16 devices under looped-bfs, v left to the search: the
    # v = 1 solve and then group-search-virtual each got the whole limit (6.3 s at a 5 s limit)
    from dataclasses import replace
    from pipeplan.experiments.bench_solvers import schedule_problem
    problem = replace(schedule_problem(64, 16, "looped-bfs", 2), virtual_stages=None)
    with cpu_past(2.0) as over:
        result = get_solver(solver).solve(problem, time_limit=2.0, seed=0)
    assert over.seconds < 0.5
    # however little of the 2 s a loaded machine gives, the fallback's plan (fixed work, no clock) is there
    assert result.plan is not None and result.status in ("feasible", "optimal")
    assert problem.evaluate(result.plan).fits and result.lower_bound <= result.iteration_time


class TestBuildData:
    def test_stage_options_stop_when_the_clock_expires(self):
        problem = sized_problem(15, layers=5, devices=4, schedule="1f1b")
        expired = TimeLimit(0.0).start()
        many = PlanningProblem(problem.graph, Cluster("c", problem.cluster.servers, problem.cluster.network,
                                                      tuple(Device(f"d{i}", "s0", 1.0 + i / 100, 1e9)
                                                            for i in range(12))), 8, 2)
        assert stage_options(many, device_classes(many.cluster), expired) is None
        data = build_data(many, clock=expired)
        assert not data.complete and not len(data)

    def test_every_arc_fits_and_bounds_its_stage(self):
        problem = sized_problem(15, layers=5, devices=4, schedule="1f1b")
        data = build_data(problem)
        assert data.arcs
        for arc in data.arcs:
            assert arc.lo < arc.hi and 0 <= arc.tau <= data.max_tau

    def test_cutoff_drops_arcs(self):
        problem = sized_problem(15, layers=5, devices=4, schedule="gpipe")
        assert len(build_data(problem, cutoff=0.0).arcs) == 0

    def test_past_max_arcs_only_the_static_bound_is_kept(self):
        problem = sized_problem(15, layers=5, devices=4, schedule="1f1b")
        full = build_data(problem)
        dropped = build_data(problem, max_arcs=len(full) - 1)
        assert not dropped.complete and not len(dropped)
        assert dropped.static_bound == full.static_bound > work_bound(problem)
        assert build_data(problem, max_arcs=len(full)).complete


def random_configs(data, rng, tries: int = 200):
    """Random valid paths of arcs from layer 0 to the last layer (configurations)."""
    by_start = {}
    for i, arc in enumerate(data.arcs):
        by_start.setdefault(arc.lo, []).append(i)
    layers = len(data.problem.graph)
    for _ in range(tries):
        config, lo = [], 0
        while lo < layers and by_start.get(lo):
            config.append(rng.choice(by_start[lo]))
            lo = data.arcs[config[-1]].hi
        if lo == layers and _valid_labels(data, config):
            yield config


class TestConfigLowerBound:
    def test_below_simulated_time_of_every_placement(self):
        problem = sized_problem(16, layers=6, devices=4, schedule="1f1b")
        data = build_data(problem)
        checked = 0
        for config in random_configs(data, random.Random(0)):
            groups, _ = placements(data, config)
            bound = config_lower_bound(data, config)
            for devs in groups:
                flags = [data.options[data.arcs[i].option].recompute for i in config]
                plan = problem.make_plan([(data.arcs[i].lo, data.arcs[i].hi) for i in config], devs, flags)
                assert bound <= problem.evaluate(plan).iteration_time * (1 + REL)
                checked += 1
        assert checked > 0


    def test_path_to_a_later_all_reduce_hand_computed(self):
        """Term 2d: stage 0 (F 3 s, B 6 s) feeds a replicated stage 1 (F 1 s, B 1 s, AR 20 s), 2 microbatches.

        Stage 0 runs F0, F1 (6 s); F1 reaches stage 1, which runs F1 and B1 (2 s) and
        all-reduces (20 s): ``T = 28``.  The other terms stop at 27 (stage 1's head 3 +
        busy 4 + all-reduce 20) or below.
        """
        graph = LayerGraph.chain("two", [Layer("a", (3.0, 0.0), (6.0, 0.0), 1.0, 0.0, 0.0),
                                         Layer("b", (1.0, 0.0), (1.0, 0.0), 2e13, 0.0, 0.0)], input_bytes=0.0)
        cluster = Cluster("one", (Link(1e12, 0.0, "s"),), Link(1e12, 0.0),
                          tuple(Device(f"d{i}", "s", 1.0, 1e15) for i in range(3)))
        problem = PlanningProblem(graph, cluster, global_batch=2, microbatches=2, schedule="1f1b",
                                  allow_recompute=False)
        plan = problem.make_plan([(0, 1), (1, 2)], [("d0",), ("d1", "d2")])
        data = build_data(problem)
        config = plan_config(data, plan)
        assert problem.evaluate(plan).iteration_time == pytest.approx(28.0)
        assert config_lower_bound(data, config) == pytest.approx(28.0)
        assert optimistic_time(data, config) == pytest.approx(28.0)  # one server: the links are known
        arcs = [data.arcs[i] for i in config]
        # F0 (F1 is in chain), less the later round trip (2 s) that the rows add back: F1 precedes B0 here
        assert arcs[0].pivot_fwd == pytest.approx(1.0) and arcs[0].chain == pytest.approx(3.0)
        assert arcs[1].end_ar == pytest.approx(22.0)  # F1, B1, all-reduce

    def test_two_round_trips_hand_computed(self):
        """Term 2c on three stages of F = 1 s, B = 2 s, 1 s per transfer, 4 microbatches.

        Stage 0 (w = 2) runs F0, waits for microbatch 0's round trip ``R = 3 + 3 + 4 x 1``,
        runs B0 and F3, waits for microbatch 3's round trip, runs B3: ``1 + 10 + 3 + 10 + 2
        = 26 = T``.  Without the second trip the best term is the last stage's busy path,
        ``(1 + 1 + 1 + 1) + 12 + (1 + 2 + 1 + 2) = 22``, as is term 2 with it as the pivot.
        """
        graph = LayerGraph.chain("three", [Layer(f"l{i}", (1.0, 0.0), (2.0, 0.0), 0.0, 0.0, 0.0)
                                           for i in range(3)], input_bytes=0.0)
        cluster = Cluster("one", (Link(1e12, 1.0, "s"),), Link(1e12, 1.0),
                          tuple(Device(f"d{i}", "s", 1.0, 1e12) for i in range(3)))
        problem = PlanningProblem(graph, cluster, global_batch=4, microbatches=4, schedule="1f1b",
                                  allow_replication=False, allow_recompute=False)
        plan = problem.make_plan([(0, 1), (1, 2), (2, 3)], [("d0",), ("d1",), ("d2",)])
        data = build_data(problem)
        config = plan_config(data, plan)
        assert problem.evaluate(plan).iteration_time == pytest.approx(26.0)
        assert config_lower_bound(data, config) == pytest.approx(26.0)
        arcs = [data.arcs[i] for i in config]
        passes = sum(a.pass_cost for a in arcs)  # u' = 3 + 2 transfers, 3 + 2, 3
        assert passes == pytest.approx(13.0)
        # term 2 (one trip): stage 0's extra ops B0..B3 + F3 - u = 7, the last stage's 12 - 3 = 9
        assert [a.pivot_extra for a in arcs] == pytest.approx([7.0, 8.0, 9.0])
        # term 2c for stage 0: F0 + B0 + F3 + B3 - u + its cut twice more = 5, and R = 5 + 3 once more
        assert arcs[0].pivot2_extra == pytest.approx(5.0)
        assert passes + arcs[0].pivot2_extra + arcs[1].pass_cost + arcs[2].pass_cost == pytest.approx(26.0)


class TestOptimisticTime:
    def test_below_simulated_time_of_every_placement(self):
        """Best conceivable links: never above a placement's time (two servers, two speeds)."""
        for seed, schedule in ((41, "1f1b"), (42, "gpipe")):
            problem = sized_problem(seed, layers=6, devices=4, schedule=schedule)
            data = build_data(problem)
            checked = 0
            for config in random_configs(data, random.Random(seed)):
                floor = optimistic_time(data, config)
                groups, _ = placements(data, config)
                flags = [data.options[data.arcs[i].option].recompute for i in config]
                for devs in groups:
                    plan = problem.make_plan([(data.arcs[i].lo, data.arcs[i].hi) for i in config], devs, flags)
                    assert floor <= problem.evaluate(plan).iteration_time * (1 + REL)
                    checked += 1
            assert checked > 0


class TestFastestFirst:
    def test_speed_then_memory_then_server_order(self):
        cluster = Cluster("c", (Link(1e9, 0, "a"), Link(1e9, 0, "b")), Link(1e8, 0),
                          (Device("a0", "a", 1.0, 8e9), Device("b0", "b", 2.0, 8e9), Device("a1", "a", 2.0, 8e9),
                           Device("b1", "b", 1.0, 16e9), Device("a2", "a", 1.0, 8e9)))
        assert fastest_first(cluster) == ["a1", "b0", "b1", "a0", "a2"]


class TestTwoRoundTrips:
    def test_only_1f1b_with_a_forward_after_the_first_backward(self):
        assert two_round_trips("1f1b", 4, 2) and two_round_trips("1f1b", 4, 0)
        assert not two_round_trips("1f1b", 4, 3)  # F3 is a warm-up forward
        assert not two_round_trips("1f1b", 1, 0)
        assert not two_round_trips("gpipe", 8, 0)


def _valid_labels(data, config) -> bool:
    count = len(config)
    return all(data.arcs[i].tau == min(count - 1 - s, data.max_tau) for s, i in enumerate(config))


class TestPlacements:
    def test_distinct_and_disjoint(self):
        problem = sized_problem(17, layers=4, devices=4, schedule="gpipe")
        data = build_data(problem)
        config = [i for i, a in enumerate(data.arcs) if a.lo == 0 and a.hi == 4
                  and data.options[a.option].replicas == 2][:1]
        groups, exhaustive = placements(data, config)
        assert exhaustive and groups
        for devs in groups:
            flat = [d for g in devs for d in g]
            assert len(flat) == len(set(flat)) == 2


class TestDeviceClasses:
    def test_two_speeds_two_classes(self):
        problem = sized_problem(18, layers=2, devices=4, schedule="gpipe")
        classes = device_classes(problem.cluster)
        assert len(classes) == 2 and classes[0].speed >= classes[1].speed
        assert sum(c.count for c in classes) == 4


class TestModelRows:
    def test_rows_reference_existing_arcs(self):
        problem = sized_problem(19, layers=5, devices=3, schedule="1f1b")
        data = build_data(problem)
        counts, times = model_rows(data)
        ids = set(range(len(data.arcs)))
        assert all(i in ids for row in counts for i, _ in row.terms)
        assert all(i in ids for row in times for i, _ in row.terms)

    def test_aux_rows_equal_expanded_sums(self):
        """The difference rows define C_l and H_l as the per-layer sums of the docstring."""
        problem = sized_problem(21, layers=6, devices=4, schedule="1f1b")
        data = build_data(problem)
        _, times = model_rows(data)
        rng = random.Random(1)
        x = [rng.random() for _ in range(len(data))]  # any point, fractional too
        values: dict[str, float] = {}
        for row in times:  # definitions come in layer order: solve each for its new variable
            if row.sense != "==":
                continue
            (name, coef), rest = row.aux[0], row.aux[1:]
            values[name] = (sum(c * x[i] for i, c in row.terms) - sum(k * values[n] for n, k in rest)) / coef
        tab = data.table
        for layer in range(len(problem.graph)):
            cover = [i for i in range(len(data)) if tab["lo"][i] <= layer < tab["hi"][i]]
            before = [i for i in range(len(data)) if tab["hi"][i] <= layer]
            assert values[f"Cb{layer}"] == pytest.approx(sum(tab["busy"][i] * x[i] for i in cover))
            assert values[f"Cd{layer}"] == pytest.approx(sum(tab["pivot_extra"][i] * x[i] for i in cover))
            if layer:
                assert values[f"Hb{layer}"] == pytest.approx(sum(tab["head_fb"][i] * x[i] for i in before))
            if layer < len(problem.graph) - 1:
                after = [i for i in range(len(data)) if tab["lo"][i] > layer]
                assert values[f"R{layer}"] == pytest.approx(sum(tab["pass_cost"][i] * x[i] for i in after))
            assert values[f"Cr{layer}"] == pytest.approx(sum(tab["pivot_ar"][i] * x[i] for i in cover))
            assert values[f"Ce{layer}"] == pytest.approx(sum(tab["pivot2_extra"][i] * x[i] for i in cover))
            assert values[f"Cs{layer}"] == pytest.approx(sum(tab["pivot2_ar"][i] * x[i] for i in cover))
            assert values[f"Cq{layer}"] == pytest.approx(sum(tab["pivot_fwd"][i] * x[i] for i in cover))
            assert values[f"Cz{layer}"] == pytest.approx(sum(tab["end_ar"][i] * x[i] for i in cover))
            if layer:
                assert values[f"G{layer}"] == pytest.approx(sum(tab["chain"][i] * x[i] for i in before))


class TestStandaloneBound:
    def test_standalone_below_every_placement(self):
        """An arc's standalone bound (used for pruning) never exceeds a plan holding it."""
        problem = sized_problem(22, layers=6, devices=4, schedule="1f1b")
        data = build_data(problem)
        checked = 0
        for config in random_configs(data, random.Random(2)):
            groups, _ = placements(data, config)
            flags = [data.options[data.arcs[i].option].recompute for i in config]
            for devs in groups:
                plan = problem.make_plan([(data.arcs[i].lo, data.arcs[i].hi) for i in config], devs, flags)
                t = problem.evaluate(plan).iteration_time
                assert max(data.arcs[i].standalone for i in config) <= t * (1 + REL)
                checked += 1
        assert checked > 0

    def test_pruned_data_keeps_only_arcs_below_cutoff(self):
        problem = sized_problem(23, layers=6, devices=4, schedule="gpipe")
        full = build_data(problem)
        cutoff = float(sorted(full.table["standalone"])[len(full) // 2])
        pruned = build_data(problem, cutoff=cutoff)
        assert 0 < len(pruned) < len(full)
        assert (pruned.table["standalone"] < cutoff).all()


class TestGreedyPlans:
    def test_plans_are_valid(self):
        problem = sized_problem(20, layers=6, devices=4, schedule="1f1b")
        for plan in greedy_plans(problem):
            plan.validate(problem.graph, problem.cluster)
            assert problem.in_search_space(plan)


def test_opt_tolerance_is_tight():
    assert 0 < OPT_TOL <= 1e-9


class TestNearTies:
    """A found instance: swapping two devices of speeds 1.5000013 and 1.5000007 changes the time by 1.2e-8."""

    def problem(self) -> PlanningProblem:
        folder = Path(__file__).parent / "data" / "near_tie"
        return PlanningProblem(load_graph(str(folder / "graph.json")), load_cluster(str(folder / "cluster.json")),
                               global_batch=12, microbatches=2, schedule="1f1b", state_factor=8.0)

    @pytest.mark.parametrize("solver", [ilp(), cpsat(), ilp(enumerate_first=False),
                                        cpsat(enumerate_first=False)], ids=["ilp", "cpsat", "ilp-model",
                                                                                  "cpsat-model"])
    def test_the_faster_plan_and_a_bound_below_it(self, solver):
        problem = self.problem()
        best = brute_force(problem)
        result = solver.solve(problem, time_limit=60, seed=0)
        assert result.status == "optimal" and result.iteration_time == best
        assert result.lower_bound <= best and result.gap <= OPT_TOL * 1.01


# =========================================================================== several stages per device group
V2 = ("interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv")


VALUES = st.lists(st.floats(0.1, 2.0), min_size=40, max_size=40)


# --------------------------------------------------------------------------- tests
class TestCandidates:
    def test_every_plan_up_to_interchangeable_devices(self):
        # R = 1: v = 1 or 2 (one boundary choice each) on {d0}, {d1} or {d0, d1}: 6; R = 2, v = 1: (d0, d1), (d1, d0)
        p = virtual_problem([1.0] * 40, "looped-bfs", devices=2, layers=2, recompute=False)
        assert len(list(candidates(p))) == 8
        # two identical devices on one server: {d0} and {d1} are one choice, and so are the two orders
        same = PlanningProblem(p.graph, Cluster("c", p.cluster.servers, p.cluster.network,
                                                tuple(Device(f"d{i}", "s0", 1.0, 1e12) for i in range(2))),
                               global_batch=4, microbatches=2, schedule="looped-bfs", allow_recompute=False)
        found = list(candidates(same))
        assert len(found) == 5 and all(c.groups[0][0] == "d0" for c in found)

    def test_rounds_rule_leaves_out_groups(self):
        # m = 5 on R = 2 groups: rounds = max(1, 5 // 2) = 2 does not divide 5 (torch refuses); R = 1: rounds = 5
        p = virtual_problem([1.0] * 40, "interleaved-1f1b", devices=2, layers=4, batch=5, m=5, recompute=False)
        assert {len(c.groups) for c in candidates(p)} == {1}
        q = virtual_problem([1.0] * 40, "looped-bfs", devices=2, layers=4, batch=5, m=5, recompute=False)
        assert {len(c.groups) for c in candidates(q)} == {1, 2}

    def test_zbv_has_two_stages_per_group(self):
        p = virtual_problem([1.0] * 40, "zbv", devices=2, layers=4, recompute=False)
        assert {(len(c.groups), len(c.bounds), c.virtual) for c in candidates(p)} == {(1, 2, 2), (2, 4, 2)}


class TestPlainCount:
    @pytest.mark.parametrize("schedule", V2)
    @pytest.mark.parametrize("layers", [2, 4, 6])
    def test_counts_the_candidates_without_recompute(self, schedule, layers):
        p = virtual_problem([1.0] * 40, schedule, devices=3, layers=layers, batch=4, m=2, servers=2)
        listed = sum(1 for _ in candidates(p, flags=False))
        assert listed > 0 and plain_count(p, 10 ** 6) == listed

    def test_stops_above_the_cap(self):
        p = virtual_problem([1.0] * 40, "looped-bfs", devices=3, layers=6, batch=4, m=2, servers=2)
        total = plain_count(p, 10 ** 6)
        assert total > 20 and 10 < plain_count(p, 10) < total


class TestCandidateBound:
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(VALUES, st.sampled_from(V2), st.integers(1, 4), st.integers(1, 2), st.booleans())
    def test_never_above_any_plan(self, values, schedule, m, servers, named):
        p = virtual_problem(values, schedule, devices=3, layers=4, batch=4, m=m, servers=servers)
        for candidate in itertools.islice(candidates(p), 0, None, 7):
            plan = p.make_plan(candidate.bounds, [candidate.groups[owner(schedule, s, len(candidate.groups))]
                                                  for s in range(len(candidate.bounds))], candidate.recompute)
            assert candidate_bound(p, candidate) <= reference(p, plan, named).iteration_time * (1 + 1e-12)

    def test_hand_computed_single_group(self):
        # one device, speed 1, no transfers: term 1 is all the work, 2 stages x 2 microbatches x (1 + 2) s
        g = LayerGraph.chain("g", [Layer("a", (0, 1), (0, 2), 0, 0, 0), Layer("b", (0, 1), (0, 2), 0, 0, 0)])
        c = Cluster("c", (Link(1e9, 0, "s0"),), Link(1e9, 0), (Device("d0", "s0", 1, 1e9),))
        p = PlanningProblem(g, c, global_batch=2, microbatches=2, schedule="looped-bfs")
        assert candidate_bound(p, Candidate(2, (("d0",),), ((0, 1), (1, 2)), (False, False))) == 12.0


class TestSpaceBound:
    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
    @given(VALUES, st.sampled_from(V2))
    def test_never_above_the_optimum(self, values, schedule):
        p = virtual_problem(values, schedule, devices=2, layers=3, m=2)
        best, _ = virtual_brute_force(p)
        assert space_bound(p) <= best * (1 + 1e-12)


class TestSolveV2:
    """:func:`pipeplan.solver.exact.virtual_search.solve_v2` against the reference's brute force."""

    @pytest.mark.parametrize("schedule", V2)
    @pytest.mark.parametrize("memory", [1e12, 2400.0, 1300.0, 1000.0])  # all fit, some, a few or none
    @pytest.mark.parametrize("named", [True, False])
    def test_equals_brute_force(self, schedule, memory, named):
        values = [0.3 + 0.17 * ((7 * i) % 11) for i in range(40)]
        p = virtual_problem(values, schedule, devices=2, layers=4, batch=4, m=2, memory=memory, servers=2)
        best, _ = virtual_brute_force(p, named)
        result = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, evaluate=lambda plan: reference(p, plan, named))
        if math.isinf(best):
            assert result.status == "infeasible" and result.plan is None
        else:
            assert result.status == "optimal"
            assert result.iteration_time == pytest.approx(best, rel=1e-12)
            assert result.lower_bound == result.iteration_time

    @pytest.mark.parametrize("schedule", V2)
    @pytest.mark.parametrize("memory", [1e12, 4000.0, 2400.0, 1300.0, 1000.0])
    def test_recompute_flags_not_listed_never_give_a_false_proof(self, schedule, memory, monkeypatch):
        # with one stage's flags listed at most, every plan of two or more stages has only none or all recompute
        monkeypatch.setattr(virtual_space, "MAX_FLAG_STAGES", 1)
        values = [0.3 + 0.17 * ((7 * i) % 11) for i in range(40)]
        p = virtual_problem(values, schedule, devices=2, layers=4, batch=4, m=2, memory=memory, servers=2)
        best, _ = virtual_brute_force(p)
        result = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, evaluate=lambda plan: reference(p, plan))
        assert result.lower_bound is None or result.lower_bound <= best * (1 + 1e-12)
        if result.status == "optimal":
            assert result.iteration_time == pytest.approx(best, rel=1e-12)
        assert result.status != "infeasible" or math.isinf(best)

    def test_proves_when_the_plans_that_need_the_flags_are_slower(self, monkeypatch):
        # plain candidates that do not fit (the fastest 29.69) are all slower than the optimum (25.38): the
        # recompute variants not listed cannot be faster, so the search still proves it
        monkeypatch.setattr(virtual_space, "MAX_FLAG_STAGES", 1)
        rng = random.Random(1)
        values = [round(rng.uniform(0.2, 2.0), 2) for _ in range(40)]
        p = virtual_problem(values, "interleaved-zb", devices=2, layers=4, batch=4, m=2, memory=4000.0, servers=2)
        best, plans = virtual_brute_force(p)
        unfit = [r.iteration_time for plan, r in plans if not r.fits and len(plan.stages) > 1
                 and not any(st.recompute for st in plan.stages)]
        assert unfit and best < min(unfit)
        result = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, evaluate=lambda plan: reference(p, plan))
        assert result.status == "optimal" and result.iteration_time == pytest.approx(best, rel=1e-12)

    def test_lists_a_small_space_whole(self, monkeypatch):
        p = virtual_problem([0.5 + 0.1 * i for i in range(40)], "looped-bfs", devices=2, layers=4)
        best, _ = virtual_brute_force(p)
        monkeypatch.setattr(virtual_search, "MAX_CANDIDATES", 3)  # below the space's count
        whole = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, evaluate=lambda plan: reference(p, plan))
        assert whole.details["listed_all"] and whole.status == "optimal"
        assert whole.iteration_time == pytest.approx(best, rel=1e-12)
        monkeypatch.setattr(virtual_search, "SMALL_SPACE", 3)  # now too large to list whole
        cut = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, evaluate=lambda plan: reference(p, plan))
        assert cut.details["candidates"] <= 3 and not cut.details["listed_all"] and cut.status == "feasible"
        assert cut.lower_bound <= best * (1 + 1e-12)

    def test_budget_counts_simulations(self):
        p = virtual_problem([0.5 + 0.1 * i for i in range(40)], "looped-bfs", devices=2, layers=4)
        full = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, evaluate=lambda plan: reference(p, plan))
        assert full.details["simulations"] > 2  # so that a budget of 2 cuts the search
        runs = [solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, budget=WorkBudget(2),
                         evaluate=lambda plan: reference(p, plan)) for _ in range(2)]
        assert runs[0].plan == runs[1].plan and runs[0].details["simulations"] == 2
        assert runs[0].status == "feasible" and runs[0].lower_bound <= full.iteration_time * (1 + 1e-12)

    def test_budget_bound_never_above_optimum(self):
        p = virtual_problem([0.5 + 0.1 * i for i in range(40)], "interleaved-zb", devices=2, layers=4)
        best, _ = virtual_brute_force(p)
        cut = solve_v2(p, "t", clock=TimeLimit(60.0), seed=0, budget=WorkBudget(2), evaluate=lambda plan: reference(p, plan))
        assert cut.lower_bound <= best * (1 + 1e-12)


class TestRefusals:
    def test_solvers_without_a_v2_form_refuse_in_one_line(self):
        p = virtual_problem([1.0] * 40, "zbv", devices=2, layers=4)
        with pytest.raises(InputError) as err:
            get_solver("pipedream").solve(p, time_limit=5.0)
        assert "pipedream does not plan zbv" in str(err.value) and "cpsat" in str(err.value)
        assert "\n" not in str(err.value)

    def test_exact_solvers_plan_every_named_schedule(self):
        for name in ("ilp", "cpsat"):
            assert all(not schedule_refusal(name, s) for s in ("gpipe", "1f1b") + V2)

    def test_virtual_bnb_refuses_one_stage_per_group_saying_why(self):
        said = schedule_refusal("virtual-bnb", "1f1b")
        assert said.startswith("virtual-bnb does not plan 1f1b: it searches plans whose device groups hold several")
        assert "ilp" in said and "cpsat" in said and "virtual-bnb, " not in said

    def test_custom_is_not_planned(self):
        with pytest.raises(ValueError, match="custom programs come from a plan file"):
            virtual_problem([1.0] * 40, "custom")

    def test_virtual_stages_only_where_they_apply(self):
        with pytest.raises(ValueError, match="zbv has 2 stage"):
            virtual_problem([1.0] * 40, "zbv", virtual=3)
        with pytest.raises(ValueError, match="1f1b has 1 stage"):
            virtual_problem([1.0] * 40, "1f1b", virtual=2)


# --------------------------------------------------------------------------- the command line
GRAPH, CLUSTER = "examples/chain8.graph.json", "examples/two-servers.cluster.json"


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    from pipeplan.cli import main

    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


class TestSchedulesFromArgs:
    def test_all_auto_and_one(self):
        import argparse

        from pipeplan.cmd_plan import schedules_from_args

        assert schedules_from_args(argparse.Namespace(schedules="all", schedule="1f1b")) == \
            ["gpipe", "1f1b", *V2, "adaptive"]
        assert schedules_from_args(argparse.Namespace(schedules=None, schedule="auto")) == \
            ["gpipe", "1f1b", *V2, "adaptive"]
        assert schedules_from_args(argparse.Namespace(schedules="zbv, 1f1b,zbv", schedule="1f1b")) == ["zbv", "1f1b"]
        with pytest.raises(InputError, match="unknown schedule 'zb'; valid: gpipe"):
            schedules_from_args(argparse.Namespace(schedules="1f1b,zb", schedule="1f1b"))


class TestCliRefusals:
    def test_a_solver_without_a_v2_form(self, tmp_path, capsys):
        code, _, err = run_cli(["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedule", "zbv",
                                "--solver", "alpa", "-o", str(tmp_path / "p.json")], capsys)
        assert code == 2 and err.count("\n") == 1 and "alpa does not plan zbv" in err
        assert not (tmp_path / "p.json").exists()

    def test_virtual_stages_on_zbv(self, tmp_path, capsys):
        code, _, err = run_cli(["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedule", "zbv",
                                "--virtual-stages", "3", "--solver", "cpsat", "-o", str(tmp_path / "p.json")], capsys)
        assert code == 2 and err.count("\n") == 1 and "zbv has 2 stage(s) per device group" in err

    def test_auto_microbatches_with_v2(self, tmp_path, capsys):
        code, _, err = run_cli(["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "auto", "--schedule",
                                "looped-bfs", "--solver", "ilp", "-o", str(tmp_path / "p.json")], capsys)
        assert code == 2 and err.count("\n") == 1 and "M equal microbatches only" in err

    def test_pareto_v2(self, tmp_path, capsys):
        code, _, err = run_cli(["pareto", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedule",
                                "interleaved-zb", "-o", str(tmp_path / "f.json")], capsys)
        assert code == 2 and err.count("\n") == 1 and "pareto writes the front of nsga" in err

    def test_unknown_schedule_list(self, capsys):
        code, _, err = run_cli(["compare", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedules",
                                "1f1b,zb"], capsys)
        assert code == 2 and "unknown schedule 'zb'" in err


# --------------------------------------------------------------------------- every solver, judged by the reference
@pytest.fixture
def judged_by_reference(monkeypatch):
    """Every solver's plans judged by the reference of this file (named programs)."""
    monkeypatch.setattr(PlanningProblem, "evaluate", lambda self, plan: reference(self, plan))


SMALL = [0.3 + 0.17 * ((7 * i) % 11) for i in range(60)]


class TestRegisteredSolvers:
    @pytest.mark.parametrize("name", ["ilp", "cpsat"])
    @pytest.mark.parametrize("schedule", V2)
    def test_exact_equals_brute_force(self, judged_by_reference, name, schedule):
        p = virtual_problem(SMALL, schedule, devices=2, layers=4, batch=4, m=2, memory=2400.0, servers=2)
        best, _ = virtual_brute_force(p)
        result = get_solver(name).solve(p, time_limit=60.0, seed=3)
        assert result.status == "optimal" and result.stopped_by == "proved"
        assert result.iteration_time == pytest.approx(best, rel=1e-12) and result.gap == 0.0
        assert result.seed == 3 and result.budget == 20_000 and result.plan.schedule == schedule

    def test_budget_and_time_are_recorded(self, judged_by_reference):
        p = virtual_problem(SMALL, "interleaved-1f1b", devices=2, layers=4, batch=4, m=2)
        assert get_solver("cpsat").solve(p, time_limit=60.0).details["simulations"] > 1
        cut = [get_solver("cpsat").solve(p, time_limit=60.0, budget=1) for _ in range(2)]
        assert cut[0].stopped_by == "budget" and cut[0].budget == 1 and cut[0].status == "feasible"
        assert cut[0].plan == cut[1].plan
        timed = get_solver("ilp").solve(p, time_limit=1e-9)  # the fallback's plan, not a proof
        assert timed.stopped_by == "time" and timed.status == "feasible" and timed.plan is not None

    @pytest.mark.parametrize("name", ["group-search", "nsga", "even", "megatron", "deepspeed-uniform",
                                      "deepspeed-parameters"])
    @pytest.mark.parametrize("schedule", V2)
    def test_heuristics_plan_no_faster_than_the_optimum(self, judged_by_reference, name, schedule):
        p = virtual_problem(SMALL, schedule, devices=3, layers=4, batch=4, m=2, servers=2)
        best, _ = virtual_brute_force(virtual_problem(SMALL, schedule, devices=3, layers=4, batch=4, m=2, servers=2,
                                           recompute=False))  # with memory to spare recompute only slows
        runs = [get_solver(name).solve(p, time_limit=60.0) for _ in range(2)]
        result = runs[0]
        assert result.status == "feasible" and result.plan.schedule == schedule
        assert result.iteration_time >= best * (1 - 1e-12) and runs[1].plan == result.plan
        if name == "group-search":
            assert result.lower_bound <= best * (1 + 1e-12)
        else:
            assert result.lower_bound is None  # a baseline, or nsga, proves nothing


class TestFallback:
    """The plan :class:`VirtualBnB` starts from, built without the clock (``solver/exact/virtual_fallback.py``)."""

    @pytest.mark.parametrize("name", ["ilp", "cpsat", "virtual-bnb"])
    @pytest.mark.parametrize("virtual", [None, 2])
    def test_an_expired_clock_still_gets_a_plan_that_fits(self, name, virtual):
        from pipeplan.experiments.bench_solvers import schedule_problem
        problem = schedule_problem(32, 8, "interleaved-zb", 2)
        problem = PlanningProblem(problem.graph, problem.cluster, 64, 8, schedule="interleaved-zb",
                                  virtual_stages=virtual)
        solver = get_solver(name).algorithm(problem)
        expired = TimeLimit(0.0).start()
        result = solver.run(problem, expired, WorkBudget(solver.default_budget, stops=expired.stops), 0, None)
        assert result.status == "feasible" and result.plan is not None
        simulated = problem.evaluate(result.plan)
        assert simulated.fits and result.iteration_time == simulated.iteration_time
        assert result.lower_bound <= result.iteration_time
        assert result.plan_by == "virtual-bnb (fallback)" and expired.stops.time_cut
        assert result.details["fallback_simulations"] <= 2 * FALLBACK_TRIES

    def test_the_plan_is_the_fastest_of_the_candidates_tried(self):
        p = virtual_problem(SMALL, "looped-bfs", devices=4, layers=8, batch=4, m=2, servers=2)
        found = fallback_plan(p)
        assert found.plan is not None and found.simulations == FALLBACK_TRIES  # all fit: no recompute tries
        bounder = Bounder(p)
        listed = [c for c in fallback_candidates(p) if not bounder.overflows(c)]
        tried = sorted(listed, key=bounder.bound)[:FALLBACK_TRIES]
        assert found.iteration_time == min(p.evaluate(to_plan(p, c)).iteration_time for c in tried)
        assert fallback_plan(p) == found  # no clock, no randomness

    def test_a_candidate_that_does_not_fit_is_tried_with_recompute(self):
        roomy = virtual_problem(SMALL, "interleaved-1f1b", devices=2, layers=4, batch=4, m=2)
        # below every plain candidate's peak: none fits without recompute
        peak = min(max(roomy.evaluate(to_plan(roomy, c)).peak_memory) for c in fallback_candidates(roomy))
        tight = virtual_problem(SMALL, "interleaved-1f1b", devices=2, layers=4, batch=4, m=2, memory=peak * 0.99)
        kept = [c for c in fallback_candidates(tight) if not Bounder(tight).overflows(c)]
        refit = fallback_plan(tight)
        assert refit.simulations == 2 * min(FALLBACK_TRIES, len(kept))
        assert refit.plan is not None and all(stage.recompute for stage in refit.plan.stages)
        assert tight.evaluate(refit.plan).fits

    def test_no_candidate_fits_no_plan_and_no_proof(self):
        p = virtual_problem(SMALL, "interleaved-zb", devices=2, layers=4, batch=4, m=2, memory=1.0)
        assert fallback_plan(p).plan is None
        result = get_solver("ilp").solve(p, time_limit=0.0)
        assert result.status == "timeout-no-solution" and result.plan is None and result.stopped_by == "time"


class TestInterleavedForms:
    def test_even_and_megatron_split_per_virtual_stage(self):
        from pipeplan.solver.baselines.even import EvenSplit
        from pipeplan.solver.baselines.megatron import Megatron

        names = ["embed"] + [f"block.{i}" for i in range(4)] + ["head"]
        graph = LayerGraph.chain("g", [Layer(n, (0, 1), (0, 1), 1, 1, 1) for n in names])
        p = virtual_problem([1.0] * 60, "interleaved-1f1b", devices=2, layers=6)
        p = PlanningProblem(graph, p.cluster, global_batch=4, microbatches=2, schedule="interleaved-1f1b")
        assert EvenSplit().v2_bounds(p, 4) == ((0, 2), (2, 4), (4, 5), (5, 6))
        # 4 blocks over 4 chunks: one each, the embedding with the first, the head with the last
        assert Megatron().v2_bounds(p, 4) == ((0, 2), (2, 3), (3, 4), (4, 6))
        assert Megatron().v2_bounds(p, 3) is None  # Megatron refuses 4 blocks over 3 chunks

    def test_groupings(self):
        from pipeplan.solver.baselines.deepspeed import DeepSpeedUniform
        from pipeplan.solver.heuristics.virtual_groups import equal_groupings

        p = virtual_problem([1.0] * 60, "looped-bfs", devices=4, layers=4)
        assert [tuple(map(len, g)) for g in equal_groupings(p, 2)] == [(1, 1), (2, 2)]
        assert [tuple(map(len, g)) for g in DeepSpeedUniform().v2_groupings(p, 3)] == [(1, 1, 1)]


class TestDecoder:
    def test_even_vectors_decode_to_the_even_split(self):
        from pipeplan.solver.heuristics.virtual_nsga import Decoder
        from pipeplan.solver.space.virtual_space import even_bounds

        p = virtual_problem([1.0] * 60, "interleaved-1f1b", devices=2, layers=5)
        decoder = Decoder(p)
        for i, st_ in enumerate(decoder.structures):
            c = decoder.decode(decoder.encode_even(i))
            assert (c.virtual, c.groups) == (st_.virtual, st_.groups)
            assert c.bounds == even_bounds(5, st_.stages) and not any(c.recompute)

    def test_every_vector_decodes_to_a_valid_candidate(self):
        import numpy as np

        from pipeplan.solver.heuristics.virtual_nsga import Decoder

        p = virtual_problem([1.0] * 60, "zbv", devices=3, layers=6)
        decoder, rng = Decoder(p), np.random.default_rng(0)
        for _ in range(200):
            c = decoder.decode(rng.random(decoder.size) * (1 - 1e-9))
            assert len(c.bounds) == 2 * len(c.groups) and c.bounds[0][0] == 0 and c.bounds[-1][1] == 6
            assert all(lo < hi == nxt for (lo, hi), (nxt, _) in zip(c.bounds, c.bounds[1:] + ((6, 6),)))
            used = [d for g in c.groups for d in g]
            assert len(used) == len(set(used)) and len(c.recompute) == len(c.bounds)


# --------------------------------------------------------------------------- with the project's simulator
@functools.lru_cache(maxsize=None)
def schedule_case(schedule: str) -> tuple[PlanningProblem, float, tuple]:
    """A small problem of ``schedule``, its optimum over every plan, and (several stages per group) every plan with
    its reference timing."""
    if not NEEDS[schedule].several_stages:
        problem, best = case_problem((2, 5, 3, schedule, True, True, None))
        return problem, best, ()
    problem = virtual_problem(SMALL, schedule, devices=2, layers=4, batch=4, m=2, memory=2400.0, servers=2)
    best, plans = virtual_brute_force(problem)
    return problem, best, tuple(plans)


class TestWithTheSimulator:
    @pytest.mark.parametrize("schedule", V2)
    def test_the_reference_is_the_simulator_s_twin(self, schedule):
        problem, _, plans = schedule_case(schedule)
        for plan, ref in plans[::9]:
            sim = problem.evaluate(plan)
            assert sim.iteration_time == pytest.approx(ref.iteration_time, rel=1e-9) and sim.fits == ref.fits


class TestEverySchedule:
    """``ilp`` and ``cpsat`` plan every named schedule, judged by the simulator: their own models for one stage per
    device group, ``virtual-bnb`` for several, and the record says which ran."""

    @pytest.mark.parametrize("name", ["ilp", "cpsat"])
    @pytest.mark.parametrize("schedule", PLANNED_SCHEDULES)
    def test_proves_the_brute_force_optimum(self, name, schedule):
        problem, best, _ = schedule_case(schedule)
        result = get_solver(name).solve(problem, time_limit=60.0, seed=0)
        assert result.status == "optimal" and result.stopped_by == "proved"
        assert result.iteration_time == pytest.approx(best, rel=1e-7)
        assert result.algorithm == ("virtual-bnb" if NEEDS[schedule].several_stages else name)
        assert result.plan_by and result.bound_by  # what found the plan and what proved it


class TestEmptySpace:
    def test_too_many_virtual_stages_is_said(self):
        p = virtual_problem([1.0] * 60, "looped-bfs", devices=2, layers=4, virtual=5)
        result = solve_v2(p, "t", clock=TimeLimit(10.0), seed=0, evaluate=lambda plan: reference(p, plan))
        assert result.status == "infeasible" and "needs more stages than the 4 layers" in result.message

    def test_a_solver_refuses_it_in_one_line(self, tmp_path, capsys):
        code, _, err = run_cli(["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedule",
                                "looped-bfs", "--virtual-stages", "9", "--solver", "cpsat",
                                "-o", str(tmp_path / "p.json")], capsys)
        assert code == 2 and err.count("\n") == 1 and "needs more stages than the 8 layers" in err
