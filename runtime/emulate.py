"""``--emulate``: make one machine behave like the plan's heterogeneous cluster.

The graph's times are those of the reference device, the machine that profiled it.
A device of speed ``v < 1`` takes ``t / v`` for work that took ``t`` here, so each
rank sleeps the difference after every compute op.  (A device faster than this
machine cannot be emulated by sleeping; its work runs at this machine's speed.)

A transfer leaves its sender when the op that produced it ends, waits for its link
(a FIFO, as in the spec), and arrives ``lat + bytes / rate`` later: the sender
stamps that arrival time on a small side message and the receiver sleeps until it.
``rate`` is the spec's ``min(r_X, r_Y) * bw`` shared among the sending replicas; one
link per ordered pair of device groups carries the forward and backward transfers of
every stage boundary between them.
Stamps compare ``time.perf_counter`` values across processes, which is valid on one
Linux machine (a system-wide monotonic clock), the only place emulation is meant for.

The gradient all-reduce of a replicated group is padded to the spec's ring time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def sleep_until(deadline: float) -> None:
    """Sleep (then spin for the last stretch) until ``time.perf_counter() >= deadline``."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        if left > 5e-4:  # time.sleep overshoots by ~0.1 ms: spin the last stretch
            time.sleep(left - 2e-4)


@dataclass
class Link:
    """One outgoing link direction of a rank (a FIFO, one transfer at a time)."""

    latency: float
    """Seconds per transfer."""
    rate: float
    """Bytes per second available to this replica."""
    free_at: float = 0.0
    """``perf_counter`` time the link is next free."""

    def arrival(self, ready: float, nbytes: int) -> float:
        """When a transfer of ``nbytes`` ready at ``ready`` arrives; books the link."""
        start = max(ready, self.free_at)
        self.free_at = start + self.latency + nbytes / self.rate
        return self.free_at


@dataclass
class Emulator:
    """Delays for one rank; :data:`None` in its place means no emulation."""

    speed: float
    """The rank's device speed relative to the reference device."""
    links: dict[int, Link] = field(default_factory=dict)
    """The rank's outgoing links, by the receiving group's index."""
    allreduce_time: float = 0.0
    """The spec's ring all-reduce time of the rank's group (0 unless replicated)."""

    def stretch(self, start: float) -> None:
        """Called at the end of a compute op begun at ``start``: sleep until it took ``t / speed``."""
        if self.speed < 1.0:
            took = time.perf_counter() - start
            sleep_until(start + took / self.speed)

    def pad_allreduce(self, start: float) -> None:
        """Make the all-reduce begun at ``start`` last at least the spec's time."""
        sleep_until(start + self.allreduce_time)

    def new_iteration(self) -> None:
        """Links start free at every iteration, as in the simulator."""
        for link in self.links.values():
            link.free_at = 0.0


def make_emulator(plan, cluster, group: int, replica: int, param_bytes: int) -> Emulator:
    """The emulator of replica ``replica`` of device group ``group`` under ``plan`` on ``cluster``.

    ``param_bytes``: the bytes of the parameters of all the group's stages (one all-reduce).
    """
    groups = plan.groups
    mine = groups[group]
    of_stage = plan.stage_groups
    peers = {of_stage[s + d] for s in range(len(of_stage)) if of_stage[s] == group for d in (-1, 1)
             if 0 <= s + d < len(of_stage) and of_stage[s + d] != group}
    links = {}
    for other in sorted(peers):
        r, r_other = len(mine), len(groups[other])
        # The spec moves the whole microbatch at min(r, r') * bw; each of the r
        # senders gets its share of that rate.
        rate = min(r, r_other) * cluster.bw(mine, groups[other]) / r
        links[other] = Link(cluster.lat(mine, groups[other]), rate)
    allreduce = 0.0
    r = len(mine)
    if r >= 2:
        allreduce = 2 * (r - 1) * (cluster.lat(mine) + param_bytes / (r * cluster.bw(mine)))
    return Emulator(cluster.device_index[mine[replica]].speed, links, allreduce)
