"""The worker entry point: one process per device of the plan.

Reads the ``torchrun`` environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``); rank ``i`` runs the ``i``-th device of the plan
(devices numbered in the order the stages first name them: stage by stage, in each
stage's order) and on it every stage of its device group, by the group's program.
The local launcher (:mod:`pipeplan.runtime.launch`) sets the same variables, so
across machines::

    torchrun --nnodes=2 --nproc-per-node=2 --node-rank=N \\
        --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        -m pipeplan.runtime.worker GRAPH CLUSTER PLAN --model gpt-tiny --verify --json

Rank 0 gathers every rank's timings (and parameters with ``--verify``), checks them
against single-process training and writes the report.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import socket
import signal
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from pipeplan.models.errors import InputError
from pipeplan.models.jsonio import atomic_write_text, dumps
from pipeplan.runtime.checks import RunInputs, check_emulation, check_world, load_inputs
from pipeplan.runtime.comm import Channels
from pipeplan.runtime.emulate import make_emulator
from pipeplan.runtime.executor import Executor, RankStage
from pipeplan.runtime.gradsync import GradSync, group_members, links, make_groups, tied_holders
from pipeplan.runtime.heartbeat import Heartbeat
from pipeplan.runtime.launch import STARTUP_TIMEOUT
from pipeplan.runtime.memory import rss_peak_bytes
from pipeplan.runtime.options import (DEFAULT_LR, DEFAULT_TIMEOUT, DEFAULT_WARMUP, MAX_SEED,  # noqa: F401
                                      RunConfig, add_arguments, add_launch_options, check_spin)
from pipeplan.runtime.routing import pieces, rank_of
from pipeplan.runtime.sharding import (RankOptimizer, forget_meshes, is_sharded, local, make_replica, parallelize_units,
                                       replica_ranks, whole)
from pipeplan.runtime.stage import Stage, cut_layout, unit_shapes
from pipeplan.runtime.transport import DistTransport, TcpTransport, Transport, reachable_host
from pipeplan.runtime.training_data import step_batch
from pipeplan.runtime.verify import max_difference, reference_parameters

FAULT_ENV = "PIPEPLAN_FAULT"
"""Test hook: ``RANK:STEP:KIND`` makes that rank fail at that step: ``kill`` (SIGKILL), ``hang``
(working), ``wait-forever`` (inside a wait), ``freeze`` (SIGSTOP inside a wait) or ``raise``."""


def main(argv: list[str] | None = None) -> int:
    """Run this rank; on rank 0 also verify and report.  Returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m pipeplan.runtime.worker", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        return run_rank(RunConfig.from_args(args), rank, int(os.environ.get("WORLD_SIZE", "1")))
    except InputError as exc:
        print(exc.line(), file=sys.stderr)
        return 2
    except BaseException as exc:  # the last line names the rank and the cause for the launcher
        traceback.print_exc()
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # Leave at once: a graceful teardown could let a peer's knock-on error exit first.
        os._exit(1)


def run_rank(config: RunConfig, rank: int, world: int) -> int:
    """Load and check the run's inputs, then train this rank (:func:`train_rank`); the exit status."""
    torch.set_num_threads(1)  # one busy core per rank
    beat = Heartbeat(rank, world)
    beat(-1, 0)
    config = config.checked()  # refuse bad options before any connection is made
    inputs = load_inputs(config.graph, config.cluster, config.plan, config.model, config.verify, config.seed)
    if config.emulate:  # pipeplan run checked already; under torchrun this is the first check
        check_emulation(inputs.prediction, config.timeout, inputs.plan_file, inputs.plan)
    return train_rank(config, inputs, rank, world, beat)


