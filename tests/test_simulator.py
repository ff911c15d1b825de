"""The simulator (spec sections 4, 5 and 7) against hand-computed cases and an independent reference.

Unless a test says otherwise, layers take F = n and B = 2n seconds for n samples, the
weight-gradient half of B is n (``bwd_w`` absent: ``bwd / 2``), links are
instantaneous and there is one device per group, so the arithmetic can be done by hand
in the docstrings.  A plan of one stage per device group is the version-1 case.

The reference at the end is a discrete-event loop written from the spec's words: a
clock jumps from event to event, groups start their next action when it is idle and
the action's inputs are in, every ordered pair of groups has a FIFO queue of
transfers.  It shares no code with the simulator's sweep.
"""

import heapq
import itertools
import math
from collections import defaultdict, deque

import pytest
from hypothesis import HealthCheck, assume, given, settings

from conftest import chain, cluster, make_layer, plan
from helpers import SLOW, flat, group_plan, program_instances, random_batch
from pipeplan.models.errors import DeadlockError
from pipeplan.models.graph import LayerGraph
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.schedules.schedule import group_programs
from pipeplan.solver.evaluation.simulator import check_deadlock_free, plan_costs, simulate


def stages_of(n_stages, split, layers_per_stage=1):
    return [(s * layers_per_stage, (s + 1) * layers_per_stage, [f"d{s}"], split) for s in range(n_stages)]


def link_times(result, cut, direction):
    """``(start, end)`` of the transfers across ``cut`` in ``direction``, by microbatch."""
    return [(t.start, t.end) for t in sorted(result.transfers, key=lambda t: t.microbatch)
            if t.cut == cut and t.direction == direction]


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
        assert flat(result.action_times[1]) == pytest.approx(flat(((1, 2), (2, 3), (3, 5), (5, 7))))
        assert flat(result.action_times[0]) == pytest.approx(flat(((0, 1), (1, 2), (5, 7), (7, 9))))

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
        assert flat(result.action_times[1]) == pytest.approx(flat(((4, 7), (7, 10), (10, 15), (15, 20))))
        assert result.iteration_time == pytest.approx(28.0)

    def test_partial_overlap_waits_for_every_overlapping_microbatch(self):
        """Stage 0 [1, 3]: F0 [0,1], F1 [1,4]. Stage 1 [2, 2]: its F0 (samples 0-1) overlaps
        both, so it starts at 4: F0 [4,6], F1 [6,8], B0 [8,12], B1 [12,16].
        Stage 0 B0 (sample 0) needs only gradient 0: max(4, 12) -> [12, 14];
        B1 (samples 1-3) needs both: [16, 22]."""
        p = plan([(0, 1, ["d0"], [1, 3]), (1, 2, ["d1"], [2, 2])], batch=4)
        result = simulate(p, chain(2), cluster(2))
        assert result.action_times[1][0] == pytest.approx((4, 6))
        assert flat(result.action_times[0]) == pytest.approx(flat(((0, 1), (1, 4), (12, 14), (16, 22))))
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
        assert flat(link_times(result, 0, "fwd")) == pytest.approx(flat(((1, 4.5), (4.5, 8), (8, 11.5))))
        assert flat(link_times(result, 0, "bwd")) == pytest.approx(flat(((13.5, 17), (17, 20.5), (20.5, 24))))
        assert flat(result.action_times[0][3:]) == pytest.approx(flat(((17, 18), (20.5, 21.5), (24, 25))))
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
        start, end = link_times(result, 0, "fwd")[0]
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
        assert [(e.kind, e.start) for e in result.syncs] == [("allreduce", pytest.approx(9.0))]
        assert result.groups[0].allreduce == pytest.approx(10.2)
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


