"""Point-to-point messages between ranks: torch.distributed, or plain TCP driven by the rank itself.

Every message of the runtime (activations, gradients, the pairwise gradient sums,
the start-of-iteration tokens) goes through one :class:`Transport`, addressed by a
*key* (which process group it belongs to, as made by
``pipeplan.runtime.gradsync.make_groups``), a peer rank and a tag.  Both ends post a key's
messages between two ranks in the same order, so they match in order, as NCCL
matches them.

[Note: tcp transport]  gloo hands every message between the calling thread, a
worker thread and an I/O thread.  On the 2-vCPU machine this project is measured on,
a woken gloo thread was seen to wait about 3.5 ms for a core in a sizeable share of
exchanges (bimodal: 0.2 ms or 3.5 ms for the same 4 KB exchange; giving gloo's
threads real-time priority removed the slow mode), while plain TCP sockets read and
written by the two main threads exchanged 220 KB in a median of 33 us (p90 44 us).
:class:`TcpTransport` is that: one non-blocking socket per key and pair of ranks,
each message a 16-byte header (tag, bytes) and the tensor's bytes, moved by the
rank's own thread whenever it posts a send or waits for anything (``poll`` when
nothing can move, so a waiting rank sleeps in the kernel until its data arrives).
Sends that do not fit in the socket buffer continue during later waits.  A wait
may first poll for ``spin`` seconds before it sleeps (see ``pipeplan.runtime.worker``'s
``--spin``).  CPU tensors only; NCCL and multi-member all-reduces stay with
torch.distributed.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, Protocol

import torch
import torch.distributed as dist

HEADER = struct.Struct("<qq")
"""Tag and payload bytes in front of every TCP message."""
BUFFER_BYTES = 4 << 20
"""Socket send and receive buffer asked for, so most messages go out in one ``send``.

The kernel caps it at ``net.core.wmem_max``/``rmem_max`` (4 MB on the measured
machine, often about 200 KB elsewhere), and a size set by hand turns off its
automatic sizing for that socket: larger messages then finish during later waits.
"""


class Work(Protocol):
    """A posted send or receive."""

    def wait(self) -> None:
        """Block until it has completed."""


class Transport(Protocol):
    """Posts point-to-point messages; see the module docstring."""

    def isend(self, tensor: torch.Tensor, peer: int, key: Hashable, tag: int = 0) -> Work:
        """Post a send of the contiguous ``tensor`` to ``peer``."""

    def irecv(self, tensor: torch.Tensor, peer: int, key: Hashable, tag: int = 0) -> Work:
        """Post a receive from ``peer`` into the contiguous ``tensor``."""


class DistTransport:
    """Messages through torch.distributed (gloo or NCCL): ``key`` names the process group.

    Parameters
    ----------
    groups : dict
        ``key -> ProcessGroup``.
    """

    def __init__(self, groups: dict) -> None:
        self.groups = groups

    def isend(self, tensor: torch.Tensor, peer: int, key: Hashable, tag: int = 0) -> Work:
        return dist.isend(tensor, peer, group=self.groups[key], tag=tag)

    def irecv(self, tensor: torch.Tensor, peer: int, key: Hashable, tag: int = 0) -> Work:
        return dist.irecv(tensor, peer, group=self.groups[key], tag=tag)


# --------------------------------------------------------------------- TCP
@dataclass(eq=False)
class _Message:
    """One posted message on one connection, and how far it has moved."""

    transport: "TcpTransport"
    """Who moves it."""
    tag: int
    """Its tag (checked against the header on receipt)."""
    data: memoryview
    """The tensor's bytes."""
    keep: torch.Tensor
    """The tensor, alive until the message has moved."""
    header: bytearray = field(default_factory=lambda: bytearray(HEADER.size))
    """The header, sent or being received."""
    moved: int = 0
    """Bytes of header and data moved so far."""
    total: int = 0
    """Bytes of header and data."""
    cpu: float = 0.0
    """Seconds this rank spent in the system calls that moved it (waits, and calls that
    found nothing to move, left out)."""

    def __post_init__(self) -> None:
        self.total = HEADER.size + len(self.data)

    @property
    def done(self) -> bool:
        return self.moved == self.total

    def wait(self) -> None:
        self.transport.wait_for(self)


