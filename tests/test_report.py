"""runtime.report: what a run's measured time is compared with."""

from __future__ import annotations

import pytest

from conftest import cluster, make_layer
from pipeplan.models.graph import LayerGraph
from pipeplan.runtime.report import without_step
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.evaluation.simulator import simulate


class TestWithoutStep:
    """The prediction up to the all-reduce: the run does not time the optimizer step."""

    @staticmethod
    def _graph(step: float) -> LayerGraph:
        return LayerGraph.chain("g", [make_layer(0, step=step), make_layer(1, step=3 * step)])

    def test_two_stages_hand_computed(self):
        # 1 sample, fwd 1 s and bwd 2 s per layer: stage 0 ends at F0 1 + wait 3 + B0 2 = 6 s, stage 1 at 4 s;
        # steps 1 s (stage 0) and 3 s (stage 1): T = max(6 + 1, 4 + 3) = 7 s, without them 6 s
        plan = Plan("g", "c", 1, 4.0, "1f1b", (Stage((0, 1), ("d0",), (1,)), Stage((1, 2), ("d1",), (1,))))
        result = simulate(plan, self._graph(1.0), cluster(2))
        assert result.iteration_time == pytest.approx(7.0)
        assert without_step(result) == pytest.approx(6.0)

    def test_group_plan(self):
        # interleaved on one group of one device: 2 stages, 1 microbatch, work 1+1+2+2 = 6 s, step 1 + 3 = 4 s
        plan = Plan("g", "c", 1, 4.0, "interleaved-1f1b", (Stage((0, 1), ("d0",), (1,)), Stage((1, 2), ("d0",), (1,))))
        result = simulate(plan, self._graph(1.0), cluster(1))
        assert result.iteration_time == pytest.approx(10.0)
        assert without_step(result) == pytest.approx(6.0)

    def test_no_step_is_the_iteration_time(self):
        plan = Plan("g", "c", 1, 4.0, "gpipe", (Stage((0, 2), ("d0",), (1,)),))
        result = simulate(plan, self._graph(0.0), cluster(1))
        assert without_step(result) == result.iteration_time
