"""``pipeplan cluster``, ``pipeplan speeds`` and ``pipeplan profile --device``: output, files, bad input."""

import json

import pytest

from conftest import EXAMPLES
from pipeplan.runtime import detect
from pipeplan.solver.formats.cluster import load_cluster

ISSUE_EXAMPLE = ["--server", "2x8:a100-80g:nvlink3", "--server", "4x8:v100-32g:pcie3", "--network", "ib-hdr"]
GRAPH = str(EXAMPLES / "chain8.graph.json")


class TestClusterCommand:
    def test_writes_the_issue_example_and_it_plans(self, run_cli, tmp_path):
        out = tmp_path / "cluster.json"
        status, stdout, err = run_cli("cluster", *ISSUE_EXAMPLE, "-o", str(out))
        assert status == 0 and stdout == ""
        assert err.startswith(f"wrote {out}: 2x8-a100-80g+4x8-v100-32g: 6 servers, 48 devices\n")
        assert "32 x v100-32g  speed 0.401  memory 30.92 GB" in err
        cluster = load_cluster(str(out))
        assert len(cluster.devices) == 48 and list(json.loads(out.read_text()))[:2] == ["format", "name"]
        status, _, err = run_cli("plan", GRAPH, str(out), "--batch", "16", "--microbatches", "4", "--solver", "even",
                                 "-o", str(tmp_path / "plan.json"))
        assert status == 0, err
        status, _, err = run_cli("validate", GRAPH, str(out), str(tmp_path / "plan.json"))
        assert status == 0, err

    def test_prints_without_output(self, run_cli):
        status, stdout, _ = run_cli("cluster", "--server", "1x2:h200", "--reference", "a100-80g")
        devices = json.loads(stdout)["devices"]
        assert status == 0 and [d["speed"] for d in devices] == [989.5 / 312] * 2

    @pytest.mark.parametrize("argv, where, what", [
        (["--server", "2x8:a100-80gb", "--network", "ib-hdr"], "--server 2x8:a100-80gb", "closest: a100-80g"),
        (["--server", "2x8:a100-80g", "--network", "ib-hrd"], "--network", "closest: ib-hdr"),
        (["--server", "2x8-a100-80g", "--network", "ib-hdr"], "--server", "expected [SERVERSx]DEVICES:KIND"),
        (["--server=-2x8:a100-80g", "--network", "ib-hdr"], "--server", "servers must be at least 1, got -2"),
        (["--server", "2x0:a100-80g", "--network", "ib-hdr"], "--server", "devices per server must be at least 1"),
        (["--server", "2x8:a100-80g"], "--network", "2 servers need the link"),
        (["--server", "1x8:a100-80g", "--memory-reserve", "1.5"], "--memory-reserve", "below 1"),
        (["--server", "1x8:a100-80g", "--processes", "2"], "--processes", "add --detect"),
        (["--server", "1x8:a100-80g", "--detect"], "--server", "does not go with --detect"),
        (["--list", "--server", "1x8:a100-80g"], "--server", "does not go with --list"),
        (["--json"], "--json", "add --list"),
        ([], "--server", "give servers"),
    ])
    def test_bad_input_is_one_line_and_writes_nothing(self, argv, where, what, run_cli, tmp_path):
        out = tmp_path / "out"
        out.mkdir()
        status, stdout, err = run_cli("cluster", *argv, *([] if "--list" in argv else ["-o", str(out / "c.json")]))
        assert status == 2 and stdout == "" and err.count("\n") == 1
        assert err.startswith(f"error: -: {where}: ") and what in err, err
        assert list(out.iterdir()) == []

    def test_list_prints_the_catalog(self, run_cli):
        status, stdout, _ = run_cli("cluster", "--list")
        assert status == 0 and "a100-80g" in stdout and "ib-hdr" in stdout and "mi300x" in stdout

    def test_list_json_has_every_source(self, run_cli):
        status, stdout, _ = run_cli("cluster", "--list", "--json")
        data = json.loads(stdout)
        assert status == 0 and all(entry["source"] for entry in data["accelerators"] + data["links"])
        assert {k["id"]: k["bandwidth"] for k in data["links"]}["ib-hdr"] == 2.5e10

    def test_detect_on_a_cpu_machine(self, run_cli, tmp_path, monkeypatch):
        monkeypatch.setattr(detect.torch.cuda, "is_available", lambda: False)
        out = tmp_path / "local.json"
        status, _, err = run_cli("cluster", "--detect", "--processes", "2", "-o", str(out))
        assert status == 0 and "no CUDA device: 2 CPU processes" in err
        cluster = load_cluster(str(out))
        assert [(d.id, d.server) for d in cluster.devices] == [("cpu0", "local"), ("cpu1", "local")]
        # the shape of the example `pipeplan run` uses on a laptop
        example = load_cluster(str(EXAMPLES / "cpu-pair.cluster.json"))
        assert [d.id for d in example.devices] == [d.id for d in cluster.devices]