class TestLocalHandOver:
    def test_two_stages_on_one_group_exchange_nothing(self):
        """looped-bfs, R=1, v=2, m=2: 0F0 0F1 1F0 1F1 1B1 1B0 0B1 0B0, F=1, B=2 each, no transfer: T = 4+8."""
        p = group_plan([["d0"], ["d0"]], [1, 1], schedule="looped-bfs")
        result = simulate(p, chain(2, out=1e9), cluster(1, bandwidth=SLOW))
        assert result.iteration_time == pytest.approx(12.0)
        assert flat(result.action_times[0]) == pytest.approx(flat(
            ((0, 1), (1, 2), (2, 3), (3, 4), (4, 6), (6, 8), (8, 10), (10, 12))))
        assert result.transfers == ()

    def test_step_follows_the_last_action(self):
        """The same with step = 0.5 s per layer on a device of speed 2: STEP = 1.0 / 2 after T = 6."""
        p = group_plan([["d0"], ["d0"]], [1, 1], schedule="looped-bfs")
        result = simulate(p, chain(2, step=0.5), cluster(1, speed=2.0))
        assert result.iteration_time == pytest.approx(6.0 + 0.5)
        assert result.groups[0].step == pytest.approx(0.5)
        assert [(e.kind, e.start, e.end) for e in result.syncs] == [("step", 6.0, 6.5)]

    def test_memory_of_both_stages_adds_up(self):
        """act 10 B/sample, params 100 B per layer, state factor 2: 4 F stash 40 B, state 2 * 200."""
        p = group_plan([["d0"], ["d0"]], [1, 1], schedule="looped-bfs", state_factor=2.0)
        result = simulate(p, chain(2, act=10.0, params=100.0), cluster(1))
        assert result.peak_memory == pytest.approx((440.0,))


class TestSplitBackward:
    def graph(self, **kw):
        """F = 1, B = 3 of which W = 1 (I = 2); act 10, act_w 4 B/sample; input 2 B/sample."""
        return LayerGraph.chain("g", [make_layer(0, fwd=(1.0, 0.0), bwd=(3.0, 0.0), bwd_w=(1.0, 0.0), act=10.0,
                                                 act_w=4.0, **kw)], input_bytes=2.0)

    def test_i_and_w_take_their_halves(self):
        """0F0 0I0 0F1 0I1 0W0 0W1: 1 + 2 + 1 + 2 + 1 + 1 = 8."""
        p = group_plan([["d0"]], [1, 1], programs=[["0F0", "0I0", "0F1", "0I1", "0W0", "0W1"]])
        result = simulate(p, self.graph(), cluster(1))
        assert result.iteration_time == pytest.approx(8.0)
        assert [e.kind for e in result.ops] == ["F", "I", "F", "I", "W", "W"]
        assert flat(result.action_times[0]) == pytest.approx(flat(
            ((0, 1), (1, 3), (3, 4), (4, 6), (6, 7), (7, 8))))

    def test_i_keeps_act_w_until_its_w(self):
        """Stash: F0 10, I0 -> 4, F1 14, I1 -> 8, W0 4, W1 0: peak 14."""
        p = group_plan([["d0"]], [1, 1], programs=[["0F0", "0I0", "0F1", "0I1", "0W0", "0W1"]])
        assert simulate(p, self.graph(), cluster(1)).peak_memory == pytest.approx((14.0,))

    def test_recomputing_i_holds_the_activations_while_it_runs(self):
        """Recompute: F stashes the input (2); I runs with 10 more, then keeps act_w (4).

        F0 2; I0 runs at 2 + 10 = 12, ends at 4; F1 6; I1 runs at 6 + 10 = 16: peak 16.
        I takes TI + TF = 3, so T = 1 + 3 + 1 + 3 + 1 + 1 = 10.
        """
        p = group_plan([["d0"]], [1, 1], programs=[["0F0", "0I0", "0F1", "0I1", "0W0", "0W1"]], recompute=True)
        result = simulate(p, self.graph(), cluster(1))
        assert result.peak_memory == pytest.approx((16.0,))
        assert result.iteration_time == pytest.approx(10.0)

    def test_a_recomputing_i_leaves_act_w_not_the_input(self):
        """Recompute, input 1 B/sample: F0 1, I0 runs at 1 + 10 = 11 and leaves act_w; then F1 and 0B1.

        act_w 4: I0 leaves 4, F1 5, B1 runs at 5 + 10 = 15.  act_w 9: I0 leaves 9, F1 10, B1 runs at 20.
        """
        for act_w, peak in ((4.0, 15.0), (9.0, 20.0)):
            g = LayerGraph.chain("g", [make_layer(0, act=10.0, act_w=act_w)], input_bytes=1.0)
            p = group_plan([["d0"]], [1, 1], programs=[["0F0", "0I0", "0F1", "0B1", "0W0"]], recompute=True)
            assert simulate(p, g, cluster(1)).peak_memory == pytest.approx((peak,))

    def test_per_stage_ops_with_i_and_w(self):
        """A /2 custom plan may keep per-stage ops when each group holds one stage: 2 stages, m=1.

        Stage 0: F0 [0,1]; stage 1: F0 [1,2], I0 [2,3] (I = B - W = 1); stage 0: I0 [3,4]; the Ws then:
        stage 1 W0 [3,4]; stage 0 W0 [4,5]: T = 5.
        """
        p = group_plan([["d0"], ["d1"]], [1], ops=[["F0", "I0", "W0"], ["F0", "I0", "W0"]])
        assert p.format == "pipeplan.plan/2"
        result = simulate(p, chain(2), cluster(2))
        assert result.iteration_time == pytest.approx(5.0)
        assert p.programs() == [["0F0", "0I0", "0W0"], ["1F0", "1I0", "1W0"]]

    def test_w_sends_nothing(self):
        """Slow links (1 B/s, 1 B/sample out, so a transfer of 1 sample takes 1 s): only F and I send.

        g0: 0F0 [0,1] -> tx [1,2]; g1: 1F0 [2,3], 1I0 [3,4] -> tx [4,5], 1W0 [4,5]; g0: 0I0 [5,6], 0W0 [6,7].
        """
        p = group_plan([["d0"], ["d1"]], [1], programs=[["0F0", "0I0", "0W0"], ["1F0", "1I0", "1W0"]])
        result = simulate(p, chain(2, out=1.0), cluster(2, bandwidth=SLOW))
        assert result.iteration_time == pytest.approx(7.0)
        assert [(t.direction, t.start, t.end) for t in result.transfers] == [("fwd", 1.0, 2.0), ("bwd", 4.0, 5.0)]


