"""``pipeplan validate`` and ``pipeplan simulate``: output, and bad input as one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES

GRAPH = str(EXAMPLES / "chain8.graph.json")
CLUSTER = str(EXAMPLES / "two-servers.cluster.json")
PLAN = str(EXAMPLES / "hetero.plan.json")


def load(name):
    return json.loads((EXAMPLES / name).read_text())


class TestSimulateCommand:
    def test_json(self, run_cli):
        status, out, err = run_cli("simulate", GRAPH, CLUSTER, PLAN, "--json")
        assert status == 0 and err == ""
        data = json.loads(out)
        assert set(data) >= {"iteration_time", "throughput", "peak_memory", "fits"}
        assert len(data["peak_memory"]) == 3 and data["fits"] is True
        assert data["throughput"] == pytest.approx(64 / data["iteration_time"])

    def test_table_and_pictures(self, run_cli, tmp_path):
        trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
        status, out, _ = run_cli("simulate", GRAPH, CLUSTER, PLAN, "--trace", str(trace), "--gantt", str(gantt))
        assert status == 0 and "iteration time" in out and "peak memory" in out
        events = json.loads(trace.read_text())["traceEvents"]
        names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        assert {"stage 0", "stage 2", "link 0->1 (activations)", "link 2->1 (gradients)"} <= names
        assert {e["cat"] for e in events if e["ph"] == "X"} == {"forward", "backward", "recompute", "transfer",
                                                                 "allreduce"}
        assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["g.png", "t.json"]  # no temporary left

    def test_name_mismatch_is_a_warning(self, run_cli, tmp_path):
        data = load("hetero.plan.json")
        data["graph"] = "other"
        path = tmp_path / "p.json"
        path.write_text(json.dumps(data))
        status, _, err = run_cli("simulate", GRAPH, CLUSTER, str(path), "--json")
        assert status == 0 and err.startswith("warning:")


class TestValidateCommand:
    def test_all_examples(self, run_cli):
        files = [GRAPH, CLUSTER, PLAN, str(EXAMPLES / "custom.plan.json")]
        status, out, _ = run_cli("validate", *files)
        assert status == 0 and out.count("ok: ") == 4

    def test_unknown_format(self, run_cli, tmp_path):
        path = tmp_path / "x.json"
        path.write_text('{"format": "something/1"}')
        status, _, err = run_cli("validate", str(path))
        assert status == 2 and err.startswith(f"error: {path}: format: unknown format")


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def _graph(mutate):
    data = load("chain8.graph.json")
    mutate(data)
    return data


def _cluster(mutate):
    data = load("two-servers.cluster.json")
    mutate(data)
    return data


def _plan(mutate):
    data = load("hetero.plan.json")
    mutate(data)
    return data


def _deadlock(d):
    d["stages"][0]["microbatches"] = [4] * 16
    d["stages"][1]["microbatches"] = [64]
    d["stages"][2]["microbatches"] = [64]


def _gpipe_as_custom(d):
    d["schedule"] = "custom"
    for st in d["stages"]:
        m = len(st["microbatches"])
        st["ops"] = [f"F{k}" for k in range(m)] + [f"B{k}" for k in range(m)]


def _custom_missing(d):
    _gpipe_as_custom(d)
    d["stages"][1]["ops"].pop()


def _custom_b_first(d):
    _gpipe_as_custom(d)
    ops = d["stages"][2]["ops"]
    ops.insert(0, ops.pop(ops.index("B0")))


def _custom_newline(d):
    _gpipe_as_custom(d)
    d["stages"][0]["ops"][0] = "F0\n"  # "$" in a regex would let it through


def _gpipe_order_on_1f1b(d):
    d["stages"][0]["ops"] = ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]  # 1f1b runs B0 before F3 here


BAD_INPUTS = [
    # (which file, content, where, what)
    ("graph", None, "file", "no such file"),
    ("graph", "{ not json", "line 1 column 3", "invalid JSON"),
    ("graph", _graph(lambda d: d["layers"][2].pop("fwd")), "layers[2].fwd", "missing required field"),
    ("graph", _graph(lambda d: d["layers"][2].update(out="x")), "layers[2].out", "expected a number"),
    ("graph", _graph(lambda d: d.update(format="pipeplan.graph/9")), "format", "unknown format version"),
    ("graph", _graph(lambda d: d["layers"][1].update(bwd=[0.1, -2e-5])), "layers[1].bwd[1]", "must not be negative"),
    ("graph", _graph(lambda d: d.update(edges=[[3, 2]])), "edges[0]", "must go forward"),
    ("graph", _graph(lambda d: d.update(edges=[[0, 8]])), "edges[0]", "does not exist"),
    ("cluster", _cluster(lambda d: d["servers"][1].update(bandwidth=0)), "servers[1].bandwidth", "must be positive"),
    ("cluster", _cluster(lambda d: d["network"].update(bandwidth=-1)), "network.bandwidth", "must be positive"),
    ("plan", _plan(lambda d: d["stages"][1].update(layers=[4, 6])), "stages[1].layers", "gap"),
    ("plan", _plan(lambda d: d["stages"][1].update(layers=[2, 6])), "stages[1].layers", "overlap"),
    ("plan", _plan(lambda d: d["stages"][1].update(layers=[3, 3])), "stages[1].layers", "empty"),
    ("plan", _plan(lambda d: d["stages"][2].update(devices=["g9"])), "stages[2].devices[0]", "unknown device"),
    ("plan", _plan(lambda d: d["stages"][2].update(devices=["g2"])), "stages[2].devices[0]", "already used"),
    ("plan", _plan(lambda d: d["stages"][1].update(microbatches=[8, 8, 16, 16, 15])), "stages[1].microbatches",
     "sum to 63"),
    ("plan", _plan(lambda d: d["stages"][1].update(microbatches=[0, 16, 16, 16, 16])), "stages[1].microbatches[0]",
     "must be positive"),
    ("plan", _plan(lambda d: d.update(schedule="interleaved")), "schedule", "unknown schedule"),
    ("plan", _plan(_custom_missing), "stages[1].ops", "missing ops B4"),
    ("plan", _plan(_custom_b_first), "stages[2].ops[0]", "B0 comes before F0"),
    ("plan", _plan(_deadlock), "stages[0].ops[3]", "deadlock: stage 0 op B0 waits for the gradients"),
    ("plan", _plan(lambda d: d.pop("stages")), "stages", "missing required field"),
    ("plan", _plan(lambda d: d.update(global_batch="64")), "global_batch", "expected an integer"),
    ("plan", _plan(lambda d: d.update(global_batch=2**60)), "global_batch", "must be at most 9007199254740992"),
    ("plan", _plan(_custom_newline), "stages[0].ops[0]", "is not of the form"),
    ("plan", _plan(_gpipe_order_on_1f1b), "stages[0].ops", "differs from this stage's 1f1b op list (F0 F1 F2 B0 F3"),
    ("graph", _graph(lambda d: d["layers"][0].update(params=10**400)), "layers[0].params", "an integer of 401 digits"),
    ("graph", '{"format": "pipeplan.graph/1", "name": "a", "name": "b"}', "key 'name'", "appears twice"),
    ("cluster", "[" * 100_000 + "]" * 100_000, "file", "nested too deeply"),
    ("graph", _graph(lambda d: d.update(edges=[[0, 10**400]])), "edges[0][1]", "an integer of 401 digits"),
    ("plan", _plan(lambda d: d["stages"][2].update(layers=[6, 10**400])), "stages[2].layers[1]", "401 digits"),
    # values JSON admits that no field can hold, unknown fields included (json.dumps escapes the surrogates)
    ("graph", _graph(lambda d: d.update(name="\ud800")), "name", "unpaired UTF-16 surrogate (\\ud800)"),
    ("plan", _plan(lambda d: d.update(graph="g\udfff")), "graph", "unpaired UTF-16 surrogate (\\udfff)"),
    ("cluster", _cluster(lambda d: d.update(comment=[{"k\ud800": 1}])), "comment[0]", "a key holds an unpaired"),
    ("plan", '{"format": "pipeplan.plan/1", "comment": 1e999}', "comment", "beyond the float range"),
    ("graph", '{"format": "pipeplan.graph/1", "note": [-1e999]}', "note[0]", "beyond the float range"),
    ("cluster", '{"note": ' + "9" * 400 + '}', "note", "an integer of 400 digits is beyond the float range"),
    ("graph", json.dumps(_graph(lambda d: d["layers"][1].update(fwd=[0.5, 12345.5]))).replace("12345.5", "1e999"),
     "layers[1].fwd[1]", "beyond the float range"),
]


class TestBadInput:
    @pytest.mark.parametrize("which, content, where, what", BAD_INPUTS)
    def test_one_error_line_status_2_nothing_written(self, which, content, where, what, run_cli, tmp_path):
        files = {"graph": GRAPH, "cluster": CLUSTER, "plan": PLAN}
        bad = str(tmp_path / f"bad-{which}.json") if content is None else _write(tmp_path, f"bad-{which}.json", content)
        files[which] = bad
        out_dir = tmp_path / "out"
        out_dir.mkdir()
        status, out, err = run_cli("simulate", files["graph"], files["cluster"], files["plan"], "--json",
                                   "--trace", str(out_dir / "t.json"), "--gantt", str(out_dir / "g.png"))
        assert status == 2 and out == ""
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"error: {bad}: {where}: "), err
        assert what in err
        assert list(out_dir.iterdir()) == []

    @pytest.mark.parametrize("which, content, where, what", BAD_INPUTS)
    def test_validate_reports_the_same(self, which, content, where, what, run_cli, tmp_path):
        bad = str(tmp_path / "bad.json") if content is None else _write(tmp_path, "bad.json", content)
        files = {"graph": GRAPH, "cluster": CLUSTER, "plan": PLAN, which: bad}
        status, _, err = run_cli("validate", files["graph"], files["cluster"], files["plan"])
        assert status == 2 and err.startswith(f"error: {bad}: {where}: ") and what in err

    def test_usage_error_is_one_line(self, run_cli):
        status, _, err = run_cli("simulate", GRAPH)
        assert status == 2 and err.startswith("error: ") and err.count("\n") == 1

    def test_as_a_real_process(self, tmp_path):
        """The installed console script, end to end: no traceback on stderr."""
        env = dict(os.environ, PYTHONPATH=str(EXAMPLES.parent))
        proc = subprocess.run([sys.executable, "-m", "pipeplan", "simulate", GRAPH, CLUSTER, str(tmp_path / "none.json")],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr == f"error: {tmp_path / 'none.json'}: file: no such file\n"


class TestOneLineWhateverTheName:
    def test_control_characters_in_a_file_name_are_escaped(self, run_cli, tmp_path):
        name = str(tmp_path / "a\nb\x1b[31m.json")
        status, _, err = run_cli("validate", name)
        assert status == 2 and err.count("\n") == 1 and "\x1b" not in err
        assert err == "error: " + name.replace("\n", "\\n").replace("\x1b", "\\x1b") + ": file: no such file\n"

    def test_a_bad_name_in_a_plan_writes_nothing(self, run_cli, tmp_path):
        plan = _write(tmp_path, "p.json", _plan(lambda d: d.update(graph="\ud800")))
        out = tmp_path / "out"
        out.mkdir()
        status, _, err = run_cli("simulate", GRAPH, CLUSTER, plan, "--trace", str(out / "t.json"),
                                 "--gantt", str(out / "g.png"))
        assert status == 2 and err.startswith(f"error: {plan}: graph: the string holds an unpaired")
        assert list(out.iterdir()) == []


class TestOutputPaths:
    @pytest.mark.parametrize("argv", [
        ["simulate", GRAPH, CLUSTER, PLAN, "--trace", "{tmp}/t.json", "--gantt", "{tmp}/no/g.png"],
        ["plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "2", "--solver", "even", "-o", "{tmp}/no/p.json"],
        ["compare", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "2", "--solvers", "even",
         "--csv", "{tmp}/c.csv", "--best", "{tmp}/no/b.json"],
        ["profile", "gpt-tiny", "-o", "{tmp}/no/g.json"],
    ])
    def test_a_bad_output_folder_fails_first_and_writes_nothing(self, argv, run_cli, tmp_path):
        status, out, err = run_cli(*[a.replace("{tmp}", str(tmp_path)) for a in argv])
        assert status == 2 and err.startswith("error: ") and "output: folder" in err and "does not exist" in err
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("argv, role", [
        (["plan", "{g}", "{c}", "--batch", "8", "--microbatches", "2", "--solver", "even", "-o", "{g}"], "graph"),
        (["compare", "{g}", "{c}", "--batch", "8", "--microbatches", "2", "--solvers", "even", "--best", "{c}"],
         "cluster"),
        (["simulate", "{g}", "{c}", "{p}", "--trace", "{p}"], "plan"),
        (["pareto", "{g}", "{c}", "--batch", "8", "--microbatches", "2", "-o", "{g}"], "graph"),
    ])
    def test_an_output_onto_an_input_is_refused_and_the_input_kept(self, argv, role, run_cli, tmp_path):
        files = {}
        for key, source in (("g", GRAPH), ("c", CLUSTER), ("p", PLAN)):
            files[key] = tmp_path / Path(source).name
            files[key].write_bytes(Path(source).read_bytes())
        before = {key: path.read_bytes() for key, path in files.items()}
        status, _, err = run_cli(*[a.format(**{k: str(v) for k, v in files.items()}) for a in argv])
        assert status == 2 and f"output: is the {role} file" in err and err.count("\n") == 1
        assert {key: path.read_bytes() for key, path in files.items()} == before

    def test_a_trailing_slash_names_no_file(self, run_cli, tmp_path):
        status, _, err = run_cli("simulate", GRAPH, CLUSTER, PLAN, "--trace", f"{tmp_path}/t/")
        assert status == 2 and "ends in a slash" in err and list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("second", ["{tmp}/a.csv", "{tmp}/./sub/../a.csv"])
    def test_two_outputs_onto_one_file_are_refused(self, second, run_cli, tmp_path):
        # the plan JSON had replaced the CSV, silently
        (tmp_path / "sub").mkdir()
        status, _, err = run_cli("compare", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "2", "--solvers", "even",
                                 "--csv", f"{tmp_path}/a.csv", "--best", second.format(tmp=tmp_path))
        assert status == 2 and "is also the file of another output" in err and err.count("\n") == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]

    def test_a_file_as_the_folder_is_called_a_file(self, run_cli, tmp_path):
        (tmp_path / "g.json").write_text("{}")
        status, _, err = run_cli("plan", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "2", "--solver", "even",
                                 "-o", f"{tmp_path}/g.json/p.json")
        assert status == 2 and "'g.json' is a file, not a folder" in err.replace(str(tmp_path) + "/", "")


class TestSolverNames:
    def test_compare_blames_the_option_given(self, run_cli):
        status, _, err = run_cli("compare", GRAPH, CLUSTER, "--batch", "8", "--microbatches", "2",
                                 "--solvers", "even,foo")
        assert status == 2 and err.startswith("error: -: --solvers: unknown solver 'foo'; valid: even")


class TestOverflow:
    def test_a_plan_whose_time_overflows_is_refused_not_printed_as_infinity(self, run_cli, tmp_path):
        # g1 runs at 5e-324 of the reference speed: its ops take inf seconds, which is no JSON number
        cluster = _write(tmp_path, "c.json", _cluster(lambda d: d["devices"][1].update(speed=5e-324)))
        out = tmp_path / "out"
        out.mkdir()
        status, stdout, err = run_cli("simulate", GRAPH, cluster, PLAN, "--json", "--trace", str(out / "t.json"))
        assert status == 2 and stdout == "" and err.count("\n") == 1
        assert err.startswith(f"error: {PLAN}: plan: its simulated iteration time is inf")
        assert list(out.iterdir()) == []

    def test_planning_refuses_a_cluster_whose_times_overflow(self, run_cli, tmp_path):
        cluster = _write(tmp_path, "c.json", _cluster(lambda d: d["devices"][1].update(speed=5e-324)))
        status, _, err = run_cli("plan", GRAPH, cluster, "--batch", "8", "--microbatches", "2", "--solver", "even",
                                 "-o", str(tmp_path / "p.json"))
        assert status == 2 and err.startswith(f"error: {cluster}: devices and links: durations overflow floating point")
        assert err.count("\n") == 1 and not (tmp_path / "p.json").exists()


    @pytest.mark.parametrize("mutate", [lambda d: d["layers"][2].update(out=1e308),
                                        lambda d: d["layers"][2].update(fwd=[1e308, 0]),
                                        lambda d: d.update(input_bytes=1e308)])
    def test_planning_blames_a_graph_whose_own_times_overflow(self, run_cli, tmp_path, mutate):
        graph = _write(tmp_path, "g.json", _graph(mutate))
        status, _, err = run_cli("plan", graph, CLUSTER, "--batch", "8", "--microbatches", "2", "--solver", "even",
                                 "-o", str(tmp_path / "p.json"))
        assert status == 2 and err.startswith(f"error: {graph}: layers: durations overflow floating point even on")
        assert err.count("\n") == 1 and not (tmp_path / "p.json").exists()


class TestValidatePartners:
    def _renamed_graph(self, tmp_path, name):
        return _write(tmp_path, f"{name}.json", _graph(lambda d: d.update(name=name)))

    def test_among_several_graphs_the_plan_is_checked_against_its_own(self, run_cli, tmp_path):
        short = _write(tmp_path, "p.json", _plan(lambda d: d["stages"][2].update(layers=[6, 7])))
        status, _, err = run_cli("validate", self._renamed_graph(tmp_path, "other"), GRAPH, CLUSTER, short)
        assert status == 2 and err.startswith(f"error: {short}: stages[2].layers")

    def test_several_graphs_none_named_as_in_the_plan(self, run_cli, tmp_path):
        a, b = self._renamed_graph(tmp_path, "a"), self._renamed_graph(tmp_path, "a")
        status, out, err = run_cli("validate", a, b, CLUSTER, PLAN)
        assert status == 0 and "checked against the cluster" in out and "graph and" not in out
        assert err == (f"warning: {PLAN}: graph: the plan names graph 'chain8', which none of the graphs given "
                       f"('a') is; checked without a graph\n")

    def test_copies_of_the_plans_graph_are_each_checked(self, run_cli, tmp_path):
        copy = self._renamed_graph(tmp_path, "chain8")
        status, out, _ = run_cli("validate", GRAPH, copy, CLUSTER, PLAN)
        assert status == 0 and "checked against the graph and cluster" in out
        short = _write(tmp_path, "p.json", _plan(lambda d: d["stages"][2].update(layers=[6, 7])))
        status, _, err = run_cli("validate", GRAPH, copy, CLUSTER, short)
        assert status == 2 and err.startswith(f"error: {short}: stages[2].layers")

    def test_one_graph_of_another_name_is_used_with_a_warning(self, run_cli, tmp_path):
        status, out, err = run_cli("validate", self._renamed_graph(tmp_path, "other"), CLUSTER, PLAN)
        assert status == 0 and "checked against the graph and cluster" in out
        assert err == f"warning: {PLAN}: graph: plan was made for graph 'chain8', checking against 'other'\n"


def _free(d):
    """Every cost, size and latency zero: a plan takes no time at all."""
    for layer in d["layers"]:
        layer.update(fwd=[0, 0], bwd=[0, 0], params=0, act=0, out=0)
    d["input_bytes"] = 0


def _instant(d):
    """Links without latency."""
    for link in (*d["servers"], d["network"]):
        link["latency"] = 0


class TestZeroCost:
    def test_simulate_json_has_no_infinite_throughput(self, run_cli, tmp_path):
        graph, cluster = _write(tmp_path, "g.json", _graph(_free)), _write(tmp_path, "c.json", _cluster(_instant))
        status, out, err = run_cli("simulate", graph, cluster, PLAN, "--json")
        assert status == 0, err
        data = json.loads(out)
        assert data["iteration_time"] == 0.0 and data["throughput"] is None

    def test_every_solver_plans_it(self, run_cli, tmp_path):
        graph, cluster = _write(tmp_path, "g.json", _graph(_free)), _write(tmp_path, "c.json", _cluster(_instant))
        status, out, err = run_cli("compare", graph, cluster, "--batch", "8", "--microbatches", "2",
                                   "--time-limit", "2", "--json")
        assert status == 0, err
        rows = json.loads(out)
        assert all(r["iteration_time"] == 0.0 and r["throughput"] is None for r in rows)
        status, out, _ = run_cli("plan", graph, cluster, "--batch", "8", "--microbatches", "2", "--solver", "even",
                                 "-o", str(tmp_path / "p.json"))
        assert status == 0 and "throughput unbounded" in out

