"""Every export run by the target runtime's own code (CPU only): DeepSpeed's pipeline engine trains the
DeepSpeed folder to ``pipeplan run``'s losses, megatron-core validates the Megatron flags and builds the
plan's (virtual) stages from them, and torchtitan loads its config and splits its model as the plan says.

The runtimes come from pyproject.toml's ``runtimes`` group, which ``make test`` installs (torchtitan's
previous release 0.2 beside it, under ``.venv/torchtitan-0.2``).  The multi-process DeepSpeed runs, and
pipeplan's own workers on the same plans, happen once for the module, in one torchrun launch
(``deepspeed_runs``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import EXAMPLES, ROOT, plan
from helpers import cpu_cluster_file, torchrun_jobs
from pipeplan.models.errors import InputError
from pipeplan.models.graph import Layer, LayerGraph, load_graph
from pipeplan.models.model_options import ModelRequest
from pipeplan.runtime.export import export_plan
from pipeplan.runtime.export.torchtitan import check_module_names
from pipeplan.runtime.report import step_losses
from pipeplan.runtime.verify import reference_parameters
from pipeplan.solver.formats.plan import Plan, Stage

GPT = str(EXAMPLES / "gpt-tiny.graph.json")
MYMODEL = f"{EXAMPLES / 'mymodel.py'}:build"
MYMODEL_ARGS = ("dim=16", "vocab=64", "seq=8")
"""examples/mymodel.py small: a user model with a head tied to its embedding and a skip from the embedding to it."""
STEPS = 3
LOSS_TOLERANCE = 1e-5
DATA = Path(__file__).resolve().parent.parent / "examples"  # titan_configs.py, which the demo uses too
TORCHTITAN_02 = ROOT / ".venv" / "torchtitan-0.2"


def require(module: str) -> None:
    """Skip, saying why, where the runtime is not installed (``make test`` installs it)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed here: `make test` installs it with pyproject.toml's runtimes "
                    f"group (pip install -e '.[runtimes]' with torch pinned)")


def write_json(path: Path, value: dict) -> str:
    path.write_text(json.dumps(value))
    return str(path)


def cli(*argv: str) -> None:
    from pipeplan.cli import main

    assert main(list(argv)) == 0, argv


# ---------------------------------------------------------------- DeepSpeed: its pipeline engine trains
DEEPSPEED_PLANS = {
    # 4 processes: 1F1B, 2 stages x 2 data-parallel replicas of gpt-tiny (embedding and head tied across the cut),
    # ZeRO-1: the optimizer state sharded over the replicas (zero_optimization stage 1)
    "gpt-replicas": ("gpt-tiny", [(0, 3, ["cpu0", "cpu1"], [4, 4]), (3, 6, ["cpu2", "cpu3"], [4, 4])], 1),
    # 2 processes: the user model (tied head, a skip from the embedding over the cut), every stage recomputing
    "mymodel-recompute": ("mymodel", [(0, 3, ["cpu0"], [2, 2, 2, 2], True), (3, 6, ["cpu1"], [2, 2, 2, 2], True)]),
}
PIPEPLAN_RUN = ("mymodel-recompute",)
"""The plans also run with pipeplan's workers (processes are the cost of this module).  gpt-tiny's
``pipeplan run`` losses at this batch, seed and step count equal the one-process ones within 1e-5
(tests/test_export.py, ``TestExportedTorchFolder``), so its DeepSpeed run is checked against those."""


STEP_LINE = re.compile(r"\bstep (\d+) loss (-?[0-9.]+(?:e[-+]?\d+)?|nan|inf)")
RANK_LINE = re.compile(r"\brank (\d+) stage (\d+) replica (\d+) layers (\d+) (\d+) parts (\[[^]]*\]) tied (\[[^]]*\])")
"""What train.py prints (searched anywhere in a line: the ranks share one stdout)."""
DEEPSPEED_ENV = {"DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": None}  # each rank's lines leave in whole writes


