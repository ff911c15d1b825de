"""Plans (spec sections 3 and 7.2): every validation rule, reading and writing ``/1`` and ``/2``, the CLI's view."""

import json

import pytest

from conftest import EXAMPLES, chain, cluster
from pipeplan.models.errors import InputError
from pipeplan.models.graph import load_graph
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.formats.plan import PLAN_FORMAT, PLAN_FORMAT_V2, Plan, Stage, equal_split, load_plan
from pipeplan.solver.schedules.schedule import schedule_for

EXAMPLE = "examples/interleaved.plan.json"
GRAPH, CLUSTER = "examples/gpt-tiny.graph.json", "examples/cpu-pair.cluster.json"


def base() -> dict:
    """A /1 plan dict: two stages, per-stage splits, a replicated and recomputing stage."""
    return {
        "format": "pipeplan.plan/1", "graph": "g", "cluster": "c", "global_batch": 8, "state_factor": 4,
        "schedule": "1f1b",
        "stages": [
            {"layers": [0, 2], "devices": ["d0"], "microbatches": [4, 4], "recompute": False},
            {"layers": [2, 4], "devices": ["d1", "d2"], "microbatches": [2, 2, 4], "recompute": True},
        ],
    }


def v2(schedule="interleaved-1f1b", layout=("a", "b", "a", "b"), split=(1, 1, 1, 1), **top):
    """A /2 plan dict: one layer per stage, ``layout[s]`` the device of stage s."""
    data = {"format": PLAN_FORMAT_V2, "graph": "g", "cluster": "c", "global_batch": sum(split), "state_factor": 4,
            "schedule": schedule,
            "stages": [{"layers": [s, s + 1], "devices": [d] if isinstance(d, str) else list(d),
                        "microbatches": list(split), "recompute": False} for s, d in enumerate(layout)]}
    data.update(top)
    return data


def refused(data):
    with pytest.raises(InputError) as info:
        Plan.from_dict(data, "p.json")
    assert "\n" not in str(info.value)
    return info.value.where, info.value.what


class TestValidate:
    def test_a_good_plan_passes(self):
        Plan.from_dict(base()).validate(chain(4), cluster(3))

    @pytest.mark.parametrize("mutate, where, what", [
        (lambda d: d["stages"][1].update(layers=[3, 4]), "stages[1].layers", "gap: layers 2..2"),
        (lambda d: d["stages"][1].update(layers=[1, 4]), "stages[1].layers", "overlap: layers 1..1"),
        (lambda d: d["stages"][1].update(layers=[2, 2]), "stages[1].layers", "is empty"),
        (lambda d: d["stages"][0].update(layers=[1, 2]), "stages[0].layers", "gap: layers 0..0"),
        (lambda d: d["stages"][1].update(devices=["d0"]), "stages[1].devices[0]", "already used by stage 0"),
        (lambda d: d["stages"][1].update(devices=["d1", "d1"]), "stages[1].devices[1]", "already used"),
        (lambda d: d["stages"][1].update(devices=[]), "stages[1].devices", "must not be empty"),
        (lambda d: d["stages"][0].update(microbatches=[4, 3]), "stages[0].microbatches", "sum to 7"),
        (lambda d: d["stages"][0].update(microbatches=[8, 0]), "stages[0].microbatches[1]", "must be positive"),
        (lambda d: d["stages"][0].update(microbatches=[9, -1]), "stages[0].microbatches[1]", "must be positive"),
        (lambda d: d["stages"][0].update(microbatches=[4.0, 4]), "stages[0].microbatches[0]", "expected an integer"),
        (lambda d: d.update(schedule="zb-v"), "schedule", "unknown schedule 'zb-v'"),
        (lambda d: d.update(global_batch=0), "global_batch", "at least 1"),
        (lambda d: d.update(format="pipeplan.plan/9"), "format", "unknown format version"),
        (lambda d: d.pop("state_factor"), "state_factor", "missing required field"),
        (lambda d: d["stages"][0].update(recompute="yes"), "stages[0].recompute", "expected true or false"),
        (lambda d: d.update(stages=[]), "stages", "must not be empty"),
        (lambda d: d.update(schedule="custom"), "stages[0].ops", "custom schedule needs an op list"),
    ])
    def test_broken_rules(self, mutate, where, what):
        data = base()
        mutate(data)
        with pytest.raises(InputError) as info:
            Plan.from_dict(data, "p.json")
        assert (info.value.file, info.value.where) == ("p.json", where)
        assert what in info.value.what

    def test_layers_must_cover_the_graph(self):
        with pytest.raises(InputError, match="layers 4..4 belong to no stage"):
            Plan.from_dict(base()).validate(chain(5), cluster(3))
        with pytest.raises(InputError, match="the graph has only 3 layers"):
            Plan.from_dict(base()).validate(chain(3), cluster(3))

    def test_devices_must_exist(self):
        with pytest.raises(InputError) as info:
            Plan.from_dict(base()).validate(chain(4), cluster(2), "p.json")
        assert info.value.where == "stages[1].devices[1]" and "unknown device 'd2'" in info.value.what

    def test_custom_ops_checked(self):
        data = base()
        data["schedule"] = "custom"
        data["stages"][0]["ops"] = ["F0", "F1", "B0", "B1"]
        data["stages"][1]["ops"] = ["F0", "B1", "F1", "F2", "B0", "B2"]
        with pytest.raises(InputError) as info:
            Plan.from_dict(data)
        assert info.value.where == "stages[1].ops[1]" and "B1 comes before F1" in info.value.what


    def test_an_op_list_on_a_named_schedule_must_be_its_own(self):
        data = base()
        # stage 0 of 2 under 1f1b with 2 microbatches: w = 1, so F0 F1 B0 B1 (the same as gpipe's)
        data["stages"][0]["ops"] = ["F0", "F1", "B0", "B1"]
        data["stages"][1]["ops"] = ["F0", "B0", "F1", "B1", "F2", "B2"]  # the last stage: w = 0
        plan = Plan.from_dict(data)
        assert plan.to_dict()["stages"][1]["ops"] == ["F0", "B0", "F1", "B1", "F2", "B2"]
        data["stages"][1]["ops"] = ["F0", "F1", "B0", "B1", "F2", "B2"]
        with pytest.raises(InputError) as info:
            Plan.from_dict(data, "p.json")
        assert info.value.where == "stages[1].ops"
        assert "differs from this stage's 1f1b op list (F0 B0 F1 B1 F2 B2)" in info.value.what
        assert '"schedule": "custom"' in info.value.what


