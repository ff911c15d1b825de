"""The parts of experiments/metis_compare.py that need no copy of Metis: its inputs, its plans, the CLI's errors."""

from __future__ import annotations

import json
import sys

import pytest

from pipeplan.experiments import metis_compare as mc
from pipeplan.models.errors import InputError
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster_spec import build_cluster, parse_server_group
from pipeplan.solver.formats.plan import Plan, Stage


@pytest.fixture(scope="module")
def graph():
    """A GPT-like graph of 4 blocks: embedding, blocks, head (6 layers)."""
    return mc.gpt_graph("tiny-gpt", 4, 256, 4, 1000, 64)


@pytest.fixture(scope="module")
def cluster():
    """Two servers of 4 A100s (NVLink) and two of 4 V100s (PCIe), InfiniBand between them."""
    return build_cluster([parse_server_group("2x4:a100-80g:nvlink3"), parse_server_group("2x4:v100-32g:pcie3")],
                         "ib-hdr")


@pytest.fixture(scope="module")
def written(graph, cluster, tmp_path_factory):
    directory = tmp_path_factory.mktemp("metis-inputs")
    return mc.write_metis_inputs(graph, cluster, str(directory), batch=8, max_tp=4)


class TestMetisNames:
    def test_catalog_kinds_keep_their_names(self, cluster):
        assert mc.metis_names(cluster) == {"a100-80g": "A100", "v100-32g": "V100"}

    def test_other_kinds_get_the_names_left(self):
        c = build_cluster([parse_server_group("1x2:h100-sxm"), parse_server_group("1x2:v100-32g")], "ib-hdr")
        assert mc.metis_names(c) == {"h100-sxm": "A100", "v100-32g": "V100"}

    def test_five_kinds_are_refused(self):
        kinds = ["a100-80g", "v100-32g", "t4", "h100-sxm", "l4"]
        c = build_cluster([parse_server_group(f"1x1:{k}") for k in kinds], "ib-hdr")
        with pytest.raises(InputError, match="5 device kinds, but Metis knows 4"):
            mc.metis_names(c)


class TestWriteMetisInputs:
    def test_one_profile_per_kind_degree_and_size(self, written):
        names = sorted(written.files)
        assert len(names) == 2 * 3 * 4  # kinds x tp {1,2,4} x bs {1,2,4,8}
        assert "DeviceType.A100_tp4_bs8.json" in names and "DeviceType.V100_tp1_bs1.json" in names
        assert written.max_tp == 4 and written.max_bs == 8 and written.num_layers == 6

    def test_profile_times_are_the_simulators(self, written, graph, cluster):
        """A one-stage plan of one replica of t devices and one microbatch of b samples is busy for the profile's sum."""
        for kind, t, b in (("A100", 1, 2), ("A100", 4, 8), ("V100", 2, 4)):
            with open(f"{written.directory}/profile/DeviceType.{kind}_tp{t}_bs{b}.json") as f:
                data = json.load(f)
            prefix = "a100" if kind == "A100" else "v100"
            devices = tuple(d.id for d in cluster.devices if d.id.startswith(prefix))[:t]
            p = Plan(graph.name, cluster.name, b, mc.STATE_FACTOR, "1f1b",
                     (Stage((0, len(graph.layers)), devices, (b,), tensor_parallel=t),))
            sim = simulate(p, graph, cluster)
            layers = data["execution_time"]["layer_compute_total_ms"]
            assert sum(layers) == pytest.approx(1000 * sim.busy[0], rel=1e-9)
            # one device's state plus one microbatch's stash: the simulator's peak for one microbatch
            assert sum(data["execution_memory"]["layer_memory_total_mb"]) * mc.MIB == \
                pytest.approx(sim.groups[0].peak_memory, rel=1e-9)
            fb = data["execution_time"]["forward_backward_time_ms"]
            assert fb - sum(layers) > 0  # Metis reads a zero difference as a missing profile

    def test_hostfile_and_clusterfile(self, written, cluster):
        hosts = open(f"{written.directory}/hostfile").read().splitlines()
        assert hosts == ["10.0.0.1 slots=4", "10.0.0.2 slots=4", "10.0.0.3 slots=4", "10.0.0.4 slots=4"]
        info = json.load(open(f"{written.directory}/clusterfile.json"))
        assert [info[h.split()[0]]["instance_type"] for h in hosts] == ["A100", "A100", "V100", "V100"]
        a100 = next(d for d in cluster.devices if d.id.startswith("a100"))
        assert info["10.0.0.1"]["memory"] * 1024 ** 3 == pytest.approx(a100.memory)
        assert info["10.0.0.1"]["intra_bandwidth"] * 1000 * mc.MIB == pytest.approx(cluster.servers[0].bandwidth)

    def test_arguments_name_the_files(self, written):
        args = written.arguments(8, 1, 4)
        assert args[args.index("--max_profiled_tp_degree") + 1] == "4"
        assert args[args.index("--sequence_length") + 1] == "1"
        assert args[args.index("--profile_data_path") + 1].endswith("profile")

    def test_servers_of_ten_devices_are_refused(self, graph, tmp_path):
        c = build_cluster([parse_server_group("1x10:a100-80g")], None)
        with pytest.raises(InputError, match="one digit"):
            mc.write_metis_inputs(graph, c, str(tmp_path), batch=8)
        assert not (tmp_path / "hostfile").exists()

    def test_batch_not_a_power_of_two_is_refused(self, graph, cluster, tmp_path):
        with pytest.raises(InputError, match="power of two"):
            mc.write_metis_inputs(graph, cluster, str(tmp_path), batch=12)