class TestSharedLink:
    def test_forward_waits_behind_a_backward_on_the_same_link(self):
        """Stages on groups [0, 1, 0]; F = B = 1; every transfer 3 s (3 B/sample, 1 B/s).

        Link 0->1 carries stage 0's activations and stage 2's gradients; link 1->0
        stage 1's activations and its gradients.  By hand:
        g0 0F0 [0,1] -> 0->1 [1,4];  g1 1F0 [4,5] -> 1->0 [5,8];  g0 2F0 [8,9], 2B0 [9,10] -> 0->1 [10,13];
        g0 0F1 [10,11] -> 0->1 waits for 2B0's gradients: [13,16];  g1 1F1 [16,17] -> 1->0 [17,20];
        g1 1B0 [17,18] -> 1->0 waits for 1F1's activations: [20,23];  g0 2F1 [20,21], 2B1 [21,22] -> [22,25];
        g0 0B0 [23,24];  g1 1B1 [25,26] -> 1->0 [26,29];  g0 0B1 [29,30].  T = 30.
        """
        layout = [["d0"], ["d1"], ["d0"]]
        programs = [["0F0", "2F0", "2B0", "0F1", "2F1", "2B1", "0B0", "0B1"], ["1F0", "1F1", "1B0", "1B1"]]
        p = group_plan(layout, [1, 1], programs=programs)
        g = LayerGraph.chain("g", [make_layer(i, fwd=(1.0, 0.0), bwd=(1.0, 0.0), out=3.0) for i in range(3)])
        result = simulate(p, g, cluster(2, bandwidth=SLOW))
        assert result.iteration_time == pytest.approx(30.0)
        on_01 = sorted((t.start, t.end) for t in result.transfers if t.link == (0, 1))
        on_10 = sorted((t.start, t.end) for t in result.transfers if t.link == (1, 0))
        assert flat(on_01) == pytest.approx(flat(((1, 4), (10, 13), (13, 16), (22, 25))))
        assert flat(on_10) == pytest.approx(flat(((5, 8), (17, 20), (20, 23), (26, 29))))

    def test_replicated_groups_use_the_smaller_replica_count_and_all_reduce_together(self):
        """Groups of 2 devices on one server (bw 1 B/s, lat 0): a transfer of 2 samples x 1 B over min(2, 2)
        replicas takes 1 s; AR_g = 2*(2-1) * (0 + P_g / (2 * 1)) with P_g = 4 + 4 (two stages) = 8."""
        layout = [["d0", "d1"], ["d2", "d3"], ["d0", "d1"]]
        programs = [["0F0", "2F0", "2B0", "0B0"], ["1F0", "1B0"]]
        p = group_plan(layout, [2], programs=programs)
        g = LayerGraph.chain("g", [make_layer(i, fwd=(1.0, 0.0), bwd=(1.0, 0.0), out=1.0, params=4.0)
                                   for i in range(3)])
        result = simulate(p, g, cluster(4, bandwidth=SLOW))
        assert result.groups[0].allreduce == pytest.approx(8.0)
        assert result.groups[1].allreduce == pytest.approx(4.0)
        # g0 0F0 [0,1] -> [1,2]; g1 1F0 [2,3] -> [3,4]; g0 2F0 [4,5] 2B0 [5,6] -> [6,7]; g1 1B0 [7,8] -> [8,9];
        # g0 0B0 [9,10], then AR 8: T = 18 (g1 ends at 8 + 4 = 12)
        assert result.iteration_time == pytest.approx(18.0)
        assert result.group_end == pytest.approx((18.0, 12.0))