class TestFromDict:
    @pytest.mark.parametrize("schedule, layout", [
        ("interleaved-1f1b", "abab"), ("interleaved-zb", "abab"), ("looped-bfs", "abcabc"), ("zbv", "abba"),
        ("looped-bfs", "aa"), ("interleaved-1f1b", "a")])
    def test_named_schedules_read_and_round_trip(self, schedule, layout):
        plan = Plan.from_dict(v2(schedule, tuple(layout)), "p.json")
        assert plan.format == PLAN_FORMAT_V2
        assert Plan.from_dict(json.loads(json.dumps(plan.to_dict())), "q.json") == plan
        assert plan.virtual == len(layout) // len(set(layout))

    def test_groups_are_numbered_by_first_stage(self):
        plan = Plan.from_dict(v2("zbv", ("x", "y", "y", "x")), "p.json")
        assert plan.groups == [("x",), ("y",)]
        assert plan.stage_groups == [0, 1, 1, 0]

    def test_equal_as_sets_is_one_group(self):
        plan = Plan.from_dict(v2(layout=(("a", "b"), ("c",), ("b", "a"), ("c",))), "p.json")
        assert plan.stage_groups == [0, 1, 0, 1]

    def test_custom_programs(self):
        data = v2("custom", ("a", "a"), (1,), programs=[["0F0", "1F0", "1I0", "0B0", "1W0"]])
        plan = Plan.from_dict(data, "p.json")
        assert plan.programs() == data["programs"]
        assert [[f"{a.kind}{a.microbatch}" for a in actions] for actions in plan.stage_actions()] == \
            [["F0", "B0"], ["F0", "I0", "W0"]]
        assert plan.to_dict()["programs"] == data["programs"]

    def test_per_stage_ops_with_i_and_w(self):
        data = v2("custom", ("a", "b"), (1, 1))
        data["stages"][0]["ops"] = ["F0", "F1", "I0", "I1", "W1", "W0"]
        data["stages"][1]["ops"] = ["F0", "B0", "F1", "B1"]
        plan = Plan.from_dict(data, "p.json")
        assert plan.format == PLAN_FORMAT_V2
        assert plan.programs() == [["0F0", "0F1", "0I0", "0I1", "0W1", "0W0"], ["1F0", "1B0", "1F1", "1B1"]]


    def test_a_v1_plan_keeps_programs_as_an_unknown_field(self):
        data = v2("gpipe", ("a", "b"), (2,), format=PLAN_FORMAT, programs=[["x"]])
        plan = Plan.from_dict(data, "p.json")
        assert plan.custom_programs is None and plan.to_dict()["programs"] == [["x"]]


