"""Train a pipeplan plan with torch.distributed.pipelining (written by ``pipeplan export --to torch``).

Run it from its folder, one process per device of the plan::

    torchrun --standalone --nproc-per-node=N train.py --steps K

It reads ``stages.json`` (and ``schedule.csv`` for custom programs) next to it, builds
the model it names (``--model`` and the options it was profiled with; a factory file
is loaded from its copy in this folder) with pipeplan's runtime (the same weights,
batches and loss as ``pipeplan run --model M --seed S``), cuts it into the plan's stages (one ``PipelineStage`` per
stage, all the stages of a device group on that group's pipeline rank, each stage's
units in one module, a ``checkpoint_wrapper`` around the stages that recompute), runs
the plan's schedule class (``Schedule1F1B``, ``ScheduleGPipe``,
``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``, ``ScheduleLoopedBFS``,
``ScheduleZBVZeroBubble``) or the CSV, feeds every stage the microbatch's model input
(an imported model's stages replay its ``forward``, which reads it; torch passes keyword
arguments of ``step`` to every stage), averages gradients over each group's replicas
(the ``dp`` dimension of a 2-D ``DeviceMesh``), sums the gradients of tied weights, takes
an SGD step, and prints ``step <k> loss <value>`` on rank 0.

A plan with ``tensor_parallel`` t > 1 runs on a 3-D mesh ``pp x dp x tp``: each stage's
units are split over ``tp`` with ``parallelize_module`` (attention and MLP column- then
row-parallel, the plan of ``pipeplan.runtime.sharding.tensor_parallel_plan``; other units
replicated), and each rank sends its stage's outputs to the rank of the same ``dp`` and
``tp`` coordinates in the next stage (every rank of a replica holds them whole).  The
parameters of stages with ``zero`` 1 or 2 are stepped by ``ZeroRedundancyOptimizer`` over
``dp`` (under ``zero`` 2 each gradient is summed onto the rank that steps it only).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble, ScheduleLoopedBFS, ScheduleZBVZeroBubble)
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
from torch.distributed.tensor.parallel import parallelize_module

from pipeplan.models.errors import InputError
from pipeplan.models.model_options import ModelRequest
from pipeplan.runtime.sharding import RankOptimizer, local, tensor_parallel_plan
from pipeplan.runtime.training_data import build_run_model, step_batch

HERE = Path(__file__).resolve().parent


class StageModule(nn.Module):
    """Units ``lo..hi-1`` of the model: takes the tensors crossing the cut before the
    stage (in ``inputs`` order) and the microbatch's model input (``batch``), and
    returns the tensors crossing the cut after it."""

    def __init__(self, model, lo: int, hi: int, inputs: list[int], outputs: list[int]) -> None:
        super().__init__()
        self.model, self.lo, self.hi = model, lo, hi
        self.inputs, self.outputs = inputs, outputs
        self.units = nn.ModuleList(unit.module for unit in model.units[lo:hi])  # registers the parameters

    def forward(self, *tensors: torch.Tensor, batch: torch.Tensor | None = None):
        given = dict(zip(self.inputs, tensors))
        # the first stage receives the input as its argument; a later one reads it only
        # where its units or the glue code feeding them do (an imported model's replay)
        done = self.model.forward(tensors[0] if self.lo == 0 else batch, self.lo, self.hi, given)
        out = tuple(done[u] for u in self.outputs)
        return out[0] if len(out) == 1 else out


def parse_args(config: dict, argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=config["model"], help=f"model spec (default {config['model']}, with the "
                                                              "options in stages.json)")
    p.add_argument("--model-arg", action="append", metavar="KEY=VALUE",
                   help="keyword argument of the factory (hf: a configuration field), VALUE in JSON; repeatable "
                        "(default: those in stages.json for its model)")
    p.add_argument("--input-shape", help="per-sample input shape of a module without an example")
    p.add_argument("--input-dtype", help="float32, float64, bfloat16 or int64")
    p.add_argument("--input-high", help="integer inputs are drawn in [0, N)")
    p.add_argument("--units", help="the model's units (auto or qualified names)")
    p.add_argument("--steps", type=int, default=6, help="training steps (default 6)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and batches (default 0)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a collective may wait")
    return p.parse_args(argv)


def model_request(config: dict, args: argparse.Namespace, folder: Path = HERE) -> ModelRequest:
    """The model to build: ``--model`` and its options; those of ``stages.json`` for its own model.

    ``stages.json`` names a factory file copied into ``folder`` by its file name: it is
    loaded from there, wherever torchrun starts.
    """
    exported = args.model == config["model"]
    options = (config.get("model_options") or {}) if exported else {}
    spec = args.model
    target, sep, attr = spec.rpartition(":")
    if exported and sep and target.endswith(".py") and not Path(target).is_absolute():
        spec = f"{folder / target}:{attr}"
    given = {"model_args": args.model_arg, "input_shape": args.input_shape, "input_dtype": args.input_dtype,
             "input_high": args.input_high, "units": args.units}
    chosen = {key: value if value is not None else options.get(key) for key, value in given.items()}
    return ModelRequest(spec, tuple(chosen["model_args"] or ()), chosen["input_shape"], chosen["input_dtype"],
                        chosen["input_high"], chosen["units"] or "auto")


def replica_rows(n_micro: int, size: int, replicas: int, replica: int) -> torch.Tensor:
    """Global sample indices of one replica: its part of every microbatch, in order.

    pipeplan's replicas each take a contiguous part of every microbatch; the replica's
    local batch is those parts one after the other, so torch's equal chunks of it are
    exactly the replica's pieces.
    """
    part = size // replicas
    return torch.cat([torch.arange(k * size + replica * part, k * size + (replica + 1) * part)
                      for k in range(n_micro)])


ONE_STAGE_CLASSES = {"Schedule1F1B": Schedule1F1B, "ScheduleGPipe": ScheduleGPipe}
"""torch's schedules that take the rank's one stage."""
MULTI_STAGE_CLASSES = {"ScheduleInterleaved1F1B": ScheduleInterleaved1F1B,
                       "ScheduleInterleavedZeroBubble": ScheduleInterleavedZeroBubble,
                       "ScheduleLoopedBFS": ScheduleLoopedBFS, "ScheduleZBVZeroBubble": ScheduleZBVZeroBubble}
"""torch's schedules that take the list of the rank's stages."""


def make_schedule(config: dict, stages: list, loss_fn, folder: Path = HERE):
    """The schedule object of this rank: its stages (ascending index) under the plan's class or the CSV."""
    m, name = config["microbatches"], config["torch_schedule"]
    if name in ONE_STAGE_CLASSES:
        return ONE_STAGE_CLASSES[name](stages[0], m, loss_fn=loss_fn)
    if name in MULTI_STAGE_CLASSES:
        return MULTI_STAGE_CLASSES[name](stages, m, loss_fn=loss_fn)
    schedule = _PipelineScheduleRuntime(stages, m, loss_fn=loss_fn)
    schedule._load_csv(str(folder / config["schedule_csv"]), format="compute_only")
    return schedule


