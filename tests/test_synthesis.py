"""Programs built for a partition (solver/schedules/synthesis.py): the instance, its timeline, the list scheduler.

Every time the module computes is checked against the simulator (``simulate`` on the
custom plan :func:`custom_plan` makes), bit for bit.  Random problems come from
:func:`random_problem`: one to two layers per stage, random costs (version-2 fields
included), devices of different speeds on two servers, groups of one or two devices,
three placements (one stage per group, V, looped) and, with one stage per group,
stages that split the batch differently.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipeplan.models.errors import DeadlockError
from pipeplan.models.graph import Layer, LayerGraph
from pipeplan.experiments.bench_synthesis import PLACEMENTS, placement_groups
from pipeplan.solver.evaluation.simulator import simulate
from pipeplan.solver.formats.cluster import Cluster, Device, Link
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.schedules.programs import (FORWARD, FULL_BACKWARD, INPUT_BACKWARD, WEIGHT_BACKWARD, Action,
                                                parse_action)
from pipeplan.solver.schedules.schedule import group_programs
from pipeplan.solver.schedules.synthesis import (ListRule, ProgramDeadlock, ScheduleInstance, custom_plan, evaluate,
                                                 fixed_programs, list_rules, list_schedule, minimal_limits,
                                                 program_strings, schedule_instance, sequential_programs,
                                                 split_backwards, synthesize, warmup_limits)


def composition(rng: random.Random, total: int, parts: int) -> tuple[int, ...]:
    """``total`` samples in ``parts`` positive microbatches, at random."""
    cuts = sorted(rng.sample(range(1, total), parts - 1))
    return tuple(b - a for a, b in zip([0] + cuts, cuts + [total]))


def random_problem(rng: random.Random, *, groups: int, microbatches: int, placement: str = "one",
                   unequal_splits: bool = False, replicas: int = 1, memory: float = 1e13,
                   recompute: float = 0.3) -> tuple[Plan, LayerGraph, Cluster]:
    """A random partition: its plan (schedule ``custom``, no programs), graph and cluster."""
    owner = placement_groups(placement, groups)
    stages = len(owner)
    sizes = [rng.randint(1, 2) for _ in range(stages)]
    layers = []
    for i in range(sum(sizes)):
        fwd = (rng.uniform(0, 2e-4), rng.uniform(1e-4, 1e-3))
        bwd = (rng.uniform(0, 4e-4), rng.uniform(2e-4, 2e-3))
        share = rng.uniform(0.2, 0.7)
        act = rng.uniform(1e5, 1e7)
        layers.append(Layer(f"l{i}", fwd, bwd, rng.uniform(1e6, 1e8), act, rng.uniform(1e4, 1e6),
                            bwd_w=(bwd[0] * share, bwd[1] * share), act_w=act * rng.uniform(0.2, 1.0),
                            step=rng.uniform(0, 5e-4)))
    graph = LayerGraph.chain("g", layers, input_bytes=rng.uniform(1e4, 1e6))
    devices = tuple(Device(f"d{i}", f"s{i * 2 // (groups * replicas)}", rng.choice([0.3, 0.45, 0.7, 1.0]), memory)
                    for i in range(groups * replicas))
    cluster = Cluster("c", (Link(rng.uniform(1e9, 2e11), 5e-6, "s0"), Link(rng.uniform(1e9, 2e11), 1e-5, "s1")),
                      Link(rng.uniform(1e8, 2e10), 2e-5), devices)
    batch = microbatches * 2 * replicas
    bounds = [0] + [sum(sizes[:s + 1]) for s in range(stages)]
    built = []
    for s in range(stages):
        split = tuple([batch // microbatches] * microbatches)
        if unequal_splits and placement == "one" and rng.random() < 0.7:
            split = composition(rng, batch, rng.randint(1, min(batch, microbatches + 2)))
        devs = tuple(f"d{owner[s] * replicas + j}" for j in range(replicas))
        built.append(Stage((bounds[s], bounds[s + 1]), devs, split, rng.random() < recompute))
    return Plan("g", "c", batch, 4.0, "custom", tuple(built)), graph, cluster


def random_order(rng: random.Random, instance: ScheduleInstance, split: bool = True) -> list[list[Action]]:
    """Programs from a random linear extension of every action's dependencies (so they never deadlock)."""
    back = INPUT_BACKWARD if split else FULL_BACKWARD
    stages = instance.stages
    done: set[Action] = set()

    def ready(a: Action) -> bool:
        s, kind, k = a
        st = stages[s]
        if kind == FORWARD:
            return s == 0 or all(Action(s - 1, FORWARD, j) in done for j in range(st.wait_forward[k][0],
                                                                                  st.wait_forward[k][1] + 1))
        if kind == WEIGHT_BACKWARD:
            return Action(s, back, k) in done
        if Action(s, FORWARD, k) not in done:
            return False
        return s == len(stages) - 1 or all(Action(s + 1, back, j) in done
                                           for j in range(st.wait_backward[k][0], st.wait_backward[k][1] + 1))

    pending = [a for acts in instance.actions(split) for a in acts]
    programs: list[list[Action]] = [[] for _ in instance.groups]
    while pending:
        a = rng.choice([x for x in pending if ready(x)])
        pending.remove(a)
        done.add(a)
        programs[stages[a.stage].group].append(a)
    return programs


