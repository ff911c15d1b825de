"""Peak memory helpers shared by the searches (solver/memory.py)."""

from __future__ import annotations

import numpy as np

from models.graph import Layer, LayerGraph
from solver.memory import ROUNDING, range_peak_memory, settle_borderline, stage_peak_memory
from solver.schedule import stage_ops


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
        out = settle_borderline(fits, peak, memory, np.array([True, False, True, True]), exact)
        assert out.tolist() == [True, False, False, True]
        assert asked == [0]  # not the non-candidate, not the peak far outside the band

    def test_a_borderline_peak_above_the_memory_is_refused(self):
        fits = settle_borderline(np.array([True]), np.array([1.0]), 1.0, np.array([True]), lambda i: 1.0 + 1e-15)
        assert fits.tolist() == [False]
