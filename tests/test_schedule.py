"""Schedules (spec 7.2): the schedule classes and their lookup, the programs each generates (equal to torch
2.13's), per-stage and custom programs read and checked, torch's CSV."""

import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.pipelining import schedules as torch_schedules
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

from conftest import ROOT
from pipeplan.models.errors import InputError
from pipeplan.solver.schedules.needs import NEEDS
from pipeplan.solver.schedules.schedule import (NAMED_V2, ONE_STAGE_PER_GROUP, SCHEDULE_CLASSES, SCHEDULES, Action,
                                                Schedule, check_counts, check_programs, check_stage_ops,
                                                format_action, group_programs, num_stages, parse_action,
                                                programs_from_csv, programs_to_csv, schedule_for, stage_actions,
                                                stage_group)

GOLDEN = ROOT / "tests" / "data" / "schedules"
MAX_GROUPS, MAX_VIRTUAL, MAX_MICROBATCHES = 6, 4, 16
TORCH_CLASS = {
    "interleaved-1f1b": torch_schedules.ScheduleInterleaved1F1B,
    "interleaved-zb": torch_schedules.ScheduleInterleavedZeroBubble,
    "looped-bfs": torch_schedules.ScheduleLoopedBFS,
    "zbv": torch_schedules.ScheduleZBVZeroBubble,
}


class StubStage:
    """What torch's multi-stage schedule constructors read of a pipeline stage, nothing more."""

    def __init__(self, index, count, groups, rank):
        self.stage_index, self.num_stages = index, count
        self.group_size, self.group_rank = groups, rank
        self.is_first, self.is_last = index == 0, index == count - 1
        self.submod = None
        self.stage_index_to_group_rank = None


def torch_stage_indices(name, groups, virtual, rank):
    """The stages rank 0 holds, as torch's users hand them to the constructor (V-shaped for zbv)."""
    count = groups * virtual
    if name == "zbv" and virtual == 2:
        return [rank, count - 1 - rank]
    return list(range(rank, count, groups))


def build_torch_schedule(name, groups, virtual, microbatches):
    """torch's schedule object for these counts, or the ValueError its constructor raised."""
    stages = [StubStage(i, groups * virtual, groups, 0) for i in torch_stage_indices(name, groups, virtual, 0)]
    try:
        return TORCH_CLASS[name](stages, microbatches)
    except ValueError as exc:
        return exc


torch_schedule = functools.lru_cache(maxsize=None)(build_torch_schedule)
"""Built once per parameter set; tests that change the object build their own."""


def torch_programs(schedule):
    """Every rank's compute actions with the idle slots dropped, as plain tuples."""
    return [[(a.stage_index, a.computation_type.value, a.microbatch_index) for a in schedule.pipeline_order[r]
             if a is not None] for r in sorted(schedule.pipeline_order)]


def text(program):
    return [format_action(a) for a in program]


def ops(actions):
    """A stage's actions as its op list writes them (``"F0"``)."""
    return [f"{a.kind}{a.microbatch}" for a in actions]


GENERATED = [cls for cls in SCHEDULE_CLASSES.values() if not cls.from_plan]
"""Every class whose programs the schedule generates (all but ``custom``)."""


def small_counts(cls):
    """``(groups, virtual, m)`` the class accepts, a few of each."""
    virtuals = (cls.stages_per_group,) if cls.stages_per_group else (1, 2, 3)
    for groups, virtual, m in itertools.product((1, 2, 3), virtuals, (1, 2, 4, 6)):
        try:
            cls.check_counts(groups, m, virtual)
        except ValueError:
            continue
        yield groups, virtual, m


class TestScheduleFor:
    @pytest.mark.parametrize("name", SCHEDULES)
    def test_each_name_has_its_class(self, name):
        assert schedule_for(name) is SCHEDULE_CLASSES[name] and schedule_for(name).name == name
        assert issubclass(schedule_for(name), Schedule)

    @pytest.mark.parametrize("bad", ["pipedream", "1F1B", "", None, 3])
    def test_unknown_names_list_the_valid_ones(self, bad):
        with pytest.raises(ValueError, match=f"unknown schedule {bad!r}; valid: gpipe, 1f1b, custom, "
                                             f"interleaved-1f1b, interleaved-zb, looped-bfs, zbv$"):
            schedule_for(bad)

    def test_one_class_per_name(self):
        assert len(set(SCHEDULE_CLASSES.values())) == len(SCHEDULES) == 7

    def test_a_schedule_is_used_as_its_class(self):
        with pytest.raises(TypeError, match="used as a class"):
            schedule_for("1f1b")()


