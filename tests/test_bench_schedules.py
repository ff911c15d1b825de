"""experiments/bench_schedules.py: the layer-balanced plans it builds and the numbers it reports."""

from __future__ import annotations

import json

import pytest

from pipeplan.experiments import bench_schedules as bench
from pipeplan.experiments import bench_solvers as solvers_bench
from pipeplan.experiments.bench_solvers import chain_graph, two_type_cluster
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.evaluation.simulator import simulate

SHARES = bench.BlockShares(0.5, 0.25, 0.5, 1e12)


def uniform_case(groups: int) -> tuple[LayerGraph, Cluster]:
    """Equal layers (1 ms forward, 2 ms backward per sample, no parameters) on equal devices
    joined by links so fast that a transfer takes under 1e-20 s."""
    layers = [Layer(f"l{i}", (0.0, 1e-3), (0.0, 2e-3), params=0.0, act=1.0, out=1.0) for i in range(4)]
    devices = tuple(Device(f"d{g}", "s0", 1.0, 1e12) for g in range(groups))
    return LayerGraph.chain("uniform", layers), Cluster("flat", (Link(1e30, 0.0, "s0"),), Link(1e30, 0.0), devices)


class TestBalancedSplit:
    def test_larger_first(self):
        assert bench.balanced_split(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]

    def test_one_layer_each(self):
        assert bench.balanced_split(3, 3) == [(0, 1), (1, 2), (2, 3)]

    def test_too_many_stages(self):
        with pytest.raises(ValueError, match="8 stages need at least 8 layers, the graph has 4"):
            bench.balanced_split(4, 8)


class TestDeviceGroups:
    def test_consecutive(self):
        assert bench.device_groups(two_type_cluster(4), 2) == [("s0g0", "s0g1"), ("s1g0", "s1g1")]

    def test_unequal(self):
        with pytest.raises(ValueError, match="8 devices do not divide into 3 equal groups"):
            bench.device_groups(two_type_cluster(8), 3)


class TestGroupCounts:
    def test_d_and_duplicates(self):
        assert bench.group_counts("4,D", 4) == [4]
        assert bench.group_counts("4,D", 16) == [4, 16]

    def test_drops_what_does_not_divide(self):
        assert bench.group_counts("3,8,32", 16) == [8]


class TestV2ChainGraph:
    def test_fields_in_shares(self):
        base, graph = chain_graph(6), bench.v2_chain_graph(6, SHARES)
        assert graph.format == "pipeplan.graph/2"
        for old, new in zip(base.layers, graph.layers):
            assert new.bwd_w == (old.bwd[0] * 0.5, old.bwd[1] * 0.25)
            assert new.act_w == old.act * 0.5
            assert new.step == 7 * old.params / 1e12  # Adam moves 7 bytes per parameter byte
            assert (new.fwd, new.bwd, new.params, new.act, new.out) == (old.fwd, old.bwd, old.params, old.act, old.out)


class TestBlockShares:
    def test_shares_are_fractions(self):
        shares = bench.block_shares()
        assert 0 < shares.bwd_w_fixed <= 1 and 0 < shares.bwd_w_sample <= 1 and 0 < shares.act_w <= 1

    def test_needs_blocks(self):
        with pytest.raises(ValueError, match="no layer named block"):
            bench.block_shares("vgg-tiny")


class TestBuildPlan:
    def test_interleaved_groups(self):
        plan = bench.build_plan("interleaved-1f1b", 2, bench.v2_chain_graph(10, SHARES), two_type_cluster(4), 2)
        assert plan.stage_groups == [0, 1, 0, 1]
        assert [st.layers for st in plan.stages] == [(0, 3), (3, 6), (6, 8), (8, 10)]
        assert {st.microbatches for st in plan.stages} == {(8,) * 8}

    def test_zbv_v_shape(self):
        plan = bench.build_plan("zbv", 2, bench.v2_chain_graph(8, SHARES), two_type_cluster(8), 4)
        assert plan.stage_groups == [0, 1, 2, 3, 3, 2, 1, 0]
        assert plan.stages[0].devices == plan.stages[7].devices == ("s0g0", "s0g1")

    def test_v1_schedules_stay_v1(self):
        plan = bench.build_plan("1f1b", 1, bench.v2_chain_graph(8, SHARES), two_type_cluster(4), 4)
        assert plan.format == "pipeplan.plan/1" and plan.num_stages == 4