OUTPUT = """len(costs): 3
rank, cost, node_sequence, device_groups, strategies(dp_deg, tp_deg), batches(number of batch), layer_partition
1, 812.5, (<DeviceType.A100: 'a100'>, <DeviceType.V100: 'v100'>), [8, 8], [(2, 4), (4, 2)], 4, [0, 3, 6]
2, 900.0, (<DeviceType.V100: 'v100'>, <DeviceType.A100: 'a100'>), [4, 4, 8], [(4, 1), (1, 4), (8, 1)], 2, [0, 2, 2, 6]
3, 950.25, (<DeviceType.A100: 'a100'>, <DeviceType.V100: 'v100'>), [2, 4, 8, 2], [(1, 2), (1, 4), (2, 4), (1, 2)], 8, [0, 1, 2, 4, 6]
"""


class TestParseMetisOutput:
    def test_ranked_lines(self):
        plans = mc.parse_metis_output(OUTPUT)
        assert [p.rank for p in plans] == [1, 2, 3]
        first = plans[0]
        assert first.cost == 812.5 and first.kinds == ("A100", "V100") and first.groups == (8, 8)
        assert first.strategies == ((2, 4), (4, 2)) and first.microbatches == 4 and first.partition == (0, 3, 6)

    def test_plans_estimated_from_fewer_stages_are_marked(self):
        log = ("node_sequence: (<DeviceType.A100: 'a100'>, <DeviceType.V100: 'v100'>), device_group: [8, 8], "
               "num_stage: 1, batches: 4, gbs: 8, strategies: [(2, 4), (4, 2)], layer_partition: [0, 3, 6]\n"
               "cost: 812.5\n"
               "node_sequence: (<DeviceType.V100: 'v100'>, <DeviceType.A100: 'a100'>), device_group: [4, 4, 8], "
               "num_stage: 3, batches: 2, gbs: 8, strategies: [(4, 1), (1, 4), (8, 1)], layer_partition: [0, 2, 2, 6]\n"
               "cost: 900.0\n")
        first, second, third = mc.parse_metis_output(log + OUTPUT)
        assert first.costed_stages == 1 and second.costed_stages is None and third.costed_stages is None

    def test_no_header_no_plans(self):
        assert mc.parse_metis_output("inter_stage_plan: ...\ncost: 3.0\n") == []