class TestBrokenRules:
    def test_partly_overlapping_devices(self):
        where, what = refused(v2(layout=(("a", "b"), ("c",), ("b", "d"), ("c",))))
        assert where == "stages[2].devices"
        assert "share b but not a, d" in what and "equal as sets" in what

    def test_stage_on_the_wrong_group(self):
        where, what = refused(v2(layout=("a", "b", "b", "a")))
        assert where == "stages[2].devices"
        assert "stage 2 runs on group 0" in what and "but it is on group 1" in what

    def test_wrong_stage_count(self):
        where, what = refused(v2("zbv", ("a", "b", "a", "b", "a", "b")))
        assert where == "stages" and "2R stages; this plan has 6 stages on 2 device groups" in what

    def test_different_microbatch_lists(self):
        data = v2(split=(2, 2))
        data["stages"][3]["microbatches"] = [1, 3]
        where, what = refused(data)
        assert where == "stages[3].microbatches" and "[1, 3] differs from stage 0's [2, 2]" in what

    def test_m_not_a_multiple_of_the_rounds(self):
        where, what = refused(v2(split=(1,) * 5))
        assert where == "stages[0].microbatches" and "multiple of rounds" in what

    def test_action_on_a_group_that_does_not_hold_its_stage(self):
        where, what = refused(v2("custom", ("a", "b"), (1,), programs=[["0F0", "1F0", "0B0"], ["1B0"]]))
        assert where == "programs[0][1]" and "group 1 holds" in what

    def test_w_before_its_i(self):
        where, what = refused(v2("custom", ("a",), (1,), programs=[["0F0", "0W0", "0I0"]]))
        assert where == "programs[0][1]" and "before 0I0" in what

    def test_missing_action(self):
        where, what = refused(v2("custom", ("a",), (1, 1), programs=[["0F0", "0B0", "0F1"]]))
        assert where == "programs[0]" and "0B1" in what

    def test_repeated_action(self):
        where, what = refused(v2("custom", ("a",), (1,), programs=[["0F0", "0F0", "0B0"]]))
        assert where == "programs[0][1]" and "appears twice" in what

    def test_per_stage_ops_report_their_own_place(self):
        data = v2("custom", ("a", "b"), (1,))
        data["stages"][0]["ops"] = ["F0", "W0", "I0"]
        data["stages"][1]["ops"] = ["F0", "B0"]
        where, what = refused(data)
        assert where == "stages[0].ops[1]" and "W0 comes before I0" in what

    def test_shared_group_under_a_one_stage_schedule(self):
        where, what = refused(v2("1f1b", ("a", "a"), (1,)))
        assert where == "stages[1].devices" and "every group holds one stage" in what

    def test_custom_shared_group_needs_programs(self):
        data = v2("custom", ("a", "a"), (1,))
        for stage in data["stages"]:
            stage["ops"] = ["F0", "B0"]
        where, what = refused(data)
        assert where == "stages[1].devices" and "custom programs" in what

    def test_programs_only_under_custom(self):
        where, what = refused(v2(programs=[["0F0"]]))
        assert where == "programs" and "only under" in what

    def test_programs_and_per_stage_ops_exclude_each_other(self):
        data = v2("custom", ("a",), (1,), programs=[["0F0", "0B0"]])
        data["stages"][0]["ops"] = ["F0", "B0"]
        where, _ = refused(data)
        assert where == "stages[0].ops"

    def test_per_stage_ops_under_a_v2_schedule(self):
        data = v2()
        data["stages"][0]["ops"] = ["F0", "B0"]
        where, what = refused(data)
        assert where == "stages[0].ops" and "not read" in what

    @pytest.mark.parametrize("mutate, where, what", [
        (lambda d: d.update(schedule="zbv"), "schedule", "version-2 schedule"),
        (lambda d: d["stages"][1].update(devices=["a"]), "stages[1].devices[0]", "at most one stage"),
        (lambda d: d.update(schedule="custom") or [s.update(ops=["F0", "I0", "W0"]) for s in d["stages"]],
         "stages[0].ops[1]", "splits the backward"),
    ])
    def test_a_v1_plan_may_not_use_version_2(self, mutate, where, what):
        data = v2("gpipe", ("a", "b"), (1,), format=PLAN_FORMAT)
        mutate(data)
        got_where, got_what = refused(data)
        assert got_where == where and what in got_what and PLAN_FORMAT_V2 in got_what


