"""Speeds from one model measured on two kinds of device, and writing them into a cluster."""

import pytest
from hypothesis import given, strategies as st

from pipeplan.models.errors import InputError
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster_spec import build_cluster, parse_server_group
from pipeplan.solver.formats.speeds import compare_speeds, set_kind_speed


def graph(*costs, names=None):
    """A chain whose layer ``i`` has forward ``costs[i]`` and backward ``2 * costs[i]`` (``(a, b)`` pairs)."""
    names = names or [f"l{i}" for i in range(len(costs))]
    return LayerGraph.chain("m", [Layer(n, c, (2 * c[0], 2 * c[1]), 0.0, 0.0, 0.0) for n, c in zip(names, costs)])


class TestCompareSpeeds:
    def test_hand_computed(self):
        ref = graph((0.0, 1.0), (1.0, 0.0), (0.0, 1.0))
        other = graph((0.0, 2.0), (1.0, 0.0), (0.0, 4.0))
        c = compare_speeds(ref, other, 2)
        # times at 2 samples, fwd + bwd = 3 * fwd: ref 6, 3, 6; other 12, 3, 24
        assert c.reference_times == (6.0, 3.0, 6.0) and c.other_times == (12.0, 3.0, 24.0)
        assert c.ratios == (0.5, 1.0, 0.25)
        assert (c.total, c.median, c.minimum, c.maximum) == (15 / 39, 0.5, 0.25, 1.0)
        mean = 1.75 / 3
        std = (((0.5 - mean) ** 2 + (1 - mean) ** 2 + (0.25 - mean) ** 2) / 3) ** 0.5
        assert c.cv == pytest.approx(std / mean)
        # weights 6, 3, 6 of 15: mean 0.5, variance 0.2 * 0.5**2 + 0.4 * 0.25**2 = 0.075
        assert c.weighted_cv == pytest.approx(0.075 ** 0.5 / 0.5) and c.wide

    def test_a_layer_that_takes_no_time_hardly_spreads_the_weighted_ratio(self):
        c = compare_speeds(graph((0.0, 1e-6), (0.0, 1.0)), graph((0.0, 1e-6), (0.0, 2.0)), 1)
        # weights 1e-6 and 1 (of about 1): standard deviation sqrt(1e-6) * 0.5 about a mean of 0.5
        assert c.cv == pytest.approx(1 / 3) and c.weighted_cv == pytest.approx(1e-3, rel=1e-3) and not c.wide

    def test_the_per_call_cost_weighs_less_at_more_samples(self):
        ref, other = graph((1.0, 1.0)), graph((1.0, 3.0))
        assert compare_speeds(ref, other, 1).total == 2 / 4
        assert compare_speeds(ref, other, 9).total == 10 / 28

    def test_a_uniformly_faster_device_has_no_spread(self):
        c = compare_speeds(graph((0.1, 1.0), (0.2, 3.0)), graph((0.05, 0.5), (0.1, 1.5)), 4)
        assert c.ratios == (2.0, 2.0) and c.total == 2.0 and c.cv == 0.0 and c.weighted_cv == 0.0 and not c.wide

    def test_a_layer_free_on_one_device_has_no_ratio(self):
        c = compare_speeds(graph((0.0, 1.0), (0.0, 0.0)), graph((0.0, 2.0), (0.0, 0.0)), 1)
        assert c.ratios == (0.5, None) and c.median == 0.5

    @pytest.mark.parametrize("other, where, what", [
        (graph((0.0, 1.0)), "layers", "has 1 layers"),
        (graph((0.0, 1.0), (0.0, 1.0), names=["l0", "x"]), "layers[1].name", "is 'x'"),
        (graph((0.0, 0.0), (0.0, 0.0)), "layers", "no layer takes time"),
    ])
    def test_graphs_of_different_models(self, other, where, what):
        with pytest.raises(InputError) as info:
            compare_speeds(graph((0.0, 1.0), (0.0, 1.0)), other, 1, other_file="b.json")
        assert (info.value.file, info.value.where) == ("b.json", where) and what in info.value.what

    @given(st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=6), st.floats(0.1, 10.0))
    def test_a_device_k_times_as_slow_has_speed_one_over_k(self, slopes, k):
        ref = graph(*((0.0, b) for b in slopes))
        other = graph(*((0.0, b * k) for b in slopes))
        c = compare_speeds(ref, other, 3)
        assert c.total == pytest.approx(1 / k) and c.median == pytest.approx(1 / k)
        assert c.minimum <= c.median <= c.maximum


class TestSetKindSpeed:
    @pytest.fixture
    def cluster(self):
        return build_cluster([parse_server_group("1x2:a100-80g"), parse_server_group("1x2:v100-32g")], "ib-hdr")

    def test_sets_the_kinds_devices_only(self, cluster):
        out = set_kind_speed(cluster, "v100-32g", 0.35, None, note="measured")
        assert [d.speed for d in out.devices] == [1.0, 1.0, 0.35, 0.35]
        assert out.devices[2].extra["speed_source"] == "measured" and "speed_source" not in out.devices[0].extra

    def test_relative_to_another_kind_of_the_cluster(self, cluster):
        out = set_kind_speed(cluster, "a100-80g", 2.5, "v100-32g")
        assert [d.speed for d in out.devices] == [2.5 * 125 / 312] * 2 + [125 / 312] * 2

    @pytest.mark.parametrize("kind, reference, what", [
        ("t4", None, "no device of kind 't4'"),
        ("v100-32g", "h100-sxm", "no device of kind 'h100-sxm' and it is not the cluster's reference"),
    ])
    def test_unknown_kinds(self, cluster, kind, reference, what):
        with pytest.raises(InputError) as info:
            set_kind_speed(cluster, kind, 0.5, reference, file="c.json")
        assert info.value.file == "c.json" and what in info.value.what

    def test_a_cluster_without_a_reference_needs_one_named(self, cluster):
        bare = type(cluster)(cluster.name, cluster.servers, cluster.network, cluster.devices, {})
        with pytest.raises(InputError) as info:
            set_kind_speed(bare, "v100-32g", 0.5, None)
        assert "--reference-kind" in info.value.what