@pytest.fixture(scope="module")
def deepspeed_runs(tmp_path_factory) -> dict[str, dict]:
    """Per plan of :data:`DEEPSPEED_PLANS`: the plan, the losses DeepSpeed printed, every rank's
    ``rank ... layers ...`` line, ``pipeplan run``'s losses and the one-process losses.

    The plans run in one torchrun launch (tests/data/torchrun_folders.py), each on as many of
    its processes as the plan takes: for the plans of :data:`PIPEPLAN_RUN` first the workers
    that ``pipeplan run`` starts (``pipeplan.runtime.worker``, as under torchrun across
    machines), then every exported DeepSpeed ``train.py``.
    """
    require("deepspeed")
    folder = tmp_path_factory.mktemp("deepspeed")
    graphs = {"gpt-tiny": GPT, "mymodel": str(folder / "mymodel.graph.json")}
    cli("profile", MYMODEL, *[w for a in MYMODEL_ARGS for w in ("--model-arg", a)], "--analytic",
        "-o", graphs["mymodel"])
    runs, jobs = {}, []
    for name, (model, stages, *zero) in DEEPSPEED_PLANS.items():
        p = plan(stages, batch=8, schedule="1f1b")
        p = dataclasses.replace(p, zero=zero[0]) if zero else p
        processes = sum(len(st.devices) for st in p.stages)
        graph = load_graph(graphs[model])
        plan_file = write_json(folder / f"{name}.plan.json",
                               {**p.to_dict(), "graph": graph.name, "cluster": f"cpu-{processes}"})
        options = (["--model", "gpt-tiny"] if model == "gpt-tiny" else
                   ["--model", MYMODEL, *[w for a in MYMODEL_ARGS for w in ("--model-arg", a)]])
        cli("export", plan_file, "--to", "deepspeed", "--graph", graphs[model], "-o", str(folder / name))
        result = folder / f"{name}.result.json"
        if name in PIPEPLAN_RUN:
            jobs.append({"pipeplan": [graphs[model], cpu_cluster_file(folder, processes), plan_file, *options,
                                      "--steps", str(STEPS), "--result", str(result)], "processes": processes})
        train = {"train": str(folder / name), "argv": ["--steps", str(STEPS), *options], "processes": processes}
        jobs.append(train)
        request = ModelRequest(options[1], MYMODEL_ARGS if model == "mymodel" else ())
        reference: list[float] = []
        reference_parameters(request, steps=STEPS, global_batch=8, lr=0.05, seed=0, dtype=torch.float32,
                             seq_len=16 if model == "gpt-tiny" else None, on_loss=reference.append)
        runs[name] = {"plan": p, "job": train, "result": result if name in PIPEPLAN_RUN else None,
                      "one_process": reference}
    jobs.sort(key=lambda job: -job["processes"])  # a launch's idle ranks wait in the next job: the largest first
    printed = torchrun_jobs(jobs, jobs[0]["processes"], folder, env=DEEPSPEED_ENV)
    for run in runs.values():
        out = "\n".join(printed[next(k for k, job in enumerate(jobs) if job is run["job"])])
        del run["job"]
        result = run.pop("result")
        run.update(stdout=out, steps=[int(m.group(1)) for m in STEP_LINE.finditer(out)],
                   losses=[float(m.group(2)) for m in STEP_LINE.finditer(out)],
                   ranks=sorted(m.groups() for m in RANK_LINE.finditer(out)),
                   pipeplan_run=None if result is None else step_losses(json.loads(result.read_text())["ranks"]))
    return runs


