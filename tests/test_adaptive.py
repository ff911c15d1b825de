"""``adaptive``: partitions planned with synthesized programs; ``auto`` never slower than a schedule it covers;
``--memory-fraction``."""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeplan import cmd_plan
from pipeplan.models.errors import InputError
from pipeplan.models.graph import load_graph
from pipeplan.solver.core.problem import PLANNED_SCHEDULES, VIRTUAL_SCHEDULES
from pipeplan.solver.core.schedule_synthesis import neighbours, partition_key, search_partitions
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.formats.plan import load_plan
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.planning import (ADAPTIVE, COVERED, POLISH_SHARE, AdaptiveOptions, _with_one_stage_per_group,
                                      plan, relabelled, schedules_for, with_memory_fraction)
from pipeplan.solver.solvers import get_solver
from helpers import REL, run_plan_command as run, sized_problem, virtual_brute_force, virtual_problem

GRAPH, CLUSTER = "examples/chain8.graph.json", "examples/two-servers.cluster.json"
CHEAP = AdaptiveOptions(evaluations=12, exact=False)
"""The partition search kept to a dozen list-scheduled partitions and no CP-SAT: what the property tests afford."""


@pytest.fixture(scope="module")
def chain8():
    return load_graph(GRAPH), load_cluster(CLUSTER)


@pytest.fixture(scope="module")
def planned(chain8):
    """``even`` on chain8 / two-servers, ``auto`` with the exact polish at a small work limit."""
    graph, cluster = chain8
    return plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="auto", time_limit=30,
                adaptive=AdaptiveOptions(evaluations=20, work=2.0))


class TestSchedulesFor:
    def test_auto_covers_adaptive(self):
        assert schedules_for("auto") == list(COVERED) and COVERED[-1] == ADAPTIVE

    def test_adaptive_alone(self):
        assert schedules_for("adaptive") == ["adaptive"]

    def test_unknown_names_adaptive_among_valid(self):
        with pytest.raises(ValueError, match="adaptive"):
            schedules_for("bogus")


class TestPlanAdaptive:
    def test_auto_has_an_adaptive_custom_plan(self, planned):
        adaptive = [o for o in planned.outcomes if o.schedule == ADAPTIVE]
        assert len(adaptive) == 1
        result = adaptive[0].result
        assert result.plan.schedule == "custom" and result.algorithm == ADAPTIVE
        assert result.status == "feasible" and result.lower_bound is None  # the partition is not proved best

    def test_never_slower_than_a_seed(self, planned):
        adaptive = next(o for o in planned.outcomes if o.schedule == ADAPTIVE).result
        fixed = [o.result.iteration_time for o in planned.outcomes
                 if o.schedule != ADAPTIVE and o.result.plan is not None]
        assert adaptive.iteration_time <= min(fixed) * (1 + REL)

    def test_record_says_what_built_the_programs(self, planned, chain8):
        result = next(o for o in planned.outcomes if o.schedule == ADAPTIVE).result
        record = result.details["synthesis"]
        assert record["algorithm"] == "cpsat-order" and record["status"] in ("optimal", "feasible")
        assert ("proved optimal for this partition" in result.message) == (record["status"] == "optimal")
        assert "not proved best" in result.message  # the proof covers the order, never the partition
        assert result.plan.extra["synthesis"] == record
        assert result.details["partitions"]["evaluations"] <= 20
        again = simulate(result.plan, *chain8)  # validated and timed by the simulator
        assert again.iteration_time == pytest.approx(result.iteration_time, rel=REL) and again.fits

    def test_alone_equals_auto(self, planned, chain8):
        """Counted work: the adaptive plan alone is the one auto finds (the seeds are the same solves)."""
        graph, cluster = chain8
        alone = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="adaptive", time_limit=30,
                     adaptive=AdaptiveOptions(evaluations=20, work=2.0))
        assert [o.schedule for o in alone.outcomes] == [ADAPTIVE]
        inside = next(o for o in planned.outcomes if o.schedule == ADAPTIVE).result
        assert alone.plan.to_dict()["stages"] == inside.plan.to_dict()["stages"]
        assert alone.record.iteration_time == inside.iteration_time

    def test_seeds_recorded(self, planned):
        result = next(o for o in planned.outcomes if o.schedule == ADAPTIVE).result
        seeds = result.details["partitions"]["seeds"]
        assert {s["schedule"] for s in seeds} <= set(PLANNED_SCHEDULES) and len(seeds) >= 2


