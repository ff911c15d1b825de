"""Gradient synchronisation after a rank's last action.

A rank holds every stage of its device group; its gradients are summed over the
group's replicas at once, over the parameters of all those stages (spec section 7.3).
Each replica's gradients are partial sums (its pieces' losses are already scaled by
their share of the global batch), so summing them gives the whole batch's gradient.

[Note: tied weights]  A Parameter shared by units in different stages (GPT's head
and embedding) exists once per stage holding it.  As DeepSpeed's TiedLayerSpec
does, the copies are kept identical by summing their gradients over every rank that
holds one, then applying the same update everywhere.  That sum runs over the
*partial* gradients of all those ranks (the replicas of each stage included), so a
tied Parameter skips the stage's own all-reduce: summing twice would count the
replicas' share ``r`` times.  Two holders on one device group (the first and last
stage of a V-shaped pipeline) share one Parameter in the process, whose gradient
collects both stages' parts before the sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from pipeplan.models.zoo import ZooModel
from pipeplan.runtime.routing import device_ranks, leader_ranks, stage_ranks
from pipeplan.runtime.sharding import local, replica_ranks
from pipeplan.runtime.transport import Transport, Work
from pipeplan.solver.formats.plan import Plan


def tied_holders(model: ZooModel, plan: Plan) -> dict[int, tuple[int, ...]]:
    """``id(parameter) -> stages holding it`` for every Parameter held by two or more stages."""
    stage_of_unit = {i: s for s, st in enumerate(plan.stages) for i in range(*st.layers)}
    holders: dict[int, set[int]] = {}
    for i, unit in enumerate(model.units):
        for p in unit.module.parameters():
            holders.setdefault(id(p), set()).add(stage_of_unit[i])
    return {pid: tuple(sorted(stages)) for pid, stages in holders.items() if len(stages) > 1}


def group_members(plan: Plan, model: ZooModel) -> dict:
    """The ranks of every process group of the run, in one order on every rank.

    Keys: ``(cut, "fwd" | "bwd")`` for the two directions of each cut (the replicas'
    leaders, see :func:`pipeplan.runtime.routing.leader_ranks`), ``("group", g)`` for
    each replicated device group (``("group", g, i)``, one per tensor-parallel rank ``i``,
    when its stages have ``tensor_parallel`` > 1), ``("tp", g, j)`` for the ranks of
    replica ``j`` of a tensor-parallel group, ``("tied", stages)`` for each set of stages
    sharing a Parameter whose holders are on two ranks or more.
    """
    ranks = stage_ranks(plan)
    leaders = [leader_ranks(plan, s) for s in range(len(plan.stages))]
    members: dict = {}
    for c in range(len(plan.stages) - 1):
        for direction in ("fwd", "bwd"):
            members[(c, direction)] = list(dict.fromkeys(leaders[c] + leaders[c + 1]))
    device_rank = device_ranks(plan)
    first = {g: s for s, g in reversed(list(enumerate(plan.stage_groups)))}
    for g, devices in enumerate(plan.groups):
        replicas = replica_ranks(plan, first[g])
        t = len(replicas[0])
        if t == 1 and len(devices) > 1:
            members[("group", g)] = [device_rank[d] for d in devices]
        elif t > 1 and len(replicas) > 1:  # one ring per tensor-parallel rank (spec section 8.3)
            for i in range(t):
                members[("group", g, i)] = [replica[i] for replica in replicas]
    for g in range(len(plan.groups)):
        for j, replica in enumerate(replica_ranks(plan, first[g])):
            if len(replica) > 1:
                members[("tp", g, j)] = replica
    for stages in sorted(set(tied_holders(model, plan).values())):
        holders = sorted({r for s in stages for r in ranks[s]})
        if len(holders) > 1:
            members[("tied", stages)] = holders
    return members


def make_groups(members: dict) -> dict:
    """A process group for every entry of :func:`group_members`.

    ``dist.new_group`` must be called by all ranks, even those outside the group.
    """
    return {key: dist.new_group(ranks) for key, ranks in members.items()}


def links(members: dict, plan: Plan) -> list[tuple]:
    """``(key, a, b)``, ``a < b``, for every two ranks that exchange point-to-point messages.

    Across each cut: every replica leader of the stage before with every one of the
    stage after.  In a gradient group: its two members when it has two (a pairwise sum, see
    [Note: pairwise exchange]); larger groups all-reduce through torch.distributed.
    """
    ranks = [leader_ranks(plan, s) for s in range(len(plan.stages))]
    out = []
    for key, group in members.items():
        if isinstance(key[0], int):  # a cut; a rank on both sides hands over to itself
            pairs = [(x, y) for x in ranks[key[0]] for y in ranks[key[0] + 1] if x != y]
        else:  # a replica's ranks ("tp") broadcast through torch.distributed
            pairs = [tuple(group)] if len(group) == 2 and key[0] != "tp" else []
        out += list(dict.fromkeys((key, min(x, y), max(x, y)) for x, y in pairs))
    return out


@dataclass
class Bucket:
    """One set of gradients summed over one group."""

    key: tuple
    """The group's key (see :func:`group_members`)."""
    group: dist.ProcessGroup | None
    """The process group summing them (``None`` when a transport's exchange does, see ``peer``)."""
    params: list[nn.Parameter]
    """The parameters whose gradients are summed (in a fixed order)."""
    peer: int | None = None
    """The other member's global rank when the group has two members (summed by one
    exchange, see [Note: pairwise exchange]); ``None``: ``dist.all_reduce``."""
    incoming: torch.Tensor | None = None
    """The peer's flat gradients (posted by :meth:`GradSync.post`)."""
    work: Work | None = None
    """Its pending receive."""
    scale: float = 1.0
    """Each rank's gradients are multiplied by it before the sum (``1/t`` for a tied Parameter on a
    tensor-parallel stage)."""
    owner: int | None = None
    """The global rank that alone receives the sum (ZeRO-2; the others drop these gradients), or ``None``."""


