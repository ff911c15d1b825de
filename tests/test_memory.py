"""Peak memory helpers shared by the searches (solver/evaluation/memory.py)."""

from __future__ import annotations

import math

import numpy as np

import random

import pytest

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.evaluation.memory import (ROUNDING, StageMemory, StashWalk, group_peak_memory, program_stash_peak,
                                               range_peak_memory, settle_borderline, stash_points)
from pipeplan.solver.schedules.schedule import Action, stage_actions


def walked(program, stages):
    """The spec's walk (7.4), one action at a time: the reference the compiled walk must equal to the bit."""
    stash = peak = 0.0
    for s, kind, k in program:
        mem = stages[s]
        q = mem.per_replica[k]
        if kind == "F":
            stash += q * mem.stash
            peak = max(peak, stash)
        elif kind == "W":
            stash -= q * mem.weight
        else:
            peak = max(peak, stash + q * mem.working)
            stash -= q * mem.stash
            if kind == "I":
                stash += q * mem.weight
    return peak


class TestRangePeakMemory:
    def test_matches_the_peak_of_the_summed_layers(self):
        graph = LayerGraph.chain("g", [Layer(f"l{i}", (0.0, 1.0), (0.0, 2.0), 10.0 * (i + 1), 3.0, 1.0)
                                       for i in range(3)], input_bytes=5.0)
        program = stage_actions("1f1b", 3, 1, 2)
        for recompute in (False, True):
            got = range_peak_memory(graph, 4.0, 1, 3, program, [2, 2, 2], recompute)
            # layers 1..2: params 20 + 30, act 3 + 3, input bytes 1 (the out of layer 0)
            assert got == group_peak_memory(4.0, 50.0, program, {1: StageMemory.of((2, 2, 2), 6.0, 1.0, 6.0,
                                                                                    recompute)})
        # the last of two stages alternates F and B: one microbatch of 2 samples stashed at a time
        assert range_peak_memory(graph, 4.0, 1, 3, program, [2, 2, 2], False) == 200.0 + 2 * 6.0


class TestStashWalk:
    def test_hand_computed(self):
        """F0 F1 (stash 2 * 10 + 2 * 10), I0 trades 20 for 2 * 4, W0 drops 8, B1 drops 20: peak 40."""
        program = [Action(0, "F", 0), Action(0, "F", 1), Action(0, "I", 0), Action(0, "W", 0), Action(0, "B", 1)]
        assert StashWalk(program).peak({0: StageMemory((2, 2), 10.0, 0.0, 4.0)}) == 40.0

    def test_a_recomputing_backward_holds_its_working_set(self):
        program = stage_actions("gpipe", 2, 0, 1)  # F0 F1 B0 B1: stash 1, 4; B0 holds 4 + 10, B1 3 + 30
        assert StashWalk(program).peak({0: StageMemory((1, 3), 1.0, 10.0, 0.0)}) == 33.0

    @pytest.mark.parametrize("seed", range(30))
    def test_equals_the_spec_walk_to_the_bit(self, seed):
        """Random programs of two stages on one group, split and whole backwards, random bytes."""
        rng = random.Random(seed)
        todo, program = {}, []
        for s in range(2):
            for k in range(rng.randint(1, 4)):
                todo[(s, k)] = ["F", "I", "W"] if rng.random() < 0.5 else ["F", "B"]
        while todo:
            key = rng.choice(sorted(todo))
            program.append(Action(key[0], todo[key].pop(0), key[1]))
            if not todo[key]:
                del todo[key]
        counts = {s: 1 + max(a.microbatch for a in program if a.stage == s) for s in range(2)}
        stages = {s: StageMemory(tuple(rng.randint(1, 9) for _ in range(counts[s])), rng.uniform(0, 1e6),
                                 rng.choice([0.0, rng.uniform(0, 1e6)]), rng.uniform(0, 1e6)) for s in range(2)}
        assert StashWalk(program).peak(stages) == walked(program, stages)
        assert program_stash_peak(program, stages) == walked(program, stages)


class TestStashPoints:
    def test_points_give_the_peak(self):
        program = stage_actions("1f1b", 4, 0, 3)
        q = [3, 1, 4, 1]
        points = stash_points(program, q)
        for stash, working in ((7.0, 0.0), (2.0, 5.0)):
            assert max(stash * i + working * w for i, w in points) == walked(program, {0: StageMemory(tuple(q), stash,
                                                                                                      working, 0.0)})

    def test_split_backwards_are_refused(self):
        with pytest.raises(ValueError, match="F and B actions"):
            stash_points([Action(0, "F", 0), Action(0, "I", 0), Action(0, "W", 0)], [1])


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