class TestPhases:
    def test_each_phase_listed_with_its_budget(self, planned):
        adaptive = next(o.result for o in planned.outcomes if o.schedule == ADAPTIVE)
        seeds, walk, polish = adaptive.details["phases"]
        assert seeds["phase"] == "seeds" and seeds["used"] == len(planned.outcomes) - 1
        assert walk["phase"] == "partition walk" and walk["budget"] == 20 and walk["used"] <= 20
        assert walk["time_cap"] == 30 * (1 - POLISH_SHARE) and walk["used"] == adaptive.details["partitions"]["evaluations"]
        assert polish["phase"] == "order polish" and polish["budget"] == 2.0
        assert polish["used"] == adaptive.details["synthesis"]["work"] and polish["time_cap"] >= 30 * POLISH_SHARE

    def test_a_tight_time_limit_still_polishes(self, chain8):
        """The walk alone would take the whole limit (120 partitions in 0.2 s); it stops at its half."""
        graph, cluster = chain8
        done = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="adaptive", time_limit=0.2,
                    adaptive=AdaptiveOptions(evaluations=120, work=1.0))
        _, walk, polish = done.record.details["phases"]
        assert walk["time_cap"] == pytest.approx(0.2 * (1 - POLISH_SHARE))
        assert polish["phase"] == "order polish" and polish["time_cap"] >= 0.2 * POLISH_SHARE
        assert done.record.details["synthesis"]["algorithm"] == "cpsat-order"

    def test_without_the_polish_the_walk_has_the_whole_limit(self, chain8):
        graph, cluster = chain8
        done = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="adaptive", time_limit=10,
                    adaptive=AdaptiveOptions(evaluations=3, exact=False))
        _, walk, last = done.record.details["phases"]
        assert walk["time_cap"] == 10 and walk["used"] == 3 and walk["stopped_by"] == "budget"
        assert last["phase"] == "programs (list scheduler)" and last["budget"] is None


class TestNeighbours:
    def test_moves_keep_every_stage_non_empty(self, planned):
        start = planned.plan
        for made in neighbours(start):
            assert all(lo < hi for lo, hi in (s.layers for s in made.stages))
            assert made.stage_groups == start.stage_groups

    def test_pruning_changes_nothing_but_the_work(self, planned, chain8, monkeypatch):
        """A walk that ends on its own takes the same moves whether or not the neighbours that cannot improve
        (their bound not below the current time) are synthesized."""
        import pipeplan.solver.core.schedule_synthesis as synthesis

        seeds = [(o.schedule, o.result.plan) for o in planned.outcomes
                 if o.schedule != ADAPTIVE and o.result.plan is not None][:2]
        pruned = search_partitions(seeds, *chain8, evaluations=400)
        monkeypatch.setattr(synthesis, "order_lower_bound", lambda *args: 0.0)
        full = search_partitions(seeds, *chain8, evaluations=400)
        assert pruned.stopped_by == full.stopped_by == "complete" and full.pruned == 0 < pruned.pruned
        assert pruned.best.iteration_time == full.best.iteration_time and pruned.best.origin == full.best.origin
        assert partition_key(pruned.best.plan) == partition_key(full.best.plan)
        assert pruned.evaluations + pruned.pruned >= full.evaluations > pruned.evaluations

    def test_search_respects_budget(self, planned, chain8):
        seeds = [(o.schedule, o.result.plan) for o in planned.outcomes
                 if o.schedule != ADAPTIVE and o.result.plan is not None]
        found = search_partitions(seeds, *chain8, evaluations=3)
        assert found.evaluations == 3 and found.stopped_by == "budget"


def _instance(seed: int):
    problem = sized_problem(seed, layers=4, devices=2 + seed % 2, schedule="1f1b")
    return problem.graph, problem.cluster, problem.global_batch, problem.microbatches


