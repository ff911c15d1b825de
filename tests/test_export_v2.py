"""pipeplan export of pipeplan.plan/2: several stages per device group, split backwards, each target's
schedule for them or its one-line refusal, and the torch folder's schedule equal to the plan's programs."""

from __future__ import annotations

import json
import os
import re

import pytest
from test_export import GPT, _cluster, _reference_losses, _torchrun_losses, _torchtitan_configs, gpt_graph

from pipeplan.models.errors import InputError
from pipeplan.runtime.export import export_plan
from pipeplan.runtime.export.megatron import check_interleaved, megatron_flags
from pipeplan.runtime.export.rules import check_plan, placement
from pipeplan.runtime.export.targets import DEEPSPEED, MEGATRON, TORCH, TORCHTITAN
from pipeplan.runtime.export.torch_target import schedule_csv, stages_config, torch_schedule
from pipeplan.runtime.export.torch_train import make_schedule
from pipeplan.runtime.export.torchtitan import csv_schedule_name, toml_fragment
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.schedules.schedule import NAMED_V2, group_programs

LAYERS = [(0, 2), (2, 3), (3, 4), (4, 6)]
"""gpt-tiny's six layers (embed, block.0 .. block.3, head) in four stages."""
LOOP, V = ("cpu0", "cpu1", "cpu0", "cpu1"), ("cpu0", "cpu1", "cpu1", "cpu0")


