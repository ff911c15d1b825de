"""The local machine as a cluster: the nvidia-smi topology parser on captured output, and the
GPU path with torch.cuda and nvidia-smi replaced (no GPU here)."""

import subprocess
from types import SimpleNamespace

import pytest

from conftest import ROOT
from pipeplan.models.errors import InputError
from pipeplan.runtime import detect
from pipeplan.runtime.detect import detect_cluster, nvlink_lanes, parse_topology
from pipeplan.solver.formats.cluster import Cluster

TOPO = ROOT / "tests" / "data" / "topo"


def topo(name):
    return (TOPO / name).read_text()


class TestParseTopology:
    def test_dgx_a100_all_pairs_nv12_nics_and_legend_left_out(self):
        pairs = parse_topology(topo("dgx-a100.txt"))  # header underlined with escape codes
        assert len(pairs) == 8 * 7 and set(pairs.values()) == {"NV12"}

    def test_dgx1_cube_mesh(self):
        pairs = parse_topology(topo("dgx1-v100.txt"))
        assert (pairs[(0, 1)], pairs[(0, 3)], pairs[(0, 5)], pairs[(5, 0)]) == ("NV1", "NV2", "SYS", "SYS")

    def test_no_matrix(self):
        assert parse_topology("") == {} and parse_topology("No devices were found") == {}


class TestNvlinkLanes:
    def test_the_worst_pair_counts(self):
        pairs = parse_topology(topo("dgx1-v100.txt"))
        assert nvlink_lanes(pairs, [0, 3]) == 2
        assert nvlink_lanes(pairs, [0, 1, 2]) == 1  # 0-1 and 0-2 NV1, 1-2 NV2
        assert nvlink_lanes(pairs, [0, 3, 4]) is None  # 3-4 is SYS

    def test_a_pair_without_nvlink_gives_none(self):
        assert nvlink_lanes(parse_topology(topo("dgx1-v100.txt")), list(range(8))) is None
        assert nvlink_lanes(parse_topology(topo("pcie-l40s.txt")), [0, 1]) is None

    def test_one_gpu_has_no_pair(self):
        assert nvlink_lanes(parse_topology(topo("dgx-a100.txt")), [0]) is None


def fake_gpus(monkeypatch, names, memory=80 * 2**30, topology=None):
    """torch.cuda reporting ``names``; nvidia-smi printing ``topology`` (None: not installed)."""
    monkeypatch.setattr(detect.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(detect.torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(detect.torch.cuda, "get_device_name", lambda i: names[i])
    monkeypatch.setattr(detect.torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=memory))
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        if topology is None:
            raise FileNotFoundError(2, "No such file or directory", argv[0])
        return subprocess.CompletedProcess(argv, 0, topology, "")

    monkeypatch.setattr(detect.subprocess, "run", run)
    return calls


class TestDetectCluster:
    def test_an_nvlink_server(self, monkeypatch):
        calls = fake_gpus(monkeypatch, ["NVIDIA A100-SXM4-80GB"] * 8, memory=81920 * 2**20,
                          topology=topo("dgx-a100.txt"))
        cluster, notes = detect_cluster(memory_reserve=0.25)
        assert calls == [["nvidia-smi", "topo", "-m"]]
        assert [d.id for d in cluster.devices] == [f"a100-0-{i}" for i in range(8)]
        assert {d.speed for d in cluster.devices} == {1.0}
        assert {d.memory for d in cluster.devices} == {60 * 2**30}  # 80 GiB less a quarter
        assert cluster.servers[0].bandwidth == 12 * 25e9 and cluster.servers[0].extra["link"] == "nvlink-x12"
        assert "12 NVLink links" in notes[0]
        Cluster.from_dict(cluster.to_dict())

    def test_the_first_gpus_only(self, monkeypatch):
        fake_gpus(monkeypatch, ["Tesla V100-SXM2-32GB"] * 8, topology=topo("dgx1-v100.txt"))
        cluster, _ = detect_cluster(2)
        assert [d.id for d in cluster.devices] == ["v100-0-0", "v100-0-1"]
        assert cluster.servers[0].bandwidth == 25e9  # GPU0-GPU1: one NVLink

    def test_pcie_when_a_pair_has_no_nvlink(self, monkeypatch):
        fake_gpus(monkeypatch, ["NVIDIA L40S"] * 4, topology=topo("pcie-l40s.txt"))
        cluster, notes = detect_cluster()
        assert cluster.servers[0].extra["link"] == "pcie4" and cluster.servers[0].bandwidth == 3.2e10
        assert "not joined by NVLink" in notes[0]

    def test_pcie_assumed_without_nvidia_smi(self, monkeypatch):
        fake_gpus(monkeypatch, ["Tesla T4", "Tesla T4"], topology=None)
        cluster, notes = detect_cluster()
        assert cluster.servers[0].extra["link"] == "pcie3" and "unavailable: PCIe assumed" in notes[0]

    def test_mixed_gpus_get_flops_ratio_speeds(self, monkeypatch):
        fake_gpus(monkeypatch, ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB"], topology=None)
        cluster, _ = detect_cluster()
        assert [d.speed for d in cluster.devices] == [1.0, 125 / 312]
        cluster, _ = detect_cluster(reference="v100-32g")
        assert [d.speed for d in cluster.devices] == [312 / 125, 1.0]

    def test_an_unknown_gpu_gets_speed_one_and_a_note(self, monkeypatch):
        fake_gpus(monkeypatch, ["NVIDIA GeForce GTX 1080"], topology=None)
        cluster, notes = detect_cluster()
        assert cluster.devices[0].id == "gpu-0-0" and cluster.devices[0].speed == 1.0
        assert any("not in the catalog" in n for n in notes)

    def test_more_gpus_than_there_are(self, monkeypatch):
        fake_gpus(monkeypatch, ["NVIDIA H200"] * 2)
        with pytest.raises(InputError) as info:
            detect_cluster(4)
        assert info.value.where == "--processes" and "has 2 GPUs, 4 asked for" in info.value.what

    def test_cpu_only_one_device_per_process(self, monkeypatch):
        monkeypatch.setattr(detect.torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(detect, "physical_memory", lambda: 12 * 10**9)
        cluster, _ = detect_cluster(3, memory_reserve=0.1)
        assert [(d.id, d.server, d.speed, d.memory) for d in cluster.devices] == [
            (f"cpu{i}", "local", 1.0, 3.6e9) for i in range(3)]
        assert cluster.servers[0].bandwidth == 3e9 and cluster.network.latency == 6e-5
        assert len(detect_cluster()[0].devices) == 2
        with pytest.raises(InputError) as info:
            detect_cluster(reference="a100-80g")
        assert info.value.where == "--reference"

    def test_no_processes(self):
        with pytest.raises(InputError) as info:
            detect_cluster(0)
        assert info.value.where == "--processes"