def _per_stage_ops(*ops):
    """A /2 custom plan dict with one stage per device and the given per-stage op lists."""
    data = v2("custom", tuple("abcd"[:len(ops)]), (1,))
    for stage, listed in zip(data["stages"], ops):
        stage["ops"] = list(listed)
    return data


class TestFormat:
    @pytest.mark.parametrize("data", [base(), v2("1f1b", ("a", "b"), (2, 2)), v2("gpipe", ("a",), (1, 1)),
                                      _per_stage_ops(["F0", "B0"], ["F0", "B0"])])
    def test_nothing_of_version_2_is_written_as_version_1(self, data):
        plan = Plan.from_dict(data, "p.json")
        assert plan.format == PLAN_FORMAT and plan.to_dict()["format"] == PLAN_FORMAT

    @pytest.mark.parametrize("data", [
        v2(), v2("zbv", ("a", "b", "b", "a")),
        v2("custom", ("a", "a"), (1,), programs=[["0F0", "1F0", "1B0", "0B0"]]),
        v2("custom", ("a", "b"), (1,), programs=[["0F0", "0B0"], ["1F0", "1B0"]]),
    ])
    def test_what_uses_version_2_is_written_as_version_2(self, data):
        plan = Plan.from_dict(data, "p.json")
        assert plan.format == PLAN_FORMAT_V2 and plan.to_dict()["format"] == PLAN_FORMAT_V2

    def test_split_backwards_in_per_stage_ops_are_version_2(self):
        assert Plan.from_dict(_per_stage_ops(["F0", "I0", "W0"], ["F0", "B0"]), "p.json").format == PLAN_FORMAT_V2


class TestStageActions:
    @pytest.mark.parametrize("schedule, layout, expected", [
        ("1f1b", "ab", [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]),
        ("looped-bfs", "abab", [["0F0", "0F1", "0B1", "0B0"], ["1F0", "1F1", "1B1", "1B0"],
                                ["2F0", "2F1", "2B1", "2B0"], ["3F0", "3F1", "3B1", "3B0"]]),
    ])
    def test_each_stage_in_its_groups_order(self, schedule, layout, expected):
        plan = Plan.from_dict(v2(schedule, tuple(layout), (1, 1)), "p.json")
        assert [[f"{a.stage}{a.kind}{a.microbatch}" for a in actions] for actions in plan.stage_actions()] == expected


class TestScheduleClass:
    @pytest.mark.parametrize("schedule, layout", [("1f1b", "ab"), ("zbv", "abba"), ("custom", "ab")])
    def test_the_plan_names_its_class(self, schedule, layout):
        plan = Plan.from_dict(v2(schedule, tuple(layout), (1, 1)) if schedule != "custom" else
                              _per_stage_ops(["F0", "B0"], ["F0", "B0"]), "p.json")
        assert plan.schedule_class is schedule_for(schedule) and plan.schedule_class.name == schedule

    def test_an_unknown_name_is_refused_where_the_plan_writes_it(self):
        data = base()
        data["schedule"] = "pipedream"
        with pytest.raises(InputError) as info:
            Plan.from_dict(data, "p.json")
        assert info.value.where == "schedule" and "unknown schedule 'pipedream'; valid: gpipe" in info.value.what


class TestRoundTrip:
    def test_extra_fields_survive(self):
        data = base()
        data["solver"] = {"name": "x", "status": "feasible"}
        data["stages"][0]["note"] = [1, 2]
        plan = Plan.from_dict(data)
        assert plan.to_dict() == data
        assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan

    @pytest.mark.parametrize("name, graph", [("hetero", "chain8"), ("skip8", "skip8"), ("custom", "chain8")])
    def test_examples(self, name, graph):
        g = load_graph(str(EXAMPLES / f"{graph}.graph.json"))
        c = load_cluster(str(EXAMPLES / "two-servers.cluster.json"))
        plan = load_plan(str(EXAMPLES / f"{name}.plan.json"), g, c)
        assert plan.to_dict() == json.loads((EXAMPLES / f"{name}.plan.json").read_text())