@dataclass(eq=False)
class _Connection:
    """A socket between this rank and ``peer`` for one key, with its queues."""

    sock: socket.socket
    peer: int
    key: str
    sends: deque = field(default_factory=deque)
    """Posted sends not yet fully written, in order."""
    recvs: deque = field(default_factory=deque)
    """Posted receives not yet fully read, in order."""

    def write(self) -> bool:
        """Write what the socket takes now; whether anything moved."""
        moved = False
        while self.sends:
            m = self.sends[0]
            began = time.perf_counter()
            try:
                n = self.sock.sendmsg(_remaining(m))
            except BlockingIOError:
                return moved
            except OSError as exc:
                raise ConnectionError(f"sending to rank {self.peer} ({self.key}) failed: {exc}") from exc
            m.cpu += time.perf_counter() - began
            m.moved += n
            moved = moved or n > 0
            if not m.done:
                return moved  # the socket buffer is full
            self.sends.popleft()
            m.keep = m.data = None  # type: ignore[assignment]
        return moved

    def read(self) -> bool:
        """Read what has arrived for the posted receives; whether anything moved.

        A message's header is read and checked on its own, before any byte lands in
        the receive buffer.
        """
        moved = False
        while self.recvs:
            m = self.recvs[0]
            in_header = m.moved < HEADER.size
            view = memoryview(m.header)[m.moved:] if in_header else m.data[m.moved - HEADER.size:]
            began = time.perf_counter()
            try:
                n = self.sock.recv_into(view)
            except BlockingIOError:
                return moved
            except OSError as exc:
                raise ConnectionError(f"receiving from rank {self.peer} ({self.key}) failed: {exc}") from exc
            if n == 0:
                raise ConnectionError(f"rank {self.peer} closed its connection ({self.key}) before sending "
                                      f"a message this rank waits for")
            m.cpu += time.perf_counter() - began
            m.moved += n
            moved = True
            if in_header and m.moved == HEADER.size:
                self._check_header(m)
            if not m.done:
                if in_header:
                    continue  # read on: the rest of the header, or now the data
                return moved  # the rest of the data has not arrived yet
            self.recvs.popleft()
            m.keep = m.data = None  # type: ignore[assignment]
        return moved

    def _check_header(self, m: _Message) -> None:
        tag, nbytes = HEADER.unpack(m.header)
        if tag != m.tag:
            raise RuntimeError(f"message out of order from rank {self.peer} ({self.key}): expected tag {m.tag} "
                               f"with {len(m.data)} bytes, got tag {tag} with {nbytes} bytes")
        if nbytes != len(m.data):
            raise RuntimeError(f"message of the wrong size from rank {self.peer} ({self.key}), tag {tag}: "
                               f"{nbytes} bytes sent, {len(m.data)} bytes expected (the two ranks disagree "
                               f"on the plan's buffer sizes)")