def check_against_simulate(plan: Plan, graph: LayerGraph, cluster: Cluster, programs) -> None:
    """:func:`evaluate` and ``simulate`` of the custom plan agree bit for bit: time, group ends, actions, peaks."""
    instance = schedule_instance(plan, graph, cluster)
    mine = evaluate(instance, programs)
    custom = custom_plan(plan, programs)
    custom.validate(graph, cluster)
    theirs = simulate(custom, graph, cluster)
    assert mine.iteration_time == theirs.iteration_time
    assert mine.group_end == tuple(theirs.group_end)
    assert mine.times == theirs.action_times
    assert mine.peak_memory == tuple(theirs.peak_memory)


class TestScheduleInstance:
    def test_hand_computed(self):
        """Two layers (F = 1 + 2q, B = 4 + 4q, W = 1 + 1q), two stages: d0 (speed 1) and d1, d2 (speed 0.5).

        Batch 4 in microbatches (2, 2): on d1/d2, q = 1.  Cut: 8 bytes per sample at 16 B/s with 1 s latency:
        2 samples * 8 / (min(1, 2) * 16) + 1 = 2 s.  All-reduce of d1/d2: 2 * (0.5 + 100 / (2 * 50)) = 3 s.
        """
        layers = [Layer(f"l{i}", (1.0, 2.0), (4.0, 4.0), 100.0, 10.0, 8.0, bwd_w=(1.0, 1.0), act_w=6.0, step=0.5)
                  for i in range(2)]
        graph = LayerGraph.chain("g", layers, input_bytes=3.0)
        cluster = Cluster("c", (Link(1e3, 0.0, "s0"), Link(50.0, 0.5, "s1")), Link(16.0, 1.0),
                          (Device("d0", "s0", 1.0, 1e4), Device("d1", "s1", 0.5, 2e4), Device("d2", "s1", 0.5, 3e4)))
        plan = Plan("g", "c", 4, 2.0, "custom", (Stage((0, 1), ("d0",), (2, 2)),
                                                 Stage((1, 2), ("d1", "d2"), (2, 2), recompute=True)))
        inst = schedule_instance(plan, graph, cluster)
        first, second = inst.stages
        assert first.forward == (5.0, 5.0) and first.backward == (12.0, 12.0)
        assert first.input_grad == (9.0, 9.0) and first.weight_grad == (3.0, 3.0)
        assert second.samples == (1, 1) and second.forward == (6.0, 6.0)
        assert second.backward == (16.0 + 6.0, 16.0 + 6.0)  # recompute adds F
        assert second.input_grad == (12.0 + 6.0, 12.0 + 6.0) and second.weight_grad == (4.0, 4.0)
        assert (first.stash, first.working, first.weight_stash) == (10.0, 0.0, 6.0)
        assert (second.stash, second.working, second.weight_stash) == (8.0, 10.0, 6.0)  # input bytes: the cut
        cut = inst.boundaries[0]
        assert cut.forward == (2.0, 2.0) and cut.backward == (2.0, 2.0)
        assert cut.forward_link == (0, 1) and cut.backward_link == (1, 0)
        g0, g1 = inst.groups
        assert (g0.allreduce, g0.step, g0.state, g0.memory, g0.cap) == (0.0, 0.5, 200.0, 1e4, 1e4)
        assert (g1.allreduce, g1.step, g1.state, g1.memory) == (3.0, 1.0, 200.0, 2e4)

    def test_stages_on_one_group_hand_over_locally(self):
        plan, graph, cluster = random_problem(random.Random(3), groups=2, microbatches=3, placement="v")
        inst = schedule_instance(plan, graph, cluster)
        middle = inst.boundaries[1]  # stages 1 and 2 both on group 1
        assert middle.forward_link is None and middle.backward_link is None
        assert set(middle.forward) == {0.0} and set(middle.backward) == {0.0}
        assert inst.placement == (0, 1, 1, 0) and inst.groups[1].stages == (1, 2)

    def test_memory_fraction_and_caps(self):
        plan, graph, cluster = random_problem(random.Random(4), groups=3, microbatches=2, memory=1e9)
        assert [g.cap for g in schedule_instance(plan, graph, cluster, memory_fraction=0.5).groups] == [5e8] * 3
        capped = schedule_instance(plan, graph, cluster, memory_caps=[1e8, 2e9, 3e8]).groups
        assert [g.cap for g in capped] == [1e8, 1e9, 3e8]  # never above the device memory
        with pytest.raises(ValueError, match="memory_fraction"):
            schedule_instance(plan, graph, cluster, memory_fraction=1.5)
        with pytest.raises(ValueError, match="one cap >= 0 per device group"):
            schedule_instance(plan, graph, cluster, memory_caps=[1e8])