class TestSpeedsCommand:
    @pytest.fixture
    def graphs(self, tmp_path):
        """chain8 and a copy whose layers run 2x, 2x, ... slower, the last 4x."""
        data = json.loads((EXAMPLES / "chain8.graph.json").read_text())
        for i, layer in enumerate(data["layers"]):
            k = 4.0 if i == len(data["layers"]) - 1 else 2.0
            layer["fwd"] = [k * v for v in layer["fwd"]]
            layer["bwd"] = [k * v for v in layer["bwd"]]
        slow = tmp_path / "slow.graph.json"
        slow.write_text(json.dumps(data))
        return GRAPH, str(slow)

    def test_reports_the_ratio_and_its_spread(self, run_cli, graphs):
        status, stdout, _ = run_cli("speeds", *graphs, "--json")
        data = json.loads(stdout)
        assert status == 0 and data["median"] == pytest.approx(0.5) and data["min"] == pytest.approx(0.25)
        assert data["max"] == pytest.approx(0.5) and len(data["layers"]) == 8

    def test_writes_the_speed_into_the_cluster(self, run_cli, graphs, tmp_path):
        cluster = tmp_path / "c.json"
        run_cli("cluster", "--server", "1x2:a100-80g", "--server", "1x2:v100-32g", "--network", "ib-hdr",
                "-o", str(cluster))
        out = tmp_path / "measured.json"
        status, _, err = run_cli("speeds", *graphs, "--cluster", str(cluster), "--kind", "v100-32g",
                                 "--statistic", "median", "-o", str(out))
        assert status == 0 and "2 devices of kind v100-32g at speed 0.5" in err
        assert [d.speed for d in load_cluster(str(out)).devices] == pytest.approx([1.0, 1.0, 0.5, 0.5])

    def test_a_wide_spread_is_warned_about(self, run_cli, graphs, tmp_path):
        data = json.loads((EXAMPLES / "chain8.graph.json").read_text())
        data["layers"][3]["fwd"] = [10 * v for v in data["layers"][3]["fwd"]]  # a block: 15 % of the time
        data["layers"][3]["bwd"] = [10 * v for v in data["layers"][3]["bwd"]]
        odd = tmp_path / "odd.json"
        odd.write_text(json.dumps(data))
        status, _, err = run_cli("speeds", GRAPH, str(odd))
        assert status == 0 and err.startswith("warning: the per-layer ratio spreads from 0.100 to 1.000")

    @pytest.mark.parametrize("extra, where", [
        (["--kind", "v100-32g"], "--cluster"),
        (["--reference-kind", "a100-80g"], "--reference-kind"),
        (["--samples", "0"], "--samples"),
    ])
    def test_bad_options(self, run_cli, graphs, extra, where):
        status, _, err = run_cli("speeds", *graphs, *extra)
        assert status == 2 and err.startswith(f"error: -: {where}: ") and err.count("\n") == 1

    def test_an_absent_kind_writes_nothing(self, run_cli, graphs, tmp_path):
        cluster = tmp_path / "c.json"
        run_cli("cluster", "--server", "1x2:a100-80g", "-o", str(cluster))
        status, _, err = run_cli("speeds", *graphs, "--cluster", str(cluster), "--kind", "t4",
                                 "-o", str(tmp_path / "out.json"))
        assert status == 2 and err.startswith(f"error: {cluster}: devices: no device of kind 't4'")
        assert not (tmp_path / "out.json").exists()

    def test_another_model_is_refused(self, run_cli):
        status, _, err = run_cli("speeds", GRAPH, str(EXAMPLES / "gpt1.graph.json"))
        assert status == 2 and "layers" in err and err.count("\n") == 1


class TestProfileDevice:
    def test_cuda_without_a_gpu_is_one_line_and_writes_nothing(self, run_cli, tmp_path, monkeypatch):
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)
        status, _, err = run_cli("profile", "gpt-tiny", "--device", "cuda", "-o", str(tmp_path / "g.json"))
        assert status == 2 and err.startswith("error: -: --device: CUDA is not available here")
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("argv, what", [
        (["--device", "gpu"], "expected cpu, cuda or cuda:N"),
        (["--device", "cpu", "--analytic"], "--analytic measures nothing"),
    ])
    def test_bad_device(self, run_cli, tmp_path, argv, what):
        status, _, err = run_cli("profile", "gpt-tiny", *argv, "-o", str(tmp_path / "g.json"))
        assert status == 2 and what in err and list(tmp_path.iterdir()) == []


class TestTimeUnitSamplesSync:
    def test_the_clock_is_read_after_a_sync(self):
        import torch

        from pipeplan.models.profile_measured import time_unit_samples

        calls = []
        module = torch.nn.Linear(3, 3)
        fwd, bwd = time_unit_samples(module, [torch.ones(2, 3)], warmup=1, repeats=2, sync=lambda: calls.append(1))
        assert len(fwd) == len(bwd) == 2 and len(calls) == 4 * 3  # before and after each timed op, every run