class TcpTransport:
    """Plain TCP sockets moved by the calling thread; see [Note: tcp transport].

    Parameters
    ----------
    rank : int
        This rank.
    links : iterable of (key, int, int)
        Every ``(key, a, b)`` with ``a < b`` that may exchange messages; each gets
        its own connection.  Every rank must pass the same set.
    gather : callable
        ``gather(obj) -> list`` of every rank's ``obj`` (``dist.all_gather_object``
        on a control group), to publish the listening addresses.
    host : str
        The address other ranks reach this one at.
    timeout : float
        Seconds a wait may last before it fails, naming the peer.
    spin : float
        Seconds a wait polls the sockets before it sleeps in ``poll``.
    alive : callable, optional
        Called before each sleep of a wait (at least once a second while it lasts), so
        a watchdog can tell a rank that waits from one that froze.
    """

    def __init__(self, rank: int, links, gather, host: str = "127.0.0.1", timeout: float = 300.0,
                 spin: float = 0.0, alive: Callable[[], None] | None = None) -> None:
        self.rank, self.timeout, self.spin = rank, timeout, spin
        self.alive = alive or (lambda: None)
        self.connections: dict[tuple[str, int], _Connection] = {}
        mine = sorted({(repr(key), a, b) for key, a, b in links if rank in (a, b)})
        listener = socket.create_server((host, 0), backlog=max(len(mine), 1) + 8)
        try:
            addresses = gather((host, listener.getsockname()[1]))
            expected = set()
            for key, a, b in mine:  # connect first: the kernel completes them before any accept
                if a == rank:
                    self._connect(key, b, tuple(addresses[b]))
                else:
                    expected.add((key, a))
            self._accept(listener, expected)
        finally:
            listener.close()
        self._order = list(self.connections.values())

    # ----------------------------------------------------------------- set-up
    def _connect(self, key: str, peer: int, address: tuple) -> None:
        sock = socket.create_connection(address, timeout=self.timeout)
        hello = json.dumps({"key": key, "rank": self.rank}).encode()
        sock.sendall(struct.pack("<q", len(hello)) + hello)
        self._add(sock, key, peer)

    def _accept(self, listener: socket.socket, expected: set) -> None:
        listener.settimeout(self.timeout)
        while expected:
            sock, _ = listener.accept()
            sock.settimeout(self.timeout)
            size = struct.unpack("<q", _read_exactly(sock, 8))[0]
            hello = json.loads(_read_exactly(sock, size))
            pair = (hello["key"], int(hello["rank"]))
            if pair not in expected:
                raise RuntimeError(f"unexpected connection {pair} at rank {self.rank}")
            expected.discard(pair)
            self._add(sock, pair[0], pair[1])

    def _add(self, sock: socket.socket, key: str, peer: int) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
        sock.setblocking(False)
        self.connections[(key, peer)] = _Connection(sock, peer, key)

    # ----------------------------------------------------------------- messages
    def isend(self, tensor: torch.Tensor, peer: int, key: Hashable, tag: int = 0) -> Work:
        conn = self._connection(key, peer)
        m = _Message(self, tag, _bytes_of(tensor), tensor)
        HEADER.pack_into(m.header, 0, tag, len(m.data))
        conn.sends.append(m)
        conn.write()  # eager: most messages leave right here
        return m

    def irecv(self, tensor: torch.Tensor, peer: int, key: Hashable, tag: int = 0) -> Work:
        m = _Message(self, tag, _bytes_of(tensor), tensor)
        self._connection(key, peer).recvs.append(m)
        return m

    def wait_for(self, m: _Message) -> None:
        """Move every connection's messages until ``m`` has moved."""
        deadline = time.monotonic() + self.timeout
        spin_until = time.perf_counter() + self.spin
        while not m.done:
            if self._pump():
                deadline = time.monotonic() + self.timeout  # a timeout counts from the last progress
                continue
            if time.perf_counter() < spin_until:
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"rank {self.rank}: no progress for {self.timeout:g} s waiting on "
                                   f"{self._describe_pending()}")
            self.alive()
            self._sleep_until_ready(min(left, 1.0))

    def _sleep_until_ready(self, seconds: float) -> None:
        """Block until a socket with pending work can move (``poll``: no limit on descriptor numbers)."""
        poller = select.poll()
        for c in self._order:
            events = (select.POLLIN if c.recvs else 0) | (select.POLLOUT if c.sends else 0)
            if events:
                poller.register(c.sock, events)
        poller.poll(seconds * 1e3)

    def _pump(self) -> bool:
        moved = False
        for c in self._order:
            if c.sends and c.write():
                moved = True
            if c.recvs and c.read():
                moved = True
        return moved

    def _connection(self, key: Hashable, peer: int) -> _Connection:
        try:
            return self.connections[(repr(key), peer)]
        except KeyError:
            raise RuntimeError(f"rank {self.rank} has no link {key!r} to rank {peer}") from None

    def _describe_pending(self) -> str:
        waiting = [f"rank {c.peer} ({c.key})" for c in self._order if c.recvs or c.sends]
        return ", ".join(waiting) or "nothing"

    def close(self) -> None:
        """Close every connection."""
        for c in self._order:
            c.sock.close()


def _remaining(m: _Message) -> list[memoryview]:
    """The header and data bytes of ``m`` not sent yet."""
    if m.moved < HEADER.size:
        return [memoryview(m.header)[m.moved:], m.data]
    return [m.data[m.moved - HEADER.size:]]


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError("the tcp transport moves contiguous CPU tensors only")
    return memoryview(tensor.view(-1).view(torch.uint8).numpy())  # views only: never a copy


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("peer closed the connection during set-up")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def reachable_host() -> str:
    """This machine's address towards ``MASTER_ADDR`` (loopback when the run is local)."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if master in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
        return probe.getsockname()[0]
    finally:
        probe.close()