class TestEqualSplit:
    def test_even(self):
        assert equal_split(8, 4) == (2, 2, 2, 2)

    def test_remainder_goes_first(self):
        assert equal_split(10, 4) == (3, 3, 2, 2)

    def test_too_many(self):
        with pytest.raises(ValueError):
            equal_split(3, 4)


class TestCommandLine:
    def test_validate_the_example(self, run_cli):
        status, out, _ = run_cli("validate", GRAPH, CLUSTER, EXAMPLE)
        assert status == 0
        assert out.splitlines()[-1].startswith(f"ok: {EXAMPLE}: plan, 4 stages on 2 device groups, no deadlock")

    def test_validate_refuses_in_one_line(self, run_cli, tmp_path):
        data = json.load(open(EXAMPLE))
        data["stages"][2]["devices"] = ["cpu1"]
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(data))
        status, out, err = run_cli("validate", GRAPH, CLUSTER, str(path))
        assert status == 2 and out == ""
        assert err.count("\n") == 1 and err.startswith(f"error: {path}: stages[2].devices: under interleaved-1f1b")

    def test_simulate_json_gives_groups_and_programs(self, run_cli):
        status, out, _ = run_cli("simulate", GRAPH, CLUSTER, EXAMPLE, "--json")
        summary = json.loads(out)
        assert status == 0
        assert summary["groups"] == [{"devices": ["cpu0"], "stages": [0, 2]}, {"devices": ["cpu1"], "stages": [1, 3]}]
        assert len(summary["peak_memory"]) == 2 and len(summary["programs"]) == 2
        assert summary["programs"] == load_plan(EXAMPLE).programs()
        assert summary["programs"][0][:4] == ["0F0", "0F1", "2F0", "2F1"]

    def test_simulate_json_of_a_v1_plan_has_one_group_per_stage(self, run_cli):
        status, out, _ = run_cli("simulate", "examples/tiny.graph.json", "examples/tiny.cluster.json",
                                 "examples/tiny.plan.json", "--json")
        summary = json.loads(out)
        assert summary["groups"] == [{"devices": ["g0"], "stages": [0]}, {"devices": ["g1"], "stages": [1]}]
        assert summary["programs"][1] == ["1F0", "1F1", "1B0", "1B1"]

    def test_trace_and_gantt_have_a_row_per_group(self, run_cli, tmp_path):
        trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
        status, _, _ = run_cli("simulate", GRAPH, CLUSTER, EXAMPLE, "--trace", str(trace), "--gantt", str(gantt))
        assert status == 0 and gantt.stat().st_size > 0
        events = json.loads(trace.read_text())["traceEvents"]
        names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
        assert names == ["group 0 (stages 0, 2; cpu0)", "link group 0->1", "link group 1->0",
                         "group 1 (stages 1, 3; cpu1)"]  # each group above the links to and from the next
        assert {e["name"] for e in events if e["ph"] == "X" and e["pid"] == 0} >= {"0F0", "2F0", "2B0", "0B3"}


class TestSplitActionsInPictures:
    def test_i_and_w_are_bars_of_their_own(self):
        from pipeplan.solver.views.gantt import bars_of
        from pipeplan.solver.evaluation.simulator import simulate
        from pipeplan.solver.views.trace import chrome_trace

        layout = ("d0", "d1", "d1", "d0")
        plan = Plan("g", "c", 2, 0.0, "zbv", tuple(Stage((s, s + 1), (d,), (1, 1)) for s, d in enumerate(layout)))
        result = simulate(plan, chain(4), cluster(2))
        rows, bars = bars_of(result)
        assert rows == ["group 0 (stages 0,3)", "group 0->1", "group 1->0", "group 1 (stages 1,2)"]
        assert {b.kind for b in bars} >= {"forward", "input-grad", "weight-grad"}
        assert {b.label for b in bars if b.kind == "weight-grad"} == {f"{s}W{k}" for s in range(4) for k in range(2)}
        cats = {e["cat"] for e in chrome_trace(result)["traceEvents"] if e["ph"] == "X"}
        assert {"input-grad", "weight-grad"} <= cats
