"""The version-2 simulator (spec 7.3, 7.4): hand-computed cases and an independent reference.

Unless a test says otherwise, layers take F = n and B = 2n seconds for n samples, the
weight-gradient half of B is n (``bwd_w`` absent: ``bwd / 2``), links are
instantaneous and there is one device per group, so the arithmetic can be done by hand
in the docstrings.

The reference at the end is a discrete-event loop written from the spec's words: a
clock jumps from event to event, groups start their next action when it is idle and
the action's inputs are in, every ordered pair of groups has a FIFO queue of
transfers.  It shares no code with the simulator's sweep.
"""

import heapq
import math
from collections import defaultdict, deque

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from conftest import chain, cluster, make_layer
from pipeplan.models.errors import DeadlockError, InputError
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.evaluation.batched import BatchSimulator, Candidate, simulate_batch
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.schedules.schedule import group_programs
from pipeplan.solver.evaluation.simulator import (GroupSimulationResult, SimulationResult, check_deadlock_free, simulate,
                                       simulate_programs)

SLOW = 1.0
"""A link bandwidth of 1 byte/s: a transfer of n samples of b bytes takes n*b seconds."""


def flat(pairs):
    return [x for pair in pairs for x in pair]


def group_plan(layout, split, *, schedule="custom", programs=None, recompute=False, state_factor=0.0, ops=None):
    """One layer per stage; ``layout[s]`` is stage s's device list."""
    stages = tuple(Stage((s, s + 1), tuple(devs), tuple(split), recompute, None if ops is None else tuple(ops[s]))
                   for s, devs in enumerate(layout))
    return Plan("g", "c", sum(split), state_factor, schedule, stages,
                custom_programs=None if programs is None else tuple(tuple(p) for p in programs))


class TestLocalHandOver:
    def test_two_stages_on_one_group_exchange_nothing(self):
        """looped-bfs, R=1, v=2, m=2: 0F0 0F1 1F0 1F1 1B1 1B0 0B1 0B0, F=1, B=2 each, no transfer: T = 4+8."""
        p = group_plan([["d0"], ["d0"]], [1, 1], schedule="looped-bfs")
        result = simulate(p, chain(2, out=1e9), cluster(1, bandwidth=SLOW))
        assert isinstance(result, GroupSimulationResult)
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
        on_01 = [(t.start, t.end) for t in result.transfers if t.link == (0, 1)]
        on_10 = [(t.start, t.end) for t in result.transfers if t.link == (1, 0)]
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
    def test_names_the_waiting_action(self):
        """0B0 waits for 1B0, which runs after 1F1, which waits for 0F1, which runs after 0B0."""
        p = group_plan([["d0"], ["d1"]], [1, 1],
                       programs=[["0F0", "0B0", "0F1", "0B1"], ["1F0", "1F1", "1B0", "1B1"]])
        with pytest.raises(DeadlockError) as info:
            simulate(p, chain(2), cluster(2))
        assert info.value.where == "programs[0][1]"
        assert "group 0 action 0B0 waits for the gradients of microbatch 0 of stage 1" in info.value.what
        assert "group 1 action 1F1 waits for the activations of microbatch 1 of stage 0" in info.value.what
        with pytest.raises(DeadlockError):
            check_deadlock_free(p)

    def test_a_local_cycle_on_one_group(self):
        """One group, two stages: 1F0 before 0F0 waits for what only a later action of its own makes."""
        p = group_plan([["d0"], ["d0"]], [1], programs=[["1F0", "0F0", "1B0", "0B0"]])
        with pytest.raises(DeadlockError, match="group 0 action 1F0 waits for the activations of microbatch 0 "
                                                "of stage 0, whose F has not run"):
            check_deadlock_free(p)


class TestVersionOneUnchanged:
    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_group_engine_equals_the_version_one_simulator(self, schedule):
        """A v1 plan gives the same numbers through either engine, to the last bit."""
        p = Plan("g", "c", 6, 4.0, schedule, (Stage((0, 2), ("d0",), (2, 2, 2), True),
                                               Stage((2, 3), ("d1", "d2"), (3, 3)),
                                               Stage((3, 4), ("d3",), (1, 2, 3))))
        g = chain(4, out=3.0, act=5.0, params=7.0, input_bytes=2.0)
        c = cluster(4, bandwidth=10.0, latency=0.5)
        old, new = simulate(p, g, c), simulate_programs(p, g, c)
        assert isinstance(old, SimulationResult)
        assert new.iteration_time == old.iteration_time
        assert new.peak_memory == old.peak_memory
        assert [(e.stage, e.kind, e.start, e.end) for e in sorted(new.ops, key=lambda e: (e.stage, e.start))] == \
               [(e.stage, e.kind, e.start, e.end) for e in old.ops]


