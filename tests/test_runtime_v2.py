"""The runtime on version-2 plans: several stages per process, split backwards, local hand-overs.

The multi-process test trains gpt-tiny (6 units) in float64 on 4 processes under every
named schedule and one custom program, each against one-process training, in one
launch: the processes run the cases one after another (this file is also their
driver, see ``__main__`` below), each by :func:`pipeplan.runtime.worker.train_rank`
on the plan's programs, as ``pipeplan run`` does after loading its files.  One case
also runs through ``pipeplan run`` itself, from a plan/2 file.  The named schedules' programs are
:func:`pipeplan.solver.schedules.schedule.group_programs`' (equal to torch's, tested there).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from pipeplan.models.jsonio import dumps
from pipeplan.models.model_options import ModelRequest
from pipeplan.runtime.gradsync import group_members, links
from pipeplan.runtime.calibrate import run_factors
from pipeplan.runtime.replay import program_durations
from pipeplan.runtime.routing import cut_messages, device_ranks, grad_order, rank_of, stage_ranks
from pipeplan.solver.formats.cluster import load_cluster
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.schedules.schedule import Action, format_action, group_programs, num_stages, stage_group

CLUSTER = str(Path(__file__).resolve().parents[1] / "examples" / "two-servers.cluster.json")
"""Six devices g0..g5; the plans use four."""

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
    groups = [("g0",), ("g1", "g2"), ("g1", "g2"), ("g3",)]
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
        named_case("interleaved-1f1b", [("g0", "g1"), ("g2",), ("g3",)], 2, (2, 1, 2, 1, 2, 1), CUTS, recompute=(3,)),
        named_case("interleaved-zb", [("g0", "g1"), ("g2", "g3")], 2, (2, 1, 2, 1),
                   ((0, 2), (2, 3), (3, 5), (5, 6)), recompute=(1,)),
        named_case("looped-bfs", [("g0",), ("g1", "g2", "g3")], 3, (3, 2, 2), CUTS),
        # the tied embedding (stage 0) and head (stage 3) on one replicated group
        named_case("zbv", [("g0", "g1"), ("g2", "g3")], 2, (3, 1, 2, 2), ((0, 2), (2, 3), (3, 5), (5, 6)),
                   recompute=(2,)),
        custom_case(),
    ]


def case_plan(case: dict) -> Plan:
    """The case as a ``pipeplan.plan/2`` plan (a custom one carries its programs)."""
    stages = tuple(Stage(tuple(st["layers"]), tuple(st["devices"]), tuple(st["microbatches"]), st["recompute"])
                   for st in case["stages"])
    custom = tuple(tuple(program) for program in case["programs"]) if case["schedule"] == "custom" else None
    return Plan("gpt-tiny-6", "two-servers", case["global_batch"], 4.0, case["schedule"], stages,
                custom_programs=custom)


# --------------------------------------------------------------------- the driver (run by each process)
def drive(case_file: str) -> int:
    """Train every case of ``case_file`` on this rank, one after another; rank 0 writes each result."""
    from pipeplan.runtime.checks import RunInputs
    from pipeplan.runtime.heartbeat import Heartbeat
    from pipeplan.runtime.training_data import build_run_model
    from pipeplan.runtime.options import RunConfig
    from pipeplan.runtime.worker import train_rank

    spec = json.loads(Path(case_file).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    for case, port in zip(spec["cases"], spec["ports"]):
        os.environ["MASTER_PORT"] = str(port)
        request = ModelRequest("gpt-tiny")
        config = RunConfig("-", "-", "-", request, steps=2, warmup=1, verify=True, timeout=60.0, result=case["result"],
                           transport=case.get("transport", "auto")).checked()
        model = build_run_model(request, dtype=torch.float64, seed=0)
        # what pipeplan run loads from files, less the graph, cluster and prediction (the workers need none)
        inputs = RunInputs(None, None, case_plan(case), case["name"], "gpt-tiny", None, torch.float64,  # type: ignore
                           None, model, request)  # type: ignore[arg-type]
        if train_rank(config, inputs, rank, world, Heartbeat(rank, world)) != 0:
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


def test_the_cases_are_valid_version_2_plans():
    from test_runtime import model_graph

    graph = model_graph("gpt-tiny")
    for case in cases():
        plan = case_plan(case)
        plan.validate(graph, load_cluster(CLUSTER), case["name"])
        assert plan.format == "pipeplan.plan/2" and plan.programs() == case["programs"]


# --------------------------------------------------------------------- pipeplan run on a plan/2 file
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    from test_runtime import model_graph

    folder = tmp_path_factory.mktemp("v2files")
    paths = {"graph": str(folder / "gpt-tiny.graph.json"), "plan": str(folder / "zbv.plan.json")}
    Path(paths["graph"]).write_text(dumps(model_graph("gpt-tiny").to_dict()))
    Path(paths["plan"]).write_text(dumps(case_plan(cases()[3]).to_dict()))
    return paths


def test_run_verify_on_a_zbv_plan_file(files, tmp_path):
    from test_runtime import pipeplan

    charts = [str(tmp_path / "run.png"), str(tmp_path / "run.trace.json")]
    done = pipeplan("run", files["graph"], CLUSTER, files["plan"], "--model", "gpt-tiny", "--steps", "2",
                    "--warmup", "1", "--verify", "--json", "--timeout", "30", "--gantt", charts[0], "--side-by-side",
                    "--trace", charts[1], timeout=HANG * 2)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["verified"] and summary["max_param_diff"] <= 1e-10
    assert summary["processes"] == 4 and summary["devices"] == ["g0", "g1", "g2", "g3"]
    # one predicted peak per group, the same on both replicas of a group
    peaks = summary["predicted_peak_memory"]
    assert peaks[0] == peaks[1] and peaks[2] == peaks[3] and peaks[0] != peaks[2]
    assert summary["replayed_iteration_time"] > 0 and len(summary["losses"]) == 2
    assert all(Path(chart).stat().st_size > 0 for chart in charts)
    names = {e["args"]["name"] for e in json.loads(Path(charts[1]).read_text())["traceEvents"] if e["ph"] == "M"
             and e["name"] == "process_name"}
    assert len(names) == 4


# --------------------------------------------------------------------- pure data
def _shared_plan() -> Plan:
    case = custom_case()
    return case_plan(case)


class TestRanks:
    def test_a_device_is_one_rank_whatever_the_stages_on_it(self):
        plan = _shared_plan()
        assert device_ranks(plan) == {"g0": 0, "g1": 1, "g2": 2, "g3": 3}
        assert stage_ranks(plan) == [[0], [1, 2], [1, 2], [3]]
        assert plan.stage_groups == [0, 1, 1, 2]
        assert rank_of(plan) == [(0, 0), (1, 0), (1, 1), (2, 0)]

    def test_version_1_numbering_is_unchanged(self):
        plan = Plan("g", "c", 4, 4.0, "gpipe", (Stage((0, 1), ("x",), (4,)), Stage((1, 2), ("y", "z"), (4,))))
        assert stage_ranks(plan) == [[0], [1, 2]] and rank_of(plan) == [(0, 0), (1, 0), (1, 1)]


class TestLocalHandOver:
    def test_messages_between_stages_of_one_group(self):
        plan = _shared_plan()
        ops = plan.stage_actions()  # each stage's actions in its group's order
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
