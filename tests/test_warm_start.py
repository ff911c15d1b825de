"""``plan --warm-start``: the earlier plan is checked against the problem, and the result is never slower."""

from __future__ import annotations

import json

import pytest

from pipeplan.models.errors import InputError
from pipeplan.models.graph import load_graph
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.warm_start import keep_better, load_warm_start
from conftest import EXAMPLES

GRAPH, CLUSTER = EXAMPLES / "gpt1.graph.json", EXAMPLES / "two-servers.cluster.json"


def problem(**kw) -> PlanningProblem:
    return PlanningProblem(load_graph(str(GRAPH)), load_cluster(str(CLUSTER)), global_batch=16, microbatches=4, **kw)


def one_stage_plan(p: PlanningProblem, split=(4, 4, 4, 4)) -> Plan:
    device = p.cluster.devices[0].id
    return Plan(p.graph.name, p.cluster.name, p.global_batch, p.state_factor, p.schedule,
                (Stage((0, len(p.graph)), (device,), tuple(split)),))


def write(tmp_path, plan: Plan, **changes) -> str:
    doc = plan.to_dict()
    doc.update(changes)
    path = tmp_path / "start.plan.json"
    path.write_text(json.dumps(doc))
    return str(path)


class TestLoadWarmStart:
    def test_a_plan_of_the_problem_loads(self, tmp_path):
        p = problem()
        assert load_warm_start(write(tmp_path, one_stage_plan(p)), p) == one_stage_plan(p)

    def test_another_batch_is_refused(self, tmp_path):
        p = problem()
        path = write(tmp_path, Plan(p.graph.name, p.cluster.name, 8, p.state_factor, p.schedule,
                                    (Stage((0, len(p.graph)), (p.cluster.devices[0].id,), (2, 2, 2, 2)),)))
        with pytest.raises(InputError, match="batch of 8 samples.*--batch 16"):
            load_warm_start(path, p)

    def test_zero_is_refused(self, tmp_path):
        p = problem()
        with pytest.raises(InputError, match="stage 0 has zero 1, but a solver's warm start takes only"):
            load_warm_start(write(tmp_path, one_stage_plan(p), format="pipeplan.plan/3", zero=1), p)

    def test_another_split_is_outside_the_space(self, tmp_path):
        p = problem()
        with pytest.raises(InputError, match="outside this problem's search space.*4 equal microbatches"):
            load_warm_start(write(tmp_path, one_stage_plan(p, (8, 8))), p)

    def test_an_unknown_device_is_refused(self, tmp_path):
        p = problem()
        doc = one_stage_plan(p).to_dict()
        doc["stages"][0]["devices"] = ["nowhere"]
        path = tmp_path / "bad.plan.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(InputError, match="unknown device 'nowhere'"):
            load_warm_start(str(path), p)


class TestKeepBetter:
    def result(self, p, plan, status="feasible", bound=None):
        t = None if plan is None else p.evaluate(plan).iteration_time
        return SolverResult("x", status, plan, t, bound, 0.1, 0)

    def test_a_faster_start_replaces_a_slower_plan(self):
        p = problem()
        gpipe_like = one_stage_plan(p)
        two_stages = Plan(p.graph.name, p.cluster.name, 16, p.state_factor, p.schedule,
                          (Stage((0, 7), (p.cluster.devices[0].id,), (4, 4, 4, 4)),
                           Stage((7, len(p.graph)), (p.cluster.devices[1].id,), (4, 4, 4, 4))))
        slow, fast = sorted((gpipe_like, two_stages), key=lambda plan: p.evaluate(plan).iteration_time)[::-1]
        kept = keep_better(p, self.result(p, slow, bound=0.0), fast)
        assert kept.plan == fast and kept.iteration_time == p.evaluate(fast).iteration_time
        assert kept.status == "feasible" and kept.lower_bound == 0.0 and "warm-start" in kept.message

    def test_a_slower_start_changes_nothing(self):
        p = problem()
        fast = self.result(p, one_stage_plan(p))
        assert keep_better(p, fast, one_stage_plan(p)) is fast

    def test_a_proved_result_is_kept(self):
        p = problem()
        proved = self.result(p, None, status="optimal")
        assert keep_better(p, proved, one_stage_plan(p)) is proved