# ---------------------------------------------------------------- random plans
costs = st.tuples(st.integers(0, 4), st.integers(0, 4)).map(lambda t: (t[0] / 4, t[1] / 4))
NAMED = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv")


@st.composite
def layers(draw, n):
    out = []
    for i in range(n):
        fwd, bwd = draw(costs), draw(costs)
        bwd_w = draw(st.none() | st.tuples(st.integers(0, 4), st.integers(0, 4)).map(
            lambda t, b=bwd: (b[0] * t[0] / 4, b[1] * t[1] / 4)))
        act = float(draw(st.integers(0, 50)))
        act_w = draw(st.none() | st.integers(0, 4).map(lambda j, a=act: a * j / 4))
        step = draw(st.none() | st.integers(0, 4).map(lambda j: j / 8))
        out.append(Layer(f"l{i}", fwd, bwd, float(draw(st.integers(0, 50))), act, float(draw(st.integers(0, 10))),
                         bwd_w=bwd_w, act_w=act_w, step=step))
    return out


def _composition(draw, total, parts):
    if parts == 1:
        return (total,)
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), min_size=parts - 1, max_size=parts - 1)))
    edges = [0] + cuts + [total]
    return tuple(b - a for a, b in zip(edges, edges[1:]))


def _layout(schedule, groups, virtual):
    """Stage -> group index for a named schedule, as spec 7.2 lays them out."""
    if schedule in ("gpipe", "1f1b"):
        return list(range(groups))
    if schedule == "zbv":
        return [s if s < groups else 2 * groups - 1 - s for s in range(2 * groups)]
    return [s % groups for s in range(virtual * groups)]


def _random_programs(draw, stage_groups, splits):
    """Random programs: per microbatch B, or I then W, each after its F on its own stage.

    Mostly a random serial run of the whole pipeline (each action after what it waits
    for on the neighbouring stages), cut into the groups' programs: such programs
    cannot deadlock.  Otherwise every group orders its actions at random, and most of
    those deadlock.
    """
    serial = draw(st.sampled_from([True, True, True, False]))
    count = max(stage_groups) + 1
    todo = {}  # action -> the actions it needs first
    for s, split in enumerate(splits):
        for k in range(len(split)):
            todo[(s, "F", k)] = [(s - 1, "F", j) for j in _overlap(splits, s, k, s - 1)] if serial else []
            back = [(s + 1, "B", j) for j in _overlap(splits, s, k, s + 1)] if serial else []
            if draw(st.booleans()):
                todo[(s, "B", k)] = [(s, "F", k)] + back
            else:
                todo[(s, "I", k)] = [(s, "F", k)] + back
                todo[(s, "W", k)] = [(s, "I", k)]
    done, programs = set(), [[] for _ in range(count)]
    while todo:
        ready = sorted(a for a, need in todo.items() if all(x in done or _backward_of(x, done) for x in need))
        action = draw(st.sampled_from(ready))
        del todo[action]
        done.add(action)
        programs[stage_groups[action[0]]].append(f"{action[0]}{action[1]}{action[2]}")
    return programs


def _overlap(splits, s, k, t):
    """Microbatches of stage t sharing a sample with microbatch k of stage s (none if t is no stage)."""
    if not 0 <= t < len(splits):
        return []
    lo = sum(splits[s][:k])
    hi = lo + splits[s][k]
    edges = [sum(splits[t][:j]) for j in range(len(splits[t]) + 1)]
    return [j for j in range(len(splits[t])) if edges[j] < hi and lo < edges[j + 1]]


def _backward_of(action, done):
    """A needed ``B`` of a neighbour is also met by its ``I``."""
    s, kind, k = action
    return kind == "B" and (s, "I", k) in done


