"""Solvers that choose tensor-parallel degrees and ZeRO levels (``--tensor-parallel``, ``--zero``).

The degree-``t`` problem (:mod:`pipeplan.solver.space.tensor_parallel`) must time a
uniform plan exactly where one server kind holds the devices; the outer loop
(:mod:`pipeplan.solver.heuristics.tensor_search`) must never return a plan slower than
the solver's own degree-1 plan, must return valid version-3 plans, the same ones on every
run, and bounds that hold over every plan the options allow: checked here against an
exhaustive search over partitions x devices x degrees x ZeRO levels, timed by ``simulate``.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipeplan.models.errors import InputError
from pipeplan.models.graph import Layer, LayerGraph, load_graph
from pipeplan.solver.core.problem import PlanningProblem, tensor_degrees
from pipeplan.solver.core.warm_start import check_warm_start, outside_options
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster import Cluster, Device, Link, load_cluster
from pipeplan.solver.formats.plan import Plan, Stage, load_plan
from pipeplan.solver.bounds.terms import work_bound
from pipeplan.solver.heuristics.tensor_search import (Phase, combined_bound, fallbacks, phases_for, relaxed_state,
                                                      state_hints, zero_levels)
from pipeplan.solver.planning import plan, problem_for
from pipeplan.solver.space.tensor_parallel import (collective_terms, degree_graph, expand_plan, homogeneous_servers,
                                                   replica_cluster, resplit, with_degree, with_zero)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
REL = 1e-9


@pytest.fixture(scope="module")
def tp_graph() -> LayerGraph:
    return load_graph(str(EXAMPLES / "tp.graph.json"))


@pytest.fixture(scope="module")
def quad() -> Cluster:
    return load_cluster(str(EXAMPLES / "tp.cluster.json"))


def two_servers(memory: float = 1e10) -> Cluster:
    """Two servers of two devices: fast ones on a fast link, slow ones on a slow link."""
    return Cluster("two-kinds", (Link(1e10, 1e-6, "a"), Link(1e9, 2e-5, "b")), Link(5e8, 3e-5),
                   (Device("a0", "a", 1.0, memory), Device("a1", "a", 1.0, memory),
                    Device("b0", "b", 0.5, memory), Device("b1", "b", 0.5, memory)))


def tp_chain(n: int, share: float = 0.9, comm: float = 2e4, memory_scale: float = 1.0) -> LayerGraph:
    layers = [Layer(f"l{i}", (1e-3, 5e-4 * (1 + i % 2)), (2e-3, 1e-3 * (1 + i % 2)), 1e6 * memory_scale,
                    1e5 * memory_scale, 1e4, step=1e-3, tp_share=(share, 1.0, 0.5), tp_comm=(comm, comm))
              for i in range(n)]
    return LayerGraph("tp-chain", layers, input_bytes=1e4)


# --------------------------------------------------------------------------- the degree-t problem
class TestTensorDegrees:
    def test_divisors_of_the_servers(self, quad):
        assert tensor_degrees(quad, 8) == [1, 2, 4]
        assert tensor_degrees(quad, 2) == [1, 2]
        assert tensor_degrees(two_servers(), 8) == [1, 2]


class TestReplicaCluster:
    def test_replicas_of_one_server(self, quad):
        layout = replica_cluster(quad, 2)
        assert [d.id for d in layout.cluster.devices] == ["g0", "g2"]
        assert layout.replicas == {"g0": ("g0", "g1"), "g2": ("g2", "g3")}
        assert replica_cluster(quad, 8) is None

    def test_a_replica_takes_its_slowest_device(self):
        cluster = replace(two_servers(), devices=(Device("a0", "a", 1.0, 5.0), Device("a1", "a", 0.5, 9.0)))
        (only,) = replica_cluster(cluster, 2).cluster.devices
        assert (only.speed, only.memory) == (0.5, 5.0)


class TestDegreeGraph:
    @pytest.mark.parametrize("schedule,recompute", [("gpipe", False), ("1f1b", True)])
    def test_exact_on_one_server(self, tp_graph, quad, schedule, recompute):
        # one server, one speed: the degree-2 problem times and sizes a plan as the simulator times its expansion
        layout = replica_cluster(quad, 2)
        small = Plan(tp_graph.name, quad.name, 8, 4.0, schedule,
                     (Stage((0, 1), ("g0",), (4, 4), recompute), Stage((1, 2), ("g2",), (4, 4))))
        inner = simulate(small, degree_graph(tp_graph, layout), layout.cluster)
        real = simulate(expand_plan(small, layout), tp_graph, quad)
        assert real.iteration_time == pytest.approx(inner.iteration_time, rel=REL)
        assert [g.peak_memory for g in real.groups] == pytest.approx([g.peak_memory for g in inner.groups], rel=REL)

    def test_folded_collectives_bracket_the_real_ones(self):
        # two server kinds: the search's collectives are never cheaper than real, the relaxed ones never dearer
        graph, cluster = tp_chain(2), two_servers()
        layout = replica_cluster(cluster, 2)
        for devices in (("a0",), ("b0",)):
            small = Plan(graph.name, cluster.name, 4, 4.0, "gpipe", (Stage((0, 2), devices, (2, 2)),))
            real = simulate(expand_plan(small, layout), graph, cluster).iteration_time
            high = simulate(small, degree_graph(graph, layout), layout.cluster).iteration_time
            low = simulate(small, degree_graph(graph, layout, optimistic=True), layout.cluster).iteration_time
            assert low <= real * (1 + REL) and real <= high * (1 + REL)


class TestCollectiveTerms:
    def test_one_server_kind_is_exact(self, quad):
        # 2(t-1) lat and 2(t-1)/(t bw), times the speed 1: docs/model.md 8.3
        assert collective_terms(replica_cluster(quad, 2)) == pytest.approx((2e-5, 1e-9))
        assert collective_terms(replica_cluster(quad, 1)) == (0.0, 0.0)

    def test_the_worst_and_the_best_server(self):
        layout = replica_cluster(two_servers(), 2)
        high, low = collective_terms(layout), collective_terms(layout, optimistic=True)
        assert high == pytest.approx((2 * 2e-5 * 0.5, 1 / 1e9 * 0.5))  # the slow link, at the slow speed
        assert low == pytest.approx((2 * 1e-6, 1 / 1e10))


class TestHomogeneousServers:
    def test_kinds(self, quad):
        assert homogeneous_servers(quad) and homogeneous_servers(two_servers())
        mixed = replace(quad, devices=(*quad.devices[:3], replace(quad.devices[3], speed=0.5)))
        assert not homogeneous_servers(mixed)


class TestExpandPlan:
    def test_round_trip_through_json(self, tp_graph, quad, tmp_path):
        layout = replica_cluster(quad, 2)
        small = Plan(tp_graph.name, quad.name, 8, 4.0, "1f1b", (Stage((0, 2), ("g0", "g2"), (4, 4)),), zero=1)
        made = expand_plan(small, layout)
        assert made.stages[0].tensor_parallel == 2 and made.stages[0].replicas == 2
        path = tmp_path / "p.json"
        path.write_text(json.dumps(made.to_dict()))
        back = load_plan(str(path), tp_graph, quad)
        assert back == made
        assert simulate(back, tp_graph, quad).iteration_time == simulate(made, tp_graph, quad).iteration_time


class TestResplit:
    def test_replicas_stay_in_their_server(self):
        cluster = two_servers()
        assert resplit(cluster, ("a0", "b0", "a1", "b1"), 2) == ("a0", "a1", "b0", "b1")
        assert resplit(cluster, ("a0", "b0"), 2) is None


class TestWithDegree:
    def test_one_group_changes(self, tp_graph, quad):
        base = Plan(tp_graph.name, quad.name, 8, 4.0, "gpipe",
                    (Stage((0, 1), ("g0", "g1"), (4, 4)), Stage((1, 2), ("g2", "g3"), (4, 4))))
        made = with_degree(base, quad, 1, 2)
        assert [st.tensor_parallel for st in made.stages] == [1, 2]
        assert with_degree(base, quad, 0, 4) is None
        simulate(made, tp_graph, quad)  # a valid version-3 plan


class TestWithZero:
    def test_one_level_is_the_plans(self, tp_graph, quad):
        base = load_plan(str(EXAMPLES / "tp.plan.json"))
        assert with_zero(base, [1, 1]).zero == 1 and all(st.zero is None for st in with_zero(base, [1, 1]).stages)
        mixed = with_zero(base, [0, 2])
        assert mixed.zero == 0 and [mixed.stage_zero(s) for s in range(2)] == [0, 2]


class TestOutsideOptions:
    def test_reasons(self, quad):
        p = load_plan(str(EXAMPLES / "tp.plan.json"))
        assert "uniform" in outside_options(p, quad, "uniform", 8, "auto", 2)
        assert "--max-zero 1" in outside_options(p, quad, "per-stage", 8, "auto", 1)
        assert "--zero 0" in outside_options(p, quad, "per-stage", 8, "0", 2)
        assert outside_options(p, quad, "per-stage", 2, "auto", 2) == ""


# --------------------------------------------------------------------------- ZeRO levels
class TestZeroLevels:
    def _plan(self, graph, cluster):
        return Plan(graph.name, cluster.name, 8, 4.0, "gpipe",
                    (Stage((0, 1), ("g0",), (4, 4)), Stage((1, 2), ("g1", "g2", "g3"), (4, 4))))

    def test_auto_shards_where_there_are_replicas(self, tp_graph, quad):
        problem = problem_for(tp_graph, quad, batch=8, microbatches=2, zero="auto")
        found = zero_levels(self._plan(tp_graph, quad), tp_graph, quad, problem)
        assert [found.plan.stage_zero(s) for s in range(2)] == [0, 1]
        plain = simulate(self._plan(tp_graph, quad), tp_graph, quad)
        assert found.time <= plain.iteration_time
        assert found.simulation.groups[1].step == pytest.approx(plain.groups[1].step / 3)  # a third of the state
        assert found.simulation.groups[1].peak_memory < plain.groups[1].peak_memory

    def test_auto_raises_to_two_only_where_it_must(self, tp_graph, quad):
        plan0 = self._plan(tp_graph, quad)
        level1 = simulate(replace(plan0, zero=1), tp_graph, quad).groups[1].peak_memory
        level2 = simulate(replace(plan0, zero=2), tp_graph, quad).groups[1].peak_memory
        tight = replace(quad, devices=tuple(replace(d, memory=(level1 + level2) / 2) if d.id != "g0" else d
                                            for d in quad.devices))
        problem = problem_for(tp_graph, tight, batch=8, microbatches=2, zero="auto")
        found = zero_levels(plan0, tp_graph, tight, problem)
        assert [found.plan.stage_zero(s) for s in range(2)] == [0, 2] and found.simulation.fits
        capped = zero_levels(plan0, tp_graph, tight, replace(problem, max_zero=1))
        assert not capped.simulation.fits

    def test_a_fixed_level_goes_to_every_stage(self, tp_graph, quad):
        problem = problem_for(tp_graph, quad, batch=8, microbatches=2, zero="2")
        assert zero_levels(self._plan(tp_graph, quad), tp_graph, quad, problem).plan.zero == 2


# --------------------------------------------------------------------------- the outer loop
class TestStateHints:
    def test_hints(self, tp_graph, quad):
        p = problem_for(tp_graph, quad, batch=8, microbatches=4, state_factor=8.0)
        assert state_hints(p) == [("full", 8.0)]
        assert state_hints(replace(p, zero="1")) == [("full", 8.0), ("paired", 1 + 1 + 6 / 2)]
        assert state_hints(replace(p, zero="auto")) == [("full", 8.0), ("paired", 1 + 7 / 2)]


class TestRelaxedState:
    def test_least_state(self, tp_graph, quad):
        p = problem_for(tp_graph, quad, batch=8, microbatches=4, state_factor=8.0)
        assert [relaxed_state(replace(p, zero=z)) for z in ("0", "1", "2", "auto")] == [8.0, 2.0, 1.0, 1.0]
        assert relaxed_state(replace(p, zero="auto", max_zero=1)) == 2.0


class TestPhasesFor:
    def test_first_the_plain_solve(self, tp_graph, quad):
        p = problem_for(tp_graph, quad, batch=8, microbatches=4, tensor_parallel="uniform", zero="auto")
        heuristic = phases_for(p, proves=False)
        assert [(f.degree, f.hint) for f in heuristic] == [(t, h) for t in (1, 2, 4) for h in ("full", "paired")]
        exact = phases_for(p, proves=True)
        assert [(f.degree, f.hint) for f in exact] == [(1, "full"), (1, "relaxed"), (2, "relaxed"), (4, "relaxed")]
        assert [(f.degree, f.hint) for f in phases_for(replace(p, zero="0"), proves=True)] == \
            [(1, "full"), (2, "relaxed"), (4, "relaxed")]


class TestFallbacks:
    def test_after_a_relaxed_plan_that_does_not_fit(self, tp_graph, quad):
        p = problem_for(tp_graph, quad, batch=8, microbatches=4, tensor_parallel="uniform", zero="auto")
        assert [(f.degree, f.hint) for f in fallbacks(p, Phase(2, "relaxed", 1.0))] == [(2, "full"), (2, "paired")]
        assert [(f.degree, f.hint) for f in fallbacks(p, Phase(1, "relaxed", 1.0))] == [(1, "paired")]
        assert fallbacks(p, Phase(2, "full", 4.0)) == []


class TestWorkBound:
    def test_work_over_speed(self, tp_graph, quad):
        p = problem_for(tp_graph, quad, batch=8, microbatches=4)
        # per layer 0.001 + 0.002 per microbatch and 0.0005 + 0.001 per sample, two layers, four devices of speed 1
        assert work_bound(p) == pytest.approx(2 * (0.003 * 4 + 0.0015 * 8) / 4)

def _plans(problem: PlanningProblem, mode: str, zero: str):
    """Every plan of ``problem`` (gpipe, no recompute) with the degrees and ZeRO levels the options allow."""
    graph, cluster = problem.graph, problem.cluster
    ids = [d.id for d in cluster.devices]
    degrees = tensor_degrees(cluster, problem.max_tensor_parallel) if mode != "1" else [1]
    levels = [0] if zero == "0" else [0, 1, 2]
    L = len(graph)
    for cuts in range(min(L, 2)):
        bounds = [(0, L)] if cuts == 0 else [(0, c) for c in range(1, L)]
        for cut in bounds:
            ranges = [(0, L)] if cuts == 0 else [(0, cut[1]), (cut[1], L)]
            S = len(ranges)
            for owner in itertools.product(range(S + 1), repeat=len(ids)):  # S: unused
                groups = [tuple(d for d, o in zip(ids, owner) if o == s) for s in range(S)]
                if any(not g for g in groups):
                    continue
                for ts in itertools.product(degrees, repeat=S):
                    if mode == "uniform" and len(set(ts)) > 1:
                        continue
                    made = [resplit(cluster, g, t) for g, t in zip(groups, ts)]
                    if any(m is None for m in made):
                        continue
                    for zs in itertools.product(levels, repeat=S):
                        stages = tuple(Stage(r, m, problem.split, False, tensor_parallel=t, zero=z)
                                       for r, m, t, z in zip(ranges, made, ts, zs))
                        yield Plan(graph.name, cluster.name, problem.global_batch, problem.state_factor,
                                   "gpipe", stages)


def _optimum(problem: PlanningProblem, mode: str, zero: str) -> float:
    times = [sim.iteration_time for sim in (simulate(p, problem.graph, problem.cluster)
                                            for p in _plans(problem, mode, zero)) if sim.fits]
    return min(times) if times else math.inf


class TestSolveTensorParallel:
    """:func:`pipeplan.solver.heuristics.tensor_search.solve_tensor_parallel`, through :func:`pipeplan.plan`."""

    @settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
    @given(layers=st.integers(2, 4), share=st.sampled_from([0.5, 0.95]), comm=st.sampled_from([0.0, 1e5]),
           solver=st.sampled_from(["greedy-speed", "group-search"]))
    def test_never_slower_than_degree_one(self, layers, share, comm, solver):
        graph, cluster = tp_chain(layers, share, comm), two_servers()
        base = plan(graph, cluster, batch=8, microbatches=4, solver=solver, schedule="1f1b")
        for mode in ("uniform", "per-stage"):
            done = plan(graph, cluster, batch=8, microbatches=4, solver=solver, schedule="1f1b",
                        tensor_parallel=mode, zero="auto")
            assert done.record.iteration_time <= base.record.iteration_time * (1 + REL)
            check = simulate(done.plan, graph, cluster)  # a valid plan the simulator accepts
            assert check.fits and check.iteration_time == pytest.approx(done.record.iteration_time, rel=REL)
            if mode == "uniform":
                assert len({st.tensor_parallel for st in done.plan.stages}) == 1

    def test_tensor_parallelism_is_chosen_where_it_pays(self, tp_graph, quad):
        base = plan(tp_graph, quad, batch=8, microbatches=4, solver="group-search")
        done = plan(tp_graph, quad, batch=8, microbatches=4, solver="group-search", tensor_parallel="uniform")
        assert {st.tensor_parallel for st in done.plan.stages} == {2}
        assert done.record.iteration_time < base.record.iteration_time
        phases = done.record.details["tensor_parallel"]["phases"]
        assert [(p["degree"], p["state"]) for p in phases] == [(1, "full"), (2, "full"), (4, "full")]
        assert "t=2" in done.record.plan_by

    def test_the_plain_solve_where_nothing_splits(self):
        # nothing to split and a collective per layer: degree 1 wins, with the very plan of the plain solve
        chain = tp_chain(3, comm=1e6)
        graph = LayerGraph(chain.name, [replace(l, tp_share=(0.0, 0.0, 0.0)) for l in chain.layers],
                           input_bytes=chain.input_bytes)
        cluster = two_servers()
        base = plan(graph, cluster, batch=8, microbatches=4, solver="group-search")
        done = plan(graph, cluster, batch=8, microbatches=4, solver="group-search", tensor_parallel="per-stage")
        assert done.plan.to_dict() == base.plan.to_dict()
        assert [p["degree"] for p in done.record.details["tensor_parallel"]["phases"]] == [1]

    def test_without_replication(self, tp_graph, quad):
        done = plan(tp_graph, quad, batch=8, microbatches=4, solver="group-search", tensor_parallel="per-stage",
                    zero="auto", allow_replication=False)
        assert all(st.replicas == 1 for st in done.plan.stages)
        assert [p["state"] for p in done.record.details["tensor_parallel"]["phases"]] == ["full"] * 3

    def test_deterministic_and_round_trips(self, tmp_path):
        graph, cluster = tp_chain(4), two_servers()
        runs = [plan(graph, cluster, batch=8, microbatches=4, solver="group-search", tensor_parallel="per-stage",
                     zero="auto", seed=3) for _ in range(2)]
        assert runs[0].plan.to_dict() == runs[1].plan.to_dict()
        assert runs[0].record.details["tensor_parallel"]["moves"] == runs[1].record.details["tensor_parallel"]["moves"]
        path = tmp_path / "chosen.plan.json"
        path.write_text(json.dumps(runs[0].record.plan_with_record().to_dict()))
        back = load_plan(str(path), graph, cluster)
        assert back == runs[0].plan
        assert simulate(back, graph, cluster).iteration_time == runs[0].record.iteration_time

    def test_warm_start_with_degrees(self, tp_graph, quad):
        start = plan(tp_graph, quad, batch=8, microbatches=4, solver="group-search", tensor_parallel="uniform").plan
        done = plan(tp_graph, quad, batch=8, microbatches=4, solver="even", tensor_parallel="uniform",
                    warm_start=start)
        assert done.record.iteration_time <= simulate(start, tp_graph, quad).iteration_time


class TestCombinedBound:
    """Bounds over every plan the options allow, and ``optimal`` only where it is the optimum."""

    INSTANCES = {"quad": lambda g, c: (g, c), "two-kinds": lambda g, c: (tp_chain(2), two_servers(memory=3.5e6))}

    @pytest.mark.parametrize("where", ["quad", "two-kinds"])
    @pytest.mark.parametrize("mode,zero", [("uniform", "0"), ("1", "auto"), ("per-stage", "auto")])
    def test_bound_below_the_optimum(self, tp_graph, quad, where, mode, zero):
        graph, cluster = self.INSTANCES[where](tp_graph, quad)
        done = plan(graph, cluster, batch=4, microbatches=2, solver="cpsat", schedule="gpipe",
                    allow_recompute=False, tensor_parallel=mode, zero=zero, time_limit=30)
        problem = done.problems[0]
        best = _optimum(problem, mode, zero)
        r = done.record
        assert best < math.inf  # on two-kinds only tensor parallelism or ZeRO fits
        assert r.plan is not None
        assert r.lower_bound is not None and r.lower_bound <= best * (1 + 1e-7)
        assert r.plan is None or r.iteration_time >= best * (1 - 1e-7)
        if r.status == "optimal":
            assert r.iteration_time == pytest.approx(best, rel=1e-7)
        if where == "quad" and mode == "uniform":
            assert r.status == "optimal"  # one server kind: each degree's relaxed problem is exact

    def test_work_bound_without_a_bound_per_degree(self, tp_graph, quad):
        problem = problem_for(tp_graph, quad, batch=8, microbatches=4, tensor_parallel="per-stage")
        phases = phases_for(problem, proves=True)
        assert combined_bound(problem, phases, [None] * len(phases)) == (work_bound(problem), "work bound")


# --------------------------------------------------------------------------- refusals
class TestRefusals:
    def test_adaptive(self, tp_graph, quad):
        with pytest.raises(ValueError, match="adaptive"):
            plan(tp_graph, quad, batch=8, microbatches=4, solver="even", schedule="adaptive", zero="1")
        done = plan(tp_graph, quad, batch=8, microbatches=4, solver="even", schedule=["1f1b", "adaptive"],
                    zero="1")
        assert [s.schedule for s in done.skipped] == ["adaptive"] and done.plan.zero == 1

    def test_zero_needs_an_optimizer_state(self, tp_graph, quad):
        with pytest.raises(ValueError, match="state_factor"):
            problem_for(tp_graph, quad, batch=8, microbatches=4, zero="auto", state_factor=1.0)

    def test_warm_start_outside_the_options(self, tp_graph, quad):
        start = load_plan(str(EXAMPLES / "tp.plan.json"), tp_graph, quad)
        start = replace(start, schedule="1f1b")
        plain = problem_for(tp_graph, quad, batch=8, microbatches=2)
        with pytest.raises(InputError, match="tensor_parallel 2"):
            check_warm_start(start, plain, "w.json")
        with pytest.raises(InputError, match="uniform"):
            check_warm_start(start, replace(plain, tensor_parallel="uniform", zero="auto"), "w.json")
        assert check_warm_start(start, replace(plain, tensor_parallel="per-stage", zero="auto"), "w.json") is start

    def test_no_plan_proved_for_every_degree(self, run_cli, tmp_path):
        tiny = json.loads((EXAMPLES / "tp.cluster.json").read_text())
        for d in tiny["devices"]:
            d["memory"] = 1e5
        cluster = tmp_path / "tiny.cluster.json"
        cluster.write_text(json.dumps(tiny))
        status, _, err = run_cli("plan", str(EXAMPLES / "tp.graph.json"), str(cluster), "--batch", "8",
                                 "--microbatches", "4", "--solver", "cpsat", "--tensor-parallel", "uniform",
                                 "--zero", "auto", "-o", str(tmp_path / "p.json"))
        assert status == 3 and err.startswith("no plan fits: at tensor-parallel degree 1 without ZeRO")
        assert "every degree's relaxed problem is proved infeasible" in err

    def test_cli(self, run_cli, tmp_path):
        graph, cluster = str(EXAMPLES / "tp.graph.json"), str(EXAMPLES / "tp.cluster.json")
        out = str(tmp_path / "p.json")
        status, _, err = run_cli("plan", graph, cluster, "--batch", "8", "--microbatches", "4", "--solver", "even",
                                 "--schedule", "adaptive", "--zero", "auto", "-o", out)
        assert status == 2 and err.startswith("error: ") and "adaptive" in err and len(err.splitlines()) == 1
        status, _, err = run_cli("plan", graph, cluster, "--batch", "8", "--microbatches", "4", "--solver",
                                 "group-search", "--tensor-parallel", "per-stage", "--zero", "auto", "-o", out)
        assert status == 0, err
        written = load_plan(out, load_graph(graph), load_cluster(cluster))
        assert written.uses_v3 and written.extra["solver"]["details"]["tensor_parallel"]["mode"] == "per-stage"