def train_rank(config: RunConfig, inputs: RunInputs, rank: int, world: int, beat: Heartbeat) -> int:
    """Connect, train this rank's group by its program, gather and report; the exit status."""
    plan = inputs.plan
    check_world(plan, world, inputs.plan_file)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % torch.cuda.device_count()}") \
        if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # The rendezvous waits for the slowest rank to start (seconds on a busy machine): the set-up
    # allowance of the launcher, not --timeout, which is for training (see runtime.launch).
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=max(config.timeout, STARTUP_TIMEOUT)))
    tcp = _uses_tcp(config.transport, device)
    control = dist.new_group(backend="gloo")  # barriers and gathering, on any backend
    members = group_members(plan, inputs.model)
    # [Note: idle gloo groups]  Every gloo group runs an I/O thread that wakes 100 times a
    # second, and on a core busy with a rank's compute (or its polling) each wake-up is a
    # preemption: measured at about 230 per second per rank with a group per key.  With
    # the tcp transport only the gradient groups of three or more ranks need gloo (for
    # ``dist.all_reduce``), so only they are made.
    # A replica's ranks ("tp") and a ZeRO ring broadcast through torch.distributed on any transport.
    groups = make_groups({key: ranks for key, ranks in members.items()
                          if not tcp or (not isinstance(key[0], int) and
                                         (len(ranks) > 2 or key[0] == "tp" or _zero_ring(plan, key)))})
    starter = None if tcp else dist.new_group(backend="gloo")  # see _start_together
    transport = _transport(config, rank, plan, members, control, beat) if tcp else \
        DistTransport({**groups, START: starter})
    executor, need_data = _build(config, inputs, rank, device, beat, members, groups, transport)
    beat.wait(True)
    dist.barrier(group=control)  # training starts together: its waits (--timeout) never wait on a set-up
    beat.wait(False)
    _pin_main_thread(device)
    records = _train(config, inputs, executor, need_data, rank, device, transport, beat)
    status = _finish(config, inputs, executor, records, rank, world, control, beat)
    if isinstance(transport, TcpTransport):
        transport.close()
    dist.destroy_process_group()
    forget_meshes()
    return status


def _zero_ring(plan, key: tuple) -> bool:
    """Whether ``key`` is the data-parallel ring of a device group holding a stage with ``zero`` 1 or 2."""
    return key[0] == "group" and any(plan.stage_zero(s) for s, g in enumerate(plan.stage_groups) if g == key[1])


def _uses_tcp(transport: str, device: torch.device) -> bool:
    """Whether ``--transport`` means the tcp transport on ``device``."""
    if transport == "tcp" and device.type != "cpu":
        raise InputError("-", "--transport", "tcp moves CPU tensors only; use --transport dist on GPUs")
    return transport == "tcp" or (transport == "auto" and device.type == "cpu")


def _transport(config: RunConfig, rank: int, plan, members: dict, control, beat: Heartbeat) -> TcpTransport:
    """The tcp transport of this rank; see :mod:`pipeplan.runtime.transport`."""
    world = dist.get_world_size()
    start = [(START, a, b) for a in range(world) for b in range(a + 1, world)]

    def gather(obj):
        out: list = [None] * world
        dist.all_gather_object(out, obj, group=control)
        return out

    # Twice --timeout: a rank waiting on a hung peer must not fail before the launcher,
    # which presumes a rank hung after --timeout without progress, has named that peer.
    return TcpTransport(rank, links(members, plan) + start, gather, host=reachable_host(),
                        timeout=2 * config.timeout, spin=_spin_seconds(config.spin), alive=beat.alive)


def _spin_seconds(spin: str) -> float:
    """``--spin``: seconds a waiting rank polls before it sleeps.

    ``auto``: 5 ms when every local rank has a core of its own, else 0 (a polling
    rank would take the core of one that computes).  Why poll at all: on the machine
    this project is measured on, an op that follows a sleep runs up to 1.5-3x slower
    than one that follows a busy wait (``experiments/idle_penalty.py``), and a
    polling rank sees its data without a wake-up.
    """
    seconds = check_spin(spin)
    if seconds is not None:
        return seconds
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 0.005 if local <= cores else 0.0


START = ("start",)
"""The key of the start-of-iteration tokens (every pair of ranks)."""