class TestDeadlock:
    def bad_plan(self):
        # 1F1B stage 0 takes B0 after F0, F1; stage 1's single microbatch needs all 4 samples.
        return plan([(0, 1, ["d0"], [1, 1, 1, 1]), (1, 2, ["d1"], [4])], batch=4, schedule="1f1b")

    def test_per_stage_ops_name_the_stage_the_op_and_what_it_waits_for(self):
        with pytest.raises(DeadlockError) as info:
            simulate(self.bad_plan(), chain(2), cluster(2), file="p.json")
        err = info.value
        assert err.file == "p.json" and err.where == "stages[0].ops[2]"
        assert "stage 0 op B0 waits for the gradients of microbatch 0 of stage 1" in err.what
        assert "stage 1 op F0 waits for the activations of microbatch 2 of stage 0" in err.what

    def test_programs_name_the_group_and_the_waiting_action(self):
        """0B0 waits for 1B0, which runs after 1F1, which waits for 0F1, which runs after 0B0."""
        p = group_plan([["d0"], ["d1"]], [1, 1],
                       programs=[["0F0", "0B0", "0F1", "0B1"], ["1F0", "1F1", "1B0", "1B1"]])
        with pytest.raises(DeadlockError) as info:
            simulate(p, chain(2), cluster(2))
        assert info.value.where == "programs[0][1]"
        assert "group 0 action 0B0 waits for the gradients of microbatch 0 of stage 1" in info.value.what
        assert "group 1 action 1F1 waits for the activations of microbatch 1 of stage 0" in info.value.what

    def test_a_split_backward_is_named_as_the_plan_writes_it(self):
        p = group_plan([["d0"], ["d1"]], [1, 1], ops=[["F0", "I0", "F1", "I1", "W0", "W1"],
                                                      ["F0", "F1", "I0", "I1", "W0", "W1"]])
        with pytest.raises(DeadlockError, match=r"stage 0 op I0 waits for the gradients of microbatch 0 of stage 1, "
                                                r"whose I0 has not run"):
            check_deadlock_free(p)

    @pytest.mark.parametrize("schedule, ops, match", [
        ("custom", [["F0", "B0", "F1", "B1"], ["F0", "F1", "B0", "B1"]], "stage 0 op B0"),
        ("custom-programs", [["0F0", "0B0", "0F1", "0B1"], ["1F0", "1F1", "1B0", "1B1"]], "group 0 action 0B0"),
    ])
    def test_an_order_can_deadlock_without_costs(self, schedule, ops, match):
        if schedule == "custom":
            p = plan([(0, 1, ["d0"], [1, 1], False, ops[0]), (1, 2, ["d1"], [1, 1], False, ops[1])], batch=2,
                     schedule="custom")
        else:
            p = group_plan([["d0"], ["d1"]], [1, 1], programs=ops)
        with pytest.raises(DeadlockError, match=match):
            check_deadlock_free(p)

    def test_a_local_cycle_on_one_group(self):
        """One group, two stages: 1F0 before 0F0 waits for what only a later action of its own makes."""
        p = group_plan([["d0"], ["d0"]], [1], programs=[["1F0", "0F0", "1B0", "0B0"]])
        with pytest.raises(DeadlockError, match="group 0 action 1F0 waits for the activations of microbatch 0 "
                                                "of stage 0, whose F has not run"):
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
        assert [(e.group, e.kind) for e in result.syncs] == [(0, "allreduce")]
        assert result.iteration_time == pytest.approx(max(result.stage_end))

    def test_a_stage_ends_with_its_group(self):
        p = group_plan([["d0"], ["d1"], ["d0"]], [1], programs=[["0F0", "2F0", "2B0", "0B0"], ["1F0", "1B0"]])
        result = simulate(p, chain(3, step=0.25), cluster(2))
        assert result.stage_end == (result.group_end[0], result.group_end[1], result.group_end[0])