class TestScheduleClasses:
    """What each class declares, checked against what it generates."""

    @pytest.mark.parametrize("name, per_group, split", [
        ("gpipe", 1, False), ("1f1b", 1, False), ("interleaved-1f1b", None, False), ("interleaved-zb", None, True),
        ("looped-bfs", None, False), ("zbv", 2, True)])
    def test_what_planning_needs(self, name, per_group, split):
        assert (NEEDS[name].stages_per_group, NEEDS[name].split_backward) == (per_group, split)
        assert NEEDS[name].several_stages == (per_group != 1)

    def test_planned_schedules_are_the_generated_ones(self):
        assert list(NEEDS.values()) == GENERATED
        assert [c.name for c in SCHEDULE_CLASSES.values() if c.one_stage_per_group] == list(ONE_STAGE_PER_GROUP)
        assert NAMED_V2 == ("interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv")

    @pytest.mark.parametrize("cls", GENERATED, ids=lambda c: c.name)
    def test_split_backward_is_what_the_programs_run(self, cls):
        for groups, virtual, m in small_counts(cls):
            kinds = {a.kind for p in cls.programs(groups, m, virtual) for a in p}
            assert kinds == ({"F", "I", "W"} if cls.split_backward else {"F", "B"}), (groups, virtual, m)

    @pytest.mark.parametrize("cls", GENERATED, ids=lambda c: c.name)
    def test_stages_per_group_is_what_the_programs_hold(self, cls):
        for groups, virtual, m in small_counts(cls):
            held = [{a.stage for a in p} for p in cls.programs(groups, m, virtual)]
            assert {len(stages) for stages in held} == {cls.stages_per_group or virtual}
            assert all(cls.stage_group(s, groups) == g for g, stages in enumerate(held) for s in stages)

    @pytest.mark.parametrize("cls", GENERATED, ids=lambda c: c.name)
    def test_warmup_attributes_are_what_a_stage_runs(self, cls):
        if not cls.one_stage_per_group:
            assert not (cls.forwards_first or cls.warmup_per_later_stage)
            return
        assert cls.forwards_first != cls.warmup_per_later_stage
        for groups, virtual, m in small_counts(cls):
            for s, program in enumerate(cls.programs(groups, m, virtual)):
                warmup = m if cls.forwards_first else min(groups - 1 - s, m)
                assert cls.warmup(s, groups, m) == warmup
                # the forwards before the first backward: the warm-up, and the steady state's first one
                assert next(i for i, a in enumerate(program) if a.kind != "F") == min(warmup + 1, m)

    def test_custom_generates_nothing(self):
        custom = schedule_for("custom")
        assert custom.from_plan and not custom.planned and custom.placement is None
        for call in (lambda: custom.programs(2, 2), lambda: custom.num_stages(2), lambda: custom.stage_group(0, 2)):
            with pytest.raises(ValueError, match="custom schedule has no generated programs"):
                call()


class TestCheckCounts:
    @pytest.mark.parametrize("name", SCHEDULES)
    def test_counts_below_one_are_refused_for_every_name(self, name):
        with pytest.raises(ValueError, match=f"{name} needs microbatches >= 1"):
            check_counts(name, 2, 0, 1)

    def test_interleaved_rounds(self):
        check_counts("interleaved-zb", 2, 6, 2)
        with pytest.raises(ValueError, match="multiple of rounds"):
            check_counts("interleaved-zb", 2, 7, 2)
        check_counts("looped-bfs", 2, 7, 2)

    def test_unknown_name(self):
        with pytest.raises(ValueError, match="unknown schedule 'x'"):
            check_counts("x", 1, 1, 1)




