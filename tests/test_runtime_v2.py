"""The runtime on version-2 plans: several stages per process, split backwards, local hand-overs.

The multi-process test trains gpt-tiny (6 units) in float64 on 4 processes under every
named schedule and one custom program, each against one-process training, in one
launch: the processes run the cases one after another (this file is also their
driver, see ``__main__`` below).  The named schedules' programs are
:func:`pipeplan.solver.schedule.group_programs`' (equal to torch's, tested there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from pipeplan.models.model_options import ModelRequest
from pipeplan.runtime.gradsync import group_members, links
from pipeplan.runtime.calibrate import run_factors
from pipeplan.runtime.programs import plan_programs, stage_op_lists
from pipeplan.runtime.replay import program_durations
from pipeplan.runtime.routing import cut_messages, device_ranks, grad_order, rank_of, stage_groups, stage_ranks
from pipeplan.solver.plan import Plan, Stage
from pipeplan.solver.schedule import Action, format_action, group_programs, num_stages, parse_action, stage_group

HANG = 60
"""Seconds a process of the multi-process test may go without progress before the launcher stops them all."""

# --------------------------------------------------------------------- the cases
CUTS = ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6))


def _stages(cuts, devices, splits, recompute=()) -> list[dict]:
    return [{"layers": list(layers), "devices": list(devs), "microbatches": list(split), "recompute": s in recompute}
            for s, (layers, devs, split) in enumerate(zip(cuts, devices, splits))]


def named_case(schedule: str, groups: list[tuple[str, ...]], virtual: int, split: tuple[int, ...],
               cuts, recompute=()) -> dict:
    """A plan of ``schedule`` on ``groups`` (one microbatches list for all stages) and torch's programs."""
    num = num_stages(schedule, len(groups), virtual)
    devices = [groups[stage_group(schedule, s, len(groups))] for s in range(num)]
    programs = group_programs(schedule, len(groups), len(split), virtual)
    return {"name": schedule, "schedule": schedule, "global_batch": sum(split),
            "stages": _stages(cuts, devices, [split] * num, recompute),
            "programs": [[format_action(a) for a in program] for program in programs]}


def custom_case() -> dict:
    """Four stages on three groups; stages 1 and 2 share a replicated group but split the batch differently.

    So some of their messages stay inside a process and others go to the other
    replica of the same group; stages 1 and 2 split their backwards (one recomputing).
    """
    groups = [("d0",), ("d1", "d2"), ("d1", "d2"), ("d3",)]
    splits = [(4, 4), (3, 5), (4, 4), (8,)]
    programs = [["0F0", "0F1", "0B0", "0B1"],
                ["1F0", "1F1", "2F0", "2F1", "2I0", "1I0", "2I1", "2W0", "1I1", "1W0", "2W1", "1W1"],
                ["3F0", "3B0"]]
    return {"name": "custom", "schedule": "custom", "global_batch": 8,
            "stages": _stages(((0, 1), (1, 3), (3, 5), (5, 6)), groups, splits, recompute=(2,)),
            "programs": programs}


def cases() -> list[dict]:
    """Every named schedule and the custom program, on 4 processes, unequal microbatches."""
    return [
        # 3 groups (one of 2 replicas) x 2 stages each; a recomputing stage on the replicated group
        named_case("interleaved-1f1b", [("d0", "d1"), ("d2",), ("d3",)], 2, (2, 1, 2, 1, 2, 1), CUTS, recompute=(3,)),
        named_case("interleaved-zb", [("d0", "d1"), ("d2", "d3")], 2, (2, 1, 2, 1),
                   ((0, 2), (2, 3), (3, 5), (5, 6)), recompute=(1,)),
        named_case("looped-bfs", [("d0",), ("d1", "d2", "d3")], 3, (3, 2, 2), CUTS),
        # the tied embedding (stage 0) and head (stage 3) on one replicated group
        named_case("zbv", [("d0", "d1"), ("d2", "d3")], 2, (3, 1, 2, 2), ((0, 2), (2, 3), (3, 5), (5, 6)),
                   recompute=(2,)),
        custom_case(),
    ]


def case_plan(case: dict) -> Plan:
    """The case as a plan (built directly: plan/2 files are read by ``pipeplan.solver.plan``)."""
    stages = tuple(Stage(tuple(st["layers"]), tuple(st["devices"]), tuple(st["microbatches"]), st["recompute"])
                   for st in case["stages"])
    return Plan("gpt-tiny", "cpu4", case["global_batch"], 4.0, case["schedule"], stages)