class TestAutoNeverWorse:
    @settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 10_000), solver=st.sampled_from(["even", "megatron"]))
    def test_auto_at_most_each_schedule_alone(self, seed, solver):
        """With every v, and with one stage per group for the schedules whose v is a choice."""
        graph, cluster, batch, m = _instance(seed)
        auto = plan(graph, cluster, batch=batch, microbatches=m, solver=solver, schedule="auto", adaptive=CHEAP)
        for schedule, v in [(s, None) for s in PLANNED_SCHEDULES] + [(s, 1) for s in VIRTUAL_SCHEDULES]:
            try:
                alone = plan(graph, cluster, batch=batch, microbatches=m, solver=solver, schedule=schedule,
                             virtual_stages=v)
            except (InputError, ValueError):  # the solver or the options rule the schedule out
                continue
            if alone.plan is not None:
                assert auto.plan is not None
                assert auto.record.iteration_time <= alone.record.iteration_time * (1 + REL), schedule
        adaptive = next(o.result for o in auto.outcomes if o.schedule == ADAPTIVE)
        for o in auto.outcomes:
            if o.result.plan is not None:
                assert adaptive.iteration_time <= o.result.iteration_time * (1 + REL), o.schedule

    @settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 10_000))
    def test_version_2_at_most_version_1_relabelled(self, seed):
        graph, cluster, batch, m = _instance(seed)
        done = plan(graph, cluster, batch=batch, microbatches=m, solver="even",
                    schedule=["1f1b", "interleaved-1f1b", "interleaved-zb"])
        by = {o.schedule: o for o in done.outcomes}
        if "1f1b" not in by or by["1f1b"].result.plan is None:
            return
        for schedule in ("interleaved-1f1b", "interleaved-zb"):
            if schedule not in by:
                continue
            made = relabelled(by["1f1b"].result.plan, by[schedule].problem)
            if made is not None:
                t = simulate(made, graph, cluster).iteration_time
                assert by[schedule].result.iteration_time <= t * (1 + REL)


class TestOneStagePerGroup:
    def test_the_v1_solve_replaces_a_slower_result(self, chain8):
        graph, cluster = chain8
        problem = plan(graph, cluster, batch=8, microbatches=4, solver="even",
                       schedule="interleaved-zb").problems[0]
        nothing = SolverResult("even", "timeout-no-solution", None, None, None, 0.5, 0)
        kept = _with_one_stage_per_group(get_solver("even"), problem, nothing, time_limit=10, seed=0, budget=None)
        assert kept.plan is not None and kept.status == "feasible" and "v=1" in kept.message
        assert set(Counter(kept.plan.stage_groups).values()) == {1} and kept.wall_time >= 0.5

    def test_a_fixed_v_is_left_alone(self, chain8):
        graph, cluster = chain8
        problem = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="interleaved-zb",
                       virtual_stages=2).problems[0]
        nothing = SolverResult("even", "timeout-no-solution", None, None, None, 0.5, 0)
        assert _with_one_stage_per_group(get_solver("even"), problem, nothing, time_limit=10, seed=0,
                                         budget=None) is nothing


