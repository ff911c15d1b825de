"""Clusters from server groups: ids, speeds, memory, links, and every written file loads."""

import json

import pytest
from hypothesis import given, settings, strategies as st

from pipeplan.models.errors import InputError
from pipeplan.solver.formats.cluster import Cluster
from pipeplan.solver.formats.cluster_spec import build_cluster, parse_server_group


def groups(*texts):
    return [parse_server_group(t) for t in texts]


class TestParseServerGroup:
    def test_full_and_short_forms(self):
        g = parse_server_group("2x8:a100-80g:nvlink3")
        assert (g.servers, g.devices, g.kind, g.link) == (2, 8, "a100-80g", "nvlink3")
        g = parse_server_group("4:t4")
        assert (g.servers, g.devices, g.kind, g.link) == (1, 4, "t4", None)

    @pytest.mark.parametrize("text", ["2x8", "a100-80g", "2x8:", "2y8:a100-80g", "2:8:a100-80g", "2x8:a:b:c", ""])
    def test_malformed(self, text):
        with pytest.raises(InputError) as info:
            parse_server_group(text)
        assert info.value.where == "--server" and "expected [SERVERSx]DEVICES:KIND[:LINK]" in info.value.what

    @pytest.mark.parametrize("text, what", [
        ("0x8:a100-80g", "servers must be at least 1, got 0"),
        ("-2x8:a100-80g", "servers must be at least 1, got -2"),
        ("2x0:a100-80g", "devices per server must be at least 1, got 0"),
        ("2x-8:a100-80g", "devices per server must be at least 1, got -8"),
        ("2000x1000:a100-80g", "more than 1,000,000"),
    ])
    def test_counts_below_one_or_too_many(self, text, what):
        with pytest.raises(InputError) as info:
            parse_server_group(text)
        assert what in info.value.what


class TestBuildCluster:
    @pytest.fixture
    def issue_example(self):
        return build_cluster(groups("2x8:a100-80g:nvlink3", "4x8:v100-32g:pcie3"), "ib-hdr")

    def test_ids_say_what_they_are(self, issue_example):
        c = issue_example
        assert [s.id for s in c.servers] == ["a100-0", "a100-1", "v100-2", "v100-3", "v100-4", "v100-5"]
        assert len(c.devices) == 48
        assert c.devices[3].id == "a100-0-3" and c.devices[3].server == "a100-0"
        assert c.devices[-1].id == "v100-5-7" and c.devices[-1].extra["kind"] == "v100-32g"

    def test_speed_is_the_peak_flops_ratio_to_the_reference(self, issue_example):
        speeds = {d.extra["kind"]: d.speed for d in issue_example.devices}
        assert speeds == {"a100-80g": 1.0, "v100-32g": 125 / 312}
        derived = issue_example.extra["derived"]
        assert derived["reference"] == "a100-80g" and "v100-32g use their fp16 peak" in derived["speed"]

    def test_another_reference(self):
        c = build_cluster(groups("1x2:a100-80g", "1x2:h100-sxm"), "ib-ndr", reference="h100-sxm")
        assert [d.speed for d in c.devices] == [312 / 989.5, 312 / 989.5, 1.0, 1.0]

    def test_memory_less_the_reserve(self, issue_example):
        memories = {d.extra["kind"]: d.memory for d in issue_example.devices}
        assert memories == {"a100-80g": 77309411328, "v100-32g": 30923764531}  # floor(0.9 * 80 GiB), 0.9 * 32 GiB
        none_reserved = build_cluster(groups("1x1:t4"), None, memory_reserve=0)
        assert none_reserved.devices[0].memory == 16 * 2**30

    def test_links_from_the_catalog(self, issue_example):
        c = issue_example
        assert c.bw(["a100-0-0"], ["a100-0-7"]) == 3e11 and c.lat(["a100-0-0"], ["a100-0-7"]) == 5e-6
        assert c.bw(["v100-2-0"], ["v100-2-1"]) == 1.6e10
        assert c.bw(["a100-0-0"], ["a100-1-0"]) == 2.5e10
        assert c.servers[0].extra["link"] == "nvlink3" and c.network.extra["link"] == "ib-hdr"

    def test_the_kinds_usual_link_by_default(self):
        c = build_cluster(groups("1x2:h100-sxm", "1x2:l40s"), "ib-ndr")
        assert [s.extra["link"] for s in c.servers] == ["nvlink4", "pcie4"]

    def test_the_written_file_loads(self, issue_example, tmp_path):
        from pipeplan.solver.formats.cluster import load_cluster

        path = tmp_path / "c.json"
        path.write_text(json.dumps(issue_example.to_dict()))
        assert load_cluster(str(path)).to_dict() == issue_example.to_dict()

    @pytest.mark.parametrize("kwargs, where, what", [
        (dict(groups=groups("2x8:a100-80g")), "--network", "2 servers need the link"),
        (dict(groups=groups("1x8:a100-80gb"), network=None), "--server 1x8:a100-80gb", "closest: a100-80g"),
        (dict(groups=groups("1x8:a100-80g:ib-hdr"), network=None), "--server 1x8:a100-80g:ib-hdr",
         "is a network link, not a server one"),
        (dict(groups=groups("1x8:a100-80g"), network="ib-hdr", reference="a200"), "--reference", "unknown"),
        (dict(groups=groups("1x8:a100-80g"), network="ib-hdr", memory_reserve=1.0), "--memory-reserve", "below 1"),
        (dict(groups=groups("1x8:a100-80g"), network="ib-hdr", memory_reserve=-0.1), "--memory-reserve", "at least 0"),
        (dict(groups=[], network="ib-hdr"), "--server", "at least one group"),
    ])
    def test_bad_input(self, kwargs, where, what):
        kwargs = {"network": None, **kwargs}
        with pytest.raises(InputError) as info:
            build_cluster(kwargs.pop("groups"), kwargs.pop("network"), **kwargs)
        assert info.value.where == where and what in info.value.what

    @settings(max_examples=30, deadline=None)
    @given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4), st.sampled_from(["a100-80g", "t4", "mi300x"])),
                    min_size=1, max_size=4))
    def test_any_groups_give_a_valid_cluster_of_their_size(self, spec):
        c = build_cluster(groups(*(f"{n}x{m}:{k}" for n, m, k in spec)), "100gbe")
        assert len(c.devices) == sum(n * m for n, m, _ in spec) and len(c.servers) == sum(n for n, _, _ in spec)
        assert Cluster.from_dict(c.to_dict()).to_dict() == c.to_dict()  # unique ids, known servers