class TestOneStagePerGroup:
    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_the_same_actions_as_custom_programs_give_the_same_numbers(self, schedule):
        """A version-1 plan is the case of one stage per group: its per-stage op lists, written as the
        programs of a custom /2 plan, time and weigh the same to the last bit."""
        p = Plan("g", "c", 6, 4.0, schedule, (Stage((0, 2), ("d0",), (2, 2, 2), True),
                                               Stage((2, 3), ("d1", "d2"), (3, 3)),
                                               Stage((3, 4), ("d3",), (1, 2, 3))))
        as_programs = Plan("g", "c", 6, 4.0, "custom", p.stages, custom_programs=tuple(map(tuple, p.programs())))
        assert p.format == "pipeplan.plan/1" and as_programs.format == "pipeplan.plan/2"
        g = chain(4, out=3.0, act=5.0, params=7.0, input_bytes=2.0)
        c = cluster(4, bandwidth=10.0, latency=0.5)
        one, other = simulate(p, g, c), simulate(as_programs, g, c)
        assert one.iteration_time == other.iteration_time and one.peak_memory == other.peak_memory
        assert one.ops == other.ops and one.transfers == other.transfers and one.syncs == other.syncs


class TestCostsCache:
    @pytest.mark.parametrize("seed", range(30))
    def test_cached_costs_equal_fresh_ones(self, seed):
        """Random plans, their stages moved to other devices and their recompute flags flipped, through one cache."""
        graph, cluster_, plans = random_batch(seed)
        cache = {}
        for p in plans:
            for shift, flip in itertools.product(range(2), (False, True)):
                ids = [f"d{(int(d[1:]) + shift) % 6}" for st in p.stages for d in st.devices]
                stages, at = [], 0
                for s, st in enumerate(p.stages):
                    devices = tuple(ids[at:at + len(st.devices)])
                    at += len(st.devices)
                    stages.append(Stage(st.layers, devices, st.microbatches, st.recompute != (flip and s % 2 == 0)))
                q = Plan(p.graph, p.cluster, p.global_batch, p.state_factor, p.schedule, tuple(stages))
                fresh = plan_costs(q, graph, cluster_)
                cached = plan_costs(q, graph, cluster_, cache)
                assert (cached.groups, cached.links) == (fresh.groups, fresh.links)


# ---------------------------------------------------------------- the reference
def _cut(graph, c):
    """Bytes per sample crossing the cut after layer c (spec 1)."""
    return sum(graph.layers[u].out for u in range(c + 1) if any(x == u and y > c for x, y in graph.edges))


