"""pipeplan export: the refusal rules, each target's files, and the torch folder trained under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, _PipelineScheduleRuntime

from conftest import EXAMPLES, ROOT, make_layer, plan
from pipeplan.models.errors import InputError
from pipeplan.models.graph import Layer, LayerGraph, load_graph
from pipeplan.runtime.export import export_plan
from pipeplan.runtime.export.deepspeed import parts
from pipeplan.runtime.export.megatron import layout, megatron_flags, stage_layout
from pipeplan.runtime.export.rules import check_plan, equal_count_near
from pipeplan.runtime.export.targets import DEEPSPEED, MEGATRON, TORCH, TORCHTITAN
from pipeplan.runtime.export.torch_target import crossing, schedule_csv, stages_config, torch_schedule
from pipeplan.runtime.export.torchtitan import RELEASES, module_fqns, toml_fragment
from pipeplan.runtime.verify import reference_parameters

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


def refusal(p, target, graph=None) -> str:
    with pytest.raises(InputError) as info:
        export_plan(p, graph or gpt_graph(), target, model="gpt-tiny", plan_file="p.json")
    return info.value.line()


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
    def test_named_classes_and_csv(self):
        assert torch_schedule(two_stage(schedule="gpipe")) == "ScheduleGPipe"
        assert torch_schedule(two_stage()) == "Schedule1F1B"
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

    def test_megatron_core_parser_reads_the_layout(self):
        layer_layout = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
        p = plan([(0, 2, ["a"], [2]), (2, 3, ["b"], [2]), (3, 6, ["c"], [2])], batch=2, schedule="1f1b")
        parsed = layer_layout.PipelineParallelLayerLayout(layout(p, ["E", "t", "t", "t", "t", "L"]), 3)
        kinds = [[[t.name for t in chunk] for chunk in stage] for stage in parsed.layout]
        assert kinds == [[["embedding", "decoder"]], [["decoder"]], [["decoder", "decoder", "loss"]]]


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


# ---------------------------------------------------------------- the torch folder under torchrun
STEPS = 3
LOSS_TOLERANCE = 1e-5


def _cluster(tmp_path: Path, n: int) -> str:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({
        "format": "pipeplan.cluster/1", "name": f"cpu-{n}",
        "servers": [{"id": "local", "bandwidth": 3.0e9, "latency": 6.0e-5}],
        "network": {"bandwidth": 1.25e9, "latency": 1.0e-4},
        "devices": [{"id": f"cpu{i}", "server": "local", "speed": 1.0, "memory": 4.0e9} for i in range(n)]}))
    return str(path)


def _torchrun_losses(folder: Path, processes: int) -> list[float]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={processes}", "train.py", "--model", "gpt-tiny", "--steps", str(STEPS)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [int(words[1]) for words in lines] == list(range(STEPS))
    return [float(words[3]) for words in lines]


def _pipeplan_run_losses(graph: str, cluster: str, plan_file: str) -> list[float]:
    proc = subprocess.run([sys.executable, "-m", "pipeplan", "run", graph, cluster, plan_file, "--model", "gpt-tiny",
                           "--steps", str(STEPS), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])["losses"]


def _reference_losses(batch: int) -> list[float]:
    losses: list[float] = []
    reference_parameters("gpt-tiny", steps=STEPS, global_batch=batch, lr=0.05, seed=0, dtype=torch.float32,
                         seq_len=16, on_loss=losses.append)
    return losses


CUSTOM_OPS = [["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"], ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"],
              ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"], ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]]

TORCHRUN_PLANS = {
    # 2 processes, 1F1B (Schedule1F1B), the second stage recomputing
    "1f1b-recompute": ("1f1b", [(0, 3, ["cpu0"], [2, 2, 2, 2]), (3, 6, ["cpu1"], [2, 2, 2, 2], True)]),
    # 4 processes, GPipe, two replicas per stage on a 2-D mesh
    "gpipe-2x2": ("gpipe", [(0, 2, ["cpu0", "cpu1"], [4, 4]), (2, 6, ["cpu2", "cpu3"], [4, 4])]),
    # 4 processes, a custom op list through schedule.csv, stage 1 recomputing
    "custom-4": ("custom", [(0, 2, ["cpu0"], [2] * 4, False, CUSTOM_OPS[0]),
                            (2, 3, ["cpu1"], [2] * 4, True, CUSTOM_OPS[1]),
                            (3, 4, ["cpu2"], [2] * 4, False, CUSTOM_OPS[2]),
                            (4, 6, ["cpu3"], [2] * 4, False, CUSTOM_OPS[3])]),
}


class TestExportedTorchFolder:
    @pytest.mark.parametrize("name", sorted(TORCHRUN_PLANS))
    def test_losses_equal_pipeplan_run_and_one_process(self, tmp_path, run_cli, name):
        schedule, stages = TORCHRUN_PLANS[name]
        p = plan(stages, batch=8, schedule=schedule)
        processes = sum(len(st.devices) for st in p.stages)
        plan_file = tmp_path / "plan.json"
        plan_file.write_text(json.dumps({**p.to_dict(), "graph": gpt_graph().name, "cluster": f"cpu-{processes}"}))
        cluster = _cluster(tmp_path, processes)
        folder = tmp_path / "torch"
        status, _, err = run_cli("export", str(plan_file), "--to", "torch", "--graph", GPT, "-o", str(folder))
        assert status == 0, err
        exported = _torchrun_losses(folder, processes)
        ours = _pipeplan_run_losses(GPT, cluster, str(plan_file))
        reference = _reference_losses(8)
        assert exported == pytest.approx(ours, rel=LOSS_TOLERANCE)
        assert exported == pytest.approx(reference, rel=LOSS_TOLERANCE)
        assert len(set(exported)) == STEPS  # the weights moved: each step's loss differs
