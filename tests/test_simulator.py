"""The simulator against hand-computed iteration times and memory peaks.

Unless a test says otherwise, layers take F = n and B = 2n seconds for n samples and
links are instantaneous, so the arithmetic can be done by hand in the docstrings.
"""

import pytest

from conftest import chain, cluster, make_layer, plan
from pipeplan.models.errors import DeadlockError
from pipeplan.models.graph import LayerGraph
from pipeplan.solver.evaluation.simulator import check_deadlock_free, simulate


def flat(pairs):
    return [x for pair in pairs for x in pair]


def stages_of(n_stages, split, layers_per_stage=1):
    return [(s * layers_per_stage, (s + 1) * layers_per_stage, [f"d{s}"], split) for s in range(n_stages)]


class TestTextbookSchedules:
    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_uniform_pipeline_takes_m_plus_s_minus_1_slots(self, schedule):
        """S=3, m=4, f=1, b=2: T = (m + S - 1)(f + b) = 6 * 3 = 18."""
        result = simulate(plan(stages_of(3, [1, 1, 1, 1]), batch=4, schedule=schedule), chain(3), cluster(3))
        assert result.iteration_time == pytest.approx(18.0)
        assert result.busy == pytest.approx((12.0, 12.0, 12.0))
        assert result.bubble_fraction == pytest.approx(1 - 36 / 54)
        assert result.throughput == pytest.approx(4 / 18)

    def test_gpipe_op_times_stage_by_stage(self):
        """Two stages, m=2: stage 1 runs F0 [1,2], F1 [2,3], B0 [3,5], B1 [5,7]."""
        result = simulate(plan(stages_of(2, [1, 1]), batch=2), chain(2), cluster(2))
        assert flat(result.op_times[1]) == pytest.approx(flat(((1, 2), (2, 3), (3, 5), (5, 7))))
        assert flat(result.op_times[0]) == pytest.approx(flat(((0, 1), (1, 2), (5, 7), (7, 9))))

    @pytest.mark.parametrize("schedule, peaks", [
        # act 10 B/sample, 1 sample per microbatch, 2 stages x 1 layer, 3 microbatches.
        # GPipe stashes all 3; 1F1B stashes S - s = 2 on stage 0 and 1 on stage 1.
        ("gpipe", (30.0, 30.0)),
        ("1f1b", (20.0, 10.0)),
    ])
    def test_stash_peak(self, schedule, peaks):
        g = chain(2, act=10.0)
        result = simulate(plan(stages_of(2, [1, 1, 1]), batch=3, schedule=schedule), g, cluster(2))
        assert result.peak_memory == pytest.approx(peaks)

    def test_state_memory(self):
        g = chain(2, params=100.0)
        result = simulate(plan(stages_of(2, [1]), batch=1, state_factor=4.0), g, cluster(2, memory=400.0))
        assert result.peak_memory == (400.0, 400.0) and result.fits
        tight = simulate(plan(stages_of(2, [1]), batch=1, state_factor=4.0), g, cluster(2, memory=399.0))
        assert not tight.fits


class TestUnequalSplits:
    def test_one_big_sender_many_small_receivers(self):
        """Stage 0 splits 4 as [4], stage 1 as [2, 2]; stage 1 layer F = 1 + n, B = 1 + 2n.

        Stage 0: F0 [0,4].  Stage 1 waits for it: F0 [4,7], F1 [7,10], B0 [10,15],
        B1 [15,20].  Stage 0's B0 needs both gradients: [20, 28].
        """
        g = LayerGraph.chain("g", [make_layer(0), make_layer(1, fwd=(1, 1), bwd=(1, 2))])
        p = plan([(0, 1, ["d0"], [4]), (1, 2, ["d1"], [2, 2])], batch=4)
        result = simulate(p, g, cluster(2))
        assert flat(result.op_times[1]) == pytest.approx(flat(((4, 7), (7, 10), (10, 15), (15, 20))))
        assert result.iteration_time == pytest.approx(28.0)

    def test_partial_overlap_waits_for_every_overlapping_microbatch(self):
        """Stage 0 [1, 3]: F0 [0,1], F1 [1,4]. Stage 1 [2, 2]: its F0 (samples 0-1) overlaps
        both, so it starts at 4: F0 [4,6], F1 [6,8], B0 [8,12], B1 [12,16].
        Stage 0 B0 (sample 0) needs only gradient 0: max(4, 12) -> [12, 14];
        B1 (samples 1-3) needs both: [16, 22]."""
        p = plan([(0, 1, ["d0"], [1, 3]), (1, 2, ["d1"], [2, 2])], batch=4)
        result = simulate(p, chain(2), cluster(2))
        assert result.op_times[1][0] == pytest.approx((4, 6))
        assert flat(result.op_times[0]) == pytest.approx(flat(((0, 1), (1, 4), (12, 14), (16, 22))))
        assert result.iteration_time == pytest.approx(22.0)