class TestTranslate:
    def test_plan_one(self, graph, cluster):
        record = mc.parse_metis_output(OUTPUT)[0]
        p = mc.translate(record, graph, cluster, mc.metis_names(cluster), batch=8)
        assert p.format == "pipeplan.plan/3" and p.schedule == "1f1b" and p.zero == 0
        first, second = p.stages
        assert first.layers == (0, 3) and first.tensor_parallel == 4 and first.replicas == 2
        assert first.microbatches == (2, 2, 2, 2) and not first.recompute
        assert {d.split("-")[0] for d in first.devices} == {"a100"}
        assert [len({d.rsplit("-", 1)[0] for d in rep}) for rep in first.replica_devices] == [1, 1]
        assert second.layers == (3, 6) and second.tensor_parallel == 2 and second.replicas == 4
        assert {d.split("-")[0] for d in second.devices} == {"v100"}
        assert p.extra["metis"] == {"rank": 1, "cost_ms": 812.5}
        assert simulate(p, graph, cluster).iteration_time > 0

    def test_kind_order_follows_metis(self, graph, cluster):
        record = mc.MetisPlan(1, 1.0, ("V100", "A100"), (8, 8), ((8, 1), (2, 4)), 2, (0, 3, 6))
        p = mc.translate(record, graph, cluster, mc.metis_names(cluster), batch=8)
        assert p.stages[0].devices[0].startswith("v100") and p.stages[1].devices[0].startswith("a100")

    def test_empty_stage_is_reported(self, graph, cluster):
        record = mc.parse_metis_output(OUTPUT)[1]
        with pytest.raises(mc.Untranslatable, match="stage 1 of 3 has no layers"):
            mc.translate(record, graph, cluster, mc.metis_names(cluster), batch=8)

    def test_replica_across_servers_is_reported(self, graph, cluster):
        record = mc.parse_metis_output(OUTPUT)[2]  # stage 1: ranks 2-5, two on each A100 server, tp 4
        with pytest.raises(mc.Untranslatable, match="stage 1: 2 of its devices are on server a100-0"):
            mc.translate(record, graph, cluster, mc.metis_names(cluster), batch=8)

    def test_dropped_layers_are_reported(self, graph, cluster):
        record = mc.MetisPlan(1, 1.0, ("A100", "V100"), (8, 8), ((8, 1), (8, 1)), 2, (0, 3, 5))
        with pytest.raises(mc.Untranslatable, match="covers layers 0 to 4 of 0 to 5"):
            mc.translate(record, graph, cluster, mc.metis_names(cluster), batch=8)

    def test_degrees_that_do_not_fill_the_group(self, graph, cluster):
        record = mc.MetisPlan(1, 1.0, ("A100", "V100"), (8, 8), ((2, 2), (8, 1)), 2, (0, 3, 6))
        with pytest.raises(mc.Untranslatable, match="dp 2 x tp 2 is not its 8 devices"):
            mc.translate(record, graph, cluster, mc.metis_names(cluster), batch=8)


