"""Batched simulator: equal to the scalar one to the last bit on random plans of every schedule; falls back where it must."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from conftest import chain, cluster
from helpers import group_plan, program_instances, random_batch, random_program_batch
from pipeplan.models.errors import DeadlockError
from pipeplan.solver.evaluation.batched import BatchSimulator, Candidate, iteration_times, simulate_batch, timeline_arrays
from pipeplan.solver.evaluation.simulator import plan_costs, run_programs, simulate
from pipeplan.solver.formats.plan import Plan, Stage


def scalar(plans, graph, cluster_):
    """``(times, largest peaks, fits)`` of the scalar simulator; ``inf`` and no fit where a plan deadlocks."""
    times, peaks, fits = [], [], []
    for plan in plans:
        try:
            r = simulate(plan, graph, cluster_)
        except DeadlockError:
            times.append(np.inf), peaks.append(0.0), fits.append(False)
            continue
        times.append(r.iteration_time), peaks.append(max(r.peak_memory)), fits.append(r.fits)
    return times, peaks, fits


def assert_equal_to_scalar(res, plans, graph, cluster_):
    times, peaks, fits = scalar(plans, graph, cluster_)
    assert res.iteration_time.tolist() == times  # bit for bit, not approx
    assert res.peak_memory.tolist() == peaks
    assert res.fits.tolist() == fits


class TestSimulateBatch:
    @pytest.mark.parametrize("seed", range(60))
    def test_one_stage_per_group_equals_the_scalar_simulator(self, seed):
        graph, cluster_, plans = random_batch(seed)
        assert_equal_to_scalar(simulate_batch(plans, graph, cluster_), plans, graph, cluster_)

    @pytest.mark.parametrize("seed", range(60))
    def test_device_groups_running_programs_equal_the_scalar_simulator(self, seed):
        graph, cluster_, plans = random_program_batch(seed)
        res = simulate_batch(plans, graph, cluster_)
        assert_equal_to_scalar(res, plans, graph, cluster_)

    def test_named_version_2_schedules_are_batched(self):
        """Unequal splits (every stage alike, as the schedule requires), two groups of four stages."""
        plans = [group_plan([["d0"], ["d1"], ["d0"], ["d1"]], split, schedule="interleaved-zb")
                 for split in ([1, 1], [2, 2], [1, 3], [3, 1])]
        g, c = chain(4, step=0.25, act=3.0), cluster(2)
        res = BatchSimulator(g, c, "interleaved-zb", 0.0).evaluate([Candidate.from_plan(p) for p in plans])
        assert res.batched.all()
        assert_equal_to_scalar(res, plans, g, c)

    def test_per_stage_splits_under_custom_programs_are_batched(self):
        """Stage 1 splits differently in every plan: each waits for other sender microbatches, one order checked."""
        programs = [["0F0", "0F1", "2F0", "2F1", "2B0", "2B1", "0B0", "0B1"], ["1F0", "1F1", "1B0", "1B1"]]
        plans = [Plan("g", "c", 4, 0.0, "custom", (Stage((0, 1), ("d0",), (2, 2)), Stage((1, 2), ("d1",), split),
                                                     Stage((2, 3), ("d0",), (2, 2))),
                      custom_programs=tuple(map(tuple, programs))) for split in ([1, 3], [2, 2], [3, 1], [1, 3])]
        g, c = chain(3, out=1.0), cluster(2, bandwidth=1.0)
        res = simulate_batch(plans, g, c)
        assert res.batched.all()
        assert_equal_to_scalar(res, plans, g, c)

    def test_programs_sending_out_of_microbatch_order_with_differing_waits_fall_back(self):
        programs = [["0F1", "0F0", "0B0", "0B1"], ["1F0", "1F1", "1B0", "1B1"]]
        plans = [Plan("g", "c", 4, 0.0, "custom", (Stage((0, 1), ("d0",), (2, 2)), Stage((1, 2), ("d1",), split)),
                      custom_programs=tuple(map(tuple, programs))) for split in ([1, 3], [2, 2], [3, 1])]
        g, c = chain(2, out=1.0), cluster(2, bandwidth=1.0)
        res = simulate_batch(plans, g, c)
        assert not res.batched.any()
        assert_equal_to_scalar(res, plans, g, c)

    def test_copies_of_a_valid_plan_are_batched(self):
        for seed in range(20):
            graph, cluster_, plans = random_batch(seed)
            try:
                simulate(plans[0], graph, cluster_)
            except DeadlockError:
                continue
            assert simulate_batch([plans[0]] * 6, graph, cluster_).batched.all()

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(program_instances())
    def test_random_programs_equal_the_scalar_simulator(self, instance):
        graph, cluster_, plan, _ = instance
        assert_equal_to_scalar(simulate_batch([plan, plan], graph, cluster_), [plan, plan], graph, cluster_)


class TestBatchSimulator:
    def test_evaluate_matches_from_plan(self):
        graph, cluster_, plans = random_batch(11)
        sim = BatchSimulator(graph, cluster_, plans[0].schedule)
        res = sim.evaluate([Candidate.from_plan(p) for p in plans])
        ref = simulate_batch(plans, graph, cluster_)
        assert np.array_equal(res.iteration_time, ref.iteration_time)

    def test_overuse_sign_is_fit(self):
        graph, cluster_, plans = random_batch(12)
        res = BatchSimulator(graph, cluster_, plans[0].schedule).evaluate([Candidate.from_plan(p) for p in plans])
        finite = np.isfinite(res.iteration_time)
        assert np.array_equal(res.fits[finite], res.overuse[finite] <= 0)

    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_the_step_in_a_batch_of_one_stage_per_group_plans(self, schedule):
        """step 0.5 s per layer, speed 1: T = the time without steps + 0.5 * layers of the stage that ends last."""
        plans = [Plan("g", "c", 4, 4.0, schedule, (Stage((0, cut), ("d0",), split), Stage((cut, 4), ("d1",), split)))
                 for cut in (1, 2, 3) for split in ((2, 2), (1, 3))]
        g, c = chain(4, step=0.5), cluster(2)
        res = BatchSimulator(g, c, schedule).evaluate([Candidate.from_plan(p) for p in plans])
        assert res.batched.all()
        assert list(res.iteration_time) == [simulate(p, g, c).iteration_time for p in plans]
        no_step = [simulate(p, chain(4), c) for p in plans]
        assert [simulate(p, g, c).iteration_time for p in plans] == pytest.approx(
            [max(e + 0.5 * (hi - lo) for e, (lo, hi) in zip(r.stage_end, (st.layers for st in p.stages)))
             for r, p in zip(no_step, plans)])


class TestTimelineArrays:
    @pytest.mark.parametrize("make", [random_batch, random_program_batch])
    def test_equal_plans_one_sweep(self, make):
        graph, cluster_, plans = make(7)
        sim = BatchSimulator(graph, cluster_, plans[0].schedule)
        cand = Candidate.from_plan(plans[0])
        times, peaks, cap = timeline_arrays(sim.arrays([cand] * 5))
        try:
            expected = simulate(plans[0], graph, cluster_)
        except DeadlockError:
            return
        assert np.all(times == expected.iteration_time)
        assert peaks.shape == cap.shape == (5, len(plans[0].groups))
        assert peaks[0].tolist() == list(expected.peak_memory)


class TestIterationTimes:
    @pytest.mark.parametrize("seed", range(40))
    @pytest.mark.parametrize("make", [random_batch, random_program_batch])
    def test_equals_run_programs_exactly(self, seed, make):
        graph, cluster_, plans = make(seed)
        costs = [plan_costs(plan, graph, cluster_) for plan in plans]
        try:
            expected = [run_programs(c).iteration_time for c in costs]
        except DeadlockError:
            with pytest.raises(DeadlockError):
                iteration_times(costs)
            return
        assert iteration_times(costs).tolist() == expected  # bit for bit, not approx

    @pytest.mark.parametrize("seed", range(10))
    @pytest.mark.parametrize("make", [random_batch, random_program_batch])
    def test_copies_are_timed_together_and_alike(self, seed, make, monkeypatch):
        graph, cluster_, plans = make(seed)
        costs = plan_costs(plans[0], graph, cluster_)
        try:
            expected = run_programs(costs).iteration_time
        except DeadlockError:
            return
        monkeypatch.setattr("pipeplan.solver.evaluation.batched.run_programs", None)  # the batched path only
        assert iteration_times([costs] * 5).tolist() == [expected] * 5