class TestEvaluate:
    @pytest.mark.parametrize("seed", range(24))
    def test_equals_simulate_bit_for_bit(self, seed):
        rng = random.Random(seed)
        placement = PLACEMENTS[seed % 3]
        plan, graph, cluster = random_problem(rng, groups=rng.randint(2, 4), microbatches=rng.randint(1, 5),
                                              placement=placement, unequal_splits=seed % 2 == 0,
                                              replicas=1 + (seed % 4 == 1))
        inst = schedule_instance(plan, graph, cluster)
        check_against_simulate(plan, graph, cluster, random_order(rng, inst, split=seed % 5 != 0))

    def test_a_cycle_is_a_deadlock(self):
        """Group 0 waits for 1B0's gradient, which group 1 runs after 1F1, which needs 0F1: after 0B0."""
        plan, graph, cluster = random_problem(random.Random(0), groups=2, microbatches=2)
        programs = [[parse_action(a) for a in p] for p in (["0F0", "0B0", "0F1", "0B1"],
                                                             ["1F0", "1F1", "1B0", "1B1"])]
        with pytest.raises(ProgramDeadlock, match="group 0 waits forever at action 0B0"):
            evaluate(schedule_instance(plan, graph, cluster), programs)
        with pytest.raises(DeadlockError):
            simulate(custom_plan(plan, programs), graph, cluster)

    def test_caps_decide_fits(self):
        plan, graph, cluster = random_problem(random.Random(5), groups=2, microbatches=3)
        inst = schedule_instance(plan, graph, cluster)
        timeline = evaluate(inst, sequential_programs(inst))
        caps = [p * (1 - 1e-9) if g == 1 else p for g, p in enumerate(timeline.peak_memory)]
        tight = evaluate(schedule_instance(plan, graph, cluster, memory_caps=caps), sequential_programs(inst))
        assert timeline.fits and not tight.fits and tight.excess > 0


