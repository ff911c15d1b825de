"""``pipeplan synthesize`` and :func:`pipeplan.synthesize`: programs built for a plan's partition.

The times reported are the simulator's (the written plan simulates to the reported
time, bit for bit); the partition is kept; bad input is one line, exit 2, nothing
written; no fitting program is exit 3, nothing written.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import pipeplan
from conftest import EXAMPLES
from pipeplan.models.graph import load_graph
from pipeplan.solver.core.schedule_synthesis import RECORD_FIELDS, order_lower_bound, synthesize_plan
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.formats.plan import Stage, load_plan
from pipeplan.solver.schedules.synthesis import evaluate, schedule_instance, sequential_programs

GRAPH = str(EXAMPLES / "chain8.graph.json")
CLUSTER = str(EXAMPLES / "two-servers.cluster.json")
PLAN = str(EXAMPLES / "hetero.plan.json")
TINY_GRAPH = str(EXAMPLES / "gpt-tiny.graph.json")
PAIR = str(EXAMPLES / "cpu-pair.cluster.json")
INTERLEAVED = str(EXAMPLES / "interleaved.plan.json")


def partition(plan_dict: dict) -> list[tuple]:
    return [(tuple(st["layers"]), tuple(st["devices"]), tuple(st["microbatches"]), st["recompute"])
            for st in plan_dict["stages"]]


class TestSynthesizeCommand:
    def test_writes_a_custom_plan_that_simulates_to_the_reported_time(self, run_cli, tmp_path):
        out = tmp_path / "syn.json"
        status, stdout, err = run_cli("synthesize", GRAPH, CLUSTER, PLAN, "-o", str(out), "--json")
        assert status == 0 and err == ""
        summary = json.loads(stdout)
        written = json.loads(out.read_text())
        assert written["schedule"] == "custom" and len(written["programs"]) == 3
        assert partition(written) == partition(json.loads((EXAMPLES / "hetero.plan.json").read_text()))
        record = written["synthesis"]
        assert tuple(record) == RECORD_FIELDS and record == summary["synthesis"]
        assert record["algorithm"] == "list-scheduler" and record["status"] in ("feasible", "optimal")
        assert record["lower_bound"] <= record["iteration_time"] and record["before"]["schedule"] == "1f1b"
        # the reported times are the simulator's, of the plan given and of the plan written
        status, simulated, _ = run_cli("simulate", GRAPH, CLUSTER, str(out), "--json")
        assert status == 0
        assert json.loads(simulated)["iteration_time"] == summary["after"]["iteration_time"] == record["iteration_time"]
        status, simulated, _ = run_cli("simulate", GRAPH, CLUSTER, PLAN, "--json")
        assert json.loads(simulated)["iteration_time"] == summary["before"]["iteration_time"]
        assert summary["after"]["iteration_time"] < summary["before"]["iteration_time"]  # 1F1B is slower here

    def test_exact_proves_the_order_and_prints_before_and_after(self, run_cli, tmp_path):
        out = tmp_path / "exact.json"
        status, stdout, err = run_cli("synthesize", TINY_GRAPH, PAIR, INTERLEAVED, "-o", str(out), "--exact",
                                      "--budget", "5", "--seed", "3")
        assert status == 0 and err == ""
        assert stdout.startswith("before: interleaved-1f1b ") and "after:  custom " in stdout
        record = json.loads(out.read_text())["synthesis"]
        assert record["algorithm"] == "cpsat-order" and record["status"] == "optimal"
        assert record["stopped_by"] == "proof" and record["seed"] == 3 and record["budget"] == 5
        assert record["lower_bound"] <= record["iteration_time"] and record["gap"] < 1e-4
        assert record["iteration_time"] <= record["before"]["iteration_time"]

    @pytest.mark.parametrize("extra, where", [
        (["--exact", "--workers", "0"], "--workers"),
        (["--seed", "2"], "--seed"),  # the list scheduler takes no seed
        (["--memory-fraction", "0"], "--memory-fraction"),
        (["--exact", "--budget", "nan"], "--budget"),
    ])
    def test_bad_options_refused_before_anything_is_written(self, run_cli, tmp_path, extra, where):
        out = tmp_path / "never.json"
        status, stdout, err = run_cli("synthesize", GRAPH, CLUSTER, PLAN, "-o", str(out), *extra)
        assert status == 2 and stdout == "" and not out.exists()
        assert err.count("\n") == 1 and err.startswith(f"error: -: {where}: ")

    def test_bad_files_refused_in_one_line(self, run_cli, tmp_path):
        out = tmp_path / "never.json"
        for args, where in (((GRAPH, CLUSTER, GRAPH), GRAPH), ((TINY_GRAPH, PAIR, PLAN), PLAN)):
            status, stdout, err = run_cli("synthesize", *args, "-o", str(out))
            assert status == 2 and stdout == "" and not out.exists()
            assert err.count("\n") == 1 and err.startswith(f"error: {where}: ")
        status, _, err = run_cli("synthesize", GRAPH, CLUSTER, PLAN, "-o", PLAN)  # would replace its input
        assert status == 2 and err.startswith(f"error: {PLAN}: output: ")

    def test_no_fitting_program_is_exit_3_and_writes_nothing(self, run_cli, tmp_path):
        out = tmp_path / "never.json"
        status, stdout, err = run_cli("synthesize", GRAPH, CLUSTER, PLAN, "-o", str(out), "--memory-fraction", "0.001")
        assert status == 3 and stdout == "" and not out.exists()
        assert err.startswith("no program fits (unknown): group ")  # unequal splits: not proved


class TestSynthesize:
    def test_api_takes_objects_and_keeps_the_better_own_programs(self):
        graph, cluster = load_graph(GRAPH), load_cluster(CLUSTER)
        first = pipeplan.synthesize(load_plan(PLAN, graph, cluster), graph, cluster)
        again = pipeplan.synthesize(first.plan, graph, cluster)  # the custom plan's own programs are a candidate
        assert again.after.iteration_time <= first.after.iteration_time
        assert again.record["before"]["iteration_time"] == first.after.iteration_time
        assert "solver" not in again.plan.extra and again.plan.extra["synthesis"] == again.record

    def test_whole_backwards_only(self):
        graph, cluster = load_graph(GRAPH), load_cluster(CLUSTER)
        made = synthesize_plan(load_plan(PLAN, graph, cluster), graph, cluster, split_backward=False)
        assert {action[-2] for program in made.plan.programs() for action in program} <= {"F", "B"}
        assert made.after.iteration_time <= made.before.iteration_time
        assert made.record["space"] == "F, B; any order"

    def test_proved_memory_shortage_is_infeasible(self):
        graph, cluster = load_graph(GRAPH), load_cluster(CLUSTER)
        plan = load_plan(PLAN, graph, cluster)
        equal = replace(plan, stages=tuple(replace(st, microbatches=(16,) * 4) for st in plan.stages))
        made = synthesize_plan(equal, graph, cluster, memory_fraction=0.001)
        assert not made.fits and made.record["status"] == "infeasible" and "so no program fits" in made.reason


class TestOrderLowerBound:
    def test_below_every_program_and_tight_on_one_group(self):
        graph, cluster = load_graph(GRAPH), load_cluster(CLUSTER)
        plan = load_plan(PLAN, graph, cluster)
        instance = schedule_instance(plan, graph, cluster)
        made = synthesize_plan(plan, graph, cluster)
        for programs in (sequential_programs(instance), made.plan.actions()):
            assert order_lower_bound(instance) <= evaluate(instance, programs).iteration_time
        one = replace(plan, stages=(Stage((0, 8), ("g0",), (16,) * 4),))
        alone = synthesize_plan(one, graph, cluster)
        assert alone.record["status"] == "optimal" and alone.record["gap"] < 1e-11
        assert alone.after.iteration_time == simulate(one, graph, cluster).iteration_time