def _build(config: RunConfig, inputs: RunInputs, rank: int, device: torch.device, beat: Heartbeat, members: dict,
           groups: dict, transport: Transport) -> tuple[Executor, bool]:
    """This rank's executor over its group's stages, and whether it needs the batch (model input or targets)."""
    plan = inputs.plan
    group, _ = rank_of(plan)[rank]
    mine = [s for s, g in enumerate(plan.stage_groups) if g == group]
    model = inputs.model  # every rank builds it with the same seed: the same weights everywhere
    shapes = unit_shapes(model)
    replica, ring = _replica(plan, mine[0], group, rank, groups, device)
    leader = rank if replica is None else replica.leader
    # every group's program, and each stage's actions in its group's order (what message routing needs)
    programs, stage_actions = plan.actions(inputs.plan_file), plan.stage_actions()
    mailbox: dict = {}  # the hand-overs between this rank's own stages
    emulator = None
    last = len(plan.stages) - 1
    stages = {s: _stage(inputs, s, shapes, device, replica) for s in mine}
    params = list({id(p): p for stage, _ in stages.values() for p in stage.parameters()}.values())
    if config.emulate:
        param_bytes = sum(p.numel() * p.element_size() for p in params)
        emulator = make_emulator(plan, inputs.cluster, group, rank_of(plan)[rank][1], param_bytes)
    prefix = len(mine) > 1
    on_rank = {s: RankStage(stage, Channels(rank, s, plan, stage_actions, layouts, transport, device, emulator, mailbox,
                                            replica),
                            {p.microbatch: p for p in pieces(plan, s) if p.rank == leader},
                            f"{s}:" if prefix else "")
               for s, (stage, layouts) in stages.items()}
    optimizer, owners, state_bytes = _optimizer(plan, model, {s: st for s, (st, _) in stages.items()}, params,
                                                config.lr, groups.get(ring), members.get(ring, []))
    sync = GradSync.for_group(group, params, model, plan, members, groups, transport, ring,
                              1 if replica is None else replica.size, owners)
    program = [a for a in programs[group] if a.stage in on_rank]
    executor = Executor(on_rank, program, plan.global_batch, sync, config.lr, emulator, beat, seed=config.seed,
                        optimizer=optimizer, reports_loss=leader == rank, state_bytes=state_bytes)
    need_data = any(s in (0, last) or any(-1 in u.inputs for u in model.units[slice(*plan.stages[s].layers)])
                    for s in mine)
    return executor, need_data


def _replica(plan, stage: int, group: int, rank: int, groups: dict, device: torch.device) -> tuple:
    """This rank's :class:`~pipeplan.runtime.sharding.Replica` (``None`` at degree 1), its data-parallel ring's key."""
    replicas = replica_ranks(plan, stage)
    if len(replicas[0]) == 1:
        return None, ("group", group)
    j = next(j for j, ranks in enumerate(replicas) if rank in ranks)
    return make_replica(groups[("tp", group, j)], replicas[j], device), ("group", group, replicas[j].index(rank))


def _optimizer(plan, model, stages: dict[int, Stage], params: list, lr: float, ring_group, ring: list[int]) -> tuple:
    """The rank's :class:`~pipeplan.runtime.sharding.RankOptimizer`, the ZeRO-2 gradients' owners and its state bytes.

    The parameters of the stages with ``zero`` 1 or 2 are sharded over the rank's
    data-parallel ring when it has two ranks or more; tied ones never (see [Note: ZeRO]).
    """
    tied = tied_holders(model, plan)
    level = {id(p): plan.stage_zero(s) for s, stage in stages.items() for p in stage.parameters()}
    sharded = [p for p in params if level[id(p)] and id(p) not in tied] if len(ring) > 1 else []
    optimizer = RankOptimizer(params, lr, sharded, ring_group)
    me = dist.get_rank()
    owners = {pid: owner for pid, owner in optimizer.owners.items() if level[pid] == 2}
    state = sum(local(p).numel() * p.element_size() * (1 + (owners.get(id(p), me) == me)) for p in params)
    return optimizer, owners, state


