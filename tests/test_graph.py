"""Layer graph: loading, round trip, boundary bytes, bad input."""

import json
import re

import pytest
from hypothesis import given, strategies as st

from conftest import EXAMPLES, chain, make_layer
from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph, load_graph


def skip_graph() -> LayerGraph:
    # out bytes 1, 2, 4, 8; edges 0->1->2->3 plus the skip 0->3
    layers = [make_layer(i, out=float(2 ** i)) for i in range(4)]
    return LayerGraph("skip", layers, [(0, 1), (1, 2), (2, 3), (0, 3)], input_bytes=3)


class TestCutBytes:
    def test_chain_cut_is_the_output_of_the_last_layer_before_it(self):
        g = LayerGraph.chain("c", [make_layer(i, out=10.0 * (i + 1)) for i in range(3)])
        assert [g.cut_bytes(c) for c in range(2)] == [10.0, 20.0]

    def test_skip_connection_is_relayed_across_every_cut(self):
        g = skip_graph()
        # after 0: layer 0 (feeds 1 and 3) -> 1; after 1: 1 (->2) + 0 (->3) -> 3;
        # after 2: 2 (->3) + 0 (->3) -> 5
        assert [g.cut_bytes(c) for c in range(3)] == [1.0, 3.0, 5.0]

    def test_a_layer_counts_once_even_with_several_consumers_beyond_the_cut(self):
        layers = [make_layer(i, out=7.0) for i in range(4)]
        g = LayerGraph("fan", layers, [(0, 1), (0, 2), (0, 3), (1, 3), (2, 3)])
        assert g.cut_bytes(0) == 7.0  # only layer 0's output crosses
        assert g.cut_bytes(1) == 14.0  # layers 0 and 1

    def test_stage_input_bytes(self):
        g = skip_graph()
        assert g.stage_input_bytes(0) == 3.0
        assert g.stage_input_bytes(2) == 3.0

    def test_no_cut_after_the_last_layer(self):
        with pytest.raises(IndexError):
            chain(3).cut_bytes(2)


class TestLoadGraph:
    def test_examples_load(self):
        g = load_graph(str(EXAMPLES / "skip8.graph.json"))
        assert len(g) == 8 and (0, 6) in g.edges
        assert g.dag.number_of_edges() == 10

    def test_round_trip_keeps_unknown_fields(self, tmp_path):
        data = skip_graph().to_dict()
        data["profiler"] = {"machine": "x"}
        data["layers"][1]["flops"] = 123
        g = LayerGraph.from_dict(data)
        again = g.to_dict()
        assert again == data
        assert LayerGraph.from_dict(again).to_dict() == data

    def test_missing_edges_means_chain(self):
        data = chain(3).to_dict()
        assert "edges" not in data
        assert LayerGraph.from_dict(data).edges == ((0, 1), (1, 2))

    def test_tied_to(self):
        layers = [make_layer(0, params=8.0), make_layer(1), make_layer(2, params=8.0, tied_to=0)]
        g = LayerGraph.chain("t", layers)
        assert g.unique_params() == 8.0
        assert LayerGraph.from_dict(g.to_dict()).layers[2].tied_to == 0

    @pytest.mark.parametrize("mutate, where, what", [
        (lambda d: d.update(format="pipeplan.graph/7"), "format", "unknown format version"),
        (lambda d: d.pop("input_bytes"), "input_bytes", "missing required field"),
        (lambda d: d["layers"][1].update(fwd=[-1, 0]), "layers[1].fwd[0]", "must not be negative"),
        (lambda d: d["layers"][0].update(bwd=[1]), "layers[0].bwd", "expected 2 numbers"),
        (lambda d: d["layers"][0].update(params="big"), "layers[0].params", "expected a number"),
        (lambda d: d["layers"][2].update(act=True), "layers[2].act", "expected a number"),
        (lambda d: d.update(edges=[[1, 1]]), "edges[0]", "must go forward"),
        (lambda d: d.update(edges=[[2, 1]]), "edges[0]", "must go forward"),
        (lambda d: d.update(edges=[[0, 9]]), "edges[0]", "does not exist"),
        (lambda d: d.update(layers=[]), "layers", "must not be empty"),
        (lambda d: d["layers"][1].update(name="l0"), "layers[1].name", "unique"),
        (lambda d: d["layers"][1].update(tied_to=1), "layers[1].tied_to", "another layer"),
    ])
    def test_bad_input_names_the_place(self, mutate, where, what, tmp_path):
        data = chain(3).to_dict()
        mutate(data)
        path = tmp_path / "g.json"
        path.write_text(json.dumps(data))
        with pytest.raises(InputError) as info:
            load_graph(str(path))
        assert info.value.where == where and what in info.value.what
        assert info.value.file == str(path)

    def test_nan_is_not_json(self, tmp_path):
        path = tmp_path / "g.json"
        path.write_text(json.dumps(chain(2).to_dict()).replace('"act": 0.0', '"act": NaN', 1))
        with pytest.raises(InputError, match="invalid JSON"):
            load_graph(str(path))

    @given(st.lists(st.tuples(st.floats(0, 1e3), st.floats(0, 1e3), st.floats(0, 1e9)), min_size=1, max_size=8),
           st.data())
    def test_any_valid_graph_round_trips(self, costs, data):
        layers = [make_layer(i, fwd=(a, b), out=o) for i, (a, b, o) in enumerate(costs)]
        n = len(layers)
        pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
        edges = data.draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
        g = LayerGraph("h", layers, edges, 1.0)
        again = LayerGraph.from_dict(json.loads(json.dumps(g.to_dict())))
        assert again.to_dict() == g.to_dict()
        for c in range(n - 1):  # definition, computed directly
            expected = sum(layers[u].out for u in range(c + 1) if any(x == u and y > c for x, y in edges))
            assert again.cut_bytes(c) == pytest.approx(expected)