def tie_classes(config: dict) -> dict[int, list[int]]:
    """The units that share weights, by the unit owning them: ``owner -> [owner, unit, ...]``."""
    owner_of = {unit: owner for unit, owner in config["tied"]}
    classes: dict[int, list[int]] = {}
    for unit in sorted(owner_of):
        root = unit
        while root in owner_of:  # a chain of ties ends at the unit that owns the weights
            root = owner_of[root]
        classes.setdefault(root, [root]).append(unit)
    return classes


def tie_groups(config: dict, replicas: int) -> list[tuple[object, list[int]]]:
    """For each set of tied units on two or more device groups: one process group per rank index over them all.

    ``replicas``: the ranks of each group (``dp x tp``).

    One sum over every holder, not one per tied pair: a group holding two of the units holds
    one Parameter (BART's encoder and decoder embeddings and its head), which pairwise sums
    would count twice, and a third holder would get only part of the sum.  Every rank creates
    every group (``new_group`` is collective); returns the ``(group, units)`` this rank belongs
    to.  Tied units on one group (ZB-V's first and last stage) are summed in the process
    (:func:`untie_within_rank`).
    """
    rank = dist.get_rank()
    group_of_unit = [config["group_of_stage"][s] for s in config["stage_of_unit"]]
    mine: list[tuple[object, list[int]]] = []
    for owner, units in sorted(tie_classes(config).items()):
        holders = sorted({group_of_unit[unit] for unit in units})
        if len(holders) < 2:
            continue  # one process holds them all
        for j in range(replicas):
            ranks = [g * replicas + j for g in holders]
            group = dist.new_group(ranks)
            if rank in ranks:
                mine.append((group, units))
    return mine


