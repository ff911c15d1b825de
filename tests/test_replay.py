"""Replaying a run's measured op times through the simulator's timeline (``pipeplan.runtime.replay``).

Layers take F = n and B = 2n seconds for n samples and links are instantaneous (see
``conftest``), so the expected timelines can be worked out by hand.
"""

import pytest

from conftest import chain, cluster, plan
from helpers import rank
from pipeplan.runtime.replay import op_seconds, program_durations, program_recompute, replay
from pipeplan.solver.evaluation.simulator import simulate


def two_stage_prediction():
    """Two stages, one layer each, GPipe, m = 2 microbatches of 1: predicted T = 9 (see test_simulator)."""
    p = plan([(0, 1, ["d0"], [1, 1]), (1, 2, ["d1"], [1, 1])], batch=2)
    return simulate(p, chain(2), cluster(2))


class TestOpSeconds:
    def test_medians_of_ops_and_shortest_receive_per_direction(self):
        r = rank(1, [[("recv A0", 0.5), ("F0", 1.0), ("recv A1", 0.1)],
                     [("recv A0", 0.7), ("F0", 3.0), ("recv A1", 0.2)],
                     [("recv A0", 0.6), ("F0", 2.0), ("recv A1", 0.3)]])
        seen = op_seconds(r, [0, 1, 2])
        # F0: median of 1, 3, 2; every "recv A": the shortest span of that direction, 0.1.
        assert seen == pytest.approx({"recv A0": 0.1, "F0": 2.0, "recv A1": 0.1})

    def test_recorded_receive_cpu_wins_over_the_shortest_span(self):
        r = rank(1, [[("recv A0", 0.5), ("F0", 1.0), ("recv A1", 0.1)],
                     [("recv A0", 0.7), ("F0", 1.0), ("recv A1", 0.2)]])
        r["steps"][0]["receive_cpu"] = {"recv A0": 0.02, "recv A1": 0.04}
        r["steps"][1]["receive_cpu"] = {"recv A0": 0.04, "recv A1": 0.06}
        assert op_seconds(r, [0, 1]) == pytest.approx({"recv A0": 0.03, "F0": 1.0, "recv A1": 0.05})

    def test_only_the_given_steps_count(self):
        r = rank(0, [[("F0", 10.0)], [("F0", 1.0)]])
        assert op_seconds(r, [1]) == {"F0": 1.0}


class TestReplay:
    def test_measured_as_predicted_replays_the_prediction(self):
        prediction = two_stage_prediction()
        ranks = [rank(0, [[("F0", 1), ("F1", 1), ("B0", 2), ("B1", 2)]]),
                 rank(1, [[("F0", 1), ("F1", 1), ("B0", 2), ("B1", 2)]])]
        assert replay(ranks, [0], prediction).iteration_time == pytest.approx(prediction.iteration_time)

    def test_message_cpu_joins_the_op_next_to_it(self):
        """Stage 0: F = 1 + send 0.5, B = 2; stage 1: F = 1 + receive 0.25, B = 2 + send 0.5.

        Stage 0 runs F0 [0, 1.5], F1 [1.5, 3]; stage 1 F0 [1.5, 2.75], F1 [3, 4.25],
        B0 [4.25, 6.75], B1 [6.75, 9.25]; stage 0 B0 [6.75, 8.75], B1 [9.25, 11.25].
        """
        prediction = two_stage_prediction()
        ranks = [rank(0, [[("F0", 1), ("send A0", 0.5), ("F1", 1), ("send A1", 0.5), ("B0", 2), ("B1", 2)]]),
                 rank(1, [[("recv A0", 1.0), ("F0", 1), ("recv A1", 0.25), ("F1", 1),
                           ("B0", 2), ("send G0", 0.5), ("B1", 2), ("send G1", 0.5)]])]
        result = replay(ranks, [0], prediction)
        assert result.iteration_time == pytest.approx(11.25)
        assert [d for a, d in zip(result.groups[1].program, result.groups[1].durations) if a.kind == "F"] == \
            pytest.approx([1.25, 1.25])

    def test_slowest_replica_counts_and_missing_ops_take_no_time(self):
        p = plan([(0, 2, ["d0", "d1"], [2, 1])], batch=3)
        prediction = simulate(p, chain(2), cluster(2))
        ranks = [rank(0, [[("F0", 1), ("F1", 1), ("B0", 2), ("B1", 2)]]),
                 rank(0, [[("F0", 3), ("B0", 1)]])]  # its share of microbatch 1 is empty
        program = list(prediction.groups[0].program)  # F0 F1 B0 B1
        assert program_durations(ranks, [0], 0, program) == (3, 1, 2, 2)
        assert replay(ranks, [0], prediction).iteration_time == pytest.approx(3 + 1 + 2 + 2)

    def test_recompute_is_part_of_the_backward(self):
        p = plan([(0, 1, ["d0"], [1], True)], batch=1)
        prediction = simulate(p, chain(1), cluster(1))
        ranks = [rank(0, [[("F0", 1), ("R0", 1.5), ("B0", 2)]])]
        program = list(prediction.groups[0].program)  # F0 B0
        assert program_durations(ranks, [0], 0, program) == (1, 3.5)
        assert program_recompute(ranks, [0], 0, program) == (0.0, 1.5)
        result = replay(ranks, [0], prediction)
        assert result.iteration_time == pytest.approx(4.5) and result.groups[0].recompute == (0.0, 1.5)