@st.composite
def v2_instances(draw):
    schedule = draw(st.sampled_from(NAMED + ("custom",) * 3))
    groups = draw(st.integers(1, 3))
    if schedule == "custom":
        n_stages = draw(st.integers(1, 5))
        labels = [draw(st.integers(0, groups - 1)) for _ in range(n_stages)]
        renumber = {}
        stage_groups = [renumber.setdefault(x, len(renumber)) for x in labels]
        groups = len(renumber)
    else:
        virtual = draw(st.integers(1, 3)) if schedule in ("interleaved-1f1b", "interleaved-zb", "looped-bfs") else 1
        stage_groups = _layout(schedule, groups, virtual)
        n_stages = len(stage_groups)
    m = draw(st.integers(1, 6))
    if schedule in ("interleaved-1f1b", "interleaved-zb"):
        assume(m % max(1, m // groups) == 0)
    batch = draw(st.integers(m, m + 4))
    n_layers = n_stages + draw(st.integers(0, 2))
    graph_layers = draw(layers(n_layers))
    pairs = [(u, v) for u in range(n_layers) for v in range(u + 2, n_layers)]
    skips = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=2)) if pairs else []
    graph = LayerGraph("g", graph_layers, [(i, i + 1) for i in range(n_layers - 1)] + skips,
                       float(draw(st.integers(0, 9))))
    replicas = [draw(st.integers(1, 2)) for _ in range(groups)]
    servers = draw(st.integers(1, 2))
    devices = tuple(Device(f"d{i}", f"s{draw(st.integers(0, servers - 1))}", draw(st.sampled_from([0.5, 1.0, 2.0])),
                           float(draw(st.integers(0, 3000)))) for i in range(sum(replicas)))
    cluster_ = Cluster("c", tuple(Link(float(draw(st.sampled_from([1, 4, 16]))), draw(st.sampled_from([0.0, 0.25])),
                                       f"s{j}") for j in range(servers)),
                       Link(float(draw(st.sampled_from([1, 2]))), draw(st.sampled_from([0.0, 0.5]))), devices)
    order = draw(st.permutations([d.id for d in devices]))
    group_devices, taken = [], 0
    for r in replicas:
        group_devices.append(tuple(order[taken:taken + r]))
        taken += r
    cuts = sorted(draw(st.lists(st.integers(1, n_layers - 1), unique=True, min_size=n_stages - 1,
                                max_size=n_stages - 1))) if n_stages > 1 else []
    bounds = list(zip([0] + cuts, cuts + [n_layers]))
    shared = _composition(draw, batch, m)
    splits = [shared if schedule != "custom" else _composition(draw, batch, draw(st.integers(1, min(batch, 4))))
              for _ in range(n_stages)]
    stages = tuple(Stage(bounds[s], group_devices[stage_groups[s]], splits[s], draw(st.booleans()))
                   for s in range(n_stages))
    programs = _random_programs(draw, stage_groups, splits) if schedule == "custom" else None
    plan = Plan("g", "c", batch, float(draw(st.sampled_from([0, 1, 4]))), schedule, stages,
                custom_programs=None if programs is None else tuple(tuple(p) for p in programs))
    return graph, cluster_, plan, stage_groups


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
    @given(v2_instances())
    def test_iteration_time_and_group_peaks(self, instance):
        graph, cluster_, plan, stage_groups = instance
        plan.validate(graph, cluster_)
        assert plan.stage_groups == stage_groups
        expected = reference(graph, cluster_, plan, stage_groups)
        if expected is None:
            with pytest.raises(DeadlockError):
                simulate_programs(plan, graph, cluster_)
            with pytest.raises(DeadlockError):
                check_deadlock_free(plan)
            return
        result = simulate_programs(plan, graph, cluster_)
        check_deadlock_free(plan)
        T, peaks = expected
        assert result.iteration_time == pytest.approx(T, rel=1e-9, abs=1e-12)
        assert result.peak_memory == pytest.approx(peaks, rel=1e-9, abs=1e-9)
        assert simulate(plan, graph, cluster_).iteration_time == pytest.approx(T, rel=1e-9, abs=1e-12)

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(v2_instances())
    def test_named_schedules_never_deadlock(self, instance):
        graph, cluster_, plan, _ = instance
        assume(plan.schedule != "custom")
        result = simulate_programs(plan, graph, cluster_)
        for busy, g in zip(result.busy, result.groups):
            assert result.iteration_time >= busy + g.allreduce + g.step - 1e-9
        for op in result.ops:
            assert 0 <= op.start <= op.end <= result.iteration_time + 1e-9


class TestBatched:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(v2_instances())
    def test_simulate_batch_equals_the_scalar_simulator(self, instance):
        graph, cluster_, plan, _ = instance
        try:
            expected = simulate(plan, graph, cluster_)
        except DeadlockError:
            return
        out = simulate_batch([plan, plan], graph, cluster_)
        assert list(out.iteration_time) == [expected.iteration_time] * 2
        assert list(out.peak_memory) == [max(expected.peak_memory)] * 2
        assert list(out.fits) == [expected.fits] * 2

    def test_a_named_v2_schedule_goes_through_the_scalar_simulator(self):
        plans = [group_plan([["d0"], ["d1"], ["d0"], ["d1"]], split, schedule="interleaved-zb")
                 for split in ([1, 1], [2, 2], [1, 3])]
        g, c = chain(4, step=0.25, act=3.0), cluster(2)
        res = BatchSimulator(g, c, "interleaved-zb", 0.0).evaluate([Candidate.from_plan(p) for p in plans])
        assert list(res.iteration_time) == [simulate(p, g, c).iteration_time for p in plans]
        assert list(res.peak_memory) == [max(simulate(p, g, c).peak_memory) for p in plans]
        assert not res.batched.any()

    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_the_step_in_a_batch_of_version_1_plans(self, schedule):
        """step 0.5 s per layer, speed 1: T = the v1 time + 0.5 * layers of the stage that ends last."""
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
