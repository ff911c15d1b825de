"""pipeplan export: the refusal rules, each target's files (plans of one stage per device group and
pipeplan.plan/2's several stages per group, split backwards), and the torch folder trained under torchrun."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, _PipelineScheduleRuntime

from conftest import EXAMPLES, make_layer, plan
from helpers import cpu_cluster_file, step_losses_printed, torchrun_jobs
from pipeplan.cli import main
from pipeplan.models.errors import InputError
from pipeplan.models.graph import LayerGraph, load_graph
from pipeplan.runtime.export import export_plan
from pipeplan.runtime.export.deepspeed import parts
from pipeplan.runtime.export.megatron import check_interleaved, layout, megatron_flags, stage_layout
from pipeplan.runtime.export.rules import check_plan, equal_count_near, placement
from pipeplan.runtime.export.targets import DEEPSPEED, MEGATRON, TORCH, TORCHTITAN
from pipeplan.runtime.export.torch_target import crossing, schedule_csv, stages_config, torch_schedule
from pipeplan.runtime.export import torch_train
from pipeplan.runtime.export.torch_train import make_schedule, tie_classes, tie_groups
from pipeplan.runtime.export.torchtitan import (RELEASES, config_module, csv_schedule_name, module_fqns,
                                                toml_fragment)
from pipeplan.runtime.report import step_losses
from pipeplan.runtime.verify import reference_parameters
from pipeplan.solver.formats.plan import Plan, Stage
from pipeplan.solver.schedules.schedule import NAMED_V2, group_programs

GPT = str(EXAMPLES / "gpt-tiny.graph.json")
ALL = ("torch", "torchtitan", "deepspeed", "megatron")


def gpt_graph() -> LayerGraph:
    """embed, block.0 .. block.3, head (the names of gpt-tiny)."""
    return load_graph(GPT)


def two_stage(split0=(4, 4), split1=(4, 4), devices1=("d1",), recompute=(False, False), schedule="1f1b",
              batch=8, ops=None):
    ops = ops or (None, None)
    return plan([(0, 3, ["d0"], list(split0), recompute[0], *(() if ops[0] is None else (ops[0],))),
                 (3, 6, list(devices1), list(split1), recompute[1], *(() if ops[1] is None else (ops[1],)))],
                batch=batch, schedule=schedule)


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


def refusal(p, target: str, graph=None, *, approximate: bool = False) -> str:
    """The one line with which ``target``'s export refuses ``p`` (on gpt-tiny unless ``graph``)."""
    with pytest.raises(InputError) as info:
        export_plan(p, graph or gpt_graph(), target, model="gpt-tiny", plan_file="p.json", approximate=approximate)
    return info.value.line()


def tp_plan(degrees=(2, 2), zero: int = 1, stage_zero=(None, None), replicas: int = 2) -> Plan:
    """gpt-tiny in two stages of ``replicas`` replicas of ``degrees[s]`` devices each, ZeRO ``zero``."""
    stages = tuple(Stage(layers, tuple(f"s{s}.{i}" for i in range(replicas * t)), (4, 4), tensor_parallel=t, zero=z)
                   for s, (layers, t, z) in enumerate(zip([(0, 3), (3, 6)], degrees, stage_zero)))
    return Plan("gpt-tiny-6", "c", 8, 4.0, "1f1b", stages, zero=zero)


