"""pipeplan plan / compare: files written, records, exit statuses, time limits."""

from __future__ import annotations

import argparse
import csv
import json

import pytest

from pipeplan.models.errors import InputError
from pipeplan.solver.baselines import BASELINES
from pipeplan.solver.formats.plan import load_plan
from pipeplan import cmd_plan
from helpers import run_plan_command as run
from conftest import cpu_past

GRAPH, CLUSTER = "examples/chain8.graph.json", "examples/two-servers.cluster.json"


def base(cmd: str) -> list[str]:
    return [cmd, GRAPH, CLUSTER, "--batch", "32", "--microbatches", "8", "--schedule", "1f1b", "--time-limit", "5"]


@pytest.fixture
def tiny_cluster(tmp_path):
    data = json.load(open(CLUSTER))
    for d in data["devices"]:
        d["memory"] = 1e6
    path = tmp_path / "tiny.cluster.json"
    path.write_text(json.dumps(data))
    return str(path)


class TestProblemFromArgs:
    def test_switches(self):
        ns = argparse.Namespace(graph=GRAPH, cluster=CLUSTER, batch=16, microbatches=4, schedule="gpipe",
                                state_factor=2.0, no_replication=True, no_recompute=False, max_stages=3,
                                time_limit=1.0)
        p = cmd_plan.problem_from_args(ns)
        assert (p.global_batch, p.microbatches, p.schedule, p.state_factor) == (16, 4, "gpipe", 2.0)
        assert not p.allow_replication and p.allow_recompute and p.max_stages == 3

    def test_m_above_b_is_input_error(self):
        ns = argparse.Namespace(graph=GRAPH, cluster=CLUSTER, batch=4, microbatches=8, schedule="1f1b",
                                state_factor=4.0, no_replication=False, no_recompute=False, max_stages=None,
                                time_limit=1.0)
        with pytest.raises(InputError):
            cmd_plan.problem_from_args(ns)


