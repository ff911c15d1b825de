"""``pipeplan reproduce``'s measured cases: plans trained by the runtime, set beside their predictions.

The runs are small (two worker processes, gpt-tiny, two steps) and bounded by the
launcher's hang timeout (:data:`RUNS`), so a stuck worker fails the test within
seconds instead of hanging the suite.
"""

from __future__ import annotations

import pytest

from pipeplan.experiments.claims.common import Section
from pipeplan.experiments.claims.runs import (LOOPBACK, Measured, RunSettings, cpu_cluster, measure_plans,
                                              profiled, ratios, record, table_rows)
from pipeplan.models.errors import InputError
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.models.zoo import build_model
from pipeplan.solver.formats.cluster import Link
from pipeplan.solver.formats.plan import Plan, Stage

RUNS = RunSettings(steps=2, warmup=1, repeats=2, timeout=20.0)


def gpt_tiny_graph() -> LayerGraph:
    """gpt-tiny's units as layers, with made-up costs (what the runtime checks is names, edges and ties)."""
    model = build_model("gpt-tiny", device="meta")
    layers = [Layer(u.name, (1e-4, 1e-5), (2e-4, 2e-5), 4.0 * sum(p.numel() for p in u.module.parameters()),
                    2048.0, 2048.0, u.tied_to) for u in model.units]
    return LayerGraph("gpt-tiny-6", layers, model.edges(), 128.0)


def two_stage(split=(4, 4), cut: int = 3) -> Plan:
    return Plan("gpt-tiny-6", "cpu-2", sum(split), 4.0, "gpipe",
                (Stage((0, cut), ("c0",), tuple(split)), Stage((cut, 6), ("c1",), tuple(split))))


class TestCpuCluster:
    def test_one_loopback_server(self):
        c = cpu_cluster("pair", [1.0, 0.5])
        assert [(d.id, d.server, d.speed) for d in c.devices] == [("c0", "local", 1.0), ("c1", "local", 0.5)]
        assert c.bw(("c0",), ("c1",)) == LOOPBACK.bandwidth and c.lat(("c0",), ("c1",)) == LOOPBACK.latency

    def test_devices_dealt_over_servers_in_order(self):
        c = cpu_cluster("two", [0.1, 0.1, 0.2, 0.2], servers=(("a", Link(1e8, 1e-4)), ("b", Link(2e9, 0.0))),
                        network=Link(5e7, 3e-4))
        assert [d.server for d in c.devices] == ["a", "a", "b", "b"]
        assert c.bw(("c0",), ("c1",)) == 1e8 and c.bw(("c2",), ("c3",)) == 2e9
        assert c.bw(("c1",), ("c2",)) == 5e7 and c.lat(("c1",), ("c2",)) == 3e-4


class TestProfiled:
    def test_measured_here_at_the_sizes_asked(self):
        g = profiled("gpt-tiny", (1, 2))
        assert [l.name for l in g.layers] == [u.name for u in build_model("gpt-tiny", device="meta").units]
        assert g.extra["profile"]["measure"]["batch_sizes"] == [1, 2]
        assert g.extra["profile"]["measure"]["rounds"] == 3


class TestRunSettings:
    def test_describe_records_its_numbers(self):
        sec = Section("x", "X")
        assert RUNS.describe(sec) == "2 steps (1 warm-up), median of 2 runs per plan"
        assert sec.shown == [2, 1, 2]


class TestMeasured:
    def test_median_and_peak(self):
        m = Measured(2, 0.1, 5.0, runs=[0.3, 0.1, 0.2], peaks=[4.0, 6.0, 5.0])
        assert m.measured == 0.2 and m.peak == 6.0
        assert Measured(2, 0.1, 5.0).measured is None and Measured(2, 0.1, 5.0).peak is None


class TestRatios:
    def test_hand_computed(self):
        m = {"slow": Measured(2, 0.3, 0.0, runs=[0.8]), "fast": Measured(2, 0.2, 0.0, runs=[0.5])}
        sim, meas = ratios(m, "slow", "fast")
        assert sim == pytest.approx(1.5) and meas == pytest.approx(1.6)

    def test_missing_plan_or_failed_runs(self):
        m = {"a": Measured(2, 0.3, 0.0, runs=[0.6]), "b": Measured(2, 0.2, 0.0)}
        assert ratios(m, "a", "nope") == (None, None)
        assert ratios(m, "a", "b") == (pytest.approx(1.5), None)


class TestTableRows:
    def test_cells_and_recorded_numbers(self):
        sec = Section("x", "X")
        rows = table_rows(sec, {"p": two_stage((6, 2))}, {"p": Measured(2, 0.01, 1.0, runs=[0.02, 0.025])},
                          RunSettings(4, 1, 2))
        assert rows == [["p", "0-2@c0 | 3-5@c1", "6+2", "2", "10.000", "22.500", "2.25×", "2 of 2", "25.0 %"]]
        assert {6, 2, 10.0, 22.5, 2.25, 25.0} <= set(sec.shown)

    def test_failed_plan_shows_na(self):
        rows = table_rows(Section("x", "X"), {"p": two_stage()}, {"p": Measured(2, 0.01, 1.0, errors=["hung"])},
                          RunSettings(4, 1, 1))
        assert rows[0][5:] == ["n/a", "n/a", "0 of 1", "n/a"]


class TestRecord:
    def test_data_table_and_method(self):
        sec = Section("x", "X")
        record(sec, "measured", {"p": two_stage()}, {"p": Measured(2, 0.01, 1.0, runs=[0.02])}, RUNS, "cond")
        assert sec.data["measured"]["plans"]["p"]["measured"] == 0.02
        assert sec.data["measured"]["plans"]["p"]["mapping"] == "0-2@c0 | 3-5@c1"
        assert sec.tables[0][0] == "Measured by the runtime: cond" and "pipeplan run" in sec.measured_method


@pytest.fixture(scope="module")
def setup():
    return gpt_tiny_graph(), cpu_cluster("cpu-2", [1.0, 1.0])


class TestMeasurePlans:
    # Plans run beside their predictions: tests/test_reproduce.py, on the quick report's runs.

    def test_emulated_op_longer_than_the_timeout_is_refused(self, setup):
        graph, _ = setup
        # A backward op of 0.28 ms (4 samples) at speed 1e-5 would last 28 s, beyond the 20 s
        # timeout: refused before any process starts.
        slow = cpu_cluster("cpu-2", [1.0, 1e-5])
        with pytest.raises(InputError, match="--emulate: an emulated op would last"):
            measure_plans({"p": two_stage()}, graph, slow, "gpt-tiny", RUNS, emulate=True)

    def test_failed_worker_is_recorded_not_raised(self, setup, monkeypatch):
        graph, cluster = setup
        monkeypatch.setenv("PIPEPLAN_FAULT", "1:0:raise")
        # two repeats: each run's failure is recorded, and the next run still starts
        out = measure_plans({"p": two_stage()}, graph, cluster, "gpt-tiny", RunSettings(2, 1, 2, 20.0))
        assert out["p"].runs == [] and out["p"].measured is None
        assert len(out["p"].errors) == 2 and all("rank 1" in e for e in out["p"].errors)

    def test_model_that_is_not_the_graph_is_refused(self, setup):
        graph, cluster = setup
        with pytest.raises(InputError, match="units"):
            measure_plans({"p": two_stage()}, graph, cluster, "unet", RUNS)