class TestVersion2SearchFromOneStagePerGroup:
    """``virtual-bnb`` (what ``cpsat`` and ``ilp`` run for the version-2 schedules) starts its search over every
    ``v`` from its own ``v = 1`` solve, so a single run with ``v`` left to the search finds the one-stage plan."""

    @settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 10_000), schedule=st.sampled_from(sorted(VIRTUAL_SCHEDULES)),
           budget=st.sampled_from([2, 8, 40]))
    # two where the search over every v alone finds no plan in its budget, and v = 1 does
    @example(seed=8, schedule="looped-bfs", budget=40)
    @example(seed=12, schedule="interleaved-zb", budget=8)
    def test_a_v_choice_run_is_never_slower_than_v1(self, seed, schedule, budget):
        """Small simulation budgets, so that the search over every ``v`` stops before it could reach the
        ``v = 1`` plans on its own."""
        graph, cluster, batch, m = _instance(seed)
        runs = {}
        for v in (None, 1):
            try:
                runs[v] = plan(graph, cluster, batch=batch, microbatches=m, solver="cpsat", schedule=schedule,
                               budget=budget, virtual_stages=v)
            except (InputError, ValueError):
                return
        one, any_v = runs[1], runs[None]
        if one.plan is not None:
            assert any_v.plan is not None
            assert any_v.record.iteration_time <= one.record.iteration_time * (1 + REL)
        simulations = any_v.record.details["simulations"]
        assert simulations <= budget + 1  # the v = 1 solve counts against the same budget

    @pytest.mark.parametrize("schedule", ["interleaved-1f1b", "interleaved-zb", "looped-bfs"])
    @pytest.mark.parametrize("memory", [1e12, 1300.0, 1000.0])  # all fit, a few or none
    def test_the_proof_still_covers_every_v(self, schedule, memory):
        """A proved ``v = 1`` solve settles the one-stage candidates; the result is still the optimum over every
        ``v`` (the reference simulator's brute force)."""
        values = [0.3 + 0.17 * ((7 * i) % 11) for i in range(40)]
        problem = virtual_problem(values, schedule, devices=2, layers=4, batch=4, m=2, memory=memory, servers=2)
        best, _ = virtual_brute_force(problem)
        result = get_solver("cpsat").solve(problem, time_limit=60.0)
        if math.isinf(best):
            assert result.status == "infeasible" and result.plan is None
        else:
            assert result.status == "optimal" and result.iteration_time == pytest.approx(best, rel=1e-12)
            assert result.lower_bound == result.iteration_time

    def test_the_record_lists_the_v1_phase(self):
        graph, cluster, batch, m = _instance(8)
        done = plan(graph, cluster, batch=batch, microbatches=m, solver="cpsat", schedule="interleaved-zb", budget=8)
        phases = [name for name, *_ in done.record.details["start_phases"]]
        assert phases[0] == "virtual-bnb (v=1)" and done.record.plan_by.endswith("(v=1)")
        assert set(Counter(done.plan.stage_groups).values()) == {1}
        fixed = plan(graph, cluster, batch=batch, microbatches=m, solver="cpsat", schedule="interleaved-zb", budget=8,
                     virtual_stages=1)
        assert fixed.record.details["start_phases"][0][0] != "virtual-bnb (v=1)"
        assert fixed.record.iteration_time == done.record.iteration_time

    def test_planning_does_not_solve_v1_again(self, chain8):
        graph, cluster = chain8
        problem = plan(graph, cluster, batch=8, microbatches=4, solver="even",
                       schedule="interleaved-zb").problems[0]
        nothing = SolverResult("cpsat", "timeout-no-solution", None, None, None, 0.5, 0)
        assert _with_one_stage_per_group(get_solver("cpsat"), problem, nothing, time_limit=10, seed=0,
                                         budget=None) is nothing


class TestRelabelled:
    def test_1f1b_as_zb1p(self, chain8):
        graph, cluster = chain8
        done = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="1f1b")
        zb = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="interleaved-zb",
                  virtual_stages=1).problems[0]
        made = relabelled(done.plan, zb)
        assert made.schedule == "interleaved-zb" and made.stages == done.plan.stages

    def test_refuses_other_stages_per_group(self, chain8):
        graph, cluster = chain8
        done = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="1f1b")
        zbv = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="zbv").problems[0]
        assert relabelled(done.plan, zbv) is None