@pytest.mark.parametrize("name", sorted(DEEPSPEED_PLANS))
class TestDeepspeedTrains:
    def test_losses_equal_pipeplan_run_and_one_process(self, deepspeed_runs, name):
        run = deepspeed_runs[name]
        assert run["steps"] == list(range(STEPS)), run["stdout"]
        if run["pipeplan_run"] is not None:
            assert run["losses"] == pytest.approx(run["pipeplan_run"], rel=LOSS_TOLERANCE)
        assert run["losses"] == pytest.approx(run["one_process"], rel=LOSS_TOLERANCE)

    def test_the_weights_move(self, deepspeed_runs, name):
        assert len(set(deepspeed_runs[name]["losses"])) == STEPS

    def test_every_rank_builds_its_stage_of_the_plan(self, deepspeed_runs, name):
        run = deepspeed_runs[name]
        p = run["plan"]
        replicas = p.stages[0].replicas
        parts = [st.layers[0] for st in p.stages] + [p.stages[-1].layers[1]]
        assert len(run["ranks"]) == len(p.stages) * replicas
        assert sorted(int(found[0]) for found in run["ranks"]) == list(range(len(p.stages) * replicas))
        for rank, stage, replica, lo, hi, found_parts, tied in run["ranks"]:
            assert (int(stage), int(replica)) == divmod(int(rank), replicas)
            assert (int(lo), int(hi)) == p.stages[int(stage)].layers
            assert json.loads(found_parts) == parts
            # the tied embedding and head: one TiedLayerSpec key on the first and the last stage
            assert tied == ("['tied0']" if int(stage) in (0, len(p.stages) - 1) else "[]")


# ---------------------------------------------------------------- Megatron: megatron-core's own checks
MEGATRON_PLANS = {
    # unequal stages, every stage recomputing
    "1f1b-unequal": ("1f1b", [(0, 2, ["a"], [2, 2, 2]), (2, 3, ["b"], [2, 2, 2]), (3, 6, ["c"], [2, 2, 2])], True),
    # 4 virtual stages on 2 pipeline ranks
    "interleaved": ("interleaved-1f1b", [(0, 2, ["a"], [2] * 4), (2, 3, ["b"], [2] * 4), (3, 4, ["a"], [2] * 4),
                                         (4, 6, ["b"], [2] * 4)], False),
}


def megatron_flags_of(text: str) -> dict[str, str | None]:
    words = shlex.split(next(line for line in text.splitlines() if not line.startswith("#")))
    flags: dict[str, str | None] = {}
    for word in words:
        if word.startswith("--"):
            flags[word] = None
            last = word
        else:
            flags[last] = word
    return flags


@pytest.mark.parametrize("name", sorted(MEGATRON_PLANS))
class TestMegatronCore:
    def test_config_and_layout_give_every_virtual_stage_the_plans_layers(self, name):
        require("megatron.core")
        from megatron.core import parallel_state
        from megatron.core.transformer.enums import LayerType
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_config import TransformerConfig
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        schedule, stages, recompute = MEGATRON_PLANS[name]
        p = plan([(*st, recompute) for st in stages], batch=8, schedule=schedule)
        flags = megatron_flags_of(export_plan(p, load_graph(GPT), "megatron", model="gpt-tiny").files["megatron.args"])
        pp = int(flags["--pipeline-model-parallel-size"])
        virtual = len(p.stages) // pp
        recompute_flags = ({"recompute_granularity": flags["--recompute-granularity"],
                            "recompute_method": flags["--recompute-method"],
                            "recompute_num_layers": int(flags["--recompute-num-layers"])} if recompute else {})
        config = TransformerConfig(num_layers=int(flags["--num-layers"]), hidden_size=32, num_attention_heads=4,
                                   pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32,
                                   virtual_pipeline_model_parallel_size=virtual if virtual > 1 else None,
                                   pipeline_model_parallel_layout=flags["--pipeline-model-parallel-layout"],
                                   **recompute_flags)
        layout = config.pipeline_model_parallel_layout
        counts = []
        parallel_state.set_virtual_pipeline_model_parallel_world_size(virtual if virtual > 1 else None)
        try:
            for s, st in enumerate(p.stages):
                rank, chunk = s % pp, s // pp  # Megatron: virtual stage i on rank i mod pp, chunk i // pp
                parallel_state.set_pipeline_model_parallel_rank(rank)
                blocks = [i - 1 for i in range(*st.layers) if 0 < i < 5]
                assert get_num_layers_to_build(config, vp_stage=chunk) == len(blocks)
                counts.append(len(blocks))
                if blocks:
                    assert get_transformer_layer_offset(config, vp_stage=chunk) == blocks[0]
                kinds = layout.layout[rank][chunk]
                assert (LayerType.embedding in kinds) == (st.layers[0] == 0)
                assert (LayerType.loss in kinds) == (st.layers[1] == 6)
        finally:
            parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
            parallel_state.set_pipeline_model_parallel_rank(None)
        if recompute:  # each stage's decoder layers in whole runs of --recompute-num-layers
            assert all(count % config.recompute_num_layers == 0 for count in counts)
        assert "--untie-embeddings-and-output-weights" not in flags  # gpt-tiny's head is its embedding


