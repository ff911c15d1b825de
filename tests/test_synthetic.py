"""Tests of the synthetic layer-graph generator (models/synthetic.py)."""

from __future__ import annotations

import math

import pytest

from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph
from pipeplan.models.synthetic import synthetic_graph


class TestSyntheticGraph:
    def test_same_seed_same_graph(self) -> None:
        a = synthetic_graph(20, seed=5, compute_spread=1.0, act_spread=0.5, skips=4)
        b = synthetic_graph(20, seed=5, compute_spread=1.0, act_spread=0.5, skips=4)
        assert a.to_dict() == b.to_dict()

    def test_other_seed_other_graph(self) -> None:
        assert synthetic_graph(20, seed=5).to_dict() != synthetic_graph(20, seed=6).to_dict()

    def test_no_spread_gives_equal_layers(self) -> None:
        g = synthetic_graph(3, seed=0, compute_spread=0.0, fixed_cost=2e-4, act_bytes=800,
                            per_sample_time=1e-3, backward_ratio=3.0, param_bytes=100)
        for layer in g.layers:
            assert layer.fwd == (2e-4, 1e-3)
            assert layer.bwd == pytest.approx((2e-4, 3e-3))
            assert (layer.params, layer.act, layer.out) == (100.0, 800.0, 200.0)
        assert g.input_bytes == 200.0
        assert g.edges == ((0, 1), (1, 2))

    def test_spread_is_bounded(self) -> None:
        spread = 0.7
        g = synthetic_graph(200, seed=1, compute_spread=spread)
        per_sample = [layer.fwd[1] for layer in g.layers]
        ratio = max(per_sample) / min(per_sample)
        assert 1.5 < ratio <= math.exp(2 * spread)
        # Parameters scale with compute.
        assert all(layer.params / layer.fwd[1] == pytest.approx(4e7 / 1e-3) for layer in g.layers)

    def test_skip_edges_go_forward(self) -> None:
        g = synthetic_graph(12, seed=2, skips=5)
        assert all(u < v for u, v in g.edges)
        assert any(v - u >= 2 for u, v in g.edges)
        # A valid graph file round trip.
        assert LayerGraph.from_dict(g.to_dict()).edges == g.edges

    def test_single_layer(self) -> None:
        g = synthetic_graph(1, seed=0, skips=3)
        assert len(g) == 1 and g.edges == ()

    @pytest.mark.parametrize("kwargs", [{"layers": 0}, {"layers": 2.5}, {"skips": -1},
                                        {"compute_spread": -0.1}, {"fixed_cost": float("nan")}])
    def test_bad_arguments(self, kwargs: dict) -> None:
        args = {"layers": 4, "seed": 0, **kwargs}
        with pytest.raises(InputError):
            synthetic_graph(args.pop("layers"), args.pop("seed"), **args)
