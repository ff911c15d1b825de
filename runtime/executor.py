"""Run one rank's program: the plan's ``F`` / ``B`` / ``I`` / ``W`` actions on real tensors.

A rank is one device of a group and serves its replica of every stage the group holds.
Per iteration it posts its receives, runs its group's program in order (each action on
the rank's own piece of the microbatch, see :mod:`pipeplan.runtime.routing`), waits for
its sends, sums gradients over its groups after the last action, and takes an SGD step.
Every piece of work is timed with ``time.perf_counter`` into an :class:`Event`.

[Note: split backward]  ``I`` and ``W`` are two autograd calls, as torch's pipelining
stages make them (``torch.distributed.pipelining._backward``): ``I`` computes the
gradients of the stage's inputs only (``stage_backward_input``: ``autograd.grad`` with
respect to the inputs, the graph retained, the nodes between inputs and weights
remembered), sends them on at once, and ``W`` computes the weights' gradients from
those nodes later (``stage_backward_weight``).  On a stage whose inputs need no
gradient (the first one), ``I`` has nothing to compute and ``W`` runs the whole
backward, as torch does.  Importing torch's pipelining package takes a second, so
only a rank whose program splits a backward imports it (:func:`split_backward`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from pipeplan.runtime.comm import Channels
from pipeplan.runtime.emulate import Emulator
from pipeplan.runtime.gradsync import GradSync
from pipeplan.runtime.heartbeat import Heartbeat
from pipeplan.runtime.memory import MemoryMeter
from pipeplan.runtime.pieces import piece_seed
from pipeplan.runtime.routing import Piece
from pipeplan.runtime.sharding import RankOptimizer
from pipeplan.runtime.stage import Stage
from pipeplan.solver.schedules.schedule import FORWARD, Action

EVENT_KINDS = ("forward", "backward", "recompute", "send", "receive", "allreduce", "idle")
"""Kinds of :class:`Event` (``idle`` is derived from the gaps when reporting)."""


@dataclass(frozen=True)
class Event:
    """One timed piece of work on a rank."""

    kind: str
    """One of :data:`EVENT_KINDS`."""
    label: str
    """``F3``, ``B3``, ``I3``, ``W3``, ``R3`` (recompute), ``recv A3`` ... ; microbatch of the stage.

    On a rank holding several stages the stage comes first: ``2:F3``, ``2:recv A3``."""
    start: float
    """Seconds from the rank's iteration start."""
    end: float
    """Seconds from the rank's iteration start."""


@dataclass
class Stash:
    """What a forward keeps for its backward."""

    inputs: dict[int, torch.Tensor]
    """The stage inputs (leaves whose ``.grad`` is sent back)."""
    done: dict[int, torch.Tensor] | None
    """Every tensor of the forward; ``None`` when recomputing."""
    loss: torch.Tensor | None
    """The piece's scaled loss on the last stage (if not recomputing)."""
    grads: dict[int, torch.Tensor] | None = None
    """The output gradients an ``I`` received, kept for a ``W`` that runs the whole backward."""
    param_groups: list | None = None
    """What ``stage_backward_input`` kept for ``stage_backward_weight`` (see [Note: split backward])."""


@dataclass
class RankStage:
    """One stage as one rank runs it."""

    stage: Stage
    """Its units."""
    channels: Channels
    """Its messages to and from the neighbouring stages."""
    pieces: dict[int, Piece]
    """The rank's piece of each of the stage's microbatches."""
    prefix: str = ""
    """Put before its event labels (``"2:"`` on a rank holding several stages)."""
    params: list[torch.nn.Parameter] = field(init=False)
    """Its unique parameters."""

    def __post_init__(self) -> None:
        self.params = self.stage.parameters()