class TestTensorParallelExport:
    """Each target's capabilities (targets.py): the keys it writes for a 3-D plan, the refusals with their numbers."""

    @pytest.mark.parametrize("target", [TORCH, TORCHTITAN, DEEPSPEED, MEGATRON])
    def test_every_refused_level_has_its_reason(self, target):
        caps = target.parallelism
        assert 0 in caps.zero_levels
        assert set(caps.zero_reasons) == {0, 1, 2} - set(caps.zero_levels)
        assert set(caps.zero_keys) <= set(caps.zero_levels) and caps.degree_reason

    def test_torch_takes_each_stages_zero_level(self):
        p = tp_plan(degrees=(2, 2), zero=1, stage_zero=(None, 2))
        assert check_plan(p, TORCH, "p.json") == (p, [])

    @pytest.mark.parametrize("target, says", [
        ("torch", "stage 1 has tensor_parallel 1 but stage 0 has 2: torch.distributed.pipelining runs the plan on "
                  "one pp x dp x tp device mesh"),
        ("deepspeed", "stage 0 has tensor_parallel 2: DeepSpeed has no tensor parallelism of its own"),
        ("megatron", "stage 1 has tensor_parallel 1 but stage 0 has 2: Megatron-LM runs one "
                     "--tensor-model-parallel-size for every pipeline stage"),
        ("torchtitan", "stage 1 has tensor_parallel 1 but stage 0 has 2: torchtitan runs one tensor_parallel_degree"),
    ])
    def test_degrees_refused(self, target, says):
        line = refusal(tp_plan(degrees=(2, 1), zero=0), target)
        assert says in line and "--allow-approximate changes no degree" in line
        assert refusal(tp_plan(degrees=(2, 1), zero=0), target, approximate=True) == line

    @pytest.mark.parametrize("target, zero, says", [
        ("deepspeed", 2, "stage 0 has zero 2: DeepSpeed refuses ZeRO-2 and ZeRO-3 under its pipeline engine"),
        ("megatron", 2, "stage 0 has zero 2: Megatron-LM shards gradients only under Megatron-FSDP"),
        ("torchtitan", 2, "stage 0 has zero 2: torchtitan shards gradients only between steps"),
    ])
    def test_zero_levels_refused(self, target, zero, says):
        line = refusal(tp_plan(degrees=(1, 1), zero=zero), target)
        assert line.startswith("error: p.json: zero: ") and says in line

    @pytest.mark.parametrize("target", ["deepspeed", "megatron", "torchtitan"])
    def test_zero_per_stage_refused(self, target):
        line = refusal(tp_plan(degrees=(1, 1), zero=1, stage_zero=(None, 0)), target)
        assert line.startswith("error: p.json: stages[1].zero: stage 1 has zero 0 but stage 0 has 1: ")

    def test_megatron_keys(self):
        text = export_plan(tp_plan(), gpt_graph(), "megatron", plan_file="p.json").files["megatron.args"]
        assert "2 pipeline stages x 2 data-parallel replicas x tensor-parallel size 2 = 8 processes" in text
        flags = text.splitlines()[-1].split()
        assert flags[flags.index("--tensor-model-parallel-size") + 1] == "2"
        assert "--use-distributed-optimizer" in flags and "--sequence-parallel" not in flags
        assert flags[flags.index("--micro-batch-size") + 1] == "2"  # 4 samples over 2 replicas
        plain = export_plan(tp_plan(degrees=(1, 1), zero=0), gpt_graph(), "megatron").files["megatron.args"]
        assert "--tensor-model-parallel-size" not in plain and "--use-distributed-optimizer" not in plain

    @pytest.mark.parametrize("version", ["0.3", "0.2"])
    def test_torchtitan_keys(self, version):
        # the config itself (the installed torchtitan's debug model has other layers than gpt-tiny)
        write = config_module if version == "0.3" else toml_fragment
        text = write(tp_plan(), gpt_graph(), GPT, "p.json", RELEASES[version])
        assert "2 stages on 2 pipeline ranks x 2 replicas x tensor-parallel degree 2 = 8 processes" in text
        for key, value in (("tensor_parallel_degree", 2), ("data_parallel_shard_degree", 2),
                           ("data_parallel_replicate_degree", 1), ("fsdp_reshard_after_forward", "never")):
            assert re.search(rf'"?{key}"?( =|:) {json.dumps(value)}', text), key
        assert ("enable_sequence_parallel" in text) == (version == "0.3")
        ddp = write(tp_plan(degrees=(1, 1), zero=0), gpt_graph(), GPT, "p.json", RELEASES[version])
        assert "tensor_parallel_degree" not in ddp and "fsdp_reshard_after_forward" not in ddp

    def test_deepspeed_zero_1(self):
        files = export_plan(tp_plan(degrees=(1, 1)), gpt_graph(), "deepspeed", model="gpt-tiny").files
        config = json.loads(files["deepspeed_config.json"])
        assert config["zero_optimization"] == {"stage": 1} and config["zero_allow_untested_optimizer"] is True
        assert config["train_micro_batch_size_per_gpu"] == 2

    def test_version_3_plan_file_round_trip(self, tmp_path):
        path = tmp_path / "p.json"
        path.write_text(json.dumps(tp_plan().to_dict()))
        jsonschema = pytest.importorskip("jsonschema")
        from referencing import Registry, Resource

        from pipeplan.schema_files import SCHEMA_NAMES, schema

        registry = Registry().with_resources((schema(n)["$id"], Resource.from_contents(schema(n)))
                                             for n in SCHEMA_NAMES)
        jsonschema.Draft202012Validator(schema("plan"), registry=registry).validate(json.loads(path.read_text()))
        out = tmp_path / "out"
        assert main(["export", str(path), "--graph", GPT, "--to", "megatron", "-o", str(out)]) == 0
        assert "--tensor-model-parallel-size 2 --use-distributed-optimizer" in (out / "megatron.args").read_text()