class TestTransfers:
    def test_busy_link_queues_transfers_fifo(self):
        """Devices on two servers, network 1/3 B/s, latency 0.5 s, 1 B/sample across the cut:
        each transfer of one sample takes 3.5 s.  Stage 0 (F = n, B = n) finishes F0..F2
        at 1, 2, 3; activations arrive at 4.5, 8, 11.5 (the link is busy).  Stage 1:
        F [4.5,5.5] [8,9] [11.5,12.5], B [12.5,13.5] [13.5,14.5] [14.5,15.5]; gradients
        arrive at 17, 20.5, 24; stage 0 B [17,18] [20.5,21.5] [24,25]."""
        g = chain(2, bwd=(0, 1), out=1.0)
        c = cluster(2, servers=2, network_bw=1 / 3, network_lat=0.5)
        result = simulate(plan(stages_of(2, [1, 1, 1]), batch=3), g, c)
        assert flat(result.transfer_times[0]) == pytest.approx(flat(((1, 4.5), (4.5, 8), (8, 11.5))))
        assert flat(result.gradient_times[0]) == pytest.approx(flat(((13.5, 17), (17, 20.5), (20.5, 24))))
        assert flat(result.op_times[0][3:]) == pytest.approx(flat(((17, 18), (20.5, 21.5), (24, 25))))
        assert result.iteration_time == pytest.approx(25.0)

    @pytest.mark.parametrize("replicas, seconds", [((2, 1), 4.0), ((2, 2), 2.0), ((1, 2), 4.0)])
    def test_transfer_divides_by_the_smaller_replica_count(self, replicas, seconds):
        """4 samples x 1 B over 1 B/s: 4 s, halved when both sides have 2 replicas."""
        r0, r1 = replicas
        devs = [f"d{i}" for i in range(r0 + r1)]
        g = chain(2, fwd=(0, 0), bwd=(0, 0), out=1.0)
        c = cluster(len(devs), servers=1, bandwidth=1.0)
        p = plan([(0, 1, devs[:r0], [4]), (1, 2, devs[r0:], [4])], batch=4, state_factor=0)
        result = simulate(p, g, c)
        start, end = result.transfer_times[0][0]
        assert end - start == pytest.approx(seconds)


class TestReplication:
    def test_all_reduce_after_the_last_op(self):
        """One stage on 2 devices (bw 100 B/s, latency 0.1 s), params 1000 B, batch split [3, 1]:
        per replica q = 2 and 1, so F 2 + 1 and B 4 + 2: 9 s of ops.
        AR = 2(r-1)(lat + P/(r bw)) = 2(0.1 + 5) = 10.2 s; T = 19.2 s.
        Memory: state 4 * 1000 + stash 10 B/sample * (2 + 1) = 4030."""
        g = chain(1, params=1000.0, act=10.0)
        c = cluster(2, bandwidth=100.0, latency=0.1)
        result = simulate(plan([(0, 1, ["d0", "d1"], [3, 1])], batch=4), g, c)
        assert result.allreduces[0].start == pytest.approx(9.0)
        assert result.stages[0].allreduce == pytest.approx(10.2)
        assert result.iteration_time == pytest.approx(19.2)
        assert result.peak_memory == pytest.approx((4030.0,))

    def test_slowest_replica_sets_the_pace(self):
        c = cluster(2, speed=[1.0, 0.5])
        result = simulate(plan([(0, 1, ["d0", "d1"], [2])], batch=2, state_factor=0), chain(1), c)
        assert result.iteration_time == pytest.approx((1 + 2) / 0.5)