def _programs(plan, stage_groups):
    if plan.custom_programs is not None:
        return [[_parse(a) for a in p] for p in plan.custom_programs]
    count = max(stage_groups) + 1
    made = group_programs(plan.schedule, count, len(plan.stages[0].microbatches),
                          len(plan.stages) // count if plan.schedule != "zbv" else 2)
    return [[(a.stage, a.kind, a.microbatch) for a in p] for p in made]


def _parse(text):
    kind_at = next(i for i, c in enumerate(text) if c in "FBIW")
    return int(text[:kind_at]), text[kind_at], int(text[kind_at + 1:])


def reference(graph, cluster_, plan, stage_groups):
    """(iteration time, peak per group) by a discrete-event loop, or None on a deadlock."""
    stages, S = plan.stages, len(plan.stages)
    G = max(stage_groups) + 1
    devs = [stages[stage_groups.index(g)].devices for g in range(G)]
    r = [len(d) for d in devs]
    speed = [min(cluster_.device_index[x].speed for x in d) for d in devs]
    programs = _programs(plan, stage_groups)

    def layers_of(s):
        lo, hi = stages[s].layers
        return graph.layers[lo:hi]

    def q(s, k):
        return math.ceil(stages[s].microbatches[k] / r[stage_groups[s]])

    def duration(s, kind, k):
        v, n = speed[stage_groups[s]], q(s, k)
        tf = sum((L.fwd[0] + L.fwd[1] * n) / v for L in layers_of(s))
        rec = tf if stages[s].recompute else 0.0
        w = [L.bwd_w if L.bwd_w is not None else (L.bwd[0] / 2, L.bwd[1] / 2) for L in layers_of(s)]
        if kind == "F":
            return tf
        if kind == "B":
            return sum((L.bwd[0] + L.bwd[1] * n) / v for L in layers_of(s)) + rec
        if kind == "I":
            return sum(((L.bwd[0] - a) + (L.bwd[1] - b) * n) / v for L, (a, b) in zip(layers_of(s), w)) + rec
        return sum((a + b * n) / v for a, b in w)

    def starts(s, k):
        lo = sum(stages[s].microbatches[:k])
        return lo, lo + stages[s].microbatches[k]

    def overlapping(s, k, t):
        a, b = starts(s, k)
        return [j for j in range(len(stages[t].microbatches)) if starts(t, j)[0] < b and a < starts(t, j)[1]]

    def needs(action):
        s, kind, k = action
        if kind == "F" and s > 0:
            return [("fwd", s - 1, j) for j in overlapping(s, k, s - 1)]
        if kind in "BI" and s < S - 1:
            return [("bwd", s + 1, j) for j in overlapping(s, k, s + 1)]
        return []

    def sends(action):
        """(key, destination stage) of what the action's end sends, if anything."""
        s, kind, k = action
        if kind == "F" and s < S - 1:
            return ("fwd", s, k), s + 1
        if kind in "BI" and s > 0:
            return ("bwd", s, k), s - 1
        return None

    def transfer_time(key, dest):
        _, s, k = key
        c = stages[s].layers[1] - 1 if dest > s else stages[s].layers[0] - 1
        x, y = devs[stage_groups[s]], devs[stage_groups[dest]]
        rate = min(len(x), len(y)) * cluster_.bw(x, y)
        return cluster_.lat(x, y) + stages[s].microbatches[k] * _cut(graph, c) / rate

    arrived = {}
    nxt = [0] * G
    busy = [False] * G
    last_end = [0.0] * G
    queue = defaultdict(deque)  # (X, Y) -> transfers waiting, FIFO
    link_busy = set()
    events = []  # (time, sequence, what, data)
    seq = 0
    now = 0.0
    while True:
        started = True
        while started:  # start everything that can start now
            started = False
            for g in range(G):
                if busy[g] or nxt[g] == len(programs[g]):
                    continue
                action = programs[g][nxt[g]]
                if all(key in arrived for key in needs(action)):
                    busy[g] = True
                    seq += 1
                    heapq.heappush(events, (now + duration(*action), seq, "action", (g, action)))
                    started = True
            for link, waiting in queue.items():
                if waiting and link not in link_busy:
                    key, dest = waiting.popleft()
                    link_busy.add(link)
                    seq += 1
                    heapq.heappush(events, (now + transfer_time(key, dest), seq, "arrive", (link, key)))
                    started = True
        if not events:
            break
        now = events[0][0]
        while events and events[0][0] == now:  # everything that ends now, ends
            _, _, what, data = heapq.heappop(events)
            if what == "action":
                g, action = data
                busy[g] = False
                nxt[g] += 1
                last_end[g] = now
                out = sends(action)
                if out is not None:
                    key, dest = out
                    if stage_groups[dest] == g:
                        arrived[key] = now
                    else:
                        queue[(g, stage_groups[dest])].append((key, dest))
            else:
                link, key = data
                link_busy.discard(link)
                arrived[key] = now
    if any(nxt[g] < len(programs[g]) for g in range(G)):
        return None
    ends = []
    for g in range(G):
        held = [s for s in range(S) if stage_groups[s] == g]
        P = sum(L.params for s in held for L in layers_of(s))
        ar = 2 * (r[g] - 1) * (cluster_.lat(devs[g]) + P / (r[g] * cluster_.bw(devs[g]))) if r[g] > 1 else 0.0
        step = sum(L.step_time for s in held for L in layers_of(s)) / speed[g]
        ends.append(last_end[g] + ar + step)
    return max(ends), [_group_peak(graph, plan, stage_groups, g, programs[g], r[g]) for g in range(G)]


def _group_peak(graph, plan, stage_groups, g, program, r):
    """State plus the largest live stash over the program (spec 7.4), tracked per microbatch."""
    stages = plan.stages
    held = [s for s in range(len(stages)) if stage_groups[s] == g]
    live, peak = {}, 0.0
    for s, kind, k in program:
        lo, hi = stages[s].layers
        A = sum(L.act for L in graph.layers[lo:hi])
        Aw = sum(L.act if L.act_w is None else L.act_w for L in graph.layers[lo:hi])
        X = (graph.input_bytes if lo == 0 else _cut(graph, lo - 1)) if stages[s].recompute else A
        n = math.ceil(stages[s].microbatches[k] / r)
        if kind in "BI" and stages[s].recompute:
            peak = max(peak, sum(live.values()) + n * A)
        if kind == "F":
            live[(s, k)] = n * X
        elif kind == "I":
            live[(s, k)] = n * Aw
        else:
            del live[(s, k)]
        peak = max(peak, sum(live.values()))
    return plan.state_factor * sum(L.params for s in held for L in graph.layers[slice(*stages[s].layers)]) + peak


class TestAgainstTheReference:
    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(program_instances())
    def test_iteration_time_and_group_peaks(self, instance):
        graph, cluster_, plan, stage_groups = instance
        plan.validate(graph, cluster_)
        assert plan.stage_groups == stage_groups
        expected = reference(graph, cluster_, plan, stage_groups)
        if expected is None:
            with pytest.raises(DeadlockError):
                simulate(plan, graph, cluster_)
            with pytest.raises(DeadlockError):
                check_deadlock_free(plan)
            return
        result = simulate(plan, graph, cluster_)
        check_deadlock_free(plan)
        T, peaks = expected
        assert result.iteration_time == pytest.approx(T, rel=1e-9, abs=1e-12)
        assert result.peak_memory == pytest.approx(peaks, rel=1e-9, abs=1e-9)

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(program_instances())
    def test_named_schedules_never_deadlock(self, instance):
        graph, cluster_, plan, _ = instance
        assume(plan.schedule != "custom")
        result = simulate(plan, graph, cluster_)
        for busy, g in zip(result.busy, result.groups):
            assert result.iteration_time >= busy + g.allreduce + g.step - 1e-9
        for op in result.ops:
            assert 0 <= op.start <= op.end <= result.iteration_time + 1e-9
