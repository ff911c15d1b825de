"""Calibrating device speeds from measured probe runs (``pipeplan.runtime.calibrate``, ``pipeplan calibrate``).

The unit tests use the hand-timed graphs of ``conftest`` (F = n, B = 2n seconds for n
samples, instantaneous links), so every factor is worked out by hand; the command
runs a real two-process probe of ``gpt-tiny``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from conftest import chain, cluster, make_layer, plan
from pipeplan.models.graph import LayerGraph
from pipeplan.models.jsonio import dumps
from pipeplan.runtime.calibrate import calibrated_cluster, charged_seconds, device_factors, run_factors
from pipeplan.solver.formats.cluster import Cluster, load_cluster
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.cmd_calibrate import _notes
from helpers import RUN_CLUSTER as CLUSTER, model_graph, rank, write_plan


def two_stage_ranks():
    """Stage 0 runs F in 1.5 and B in 3 (9 s against 6 charged); stage 1 as charged plus 0.5 s per send."""
    return [rank(0, [[("F0", 1.5), ("F1", 1.5), ("B0", 3), ("B1", 3)]]),
            rank(1, [[("F0", 1), ("F1", 1), ("B0", 2), ("send G0", 0.5), ("B1", 2), ("send G1", 0.5)]])]


def two_stage_plan():
    """Two stages of one layer each on d0 and d1, GPipe, 2 microbatches of 1 (F = 1, B = 2 each)."""
    return plan([(0, 1, ["d0"], [1, 1]), (1, 2, ["d1"], [1, 1])], batch=2)


def ranked(records: list[dict], replicas: list[int]) -> list[dict]:
    """``records`` with their replica index, as the runtime reports them."""
    return [{**r, "replica": j} for r, j in zip(records, replicas)]


class TestChargedSeconds:
    def test_forward_and_backward_of_the_replicas_own_share(self):
        p = plan([(0, 2, ["d0", "d1"], [3, 1])], batch=4)  # shares: d0 2 and 1, d1 1 and none
        # Two layers: F = 2q, B = 4q for q samples; d1 runs only microbatch 0.
        assert charged_seconds(p, chain(2), 0, 0) == pytest.approx(6 * 2 + 6 * 1)
        assert charged_seconds(p, chain(2), 0, 1) == pytest.approx(6 * 1)

    def test_recompute_charges_the_forward_again(self):
        p = plan([(0, 1, ["d0"], [2], True)], batch=2)
        assert charged_seconds(p, chain(1), 0, 0) == pytest.approx(2 + 4 + 2)

    def test_fixed_part_of_each_op(self):
        p = plan([(0, 1, ["d0"], [2, 2])], batch=4)
        graph = chain(1, fwd=(0.5, 1.0), bwd=(0.25, 2.0))
        assert charged_seconds(p, graph, 0, 0) == pytest.approx(2 * (0.5 + 2 + 0.25 + 4))


class TestRunFactors:
    def test_measured_over_charged_seconds_of_each_device(self):
        got = run_factors(ranked(two_stage_ranks(), [0, 0]), [0], two_stage_plan(), chain(2), cluster(2))
        assert got == pytest.approx({"d0": 9 / 6, "d1": 7 / 6})

    def test_charged_at_the_devices_own_speed(self):
        # d1 is declared at speed 0.5: its ops are charged 12 s, and took 7.
        got = run_factors(ranked(two_stage_ranks(), [0, 0]), [0], two_stage_plan(), chain(2),
                          cluster(2, speed=[1.0, 0.5]))
        assert got == pytest.approx({"d0": 9 / 6, "d1": 7 / 12})

    def test_each_replica_against_its_own_share(self):
        p = plan([(0, 2, ["d0", "d1"], [2, 1])], batch=3)  # d0: 1 and 1 sample, d1: 1 and none
        ranks = ranked([rank(0, [[("F0", 1), ("F1", 1), ("B0", 2), ("B1", 2)]]),
                        rank(0, [[("F0", 3), ("B0", 1)]])], [0, 1])
        got = run_factors(ranks, [0], p, chain(2), cluster(2))
        assert got == pytest.approx({"d0": 6 / 12, "d1": 4 / 6})

    def test_recompute_counts_on_both_sides(self):
        p = plan([(0, 1, ["d0"], [1], True)], batch=1)  # charged F 1 + R 1 + B 2
        ranks = ranked([rank(0, [[("F0", 1), ("R0", 2), ("B0", 3)]])], [0])
        assert run_factors(ranks, [0], p, chain(1), cluster(1)) == pytest.approx({"d0": 6 / 4})

    def test_a_device_that_ran_nothing_has_no_factor(self):
        p = plan([(0, 2, ["d0", "d1"], [1])], batch=1)  # d1's share is empty
        ranks = ranked([rank(0, [[("F0", 2), ("B0", 4)]]), rank(0, [[]])], [0, 1])
        assert run_factors(ranks, [0], p, chain(2), cluster(2)) == pytest.approx({"d0": 1.0})


class TestDeviceFactors:
    def test_median_over_the_runs_that_measured_the_device(self):
        got = device_factors([{"d0": 1.0, "d1": 2.0}, {"d0": 1.1}, {"d0": 5.0, "d1": 4.0}])
        assert got == pytest.approx({"d0": 1.1, "d1": 3.0})


class TestCalibratedCluster:
    def test_speeds_divided_by_the_factors_and_the_rest_unchanged(self):
        c = cluster(3, speed=[1.0, 0.5, 2.0])
        got = calibrated_cluster(c, {"d0": 1.25, "d1": 0.5}, {"graph": "g"})
        assert [d.speed for d in got.devices] == pytest.approx([0.8, 1.0, 2.0])
        assert (got.name, got.servers, got.network) == (c.name, c.servers, c.network)
        assert [d.memory for d in got.devices] == [d.memory for d in c.devices]
        record = got.extra["calibration"]
        assert record["graph"] == "g" and record["factors"] == {"d0": 1.25, "d1": 0.5}
        assert record["speeds_before"] == {"d0": 1.0, "d1": 0.5} and record["not_calibrated"] == ["d2"]

    def test_replicas_declared_at_other_speeds_get_the_speed_they_ran_at(self):
        """Both replicas ran their equal shares 1.1x slower than the profile: both ran at 1 / 1.1."""
        p = plan([(0, 1, ["d0", "d1"], [2])], batch=2)
        ranks = ranked([rank(0, [[("F0", 1.1), ("B0", 2.2)]]), rank(0, [[("F0", 1.1), ("B0", 2.2)]])], [0, 1])
        c = cluster(2, speed=[1.0, 0.5])
        got = calibrated_cluster(c, device_factors([run_factors(ranks, [0], p, chain(1), c)]), {})
        assert [d.speed for d in got.devices] == pytest.approx([1 / 1.1, 1 / 1.1])

    def test_the_calibrated_prediction_charges_the_measured_op_times(self):
        factors = device_factors([run_factors(ranked(two_stage_ranks(), [0, 0]), [0], two_stage_plan(), chain(2),
                                              cluster(2))])
        again = simulate(two_stage_plan(), chain(2), calibrated_cluster(cluster(2), factors, {}))
        assert [sum(g.durations) for g in again.groups] == pytest.approx([9, 7])

    def test_calibrating_again_with_the_same_times_changes_nothing_and_keeps_history(self):
        ranks = ranked(two_stage_ranks(), [0, 0])
        once = calibrated_cluster(cluster(2), device_factors([run_factors(ranks, [0], two_stage_plan(), chain(2),
                                                                          cluster(2))]), {"n": 1})
        factors = device_factors([run_factors(ranks, [0], two_stage_plan(), chain(2), once)])
        twice = calibrated_cluster(once, factors, {"n": 2})
        thrice = calibrated_cluster(twice, factors, {"n": 3})
        assert factors == pytest.approx({"d0": 1.0, "d1": 1.0})
        assert [d.speed for d in thrice.devices] == pytest.approx([d.speed for d in once.devices])
        assert [r["n"] for r in thrice.extra["calibration"]["previous"]] == [1, 2]  # flat, oldest first

    @pytest.mark.parametrize("earlier, kept", [
        ("a note", ["a note"]),
        ([1, 2], [[1, 2]]),
        ({"previous": 5, "factors": {"d1": 1.5}}, [5, {"factors": {"d1": 1.5}}]),
        ({"previous": [1, "x"], "factors": 3}, [1, "x", {"factors": 3}]),
    ])
    def test_an_odd_earlier_calibration_field_is_kept_not_dropped(self, earlier, kept):
        c = cluster(2)
        got = calibrated_cluster(Cluster(c.name, c.servers, c.network, c.devices, {"calibration": earlier}),
                                 {"d0": 1.1}, {})
        assert got.extra["calibration"]["previous"] == kept
        calibrated_before = isinstance(earlier, dict) and isinstance(earlier.get("factors"), dict)
        assert got.extra["calibration"]["not_calibrated"] == ([] if calibrated_before else ["d1"])

    def test_round_trip_through_json_keeps_speeds_and_record(self):
        got = calibrated_cluster(cluster(2), {"d1": 1.5}, {"model": "gpt-tiny"})
        back = Cluster.from_dict(json.loads(dumps(got.to_dict())))
        assert [d.speed for d in back.devices] == pytest.approx([1.0, 1 / 1.5])
        assert back.extra["calibration"]["model"] == "gpt-tiny"

    @pytest.mark.parametrize("factor", [0.0, -1.0, float("inf"), float("nan")])
    def test_refuses_a_factor_that_is_not_finite_and_positive(self, factor):
        with pytest.raises(ValueError, match="calibration factor"):
            calibrated_cluster(cluster(2), {"d0": factor}, {})

    @pytest.mark.parametrize("speed, factor", [(5e-324, 2.0), (1e308, 0.5)])
    def test_refuses_a_speed_that_would_underflow_or_overflow(self, speed, factor):
        with pytest.raises(ValueError, match="gives speed"):
            calibrated_cluster(cluster(1, speed=speed), {"d0": factor}, {})

    def test_refuses_a_device_the_cluster_does_not_have(self):
        with pytest.raises(ValueError, match="'x9' has a calibration factor but is not in cluster"):
            calibrated_cluster(cluster(1), {"x9": 1.0}, {})

    def test_devices_calibrated_by_an_earlier_probe_are_not_listed_as_uncalibrated(self):
        first = calibrated_cluster(cluster(4), {"d0": 1.1, "d1": 1.2}, {"n": 1})
        second = calibrated_cluster(first, {"d2": 1.3}, {"n": 2})
        assert first.extra["calibration"]["not_calibrated"] == ["d2", "d3"]
        assert second.extra["calibration"]["not_calibrated"] == ["d3"]
        assert [d.speed for d in second.devices] == pytest.approx([1 / 1.1, 1 / 1.2, 1 / 1.3, 1.0])


class TestCalibrateCommand:
    @pytest.fixture
    def probe(self, tmp_path) -> tuple[str, str]:
        graph = tmp_path / "gpt-tiny.graph.json"
        graph.write_text(dumps(model_graph("gpt-tiny").to_dict()))
        # A replicated first stage whose second microbatch (1 sample) leaves g1 without work.
        return str(graph), write_plan(tmp_path, [(0, 3, ["g0", "g1"], [3, 1]), (3, 6, ["g2"], [2, 2])], 4, "1f1b")

    def test_writes_the_cluster_with_the_probe_devices_calibrated(self, probe, tmp_path, run_cli):
        """Three processes: g0 and g1 (declared speed 1) replicate stage 0, g2 (0.45) runs stage 1."""
        graph, plan_file = probe
        out = tmp_path / "calibrated.json"
        status, stdout, stderr = run_cli("calibrate", graph, CLUSTER, plan_file, "--model", "gpt-tiny", "--runs", "2",
                                         "--steps", "3", "--warmup", "1", "--json", "-o", str(out))
        assert status == 0, stderr
        summary = json.loads(stdout)
        before, after = load_cluster(CLUSTER), load_cluster(str(out))
        assert set(summary["factors"]) == {"g0", "g1", "g2"} and len(summary["run_factors"]) == 2
        assert summary["not_calibrated"] == ["g3", "g4", "g5"]
        assert "warning:" in stderr and "g3, g4, g5" in stderr  # they keep the file's speeds
        for device, factor in summary["factors"].items():  # each the median of its runs
            assert factor == pytest.approx(statistics.median(run[device] for run in summary["run_factors"]))
        for b, a in zip(before.devices, after.devices):
            expected = b.speed / summary["factors"][b.id] if b.id in summary["factors"] else b.speed
            assert a.speed == pytest.approx(expected) and a.memory == b.memory
        record = after.extra["calibration"]
        assert record["model"] == "gpt-tiny" and record["runs"] == 2 and record["transport"] == "tcp"
        assert record["not_calibrated"] == ["g3", "g4", "g5"]
        assert summary["predicted_after"] > 0 and summary["measured_iteration_time"] > 0
        # the calibrated cluster is an ordinary cluster: the plan simulates on it
        assert run_cli("simulate", graph, str(out), plan_file, "--json")[0] == 0

    @pytest.mark.parametrize("option, value, message", [("--runs", "0", "--runs: must be at least 1"),
                                                        ("--steps", "0", "--steps: must be at least 1")])
    def test_bad_option_is_refused_and_nothing_written(self, probe, tmp_path, run_cli, option, value, message):
        graph, plan_file = probe
        out = tmp_path / "calibrated.json"
        status, _, err = run_cli("calibrate", graph, CLUSTER, plan_file, "--model", "gpt-tiny", option, value,
                                 "-o", str(out))
        assert status == 2 and message in err and err.startswith("error: ") and not out.exists()

    @pytest.mark.parametrize("which", [0, 1])
    def test_output_onto_the_graph_or_plan_is_refused(self, probe, run_cli, which):
        before = Path(probe[which]).read_bytes()
        status, _, err = run_cli("calibrate", *probe[:1], CLUSTER, probe[1], "--model", "gpt-tiny", "-o", probe[which])
        assert status == 2 and "output: is the" in err and err.count("\n") == 1
        assert Path(probe[which]).read_bytes() == before

    def test_plan_for_another_model_is_refused_before_any_process(self, probe, tmp_path, run_cli):
        graph, plan_file = probe
        out = tmp_path / "calibrated.json"
        status, _, err = run_cli("calibrate", graph, CLUSTER, plan_file, "--model", "unet", "-o", str(out))
        assert status == 2 and err.count("\n") == 1 and "Traceback" not in err and not out.exists()

    def test_a_failed_probe_run_writes_nothing(self, probe, tmp_path, run_cli, monkeypatch):
        graph, plan_file = probe
        out = tmp_path / "calibrated.json"
        monkeypatch.setenv("PIPEPLAN_FAULT", "1:1:raise")
        status, _, err = run_cli("calibrate", graph, CLUSTER, plan_file, "--model", "gpt-tiny", "--steps", "2",
                                 "-o", str(out))
        assert status == 1 and "rank 1" in err and "injected fault" in err
        assert not out.exists()


class TestRunOnCalibratedCluster:
    def test_emulating_a_calibrated_cluster_warns(self, tmp_path, run_cli):
        graph = tmp_path / "gpt-tiny.graph.json"
        graph.write_text(dumps(model_graph("gpt-tiny").to_dict()))
        plan_file = write_plan(tmp_path, [(0, 3, ["g0"], [2]), (3, 6, ["g1"], [2])], 2)
        calibrated = tmp_path / "calibrated.json"
        calibrated.write_text(dumps(calibrated_cluster(load_cluster(CLUSTER), {"g0": 1.1, "g1": 1.2}, {}).to_dict()))
        status, _, err = run_cli("run", str(graph), str(calibrated), plan_file, "--model", "gpt-tiny", "--steps", "1",
                                 "--emulate", "--json")
        assert status == 0, err
        assert "warning:" in err and "calibrat" in err and "Traceback" not in err


@st.composite
def probes(draw):
    """A random plan of one device per stage (unequal per-stage splits, recompute, fixed op parts,
    any speeds), and each device's true slowdown."""
    count = draw(st.integers(1, 5))
    times = st.tuples(st.floats(0.0, 1.0), st.floats(0.1, 2.0))
    graph = LayerGraph.chain("g", [make_layer(i, fwd=draw(times), bwd=draw(times)) for i in range(count)])
    stages = draw(st.integers(1, min(3, count)))
    inner = st.integers(1, max(count - 1, 1))
    cuts = sorted(draw(st.sets(inner, min_size=stages - 1, max_size=stages - 1)))
    bounds = list(zip([0, *cuts], [*cuts, count]))
    batch = draw(st.integers(1, 8))

    def split() -> list[int]:
        marks = sorted(draw(st.sets(st.integers(1, batch - 1), max_size=3))) if batch > 1 else []
        return [b - a for a, b in zip([0, *marks], [*marks, batch])]

    p = plan([(lo, hi, [f"d{s}"], split(), draw(st.booleans())) for s, (lo, hi) in enumerate(bounds)], batch=batch)
    speeds = [draw(st.floats(0.25, 4.0)) for _ in bounds]
    slowdowns = [draw(st.floats(0.5, 3.0)) for _ in bounds]
    return graph, p, cluster(len(bounds), speed=speeds), slowdowns