class TestMain:
    def test_missing_metis_is_one_line(self, tmp_path, capsys):
        assert mc.main(["--metis", str(tmp_path / "nowhere"), "--json", str(tmp_path / "out.json")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path / 'nowhere'}: --metis: no cost_het_cluster.py")
        assert not (tmp_path / "out.json").exists()

    def test_missing_python_is_an_input_error(self, graph, cluster, tmp_path):
        inputs = mc.write_metis_inputs(graph, cluster, str(tmp_path), batch=8)
        with pytest.raises(InputError, match="--metis-python: no such program"):
            mc.run_metis(tmp_path, str(tmp_path / "no-python"), inputs, batch=8, variance=1, permute=4, timeout=5)

    def test_a_degree_below_one_is_refused(self, tmp_path, capsys):
        assert mc.main(["--metis", str(tmp_path), "--max-tp", "0"]) == 2
        assert capsys.readouterr().err == "error: -: --max-tp: must be at least 1, got 0\n"

    def test_unknown_instance(self, tmp_path, capsys):
        (tmp_path / "cost_het_cluster.py").write_text("")
        assert mc.main(["--metis", str(tmp_path), "--instances", "gpt-9t"]) == 2
        assert "--instances: unknown 'gpt-9t'" in capsys.readouterr().err


FAKE_METIS = '''import sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
assert args["--num_layers"] == "6" and args["--gbs"] == "8" and args["--max_profiled_tp_degree"] == "4"
print("node_sequence: (<DeviceType.A100: 'a100'>, <DeviceType.V100: 'v100'>), device_group: [8, 8], num_stage: 1, "
      "batches: 4, gbs: 8, strategies: [(2, 4), (4, 2)], layer_partition: [0, 3, 6]")
print(open(sys.argv[0].replace("cost_het_cluster.py", "ranked.txt")).read())
'''


@pytest.fixture(scope="module")
def fake_metis(tmp_path_factory):
    """A stand-in for Metis's search that prints a fixed ranked list (the plan ranked 1 estimated from one stage)."""
    where = tmp_path_factory.mktemp("fake-metis")
    (where / "cost_het_cluster.py").write_text(FAKE_METIS)
    (where / "ranked.txt").write_text(OUTPUT)
    return where


class TestMetisSide:
    def test_runs_translates_and_scores(self, fake_metis, graph, cluster, tmp_path):
        inst = mc.Instance("tiny", graph, cluster, 8)
        out = mc.metis_side(inst, fake_metis, sys.executable, top=10, variance=1, permute=4, max_tp=4,
                            timeout=60, keep=str(tmp_path))
        assert out["status"] == "ok" and out["plans_found"] == 3 and out["short_costed"] == 1
        first, second, third = out["scored"]
        assert first["costed_stages"] == 1 and first["fits"] and first["degrees"] == [4, 2]
        assert "no layers" in second["untranslatable"] and "server a100-0" in third["untranslatable"]
        assert mc.metis_choice(out) is second and mc.best_scored(out) is None
        assert json.loads((tmp_path / "run.json").read_text())["status"] == "ok"

    def test_reuse_reads_the_kept_log(self, fake_metis, graph, cluster, tmp_path):
        inst = mc.Instance("tiny", graph, cluster, 8)
        kw = dict(top=10, variance=1, permute=4, max_tp=4, timeout=60, keep=str(tmp_path))
        mc.metis_side(inst, fake_metis, sys.executable, **kw)
        again = mc.metis_side(inst, tmp_path / "no-metis-here", sys.executable, reuse=True, **kw)
        assert again["plans_found"] == 3 and again["status"] == "ok"

    def test_a_failing_metis_is_reported(self, graph, cluster, tmp_path):
        broken = tmp_path / "metis"
        broken.mkdir()
        (broken / "cost_het_cluster.py").write_text("raise IndexError('list index out of range')\n")
        inst = mc.Instance("tiny", graph, cluster, 8)
        out = mc.metis_side(inst, broken, sys.executable, top=10, variance=1, permute=4, max_tp=4, timeout=60,
                            keep=None)
        assert out["status"] == "exit 1: IndexError: list index out of range" and out["scored"] == []


class TestTable:
    def test_rows_say_what_they_could_not_score(self, fake_metis, graph, cluster, tmp_path):
        inst = mc.Instance("tiny", graph, cluster, 8)
        m = mc.metis_side(inst, fake_metis, sys.executable, top=10, variance=1, permute=4, max_tp=4, timeout=60,
                          keep=None)
        pipeplan = {"iteration_time": 1.0, "fits": True, "max_memory_share": 0.5, "stages": 1, "degrees": [1],
                    "replicas": [8], "zero": [0], "microbatches": 4, "recompute": 0, "wall_time": 0.1}
        text = mc.table([{"instance": "tiny", "devices": 16, "batch": 8, "metis": m,
                          "pipeplan": {"auto": pipeplan, "0": dict(pipeplan)}}])
        row = text.splitlines()[-1]
        assert "estimated 0.812 s from 1 of 2 stages" in row
        assert "plan 2, estimated 0.900 s: not expressible: stage 1 of 3 has no layers" in row
        assert "none fits" in row