class TestAtomicWriteBytes:
    def test_writes_with_the_umask_mode_and_leaves_no_temporary(self, tmp_path):
        import os
        import stat

        from pipeplan.models.jsonio import atomic_write_bytes

        old = os.umask(0o022)
        try:
            atomic_write_bytes(tmp_path / "plan.json", b"{}\n")
        finally:
            os.umask(old)
        assert (tmp_path / "plan.json").read_bytes() == b"{}\n"
        assert stat.S_IMODE((tmp_path / "plan.json").stat().st_mode) == 0o644
        assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]

    def test_missing_folder_is_input_error(self, tmp_path):
        from pipeplan.models.errors import InputError
        from pipeplan.models.jsonio import atomic_write_bytes

        with pytest.raises(InputError):
            atomic_write_bytes(tmp_path / "nowhere" / "plan.json", b"{}")


class TestCheckValues:
    """``pipeplan.models.jsonio.check_values``: what JSON admits but no field can hold, anywhere in a file."""

    def test_valid_values_pass(self):
        from pipeplan.models.jsonio import check_values

        check_values({"a": [1e308, 2 ** 1023, 2 ** 1024 - 2 ** 970 - 1, True, None, "caf\u00e9 \U0001F600"],
                      "\u00e9": {"b": -5e-324}}, "f.json")

    @pytest.mark.parametrize("value, where, what", [
        ({"a": 1, "b": [0, float("inf")]}, "b[1]", "the number is beyond the float range"),
        ({"a": -float("inf")}, "a", "the number is beyond the float range"),
        ({"a": 2 ** 1024 - 2 ** 970}, "a", "an integer of 309 digits"),
        ({"a": "x\ud800"}, "a", "the string holds an unpaired UTF-16 surrogate (\\ud800)"),
        ({"a": {"k\udfff": 1}}, "a", "a key holds an unpaired UTF-16 surrogate (\\udfff)"),
        ("\ud800", "top level", "the string holds"),
        # the first in document order: a value before a later key, a key before a later value
        ({"a": "\ud800", "\ud801": 1}, "a", "(\\ud800)"),
        ({"\ud801": 1, "a": "\ud800"}, "top level", "(\\ud801)"),
        ({"a": float("inf"), "b": float("inf")}, "a", "beyond the float range"),
    ])
    def test_refused_at_its_path(self, value, where, what):
        from pipeplan.models.jsonio import check_values

        with pytest.raises(InputError) as caught:
            check_values(value, "f.json")
        assert caught.value.file == "f.json" and caught.value.where == where and what in caught.value.what


class TestGraphVersion2:
    """Spec 7.1: optional ``bwd_w``, ``act_w``, ``step``; ``/1`` read without them."""

    @staticmethod
    def _data(fmt: str) -> dict:
        return {"format": fmt, "name": "t", "input_bytes": 4, "layers": [
            {"name": "a", "fwd": [0, 1], "bwd": [1, 2], "bwd_w": [0.25, 1.5], "act_w": 3, "step": 0.1,
             "params": 4, "act": 8, "out": 16},
            {"name": "b", "fwd": [0, 1], "bwd": [1, 2], "params": 4, "act": 8, "out": 16}]}

    def test_fields_and_defaults(self):
        g = LayerGraph.from_dict(self._data("pipeplan.graph/2"))
        # layer a as given, layer b defaulted to bwd/2, act, 0
        assert g.range_weight_time(0, 2) == (0.25 + 0.5, 1.5 + 1.0)
        assert g.layers[0].input_bwd == (0.75, 0.5)
        assert g.range_act_weight(0, 2) == 3 + 8
        assert g.range_step(0, 2) == 0.1
        assert g.format == "pipeplan.graph/2"

    def test_round_trip_keeps_version(self):
        g = LayerGraph.from_dict(self._data("pipeplan.graph/2"))
        again = LayerGraph.from_dict(g.to_dict())
        assert again.to_dict() == g.to_dict()
        assert again.layers[0].bwd_w == (0.25, 1.5)

    def test_version1_ignores_fields_of_those_names(self):
        g = LayerGraph.from_dict(self._data("pipeplan.graph/1"))
        assert g.layers[0].bwd_w is None and g.layers[0].extra["bwd_w"] == [0.25, 1.5]
        assert g.range_weight_time(0, 1) == (0.5, 1.0)
        assert g.range_act_weight(0, 1) == 8 and g.range_step(0, 2) == 0
        assert g.to_dict()["format"] == "pipeplan.graph/1"
        assert g.to_dict()["layers"][0]["bwd_w"] == [0.25, 1.5]  # kept as an unknown field

    @pytest.mark.parametrize("field, value, message", [
        ("bwd_w", [0, 3], "exceeds bwd[1]"),
        ("bwd_w", [2, 0], "exceeds bwd[0]"),
        ("act_w", 9, "exceed act"),
        ("step", -1, "must not be negative"),
        ("bwd_w", [0], "expected 2 numbers"),
    ])
    def test_bad_fields(self, field, value, message):
        data = self._data("pipeplan.graph/2")
        data["layers"][0][field] = value
        with pytest.raises(InputError, match=re.escape(message)):
            LayerGraph.from_dict(data)

    def test_unknown_version(self):
        with pytest.raises(InputError, match="unknown format version 'pipeplan.graph/4'"):
            LayerGraph.from_dict(self._data("pipeplan.graph/4"))