class TestGroupPrograms:
    @pytest.mark.parametrize("name, groups", list(itertools.product(NAMED_V2, range(1, MAX_GROUPS + 1))))
    def test_every_count_torch_accepts(self, name, groups):
        compared = 0
        for virtual, m in itertools.product(range(1, MAX_VIRTUAL + 1), range(1, MAX_MICROBATCHES + 1)):
            if name == "zbv" and virtual == 1:
                continue  # our virtual = 1 means "not given" for zbv; torch's one-stage case is checked below
            theirs = torch_schedule(name, groups, virtual, m)
            if isinstance(theirs, ValueError):
                with pytest.raises(ValueError) as info:
                    group_programs(name, groups, m, virtual)
                assert "\n" not in str(info.value)
                continue
            ours = group_programs(name, groups, m, virtual)
            for g, (mine, torch_program) in enumerate(zip(ours, torch_programs(theirs), strict=True)):
                assert [tuple(a) for a in mine] == torch_program, (name, groups, virtual, m, g)
            compared += 1
        assert compared > 0

    def test_torch_refuses_zbv_with_one_stage_per_rank(self):
        assert isinstance(torch_schedule("zbv", 2, 1, 4), ValueError)
        assert group_programs("zbv", 2, 4, 1) == group_programs("zbv", 2, 4, 2)

    @pytest.mark.parametrize("name, groups, virtual, m, rounds, fix", [
        ("interleaved-1f1b", 4, 2, 9, 2, "8 or 10"), ("interleaved-zb", 2, 3, 7, 3, "6 or 8"),
        ("interleaved-1f1b", 3, 1, 10, 3, "9 or 12")])
    def test_refused_like_torch_with_the_numbers(self, name, groups, virtual, m, rounds, fix):
        assert isinstance(torch_schedule(name, groups, virtual, m), ValueError)
        with pytest.raises(ValueError, match=f"multiple of rounds = max\\(1, m // R\\) = {rounds}; "
                                             f"m = {m} with R = {groups} groups is not: use m = {fix}$"):
            group_programs(name, groups, m, virtual)

    @pytest.mark.parametrize("virtual", [3, 4])
    def test_zbv_refuses_other_stage_counts(self, virtual):
        assert isinstance(torch_schedule("zbv", 2, virtual, 4), ValueError)
        with pytest.raises(ValueError, match=f"exactly 2 stages per group, got virtual = {virtual}"):
            group_programs("zbv", 2, 4, virtual)



    def test_interleaved_1f1b(self):
        # R = v = m = 2: rounds 1, p = 2; group 1 warms up w = min(1*2 + 2*0, 4) = 2 forwards of stage 1
        assert text(group_programs("interleaved-1f1b", 2, 2, 2)[1]) == [
            "1F0", "1F1", "3F0", "3B0", "3F1", "3B1", "1B0", "1B1"]

    def test_interleaved_zb_pairs_i_with_w_from_the_second_backward_on_group_1(self):
        # w = min(2 + 1*0, 4) = 2; I number j >= g = 1 is followed by the earliest missing W
        assert text(group_programs("interleaved-zb", 2, 2, 2)[1]) == [
            "1F0", "1F1", "3F0", "3I0", "3F1", "3I1", "3W0", "1I0", "3W1", "1I1", "1W0", "1W1"]

    def test_looped_bfs(self):
        assert text(group_programs("looped-bfs", 2, 2, 2)[1]) == [
            "1F0", "1F1", "3F0", "3F1", "3B1", "3B0", "1B1", "1B0"]

    def test_zbv_one_group(self):
        # n = max(2*1-1, 2) = 2: warm-up 0F0; one triple on chunk 1; one steady step; cool-down 0I1 0W1
        assert text(group_programs("zbv", 1, 2)[0]) == [
            "0F0", "1F0", "1I0", "1W0", "0F1", "0I0", "0W0", "1F1", "1I1", "1W1", "0I1", "0W1"]

    def test_zbv_drops_the_padding_microbatches(self):
        # R = 3 builds n = 5 microbatches; with m = 2 nothing of microbatches 2..4 remains
        programs = group_programs("zbv", 3, 2)
        assert {a.microbatch for p in programs for a in p} == {0, 1}
        assert sum(len(p) for p in programs) == 6 * 2 * 3

    @pytest.mark.parametrize("name", ["gpipe", "1f1b"])
    def test_one_stage_groups_run_the_version_1_lists(self, name):
        assert text(group_programs(name, 2, 2)[0]) == (
            ["0F0", "0F1", "0B0", "0B1"] if name == "gpipe" else ["0F0", "0F1", "0B0", "0B1"])
        assert text(group_programs(name, 2, 2)[1]) == (
            ["1F0", "1F1", "1B0", "1B1"] if name == "gpipe" else ["1F0", "1B0", "1F1", "1B1"])

    @pytest.mark.parametrize("name", ["gpipe", "1f1b"])
    def test_one_stage_groups_refuse_virtual_stages(self, name):
        with pytest.raises(ValueError, match="one stage per group, got virtual = 2"):
            group_programs(name, 2, 2, 2)

    @pytest.mark.parametrize("args, what", [
        (("custom", 2, 2), "custom schedule has no generated programs"),
        (("pipedream", 2, 2), "unknown schedule 'pipedream'"),
        (("looped-bfs", 0, 2), "groups >= 1"),
        (("looped-bfs", 2, 0), "microbatches >= 1"),
        (("looped-bfs", 2, 2, 0), "virtual >= 1"),
    ])
    def test_bad_arguments(self, args, what):
        with pytest.raises(ValueError, match=what):
            group_programs(*args)

    @pytest.mark.parametrize("name", SCHEDULES[:2] + NAMED_V2)
    def test_generated_programs_pass_the_custom_checks(self, name):
        for groups, virtual, m in itertools.product((1, 2, 3), (1, 2), (1, 3, 6)):
            if name in ("gpipe", "1f1b") and virtual > 1:
                continue
            programs = group_programs(name, groups, m, virtual)
            stages = num_stages(name, groups, virtual)
            owners = [stage_group(name, s, groups) for s in range(stages)]
            assert check_programs([text(p) for p in programs], owners, [m] * stages, "-", "programs") == programs


