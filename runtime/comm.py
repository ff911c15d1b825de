"""Activations and gradients between the ranks of neighbouring stages.

Every receive of an iteration is posted when the iteration starts, into a buffer
sized from the plan (``samples x features`` of the cut, see :mod:`pipeplan.runtime.routing`),
so a transfer proceeds as soon as its sender posts it, as the spec's timing assumes,
and a rank only blocks when it needs data that has not arrived.  Each cut and
direction has its own process group, and both ends post a cut's messages in the
sender's op order: with NCCL (which matches point-to-point messages in order per
group, ignoring tags) the two directions can then never block each other.

Consecutive stages on one device group exchange nothing over the network: a message
whose two ends are the same rank is handed over inside the process, through the
rank's :class:`Mailbox` (spec section 7.3: available when the producing action ends).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from pipeplan.runtime.emulate import Emulator, sleep_until
from pipeplan.runtime.routing import Message, cut_messages, grad_order
from pipeplan.runtime.sharding import Replica
from pipeplan.runtime.stage import CutLayout
from pipeplan.runtime.transport import Transport, Work
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.schedules.schedule import Action

STAMP_TAG = 1 << 20
"""Added to a message's tag for its emulated-arrival stamp."""


Mailbox = dict
"""``(key, tag) -> rows``: the messages a rank hands over to itself, shared by its stages' :class:`Channels`."""


@dataclass
class Inbound:
    """A posted receive."""

    message: Message
    """What arrives."""
    buffer: torch.Tensor | None
    """``(samples, features)`` it arrives into (``None`` for a hand-over inside the rank)."""
    work: Work | None
    """The pending receive (``None`` for a hand-over inside the rank)."""
    key: tuple = ()
    """The direction's key (finds a hand-over in the mailbox)."""
    stamp: torch.Tensor | None = None
    """Emulated arrival time (``--emulate`` only)."""
    stamp_work: Work | None = None
    """Its pending receive."""


@dataclass
class Direction:
    """One direction across one cut, as seen by this rank."""

    key: tuple
    """The key of the cut's process group for this direction (see ``pipeplan.runtime.gradsync.group_members``)."""
    layout: CutLayout | None
    """Buffer layout of the cut."""
    incoming: list[Message] = field(default_factory=list)
    """Messages this rank receives, in the sender's order."""
    outgoing: list[Message] = field(default_factory=list)
    """Messages this rank sends, in its own op order."""