def shared_parameters(model, units: list[int]) -> list[nn.Parameter]:
    """The Parameters the owner ``units[0]`` shares with the other units, each once."""
    found = {id(p): p for unit in units[1:] for p in tied_parameters(model, unit, units[0])}
    return list(found.values())


def tied_parameters(model, unit: int, owner: int) -> list[nn.Parameter]:
    """The Parameters units ``unit`` and ``owner`` share (a GPT head's embedding matrix)."""
    theirs = {id(p) for p in model.units[owner].module.parameters()}
    return [p for p in model.units[unit].module.parameters() if id(p) in theirs]


def untie_within_rank(model, config: dict, mine: list[int]) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """Give a tied unit whose owner is in another stage of this rank its own copy of the shared weights.

    With a Parameter that two stages of one rank share (ZB-V's tied embedding and head
    on rank 0), torch 2.13's ``ScheduleZBVZeroBubble`` trains to other losses than one
    process does; with a copy each stage has its own Parameter, ``main`` sums the two
    gradients into both, and the copies step alike and stay equal.  Returns the
    ``(owner's, copy)`` pairs.
    """
    pairs: list[tuple[nn.Parameter, nn.Parameter]] = []
    for unit, owner in config["tied"]:
        s_unit, s_owner = config["stage_of_unit"][unit], config["stage_of_unit"][owner]
        if s_unit == s_owner or s_unit not in mine or s_owner not in mine:
            continue
        cloned: list[str] = []
        shared = {id(p) for p in tied_parameters(model, unit, owner)}
        owned = {id(m) for m in model.units[owner].module.modules()}
        module = model.units[unit].module
        for name, sub in list(module.named_modules()):
            if not name or id(sub) not in owned or any(name.startswith(f"{done}.") for done in cloned):
                continue
            # the unit holds the owner's module itself (GPT's head its wte): replace it by a copy
            *path, leaf = name.split(".")
            clone = copy.deepcopy(sub)
            setattr(module.get_submodule(".".join(path)), leaf, clone)
            cloned.append(name)
            pairs += [(p, q) for p, q in zip(sub.parameters(), clone.parameters()) if id(p) in shared]
        for name, p in list(module.named_parameters()):
            if id(p) in shared:  # a shared Parameter held directly
                *path, leaf = name.split(".")
                twin = nn.Parameter(p.detach().clone())
                setattr(module.get_submodule(".".join(path)), leaf, twin)
                pairs.append((p, twin))
    return pairs


