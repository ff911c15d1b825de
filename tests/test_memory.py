"""Peak memory helpers shared by the searches (solver/evaluation/memory.py)."""

from __future__ import annotations

import math

import numpy as np

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.evaluation.memory import ROUNDING, range_peak_memory, settle_borderline, stage_peak_memory
from pipeplan.solver.schedules.schedule import stage_ops


class TestRangePeakMemory:
    def test_matches_the_stage_peak_of_the_summed_layers(self):
        graph = LayerGraph.chain("g", [Layer(f"l{i}", (0.0, 1.0), (0.0, 2.0), 10.0 * (i + 1), 3.0, 1.0)
                                       for i in range(3)], input_bytes=5.0)
        ops = stage_ops("1f1b", 3, 0, 2)
        for recompute in (False, True):
            got = range_peak_memory(graph, 4.0, 1, 3, ops, [2, 2, 2], recompute)
            assert got == stage_peak_memory(4.0, 50.0, ops, [2, 2, 2], 6.0, 1.0, recompute)


class TestSettleBorderline:
    def test_the_exact_sum_decides_inside_the_band_only(self):
        memory = 0.0
        for _ in range(7):
            memory += 0.1  # 0.7 exactly as the simulator adds it; 7 * 0.1 is one bit above
        peak = np.array([7 * 0.1, 7 * 0.1, memory * (1 + 10 * ROUNDING), 0.5])
        fits = peak <= memory
        asked = []

        def exact(i: int) -> float:
            asked.append(i)
            return memory
        out = settle_borderline(fits, peak, memory, np.array([True, False, True, True]), exact, scale=memory)
        assert out.tolist() == [True, False, False, True]
        assert asked == [0]  # not the non-candidate, not the peak far outside the band

    def test_a_borderline_peak_above_the_memory_is_refused(self):
        fits = settle_borderline(np.array([True]), np.array([1.0]), 1.0, np.array([True]), lambda i: 1.0 + 1e-15,
                                 scale=1.0)
        assert fits.tolist() == [False]

    def test_the_band_grows_with_the_operands(self):
        # a difference of two prefix sums near 1e12 is off by about 1e-4 however small the stage
        asked: list[int] = []
        peak = np.array([0.98 + 1e-5, 0.98 + 1e-5])
        settle_borderline(peak <= 0.98, peak, 0.98, np.array([True, True]), lambda i: asked.append(i) or 0.98,
                          scale=np.array([1e12, 1.0]))
        assert asked == [0]

    def test_sums_of_zeros_and_unbounded_memory_are_left_alone(self):
        def never(i: int) -> float:
            raise AssertionError("re-summed")
        fits = np.array([True, True])
        assert settle_borderline(fits, np.zeros(2), 0.0, np.array([True, True]), never, scale=0.0).tolist() == [True, True]
        assert settle_borderline(fits, np.zeros(2), math.inf, np.array([True, True]), never, scale=1.0).all()

    def test_writes_through_to_a_non_contiguous_array(self):
        grid = np.zeros((3, 3), dtype=bool)
        view = grid.T  # not C-contiguous: reshape(-1) would copy
        settle_borderline(view, np.full((3, 3), 1.0), 1.0, np.eye(3, dtype=bool), lambda i: 1.0, scale=1.0)
        assert view.diagonal().all() and grid.diagonal().all()
