"""Who computes which samples, and which messages cross each cut (pure data).

Every rank is one device of the plan and serves its replica of every stage on that
device (several stages when stages share a device group, plan version 2).  Microbatch ``k`` of stage ``s`` covers
the global samples ``[C_s(k-1), C_s(k))`` (spec section 3); its ``r_s`` replicas split
it into contiguous parts of at most ``q = ceil(n / r_s)`` samples (spec section 4).

[Note: replica remainders]  The parts are as equal as integers allow, larger first
(``n = 5, r = 2`` gives 3 and 2; ``n = 5, r = 4`` gives 2, 1, 1, 1), so the largest part
is exactly the spec's ``q`` and no replica idles while another holds two extra
samples.  When ``n < r`` some replicas get no sample of that microbatch: they skip
its ops (nothing to compute, nothing to send).

A message carries the samples that one sending piece and one receiving piece have in
common, so a stage regroups what it receives into its own microbatches by
concatenating the messages of a piece in sample order.  Both ends derive the same
message list from the plan, so receive buffers are sized from it: no shape
handshake is ever sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Sequence

from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.schedules.schedule import Action

GRADIENT_SENDERS = ("B", "I")
"""Actions that compute a stage's input gradients and send them to the stage before."""


@dataclass(frozen=True)
class Piece:
    """The samples one rank handles in one microbatch of its stage."""

    stage: int
    """Stage index."""
    replica: int
    """Replica index inside the stage (position in the stage's ``devices``; among its replicas when
    ``tensor_parallel`` > 1)."""
    rank: int
    """Global rank of that replica (of its leader, :func:`leader_ranks`, when ``tensor_parallel`` > 1)."""
    microbatch: int
    """The stage's microbatch index ``k``."""
    start: int
    """First global sample index."""
    stop: int
    """One past the last global sample index (``start == stop``: no sample)."""

    @property
    def size(self) -> int:
        """Number of samples."""
        return self.stop - self.start


@dataclass(frozen=True)
class Message:
    """The samples two pieces on either side of a cut have in common."""

    cut: int
    """The cut after stage ``cut``."""
    src: int
    """Sending rank (stage ``cut`` for activations)."""
    dst: int
    """Receiving rank (stage ``cut + 1`` for activations)."""
    src_mb: int
    """Microbatch of the sending stage (stage ``cut``)."""
    dst_mb: int
    """Microbatch of the receiving stage (stage ``cut + 1``)."""
    start: int
    """First global sample."""
    stop: int
    """One past the last global sample."""
    tag: int
    """Index of the message in its cut's list: the same at both ends."""

    @property
    def size(self) -> int:
        """Number of samples."""
        return self.stop - self.start


def replica_split(n: int, r: int) -> list[int]:
    """Samples per replica for a microbatch of ``n``: as equal as possible, larger first.

    Examples
    --------
    >>> replica_split(5, 2), replica_split(2, 3)
    ([3, 2], [1, 1, 0])
    """
    q, rem = divmod(n, r)
    return [q + 1 if j < rem else q for j in range(r)]


def device_ranks(plan: Plan) -> dict[str, int]:
    """``device -> global rank``: devices numbered in the order the stages first name them.

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Plan, Stage
    >>> plan = Plan("g", "c", 2, 4.0, "custom", (Stage((0, 1), ("a", "b"), (2,)), Stage((1, 2), ("c",), (2,)),
    ...                                          Stage((2, 3), ("b", "a"), (2,))))
    >>> device_ranks(plan)
    {'a': 0, 'b': 1, 'c': 2}
    """
    ranks: dict[str, int] = {}
    for st in plan.stages:
        for device in st.devices:
            ranks.setdefault(device, len(ranks))
    return ranks


def stage_ranks(plan: Plan) -> list[list[int]]:
    """Global ranks of each stage's replicas, in the order of the stage's ``devices``."""
    ranks = device_ranks(plan)
    return [[ranks[d] for d in st.devices] for st in plan.stages]


def rank_of(plan: Plan) -> list[tuple[int, int]]:
    """``(group, replica)`` of every global rank: its group and its position in the group's devices.

    With one stage per group (every version-1 plan) the group is the stage.
    """
    ranks = device_ranks(plan)
    out = [(0, 0)] * len(ranks)
    for g, devices in enumerate(plan.groups):
        for j, device in enumerate(devices):
            out[ranks[device]] = (g, j)
    return out


