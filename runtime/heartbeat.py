"""Liveness of the workers: one shared-memory row per rank, read by the launcher.

A worker writes ``(time, step, op position, waiting, alive)`` before every op and around
every blocking wait; writing a few floats into a memory map costs about a
microsecond.  ``waiting`` tells a rank blocked on a peer from one stuck on its own,
so when nothing moves the launcher can name the rank that stopped first.  A rank
blocked in a wait that it drives itself (the tcp transport) also refreshes ``alive``
about once a second while it sleeps, so among ranks that all wait, the frozen one is
the one whose ``alive`` stopped.  Under
``torchrun`` there is no launcher of ours and no map: beats are no-ops and the
process-group timeout ends a hang.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

ENV = "PIPEPLAN_HEARTBEAT"
"""Environment variable naming the map file (set by the local launcher)."""

FIELDS = 5  # time, step, position, waiting, alive


@dataclass(frozen=True)
class Beat:
    """The last sign of life of one rank."""

    time: float
    """``time.perf_counter()`` of the beat (0: none yet)."""
    step: int
    """Training step (``-1`` while setting up, ``-2`` while verifying)."""
    position: int
    """Position in the op list (its length: after the last op)."""
    waiting: bool
    """Blocked on peers (a receive, a barrier, an all-reduce)."""
    alive: float = 0.0
    """``time.perf_counter()`` of the last sign of life, progress or not (0: none yet)."""


def create(path: str, world: int) -> np.memmap:
    """The launcher's map: ``world`` zeroed rows."""
    table = np.memmap(path, dtype=np.float64, mode="w+", shape=(world, FIELDS))
    table[:] = 0.0
    table.flush()
    return table


def read(table: np.memmap, rank: int) -> Beat:
    """The last beat of ``rank``."""
    t, step, position, waiting, alive = (float(v) for v in table[rank])
    return Beat(t, int(step), int(position), waiting > 0, alive)


class Heartbeat:
    """A worker's writer; a no-op when the launcher gave no map."""

    def __init__(self, rank: int, world: int) -> None:
        path = os.environ.get(ENV)
        self._row = None if not path else np.memmap(path, dtype=np.float64, mode="r+", shape=(world, FIELDS))[rank]
        self.step = -1
        self.position = 0

    def __call__(self, step: int, position: int, waiting: bool = False) -> None:
        """Record progress; also remembered for :meth:`wait`."""
        self.step, self.position = step, position
        if self._row is not None:
            now = time.perf_counter()
            self._row[:] = (now, step, position, 1.0 if waiting else 0.0, now)

    def alive(self) -> None:
        """Say the rank still runs (while it waits) without claiming progress."""
        if self._row is not None:
            self._row[FIELDS - 1] = time.perf_counter()

    def wait(self, waiting: bool) -> None:
        """Mark the start (``True``) or end (``False``) of a blocking wait at the current op."""
        self(self.step, self.position, waiting)
