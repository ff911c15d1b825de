"""Train a pipeplan plan with DeepSpeed's pipeline engine (written by ``pipeplan export --to deepspeed``).

Run it from its folder, one process per device of the plan::

    torchrun --standalone --nproc-per-node=N train.py --model gpt-tiny --steps K

(``deepspeed --num_gpus=N train.py ...`` launches it the same way on GPUs).  It builds
the model with pipeplan's runtime (the same weights, batches and loss as ``pipeplan run
--model M --seed S``), makes one DeepSpeed layer per unit of the model, cuts them at the
plan's boundaries with ``pipeline_module.py``'s ``PlanPipelineModule`` (tied units as
``TiedLayerSpec``), hands it and an SGD optimizer to ``deepspeed.initialize`` with
``deepspeed_config.json``, runs ``engine.train_batch()`` per step and prints ``step <k>
loss <value>`` on rank 0.

Each layer takes the tensors live before its unit (the outputs a later unit reads, the
model input among them where the model's own ``forward`` reads it again) and returns
those live after it, so a skip connection crosses the stages as one more tensor of the
tuple DeepSpeed sends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# DeepSpeed picks its accelerator on import: CPU processes (gloo) where no GPU is
os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")

import deepspeed  # noqa: E402
from deepspeed.pipe import TiedLayerSpec  # noqa: E402

from pipeline_module import MODEL, PARTS, REPLICAS, SEQ_LEN, TIED, UNITS, pipeline_module  # noqa: E402
from pipeplan.models.model_options import add_model_options, request_from_args  # noqa: E402
from pipeplan.runtime.training_data import build_run_model, step_batch  # noqa: E402


def live_tensors(model) -> list[list[int]]:
    """For every cut ``i`` (after unit ``i - 1``): the units whose outputs a unit from ``i`` on reads
    (``-1``: the model input), ascending.  ``live[0]`` is ``[-1]``."""
    n = len(model.units)
    live = []
    for i in range(n):
        live.append(sorted({u for v in range(i, n) for u in model.units[v].inputs if u < i}))
    return live


def run_unit(model, index: int, before: list[int], after: list[int], tensors):
    """Unit ``index`` on the tensors live before it; the tensors live after it (one tensor alone)."""
    tensors = tensors if isinstance(tensors, tuple) else (tensors,)
    given = dict(zip(before, tensors))
    done = model.forward(given.get(-1), index, index + 1, given)
    out = tuple(done[u] for u in after)
    return out[0] if len(out) == 1 else out


class UnitLayer(nn.Module):
    """One unit of the model as a DeepSpeed layer (its module registered for the parameters)."""

    def __init__(self, model, index: int, before: list[int], after: list[int]) -> None:
        super().__init__()
        self.unit = model.units[index].module
        self.run = partial(run_unit, model, index, before, after)

    def forward(self, tensors):
        return self.run(tensors)


class TiedUnits(nn.Module):
    """The units of one tie group that a stage holds (DeepSpeed builds one per stage and key)."""

    def __init__(self, model, indices: list[int]) -> None:
        super().__init__()
        self.units = nn.ModuleDict({str(i): model.units[i].module for i in indices})


def tie_groups() -> dict[int, list[int]]:
    """Owner unit -> every unit sharing its Parameters (the owner first)."""
    groups: dict[int, list[int]] = {}
    for unit, owner in TIED:
        groups.setdefault(owner, [owner]).append(unit)
    return groups


def shared_names(model, owner: int, units: list[int]) -> list[list[str]]:
    """For every Parameter the group shares (in the owner's order): its name inside ``TiedUnits``
    through each unit of the group (``None`` where that unit does not hold it)."""
    names = []
    for name, p in model.units[owner].module.named_parameters():
        paths = []
        for u in units:
            found = next((f"units.{u}.{n}" for n, q in model.units[u].module.named_parameters(remove_duplicate=False)
                          if q is p), None)
            paths.append(found)
        if sum(path is not None for path in paths) > 1:
            names.append(paths)
    return names


def plan_layers(model) -> list:
    """One DeepSpeed layer per unit: ``UnitLayer``, or ``TiedLayerSpec`` for a unit in a tie group.

    DeepSpeed builds one module per tie key on every stage that holds a unit of the group,
    broadcasts the shared weights from the lowest of those stages, and sums their
    gradients over them after the backward passes (``allreduce_tied_weight_gradients``).
    The module built on a stage is ``TiedUnits`` of the group's units on that stage, and
    ``tied_weight_attr`` names the shared Parameters through the first of them.
    """
    live = live_tensors(model) + [[len(model.units) - 1]]
    stage_of = [s for s in range(len(PARTS) - 1) for _ in range(PARTS[s], PARTS[s + 1])]
    groups = tie_groups()
    key_of = {u: owner for owner, units in groups.items() for u in units}
    layers: list = []
    for i in range(len(model.units)):
        if i not in key_of:
            layers.append(UnitLayer(model, i, live[i], live[i + 1]))
            continue
        units = groups[key_of[i]]
        here = [u for u in units if stage_of[u] == stage_of[i]]
        attrs = [next(path for u, path in zip(units, paths) if u in here and path is not None)
                 for paths in shared_names(model, key_of[i], units)]
        layers.append(TiedLayerSpec(f"tied{key_of[i]}", TiedUnits, model, here,
                                    forward_fn=partial(_run_tied, model, i, live[i], live[i + 1]),
                                    tied_weight_attr=attrs))
    return layers


def _run_tied(model, index: int, before: list[int], after: list[int], _module: TiedUnits, tensors):
    # the TiedUnits module holds the very unit modules the model runs
    return run_unit(model, index, before, after, tensors)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=MODEL, help=f"model spec (default {MODEL})")
    p.add_argument("--steps", type=int, default=6, help="training steps (default 6)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and batches (default 0)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--seq-len", type=int, default=SEQ_LEN, help="tokens per sample (zoo language models)")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher's
    add_model_options(p, trace=False)  # an imported model's --model-arg, --units ... as pipeplan run takes them
    return p.parse_args(argv)


def replica_microbatches(x: torch.Tensor, y: torch.Tensor, m: int, size: int, replicas: int, replica: int):
    """The replica's part of every microbatch, in order: pipeplan's replicas each take a
    contiguous part of every microbatch."""
    part = size // replicas
    for k in range(m):
        rows = slice(k * size + replica * part, k * size + (replica + 1) * part)
        yield x[rows], y[rows]


def say(line: str) -> None:
    """One line on stdout in one write, so that the lines of several ranks never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    config = json.loads((HERE / "deepspeed_config.json").read_text())
    args = parse_args(argv)
    if not torch.cuda.is_available():
        # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce (a C++ build of minutes on a
        # small machine) that only its inference all-reduce uses; training's collectives are gloo's
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    world = torch.distributed.get_world_size()
    stages, replicas = len(PARTS) - 1, REPLICAS
    if world != stages * replicas:
        raise SystemExit(f"error: {HERE / 'pipeline_module.py'}: PARTS: the plan needs {stages * replicas} processes "
                         f"({stages} stages x {replicas} replicas), got {world}")
    request = request_from_args(args)
    model = build_run_model(request, seq_len=args.seq_len if request.is_zoo else None, seed=args.seed)
    names = [unit.name for unit in model.units]
    if names != UNITS:
        raise SystemExit(f"error: {HERE / 'pipeline_module.py'}: UNITS: model {args.model!r} has units {names}, "
                         f"the plan's graph {UNITS}")
    module = pipeline_module(plan_layers(model), model.loss)
    optimizer = torch.optim.SGD([p for p in module.parameters()], lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    replica = engine.grid.get_data_parallel_rank()
    built = engine.module
    say(f"rank {torch.distributed.get_rank()} stage {engine.stage_id} replica {replica} layers "
        f"{built._local_start} {built._local_stop} parts {list(built.parts)} tied {sorted(built.tied_modules)}")
    m, size = config["gradient_accumulation_steps"], config["train_batch_size"] // config["gradient_accumulation_steps"]
    for step in range(args.steps):
        x, y = step_batch(model, config["train_batch_size"], args.seed, step)
        loss = engine.train_batch(data_iter=replica_microbatches(x, y, m, size, replicas, replica))
        if torch.distributed.get_rank() == 0:
            say(f"step {step} loss {loss.item()!r}")
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
