"""The ``piper`` and ``megatron`` baselines: hand-computed cases and Piper's DP against brute force."""

from __future__ import annotations

import itertools
import math

import pytest

from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.baselines.megatron import Megatron, block_span, megatron_bounds
from pipeplan.solver.baselines.piper import Piper, PiperView, piper_dp, stage_estimate
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit
from helpers import piper_problem


def uniform(layers: int = 4, speeds=(1.0, 1.0), memory: float = 1e12, act: float = 1e3, names=None,
            **kw) -> PlanningProblem:
    """``layers`` identical layers (F 1 ms, B 2 ms per sample, 1 MB params) on one server, batch 16, M 8."""
    names = names or [f"l{i}" for i in range(layers)]
    g = LayerGraph.chain("u", [Layer(n, (0.0, 1e-3), (0.0, 2e-3), 1e6, act, 1e3) for n in names], 1e3)
    c = Cluster("c", (Link(1e12, 0.0, "s0"),), Link(1e10, 0.0),
                tuple(Device(f"g{i}", "s0", sp, memory) for i, sp in enumerate(speeds)))
    return PlanningProblem(g, c, global_batch=16, microbatches=8, **kw)


def chain(names: list[str]) -> LayerGraph:
    return LayerGraph.chain("g", [Layer(n, (0.0, 1.0), (0.0, 1.0), 1.0, 1.0, 1.0) for n in names])


class TestPiperView:
    def test_homogeneous_view_of_a_mixed_cluster(self):
        view = PiperView(uniform(speeds=(1.0, 0.5, 2.0)))
        assert view.speed == 0.5 and view.memory == 1e12 and view.bandwidth == 1e12
        assert view.max_devices == 3 and view.degrees() == [1, 2]   # divisors of M = 8 up to 3

    def test_one_device_has_no_bandwidth_limit(self):
        assert PiperView(uniform(speeds=(1.0,))).bandwidth == math.inf

    def test_in_flight_follows_the_schedule(self):
        assert PiperView(uniform()).in_flight(3, 2) == 2
        assert PiperView(uniform(schedule="gpipe")).in_flight(3, 2) == 8

    def test_no_replication_means_degree_one(self):
        assert PiperView(uniform(speeds=(1.0,) * 4, allow_replication=False)).degrees() == [1]


class TestStageEstimate:
    def test_plain_stage(self):
        # 8 microbatches of 2 samples, 2 layers: F 8*2*2 ms = 32 ms, B 64 ms; the cut after
        # layer 1 carries 1e3 B/sample both ways: 2 * 1e3 * 16 / 1e12 s.
        time, recompute = stage_estimate(PiperView(uniform()), 0, 2, 1, 1)
        assert time == pytest.approx(0.096 + 3.2e-8, rel=1e-12) and not recompute

    def test_replicated_stage_pays_the_resync(self):
        # d = 2: one sample per replica, half the compute; edges / 2 plus 4 * (2-1) * 2e6 / 2 bytes.
        time, _ = stage_estimate(PiperView(uniform()), 0, 2, 2, 2)
        assert time == pytest.approx(0.048 + (16000 + 4e6) / 1e12, rel=1e-12)

    def test_recompute_when_the_plain_stage_does_not_fit(self):
        # act 1e4/layer: plain stash 2e4 * 2 samples * ceil(2/1) = 8e4 B; recompute stash
        # 1e3 * 2 * 2 = 4e3 plus one microbatch's 4e4 B working set.  State 4 * 2e6.
        view = PiperView(uniform(memory=8e6 + 5e4, act=1e4))
        time, recompute = stage_estimate(view, 0, 2, 1, 2)
        assert recompute and time == pytest.approx(0.096 + 0.032 + 3.2e-8, rel=1e-12)
        assert stage_estimate(PiperView(uniform(memory=8e6 + 5e4, act=1e4, allow_recompute=False)),
                              0, 2, 1, 2) is None

    def test_nothing_fits(self):
        assert stage_estimate(PiperView(uniform(memory=1e6)), 0, 2, 1, 1) is None


def brute_force(problem: PlanningProblem) -> float:
    """The minimum of Piper's formula over every stage range, degree and device sum."""
    view = PiperView(problem)
    L, best = len(problem.graph), math.inf
    for count in range(1, problem.stage_limit + 1):
        for cuts in itertools.combinations(range(1, L), count - 1):
            bounds = list(zip((0, *cuts), (*cuts, L)))
            for degs in itertools.product(view.degrees(), repeat=count):
                if sum(degs) > view.max_devices:
                    continue
                times = []
                for s_idx, (lo, hi) in enumerate(bounds):
                    est = stage_estimate(view, lo, hi, degs[s_idx], sum(degs[s_idx:]))
                    times.append(math.inf if est is None else est[0])
                best = min(best, max(times))
    return best


