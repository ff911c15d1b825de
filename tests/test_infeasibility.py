"""tightest_constraint: names the layer (or the model) that no device can hold, with numbers."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings, strategies as st

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.bounds.infeasibility import (_first_counts, exceeds, fewest_stages, format_bytes, largest_microbatch, layer_footprint,
                                   heuristic_no_plan, proves_infeasible, tightest_constraint)
from pipeplan.solver.core.problem import PlanningProblem


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
        assert format_bytes(12) == "12 B" and format_bytes(4.8e6, 2) == "4.80 MB"


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
        assert text.startswith("the layers need at least 2 stages")
        assert "layers 'block.0' to 'block.2' together already need 2.4 GB at microbatch 8" in text
        assert text.endswith("more than the largest device's 2.0 GB; a plan has at most 1 stage(s) (--max-stages 1)")

    def test_adjacent_layers_that_fit_no_device_together(self):
        # Three layers of 0.6 GB state on two 1 GB devices: each fits alone, the whole state
        # (1.8 GB) fits the two devices' 2 GB, but no two adjacent layers share a device.
        text = tightest_constraint(problem([1e9, 1e9], params=(1.5e8,) * 3, act=1.0, batch=4, m=2))
        assert text.startswith("the layers need at least 3 stages")
        assert "layers 'block.0' to 'block.1' together already need 1.2 GB" in text
        assert text.endswith("a plan has at most 2 stage(s) (2 device(s))")

    def test_packing_may_fit_and_then_the_model_is_described(self):
        text = tightest_constraint(problem([1e9, 1e9, 1e9], params=(1.5e8,) * 3, act=1.0, batch=4, m=2))
        assert text.startswith("every layer fits on a device alone")
        # no "state X and activations Y; the devices hold Z together" whose sum fits (it read as if a plan did)
        assert "fits the 3 largest devices' 3.0 GB taken together, but no split into at most 3" in text
        assert "device by device" in text and "(under 1F1B, one per later stage plus one" in text


class TestLargestMicrobatch:
    def test_equal_split(self):
        assert largest_microbatch(problem([1e9], batch=10, m=4)) == 3

    def test_free_sizes_use_the_most_microbatches_allowed(self):
        # B = 6 in at most K = 3: the seeding split (2 of 3) is not the smallest largest one
        p = problem([1e9], batch=6, m=2, auto_microbatches=True, max_microbatches=3)
        assert largest_microbatch(p) == 2

    def test_a_split_that_fits_is_not_ruled_out(self):
        # one layer of 1 byte per sample on a 2.5-byte device: 3 + 3 does not fit, 2 + 2 + 2 does
        p = problem([2.5], params=(0.0,), act=1.0, batch=6, m=2, auto_microbatches=True, max_microbatches=3,
                    allow_recompute=False)
        assert not proves_infeasible(p)


class TestProvesInfeasible:
    def test_zero_need_fits_a_zero_memory_device(self):
        assert not proves_infeasible(problem([0.0], params=(0.0,), act=0.0))

    def test_a_layer_too_large_alone(self):
        assert proves_infeasible(problem([24e9, 16e9]))

    def test_rounding_is_not_a_proof(self):
        # the simulator may sum the same bytes in another order: a bound one ulp above a memory
        # equal to the peak must not count as exceeding it
        assert not exceeds(5 * (0.2 + 0.4), 3.0) and exceeds(3.0 * (1 + 1e-6), 3.0)


class TestFewestStages:
    def test_hand_computed(self):
        p = problem([1e9, 1e9], params=(1.5e8, 1e8, 1.5e8, 0.5e8), act=0.0)
        # 0.6 + 0.4 = 1.0 fits; + 0.6 overflows; 0.6 + 0.2 fits
        assert fewest_stages(p) == (2, (0, 3, 1.6e9))

    def test_one_stage_holds_everything(self):
        assert fewest_stages(problem([1e12]))[0] == 1

    @pytest.mark.parametrize("seed", range(30))
    def test_proof_agrees_with_the_exact_solver(self, seed):
        from pipeplan.solver.solvers import get_solver

        rng = random.Random(seed)
        p = problem([rng.choice([0.5e9, 1e9, 1.6e9]) for _ in range(rng.randint(1, 3))],
                    params=tuple(rng.choice([0.5e8, 1e8, 1.5e8]) for _ in range(4)), act=rng.choice([1.0, 2e7]),
                    batch=4, m=rng.choice([1, 2]), schedule=rng.choice(["gpipe", "1f1b"]))
        if proves_infeasible(p):
            assert get_solver("ilp").solve(p, time_limit=20).status == "infeasible"


class TestHeuristicNoPlan:
    def test_proved_by_the_memory_bounds_is_infeasible(self):
        # block.1 alone needs 32.0 GB (see TestLayerFootprint); the only device has 24 GB.
        result = heuristic_no_plan(problem([24e9]), "nsga", "no evaluated plan fits in memory", 0.5, 7)
        assert (result.status, result.plan, result.lower_bound, result.seed) == ("infeasible", None, None, 7)
        assert "block.1" in result.message and "24.0 GB" in result.message

    def test_not_proved_is_no_solution_and_says_so(self):
        result = heuristic_no_plan(problem([40e9, 40e9]), "nsga", "no evaluated plan fits in memory", 0.5, 7,
                                   details={"evaluations": 3})
        assert result.status == "timeout-no-solution" and result.plan is None
        assert result.message.startswith("no evaluated plan fits in memory; that does not prove")
        assert result.details == {"evaluations": 3} and result.wall_time == 0.5


class TestFirstCounts:
    @settings(max_examples=300, deadline=None)
    @given(st.integers(1, 5000), st.integers(1, 5000))
    def test_every_new_microbatch_size_brute_force(self, q, most):
        expected = [r for r in range(1, most + 1) if r == 1 or math.ceil(q / r) < math.ceil(q / (r - 1))]
        assert _first_counts(q, most) == expected