class TestStageActions:
    def test_gpipe_all_forwards_then_all_backwards(self):
        assert ops(stage_actions("gpipe", 3, 1, 2)) == ["F0", "F1", "F2", "B0", "B1", "B2"]
        assert {a.stage for a in stage_actions("gpipe", 3, 1, 2)} == {1}

    def test_1f1b_first_stage_of_four(self):
        assert ops(stage_actions("1f1b", 5, 0, 4)) == ["F0", "F1", "F2", "F3", "B0", "F4", "B1", "B2", "B3", "B4"]

    def test_1f1b_last_stage_alternates(self):
        assert ops(stage_actions("1f1b", 3, 3, 4)) == ["F0", "B0", "F1", "B1", "F2", "B2"]

    def test_1f1b_fewer_microbatches_than_warmup(self):
        # w = min(S-1-s, m) = 2: all forwards, then all backwards
        assert ops(stage_actions("1f1b", 2, 0, 4)) == ["F0", "F1", "B0", "B1"]

    @pytest.mark.parametrize("m, s, S", [(1, 0, 1), (4, 1, 3), (7, 0, 8), (8, 2, 3)])
    def test_every_op_once_forward_first(self, m, s, S):
        assert check_stage_ops(ops(stage_actions("1f1b", m, s, S)), s, m, "-", "ops") == list(stage_actions("1f1b", m, s, S))

    @pytest.mark.parametrize("name", NAMED_V2 + ("custom",))
    def test_only_one_stage_per_group_schedules_have_them(self, name):
        with pytest.raises(ValueError, match=f"{name} does not generate per-stage programs; valid: gpipe, 1f1b"):
            stage_actions(name, 2, 0, 2)