class Executor:
    """One rank's training loop over its group's program.

    Parameters
    ----------
    stages : dict of int to RankStage
        The rank's stages by index.
    program : list of Action
        The group's program (only actions of ``stages``).
    global_batch : int
        For the loss share of each piece.
    sync : GradSync
        The gradient all-reduces after the last action.
    lr : float
        SGD learning rate.
    emulator : Emulator, optional
        Stretches compute to the device's speed.
    beat : Heartbeat, optional
        Liveness signal for the launcher, given before every action and around waits.
    seed : int
        The run's seed: with the step and the piece, it seeds each forward's dropout masks
        (:func:`pipeplan.runtime.pieces.piece_seed`).
    optimizer : RankOptimizer, optional
        Steps the parameters (default: SGD over all of them, nothing sharded).
    reports_loss : bool
        Whether :attr:`loss` counts this rank's pieces (``False`` on the ranks of a
        tensor-parallel replica other than its leader, which compute the same loss).
    """

    def __init__(self, stages: dict[int, RankStage], program: Sequence[Action], global_batch: int,
                 sync: GradSync, lr: float, emulator: Emulator | None = None,
                 beat: Heartbeat | None = None, seed: int = 0, optimizer: RankOptimizer | None = None,
                 reports_loss: bool = True, state_bytes: int | None = None) -> None:
        self.stages, self.program, self.seed = stages, list(program), seed
        self.global_batch, self.sync = global_batch, sync
        self._split = split_backward() if any(a.kind in ("I", "W") for a in self.program) else None
        self.emulator = emulator
        self.beat = beat or Heartbeat(0, 1)
        params = self.parameters()
        self.optimizer = optimizer if optimizer is not None else RankOptimizer(params, lr)
        self.reports_loss = reports_loss
        self.memory = MemoryMeter(params, next(iter(params)).device if params else torch.device("cpu"), state_bytes)
        self._events: list[Event] = []
        self.receive_cpu: dict[str, float] = {}
        """``"recv A3" -> seconds`` of the last iteration's receives, waits left out (tcp transport only)."""
        self._t0 = 0.0
        self._losses: list[torch.Tensor] = []
        self.loss: float | None = None
        """The last iteration's loss over this rank's pieces (the last stage only), each scaled by its share."""

    @property
    def model(self):
        """The model the stages are cut from."""
        return next(iter(self.stages.values())).stage.model

    @property
    def holds_last(self) -> bool:
        """Whether the rank runs the last stage (it computes the loss)."""
        return any(on.stage.is_last for on in self.stages.values())

    def parameters(self) -> list[torch.nn.Parameter]:
        """Unique parameters of all the rank's stages (a Parameter tied between two of them once)."""
        return list({id(p): p for on in self.stages.values() for p in on.params}.values())

    def named_parameters(self) -> dict[str, torch.nn.Parameter]:
        """``"unit.param" -> Parameter`` over all the rank's stages."""
        return {name: p for on in self.stages.values() for name, p in on.stage.named_parameters().items()}

    @property
    def started(self) -> float:
        """``time.perf_counter()`` at the start of the last iteration."""
        return self._t0

    # ----------------------------------------------------------------- one iteration
    def train_step(self, step: int, inputs: torch.Tensor, targets: torch.Tensor,
                   start: Callable[[], None] = lambda: None) -> tuple[list[Event], float]:
        """One iteration on the global batch ``(inputs, targets)``.

        ``start`` runs after the receives are posted and before the clock starts (the
        caller's start line: every rank leaves it together).  Returns the events and the time the gradients were
        synchronised (the iteration's end in the spec's sense; the optimizer step
        after it is not timed).
        """
        for on in self.stages.values():
            on.channels.post_receives()
        self.sync.post()
        if self.emulator is not None:
            self.emulator.new_iteration()
        self.beat(step, 0, waiting=True)
        start()
        self.beat(step, 0)
        self._events, self.receive_cpu, self._losses, self._t0 = [], {}, [], time.perf_counter()
        stash: dict[tuple[int, int], Stash] = {}
        for position, (s, kind, k) in enumerate(self.program):
            on = self.stages[s]
            piece = on.pieces[k]
            if piece.size == 0:  # see [Note: replica remainders] in runtime.routing
                continue
            self.beat(step, position)
            seed = piece_seed(self.seed, step, piece.stage, piece.microbatch, piece.replica) \
                if on.stage.has_dropout else None  # a hash per action only where masks are drawn
            if kind == FORWARD:
                stash[(s, k)] = self._forward(on, k, piece, seed, inputs, targets)
            elif kind == "B":
                self._backward(on, k, piece, seed, stash.pop((s, k)), targets)
            elif kind == "I":
                self._backward_input(on, k, piece, seed, stash[(s, k)], targets)
            else:
                self._backward_weight(on, k, piece, stash.pop((s, k)))
        self.beat(step, len(self.program))
        with self._timed("send", "wait sends", waiting=True):
            for on in self.stages.values():
                on.channels.finish()
        if self.sync:
            with self._timed("allreduce", "all-reduce", waiting=True) as began:
                self.sync.all_reduce()
                if self.emulator is not None:
                    self.emulator.pad_allreduce(began[0])
        end = time.perf_counter() - self._t0
        self.loss = float(sum(loss.item() for loss in self._losses)) if self.holds_last and self.reports_loss \
            else None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self._events, end

    # ----------------------------------------------------------------- actions
    def _forward(self, on: RankStage, k: int, piece: Piece, seed: int | None, inputs: torch.Tensor,
                 targets: torch.Tensor) -> Stash:
        stage, key = on.stage, (piece.stage, k)
        x: dict[int, torch.Tensor] = {}
        if stage.input_layout is not None:
            x = self._receive(on, f"recv A{k}", lambda: on.channels.receive_activations(k),
                              lambda buffer: stage.input_layout.unpack(buffer, requires_grad=True))  # type: ignore
        x[-1] = inputs[piece.start:piece.stop]
        with self._timed("forward", f"{on.prefix}F{k}", stretch=True):
            if stage.recompute:
                self.memory.hold(key, sum(t.numel() * t.element_size() for t in x.values()))
                with torch.no_grad():
                    done = stage.run(x, seed)
                kept = Stash(x, None, None)
            else:
                with self.memory.saving(key):
                    done = stage.run(x, seed)
                    loss = stage.loss(done, targets[piece.start:piece.stop], self._share(piece)) \
                        if stage.is_last else None
                kept = Stash(x, done, loss)
        if stage.output_layout is not None:
            with self._timed("send", f"{on.prefix}send A{k}"):
                on.channels.send_activations(k, stage.output_layout.pack(stage.outputs(done)), piece.start)
        return kept

    def _backward(self, on: RankStage, k: int, piece: Piece, seed: int | None, kept: Stash,
                  targets: torch.Tensor) -> None:
        grads = self._prepare_backward(on, k, piece, seed, kept, targets)
        with self._timed("backward", f"{on.prefix}B{k}", stretch=True):
            on.stage.backward(kept.done, grads, kept.loss)  # type: ignore[arg-type]
        self._release(piece.stage, k)
        self._send_input_gradients(on, k, piece, kept)

    def _backward_input(self, on: RankStage, k: int, piece: Piece, seed: int | None, kept: Stash,
                        targets: torch.Tensor) -> None:
        """``I``: the input gradients only, sent on at once; see [Note: split backward]."""
        stage = on.stage
        grads = self._prepare_backward(on, k, piece, seed, kept, targets)
        with self._timed("backward", f"{on.prefix}I{k}", stretch=True):
            if stage.input_layout is None:
                kept.grads = grads  # nothing to compute here: W runs the whole backward
            else:
                assert kept.done is not None
                if kept.loss is not None:
                    outputs, output_grads = [kept.loss], None
                else:
                    assert grads is not None and stage.output_layout is not None
                    units = stage.output_layout.units
                    outputs, output_grads = [kept.done[u] for u in units], [grads[u] for u in units]
                inputs = [kept.inputs[u] for u in stage.input_layout.units]
                _, kept.param_groups = self._split[0](outputs, output_grads, inputs, iter(on.params))  # type: ignore
        self._send_input_gradients(on, k, piece, kept)

    def _backward_weight(self, on: RankStage, k: int, piece: Piece, kept: Stash) -> None:
        """``W``: the weight gradients from what ``I`` kept; see [Note: split backward]."""
        with self._timed("backward", f"{on.prefix}W{k}", stretch=True):
            if kept.param_groups is None:
                on.stage.backward(kept.done, kept.grads, kept.loss)  # type: ignore[arg-type]
            else:
                self._split[1](iter(on.params), kept.param_groups)  # type: ignore[index]
        self._release(piece.stage, k)

    def _prepare_backward(self, on: RankStage, k: int, piece: Piece, seed: int | None, kept: Stash,
                          targets: torch.Tensor) -> dict[int, torch.Tensor] | None:
        """Receive the output gradients and, on a recomputing stage, run the forward again."""
        stage = on.stage
        grads = None
        if stage.output_layout is not None:
            grads = self._receive(on, f"recv G{k}", lambda: on.channels.receive_gradients(k),
                                  stage.output_layout.unpack)
        if kept.done is None:  # recompute: re-run the forward with autograd on
            with self._timed("recompute", f"{on.prefix}R{k}", stretch=True), \
                    self.memory.saving(("R", piece.stage, k)):
                kept.done = stage.rerun(kept.inputs, seed)
                if stage.is_last:
                    kept.loss = stage.loss(kept.done, targets[piece.start:piece.stop], self._share(piece))
        if kept.loss is not None:
            self._losses.append(kept.loss.detach())
        return grads

    def _send_input_gradients(self, on: RankStage, k: int, piece: Piece, kept: Stash) -> None:
        layout = on.stage.input_layout
        if layout is not None:
            with self._timed("send", f"{on.prefix}send G{k}"):
                grad_in = {u: _grad_or_zeros(kept.inputs[u]) for u in layout.units}
                on.channels.send_gradients(k, layout.pack(grad_in), piece.start)

    def _release(self, stage: int, k: int) -> None:
        self.memory.release((stage, k))
        self.memory.release(("R", stage, k))

    def _receive(self, on: RankStage, label: str, wait: Callable[[], torch.Tensor], unpack: Callable):
        """Wait for a receive, then unpack it; notes its CPU seconds (waits left out) under ``label``."""
        label = on.prefix + label
        with self._timed("receive", label, waiting=True):
            buffer = wait()
            began = time.perf_counter()
            out = unpack(buffer)
            if on.channels.receive_cpu is not None:
                self.receive_cpu[label] = on.channels.receive_cpu + time.perf_counter() - began
        return out

    def _share(self, piece: Piece) -> float:
        return piece.size / self.global_batch

    # ----------------------------------------------------------------- timing
    def _timed(self, kind: str, label: str, stretch: bool = False, waiting: bool = False) -> "_Span":
        return _Span(self, kind, label, stretch, waiting)


class _Span:
    """Times a block into an :class:`Event`.

    ``stretch`` applies the emulated device speed; ``waiting`` tells the heartbeat the
    rank is blocked on peers meanwhile.
    """

    def __init__(self, executor: Executor, kind: str, label: str, stretch: bool, waiting: bool) -> None:
        self.executor, self.kind, self.label = executor, kind, label
        self.stretch, self.waiting = stretch, waiting
        self.began = [0.0]

    def __enter__(self) -> list[float]:
        if self.waiting:
            self.executor.beat.wait(True)
        self.began[0] = time.perf_counter()
        return self.began

    def __exit__(self, *exc) -> None:
        ex = self.executor
        if self.waiting:
            ex.beat.wait(False)
        if self.stretch and ex.emulator is not None and exc[0] is None:
            ex.emulator.stretch(self.began[0])
        ex._events.append(Event(self.kind, self.label, self.began[0] - ex._t0, time.perf_counter() - ex._t0))


def split_backward() -> tuple[Callable, Callable]:
    """torch's ``stage_backward_input`` and ``stage_backward_weight`` (see [Note: split backward])."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    return stage_backward_input, stage_backward_weight


def _grad_or_zeros(leaf: torch.Tensor) -> torch.Tensor:
    return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