class TestMeasure:
    def test_gpipe_bubble_is_textbook(self):
        # 2 stages of 2 layers, 8 microbatches of 8: F = 16 ms, B = 32 ms; T = (m + S - 1)(F + B)
        graph, cluster = uniform_case(2)
        plan = bench.build_plan("gpipe", 1, graph, cluster, 2)
        row = bench.measure(plan, graph, cluster)
        assert row["iteration_time"] == pytest.approx(9 * 0.048, rel=1e-12)
        assert row["bubble_fraction"] == pytest.approx(1 / 9, rel=1e-9)
        assert (row["stages"], row["groups"], row["fits"]) == (2, 2, True)

    def test_interleaving_shrinks_the_bubble(self):
        graph, cluster = uniform_case(2)
        plain = bench.measure(bench.build_plan("1f1b", 1, graph, cluster, 2), graph, cluster)
        looped = bench.measure(bench.build_plan("interleaved-1f1b", 2, graph, cluster, 2), graph, cluster)
        assert looped["iteration_time"] < plain["iteration_time"]
        assert looped["bubble_fraction"] < plain["bubble_fraction"]


class TestBenchCase:
    def test_refusal_has_reason(self):
        row = bench.bench_case("interleaved-1f1b", 4, bench.v2_chain_graph(8, SHARES), two_type_cluster(4), 4)
        assert row["refused"] == "16 stages need at least 16 layers, the graph has 8"
        assert bench._cell(row) == "-"


