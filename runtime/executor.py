"""Run one rank's op list: the plan's ``Fk`` / ``Bk`` actions on real tensors.

Per iteration a rank posts its receives, runs its stage's op list in order (each op
on its own piece of the microbatch, see :mod:`pipeplan.runtime.routing`), waits for its sends,
sums gradients over its groups after the last backward, and takes an SGD step.
Every piece of work is timed with ``time.perf_counter`` into an :class:`Event`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from pipeplan.runtime.comm import Channels
from pipeplan.runtime.emulate import Emulator
from pipeplan.runtime.gradsync import GradSync
from pipeplan.runtime.heartbeat import Heartbeat
from pipeplan.runtime.memory import MemoryMeter
from pipeplan.runtime.pieces import piece_seed
from pipeplan.runtime.routing import Piece
from pipeplan.runtime.stage import Stage
from pipeplan.solver.schedule import FORWARD, Op

EVENT_KINDS = ("forward", "backward", "recompute", "send", "receive", "allreduce", "idle")
"""Kinds of :class:`Event` (``idle`` is derived from the gaps when reporting)."""


@dataclass(frozen=True)
class Event:
    """One timed piece of work on a rank."""

    kind: str
    """One of :data:`EVENT_KINDS`."""
    label: str
    """``F3``, ``B3``, ``R3`` (recompute), ``recv A3`` ... ; microbatch of the stage."""
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


class Executor:
    """One rank's training loop over its stage's op list.

    Parameters
    ----------
    stage : Stage
        The rank's units.
    ops : list of Op
        The stage's op list.
    pieces : list of Piece
        The rank's piece of each of the stage's microbatches.
    global_batch : int
        For the loss share of each piece.
    channels : Channels
        Point-to-point transfers.
    sync : GradSync
        The gradient all-reduces after the last op.
    lr : float
        SGD learning rate.
    emulator : Emulator, optional
        Stretches compute to the device's speed.
    beat : Heartbeat, optional
        Liveness signal for the launcher, given before every op and around waits.
    seed : int
        The run's seed: with the step and the piece, it seeds each forward's dropout masks
        (:func:`pipeplan.runtime.pieces.piece_seed`).
    """

    def __init__(self, stage: Stage, ops: list[Op], pieces: list[Piece], global_batch: int,
                 channels: Channels, sync: GradSync, lr: float, emulator: Emulator | None = None,
                 beat: Heartbeat | None = None, seed: int = 0) -> None:
        self.stage, self.ops, self.pieces, self.seed = stage, ops, pieces, seed
        self.global_batch, self.channels, self.sync = global_batch, channels, sync
        self.emulator = emulator
        self.beat = beat or Heartbeat(0, 1)
        params = stage.parameters()
        self.optimizer = torch.optim.SGD(params, lr=lr)
        self.memory = MemoryMeter(params, next(iter(params)).device if params else torch.device("cpu"))
        self._events: list[Event] = []
        self.receive_cpu: dict[str, float] = {}
        """``"recv A3" -> seconds`` of the last iteration's receives, waits left out (tcp transport only)."""
        self._t0 = 0.0
        self._losses: list[torch.Tensor] = []
        self.loss: float | None = None
        """The last iteration's loss over this rank's pieces (the last stage only), each scaled by its share."""

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
        self.channels.post_receives()
        self.sync.post()
        if self.emulator is not None:
            self.emulator.new_iteration()
        self.beat(step, 0, waiting=True)
        start()
        self.beat(step, 0)
        self._events, self.receive_cpu, self._losses, self._t0 = [], {}, [], time.perf_counter()
        stash: dict[int, Stash] = {}
        for position, (kind, k) in enumerate(self.ops):
            piece = self.pieces[k]
            if piece.size == 0:  # see [Note: replica remainders] in runtime.routing
                continue
            self.beat(step, position)
            seed = piece_seed(self.seed, step, piece.stage, piece.microbatch, piece.replica) \
                if self.stage.has_dropout else None  # a hash per op only where masks are drawn
            if kind == FORWARD:
                stash[k] = self._forward(k, piece, seed, inputs, targets)
            else:
                self._backward(k, piece, seed, stash.pop(k), targets)
        self.beat(step, len(self.ops))
        with self._timed("send", "wait sends", waiting=True):
            self.channels.finish()
        if self.sync:
            with self._timed("allreduce", "all-reduce", waiting=True) as began:
                self.sync.all_reduce()
                if self.emulator is not None:
                    self.emulator.pad_allreduce(began[0])
        end = time.perf_counter() - self._t0
        self.loss = float(sum(loss.item() for loss in self._losses)) if self.stage.is_last else None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self._events, end

    # ----------------------------------------------------------------- ops
    def _forward(self, k: int, piece: Piece, seed: int | None, inputs: torch.Tensor, targets: torch.Tensor) -> Stash:
        stage = self.stage
        x: dict[int, torch.Tensor] = {}
        if stage.input_layout is not None:
            with self._timed("receive", f"recv A{k}", waiting=True):
                buffer = self.channels.receive_activations(k)
                began = time.perf_counter()
                x = stage.input_layout.unpack(buffer, requires_grad=True)
                self._note_receive_cpu(f"recv A{k}", time.perf_counter() - began)
        x[-1] = inputs[piece.start:piece.stop]
        with self._timed("forward", f"F{k}", stretch=True):
            if stage.recompute:
                self.memory.hold(k, sum(t.numel() * t.element_size() for t in x.values()))
                with torch.no_grad():
                    done = stage.run(x, seed)
                kept = Stash(x, None, None)
            else:
                with self.memory.saving(k):
                    done = stage.run(x, seed)
                    loss = stage.loss(done, targets[piece.start:piece.stop], self._share(piece)) \
                        if stage.is_last else None
                kept = Stash(x, done, loss)
        if stage.output_layout is not None:
            with self._timed("send", f"send A{k}"):
                self.channels.send_activations(k, stage.output_layout.pack(stage.outputs(done)), piece.start)
        return kept

    def _backward(self, k: int, piece: Piece, seed: int | None, kept: Stash, targets: torch.Tensor) -> None:
        stage = self.stage
        grads = None
        if stage.output_layout is not None:
            with self._timed("receive", f"recv G{k}", waiting=True):
                buffer = self.channels.receive_gradients(k)
                began = time.perf_counter()
                grads = stage.output_layout.unpack(buffer)
                self._note_receive_cpu(f"recv G{k}", time.perf_counter() - began)
        if kept.done is None:  # recompute: re-run the forward with autograd on
            with self._timed("recompute", f"R{k}", stretch=True), self.memory.saving(("R", k)):
                kept.done = stage.rerun(kept.inputs, seed)
                if stage.is_last:
                    kept.loss = stage.loss(kept.done, targets[piece.start:piece.stop], self._share(piece))
        with self._timed("backward", f"B{k}", stretch=True):
            stage.backward(kept.done, grads, kept.loss)
        if kept.loss is not None:
            self._losses.append(kept.loss.detach())
        self.memory.release(k)
        self.memory.release(("R", k))
        if stage.input_layout is not None:
            with self._timed("send", f"send G{k}"):
                layout = stage.input_layout
                grad_in = {u: _grad_or_zeros(kept.inputs[u]) for u in layout.units}
                self.channels.send_gradients(k, layout.pack(grad_in), piece.start)

    def _note_receive_cpu(self, label: str, unpacking: float) -> None:
        if self.channels.receive_cpu is not None:
            self.receive_cpu[label] = self.channels.receive_cpu + unpacking

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


def _grad_or_zeros(leaf: torch.Tensor) -> torch.Tensor:
    return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