class TestPiperDp:
    def test_two_even_stages_beat_replication(self):
        # One stage on 2 replicas: 96 ms + 4 * 4e6 / 2 / 1e12 s resync; two stages: 96 ms + 3.2e-8 s.
        choice = piper_dp(uniform())
        assert choice.bounds == ((0, 2), (2, 4)) and choice.degrees == (1, 1)
        assert choice.bottleneck == pytest.approx(0.096 + 3.2e-8, rel=1e-12)

    def test_ignores_device_speeds(self):
        # Piper sees one device type, so a 4x faster device changes nothing in its split.
        assert piper_dp(uniform(speeds=(4.0, 1.0))).bounds == ((0, 2), (2, 4))

    @pytest.mark.parametrize("seed", range(40))
    def test_minimum_of_its_own_formula(self, seed):
        problem = piper_problem(seed)
        choice, expected = piper_dp(problem), brute_force(problem)
        if choice is None:
            assert expected == math.inf
            return
        assert choice.bottleneck == pytest.approx(expected, rel=1e-12)
        view = PiperView(problem)
        own = [stage_estimate(view, lo, hi, d, sum(choice.degrees[i:]))[0]
               for i, ((lo, hi), d) in enumerate(zip(choice.bounds, choice.degrees))]
        assert max(own) == pytest.approx(choice.bottleneck, rel=1e-12)
        assert len(choice.bounds) <= problem.stage_limit and sum(choice.degrees) <= view.max_devices

    def test_deadline_in_the_past_gives_nothing(self):
        assert piper_dp(uniform(), deadline=TimeLimit(0.0)) is None


class TestPiperSolve:
    def test_plan_is_the_dp_choice_on_the_fastest_devices(self):
        problem = uniform(speeds=(1.0, 4.0, 2.0))
        result = Piper().solve(problem)
        choice = piper_dp(problem)
        assert result.status == "feasible" and result.lower_bound is None
        assert tuple(st.layers for st in result.plan.stages) == choice.bounds
        assert [st.devices for st in result.plan.stages][0] == ("g1",)   # fastest first
        assert result.iteration_time == pytest.approx(problem.evaluate(result.plan).iteration_time)

    def test_infeasible_when_nothing_fits(self):
        result = Piper().solve(uniform(memory=1e6))
        assert result.status == "infeasible" and result.plan is None


class TestBlockSpan:
    def test_embedding_blocks_head(self):
        assert block_span(chain(["embed", "block.0", "block.1", "block.2", "head"])) == (1, 4)

    def test_no_numbered_layer_means_all_blocks(self):
        assert block_span(chain(["a", "b", "c"])) == (0, 3)

    def test_most_common_prefix_wins(self):
        assert block_span(chain(["stem.0", "layer.0", "layer.1", "layer.2", "fc"])) == (1, 4)


class TestMegatronBounds:
    def test_gpt1_on_four_stages(self):
        names = ["embed"] + [f"block.{i}" for i in range(12)] + ["head"]
        assert megatron_bounds(chain(names), 4) == ((0, 4), (4, 7), (7, 10), (10, 14))

    def test_refuses_an_uneven_block_count(self):
        names = ["embed"] + [f"block.{i}" for i in range(12)] + ["head"]
        assert megatron_bounds(chain(names), 5) is None

    def test_one_stage(self):
        assert megatron_bounds(chain(["a", "b"]), 1) == ((0, 2),)


class TestMegatronSolve:
    def test_devices_in_file_order(self):
        # The slow device comes first in the file: Megatron still gives it stage 0.
        problem = uniform(speeds=(0.5, 1.0), allow_replication=False)
        result = Megatron().solve(problem)
        assert result.status == "feasible" and result.plan.stages[0].devices == ("g0",)

    def test_fastest_of_its_configurations(self):
        # Blocks b.0..b.3 between embed and head: S = 1 (d = 1, 2) or S = 2 (d = 1) on 2 devices.
        names = ["embed", "b.0", "b.1", "b.2", "b.3", "head"]
        problem = uniform(names=names)
        result = Megatron().solve(problem)
        candidates = [problem.make_plan(((0, 6),), (("g0",),)), problem.make_plan(((0, 6),), (("g0", "g1"),)),
                      problem.make_plan(((0, 3), (3, 6)), (("g0",), ("g1",)))]
        assert result.iteration_time == pytest.approx(min(problem.evaluate(p).iteration_time for p in candidates))
        assert result.details["proposals"] == 3