class TestCalibrationProperty:
    @settings(max_examples=200, deadline=None)
    @given(probes())
    def test_recovers_each_slowdown_and_the_simulator_then_charges_what_was_measured(self, probe):
        """Ops that took ``slowdown`` times the spec's charge, spread over the op labels as a run
        records them: calibration finds each slowdown, and the calibrated simulation's stage
        times are the measured ones (which ties ``charged_seconds`` to the simulator's costs)."""
        graph, p, c, slowdowns = probe
        prediction = simulate(p, graph, c)
        ranks = []
        for s, (cost, slowdown) in enumerate(zip(prediction.groups, slowdowns)):  # a group per stage
            spans = []
            for (_, kind, k), seconds, rec in zip(cost.program, cost.durations, cost.recompute):
                if kind == "F":
                    spans += [(f"F{k}", 0.75 * seconds * slowdown), (f"send A{k}", 0.25 * seconds * slowdown)]
                else:
                    spans += [(f"R{k}", rec * slowdown), (f"B{k}", (seconds - rec) * slowdown)]
            ranks.append({**rank(s, [spans]), "replica": 0})
        factors = device_factors([run_factors(ranks, [0], p, graph, c)])
        assert factors == pytest.approx({f"d{s}": f for s, f in enumerate(slowdowns)}, rel=1e-9)
        again = simulate(p, graph, calibrated_cluster(c, factors, {}))
        measured = [slowdown * sum(cost.durations) for cost, slowdown in zip(prediction.groups, slowdowns)]
        assert [sum(g.durations) for g in again.groups] == pytest.approx(measured, rel=1e-9)


class TestNotes:
    def summary(self, **kw) -> dict:
        return {"cluster": "out.json", "factors": {"g0": 1.1}, "not_calibrated": [],
                "measured_iteration_time": 1.0, "predicted_after": 1.0, **kw}

    def test_nothing_to_say(self):
        assert _notes(self.summary()) == []

    def test_a_factor_far_from_one_is_named(self):
        notes = _notes(self.summary(factors={"g0": 1.1, "g5": 31.4, "g2": 0.4}))
        assert len(notes) == 1 and "g5 31.4" in notes[0] and "g2 0.4" in notes[0] and "g0" not in notes[0]

    def test_uncalibrated_devices_and_a_probe_far_off_its_prediction(self):
        notes = _notes(self.summary(not_calibrated=["g3", "g4"], measured_iteration_time=1.5))
        assert [n.split(":")[0] for n in notes] == ["warning", "note"] and "g3, g4" in notes[0]
        assert "+50.0 %" in notes[1]