class TestRecompute:
    def test_backward_repeats_the_forward_and_holds_activations(self):
        """F = 1 + n, B = 1 + 2n (+ F again): per microbatch of 1, F = 2, B = 5.
        GPipe with [1, 1]: 2 + 2 + 5 + 5 = 14 s.
        Memory: the stash holds inputs (10 B/sample): 20 after both forwards; during B0
        the working set adds 1 * act = 100: peak 120.  Without recompute: 2 * 100."""
        g = chain(1, fwd=(1, 1), bwd=(1, 2), act=100.0, input_bytes=10.0)
        on = simulate(plan([(0, 1, ["d0"], [1, 1], True)], batch=2, state_factor=0), g, cluster(1))
        off = simulate(plan([(0, 1, ["d0"], [1, 1], False)], batch=2, state_factor=0), g, cluster(1))
        assert on.iteration_time == pytest.approx(14.0) and off.iteration_time == pytest.approx(10.0)
        assert on.peak_memory == pytest.approx((120.0,)) and off.peak_memory == pytest.approx((200.0,))
        assert on.ops[2].recompute == pytest.approx(2.0)

    def test_later_stage_recompute_stashes_the_cut_bytes(self):
        g = chain(2, act=100.0, out=7.0)
        p = plan([(0, 1, ["d0"], [1]), (1, 2, ["d1"], [1], True)], batch=1, state_factor=0)
        assert simulate(p, g, cluster(2)).peak_memory == pytest.approx((100.0, 7.0 + 100.0))


class TestDeadlock:
    def bad_plan(self):
        # 1F1B stage 0 takes B0 after F0, F1; stage 1's single microbatch needs all 4 samples.
        return plan([(0, 1, ["d0"], [1, 1, 1, 1]), (1, 2, ["d1"], [4])], batch=4, schedule="1f1b")

    def test_names_the_stage_the_op_and_what_it_waits_for(self):
        with pytest.raises(DeadlockError) as info:
            simulate(self.bad_plan(), chain(2), cluster(2), file="p.json")
        err = info.value
        assert err.file == "p.json" and err.where == "stages[0].ops[2]"
        assert "stage 0 op B0 waits for the gradients of microbatch 0 of stage 1" in err.what
        assert "stage 1 op F0 waits for the activations of microbatch 2 of stage 0" in err.what

    def test_custom_order_can_deadlock_without_costs(self):
        p = plan([(0, 1, ["d0"], [1, 1], False, ["F0", "B0", "F1", "B1"]),
                  (1, 2, ["d1"], [1, 1], False, ["F0", "F1", "B0", "B1"])], batch=2, schedule="custom")
        with pytest.raises(DeadlockError, match="stage 0 op B0"):
            check_deadlock_free(p)

    def test_gpipe_with_the_same_splits_runs(self):
        p = plan([(0, 1, ["d0"], [1, 1, 1, 1]), (1, 2, ["d1"], [4])], batch=4, schedule="gpipe")
        check_deadlock_free(p)
        assert simulate(p, chain(2), cluster(2)).iteration_time == pytest.approx(4 + 4 + 8 + 4 * 2)


class TestTimeline:
    def test_every_op_transfer_and_allreduce_is_listed(self):
        p = plan([(0, 1, ["d0", "d1"], [1, 1]), (1, 2, ["d2"], [2])], batch=2)
        result = simulate(p, chain(2, params=1.0), cluster(3))
        assert len(result.ops) == 4 + 2
        assert sorted((t.direction, t.microbatch) for t in result.transfers) == [("bwd", 0), ("fwd", 0), ("fwd", 1)]
        assert [a.stage for a in result.allreduces] == [0]
        assert result.iteration_time == pytest.approx(max(result.stage_end))


class TestStageCostsCache:
    @pytest.mark.parametrize("seed", range(30))
    def test_cached_costs_equal_fresh_ones(self, seed):
        """Every split of random problems onto rotating device groups, all through one cache."""
        import itertools

        from pipeplan.solver.evaluation.simulator import stage_costs
        from helpers import random_problem
        problem = random_problem(seed, memory=1e12)
        ids = [d.id for d in problem.cluster.devices]
        L, cache = len(problem.graph), {}
        for stages in range(1, min(L, len(ids)) + 1):
            for cuts in itertools.combinations(range(1, L), stages - 1):
                ends = list(cuts) + [L]
                bounds = list(zip([0] + ends[:-1], ends))
                for shift in range(len(ids)):
                    groups = [(ids[(s + shift) % len(ids)],) for s in range(stages)]
                    for recompute in ([False] * stages, [s % 2 == 0 for s in range(stages)]):
                        p = problem.make_plan(bounds, groups, recompute)
                        fresh = stage_costs(p, problem.graph, problem.cluster)
                        assert stage_costs(p, problem.graph, problem.cluster, cache) == fresh