# --------------------------------------------------------------------- the driver (run by each process)
def drive(case_file: str) -> int:
    """Train every case of ``case_file`` on this rank, one after another; rank 0 writes each result."""
    from pipeplan.runtime.checks import RunInputs
    from pipeplan.runtime.heartbeat import Heartbeat
    from pipeplan.runtime.training_data import build_run_model
    from pipeplan.runtime.worker import add_arguments, train_rank

    spec = json.loads(Path(case_file).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    for case, port in zip(spec["cases"], spec["ports"]):
        os.environ["MASTER_PORT"] = str(port)
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["-", "-", "-", "--model", "gpt-tiny", "--steps", "2", "--warmup", "1", "--verify",
                                  "--timeout", "60", "--result", case["result"],
                                  "--transport", case.get("transport", "auto")])
        request = ModelRequest("gpt-tiny")
        model = build_run_model(request, dtype=torch.float64, seed=0)
        inputs = RunInputs(None, None, case_plan(case), case["name"], "gpt-tiny", None, torch.float64,  # type: ignore
                           None, model, request)  # type: ignore[arg-type]
        programs = [[parse_action(text) for text in program] for program in case["programs"]]
        if train_rank(args, inputs, programs, rank, world, Heartbeat(rank, world)) != 0:
            return 1
    return 0


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    from pipeplan.runtime.launch import free_port, launch_local

    tmp = tmp_path_factory.mktemp("v2run")
    todo = cases()
    for case in todo:
        case["result"] = str(tmp / f"{case['name']}.json")
    case_file = tmp / "cases.json"
    case_file.write_text(json.dumps({"cases": todo, "ports": [free_port() for _ in todo]}))
    launch_local([str(case_file)], 4, tmp, timeout=HANG, describe=lambda rank: f"rank {rank}",
                 entry=[str(Path(__file__).resolve())])
    return {case["name"]: json.loads(Path(case["result"]).read_text()) for case in todo}


@pytest.mark.parametrize("name", ["interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv", "custom"])
def test_verify_equals_one_process_training(results, name):
    result = results[name]
    assert result["max_param_diff"] is not None and result["max_param_diff"] <= 1e-6, result["max_param_diff_at"]


def test_each_rank_ran_its_groups_program_with_split_backwards(results):
    case = cases()[3]  # zbv: rank 0 and 1 hold stages 0 and 3, ranks 2 and 3 stages 1 and 2
    zbv = results["zbv"]
    assert [(r["rank"], r["group"], r["stages"]) for r in zbv["ranks"]] == \
        [(0, 0, [0, 3]), (1, 0, [0, 3]), (2, 1, [1, 2]), (3, 1, [1, 2])]
    compute = [label for kind, label, *_ in zbv["ranks"][0]["steps"][1]["events"]
               if kind in ("forward", "backward", "recompute")]
    # rank 0 is the larger replica of every microbatch: it runs every action, in the program's order
    assert compute == [a[:1] + ":" + a[1:] for a in case["programs"][0]]


def test_custom_recompute_before_its_input_gradient(results):
    rank1 = results["custom"]["ranks"][1]
    compute = [label for kind, label, *_ in rank1["steps"][1]["events"] if kind in ("forward", "backward", "recompute")]
    assert compute.index("2:R0") == compute.index("2:I0") - 1
    assert compute.index("2:W0") > compute.index("2:I1")


# --------------------------------------------------------------------- pure data
def _shared_plan() -> Plan:
    case = custom_case()
    return case_plan(case)


class TestStageOpLists:
    def test_split_by_stage_in_program_order(self):
        programs = [[parse_action(t) for t in p] for p in custom_case()["programs"]]
        lists = stage_op_lists(programs, 4)
        assert lists[1] == [("F", 0), ("F", 1), ("I", 0), ("I", 1), ("W", 0), ("W", 1)]
        assert lists[2] == [("F", 0), ("F", 1), ("I", 0), ("I", 1), ("W", 0), ("W", 1)]
        assert lists[3] == [("F", 0), ("B", 0)]


class TestPlanPrograms:
    def test_a_version_1_plan(self):
        plan = Plan("g", "c", 2, 4.0, "1f1b", (Stage((0, 1), ("a",), (1, 1)), Stage((1, 2), ("b",), (1, 1))))
        assert plan_programs(plan) == [[Action(0, "F", 0), Action(0, "F", 1), Action(0, "B", 0), Action(0, "B", 1)],
                                       [Action(1, "F", 0), Action(1, "B", 0), Action(1, "F", 1), Action(1, "B", 1)]]