class TestMemoryFraction:
    def test_scales_every_device(self, chain8):
        _, cluster = chain8
        half = with_memory_fraction(cluster, 0.5)
        assert [d.memory for d in half.devices] == [d.memory * 0.5 for d in cluster.devices]
        assert with_memory_fraction(cluster, 1.0) is cluster

    @pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
    def test_refuses_outside_unit_interval(self, chain8, bad):
        with pytest.raises(ValueError, match="memory fraction"):
            with_memory_fraction(chain8[1], bad)

    def test_plans_fit_the_fraction(self, chain8):
        graph, cluster = chain8
        full = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="1f1b")
        known = {d.id: d.memory for d in cluster.devices}
        sim = simulate(full.plan, graph, cluster)
        fraction = max(p / min(known[d] for d in devs) for p, devs in zip(sim.peak_memory, full.plan.groups))
        fraction = min(1.0, 1.2 * fraction)
        done = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule=["1f1b", "adaptive"],
                    memory_fraction=fraction, adaptive=CHEAP)
        for o in done.outcomes:
            assert o.result.plan is not None
            sim = simulate(o.result.plan, graph, cluster)
            for peak, devs in zip(sim.peak_memory, o.result.plan.groups):
                assert peak <= fraction * min(known[d] for d in devs) * (1 + REL)
        record = next(o for o in done.outcomes if o.schedule == ADAPTIVE).result.details["synthesis"]
        assert record["memory_fraction"] == fraction


class TestCli:
    def test_plan_adaptive_writes_a_custom_plan(self, tmp_path, capsys):
        out = tmp_path / "a.json"
        rc = run(["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedule", "adaptive",
                  "--solver", "even", "--adaptive-evaluations", "10", "--order-work", "1", "-o", str(out)])
        assert rc == 0
        data = json.loads(out.read_text())
        assert data["schedule"] == "custom" and data["solver"]["algorithm"] == "adaptive"
        assert data["synthesis"]["algorithm"] == "cpsat-order"
        load_plan(str(out), load_graph(GRAPH), load_cluster(CLUSTER))
        assert "custom" in capsys.readouterr().out

    @pytest.mark.parametrize("flag,value", [("--memory-fraction", "0"), ("--memory-fraction", "1.5"),
                                            ("--adaptive-evaluations", "0"), ("--order-work", "nan")])
    def test_bad_options_one_line(self, tmp_path, capsys, flag, value):
        out = tmp_path / "a.json"
        rc = run(["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "4", "--schedule", "adaptive",
                  "--solver", "even", flag, value, "-o", str(out)])
        assert rc == 2 and not out.exists()
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and flag in err

    def test_a_solver_planning_no_seed_refuses(self, tmp_path, capsys):
        out = tmp_path / "a.json"
        rc = run(["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "auto", "--schedule", "adaptive",
                  "--solver", "ilp", "-o", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and not out.exists()
        assert "ilp does not plan adaptive" in err and "M equal microbatches only" in err

    def test_help_states_the_defaults(self):
        from pipeplan.solver.core.schedule_synthesis import DEFAULT_EVALUATIONS, DEFAULT_WORK

        parser = argparse.ArgumentParser(prog="pipeplan")
        cmd_plan.register(parser.add_subparsers(dest="command", required=True))
        text = " ".join(parser._subparsers._group_actions[0].choices["plan"].format_help().split())
        assert f"(default {DEFAULT_EVALUATIONS})" in text and f"(default {DEFAULT_WORK:g})" in text


class TestParetoAdaptive:
    def test_front_of_synthesized_schedules(self, chain8):
        """nsga's front (here one 1F1B plan, without nsga's seeding) with its partition's programs synthesized."""
        from pipeplan.cmd_pareto import synthesized_front
        from pipeplan.solver.heuristics.nsga import FrontPoint, NsgaRun

        graph, cluster = chain8
        done = plan(graph, cluster, batch=8, microbatches=4, solver="even", schedule="1f1b")
        sim = simulate(done.plan, graph, cluster)
        start = NsgaRun((FrontPoint(done.plan, sim.iteration_time, max(sim.peak_memory)),), 0, 0, False, ())
        points = synthesized_front(start, done.problems[0]).front
        assert any(p.plan.schedule == "custom" for p in points)
        for a, b in zip(points, points[1:]):  # fastest first, each next one smaller
            assert a.iteration_time <= b.iteration_time and a.peak_memory > b.peak_memory
        assert points[0].iteration_time <= sim.iteration_time  # never slower than the plan it started from
        for p in points:
            again = simulate(p.plan, graph, cluster)
            assert again.iteration_time == pytest.approx(p.iteration_time, rel=REL)
            assert max(again.peak_memory) == pytest.approx(p.peak_memory, rel=REL)
