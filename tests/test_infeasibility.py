"""tightest_constraint: names the layer (or the model) that no device can hold, with numbers."""

from __future__ import annotations

from models.graph import Layer, LayerGraph
from solver.cluster import Cluster, Device, Link
from solver.infeasibility import format_bytes, layer_footprint, tightest_constraint
from solver.problem import PlanningProblem


def problem(memories, params=(1e9, 7.8e9, 1e9), act=1e8, **kw) -> PlanningProblem:
    layers = [Layer(f"block.{i}", (0, 1e-3), (0, 2e-3), p, act, 1e6) for i, p in enumerate(params)]
    c = Cluster("c", (Link(1e11, 0, "s0"),), Link(1e10, 0),
                tuple(Device(f"g{i}", "s0", 1.0, m) for i, m in enumerate(memories)))
    return PlanningProblem(LayerGraph.chain("g", layers, 1e6), c, global_batch=kw.pop("batch", 8),
                           microbatches=kw.pop("m", 1), **kw)


class TestFormatBytes:
    def test_units(self):
        assert format_bytes(31.2e9) == "31.2 GB"
        assert format_bytes(2.5e6) == "2.5 MB"
        assert format_bytes(12) == "12.0 B"


class TestLayerFootprint:
    def test_hand_computed(self):
        # 4 * 7.8e9 state + 8 samples * 1e8 act = 31.2e9 + 0.8e9 = 32.0e9 bytes.
        assert layer_footprint(problem([24e9]), 1, 1) == 32.0e9
        # Two replicas: 4 samples each.
        assert layer_footprint(problem([24e9]), 1, 2) == 31.2e9 + 4e8


class TestTightestConstraint:
    def test_names_the_layer_and_numbers(self):
        text = tightest_constraint(problem([24e9, 16e9]))
        assert "layer 'block.1' alone needs" in text
        assert "microbatch 8" in text and "24.0 GB" in text

    def test_single_device_exact_sentence(self):
        text = tightest_constraint(problem([24e9], allow_replication=False))
        assert text.startswith("layer 'block.1' alone needs 32.0 GB at microbatch 8 "
                               "(state 31.2 GB + activations 800.0 MB); the largest device has 24.0 GB")
        assert "replication is off" in text

    def test_replication_considered(self):
        # Replicas halve the activations but not the state: best is 2 replicas of 24 GB.
        text = tightest_constraint(problem([24e9, 24e9]))
        assert "over 2 replicas (4 sample(s) each)" in text and "31.6 GB" in text

    def test_whole_model_state(self):
        # Every layer fits alone on 10 GB, but one stage must hold all 3 x 4 GB of state.
        text = tightest_constraint(problem([10e9, 10e9], params=(1e9, 1e9, 1e9), act=1.0, max_stages=1))
        assert "training state alone needs 12.0 GB" in text and "10.0 GB" in text

    def test_activations_named_when_the_state_fits(self):
        # No state at all (state factor 0), yet 3 x 1e8 bytes of activations per sample of a
        # microbatch of 8 (2.4 GB) cannot sit on one 2 GB device while each layer's 800 MB can.
        text = tightest_constraint(problem([2e9], params=(1e9, 1e9, 1e9), act=1e8, max_stages=1,
                                           state_factor=0.0))
        assert "state is 0.0 B and its activations 2.4 GB per microbatch of 8" in text
        assert "the 1 largest devices hold 2.0 GB together" in text