class TestRanks:
    def test_a_device_is_one_rank_whatever_the_stages_on_it(self):
        plan = _shared_plan()
        assert device_ranks(plan) == {"d0": 0, "d1": 1, "d2": 2, "d3": 3}
        assert stage_ranks(plan) == [[0], [1, 2], [1, 2], [3]]
        assert stage_groups(plan) == [0, 1, 1, 2]
        assert rank_of(plan) == [(0, 0), (1, 0), (1, 1), (2, 0)]

    def test_version_1_numbering_is_unchanged(self):
        plan = Plan("g", "c", 4, 4.0, "gpipe", (Stage((0, 1), ("x",), (4,)), Stage((1, 2), ("y", "z"), (4,))))
        assert stage_ranks(plan) == [[0], [1, 2]] and rank_of(plan) == [(0, 0), (1, 0), (1, 1)]


class TestLocalHandOver:
    def test_messages_between_stages_of_one_group(self):
        plan = _shared_plan()
        programs = [[parse_action(t) for t in p] for p in custom_case()["programs"]]
        ops = stage_op_lists(programs, 4)
        msgs = cut_messages(plan, 1, ops)
        # stage 1 pieces: rank 1 [0,2) [3,6), rank 2 [2,3) [6,8); stage 2: rank 1 [0,2) [4,6), rank 2 [2,4) [6,8)
        assert [(m.src, m.dst, m.start, m.stop) for m in msgs] == \
            [(1, 1, 0, 2), (2, 2, 2, 3), (1, 2, 3, 4), (1, 1, 4, 6), (2, 2, 6, 8)]
        # gradients come back in the order stage 2 runs its I's
        assert [m.dst_mb for m in grad_order(msgs, ops)] == [0, 0, 0, 1, 1]

    def test_only_ranks_that_differ_get_links(self):
        plan = _shared_plan()
        from pipeplan.models.zoo import build_model

        members = group_members(plan, build_model("gpt-tiny", device="meta"))
        assert members[(1, "fwd")] == [1, 2] and members[("group", 1)] == [1, 2]
        assert links(members, plan).count(((1, "fwd"), 1, 2)) == 1


def _record(group: int, stages: list[int], spans: list[tuple[str, float]], device: str = "d") -> dict:
    """A rank record whose one step runs the ``(label, seconds)`` spans back to back."""
    events, t = [], 0.0
    for label, seconds in spans:
        events.append(["backward", label, t, t + seconds])
        t += seconds
    return {"group": group, "stages": stages, "stage": stages[0], "device": device,
            "steps": [{"events": events, "end": t}]}


class TestProgramDurations:
    def test_split_backward_halves_with_their_messages_slowest_replica(self):
        program = [Action(1, "F", 0), Action(2, "F", 0), Action(2, "I", 0), Action(1, "B", 0), Action(2, "W", 0)]
        a = _record(1, [1, 2], [("1:F0", 1.0), ("1:send A0", 0.25), ("2:F0", 2.0), ("2:recv G0", 0.5),
                                ("2:I0", 3.0), ("2:send G0", 0.25), ("1:B0", 4.0), ("2:W0", 5.0)])
        b = _record(1, [1, 2], [("1:F0", 1.5), ("2:F0", 1.0), ("2:I0", 1.0), ("1:B0", 1.0), ("2:W0", 6.0)])
        other = _record(0, [0], [("F0", 100.0)])
        # I: receive (its span: no recorded CPU part, the shortest of its direction) + I + send
        assert program_durations([a, b, other], [0], 1, program) == pytest.approx((1.5, 2.0, 3.75, 4.0, 6.0))

    def test_version_1_records(self):
        r = {"stage": 0, "steps": [{"events": [["forward", "F0", 0.0, 1.0], ["backward", "B0", 1.0, 3.0]],
                                    "end": 3.0}]}
        assert program_durations([r], [0], 0, [Action(0, "F", 0), Action(0, "B", 0)]) == (1.0, 2.0)


class TestRunFactorsOfAGroup:
    def test_every_stage_of_the_group_and_both_halves_count(self):
        from conftest import chain, cluster

        plan = Plan("g", "c", 2, 4.0, "custom", (Stage((0, 1), ("d0",), (2,)), Stage((1, 2), ("d0",), (2,))))
        # one layer per stage: F = 2, B = 4 for 2 samples; charged 12 on d0 (speed 1)
        ranks = [_record(0, [0, 1], [("0:F0", 2.0), ("1:F0", 3.0), ("1:I0", 3.0), ("0:B0", 4.0), ("1:W0", 3.0)],
                         device="d0")]
        assert run_factors(ranks, [0], plan, chain(2), cluster(1)) == pytest.approx({"d0": 15 / 12})


if __name__ == "__main__":
    sys.exit(drive(sys.argv[1]))