class TestCheckStageOps:
    def test_split_backwards_are_read(self):
        assert ops(check_stage_ops(["F0", "F1", "I0", "B1", "W0"], 3, 2, "-", "ops")) == ["F0", "F1", "I0", "B1", "W0"]

    @pytest.mark.parametrize("ops, where, what", [
        (["F0", "B0", "F1"], "ops", "missing ops B1"),
        (["F0", "I0", "F1", "B1"], "ops", "missing ops W0"),
        (["F0", "B1", "F1", "B0"], "ops[1]", "B1 comes before F1"),
        (["F0", "W0", "I0", "F1", "B1"], "ops[1]", "W0 comes before I0"),
        (["F0", "B0", "I0"], "ops[2]", "I0 splits the backward of microbatch 0, which already ran whole"),
        (["F0", "I0", "B0"], "ops[2]", "B0 is a whole backward, but microbatch 0 already split"),
        (["F0", "F0", "B0"], "ops[1]", "appears twice"),
        (["F0", "F2", "B0"], "ops[1]", "names microbatch 2"),
        (["F0", "Q1"], "ops[1]", "not of the form"),
        (["F0", "0B0"], "ops[1]", "not of the form"),
    ])
    def test_bad_lists(self, ops, where, what):
        with pytest.raises(InputError) as info:
            check_stage_ops(ops, 0, 2, "p.json", "ops")
        assert info.value.where == where and what in info.value.what

    @pytest.mark.parametrize("bad", ["F", "X0", "F-1", "f0", "F01", "B 1", 3])
    def test_rejects_what_is_no_op(self, bad):
        with pytest.raises(InputError, match="not of the form"):
            check_stage_ops([bad], 0, 1, "-", "ops")


class TestNumStages:
    @pytest.mark.parametrize("name, groups, virtual, expected", [
        ("gpipe", 3, 1, 3), ("1f1b", 5, 1, 5), ("interleaved-1f1b", 4, 3, 12), ("interleaved-zb", 2, 4, 8),
        ("looped-bfs", 3, 2, 6), ("zbv", 3, 1, 6), ("zbv", 3, 2, 6)])
    def test_counts(self, name, groups, virtual, expected):
        assert num_stages(name, groups, virtual) == expected

    def test_custom_refused(self):
        with pytest.raises(ValueError, match="custom"):
            num_stages("custom", 2, 1)