class TestCheckPlan:
    @pytest.mark.parametrize("target", ALL)
    def test_unequal_sizes_refused_by_every_target(self, target):
        line = refusal(two_stage(split1=(5, 3)), target)
        assert line.startswith("error: p.json: stages[1].microbatches: stage 1 splits the batch into unequal "
                               "microbatches [5, 3]")

    def test_torch_says_what_it_would_silently_do(self):
        line = refusal(two_stage(split0=(3, 3, 2), split1=(3, 3, 2)), "torch")
        assert "stage 0" in line and "tensor_split" in line and "silently" in line

    @pytest.mark.parametrize("target", ALL)
    def test_different_counts_refused(self, target):
        line = refusal(two_stage(split1=(2, 2, 2, 2)), target)
        assert "stage 1 splits the batch into 4 microbatches but stage 0 into 2" in line

    @pytest.mark.parametrize("target", ALL)
    def test_different_replica_counts_refused(self, target):
        line = refusal(two_stage(devices1=("d1", "d2")), target)
        assert line.startswith("error: p.json: stages[1].devices: stage 1 has 2 replicas but stage 0 has 1")

    @pytest.mark.parametrize("target", ALL)
    def test_unequal_replica_parts_refused(self, target):
        p = plan([(0, 3, ["d0", "d1"], [3, 3]), (3, 6, ["d2", "d3"], [3, 3])], batch=6, schedule="1f1b")
        assert "splits microbatches of 3 samples over 2 replicas" in refusal(p, target)

    @pytest.mark.parametrize("target", ("torchtitan", "deepspeed", "megatron"))
    def test_recompute_per_stage_refused_where_one_setting(self, target):
        line = refusal(two_stage(recompute=(False, True)), target)
        assert line.startswith("error: p.json: stages[1].recompute: stage 1 recomputes but stage 0 does not")

    def test_torch_recomputes_per_stage(self):
        assert export_plan(two_stage(recompute=(False, True)), gpt_graph(), "torch", model="gpt-tiny").files

    @pytest.mark.parametrize("target", ("deepspeed", "megatron"))
    def test_custom_op_list_refused_where_none(self, target):
        ops = (["F0", "F1", "B0", "B1"], ["F0", "B0", "F1", "B1"])
        line = refusal(two_stage(schedule="custom", ops=ops), target)
        assert line.startswith("error: p.json: schedule: stage 0 (every stage): schedule 'custom'")

    @pytest.mark.parametrize("target", ("deepspeed", "megatron"))
    def test_gpipe_refused_where_only_1f1b(self, target):
        assert "schedule 'gpipe'" in refusal(two_stage(schedule="gpipe"), target)

    @pytest.mark.parametrize("target", ("torchtitan", "megatron"))
    def test_placement_refused_for_skip_edges(self, target):
        graph = load_graph(str(EXAMPLES / "skip8.graph.json"))
        p = plan([(0, 4, ["d0"], [4, 4]), (4, 8, ["d1"], [4, 4])], batch=8, schedule="1f1b")
        assert "error: " in refusal(p, target, graph) and "skip edges" in refusal(p, target, graph)

    @pytest.mark.parametrize("target", ("torchtitan", "megatron"))
    def test_placement_refused_for_layers_no_transformer_has(self, target):
        graph = LayerGraph.chain("g", [make_layer(i) for i in range(6)])
        assert "layer 0 'l0' is not an embedding" in refusal(two_stage(), target, graph)

    def test_no_equal_split_refused_even_approximately(self):
        p = plan([(0, 3, ["d0", "d1"], [5, 4]), (3, 6, ["d2", "d3"], [5, 4])], batch=9, schedule="1f1b")
        with pytest.raises(InputError, match="no count splits 9 samples equally over 2 replicas"):
            check_plan(p, TORCH, "p.json", approximate=True)

    def test_approximation_changes_each_difference_once(self):
        p = two_stage(split0=(5, 3), split1=(2, 2, 2, 2), devices1=("d1", "d2"), recompute=(True, False),
                      schedule="gpipe")
        runnable, changes = check_plan(p, DEEPSPEED, "p.json", approximate=True)
        assert [c.where for c in changes] == ["schedule", "stages[1].devices", "stages[0].microbatches",
                                              "stages[1].microbatches", "stages[1].recompute"]
        assert runnable.schedule == "1f1b" and [st.devices for st in runnable.stages] == [("d0",), ("d1",)]
        assert all(st.microbatches == (4, 4) and st.recompute for st in runnable.stages)

    def test_a_runnable_plan_is_unchanged(self):
        p = two_stage()
        for target in (TORCH, TORCHTITAN, DEEPSPEED, MEGATRON):
            assert check_plan(p, target, "p.json") == (p, [])

    @pytest.mark.parametrize("schedule", NAMED_V2)
    @pytest.mark.parametrize("approximate", (False, True))
    def test_deepspeed_refuses_several_stages_per_rank(self, schedule, approximate):
        line = refusal(v2_plan(schedule), "deepspeed", approximate=approximate)
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