class TestRunPlan:
    def test_writes_plan_with_record(self, tmp_path, capsys):
        out = tmp_path / "plan.json"
        assert run(base("plan") + ["--solver", "pipedream", "--seed", "3", "-o", str(out)]) == 0
        plan = load_plan(str(out))
        record = plan.extra["solver"]
        for key in ("name", "status", "iteration_time", "lower_bound", "gap", "wall_time", "seed"):
            assert key in record
        assert record["name"] == "pipedream" and record["status"] == "feasible" and record["seed"] == 3
        assert "pipedream" in capsys.readouterr().out

    def test_no_plan_exit_3(self, tmp_path, tiny_cluster, capsys):
        out = tmp_path / "plan.json"
        argv = ["plan", GRAPH, tiny_cluster, "--batch", "32", "--microbatches", "8", "--solver", "even", "-o", str(out)]
        assert run(argv) == 3
        assert "alone needs" in capsys.readouterr().err
        assert not out.exists()

    def test_unknown_solver_exit_2(self, tmp_path, capsys):
        assert run(base("plan") + ["--solver", "nope", "-o", str(tmp_path / "p.json")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and "even" in err

    def test_m_above_b_exit_2(self, tmp_path, capsys):
        argv = ["plan", GRAPH, CLUSTER, "--batch", "4", "--microbatches", "8", "--solver", "even",
                "-o", str(tmp_path / "p.json")]
        assert run(argv) == 2
        assert capsys.readouterr().err.startswith("error:")

    def test_missing_file_exit_2(self, tmp_path, capsys):
        argv = ["plan", "nope.json", CLUSTER, "--batch", "4", "--microbatches", "2", "--solver", "even",
                "-o", str(tmp_path / "p.json")]
        assert run(argv) == 2

    def test_time_limit_respected(self, tmp_path):
        argv = base("plan")[:-1] + ["0.5", "--solver", "dapple", "-o", str(tmp_path / "p.json")]
        with cpu_past(0.5) as over:  # CPU past the limit: the work done there, the same idle or loaded
            assert run(argv) in (0, 3)
        assert over.seconds < 4.5


class TestRunCompare:
    def test_json_csv_plot(self, tmp_path, capsys):
        csv_path, png = tmp_path / "c.csv", tmp_path / "c.png"
        assert run(base("compare") + ["--json", "--csv", str(csv_path), "--plot", str(png),
                                      "--solvers", "even,pipedream,greedy-speed"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert [r["solver"] for r in rows] == ["even", "pipedream", "greedy-speed"]
        assert min(r["ratio_to_best"] for r in rows) == pytest.approx(1.0)
        assert len(list(csv.DictReader(open(csv_path)))) == 3
        assert png.read_bytes()[:4] == b"\x89PNG"

    def test_best_plan_and_gantt(self, tmp_path, capsys):
        best, png = tmp_path / "best.json", tmp_path / "best.png"
        assert run(base("compare") + ["--json", "--solvers", "even,alpa", "--best", str(best),
                                      "--gantt", str(png)]) == 0
        rows = json.loads(capsys.readouterr().out)
        winner = min(rows, key=lambda r: r["iteration_time"])
        plan = load_plan(str(best))
        assert plan.extra["solver"]["name"] == winner["solver"]
        assert plan.extra["solver"]["iteration_time"] == pytest.approx(winner["iteration_time"])
        assert png.read_bytes()[:4] == b"\x89PNG"

    def test_table_all_baselines(self, capsys):
        # Only the baselines: the exact solvers have their own tests and time budgets.
        names = ",".join(cls.name for cls in BASELINES)
        assert run(base("compare") + ["--solvers", names]) == 0
        out = capsys.readouterr().out
        assert "alpa" in out and "ratio to best" in out

    def test_no_plan_exit_3(self, tiny_cluster, capsys):
        argv = ["compare", GRAPH, tiny_cluster, "--batch", "32", "--microbatches", "8", "--solvers", "even,alpa"]
        assert run(argv) == 3
        assert "no plan fits" in capsys.readouterr().err

    def test_heuristic_without_plan_does_not_claim_none_fits(self, tmp_path, capsys):
        # 1 GB devices: the even split fits nowhere, but ilp proves a 5-stage plan optimal.
        data = json.load(open(CLUSTER))
        for d in data["devices"]:
            d["memory"] = 1e9
        cluster = tmp_path / "1g.cluster.json"
        cluster.write_text(json.dumps(data))
        argv = ["compare", GRAPH, str(cluster), "--batch", "64", "--microbatches", "8", "--time-limit", "5"]
        assert run(argv + ["--solvers", "even"]) == 3
        err = capsys.readouterr().err
        assert "no plan found: even found no fitting plan, which does not prove that none fits" in err
        assert "no plan fits" not in err
        assert run(argv + ["--solvers", "ilp", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["status"] == "optimal"

    def test_empty_solver_list_is_input_error(self, capsys):
        assert run(base("compare") + ["--solvers", " , "]) == 2
        assert capsys.readouterr().err.startswith("error: -: --solvers: names no solver")


class TestCheckOptions:
    @pytest.mark.parametrize("flag, value, message", [
        ("--time-limit", "nan", "must be positive finite seconds, got nan"),
        ("--time-limit", "inf", "must be positive finite seconds, got inf"),
        ("--seed", "-1", "must be 0 to 2**31-1"),
        ("--seed", str(2 ** 31), "must be 0 to 2**31-1"),
        ("--state-factor", "nan", "must be finite and >= 0"),
        ("--state-factor", "-1", "must be finite and >= 0"),
        ("--generations", "0", "must be at least 1, got 0"),
        ("--population", "1", "must be at least 2, got 1"),
        ("--population", "5000", "must be at most 4096, got 5000"),
        ("--batch", str(2 ** 60), f"must be at most {2 ** 53}, got {2 ** 60}"),
        ("--max-microbatches", "16", "only applies with --microbatches auto (got --microbatches 8, which fixes"),
    ])
    def test_bad_option_is_one_line_exit_2_nothing_written(self, tmp_path, capsys, flag, value, message):
        out = tmp_path / "plan.json"
        argv = base("plan") + ["--solver", "nsga", flag, value, "-o", str(out)]
        assert run(argv) == 2
        err = capsys.readouterr().err
        assert err == f"error: -: {flag}: {message}" + err.split(message, 1)[1] and err.count("\n") == 1
        assert not out.exists()