class TestWarmStartCommand:
    def test_the_result_is_never_slower_than_the_start(self, run_cli, tmp_path):
        start = tmp_path / "start.json"
        status, _, err = run_cli("plan", str(GRAPH), str(CLUSTER), "--batch", "16", "--microbatches", "4",
                                 "--solver", "even", "-o", str(start))
        assert status == 0, err
        out = tmp_path / "again.json"
        for solver in ("even", "nsga"):
            status, _, err = run_cli("plan", str(GRAPH), str(CLUSTER), "--batch", "16", "--microbatches", "4",
                                     "--solver", solver, "--budget", "2", "--warm-start", str(start), "-o", str(out))
            assert status == 0, err
            before = json.loads(start.read_text())["solver"]["iteration_time"]
            assert json.loads(out.read_text())["solver"]["iteration_time"] <= before

    def test_a_plan_of_another_problem_is_one_error_line(self, run_cli, tmp_path):
        p = problem()
        start = write(tmp_path, one_stage_plan(p))
        out = tmp_path / "out.json"
        status, _, err = run_cli("plan", str(GRAPH), str(CLUSTER), "--batch", "16", "--microbatches", "2",
                                 "--solver", "even", "--warm-start", start, "-o", str(out))
        assert status == 2 and not out.exists()
        assert err.count("\n") == 1 and err.startswith(f"error: {start}: stages: the plan lies outside")


class TestBudgetOption:
    def test_recorded_and_the_same_plan_twice(self, run_cli, tmp_path):
        docs = []
        for k in range(2):
            out = tmp_path / f"p{k}.json"
            status, stdout, err = run_cli("plan", str(GRAPH), str(CLUSTER), "--batch", "16", "--microbatches", "auto",
                                          "--max-microbatches", "4", "--solver", "nsga", "--budget", "2",
                                          "--time-limit", "600", "-o", str(out))
            assert status == 0, err
            docs.append(json.loads(out.read_text()))
        record = docs[0]["solver"]
        assert record["budget"] == 2 and record["details"]["generations"] == 2
        assert record["stopped_by"] == "budget" and "stopped by budget" in stdout
        assert docs[0]["stages"] == docs[1]["stages"]

    @pytest.mark.parametrize("value", ["0", "-3", "nan", "inf"])
    def test_a_non_positive_budget_is_refused(self, run_cli, tmp_path, value):
        status, _, err = run_cli("plan", str(GRAPH), str(CLUSTER), "--batch", "16", "--microbatches", "4",
                                 "--solver", "even", "--budget", value, "-o", str(tmp_path / "x.json"))
        assert status == 2 and err.startswith("error: -: --budget: must be a positive finite amount of work")


class TestNsgaWarmStartSeeding:
    def test_the_seeding_runs_inside_the_solve_and_its_clock(self):
        # the seeding solvers must share the solve's clock, not run before it starts
        from pipeplan.solver.heuristics.nsga import SEEDING_SHARE, Nsga
        from pipeplan.solver.portfolio import nsga_seeds

        events = []

        def seeding(problem, *, seed, time_limit, within):
            events.append((time_limit, within.seconds))
            return nsga_seeds(problem, seed=seed, time_limit=time_limit, within=within)

        p = problem()
        result = Nsga(seeding=seeding).solve(p, time_limit=600.0, seed=0, budget=1, warm_start=one_stage_plan(p))
        assert events == [(SEEDING_SHARE * 600.0, 600.0)]
        assert result.details["seeds"][0] == "warm-start" and "group-search" in result.details["seeds"]