def v2_plan(schedule: str, devices=None, m: int = 4, batch: int = 8, replicas: int = 1, programs=None,
            ops=None) -> Plan:
    """Four stages of gpt-tiny on two groups (``replicas`` devices each), ``m`` equal microbatches."""
    devices = devices or (V if schedule == "zbv" else LOOP)
    groups = {d: tuple(f"{d}.{j}" for j in range(replicas)) if replicas > 1 else (d,) for d in devices}
    stages = tuple(Stage(layers, groups[d], (batch // m,) * m, False, None if ops is None else tuple(ops[s]))
                   for s, (layers, d) in enumerate(zip(LAYERS, devices)))
    p = Plan("gpt-tiny-6", "c", batch, 4.0, schedule, stages, {},
             None if programs is None else tuple(tuple(row) for row in programs))
    p.validate(gpt_graph(), file="p.json")
    return p


def custom_of(schedule: str, **kwargs) -> Plan:
    """A custom plan whose programs are ``schedule``'s, on its placement."""
    named = v2_plan(schedule, **kwargs)
    return v2_plan("custom", devices=[named.groups[g][0] for g in named.stage_groups], programs=named.programs(),
                   m=len(named.stages[0].microbatches))


def refusal(p: Plan, target: str, approximate: bool = False) -> str:
    with pytest.raises(InputError) as info:
        export_plan(p, gpt_graph(), target, model="gpt-tiny", plan_file="p.json", approximate=approximate)
    return info.value.line()


class TestPlacement:
    def test_each_style(self):
        assert placement(v2_plan("interleaved-1f1b")) == "loop" and placement(v2_plan("zbv")) == "v"
        assert placement(v2_plan("1f1b", devices=("a", "b", "c", "d"))) == "one"
        assert placement(v2_plan("custom", devices=("a", "a", "b", "b"), programs=[
            ["0F0", "1F0", "1B0", "0B0"], ["2F0", "3F0", "3B0", "2B0"]], m=1)) is None

    def test_brute_force_over_every_group_assignment(self):
        import itertools

        for stages in range(1, 7):
            for assignment in itertools.product(range(3), repeat=stages):
                used = sorted(set(assignment), key=assignment.index)
                if used != list(range(len(used))):
                    continue  # groups are numbered by first use
                groups = len(used)
                p = Plan("g", "c", 1, 4.0, "custom", tuple(Stage((i, i + 1), (f"d{g}",), (1,))
                                                           for i, g in enumerate(assignment)))
                loop = stages % groups == 0 and all(g == s % groups for s, g in enumerate(assignment))
                vee = stages == 2 * groups and all(g == min(s, 2 * groups - 1 - s) for s, g in enumerate(assignment))
                expected = "one" if stages == groups else "loop" if loop else "v" if vee else None
                assert placement(p) == expected, assignment


class TestCheckPlanV2:
    @pytest.mark.parametrize("schedule", NAMED_V2)
    @pytest.mark.parametrize("approximate", (False, True))
    def test_deepspeed_refuses_several_stages_per_rank(self, schedule, approximate):
        line = refusal(v2_plan(schedule), "deepspeed", approximate)
        assert line.startswith(f"error: p.json: schedule: stage 0 (every stage): schedule {schedule!r}: puts 4 "
                               f"stages on 2 device groups, but DeepSpeed runs one stage per rank")
        assert "--allow-approximate cannot" in line and "\n" not in line

    def test_deepspeed_refuses_custom_programs_on_shared_groups(self):
        line = refusal(custom_of("interleaved-1f1b"), "deepspeed", approximate=True)
        assert "puts 4 stages on 2 device groups" in line

    def test_one_stage_per_group_interleaving_approximates_to_1f1b(self):
        p = v2_plan("interleaved-1f1b", devices=("a", "b", "c", "d"))
        runnable, changes = check_plan(p, DEEPSPEED, "p.json", approximate=True)
        assert runnable.schedule == "1f1b" and [c.where for c in changes] == ["schedule"]

    @pytest.mark.parametrize("schedule, says", [("looped-bfs", "has no looped-BFS schedule"),
                                                ("interleaved-zb", "has no zero-bubble schedule in core"),
                                                ("zbv", "has no zero-bubble schedule in core and no V placement")])
    def test_megatron_says_which_schedule_it_lacks(self, schedule, says):
        line = refusal(v2_plan(schedule), "megatron")
        assert line.startswith(f"error: p.json: schedule: stage 0 (every stage): schedule {schedule!r}: "
                               f"Megatron-LM {says}")
        assert "get_forward_backward_func" in line

    @pytest.mark.parametrize("schedule", ("looped-bfs", "interleaved-zb"))
    def test_megatron_approximates_looped_placements_by_interleaving(self, schedule):
        p = v2_plan(schedule)
        runnable, changes = check_plan(p, MEGATRON, "p.json", approximate=True)
        assert runnable.schedule == "interleaved-1f1b" and runnable.stages == p.stages
        assert [c.where for c in changes] == ["schedule"]

    def test_megatron_cannot_approximate_the_v(self):
        assert "--allow-approximate cannot" in refusal(v2_plan("zbv"), "megatron", approximate=True)

    @pytest.mark.parametrize("schedule", NAMED_V2)
    def test_torch_and_torchtitan_run_every_schedule_unchanged(self, schedule):
        p = v2_plan(schedule)
        for target in (TORCH, TORCHTITAN):
            assert check_plan(p, target, "p.json") == (p, [])

    def test_replicas_cut_alike_on_stages_sharing_a_group(self):
        p = v2_plan("interleaved-1f1b", replicas=2)
        wider = Stage(p.stages[1].layers, ("cpu1.1", "cpu1.0", "cpu1.2"), p.stages[1].microbatches)
        p = Plan(p.graph, p.cluster, 8, 4.0, p.schedule, (p.stages[0], wider, p.stages[2],
                                                          Stage(p.stages[3].layers, ("cpu1.2", "cpu1.0", "cpu1.1"),
                                                                p.stages[3].microbatches)))
        runnable, changes = check_plan(p, TORCH, "p.json", approximate=True)
        assert runnable.stages[1].devices == runnable.stages[3].devices == ("cpu1.1", "cpu1.0")
        assert [c.what for c in changes] == ["stage 1: 3 -> 2 replicas (cpu1.2 left unused)",
                                             "stage 3: 3 -> 2 replicas (cpu1.2 left unused)"]

    def test_approximate_split_takes_a_count_torch_runs(self):
        # 24 samples in [7, 7, 5, 5]: the nearest equal counts are 4 (6 each, 4 % 2 == 0, accepted)
        # and for interleaved-zb on 2 groups any m with m % max(1, m // 2) == 0: 4 passes
        stages = tuple(Stage(st.layers, st.devices, (7, 7, 5, 5)) for st in v2_plan("interleaved-zb").stages)
        p = Plan("gpt-tiny-6", "c", 24, 4.0, "interleaved-zb", stages)
        runnable, _ = check_plan(p, TORCH, "p.json", approximate=True)
        assert runnable.stages[0].microbatches == (6, 6, 6, 6)
        group_programs("interleaved-zb", 2, 4, 2)
        # 30 samples wanted in 5: m = 5 has 5 % 2 != 0 on 2 groups, so the nearest accepted count is 6
        stages = tuple(Stage(st.layers, st.devices, (7, 7, 6, 5, 5)) for st in v2_plan("interleaved-zb").stages)
        runnable, _ = check_plan(Plan("gpt-tiny-6", "c", 30, 4.0, "interleaved-zb", stages), TORCH, "p.json",
                                 approximate=True)
        assert runnable.stages[0].microbatches == (5,) * 6
        with pytest.raises(ValueError):
            group_programs("interleaved-zb", 2, 5, 2)

    def test_custom_programs_on_a_v_approximate_to_zbv_with_new_counts(self):
        p = custom_of("zbv")
        stages = tuple(Stage(st.layers, st.devices, (3, 3, 1, 1)) for st in p.stages)
        p = Plan(p.graph, p.cluster, 8, 4.0, "custom", stages, {}, p.custom_programs)
        runnable, changes = check_plan(p, TORCH, "p.json", approximate=True)
        assert runnable.schedule == "zbv" and runnable.custom_programs is None
        assert changes[-1].what == "custom -> zbv (the op lists were for the old microbatch counts)"

    def test_custom_programs_on_no_runnable_placement_are_not_approximated(self):
        programs = [["0F0", "1F0", "1B0", "0B0"], ["2F0", "3F0", "3B0", "2B0"]]
        stages = tuple(Stage(layers, (d,), (5, 3)) for layers, d in zip(LAYERS, ("a", "a", "b", "b")))
        p = Plan("gpt-tiny-6", "c", 8, 4.0, "custom", stages, {}, tuple(tuple(r) for r in programs))
        with pytest.raises(InputError, match="no schedule it runs keeps these stages on their device groups"):
            check_plan(p, TORCH, "p.json", approximate=True)


class TestTorchSchedule:
    @pytest.mark.parametrize("schedule, name", [("interleaved-1f1b", "ScheduleInterleaved1F1B"),
                                                ("interleaved-zb", "ScheduleInterleavedZeroBubble"),
                                                ("looped-bfs", "ScheduleLoopedBFS"), ("zbv", "ScheduleZBVZeroBubble")])
    def test_classes(self, schedule, name):
        assert torch_schedule(v2_plan(schedule)) == name
        assert torch_schedule(custom_of(schedule)) == "csv"


class TestStagesConfig:
    def test_zbv_ranks_hold_the_v(self):
        cfg = stages_config(v2_plan("zbv", replicas=2), gpt_graph(), "gpt-tiny")
        assert [g["stages"] for g in cfg["groups"]] == [[0, 3], [1, 2]]
        assert [g["ranks"] for g in cfg["groups"]] == [[0, 1], [2, 3]] and cfg["mesh"]["shape"] == [2, 2]
        assert [s["ranks"] for s in cfg["stages"]] == [[0, 1], [2, 3], [2, 3], [0, 1]]
        assert cfg["group_of_stage"] == [0, 1, 1, 0] and cfg["tied"] == [[5, 0]]
        assert [r["stages"] for r in cfg["ranks"]] == [[0, 3], [0, 3], [1, 2], [1, 2]]


class StubStage:
    """What torch's schedule constructors read of a pipeline stage (no process group needed)."""

    def __init__(self, index: int, count: int, groups: int, rank: int) -> None:
        self.stage_index, self.num_stages = index, count
        self.group_size, self.group_rank = groups, rank
        self.is_first, self.is_last = index == 0, index == count - 1
        self.submod = None
        self.stage_index_to_group_rank = None


SPLIT_OPS = [["F0", "F1", "I0", "I1", "W1", "W0"], ["F0", "I0", "F1", "B1", "W0"], ["F0", "B0", "F1", "B1"],
             ["F0", "I0", "W0", "F1", "I1", "W1"]]
"""A /2 custom plan's per-stage ops, one stage per group, I/W and B mixed."""

TRAIN_PLANS = {
    **{name: (lambda name=name: v2_plan(name)) for name in NAMED_V2},
    "interleaved-1f1b-m2": lambda: v2_plan("interleaved-1f1b", m=2),  # one round: p = m = 2
    "zbv-m1": lambda: v2_plan("zbv", m=1),  # torch pads to 2R-1 microbatches and drops the padding
    "custom-zbv": lambda: custom_of("zbv"),
    "custom-looped": lambda: custom_of("looped-bfs"),
    "custom-split-ops": lambda: v2_plan("custom", devices=("a", "b", "c", "d"), m=2, ops=SPLIT_OPS),
}


class TestTrainScriptSchedule:
    @pytest.mark.parametrize("name", sorted(TRAIN_PLANS))
    def test_every_rank_runs_the_plans_program(self, tmp_path, name):
        p = TRAIN_PLANS[name]()
        cfg = stages_config(p, gpt_graph(), "gpt-tiny")
        (tmp_path / "schedule.csv").write_text(schedule_csv(p))
        groups, count = len(cfg["groups"]), len(cfg["stages"])
        expected = p.programs()
        for g, group in enumerate(cfg["groups"]):
            stubs = [StubStage(s, count, groups, g) for s in group["stages"]]
            schedule = make_schedule(cfg, stubs, None, tmp_path)
            order = schedule.pipeline_order
            assert sorted(order) == list(range(groups))
            assert [[str(a) for a in order[r] if a is not None] for r in range(groups)] == expected


class TestTorchtitan:
    @pytest.mark.parametrize("schedule, name", [("interleaved-1f1b", "Interleaved1F1B"),
                                                ("interleaved-zb", "InterleavedZeroBubble"),
                                                ("looped-bfs", "LoopedBFS"), ("zbv", "ZBVZeroBubble")])
    def test_named_schedules(self, schedule, name):
        import tomllib

        files = export_plan(v2_plan(schedule, replicas=2), gpt_graph(), "torchtitan", model="m",
                            torchtitan_version="0.2").files
        config = tomllib.loads(files["torchtitan.toml"])
        par = config["parallelism"]
        assert sorted(files) == ["torchtitan.toml"]
        assert par["pipeline_parallel_schedule"] == name and par["pipeline_parallel_degree"] == 2
        assert par["module_fqns_per_model_part"] == [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2"],
                                                     ["layers.3", "norm", "output"]]
        assert par["data_parallel_replicate_degree"] == 2 and "pipeline_parallel_schedule_csv" not in par
        configs = _torchtitan_configs()
        if configs is not None:
            configs.ParallelismConfig(**par)

    @pytest.mark.parametrize("schedule, name", [("looped-bfs", "Interleaved1F1B"), ("zbv", "ZBVZeroBubble")])
    def test_custom_programs_name_the_placement(self, schedule, name):
        p = custom_of(schedule)
        files = export_plan(p, gpt_graph(), "torchtitan", model="m", torchtitan_version="0.2").files
        text = files["torchtitan.toml"]
        assert f'pipeline_parallel_schedule = "{name}"' in text
        assert 'pipeline_parallel_schedule_csv = "schedule.csv"' in text and files["schedule.csv"] == schedule_csv(p)

    def test_one_stage_per_rank_csv_keeps_the_default_schedule(self):
        p = v2_plan("custom", devices=("a", "b", "c", "d"), m=2, ops=SPLIT_OPS)
        assert csv_schedule_name(p) is None
        assert "pipeline_parallel_schedule =" not in toml_fragment(p, gpt_graph())

    def test_other_placements_refused(self):
        programs = [["0F0", "1F0", "1B0", "0B0"], ["2F0", "3F0", "3B0", "2B0"]]
        p = v2_plan("custom", devices=("a", "a", "b", "b"), programs=programs, m=1)
        line = refusal(p, "torchtitan")
        assert line.startswith("error: p.json: stages[1].devices: stage 1 is on device group 0: torchtitan places "
                               "model part s on rank s mod pp, or in V pairs")
        assert export_plan(p, gpt_graph(), "torch", model="m").files["schedule.csv"] == "0F0,1F0,1B0,0B0\r\n" \
                                                                                         "2F0,3F0,3B0,2B0\r\n"


class TestMegatron:
    def test_interleaved_flags(self):
        flags = megatron_flags(v2_plan("interleaved-1f1b", replicas=2), gpt_graph())
        assert flags == ["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et|t|t|tL",
                         "--num-layers", "4", "--micro-batch-size", "1", "--global-batch-size", "8"]
        text = export_plan(v2_plan("interleaved-1f1b"), gpt_graph(), "megatron", model="m").files["megatron.args"]
        assert text.startswith("# Megatron-LM flags for plan on graph 'gpt-tiny-6': 2 pipeline stages (4 virtual "
                               "stages, 2 per rank) x 1 data-parallel replica = 2 processes")

    @pytest.mark.parametrize("m, ok", [(2, True), (4, True), (8, True), (1, False)])
    def test_microbatches_a_multiple_of_the_ranks(self, m, ok):
        p = v2_plan("interleaved-1f1b", m=m)
        if ok:
            check_interleaved(p, "p.json")
            return
        line = refusal(p, "megatron")
        assert line.startswith(f"error: p.json: stages[0].microbatches: {m} microbatches on 2 pipeline ranks: "
                               f"Megatron-LM's interleaved schedule runs microbatch groups")

    def test_one_group_refused(self):
        stages = tuple(Stage(layers, ("a",), (4, 4)) for layers in LAYERS)
        p = Plan("gpt-tiny-6", "c", 8, 4.0, "interleaved-1f1b", stages)
        p.validate(gpt_graph(), file="p.json")
        assert "Megatron-LM interleaves virtual stages only with --pipeline-model-parallel-size above 1" in \
            refusal(p, "megatron")

    def test_one_stage_per_group_refused(self):
        # Megatron would run plain 1F1B (warm-up R-1-g), not torch's Interleaved1F1B (2(R-1-g))
        p = v2_plan("interleaved-1f1b", devices=("a", "b", "c", "d"))
        assert group_programs("interleaved-1f1b", 4, 4, 1) != group_programs("1f1b", 4, 4)
        assert "with one stage per rank Megatron-LM runs its plain 1F1B" in refusal(p, "megatron")

    def test_megatron_core_reads_the_virtual_layout(self):
        layer_layout = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
        flags = megatron_flags(v2_plan("interleaved-1f1b"), gpt_graph())
        parsed = layer_layout.PipelineParallelLayerLayout(flags[3], 2)
        kinds = [[[t.name for t in chunk] for chunk in rank] for rank in parsed.layout]
        # rank r holds virtual stages r and r + 2 as its chunks 0 and 1
        assert kinds == [[["embedding", "decoder"], ["decoder"]], [["decoder"], ["decoder", "loss"]]]


class TestExportCommand:
    def _plan_file(self, tmp_path, p) -> str:
        path = tmp_path / "p.json"
        path.write_text(json.dumps(p.to_dict()))
        return str(path)

    def test_plan_2_file_is_read_as_version_2(self, tmp_path):
        path = self._plan_file(tmp_path, v2_plan("zbv"))
        assert json.loads(open(path).read())["format"] == "pipeplan.plan/2"

    @pytest.mark.parametrize("target", ("deepspeed", "megatron"))
    def test_refusal_is_one_line_and_writes_nothing(self, run_cli, tmp_path, target):
        status, out, err = run_cli("export", self._plan_file(tmp_path, v2_plan("zbv")), "--to", target, "--graph", GPT,
                                   "-o", str(tmp_path / "out"))
        assert status == 2 and out == "" and len(err.splitlines()) == 1
        assert re.match(rf"error: {re.escape(str(tmp_path / 'p.json'))}: schedule: stage 0 \(every stage\): "
                        rf"schedule 'zbv': ", err)
        assert not (tmp_path / "out").exists()

    def test_approximate_warns_and_simulates_both(self, run_cli, tmp_path):
        cluster = _cluster(tmp_path, 2)
        status, out, err = run_cli("export", self._plan_file(tmp_path, v2_plan("looped-bfs")), "--to", "megatron",
                                   "--graph", GPT, "--allow-approximate", "--cluster", cluster,
                                   "-o", str(tmp_path / "out"))
        lines = err.splitlines()
        assert status == 0 and len(lines) == 2 and "schedule: looped-bfs -> interleaved-1f1b" in lines[0]
        assert " ms as planned, " in lines[1]
        assert "--pipeline-model-parallel-layout 'Et|t|t|tL'" in (tmp_path / "out" / "megatron.args").read_text()

    def test_torch_folder(self, run_cli, tmp_path):
        status, _, err = run_cli("export", self._plan_file(tmp_path, v2_plan("zbv")), "--to", "torch", "--graph", GPT,
                                 "-o", str(tmp_path / "out"))
        assert status == 0 and err == ""
        assert sorted(os.listdir(tmp_path / "out")) == ["schedule.csv", "stages.json", "train.py"]
        cfg = json.loads((tmp_path / "out" / "stages.json").read_text())
        assert cfg["torch_schedule"] == "ScheduleZBVZeroBubble" and cfg["format"] == "pipeplan.torch-export/2"


class TestExportedTorchFolder:
    """Under torchrun, 2 processes, ZB-V: two stages per rank, I and W apart, the tied embedding and
    head on one rank; each step's loss against one process."""

    def test_losses_equal_one_process(self, run_cli, tmp_path):
        path = tmp_path / "p.json"
        path.write_text(json.dumps(v2_plan("zbv").to_dict()))
        status, _, err = run_cli("export", str(path), "--to", "torch", "--graph", GPT, "-o", str(tmp_path / "torch"))
        assert status == 0, err
        exported = _torchrun_losses(tmp_path / "torch", 2)
        assert exported == pytest.approx(_reference_losses(8), rel=1e-5)
        assert len(set(exported)) == len(exported)  # the weights moved