@dataclass
class GradSync:
    """The gradient sums one rank takes part in, each over one flat buffer.

    [Note: pairwise exchange]  Most groups here have two members (two replicas, or
    the two stages holding GPT's tied embedding and head).  For them a sum is one
    message each way: the receive of the peer's flat gradients is posted with the
    iteration's other receives, and each side sends its own as soon as its last
    backward ends, so the member that finishes first (the last stage, for tied
    weights) has its part delivered by the time the other one needs it.  The
    exposed cost is one message latency instead of gloo's all-reduce (several
    rounds, each handed between gloo's worker and I/O threads).  Both members add
    the same two buffers, ``a + b`` and ``b + a``, which floating-point addition
    makes bitwise equal, so the copies stay identical.  Larger groups use
    ``dist.all_reduce`` (a ring moves less data than sending everything to everyone).
    """

    buckets: list[Bucket] = field(default_factory=list)
    """The sums, in one global order."""
    transport: Transport | None = None
    """Moves the two-member sums' messages."""

    @classmethod
    def for_group(cls, group: int, params: list[nn.Parameter], model: ZooModel, plan: Plan,
                  members: dict, groups: dict, transport: Transport, ring: tuple | None = None,
                  degree: int = 1, owners: dict[int, int] | None = None) -> "GradSync":
        """The buckets of a rank of device group ``group`` holding ``params`` (all its stages', once each).

        ``members``: :func:`group_members`; ``groups``: the process groups made of
        them (at least those of three or more ranks, which all-reduce through them).
        ``ring``: the key of the rank's data-parallel ring (default ``("group", group)``;
        ``("group", group, i)`` on tensor-parallel rank ``i``); ``degree``: the group's
        ``tensor_parallel`` (a tied Parameter is replicated on the ``t`` ranks of a replica,
        so each adds ``1/t`` of its gradient to the tied sum); ``owners``: ``id(p) ->
        global rank`` of the parameters whose gradients are summed onto one rank only
        (ZeRO-2, see [Note: ZeRO] in :mod:`pipeplan.runtime.sharding`).
        """
        ring = ("group", group) if ring is None else ring
        owners = owners or {}
        tied = tied_holders(model, plan)
        by_group: dict = {}
        for p in params:
            key = ("tied", tied[id(p)]) if id(p) in tied and ("tied", tied[id(p)]) in members else ring
            if key in members:
                by_group.setdefault(key, []).append(p)
        # One global order (the groups' order): two ranks sharing two groups must
        # reduce them in the same order or wait on each other forever.
        order = list(members)
        me = dist.get_rank()
        buckets = []
        for key in sorted(by_group, key=order.index):
            ranks = members[key]
            reduced = [p for p in by_group[key] if id(p) in owners] if key == ring else []
            summed = [p for p in by_group[key] if id(p) not in owners]
            peer = next(r for r in ranks if r != me) if len(ranks) == 2 else None
            scale = 1.0 / degree if key[0] == "tied" and degree > 1 else 1.0
            if summed:
                buckets.append(Bucket(key, groups.get(key), summed, peer, scale=scale))
            by_owner: dict[int, list[nn.Parameter]] = {}
            for p in reduced:
                by_owner.setdefault(owners[id(p)], []).append(p)
            for owner in sorted(by_owner):
                buckets.append(Bucket(key, groups[key], by_owner[owner], owner=owner))
        return cls(buckets, transport)

    def __bool__(self) -> bool:
        return bool(self.buckets)

    def post(self) -> None:
        """Post the receives of the peers' gradients (before the iteration starts)."""
        for b in self.buckets:
            if b.peer is not None:
                first = b.params[0]
                b.incoming = torch.empty(sum(local(p).numel() for p in b.params), dtype=first.dtype,
                                         device=first.device)
                b.work = self.transport.irecv(b.incoming, b.peer, b.key)

    def all_reduce(self) -> None:
        """Sum every bucket's gradients over its group, in place."""
        for b in self.buckets:
            for p in b.params:
                if p.grad is None:  # a replica that got no sample still takes part
                    p.grad = torch.zeros_like(p)
            grads = [local(p.grad) for p in b.params]  # a DTensor's gradient: this rank's shard
            flat = torch.cat([g.reshape(-1) for g in grads]) if len(grads) > 1 else grads[0].reshape(-1)
            if b.scale != 1.0:
                flat = flat * b.scale
            if b.owner is not None:
                dist.reduce(flat, dst=b.owner, group=b.group)
                if b.owner != dist.get_rank():
                    for p in b.params:
                        p.grad = None  # ZeRO-2: only the owner keeps (and steps) them
                    continue
            elif b.peer is None:
                dist.all_reduce(flat, group=b.group)
            else:
                assert b.work is not None and b.incoming is not None, "GradSync.post() was not called"
                sent = self.transport.isend(flat, b.peer, b.key)
                b.work.wait()
                flat = flat + b.incoming  # a new tensor: the sent one stays untouched until sent
                sent.wait()
                b.work = b.incoming = None
            for g, part in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(part.view_as(g))