def _stage(inputs: RunInputs, s: int, shapes: dict, device: torch.device, replica=None) -> tuple[Stage, tuple]:
    """Stage ``s`` on ``device`` (its units split over ``replica`` when given), and the layouts of its cuts."""
    model, plan = inputs.model, inputs.plan
    lo, hi = plan.stages[s].layers
    for unit in model.units[lo:hi]:
        unit.module.to(device)
    if replica is not None:
        parallelize_units([unit.module for unit in model.units[lo:hi]], replica)
    layouts = (cut_layout(model, lo - 1, shapes) if s > 0 else None,
               cut_layout(model, hi - 1, shapes) if s < len(plan.stages) - 1 else None)
    return Stage(model, lo, hi, plan.stages[s].recompute, *layouts), layouts


def _pin_main_thread(device: torch.device) -> None:
    """With ``PIPEPLAN_PIN=1``: pin this rank's main thread to a core of its own.

    [Note: core pinning]  A rank's main thread does all its compute and blocks for
    messages; with ``--transport dist``, gloo's I/O threads hand the messages over
    (the tcp transport has no such threads, see [Note: tcp transport]).  Left to the scheduler, a
    send from rank ``a`` can wake rank ``b``'s threads on ``a``'s core (wake-affine
    placement), where ``b``'s compute then runs while ``a``'s main thread waits in
    the run queue, until the load balancer moves one of them: on a loaded 2-core box
    a gloo ``isend`` was seen to take 1.3 ms instead of 40 us.  One core per main
    thread rules that out (gloo's threads, created with the process groups before
    this call, stay free to run anywhere).  It is opt-in: when other work shares the
    machine, a pinned rank cannot leave a core that another process keeps busy,
    which measured worse than leaving placement to the scheduler; on an idle machine
    the two measured alike.  Skipped when there are more local ranks than usable
    cores, and on GPUs.
    """
    if device.type != "cpu" or os.environ.get("PIPEPLAN_PIN", "0") != "1" or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    if 0 < local_world <= len(cores):
        try:
            os.sched_setaffinity(0, {cores[local_rank]})  # pid 0: the calling thread only
        except OSError:
            pass


def _start_together(transport: Transport, rank: int, world: int) -> None:
    """Return on every rank at (nearly) the same moment: the start of an iteration.

    Each rank sends a token to every other one and waits for theirs, so the last rank
    to arrive leaves at once (the others' tokens are there) and the others leave one
    message latency later.  ``dist.barrier`` on gloo was measured to release one of two
    ranks about 2 ms after the other in one iteration out of ten or so, which then
    counted as pipeline time.  One token per pair and iteration: fine for the few
    ranks of a pipeline.
    """
    peers = [r for r in range(world) if r != rank]
    tokens = [torch.zeros(1) for _ in peers]
    recvs = [transport.irecv(t, peer, START) for t, peer in zip(tokens, peers)]
    mine = torch.zeros(1)
    sends = [transport.isend(mine, peer, START) for peer in peers]
    for work in recvs + sends:
        work.wait()


def _train(config: RunConfig, inputs: RunInputs, executor: Executor, need_data: bool, rank: int, device: torch.device,
           transport: Transport, beat: Heartbeat) -> list[dict]:
    model, batch = executor.model, inputs.plan.global_batch
    world = dist.get_world_size()
    fault = _fault(rank)
    records = []
    # A garbage collection pass inside an iteration stalls this rank for milliseconds
    # and every rank waiting on it: collect between iterations only.
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        for step in range(config.steps):
            if fault is not None and fault[0] == step:
                _inject(fault[1], beat, step)
            if need_data:
                x, y = step_batch(model, batch, config.seed, step)
                x, y = x.to(device), y.to(device)
            else:
                x = y = torch.empty(0)
            executor.memory.enabled = step < max(config.warmup, 1)  # see runtime.memory
            events, end = executor.train_step(step, x, y, start=lambda: _start_together(transport, rank, world))
            records.append({"t0": executor.started, "end": end,
                            "events": [[e.kind, e.label, e.start, e.end] for e in events],
                            "receive_cpu": dict(executor.receive_cpu), "loss": executor.loss})
            gc.collect(1)
    finally:
        gc.enable()
    return records