class TestMain:
    """``--quick`` on a tiny case: every reported number is what simulate() gives the plan built."""

    def test_quick_tiny(self, tmp_path, capsys):
        out = tmp_path / "res"
        assert bench.main(["--quick", "--pairs", "8x4", "--groups", "2,D", "--out-dir", str(out)]) == 0
        record = json.loads((out / "schedules.json").read_text())
        table = (out / "schedules.md").read_text()
        assert capsys.readouterr().out == table
        assert [(r["layers"], r["devices"], r["groups"]) for r in record["results"]] == [(8, 4, 2), (8, 4, 4)]
        shares = bench.BlockShares(**record["shares"])
        graph, cluster = bench.v2_chain_graph(8, shares), two_type_cluster(4)
        rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in table.splitlines()[2:9]}
        for col, res in enumerate(record["results"]):
            for (schedule, v), row in zip(bench.CASES, res["cases"]):
                cell = rows[bench.case_name(schedule, v)][col].rstrip(" |")
                try:
                    plan = bench.build_plan(schedule, v, graph, cluster, res["groups"])
                except ValueError as err:
                    assert row["refused"] == str(err) and cell == "-"
                    continue
                result = simulate(plan, graph, cluster)
                assert row["iteration_time"] == result.iteration_time
                assert row["bubble_fraction"] == result.bubble_fraction
                assert row["peak_memory"] == max(result.peak_memory)
                assert cell.startswith(f"{1e3 * result.iteration_time:.1f} ms / "
                                       f"{100 * result.bubble_fraction:.1f} % / "
                                       f"{max(result.peak_memory) / 1e9:.2f} GB")
        assert (out / "schedules.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def test_rerun_writes_the_same_files(self, tmp_path):
        for name in ("a", "b"):
            bench.main(["--pairs", "8x4", "--groups", "2", "--out-dir", str(tmp_path / name)])
        for suffix in ("json", "md", "png"):
            assert (tmp_path / "a" / f"schedules.{suffix}").read_bytes() == \
                   (tmp_path / "b" / f"schedules.{suffix}").read_bytes()

    def test_bad_pair(self, capsys):
        with pytest.raises(SystemExit) as stop:
            bench.main(["--pairs", "8x5"])
        assert stop.value.code == 2
        assert capsys.readouterr().err == "error: --pairs: 8x5: devices must be one of 4, 8, 16, 32, 64\n"


class TestParseSchedules:
    def test_defaults_and_virtual(self):
        assert solvers_bench.parse_schedules("gpipe,interleaved-1f1b:4,zbv,looped-bfs") == [
            ("gpipe", 1), ("interleaved-1f1b", 4), ("zbv", 2), ("looped-bfs", 2)]

    def test_refuses_v_on_a_fixed_schedule(self, capsys):
        with pytest.raises(SystemExit) as stop:
            solvers_bench.parse_schedules("1f1b:2")
        assert stop.value.code == 2
        assert capsys.readouterr().err.startswith("error: --schedules: 1f1b:2: give one of")


class TestParseSolvers:
    def test_names_in_order(self):
        assert solvers_bench.parse_solvers("ilp, cpsat") == ("ilp", "cpsat")

    def test_refuses_an_unknown_name(self, capsys):
        with pytest.raises(SystemExit) as stop:
            solvers_bench.parse_solvers("ilp,lip")
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --solvers: lip: no such solver; give any of ") and err.count("\n") == 1

    def test_only_with_the_version2_row(self, capsys):
        with pytest.raises(SystemExit) as stop:
            solvers_bench.main(["--solvers", "ilp", "--quick"])
        assert stop.value.code == 2
        assert capsys.readouterr().err == "error: --solvers: only the version-2 row takes it; add --version2 LxD\n"


class TestBestAndGap:
    def test_largest_bound_and_tie_to_the_proved(self):
        rows = {"a": {"iteration_time": 2.0, "status": "feasible"},
                "b": {"iteration_time": 2.0, "status": "optimal", "lower_bound": 1.5},
                "c": {"iteration_time": 3.0, "lower_bound": 1.0}, "d": {"refused": "no"}}
        assert solvers_bench.best_and_gap(rows) == {"best": 2.0, "solver": "b", "lower_bound": 1.5, "gap": 0.25}

    def test_nothing_found(self):
        assert solvers_bench.best_and_gap({"a": {"refused": "no"}})["best"] is None


class TestBenchSchedule:
    def test_gpipe_column_is_the_solvers_best(self):
        col = solvers_bench.bench_schedule(16, 4, "gpipe", 1, 10.0, 2.0, solvers=("even", "ilp"))
        rows = col["solvers"]
        assert rows["ilp"]["status"] == "optimal"
        assert col["best"] == min(rows["even"]["iteration_time"], rows["ilp"]["iteration_time"])
        assert col["gap"] == pytest.approx((col["best"] - rows["ilp"]["lower_bound"]) / col["best"], abs=1e-12)
        assert solvers_bench.schedule_markdown([{"layers": 16, "devices": 4, "servers": 2, "schedules": [col]}]) \
            .splitlines()[2] == f"| 16 x 4 (2) | {1e3 * col['best']:.1f} ms ({col['solver']}) / " \
                                f"{100 * col['gap']:.2f} % |"


class TestSchedulesTable:
    def test_rows_median_and_refusals(self):
        from pipeplan.experiments import bench_runtime

        rows = [{"plan": "sched zbv", "stages": 4, "groups": 2, "measured": 0.010, "predicted": 0.0125, "error": -0.2,
                 "calibrated_error": 0.02},
                {"plan": "sched 1f1b", "stages": 2, "groups": 2, "measured": 0.012, "predicted": 0.010, "error": 0.2,
                 "calibrated_error": -0.04},
                {"plan": "sched gpipe", "stages": 1, "groups": 1, "measured": 0.011, "predicted": 0.010, "error": 0.1,
                 "calibrated_error": 0.0}]
        lines = bench_runtime.schedules_table(rows, {"sched looped-bfs v=2": "error: no"}).splitlines()
        assert lines[2] == "| zbv | 4 / 2 | 10.00 ms | 12.50 ms | -20.0 % | +2.0 % |"
        assert lines[5] == "| median over 3 plans | | | | 20.0 % | 2.0 % |"
        assert lines[-1] == "- looped-bfs v=2: not planned: error: no"


class TestVersion2Row:
    """``bench_solvers --version2``: the version-2 row (issue 37) on a tiny pair, one solver, short limits."""

    def test_row_and_table(self, monkeypatch):
        monkeypatch.setitem(solvers_bench.SERVERS, 2, 1)
        monkeypatch.setattr(solvers_bench, "SCHEDULE_CASES", (("1f1b", 1), ("looped-bfs", 2)))
        row = solvers_bench.version2_row(4, 2, 5.0, solvers=("group-search",))
        assert [c["name"] for c in row["cases"]] == ["looped-bfs v=2"]
        case = row["cases"][0]
        assert case["best"] is not None and row["version1"]["best"] is not None
        assert case["beats_v1"] == (case["best"] <= row["version1"]["best"] * (1 + 1e-12))
        table = solvers_bench.version2_markdown(row).splitlines()
        assert len(table) == 3 and table[2].startswith("| looped-bfs v=2 |")


    def test_a_cell_says_what_proved_it(self):
        proved = {"iteration_time": 0.2, "lower_bound": 0.2, "gap": 0.0, "status": "optimal",
                  "bound_by": "virtual-bnb", "details": {}}
        modelled = dict(proved, details={"model_groups": "R=1:target R=2:model", "model_complete": True})
        unproved = dict(proved, status="feasible", lower_bound=0.1, gap=0.5)
        row = {"version1": {"best": 0.3}, "cases": [
            {"name": f"zbv {i}", "best": 0.2, "gap": 0.0, "beats_v1": True, "solvers": {"ilp": cell}}
            for i, cell in enumerate((proved, modelled, unproved))]}
        table = solvers_bench.version2_markdown(row).splitlines()[2:]
        assert "(virtual-bnb; the search proved it)" in table[0]
        assert "(virtual-bnb; R 2 by the model, R 1 by target LPs, all)" in table[1]
        assert "(virtual-bnb; no model)" in table[2]


class TestModelSummary:
    def test_spans(self):
        d = {"model_groups": "R=1:model R=2:model R=3:target R=4:model", "model_complete": True}
        assert solvers_bench.model_summary(d) == "R 1,2,4 by the model, R 3 by target LPs, all"

    def test_without_a_model(self):
        assert solvers_bench.model_summary({}) == "no model"