def leader_ranks(plan: Plan, stage: int) -> list[int]:
    """The rank of each replica of ``stage`` that exchanges its messages: the replica's lowest rank.

    A replica of a tensor-parallel stage (``tensor_parallel`` t > 1, plan version 3) is
    ``t`` devices that all hold its whole inputs and outputs (spec section 8.3); its
    leader sends and receives them for it (see :mod:`pipeplan.runtime.sharding`).  With
    ``t = 1`` every device is a replica and its own leader.

    Examples
    --------
    >>> from pipeplan.solver.formats.plan import Plan, Stage
    >>> leader_ranks(Plan("g", "c", 2, 4.0, "gpipe", (Stage((0, 1), ("a", "b", "c", "d"), (2,),
    ...                                                     tensor_parallel=2),)), 0)
    [0, 2]
    """
    ranks = device_ranks(plan)
    return [min(ranks[d] for d in replica) for replica in plan.stages[stage].replica_devices]


def pieces(plan: Plan, stage: int) -> list[Piece]:
    """Every piece of ``stage``, by microbatch then replica (``rank``: the replica's leader)."""
    st = plan.stages[stage]
    ranks = leader_ranks(plan, stage)
    out, start = [], 0
    for k, n in enumerate(st.microbatches):
        lo = start
        for j, part in enumerate(replica_split(n, len(ranks))):
            out.append(Piece(stage, j, ranks[j], k, lo, lo + part))
            lo += part
        start += n
    return out


def cut_messages(plan: Plan, cut: int, stage_actions: Sequence[Sequence[Action]]) -> list[Message]:
    """Activation messages across the cut after stage ``cut``, in sending order.

    ``stage_actions[s]``: stage ``s``'s actions in the order its group runs them.  Sending
    order: by the position of the sender's ``Fk`` among them, then by sample.
    Gradients travel the same pieces backwards (see :func:`grad_order`).  A message
    whose two pieces are on one rank (consecutive stages on one group) is handed
    over inside the process (``src == dst``).
    """
    senders = [p for p in pieces(plan, cut) if p.size]
    receivers = [p for p in pieces(plan, cut + 1) if p.size]
    position = {k: i for i, (_, kind, k) in enumerate(stage_actions[cut]) if kind == "F"}
    pairs = []
    for a in senders:
        for b in receivers:
            lo, hi = max(a.start, b.start), min(a.stop, b.stop)
            if lo < hi:
                pairs.append((position[a.microbatch], lo, a, b, hi))
    pairs.sort(key=lambda item: (item[0], item[1], item[3].rank))
    return [Message(cut, a.rank, b.rank, a.microbatch, b.microbatch, lo, hi, i)
            for i, (_, lo, a, b, hi) in enumerate(pairs)]


def grad_order(messages: Sequence[Message], stage_actions: Sequence[Sequence[Action]]) -> list[Message]:
    """The messages of one cut in the order their gradients are sent back.

    By the position of the receiving stage's ``Bk`` (or ``Ik``, the input-gradient
    half of a split backward, which sends them) among its actions, then by sample.
    """
    if not messages:
        return []
    cut = messages[0].cut
    position = {k: i for i, (_, kind, k) in enumerate(stage_actions[cut + 1]) if kind in GRADIENT_SENDERS}
    return sorted(messages, key=lambda m: (position[m.dst_mb], m.start, m.src))


def boundary(inputs: Sequence[Sequence[int]], cut_after: int) -> list[int]:
    """Units ``u <= cut_after`` whose output some unit ``v > cut_after`` consumes.

    ``inputs[v]`` lists the units unit ``v`` consumes (``-1`` is the model input, which
    every rank draws itself and never crosses a cut).  These are the tensors crossing
    the cut, relayed ones included, as in the spec's boundary bytes.

    Examples
    --------
    >>> boundary([(-1,), (0,), (1,), (2, 0)], 1)
    [0, 1]
    """
    return sorted({u for v in range(cut_after + 1, len(inputs)) for u in inputs[v] if 0 <= u <= cut_after})


def sample_offsets(sizes: Sequence[int]) -> list[int]:
    """Start of each microbatch: ``[0, C(0), C(1), ...]`` without the total."""
    return [0, *accumulate(sizes)][:-1]
