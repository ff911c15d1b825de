"""Cluster: links between device sets, round trip, bad input."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import EXAMPLES
from pipeplan.models.errors import InputError
from pipeplan.solver.formats.cluster import Cluster, Device, load_cluster


@pytest.fixture
def two_servers() -> Cluster:
    return load_cluster(str(EXAMPLES / "two-servers.cluster.json"))


class TestBwLat:
    def test_same_server_uses_its_link(self, two_servers):
        assert two_servers.bw(["g0"], ["g1"]) == 1.5e11
        assert two_servers.lat(["g2"], ["g3"]) == 1e-5

    def test_across_servers_uses_the_network(self, two_servers):
        assert two_servers.bw(["g0"], ["g2"]) == 1.25e10
        assert two_servers.lat(["g0"], ["g2"]) == 2e-5

    def test_sets_take_the_worst_pair(self, two_servers):
        # g0-g1 NVLink, g0-g2 network: smallest bandwidth, largest latency
        assert two_servers.bw(["g0"], ["g1", "g2"]) == 1.25e10
        assert two_servers.lat(["g0", "g1", "g2"]) == 2e-5
        assert two_servers.bw(["g2", "g3", "g4"]) == 1.6e10

    def test_one_device_alone_has_no_pair(self, two_servers):
        with pytest.raises(ValueError, match="distinct"):
            two_servers.bw(["g0"], ["g0"])

    @settings(max_examples=200, derandomize=True, deadline=None)
    @given(st.lists(st.sampled_from(["g0", "g1", "g2", "g3", "g4"]), min_size=1, max_size=5),
           st.one_of(st.none(), st.lists(st.sampled_from(["g0", "g1", "g2", "g3", "g4"]), min_size=1, max_size=5)))
    def test_agrees_with_every_pair(self, xs, ys):
        """Brute force: the links of every pair of distinct devices, as the spec defines bw and lat."""
        c = load_cluster(str(EXAMPLES / "two-servers.cluster.json"))
        links = [c.pair_link(x, y) for x in xs for y in (xs if ys is None else ys) if x != y]
        if not links:
            with pytest.raises(ValueError):
                c.bw(xs, ys)
            return
        assert c.bw(xs, ys) == min(link.bandwidth for link in links)
        assert c.lat(xs, ys) == max(link.latency for link in links)


class TestLoadCluster:
    def test_round_trip_keeps_unknown_fields(self, two_servers):
        data = json.loads((EXAMPLES / "two-servers.cluster.json").read_text())
        assert two_servers.to_dict() == data
        assert Cluster.from_dict(two_servers.to_dict()).to_dict() == data

    @pytest.mark.parametrize("mutate, where, what", [
        (lambda d: d.update(format="pipeplan.cluster/7"), "format", "unknown format version"),
        (lambda d: d.update(format="pipeplan.graph/1"), "format", "expected 'pipeplan.cluster/1'"),
        (lambda d: d["servers"][0].update(bandwidth=0), "servers[0].bandwidth", "must be positive"),
        (lambda d: d["network"].update(bandwidth=-5), "network.bandwidth", "must be positive"),
        (lambda d: d["network"].update(latency=-1e-6), "network.latency", "must not be negative"),
        (lambda d: d["devices"][1].update(speed=0), "devices[1].speed", "must be positive"),
        (lambda d: d["devices"][1].update(id="g0"), "devices[1].id", "also used"),
        (lambda d: d["devices"][2].update(server="s9"), "devices[2].server", "unknown server"),
        (lambda d: d["devices"][0].pop("memory"), "devices[0].memory", "missing required field"),
        (lambda d: d.pop("network"), "network", "missing required field"),
    ])
    def test_bad_input_names_the_place(self, mutate, where, what, tmp_path):
        data = json.loads((EXAMPLES / "two-servers.cluster.json").read_text())
        mutate(data)
        path = tmp_path / "c.json"
        path.write_text(json.dumps(data))
        with pytest.raises(InputError) as info:
            load_cluster(str(path))
        assert (info.value.where, info.value.file) == (where, str(path))
        assert what in info.value.what


class TestDevice:
    @pytest.mark.parametrize("speed, memory", [(0.0, 8e9), (-0.3, 8e9), (float("nan"), 8e9), (1.0, -1.0)])
    def test_rejects_bad_speed_or_memory(self, speed, memory):
        with pytest.raises(ValueError, match="speed must be > 0"):
            Device("g0", "s0", speed, memory)

    def test_accepts_zero_memory(self):
        assert Device("g0", "s0", 0.5, 0.0).memory == 0.0