class TestMegatronCoreTensorParallel:
    def test_flags_name_megatron_cores_settings(self):
        require("megatron.core")
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.transformer.transformer_config import TransformerConfig

        stages = tuple(Stage(layers, tuple(f"s{s}.{i}" for i in range(4)), (4, 4), tensor_parallel=2)
                       for s, layers in enumerate([(0, 3), (3, 6)]))
        text = export_plan(Plan("gpt-tiny-6", "c", 8, 4.0, "1f1b", stages, zero=1), load_graph(GPT),
                           "megatron").files["megatron.args"]
        flags = megatron_flags_of(text)
        config = TransformerConfig(num_layers=4, hidden_size=32, num_attention_heads=4,
                                   tensor_model_parallel_size=int(flags["--tensor-model-parallel-size"]))
        assert config.tensor_model_parallel_size == 2
        assert "use_distributed_optimizer" in {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
        assert "--use-distributed-optimizer" in text.split()


# ---------------------------------------------------------------- torchtitan 0.3: its config loading and split
TITAN_PLANS = {
    # 2 stages x 2 replicas, recomputing
    "1f1b": ("1f1b", [(0, 3, ["a", "b"], [4, 4], True), (3, 6, ["c", "d"], [4, 4], True)]),
    # 4 stages on 2 ranks, looped
    "interleaved": ("interleaved-1f1b", [(0, 2, ["a"], [2] * 4), (2, 3, ["b"], [2] * 4), (3, 4, ["a"], [2] * 4),
                                         (4, 6, ["b"], [2] * 4)]),
    # 4 stages on 2 ranks in a V
    "zbv": ("zbv", [(0, 2, ["a"], [2] * 4), (2, 3, ["b"], [2] * 4), (3, 4, ["b"], [2] * 4), (4, 6, ["a"], [2] * 4)]),
}
TITAN_MODEL = "titan_configs:llama3_4_layers"
"""torchtitan's llama3 debug model with gpt-tiny's 4 decoder layers (examples/titan_configs.py)."""


@pytest.fixture(scope="module")
def titan(tmp_path_factory, monkeypatch_module):
    """torchtitan 0.3's ConfigManager and split, its model of :data:`TITAN_MODEL` with real weights, a batch."""
    require("torchtitan")
    import torchtitan.distributed.pipeline_parallel as pipeline_parallel
    from torchtitan.config.manager import ConfigManager

    from pipeplan.runtime.export.torchtitan import installed_version

    if installed_version() != "0.3":
        pytest.skip(f"torchtitan {installed_version()} is installed here, not its current release 0.3")
    monkeypatch_module.syspath_prepend(str(DATA))
    return {"manager": ConfigManager, "pp": pipeline_parallel, "folder": tmp_path_factory.mktemp("torchtitan"),
            "model": None}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def load_titan_config(titan, folder: Path):
    """The plan's torchtitan config as ``torchtitan.train --module pipeplan_torchtitan --config pipeplan_plan``
    loads it."""
    sys.modules.pop("pipeplan_torchtitan", None)
    sys.path.insert(0, str(folder))
    try:
        return titan["manager"]().parse_args(["--module", "pipeplan_torchtitan", "--config", "pipeplan_plan"])
    finally:
        sys.path.remove(str(folder))


def titan_model(titan, config):
    """The model of ``config`` with weights (built once), and a batch with its attention masks."""
    if titan["model"] is None:
        torch.manual_seed(0)
        with torch.device("cpu"):
            model = config.model_spec.model.build()
        model.init_states()
        # 128 tokens: torchtitan's block-causal masks come in blocks of 128 (shorter rows give NaNs)
        tokens = torch.randint(0, 2048, (1, 128))
        positions = torch.arange(128).unsqueeze(0)
        titan["model"] = (model, tokens, positions, model.get_attention_masks(positions))
    return titan["model"]


@pytest.mark.parametrize("name", sorted(TITAN_PLANS))
class TestTorchtitanCurrent:
    def test_config_loads_and_torchtitans_split_is_the_plans(self, titan, name):
        schedule, stages = TITAN_PLANS[name]
        p = plan(stages, batch=8, schedule=schedule)
        folder = titan["folder"] / name
        files = export_plan(p, load_graph(GPT), "torchtitan", model="gpt-tiny", torchtitan_model=TITAN_MODEL).files
        assert sorted(files) == ["pipeplan_torchtitan.py"]
        folder.mkdir()
        (folder / "pipeplan_torchtitan.py").write_text(files["pipeplan_torchtitan.py"])
        config = load_titan_config(titan, folder)
        par = config.parallelism
        assert par.pipeline_parallel_degree == len(p.groups)
        assert config.training.local_batch_size * par.data_parallel_replicate_degree == 8
        assert par.pipeline_parallel_microbatch_size * len(p.stages[0].microbatches) == config.training.local_batch_size
        assert (config.activation_checkpoint is not None) == p.stages[0].recompute
        model, tokens, positions, masks = titan_model(titan, config)
        parts = []
        for rank in range(par.pipeline_parallel_degree):
            mine = titan["pp"]._get_pp_rank_to_stage_indices_mapping(rank, par.pipeline_parallel_degree,
                                                                     par.pipeline_parallel_schedule,
                                                                     len(par.module_fqns_per_model_part))
            assert [p.stage_groups[s] for s in mine] == [rank] * len(mine)
        expected = [["tok_embeddings"] * (lo == 0) + [f"layers.{i - 1}" for i in range(lo, hi) if 0 < i < 5]
                    + ["norm", "lm_head"] * (hi == 6) for lo, hi in (st.layers for st in p.stages)]
        with torch.no_grad():
            h = tokens
            for s, names in enumerate(par.module_fqns_per_model_part):
                part = titan["pp"]._split_module(model, names)
                kept = [n for n, c in part.named_children() if c is not None and not isinstance(c, torch.nn.ModuleDict)]
                kept += [f"layers.{k}" for k in part.layers]
                assert sorted(kept) == sorted(expected[s])
                parts.append(part)
                h = part(h, positions, masks)
            assert h.shape == (1, 128, 2048)  # the last stage returns logits (vocabulary 2048), not hidden states
            assert torch.equal(h, model(tokens, positions, masks))


class TestTorchtitanTensorParallel:
    def test_config_loads_with_the_plans_degree_and_fsdp(self, titan):
        # 2 stages x 2 replicas x tensor-parallel degree 2, ZeRO-1: FSDP over the replicas
        stages = tuple(Stage(layers, tuple(f"s{s}.{i}" for i in range(4)), (4, 4), tensor_parallel=2)
                       for s, layers in enumerate([(0, 3), (3, 6)]))
        p = Plan("gpt-tiny-6", "c", 8, 4.0, "1f1b", stages, zero=1)
        files = export_plan(p, load_graph(GPT), "torchtitan", model="gpt-tiny", torchtitan_model=TITAN_MODEL).files
        folder = titan["folder"] / "tensor-parallel"
        folder.mkdir()
        (folder / "pipeplan_torchtitan.py").write_text(files["pipeplan_torchtitan.py"])
        par = (config := load_titan_config(titan, folder)).parallelism
        assert (par.tensor_parallel_degree, par.enable_sequence_parallel) == (2, False)
        assert (par.data_parallel_shard_degree, par.data_parallel_replicate_degree) == (2, 1)
        assert par.fsdp_reshard_after_forward == "never"
        assert config.training.local_batch_size * par.data_parallel_shard_degree == 8
        assert "= 8 processes" in files["pipeplan_torchtitan.py"]


class TestModelModules:
    def test_reads_the_names_without_torchtitans_checkpoint_advice(self, titan, caplog):
        from pipeplan.runtime.export.torchtitan import CURRENT, RELEASES, model_modules

        with caplog.at_level(logging.WARNING):
            names = model_modules(RELEASES[CURRENT], TITAN_MODEL)
            assert logging.getLogger().level == logging.WARNING  # the caller's level is back
        assert names[:2] == ["tok_embeddings", "layers.0"]
        assert "layers.3" in names and "layers.4" not in names  # gpt-tiny's 4 blocks
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


class TestTorchtitanRefusals:
    def test_a_module_the_model_lacks_is_an_export_error(self):
        require("torchtitan")
        p = plan([(0, 3, ["a"], [4, 4]), (3, 6, ["b"], [4, 4])], batch=8, schedule="1f1b")
        with pytest.raises(InputError) as info:  # torchtitan's llama3 debug model has 6 layers, gpt-tiny 4 blocks
            export_plan(p, load_graph(GPT), "torchtitan", model="gpt-tiny", plan_file="p.json",
                        torchtitan_version="0.3")
        assert "module 'layers.4', which no stage of the plan holds" in info.value.line()
        with pytest.raises(InputError) as info:
            check_module_names([["tok_embeddings", "layers.0"], ["norm", "output"]],
                               ["tok_embeddings", "layers.0", "norm", "lm_head"], "llama3", "p.json")
        assert "stage 1 names 'output', which is no module" in info.value.line()

    def test_the_config_refuses_names_the_model_lacks(self, titan, tmp_path):
        p = plan([(0, 3, ["a"], [4, 4]), (3, 6, ["b"], [4, 4])], batch=8, schedule="1f1b")
        text = export_plan(p, load_graph(GPT), "torchtitan", model="gpt-tiny",
                           torchtitan_model=TITAN_MODEL).files["pipeplan_torchtitan.py"]
        (tmp_path / "pipeplan_torchtitan.py").write_text(text.replace('"lm_head"', '"output"'))
        with pytest.raises(ValueError, match="no modules of titan_configs:llama3_4_layers"):
            load_titan_config(titan, tmp_path)

    def test_one_device_group_is_refused(self):
        stages = [(0, 2, ["a"], [2] * 4), (2, 4, ["a"], [2] * 4), (4, 6, ["a"], [2] * 4)]
        p = plan(stages, batch=8, schedule="interleaved-1f1b")
        with pytest.raises(InputError) as info:
            export_plan(p, load_graph(GPT), "torchtitan", model="gpt-tiny", plan_file="p.json",
                        torchtitan_version="0.2")
        assert info.value.line().startswith("error: p.json: stages: 3 stages and 4 microbatches on 1 device group: "
                                            "torchtitan takes pipeline_parallel_degree = 1 as no pipeline")


# ---------------------------------------------------------------- torchtitan 0.2: the previous release
_TITAN_02_CHECK = '''
import json, sys, torch
from torch import nn
from torchtitan.config import ConfigManager
from torchtitan.distributed import pipeline_parallel
from torchtitan.protocols.train_spec import get_train_spec

config = ConfigManager().parse_args(["--job.config_file", sys.argv[1]])
spec = get_train_spec(config.model.name)
torch.manual_seed(0)
model = spec.model_cls(spec.model_args[config.model.flavor])
with torch.no_grad():
    model.init_weights()


class Mesh:  # torchtitan's split asks the mesh for its rank, size and group only
    def __init__(self, rank, size):
        self.rank, self.size_ = rank, size
    def get_local_rank(self):
        return self.rank
    def size(self):
        return self.size_
    def get_group(self, name):
        return torch.distributed.group.WORLD


torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
par = config.parallelism
found = {}
for rank in range(par.pipeline_parallel_degree):
    stages, parts = pipeline_parallel.pipeline_module_split(model, Mesh(rank, par.pipeline_parallel_degree),
                                                            par.pipeline_parallel_schedule, torch.device("cpu"),
                                                            par.module_fqns_per_model_part)
    for stage, part in zip(stages, parts):
        kept = [n for n, c in part.named_children() if c is not None and not isinstance(c, nn.ModuleDict)]
        found[stage.stage_index] = {"rank": rank, "modules": kept + [f"layers.{k}" for k in part.layers]}
        found[stage.stage_index]["part"] = part
tokens = torch.randint(0, 2048, (2, 8))
with torch.no_grad():
    h = tokens
    for s in sorted(found):
        h = found[s].pop("part")(h)
    whole = model(tokens)
print(json.dumps({"stages": [found[s] for s in sorted(found)], "shape": list(h.shape),
                  "equal": bool(torch.equal(h, whole)), "mode": config.activation_checkpoint.mode,
                  "microbatch": par.pipeline_parallel_microbatch_size, "local_batch": config.training.local_batch_size}))
'''


class TestTorchtitanPrevious:
    def test_toml_loads_and_its_split_is_the_plans(self, tmp_path):
        if not (TORCHTITAN_02 / "torchtitan").is_dir():
            pytest.skip(f"torchtitan 0.2 is not installed in {TORCHTITAN_02} (`make test` puts it there)")
        names = ["embed"] + [f"block.{i}" for i in range(6)] + ["head"]  # torchtitan 0.2's llama3 debug model
        graph = LayerGraph.chain("llama3-debug", [Layer(n, (0, 1), (0, 1), 1, 1, 1) for n in names])
        p = plan([(0, 3, ["a"], [2, 2]), (3, 5, ["b"], [2, 2]), (5, 8, ["c"], [2, 2])], batch=4, schedule="1f1b")
        files = export_plan(p, graph, "torchtitan", model="m", torchtitan_version="0.2").files
        assert sorted(files) == ["torchtitan.toml"]
        (tmp_path / "torchtitan.toml").write_text(files["torchtitan.toml"])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TORCHTITAN_02), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-c", _TITAN_02_CHECK, str(tmp_path / "torchtitan.toml")],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        found = json.loads(proc.stdout.splitlines()[-1])
        assert [sorted(st["modules"]) for st in found["stages"]] == [
            sorted(["tok_embeddings", "layers.0", "layers.1"]), ["layers.2", "layers.3"],
            sorted(["layers.4", "layers.5", "norm", "output"])]
        assert [st["rank"] for st in found["stages"]] == [0, 1, 2]
        assert found["shape"] == [2, 8, 2048] and found["equal"]
        assert (found["mode"], found["microbatch"], found["local_batch"]) == ("none", 2, 4)