def _finish(config: RunConfig, inputs: RunInputs, executor: Executor, records: list[dict], rank: int, world: int,
            control, beat: Heartbeat) -> int:
    """Gather everything on rank 0, verify, and write or print the report; the exit status."""
    plan = inputs.plan
    group, replica = rank_of(plan)[rank]
    stages = [s for s, g in enumerate(plan.stage_groups) if g == group]
    # "stage": the group's first stage (the stage itself under version 1)
    mine = {"rank": rank, "group": group, "stages": stages, "stage": stages[0], "replica": replica,
            "host": socket.gethostname(), "device": plan.groups[group][replica], "steps": records,
            "peak_memory": executor.memory.peak_bytes, "peak_memory_kind": executor.memory.kind,
            "rss_peak": rss_peak_bytes(),
            # what tensor parallelism and ZeRO did here: parameters held as shards, and those this rank steps
            "sharded_parameters": sum(is_sharded(p) for p in executor.parameters()),
            # the training state the rank keeps (spec 8.4's state with SGD: weights and the gradients it keeps)
            "param_bytes": sum(local(p).numel() * p.element_size() for p in executor.parameters()),
            "state_bytes": executor.memory.base,
            "zero_stepped": executor.optimizer.stepped_here()}
    # a tensor-parallel parameter is gathered whole (a collective of its replica, in one order on its ranks)
    params = {name: whole(p) for name, p in executor.named_parameters().items()} if config.verify else {}
    gathered: list = [None] * world if rank == 0 else None  # type: ignore[assignment]
    beat(config.steps, 0, waiting=True)
    dist.gather_object((mine, params), gathered, dst=0, group=control)
    beat(config.steps, 0)
    if rank != 0:
        return 0
    result = {"model": inputs.model_name, "dtype": str(inputs.dtype).removeprefix("torch."),
              "steps": config.steps, "warmup": config.warmup, "emulate": config.emulate,
              "transport": "tcp" if _uses_tcp(config.transport, executor.memory.device) else "dist",
              "ranks": [item[0] for item in gathered]}
    if config.verify:
        notes: list[str] = []
        reference = reference_parameters(inputs.request, steps=config.steps, global_batch=plan.global_batch,
                                         lr=config.lr, seed=config.seed, dtype=inputs.dtype, seq_len=inputs.seq_len,
                                         plan=plan, device=executor.memory.device,
                                         beat=lambda step: beat(-2, step), notes=notes)
        if notes:
            result["verify_notes"] = notes
        diff, where = max_difference(((item[0]["rank"], item[1]) for item in gathered), reference)
        # JSON has no inf: a non-finite difference (NaN or inf in some parameter) is reported as null
        result.update(max_param_diff=diff if math.isfinite(diff) else None, max_param_diff_at=where)
    if config.result:
        atomic_write_text(config.result, dumps(result))
        return 0
    from pipeplan.runtime.report import present  # under torchrun: report from here

    return present(config, inputs, result)


def _fault(rank: int) -> tuple[int, str] | None:
    spec = os.environ.get(FAULT_ENV, "")
    parts = spec.split(":")
    if len(parts) == 3 and parts[0] == str(rank):
        return int(parts[1]), parts[2]
    return None


def _inject(kind: str, beat: Heartbeat, step: int) -> None:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        time.sleep(10 ** 6)
    if kind in ("freeze", "wait-forever"):
        # Stop *inside a wait*, after the peers began waiting for this rank: the
        # launcher must still name this rank, not one of them.
        beat(step, 0)
        time.sleep(0.5)
        beat.wait(True)
        if kind == "freeze":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(10 ** 6)
    raise RuntimeError("injected fault")


if __name__ == "__main__":
    raise SystemExit(main())