def main(argv: list[str] | None = None) -> int:
    config = json.loads((HERE / "stages.json").read_text())
    args = parse_args(config, argv)
    num_stages, groups, replicas = len(config["stages"]), len(config["groups"]), config["replicas"]
    t = config.get("tensor_parallel", 1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != groups * replicas * t:
        raise SystemExit(f"error: {HERE / 'stages.json'}: ranks: the plan needs {groups * replicas * t} processes "
                         f"({groups} device groups x {replicas} replicas x {t} tensor-parallel), got {world}: run "
                         f"torchrun --nproc-per-node={groups * replicas * t}")
    # NCCL takes one GPU per process: with fewer GPUs than local processes, train on the CPUs (gloo)
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=args.timeout))
    mesh = init_device_mesh(device.type, tuple(config["mesh"]["shape"]), mesh_dim_names=tuple(config["mesh"]["dims"]))
    g, j = mesh.get_coordinate()[:2]
    mine = config["groups"][g]["stages"]
    try:
        model = build_run_model(model_request(config, args), seq_len=config["seq_len"], seed=args.seed)
    except InputError as exc:  # the model's own refusal, one line as from pipeplan
        raise SystemExit(exc.line()) from None
    names = [unit.name for unit in model.units]
    copies = untie_within_rank(model, config, mine)
    modules, stages = [], []
    for s in mine:
        spec = config["stages"][s]
        if names[spec["layers"][0]:spec["layers"][1]] != spec["units"]:
            raise SystemExit(f"error: {HERE / 'stages.json'}: stages[{s}].units: model {args.model!r} has units "
                             f"{names}, the plan's stage {s} holds {spec['units']}")
        module = StageModule(model, *spec["layers"], spec["inputs"], spec["outputs"]).to(device)
        if t > 1:  # every rank built the same weights: each keeps its shard (src_data_rank=None)
            for unit in module.units:
                parallelize_module(unit, mesh["tp"], tensor_parallel_plan(unit, t), src_data_rank=None)
        runner = checkpoint_wrapper(module) if spec["recompute"] else module
        modules.append(module)
        stages.append(PipelineStage(runner, s, num_stages, device, group=mesh["pp"].get_group()))
    schedule = make_schedule(config, stages, model.loss)
    parameters = list({id(p): p for module in modules for p in module.parameters()}.values())  # tied: once
    ties = tie_groups(config, replicas * t)
    optimizer = make_optimizer(config, model, modules, mine, parameters, ties, copies, mesh, args.lr)
    rows = replica_rows(config["microbatches"], config["microbatch_size"], replicas, j)
    first, last = 0 in mine, num_stages - 1 in mine
    for step in range(args.steps):
        x, y = step_batch(model, config["global_batch"], args.seed, step)
        x, y = x[rows].to(device), y[rows].to(device)
        losses: list[torch.Tensor] = []
        inputs = (x,) if first else ()
        schedule.step(*inputs, batch=x, **({"target": y, "losses": losses} if last else {}))
        for p, copy in copies:
            p.grad = copy.grad = p.grad + copy.grad
        sync_gradients(parameters, mesh, replicas, model, ties, optimizer.owners if zero_two(config, mine) else {})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        report_loss(step, losses, replicas * t)
    dist.destroy_process_group()
    return 0


def zero_two(config: dict, mine: list[int]) -> bool:
    """Whether this rank's stages shard their gradients (``zero`` 2)."""
    return any(config["stages"][s].get("zero", 0) == 2 for s in mine)


def make_optimizer(config: dict, model, modules: list, mine: list[int], parameters: list[nn.Parameter],
                   ties: list[tuple[object, list[int]]], copies: list, mesh, lr: float) -> RankOptimizer:
    """SGD; over ``dp`` with ZeroRedundancyOptimizer for the parameters of stages with ``zero`` 1 or 2.

    Tied parameters are summed across groups and stepped whole on each holder.
    """
    tied = {id(p) for _, units in ties for p in shared_parameters(model, units)}
    tied |= {id(q) for pair in copies for q in pair}
    zero = {id(p) for module, s in zip(modules, mine) if config["stages"][s].get("zero", 0)
            for p in module.parameters()}
    if config["replicas"] == 1:
        return RankOptimizer(parameters, lr)
    sharded = [p for p in parameters if id(p) in zero and id(p) not in tied]
    return RankOptimizer(parameters, lr, sharded, mesh["dp"].get_group() if sharded else None)


def sync_gradients(parameters: list[nn.Parameter], mesh, replicas: int, model, ties: list[tuple[object, list[int]]],
                   owners: dict[int, int] | None = None) -> None:
    """Average over the group's replicas (ZeRO-2: onto each gradient's owner only), then sum the tied copies'
    gradients across groups.  A tensor-parallel parameter's gradient is this rank's shard (``local``)."""
    owners = owners or {}
    if replicas > 1:
        group = mesh["dp"].get_group()
        for p in parameters:
            if p.grad is None:
                continue
            grad = local(p.grad)
            if id(p) in owners:
                dist.reduce(grad, dst=owners[id(p)], group=group)
                if owners[id(p)] != dist.get_rank():
                    p.grad = None
                    continue
            else:
                dist.all_reduce(grad, group=group)
            grad /= replicas
    for group, units in ties:
        for p in shared_parameters(model, units):
            dist.all_reduce(p.grad, group=group)


def report_loss(step: int, losses: list[torch.Tensor], replicas: int) -> None:
    """The global batch's mean loss on rank 0: the last stage's ranks hold it, each for its replica.

    ``replicas``: the last stage's ranks (``dp x tp``: a replica's tensor-parallel ranks hold the same loss).
    """
    mine = torch.stack(losses).mean().double() / replicas if losses else torch.zeros((), dtype=torch.float64)
    dist.all_reduce(mine)
    if dist.get_rank() == 0:
        print(f"step {step} loss {mine.item()!r}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