class TestEqualCountNear:
    def test_hand_computed(self):
        assert equal_count_near(64, 2, 5) == 4  # 4 and 8 divide 32; 4 is nearer
        assert equal_count_near(12, 1, 5) == 6  # 4 and 6 are as near: the larger
        assert equal_count_near(9, 2, 3) is None

    def test_brute_force(self):
        for batch in range(1, 25):
            for r in range(1, 4):
                for want in range(1, 9):
                    got = equal_count_near(batch, r, want)
                    ok = [m for m in range(1, batch + 1) if batch % m == 0 and (batch // m) % r == 0]
                    assert got == (min(ok, key=lambda m: (abs(m - want), -m)) if ok else None)


class TestScheduleCsv:
    def test_torch_loader_reads_every_rank_row(self, tmp_path):
        ops = (["F0", "F1", "F2", "B0", "B1", "B2"], ["F0", "B0", "F1", "B1", "F2", "B2"])
        p = two_stage(split0=(2, 2, 2), split1=(2, 2, 2), batch=6, schedule="custom", ops=ops)
        path = tmp_path / "schedule.csv"
        path.write_text(schedule_csv(p))
        # torch's own parser and validator, on a schedule object that needs no process group
        sched = object.__new__(_PipelineScheduleRuntime)
        sched.pipeline_order, sched._stages = {}, []
        sched.pp_group_size, sched._num_stages, sched._n_microbatches = 2, 2, 3
        PipelineScheduleMulti._load_csv(sched, str(path))
        assert [[str(a) for a in sched.pipeline_order[r]] for r in (0, 1)] == \
            [[f"{r}{op}" for op in ops[r]] for r in (0, 1)]
        assert sched.stage_index_to_group_rank == {0: 0, 1: 1}


class TestTorchSchedule:
    @pytest.mark.parametrize("schedule, name", [("gpipe", "ScheduleGPipe"), ("1f1b", "Schedule1F1B"),
                                                ("interleaved-1f1b", "ScheduleInterleaved1F1B"),
                                                ("interleaved-zb", "ScheduleInterleavedZeroBubble"),
                                                ("looped-bfs", "ScheduleLoopedBFS"), ("zbv", "ScheduleZBVZeroBubble")])
    def test_named_classes(self, schedule, name):
        assert torch_schedule(v2_plan(schedule) if schedule in NAMED_V2 else two_stage(schedule=schedule)) == name
        if schedule in NAMED_V2:  # the same stages with the schedule's programs written out: the CSV
            assert torch_schedule(custom_of(schedule)) == "csv"

    def test_csv_where_no_class_runs_the_plan(self):
        one_mb = two_stage(split0=(8,), split1=(8,))  # Schedule1F1B needs as many microbatches as stages
        assert torch_schedule(one_mb) == "csv"


class TestCrossing:
    def test_skip_edges_relay(self):
        graph = LayerGraph("g", [make_layer(i) for i in range(4)], [(0, 1), (1, 2), (2, 3), (0, 3)])
        assert crossing(graph, 0) == [0] and crossing(graph, 1) == [0, 1] and crossing(graph, 2) == [0, 2]


class TestStagesConfig:
    def test_gpt_two_by_two(self):
        p = plan([(0, 2, ["a", "b"], [4, 4]), (2, 6, ["c", "d"], [4, 4], True)], batch=8, schedule="gpipe")
        cfg = stages_config(p, gpt_graph(), "gpt-tiny")
        assert cfg["stages"][1]["units"] == ["block.1", "block.2", "block.3", "head"]
        assert cfg["stages"][1]["inputs"] == [1] and cfg["stages"][0]["outputs"] == [1]
        assert [s["ranks"] for s in cfg["stages"]] == [[0, 1], [2, 3]] and cfg["mesh"]["shape"] == [2, 2]
        assert cfg["tied"] == [[5, 0]] and cfg["seq_len"] == 16 and cfg["microbatch_size"] == 4

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


class FakeDist:
    """Records the process groups ``tie_groups`` creates, as rank lists, for one rank."""

    def __init__(self, rank: int) -> None:
        self.rank, self.created = rank, []

    def get_rank(self) -> int:
        return self.rank

    def new_group(self, ranks: list[int]) -> tuple[int, ...]:
        self.created.append(tuple(ranks))
        return tuple(ranks)


class TestTieClasses:
    def test_units_by_the_unit_owning_the_weights(self):
        assert tie_classes({"tied": [[4, 0], [8, 0]]}) == {0: [0, 4, 8]}

    def test_a_chain_of_ties_ends_at_its_owner(self):
        assert tie_classes({"tied": [[5, 2], [9, 5], [3, 1]]}) == {1: [1, 3], 2: [2, 5, 9]}


class TestTieGroups:
    @staticmethod
    def groups(monkeypatch, config: dict, replicas: int, rank: int) -> tuple[list, list]:
        fake = FakeDist(rank)
        monkeypatch.setattr(torch_train, "dist", fake)
        return tie_groups(config, replicas), fake.created

    def test_one_sum_when_a_group_holds_two_tied_units(self, monkeypatch):
        # BART cut after the encoder: its embedding on group 0, the decoder's embedding and the
        # head (one Parameter in the process) on group 1; a sum per tied pair counted group 0 twice
        config = {"tied": [[4, 0], [8, 0]], "stage_of_unit": [0] * 4 + [1] * 5, "group_of_stage": [0, 1]}
        for rank in (0, 1):
            mine, created = self.groups(monkeypatch, config, 1, rank)
            assert created == [(0, 1)] and mine == [((0, 1), [0, 4, 8])]

    def test_three_holders_sum_in_one_group_per_replica(self, monkeypatch):
        config = {"tied": [[2, 0], [5, 0]], "stage_of_unit": [0, 0, 1, 1, 2, 2], "group_of_stage": [0, 1, 2]}
        mine, created = self.groups(monkeypatch, config, 2, 3)
        assert created == [(0, 2, 4), (1, 3, 5)] and mine == [((1, 3, 5), [0, 2, 5])]

    def test_no_group_when_one_process_holds_every_tied_unit(self, monkeypatch):
        config = {"tied": [[3, 0]], "stage_of_unit": [0, 1, 2, 3], "group_of_stage": [0, 1, 1, 0]}
        assert self.groups(monkeypatch, config, 2, 0) == ([], [])


class TestMegatron:
    def test_layout_hand_computed(self):
        roles = ["E", "t", "t", "t", "t", "L"]
        p = plan([(0, 2, ["a"], [2, 2]), (2, 4, ["b"], [2, 2]), (4, 6, ["c"], [2, 2])], batch=4, schedule="1f1b")
        assert layout(p, roles) == "Et|t*2|tL"
        assert stage_layout(["t", "t", "t", "L"]) == "t*3L"

    def test_flags(self):
        p = plan([(0, 3, ["a", "b"], [4, 4], True), (3, 6, ["c", "d"], [4, 4], True)], batch=8, schedule="1f1b")
        flags = megatron_flags(p, gpt_graph())
        assert flags == ["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et*2|t*2L",
                         "--num-layers", "4", "--micro-batch-size", "2", "--global-batch-size", "8",
                         "--recompute-granularity", "full", "--recompute-method", "uniform",
                         "--recompute-num-layers", "2"]  # each stage's 2 decoder layers in one run

    def test_layout_matches_the_written_grammar(self):
        # megatron/core/transformer/pipeline_parallel_layer_layout.py, written out: E first and L last
        # once each, t or t*n decoder layers, | between stages; the t count is --num-layers
        import re

        blocks = r"(?:t(?:\*\d+)?)*"
        p = plan([(0, 1, ["a"], [2]), (1, 5, ["b"], [2]), (5, 6, ["c"], [2])], batch=2, schedule="1f1b")
        text = layout(p, ["E", "t", "t", "t", "t", "L"])
        assert text == "E|t*4|L"
        assert re.fullmatch(rf"E{blocks}(?:\|{blocks})*L", text)
        counted = sum(int(n) if n else 1 for n in re.findall(r"t(?:\*(\d+))?", text))
        assert counted == 4 and text.count("|") + 1 == len(p.stages)

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

    @pytest.mark.parametrize("name", ["three-stages", "interleaved"])
    def test_megatron_core_parser_reads_the_layout(self, name):
        layer_layout = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
        if name == "three-stages":
            p = plan([(0, 2, ["a"], [2]), (2, 3, ["b"], [2]), (3, 6, ["c"], [2])], batch=2, schedule="1f1b")
            text, ranks = layout(p, ["E", "t", "t", "t", "t", "L"]), 3
            expected = [[["embedding", "decoder"]], [["decoder"]], [["decoder", "decoder", "loss"]]]
        else:  # rank r holds virtual stages r and r + 2 as its chunks 0 and 1
            text, ranks = megatron_flags(v2_plan("interleaved-1f1b"), gpt_graph())[3], 2
            expected = [[["embedding", "decoder"], ["decoder"]], [["decoder"], ["decoder", "loss"]]]
        parsed = layer_layout.PipelineParallelLayerLayout(text, ranks)
        kinds = [[[t.name for t in chunk] for chunk in rank] for rank in parsed.layout]
        assert kinds == expected


class TestTorchtitan:
    def test_module_fqns(self):
        p = plan([(0, 2, ["a"], [2, 2]), (2, 6, ["b"], [2, 2])], batch=4, schedule="gpipe")
        assert module_fqns(p, gpt_graph()) == [["tok_embeddings", "layers.0"],
                                               ["layers.1", "layers.2", "layers.3", "norm", "lm_head"]]
        assert module_fqns(p, gpt_graph(), release=RELEASES["0.2"])[1][-1] == "output"

    def test_fragment_parses_into_torchtitans_config(self):
        import tomllib

        p = plan([(0, 3, ["a", "b"], [4, 4]), (3, 6, ["c", "d"], [4, 4])], batch=8, schedule="gpipe")
        config = tomllib.loads(toml_fragment(p, gpt_graph()))
        assert config["parallelism"]["pipeline_parallel_schedule"] == "GPipe"
        assert config["parallelism"]["pipeline_parallel_microbatch_size"] == 2
        assert config["training"]["local_batch_size"] == 4
        configs = _torchtitan_configs()
        if configs is None:
            return  # torchtitan not installed: the keys are checked against its written names above
        configs.ParallelismConfig(**config["parallelism"])
        configs.TrainingConfig(**config["training"])

    def test_custom_writes_the_csv(self):
        ops = (["F0", "F1", "B0", "B1"], ["F0", "B0", "F1", "B1"])
        files = export_plan(two_stage(schedule="custom", ops=ops), gpt_graph(), "torchtitan", model="m",
                            torchtitan_version="0.2").files
        assert 'pipeline_parallel_schedule_csv = "schedule.csv"' in files["torchtitan.toml"]
        assert files["schedule.csv"].splitlines() == ["0F0,0F1,0B0,0B1", "1F0,1B0,1F1,1B1"]

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


def _torchtitan_configs():
    """torchtitan's config dataclasses (``torchtitan/config/configs.py``), loaded alone:
    its package imports a CLI library the config classes do not need."""
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "config" / "configs.py"
    if not path.exists():
        return None
    module_spec = importlib.util.spec_from_file_location("torchtitan_configs", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


class TestDeepspeed:
    def test_parts_and_config(self):
        p = plan([(0, 1, ["a"], [2, 2, 2], True), (1, 6, ["b"], [2, 2, 2], True)], batch=6, schedule="1f1b")
        files = export_plan(p, gpt_graph(), "deepspeed", model="m").files
        assert parts(p) == [0, 1, 6]
        assert json.loads(files["deepspeed_config.json"]) == {
            "train_batch_size": 6, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
            "gradient_clipping": 0.0, "pipeline": {"use_reentrant": False}}
        assert "PARTS = [0, 1, 6]" in files["pipeline_module.py"]
        assert "TIED = [[5, 0]]" in files["pipeline_module.py"]
        assert '"activation_checkpoint_interval": 5' in files["pipeline_module.py"]  # a stage is one block
        compile(files["pipeline_module.py"], "pipeline_module.py", "exec")
        compile(files["train.py"], "train.py", "exec")


class TestExportCommand:
    def _plan_file(self, tmp_path, p) -> str:
        path = tmp_path / "p.json"
        path.write_text(json.dumps({**p.to_dict(), "graph": gpt_graph().name}))
        return str(path)

    @pytest.mark.parametrize("target", ALL)
    def test_writes_every_target(self, run_cli, tmp_path, target):
        p = plan([(0, 3, ["cpu0"], [4, 4]), (3, 6, ["cpu1"], [4, 4])], batch=8, schedule="1f1b")
        release = ["--torchtitan-version", "0.2"] if target == "torchtitan" else []  # 0.3: test_export_runtimes
        status, out, err = run_cli("export", self._plan_file(tmp_path, p), "--to", target, "--graph", GPT,
                                   *release, "-o", str(tmp_path / "out"))
        assert status == 0 and err == "" and out.startswith("wrote ")
        assert sorted(os.listdir(tmp_path / "out")) == sorted(
            {"torch": ["schedule.csv", "stages.json", "train.py"], "torchtitan": ["torchtitan.toml"],
             "deepspeed": ["deepspeed_config.json", "pipeline_module.py", "train.py"],
             "megatron": ["megatron.args"]}[target])

    @pytest.mark.parametrize("target", ALL)
    def test_refusal_is_one_line_and_writes_nothing(self, run_cli, tmp_path, target):
        p = plan([(0, 3, ["cpu0"], [5, 3]), (3, 6, ["cpu1"], [5, 3])], batch=8, schedule="1f1b")
        status, out, err = run_cli("export", self._plan_file(tmp_path, p), "--to", target, "--graph", GPT,
                                   "-o", str(tmp_path / "out"))
        assert status == 2 and out == "" and len(err.splitlines()) == 1
        assert err.startswith(f"error: {tmp_path / 'p.json'}: stages[0].microbatches: stage 0 ")
        assert not (tmp_path / "out").exists()

    def test_approximate_warns_per_change_with_both_times(self, run_cli, tmp_path):
        p = plan([(0, 3, ["cpu0"], [5, 3], True), (3, 6, ["cpu1"], [5, 3])], batch=8, schedule="gpipe")
        status, out, err = run_cli("export", self._plan_file(tmp_path, p), "--to", "megatron", "--graph", GPT,
                                   "--allow-approximate", "--cluster", str(EXAMPLES / "cpu-pair.cluster.json"),
                                   "-o", str(tmp_path / "out"))
        lines = err.splitlines()
        assert status == 0 and len(lines) == 5 and all(line.startswith("warning: ") for line in lines)
        assert "schedule: gpipe -> 1f1b" in lines[0] and "stages[1].recompute" in lines[3]
        assert "simulated iteration time" in lines[4] and " ms as planned, " in lines[4]
        assert "--micro-batch-size 4" in (tmp_path / "out" / "megatron.args").read_text()

    def test_approximate_needs_the_cluster(self, run_cli, tmp_path):
        p = plan([(0, 3, ["cpu0"], [5, 3]), (3, 6, ["cpu1"], [5, 3])], batch=8, schedule="1f1b")
        status, _, err = run_cli("export", self._plan_file(tmp_path, p), "--to", "torch", "--graph", GPT,
                                 "--allow-approximate", "-o", str(tmp_path / "out"))
        assert status == 2 and err.startswith("error: -: --cluster: ") and not (tmp_path / "out").exists()

    def test_warns_when_the_plan_names_another_graph(self, run_cli, tmp_path):
        p = plan([(0, 3, ["cpu0"], [4, 4]), (3, 6, ["cpu1"], [4, 4])], batch=8, schedule="1f1b")
        path = tmp_path / "other.json"
        path.write_text(json.dumps(p.to_dict()))  # made for graph "g"
        status, _, err = run_cli("export", str(path), "--to", "megatron", "--graph", GPT, "-o", str(tmp_path / "o"))
        assert status == 0 and err == (f"warning: {path}: graph: plan was made for graph 'g', exporting it on "
                                       f"'gpt-tiny-6'\n")

    def test_output_that_is_a_file(self, run_cli, tmp_path):
        p = plan([(0, 3, ["cpu0"], [4, 4]), (3, 6, ["cpu1"], [4, 4])], batch=8, schedule="1f1b")
        (tmp_path / "f").write_text("")
        status, _, err = run_cli("export", self._plan_file(tmp_path, p), "--to", "torch", "--graph", GPT,
                                 "-o", str(tmp_path / "f"))
        assert status == 2 and "is a file" in err

    def test_plan_2_file_is_read_as_version_2(self, tmp_path):
        path = self._plan_file(tmp_path, v2_plan("zbv"))
        assert json.loads(open(path).read())["format"] == "pipeplan.plan/2"

    @pytest.mark.parametrize("target", ("deepspeed", "megatron"))
    def test_schedule_refusal_is_one_line_and_writes_nothing(self, run_cli, tmp_path, target):
        status, out, err = run_cli("export", self._plan_file(tmp_path, v2_plan("zbv")), "--to", target, "--graph", GPT,
                                   "-o", str(tmp_path / "out"))
        assert status == 2 and out == "" and len(err.splitlines()) == 1
        assert re.match(rf"error: {re.escape(str(tmp_path / 'p.json'))}: schedule: stage 0 \(every stage\): "
                        rf"schedule 'zbv': ", err)
        assert not (tmp_path / "out").exists()

    def test_approximate_warns_and_simulates_both(self, run_cli, tmp_path):
        cluster = cpu_cluster_file(tmp_path, 2)
        status, out, err = run_cli("export", self._plan_file(tmp_path, v2_plan("looped-bfs")), "--to", "megatron",
                                   "--graph", GPT, "--allow-approximate", "--cluster", cluster,
                                   "-o", str(tmp_path / "out"))
        lines = err.splitlines()
        assert status == 0 and len(lines) == 2 and "schedule: looped-bfs -> interleaved-1f1b" in lines[0]
        assert " ms as planned, " in lines[1]
        assert "--pipeline-model-parallel-layout 'Et|t|t|tL'" in (tmp_path / "out" / "megatron.args").read_text()

    def test_torch_folder_of_a_plan_2(self, run_cli, tmp_path):
        status, _, err = run_cli("export", self._plan_file(tmp_path, v2_plan("zbv")), "--to", "torch", "--graph", GPT,
                                 "-o", str(tmp_path / "out"))
        assert status == 0 and err == ""
        assert sorted(os.listdir(tmp_path / "out")) == ["schedule.csv", "stages.json", "train.py"]
        cfg = json.loads((tmp_path / "out" / "stages.json").read_text())
        assert cfg["torch_schedule"] == "ScheduleZBVZeroBubble" and cfg["format"] == "pipeplan.torch-export/2"


# ---------------------------------------------------------------- the torch folder under torchrun
STEPS = 3
LOSS_TOLERANCE = 1e-5

CUSTOM_OPS = [["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"], ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"],
              ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"], ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]]

TORCHRUN_PLANS = {
    # 2 processes, 1F1B (Schedule1F1B), the second stage recomputing
    "1f1b-recompute": lambda: plan([(0, 3, ["cpu0"], [2, 2, 2, 2]), (3, 6, ["cpu1"], [2, 2, 2, 2], True)],
                                   batch=8, schedule="1f1b"),
    # 4 processes, GPipe, two replicas per stage on a 2-D mesh
    "gpipe-2x2": lambda: plan([(0, 2, ["cpu0", "cpu1"], [4, 4]), (2, 6, ["cpu2", "cpu3"], [4, 4])],
                              batch=8, schedule="gpipe"),
    # 4 processes, a custom op list through schedule.csv, stage 1 recomputing
    "custom-4": lambda: plan([(0, 2, ["cpu0"], [2] * 4, False, CUSTOM_OPS[0]),
                              (2, 3, ["cpu1"], [2] * 4, True, CUSTOM_OPS[1]),
                              (3, 4, ["cpu2"], [2] * 4, False, CUSTOM_OPS[2]),
                              (4, 6, ["cpu3"], [2] * 4, False, CUSTOM_OPS[3])], batch=8, schedule="custom"),
    # 2 processes, ZB-V: two stages per rank, I and W apart, the tied embedding and head on one rank
    "zbv": lambda: v2_plan("zbv"),
    # 4 processes, 1F1B on a pp x dp x tp mesh: two stages of tensor parallelism 2 (parallelize_module),
    # stage 1 recomputing
    "tp-2x2": lambda: tensor_parallel(plan([(0, 3, ["cpu0", "cpu1"], [2] * 4), (3, 6, ["cpu2", "cpu3"], [2] * 4, True)],
                                           batch=8, schedule="1f1b")),
    # 4 processes, one stage of 2 replicas x tensor parallelism 2, ZeRO-2 (ZeroRedundancyOptimizer over dp)
    "tp-dp-zero2": lambda: tensor_parallel(plan([(0, 6, ["cpu0", "cpu1", "cpu2", "cpu3"], [4, 4])], batch=8,
                                                schedule="gpipe"), zero=2),
}
"""The plans trained from their exported folders (every one with a global batch of 8 on gpt-tiny)."""


def tensor_parallel(p: Plan, t: int = 2, zero: int = 0) -> Plan:
    """``p`` with every stage of degree ``t`` (its devices: replicas of ``t``) and ZeRO level ``zero``."""
    from dataclasses import replace

    return replace(p, stages=tuple(replace(st, tensor_parallel=t) for st in p.stages), zero=zero)


@pytest.fixture(scope="module")
def torchrun_runs(tmp_path_factory) -> dict[str, dict]:
    """Per plan of :data:`TORCHRUN_PLANS`: the losses its exported ``train.py`` printed under torchrun
    (``exported``), those of pipeplan's workers on the same plan (``pipeplan_run``) and one process's.

    Every plan runs in one torchrun launch (tests/data/torchrun_folders.py): each exported
    folder in turn, followed by the workers that ``pipeplan run`` starts
    (``pipeplan.runtime.worker``, as under torchrun across machines), each on as many of the
    launch's processes as its plan takes, so the processes start once, not three times per plan.
    """
    root = tmp_path_factory.mktemp("torchrun")
    plans = []
    for name, make in TORCHRUN_PLANS.items():
        p = make()
        processes = sum(len(group) for group in p.groups)
        plan_file = root / f"{name}.plan.json"
        plan_file.write_text(json.dumps({**p.to_dict(), "graph": gpt_graph().name, "cluster": f"cpu-{processes}"}))
        assert main(["export", str(plan_file), "--to", "torch", "--graph", GPT, "-o", str(root / name)]) == 0
        plans.append((processes, name, plan_file))
    plans.sort(key=lambda item: -item[0])  # a launch's idle ranks wait in the next job: the largest first
    jobs = []
    for processes, name, plan_file in plans:
        # --timeout: a job's ranks wait in its rendezvous for those still finishing the job before
        jobs.append({"train": str(root / name), "argv": ["--model", "gpt-tiny", "--steps", str(STEPS),
                                                          "--timeout", "600"], "processes": processes})
        jobs.append({"pipeplan": [GPT, cpu_cluster_file(root, processes), str(plan_file), "--model", "gpt-tiny",
                                  "--steps", str(STEPS), "--result", str(root / f"{name}.result.json")],
                     "processes": processes})
    printed = torchrun_jobs(jobs, plans[0][0], root)
    reference = reference_losses(8)
    runs: dict[str, dict] = {}
    for k, (_, name, _) in enumerate(plans):
        ranks = json.loads((root / f"{name}.result.json").read_text())["ranks"]
        runs[name] = {"exported": step_losses_printed(printed[2 * k], STEPS), "pipeplan_run": step_losses(ranks),
                      "one_process": reference}
    return runs


def reference_losses(batch: int) -> list[float]:
    """gpt-tiny's losses trained in one process (seed 0, learning rate 0.05, the runs' defaults)."""
    losses: list[float] = []
    reference_parameters("gpt-tiny", steps=STEPS, global_batch=batch, lr=0.05, seed=0, dtype=torch.float32,
                         seq_len=16, on_loss=losses.append)
    return losses


class TestExportedTorchFolder:
    @pytest.mark.parametrize("name", sorted(TORCHRUN_PLANS))
    def test_losses_equal_pipeplan_run_and_one_process(self, torchrun_runs, name):
        run = torchrun_runs[name]
        assert run["exported"] == pytest.approx(run["pipeplan_run"], rel=LOSS_TOLERANCE)
        assert run["exported"] == pytest.approx(run["one_process"], rel=LOSS_TOLERANCE)
        assert len(set(run["exported"])) == STEPS  # the weights moved: each step's loss differs
