"""Batched simulator: agrees with the scalar one on random plans, falls back where it must."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeplan.models.errors import DeadlockError
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.evaluation.batched import BatchSimulator, Candidate, iteration_times, simulate_batch, stage_row, timeline_arrays
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.evaluation.simulator import run_timeline, simulate, stage_costs


def random_split(rng: random.Random, batch: int, m: int) -> tuple[int, ...]:
    ends = [0, *sorted(rng.sample(range(1, batch), m - 1)), batch]
    return tuple(b - a for a, b in zip(ends[:-1], ends[1:]))


def random_batch(seed: int):
    """Random graph, cluster and a batch of plans (per-stage splits, replicas, recompute)."""
    rng = random.Random(seed)
    n = rng.randint(1, 8)
    layers = [Layer(f"l{i}", (rng.uniform(0, 1e-4), rng.uniform(1e-4, 1e-3)), (rng.uniform(0, 2e-4),
                    rng.uniform(1e-4, 2e-3)), rng.uniform(1e6, 1e7), rng.uniform(1e5, 1e6), rng.uniform(1e4, 1e5))
              for i in range(n)]
    graph = LayerGraph.chain("g", layers, 1e4)
    cluster = Cluster("c", (Link(1e11, 1e-6, "s0"), Link(1e10, 2e-6, "s1")), Link(1e9, 1e-5),
                      tuple(Device(f"d{i}", f"s{i % 2}", rng.choice([1.0, 0.5]), rng.choice([1e8, 1e10]))
                            for i in range(6)))
    stages, schedule, batch = rng.randint(1, min(n, 3)), rng.choice(["gpipe", "1f1b"]), rng.randint(4, 12)
    counts = [rng.randint(1, min(5, batch)) for _ in range(stages)]
    shared = rng.random() < 0.4
    plans = []
    for _ in range(rng.randint(1, 15)):
        cuts = [0, *sorted(rng.sample(range(1, n), stages - 1)), n]
        devs = [f"d{i}" for i in range(6)]
        rng.shuffle(devs)
        split = random_split(rng, batch, counts[0])
        built = []
        for s in range(stages):
            group, devs = tuple(devs[:rng.randint(1, 2)]), devs[2:]
            built.append(Stage((cuts[s], cuts[s + 1]), group, split if shared else random_split(rng, batch, counts[s]),
                               rng.random() < 0.3))
        plans.append(Plan("g", "c", batch, 4.0, schedule, tuple(built)))
    return graph, cluster, plans


class TestSimulateBatch:
    @pytest.mark.parametrize("seed", range(60))
    def test_agrees_with_scalar(self, seed):
        graph, cluster, plans = random_batch(seed)
        res = simulate_batch(plans, graph, cluster)
        for i, plan in enumerate(plans):
            try:
                r = simulate(plan, graph, cluster)
            except DeadlockError:
                assert res.iteration_time[i] == np.inf and not res.fits[i]
                continue
            assert res.iteration_time[i] == pytest.approx(r.iteration_time, rel=1e-9, abs=0)
            assert res.peak_memory[i] == pytest.approx(max(r.peak_memory), rel=1e-9, abs=0)
            assert bool(res.fits[i]) == r.fits

    def test_custom_schedule_falls_back(self):
        graph, cluster, plans = random_batch(3)
        custom = Plan("g", "c", 4, 4.0, "custom", (Stage((0, len(graph)), ("d0",), (2, 2), False,
                                                           ("F0", "F1", "B1", "B0")),))
        res = simulate_batch([custom, custom], graph, cluster)
        assert not res.batched.any()
        assert res.iteration_time[0] == simulate(custom, graph, cluster).iteration_time

    def test_copies_of_a_valid_plan_are_batched(self):
        for seed in range(20):
            graph, cluster, plans = random_batch(seed)
            try:
                simulate(plans[0], graph, cluster)
            except DeadlockError:
                continue
            assert simulate_batch([plans[0]] * 6, graph, cluster).batched.all()


class TestBatchSimulator:
    def test_evaluate_matches_from_plan(self):
        graph, cluster, plans = random_batch(11)
        sim = BatchSimulator(graph, cluster, plans[0].schedule)
        res = sim.evaluate([Candidate.from_plan(p) for p in plans])
        ref = simulate_batch(plans, graph, cluster)
        assert np.array_equal(res.iteration_time, ref.iteration_time)

    def test_overuse_sign_is_fit(self):
        graph, cluster, plans = random_batch(12)
        res = BatchSimulator(graph, cluster, plans[0].schedule).evaluate([Candidate.from_plan(p) for p in plans])
        finite = np.isfinite(res.iteration_time)
        assert np.array_equal(res.fits[finite], res.overuse[finite] <= 0)


class TestTimelineArrays:
    def test_equal_plans_one_sweep(self):
        graph, cluster, plans = random_batch(7)
        sim = BatchSimulator(graph, cluster, plans[0].schedule)
        cand = Candidate.from_plan(plans[0])
        times, peaks, cap = timeline_arrays(sim.arrays([cand] * 5))
        try:
            expected = simulate(plans[0], graph, cluster).iteration_time
        except DeadlockError:
            return
        assert np.all(times == expected)
        assert peaks.shape == cap.shape == (5, len(cand.bounds))


class TestIterationTimes:
    @pytest.mark.parametrize("seed", range(40))
    def test_equals_run_timeline_exactly(self, seed):
        graph, cluster, plans = random_batch(seed)
        costs = [stage_costs(plan, graph, cluster) for plan in plans]
        rows = [[stage_row(c) for c in plan_costs] for plan_costs in costs]
        try:
            expected = [run_timeline(c, 0).iteration_time for c in costs]
        except DeadlockError:
            with pytest.raises(DeadlockError):
                iteration_times(rows, plans[0].schedule)
            return
        assert iteration_times(rows, plans[0].schedule).tolist() == expected  # bit for bit, not approx

    @pytest.mark.parametrize("seed", range(10))
    def test_copies_are_timed_together_and_alike(self, seed, monkeypatch):
        graph, cluster, plans = random_batch(seed)
        costs = stage_costs(plans[0], graph, cluster)
        try:
            expected = run_timeline(costs, 0).iteration_time
        except DeadlockError:
            return
        monkeypatch.setattr("pipeplan.solver.evaluation.batched.run_timeline", None)  # the batched path only
        assert iteration_times([[stage_row(c) for c in costs]] * 5, plans[0].schedule).tolist() == [expected] * 5