# ---------------------------------------------------------------- the command
class TestExportCommand:
    def test_creates_missing_parent_folders(self, run_cli, tmp_path):
        p = plan([(0, 3, ["cpu0"], [4, 4]), (3, 6, ["cpu1"], [4, 4])], batch=8, schedule="1f1b")
        plan_file = write_json(tmp_path / "p.json", {**p.to_dict(), "graph": "gpt-tiny-6"})
        out = tmp_path / "a" / "b" / "c"
        status, _, err = run_cli("export", plan_file, "--to", "megatron", "--graph", GPT, "-o", str(out))
        assert status == 0, err
        assert (out / "megatron.args").is_file()

    def test_a_file_on_the_way_is_refused(self, run_cli, tmp_path):
        p = plan([(0, 3, ["cpu0"], [4, 4]), (3, 6, ["cpu1"], [4, 4])], batch=8, schedule="1f1b")
        plan_file = write_json(tmp_path / "p.json", {**p.to_dict(), "graph": "gpt-tiny-6"})
        (tmp_path / "a").write_text("")
        status, _, err = run_cli("export", plan_file, "--to", "megatron", "--graph", GPT,
                                 "-o", str(tmp_path / "a" / "b"))
        assert status == 2 and "is a file, not a folder" in err and len(err.splitlines()) == 1
