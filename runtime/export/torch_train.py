"""Train a pipeplan plan with torch.distributed.pipelining (written by ``pipeplan export --to torch``).

Run it from its folder, one process per device of the plan::

    torchrun --standalone --nproc-per-node=N train.py --model gpt-tiny --steps K

It reads ``stages.json`` (and ``schedule.csv`` for a custom op list) next to it, builds
the model with pipeplan's runtime (the same weights, batches and loss as ``pipeplan
run --model M --seed S``), cuts it into the plan's stages (one ``PipelineStage`` per
pipeline rank, each stage's units in one module, a ``checkpoint_wrapper`` around the
stages that recompute), runs ``Schedule1F1B`` / ``ScheduleGPipe`` or the CSV, averages
gradients over each stage's replicas (the ``dp`` dimension of a 2-D ``DeviceMesh``),
sums the gradients of tied weights, takes an SGD step, and prints ``step <k> loss
<value>`` on rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from pipeplan.runtime.training_data import build_run_model, step_batch

HERE = Path(__file__).resolve().parent


class StageModule(nn.Module):
    """Units ``lo..hi-1`` of the model: takes the tensors crossing the cut before the
    stage (in ``inputs`` order) and returns those crossing the cut after it."""

    def __init__(self, model, lo: int, hi: int, inputs: list[int], outputs: list[int]) -> None:
        super().__init__()
        self.model, self.lo, self.hi = model, lo, hi
        self.inputs, self.outputs = inputs, outputs
        self.units = nn.ModuleList(unit.module for unit in model.units[lo:hi])  # registers the parameters

    def forward(self, *tensors: torch.Tensor):
        given = dict(zip(self.inputs, tensors))
        first = tensors[0] if self.lo == 0 else None
        done = self.model.forward(first, self.lo, self.hi, given)
        out = tuple(done[u] for u in self.outputs)
        return out[0] if len(out) == 1 else out


def parse_args(config: dict, argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=config["model"], help=f"model spec (default {config['model']})")
    p.add_argument("--steps", type=int, default=6, help="training steps (default 6)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and batches (default 0)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a collective may wait")
    return p.parse_args(argv)


def replica_rows(n_micro: int, size: int, replicas: int, replica: int) -> torch.Tensor:
    """Global sample indices of one replica: its part of every microbatch, in order.

    pipeplan's replicas each take a contiguous part of every microbatch; the replica's
    local batch is those parts one after the other, so torch's equal chunks of it are
    exactly the replica's pieces.
    """
    part = size // replicas
    return torch.cat([torch.arange(k * size + replica * part, k * size + (replica + 1) * part)
                      for k in range(n_micro)])


def make_schedule(config: dict, stage: PipelineStage, loss_fn):
    m = config["microbatches"]
    if config["torch_schedule"] == "Schedule1F1B":
        return Schedule1F1B(stage, m, loss_fn=loss_fn)
    if config["torch_schedule"] == "ScheduleGPipe":
        return ScheduleGPipe(stage, m, loss_fn=loss_fn)
    schedule = _PipelineScheduleRuntime([stage], m, loss_fn=loss_fn)
    schedule._load_csv(str(HERE / config["schedule_csv"]), format="compute_only")
    return schedule


def tie_groups(config: dict, replicas: int) -> dict[int, list]:
    """For each tied pair of units on two stages: one process group per replica index.

    Every rank creates every group (``new_group`` is collective); returns the groups
    this rank belongs to, by the unit whose weights it shares.
    """
    rank = dist.get_rank()
    mine: dict[int, list] = {}
    for unit, owner in config["tied"]:
        s_unit, s_owner = config["stage_of_unit"][unit], config["stage_of_unit"][owner]
        if s_unit == s_owner:
            continue  # one module holds both: the Parameter is shared already
        for j in range(replicas):
            ranks = [s_unit * replicas + j, s_owner * replicas + j]
            group = dist.new_group(ranks)
            if rank in ranks:
                mine.setdefault(unit if rank == ranks[0] else owner, []).append((group, (unit, owner)))
    return mine


def tied_parameters(model, unit: int, owner: int) -> list[nn.Parameter]:
    """The Parameters units ``unit`` and ``owner`` share (a GPT head's embedding matrix)."""
    theirs = {id(p) for p in model.units[owner].module.parameters()}
    return [p for p in model.units[unit].module.parameters() if id(p) in theirs]


def main(argv: list[str] | None = None) -> int:
    config = json.loads((HERE / "stages.json").read_text())
    args = parse_args(config, argv)
    stages, replicas = len(config["stages"]), config["replicas"]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != stages * replicas:
        raise SystemExit(f"error: {HERE / 'stages.json'}: ranks: the plan needs {stages * replicas} processes "
                         f"({stages} stages x {replicas} replicas), got {world}: run torchrun --nproc-per-node="
                         f"{stages * replicas}")
    # NCCL takes one GPU per process: with fewer GPUs than local processes, train on the CPUs (gloo)
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=args.timeout))
    mesh = init_device_mesh(device.type, (stages, replicas), mesh_dim_names=("pp", "dp"))
    s, j = mesh.get_coordinate()
    spec = config["stages"][s]
    model = build_run_model(args.model, seq_len=config["seq_len"], seed=args.seed)
    names = [unit.name for unit in model.units]
    if names[spec["layers"][0]:spec["layers"][1]] != spec["units"]:
        raise SystemExit(f"error: {HERE / 'stages.json'}: stages[{s}].units: model {args.model!r} has units "
                         f"{names}, the plan's stage {s} holds {spec['units']}")
    module = StageModule(model, *spec["layers"], spec["inputs"], spec["outputs"]).to(device)
    runner = checkpoint_wrapper(module) if spec["recompute"] else module
    stage = PipelineStage(runner, s, stages, device, group=mesh["pp"].get_group())
    schedule = make_schedule(config, stage, model.loss)
    optimizer = torch.optim.SGD(module.parameters(), lr=args.lr)
    ties = tie_groups(config, replicas)
    rows = replica_rows(config["microbatches"], config["microbatch_size"], replicas, j)
    for step in range(args.steps):
        x, y = step_batch(model, config["global_batch"], args.seed, step)
        x, y = x[rows].to(device), y[rows].to(device)
        losses: list[torch.Tensor] = []
        if s == 0 and s == stages - 1:
            schedule.step(x, target=y, losses=losses)
        elif s == 0:
            schedule.step(x)
        elif s == stages - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        sync_gradients(module, mesh, replicas, model, ties)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        report_loss(step, losses, replicas)
    dist.destroy_process_group()
    return 0


def sync_gradients(module: nn.Module, mesh, replicas: int, model, ties: dict[int, list]) -> None:
    """Average over the stage's replicas, then sum the tied copies' gradients across stages."""
    if replicas > 1:
        group = mesh["dp"].get_group()
        for p in module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)
                p.grad /= replicas
    for groups in ties.values():
        for group, (unit, owner) in groups:
            for p in tied_parameters(model, unit, owner):
                dist.all_reduce(p.grad, group=group)


def report_loss(step: int, losses: list[torch.Tensor], replicas: int) -> None:
    """The global batch's mean loss on rank 0: the last stage's ranks hold it, each for its replica."""
    mine = torch.stack(losses).mean().double() / replicas if losses else torch.zeros((), dtype=torch.float64)
    dist.all_reduce(mine)
    if dist.get_rank() == 0:
        print(f"step {step} loss {mine.item()!r}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