class TestStageGroup:
    @pytest.mark.parametrize("name, virtual", [
        ("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 3), ("interleaved-zb", 2), ("looped-bfs", 4), ("zbv", 2)])
    def test_equals_torch_mapping_of_the_class_placement(self, name, virtual):
        for groups in range(1, MAX_GROUPS + 1):
            count = num_stages(name, groups, virtual)
            expected = generate_stage_to_rank_mapping(groups, count, style=schedule_for(name).placement)
            assert {s: stage_group(name, s, groups) for s in range(count)} == expected

    def test_one_stage_groups(self):
        assert [stage_group("1f1b", s, 3) for s in range(3)] == [0, 1, 2]

    @pytest.mark.parametrize("name, stage", [("1f1b", 3), ("zbv", 6), ("gpipe", -1)])
    def test_stage_outside_the_schedule(self, name, stage):
        with pytest.raises(ValueError, match="stage"):
            stage_group(name, stage, 3)


class TestParseAction:
    @pytest.mark.parametrize("given, expected", [
        ("0F3", Action(0, "F", 3)), ("12B0", Action(12, "B", 0)), ("3I5", Action(3, "I", 5)),
        ("1W10", Action(1, "W", 10))])
    def test_reads(self, given, expected):
        assert parse_action(given) == expected

    @pytest.mark.parametrize("bad", ["F3", "0F", "0X1", "01F1", "0F01", " 0F1", "0f1", "0F1\n", "0SEND_F1", 3, None])
    def test_rejects(self, bad):
        with pytest.raises(ValueError, match="not of the form <stage><kind><microbatch>"):
            parse_action(bad)


class TestFormatAction:
    def test_round_trip(self):
        assert format_action(Action(0, "I", 2)) == "0I2"
        assert parse_action(format_action(Action(7, "W", 11))) == Action(7, "W", 11)

    def test_matches_torch_text(self):
        action = torch_schedules._Action(3, torch_schedules.BACKWARD_INPUT, 5)
        assert format_action(Action(3, "I", 5)) == str(action)


def in_dependency_order(program):
    """The oracle: every B or I after its F, every W after its I (the only order rules one group can break)."""
    position = {a: i for i, a in enumerate(program)}
    for a in program:
        needs = {"B": "F", "I": "F", "W": "I"}.get(a.kind)
        if needs and position[Action(a.stage, needs, a.microbatch)] > position[a]:
            return False
    return True


@st.composite
def shuffled_programs(draw):
    name = draw(st.sampled_from(NAMED_V2))
    groups, m = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    virtual = 2 if name == "zbv" else draw(st.integers(1, 2))
    programs = [draw(st.permutations(p)) for p in group_programs(name, groups, m, virtual)]
    count = num_stages(name, groups, virtual)
    return programs, [stage_group(name, s, groups) for s in range(count)], [m] * count


class TestCheckPrograms:
    """One test per rule; two stages on group 0 and one on group 1 (stage 2), two microbatches each."""

    OWNERS, COUNTS = [0, 0, 1], [2, 2, 1]
    GOOD = [["0F0", "0F1", "1F0", "1F1", "1B0", "1I1", "0B0", "1W1", "0I1", "0W1"], ["2F0", "2B0"]]

    def check(self, programs):
        return check_programs(programs, self.OWNERS, self.COUNTS, "p.json", "programs")

    def fails(self, programs, where, what):
        with pytest.raises(InputError) as info:
            self.check(programs)
        assert info.value.where == where and what in info.value.what, info.value.what
        return info.value.what

    def test_accepts_a_valid_mix_of_b_and_i_w(self):
        assert self.check(self.GOOD) == [[parse_action(t) for t in p] for p in self.GOOD]

    def test_accepts_actions(self):
        programs = [[parse_action(t) for t in p] for p in self.GOOD]
        assert self.check(programs) == programs

    def test_not_a_list(self):
        self.fails({"0": []}, "programs", "expected a list of 2 programs")

    def test_wrong_number_of_programs(self):
        self.fails([self.GOOD[0]], "programs", "one program per device group, 2 in all, got 1")

    def test_not_an_action(self):
        self.fails([["0F0", "0Q1"], ["2F0", "2B0"]], "programs[0][1]", "not of the form")

    def test_unknown_stage(self):
        self.fails([["0F0", "5F0"], ["2F0", "2B0"]], "programs[0][1]", "names stage 5, but the plan has 3 stages")

    def test_unknown_microbatch(self):
        self.fails([self.GOOD[0], ["2F0", "2F1"]], "programs[1][1]", "microbatch 1, but stage 2 has 1 microbatches")

    def test_action_on_a_group_that_does_not_hold_its_stage(self):
        what = self.fails([["2F0"] + self.GOOD[0], ["2B0"]], "programs[0][0]",
                          "runs stage 2, which group 1 holds, not group 0")
        assert "move it to programs[1]" in what

    def test_repeated_action(self):
        self.fails([["0F0", "0F0"], ["2F0", "2B0"]], "programs[0][1]", "0F0 appears twice (first at programs[0][0])")

    def test_backward_before_forward(self):
        self.fails([["0B0", "0F0"], ["2F0", "2B0"]], "programs[0][0]", "0B0 comes before 0F0")

    def test_input_backward_before_forward(self):
        self.fails([["0I0", "0F0"], ["2F0", "2B0"]], "programs[0][0]", "0I0 comes before 0F0")

    def test_weight_before_its_input_backward(self):
        self.fails([["0F0", "0W0", "0I0"], ["2F0", "2B0"]], "programs[0][1]", "0W0 comes before 0I0")

    def test_whole_backward_after_a_split_one(self):
        what = self.fails([["0F0", "0I0", "0B0"], ["2F0", "2B0"]], "programs[0][2]", "already split its backward")
        assert "run either 0B0 or 0I0 then 0W0" in what

    def test_split_backward_after_a_whole_one(self):
        self.fails([["0F0", "0B0", "0I0"], ["2F0", "2B0"]], "programs[0][2]", "already ran whole as 0B0")

    def test_weight_after_a_whole_backward(self):
        self.fails([["0F0", "0B0", "0W0"], ["2F0", "2B0"]], "programs[0][2]", "already ran whole as 0B0")

    def test_missing_actions(self):
        what = self.fails([self.GOOD[0][:-1], ["2F0"]], "programs[0]", "group 0 misses 1 action(s): 0W1")
        assert "one F and then one B, or one I and later one W" in what
        self.fails([self.GOOD[0], ["2F0"]], "programs[1]", "misses 1 action(s): 2B0 (or 2I0 and 2W0)")
        self.fails([self.GOOD[0], []], "programs[1]", "misses 2 action(s): 2F0, 2B0")

    @settings(max_examples=150, deadline=None)
    @given(shuffled_programs())
    def test_accepts_a_reordering_exactly_when_dependencies_hold(self, case):
        programs, owners, counts = case
        texts = [text(p) for p in programs]
        if all(in_dependency_order(p) for p in programs):
            assert check_programs(texts, owners, counts, "-", "programs") == programs
        else:
            with pytest.raises(InputError, match="comes before"):
                check_programs(texts, owners, counts, "-", "programs")


class TestProgramsToCsv:
    @pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.csv")), ids=lambda p: p.stem)
    def test_golden_files(self, path):
        name, groups, virtual, m = parse_golden_name(path.stem)
        assert programs_to_csv(group_programs(name, groups, m, virtual)) == path.read_bytes().decode()

    def test_every_schedule_has_golden_files(self):
        assert {parse_golden_name(p.stem)[0] for p in GOLDEN.glob("*.csv")} == set(NAMED_V2)

    def test_equals_torch_dump(self, tmp_path):
        schedule = build_torch_schedule("interleaved-zb", 3, 2, 6)
        schedule.pipeline_order = {r: [a for a in ops if a is not None] for r, ops in schedule.pipeline_order.items()}
        schedule._dump_csv(str(tmp_path / "torch.csv"), format="compute_only")
        ours = programs_to_csv(group_programs("interleaved-zb", 3, 6, 2))
        assert (tmp_path / "torch.csv").read_bytes() == ours.encode()


class TestProgramsFromCsv:
    @pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.csv")), ids=lambda p: p.stem)
    def test_golden_files_round_trip(self, path):
        name, groups, virtual, m = parse_golden_name(path.stem)
        count = num_stages(name, groups, virtual)
        owners = [stage_group(name, s, groups) for s in range(count)]
        assert programs_from_csv(path.read_text(), owners, [m] * count, str(path)) == group_programs(
            name, groups, m, virtual)

    @pytest.mark.parametrize("name, groups, virtual, m", [
        ("interleaved-1f1b", 2, 2, 4), ("interleaved-zb", 4, 2, 8), ("looped-bfs", 3, 2, 3), ("zbv", 3, 2, 4)])
    def test_torch_load_csv_reads_ours(self, tmp_path, name, groups, virtual, m):
        path = tmp_path / "ours.csv"
        path.write_text(programs_to_csv(group_programs(name, groups, m, virtual)), newline="")
        schedule = build_torch_schedule(name, groups, virtual, m)
        schedule._load_csv(str(path))
        assert torch_programs(schedule) == [[tuple(a) for a in p] for p in group_programs(name, groups, m, virtual)]

    def test_reads_torch_dump_with_idle_slots(self, tmp_path):
        schedule = torch_schedule("interleaved-1f1b", 2, 2, 4)
        assert any(a is None for ops in schedule.pipeline_order.values() for a in ops)
        schedule._dump_csv(str(tmp_path / "torch.csv"), format="compute_only")
        owners = [stage_group("interleaved-1f1b", s, 2) for s in range(4)]
        got = programs_from_csv((tmp_path / "torch.csv").read_text(), owners, [4] * 4)
        assert got == group_programs("interleaved-1f1b", 2, 4, 2)

    def test_bad_cell_is_placed(self):
        with pytest.raises(InputError) as info:
            programs_from_csv("0F0,0SEND_F0,0B0\n", [0], [1], "s.csv")
        assert (info.value.file, info.value.where) == ("s.csv", "rows[0][1]")

    def test_missing_row(self):
        with pytest.raises(InputError, match="one program per device group, 2 in all, got 1"):
            programs_from_csv("0F0,0B0\n", [0, 1], [1, 1])


def parse_golden_name(stem):
    """``"interleaved-zb-R4-v2-m8"`` -> ``("interleaved-zb", 4, 2, 8)``."""
    name, groups, virtual, m = stem.rsplit("-", 3)
    return name, int(groups[1:]), int(virtual[1:]), int(m[1:])