class TestCustomPlan:
    def test_a_valid_version_2_plan_with_the_programs(self):
        plan, graph, cluster = random_problem(random.Random(1), groups=2, microbatches=2, placement="v")
        plan = plan.with_extra(solver={"name": "x"})
        programs = sequential_programs(schedule_instance(plan, graph, cluster))
        custom = custom_plan(plan, programs, synthesis={"source": "sequential"})
        custom.validate(graph, cluster)
        assert custom.schedule == "custom" and custom.format == "pipeplan.plan/2"
        assert custom.custom_programs == program_strings(programs)
        assert all(st.ops is None for st in custom.stages)
        assert custom.extra == {"solver": {"name": "x"}, "synthesis": {"source": "sequential"}}
        assert Plan.from_dict(custom.to_dict()) == custom
        assert [st.layers for st in custom.stages] == [st.layers for st in plan.stages]


class TestFixedPrograms:
    @pytest.mark.parametrize("placement, names", [
        ("one", ["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "looped-bfs"]),
        ("v", ["zbv"]),
        ("looped", ["interleaved-1f1b", "interleaved-zb", "looped-bfs"])])
    def test_the_schedules_of_each_placement(self, placement, names):
        plan, graph, cluster = random_problem(random.Random(2), groups=3, microbatches=6, placement=placement)
        found = fixed_programs(schedule_instance(plan, graph, cluster))
        assert list(found) == names
        virtual = 2 if placement != "one" else 1
        for name in names:
            if name not in ("gpipe", "1f1b"):
                assert found[name] == tuple(tuple(p) for p in group_programs(name, 3, 6, virtual))

    def test_unequal_splits_leave_one_stage_per_group_schedules(self):
        plan, graph, cluster = random_problem(random.Random(6), groups=3, microbatches=4, unequal_splits=True)
        assert len({st.microbatches for st in plan.stages}) > 1
        assert list(fixed_programs(schedule_instance(plan, graph, cluster))) == ["gpipe", "1f1b"]

    def test_torch_refused_counts_are_left_out(self):
        """m = 9 on 4 groups: rounds = 9 // 4 = 2 does not divide 9, so torch refuses the interleaved ones."""
        plan, graph, cluster = random_problem(random.Random(7), groups=4, microbatches=9, placement="looped")
        assert list(fixed_programs(schedule_instance(plan, graph, cluster))) == ["looped-bfs"]


class TestSequentialPrograms:
    def test_one_microbatch_at_a_time(self):
        plan, graph, cluster = random_problem(random.Random(8), groups=3, microbatches=2)
        programs = sequential_programs(schedule_instance(plan, graph, cluster))
        assert [" ".join(p) for p in program_strings(programs)] == [
            "0F0 0I0 0W0 0F1 0I1 0W1", "1F0 1I0 1W0 1F1 1I1 1W1", "2F0 2I0 2W0 2F1 2I1 2W1"]

    @pytest.mark.parametrize("seed", range(6))
    def test_no_fixed_schedule_holds_less(self, seed):
        rng = random.Random(seed)
        plan, graph, cluster = random_problem(rng, groups=3, microbatches=6, placement=PLACEMENTS[seed % 3])
        inst = schedule_instance(plan, graph, cluster)
        least = evaluate(inst, sequential_programs(inst)).peak_memory
        for programs in fixed_programs(inst).values():
            peaks = evaluate(inst, programs).peak_memory
            assert all(a <= b for a, b in zip(least, peaks))

    @pytest.mark.parametrize("seed", range(6))
    def test_unequal_splits_drain(self, seed):
        rng = random.Random(100 + seed)
        plan, graph, cluster = random_problem(rng, groups=3, microbatches=4, unequal_splits=True)
        inst = schedule_instance(plan, graph, cluster)
        assert all(limit >= 1 for limit in minimal_limits(inst))
        check_against_simulate(plan, graph, cluster, sequential_programs(inst))


class TestListSchedule:
    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(seed=st.integers(0, 2 ** 32 - 1), placement=st.sampled_from(PLACEMENTS), split=st.booleans())
    def test_every_rule_gives_valid_programs(self, seed, placement, split):
        rng = random.Random(seed)
        plan, graph, cluster = random_problem(rng, groups=rng.randint(2, 3), microbatches=rng.randint(1, 5),
                                              placement=placement, unequal_splits=True)
        inst = schedule_instance(plan, graph, cluster)
        seen = set()
        for rule in list_rules(inst, split):
            programs = list_schedule(inst, rule, split)
            assert programs is not None, rule.name  # loose caps: no rule stalls
            seen.add(programs)
        for programs in sorted(seen)[:3]:
            check_against_simulate(plan, graph, cluster, programs)

    def test_warmup_depth_of_equal_stages_is_1f1b(self):
        """Equal stages, free links: whole backwards hold ``S - s`` microbatches, as 1F1B does."""
        layers = [Layer(f"l{i}", (0.0, 1.0), (0.0, 2.0), 1.0, 1.0, 1.0) for i in range(4)]
        graph = LayerGraph.chain("g", layers)
        cluster = Cluster("c", (Link(1e30, 0.0, "s0"),), Link(1e30, 0.0),
                          tuple(Device(f"d{i}", "s0", 1.0, 1e9) for i in range(4)))
        plan = Plan("g", "c", 8, 4.0, "custom", tuple(Stage((s, s + 1), (f"d{s}",), (1,) * 8) for s in range(4)))
        inst = schedule_instance(plan, graph, cluster)
        assert warmup_limits(inst, split_backward=False) == (4, 3, 2, 1)
        assert warmup_limits(inst) == (3, 3, 2, 1)  # I is half of B: the gradient is back sooner

    def test_limits_bound_the_stash(self):
        plan, graph, cluster = random_problem(random.Random(9), groups=3, microbatches=6, placement="v",
                                              recompute=0.0)
        inst = schedule_instance(plan, graph, cluster)
        least = evaluate(inst, sequential_programs(inst)).peak_memory
        caps = [p + 0.1 * (p - g.state) for p, g in zip(least, inst.groups)]  # room for 1.1 microbatches' stash
        tight = schedule_instance(plan, graph, cluster, memory_caps=caps)
        assert set(warmup_limits(tight)) == {1}
        for rule in list_rules(tight):
            assert evaluate(tight, list_schedule(tight, rule)).fits, rule.name


class TestSynthesize:
    @settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(seed=st.integers(0, 2 ** 32 - 1), placement=st.sampled_from(PLACEMENTS))
    def test_never_slower_than_a_fixed_schedule(self, seed, placement):
        """Unequal stages, devices and links: at most the time of every fixed schedule's programs that fit."""
        rng = random.Random(seed)
        plan, graph, cluster = random_problem(rng, groups=rng.randint(2, 3), microbatches=rng.randint(2, 6),
                                              placement=placement, unequal_splits=rng.random() < 0.3)
        inst = schedule_instance(plan, graph, cluster)
        syn = synthesize(inst)
        assert syn.fits
        for name, programs in fixed_programs(inst).items():
            try:
                fixed = evaluate(inst, programs)
            except ProgramDeadlock:  # 1F1B with unequal splits can deadlock
                continue
            assert syn.iteration_time <= fixed.iteration_time, name
        assert simulate(custom_plan(plan, syn.programs), graph, cluster).iteration_time == syn.iteration_time

    @pytest.mark.parametrize("placement", PLACEMENTS)
    def test_caps_hold_in_the_simulator(self, placement):
        plan, graph, cluster = random_problem(random.Random(11), groups=3, microbatches=6, placement=placement)
        inst = schedule_instance(plan, graph, cluster)
        least = evaluate(inst, sequential_programs(inst)).peak_memory
        most = evaluate(inst, synthesize(inst).programs).peak_memory
        caps = [a + 0.3 * (b - a) for a, b in zip(least, most)]
        syn = synthesize(schedule_instance(plan, graph, cluster, memory_caps=caps))
        assert syn.fits
        peaks = simulate(custom_plan(plan, syn.programs), graph, cluster).peak_memory
        assert all(p <= c for p, c in zip(peaks, caps))

    def test_a_cap_no_program_meets_is_reported(self):
        plan, graph, cluster = random_problem(random.Random(12), groups=3, microbatches=4, placement="v")
        inst = schedule_instance(plan, graph, cluster)
        least = evaluate(inst, sequential_programs(inst)).peak_memory
        caps = [p if g != 1 else p * 0.99 for g, p in enumerate(least)]
        syn = synthesize(schedule_instance(plan, graph, cluster, memory_caps=caps))
        assert not syn.fits and syn.timeline.excess > 0
        assert syn.reason is not None and syn.reason.startswith("group 1 needs")
        assert "even one microbatch at a time" in syn.reason and "so no program fits" in syn.reason

    @pytest.mark.parametrize("placement", PLACEMENTS)
    def test_equal_stages_within_one_percent_of_the_best_generator(self, placement):
        layers = [Layer(f"l{i}", (1e-5, 1e-4), (2e-5, 2e-4), 1e7, 1e6, 1e5) for i in range(8)]
        graph = LayerGraph.chain("g", layers, input_bytes=1e5)
        cluster = Cluster("c", (Link(1e11, 5e-6, "s0"),), Link(1e10, 1e-5),
                          tuple(Device(f"d{i}", "s0", 1.0, 1e12) for i in range(4)))
        owner = placement_groups(placement, 4)
        per = 8 // len(owner)
        plan = Plan("g", "c", 16, 4.0, "custom", tuple(Stage((s * per, s * per + per), (f"d{owner[s]}",), (2,) * 8)
                                                       for s in range(len(owner))))
        inst = schedule_instance(plan, graph, cluster)
        best = min(evaluate(inst, p).iteration_time for p in fixed_programs(inst).values())
        assert synthesize(inst).iteration_time <= 1.01 * best

    def test_deterministic(self):
        plan, graph, cluster = random_problem(random.Random(13), groups=3, microbatches=5, placement="looped")
        inst = schedule_instance(plan, graph, cluster)
        first, second = synthesize(inst), synthesize(inst)
        assert first.programs == second.programs and first.source == second.source

    def test_whole_backwards_when_asked(self):
        plan, graph, cluster = random_problem(random.Random(14), groups=3, microbatches=4)
        syn = synthesize(schedule_instance(plan, graph, cluster), split_backward=False)
        assert {a.kind for p in syn.programs for a in p} == {FORWARD, FULL_BACKWARD}

    def test_split_backwards(self):
        programs = ((Action(0, "F", 0), Action(0, "B", 0)),)
        assert split_backwards(programs) == ((Action(0, "F", 0), Action(0, "I", 0), Action(0, "W", 0)),)

    def test_custom_rules(self):
        plan, graph, cluster = random_problem(random.Random(15), groups=2, microbatches=3)
        inst = schedule_instance(plan, graph, cluster)
        rule = ListRule("mine", True, True, "eager", (2, 1))
        syn = synthesize(inst, fixed=False, rules=[rule])
        assert [c.source for c in syn.candidates] == ["list: mine", "sequential"]