class Channels:
    """Send and receive the boundary buffers of one rank.

    Parameters
    ----------
    rank : int
        This process's global rank.
    stage : int
        Its stage.
    plan : Plan
    stage_actions : sequence of list of Action
        Every stage's actions in the order its group runs them.
    layouts : (CutLayout or None, CutLayout or None)
        Layout of the cut before and after the stage.
    transport : Transport
        Moves the messages (see :mod:`pipeplan.runtime.transport`).
    device : torch.device
        Where buffers live.
    emulator : Emulator, optional
        Delays transfers to the cluster's links when given.
    mailbox : Mailbox, optional
        The rank's hand-overs to itself, shared by all its stages' channels.
    replica : Replica, optional
        The rank's replica on a tensor-parallel stage: its leader sends and receives for
        all its ranks, and broadcasts what it receives to them (see
        :mod:`pipeplan.runtime.sharding`).
    """

    def __init__(self, rank: int, stage: int, plan: Plan, stage_actions: Sequence[Sequence[Action]],
                 layouts: tuple[CutLayout | None, CutLayout | None], transport: Transport, device: torch.device,
                 emulator: Emulator | None = None, mailbox: Mailbox | None = None,
                 replica: Replica | None = None) -> None:
        self.device, self.emulator, self.transport = device, emulator, transport
        self.replica = replica
        self.leads = replica is None or replica.leader == rank
        """Whether this rank moves the messages (every rank of a stage of degree 1)."""
        # the messages are the leader's; the other ranks of its replica receive them by broadcast
        self.rank = rank if replica is None else replica.leader
        self.mailbox: Mailbox = {} if mailbox is None else mailbox
        groups = plan.stage_groups
        # Emulated links are FIFOs per ordered pair of groups (spec 7.3), named by the peer group.
        self._link = {"fwd": groups[stage + 1] if stage + 1 < len(groups) else None,
                      "bwd": groups[stage - 1] if stage > 0 else None}
        last = len(plan.stages) - 1
        before = cut_messages(plan, stage - 1, stage_actions) if stage > 0 else []
        after = cut_messages(plan, stage, stage_actions) if stage < last else []
        # Activations come in over the cut before the stage and leave over the one after;
        # gradients the other way round, in the order the later stage runs its backwards.
        self.act_in = Direction((stage - 1, "fwd"), layouts[0], [m for m in before if m.dst == self.rank])
        self.act_out = Direction((stage, "fwd"), layouts[1], outgoing=[m for m in after if m.src == self.rank])
        self.grad_in = Direction((stage, "bwd"), layouts[1],
                                 [m for m in grad_order(after, stage_actions) if m.src == self.rank])
        self.grad_out = Direction((stage - 1, "bwd"), layouts[0],
                                  outgoing=[m for m in grad_order(before, stage_actions) if m.dst == self.rank])
        # Each op's outgoing messages, looked up once rather than filtered per op.
        self._act_sends: dict[int, list[Message]] = {}
        for m in self.act_out.outgoing:
            self._act_sends.setdefault(m.src_mb, []).append(m)
        self._grad_sends: dict[int, list[Message]] = {}
        for m in self.grad_out.outgoing:
            self._grad_sends.setdefault(m.dst_mb, []).append(m)
        self._acts: dict[int, list[Inbound]] = {}
        self._grads: dict[int, list[Inbound]] = {}
        self._sends: list[tuple[Work, torch.Tensor]] = []
        self.receive_cpu: float | None = None
        """CPU seconds the last receive took, waits left out, when the transport tells (tcp)."""

    # ----------------------------------------------------------------- receiving
    def post_receives(self) -> None:
        """Post every receive of the coming iteration."""
        self._acts = self._post(self.act_in, peer=lambda m: m.src, key=lambda m: m.dst_mb)
        self._grads = self._post(self.grad_in, peer=lambda m: m.dst, key=lambda m: m.src_mb)

    def _post(self, direction: Direction, peer, key) -> dict[int, list[Inbound]]:
        posted: dict[int, list[Inbound]] = {}
        if not self.leads:  # nothing to post: the leader's buffers arrive by broadcast
            for m in direction.incoming:
                posted.setdefault(key(m), []).append(Inbound(m, None, None, direction.key))
            return posted
        for m in direction.incoming:
            if peer(m) == self.rank:
                posted.setdefault(key(m), []).append(Inbound(m, None, None, direction.key))
                continue
            layout = direction.layout
            assert layout is not None
            buffer = torch.empty(m.size, layout.features, dtype=layout.dtype, device=self.device)
            item = Inbound(m, buffer, self.transport.irecv(buffer, peer(m), direction.key, m.tag))
            if self.emulator is not None:
                item.stamp = torch.zeros(1, dtype=torch.float64, device=self.device)
                item.stamp_work = self.transport.irecv(item.stamp, peer(m), direction.key, m.tag + STAMP_TAG)
            posted.setdefault(key(m), []).append(item)
        return posted

    def receive_activations(self, k: int) -> torch.Tensor:
        """The ``(samples, features)`` input of this rank's piece of microbatch ``k``."""
        return self._shared(self._acts.pop(k), self.act_in.layout)

    def receive_gradients(self, k: int) -> torch.Tensor:
        """The output gradients of this rank's piece of microbatch ``k``."""
        return self._shared(self._grads.pop(k), self.grad_in.layout)

    def _shared(self, items: list[Inbound], layout: CutLayout | None) -> torch.Tensor:
        """What arrived for ``items``; on a tensor-parallel replica, the leader's copy on every rank."""
        if self.replica is None:
            return self._wait(items)
        if self.leads:
            buffer = self._wait(items).contiguous()
        else:
            assert layout is not None
            buffer = torch.empty(sum(item.message.size for item in items), layout.features, dtype=layout.dtype,
                                 device=self.device)
        self.replica.broadcast(buffer)
        return buffer

    def _wait(self, items: list[Inbound]) -> torch.Tensor:
        remote = [item for item in items if item.work is not None]
        for item in remote:
            item.work.wait()  # type: ignore[union-attr]
        for item in items:
            if item.work is None:  # sent earlier by this rank's own stage
                item.buffer = self.mailbox.pop((item.key, item.message.tag))
        if self.emulator is not None and remote:
            for item in remote:
                item.stamp_work.wait()  # type: ignore[union-attr]
            sleep_until(max(float(item.stamp) for item in remote))  # type: ignore[arg-type]
        # the tcp transport's CPU seconds, waits left out; a hand-over costs none
        costs = [getattr(item.work, "cpu", None) if item.work is not None else 0.0 for item in items]
        began = time.perf_counter()
        items.sort(key=lambda item: item.message.start)  # regroup samples in order
        joined = items[0].buffer if len(items) == 1 else torch.cat([item.buffer for item in items])  # type: ignore
        self.receive_cpu = None if None in costs else sum(costs) + time.perf_counter() - began  # type: ignore
        return joined

    # ----------------------------------------------------------------- sending
    def send_activations(self, k: int, buffer: torch.Tensor, first_sample: int) -> None:
        """Send the rows of microbatch ``k``'s output to every piece that needs them."""
        self._send(self.act_out, self._act_sends.get(k, []), buffer, first_sample, "fwd", peer=lambda m: m.dst)

    def send_gradients(self, k: int, buffer: torch.Tensor, first_sample: int) -> None:
        """Send the input gradients of microbatch ``k`` back to the pieces they came from."""
        self._send(self.grad_out, self._grad_sends.get(k, []), buffer, first_sample, "bwd", peer=lambda m: m.src)

    def _send(self, direction: Direction, messages: list[Message], buffer: torch.Tensor,
              first_sample: int, link: str, peer) -> None:
        if not self.leads:
            return  # the leader sends the replica's copy
        stamp = None
        remote = [m for m in messages if peer(m) != self.rank]
        if self.emulator is not None and remote:
            nbytes = buffer.element_size() * buffer.shape[1] * sum(m.size for m in remote)
            arrival = self.emulator.links[self._link[link]].arrival(time.perf_counter(), nbytes)
            stamp = torch.tensor([arrival], dtype=torch.float64, device=self.device)
        for m in messages:
            rows = buffer if m.size == buffer.shape[0] else \
                buffer[m.start - first_sample:m.stop - first_sample].contiguous()
            if peer(m) == self.rank:
                # a copy: the receiving stage's input must not share storage with this stage's output
                self.mailbox[(direction.key, m.tag)] = rows.clone()
                continue
            self._sends.append((self.transport.isend(rows, peer(m), direction.key, m.tag), rows))
            if stamp is not None:
                self._sends.append((self.transport.isend(stamp, peer(m), direction.key, m.tag + STAMP_TAG), stamp))

    def finish(self) -> None:
        """Wait until every send of the iteration has completed."""
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()
