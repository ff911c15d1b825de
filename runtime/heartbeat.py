"""Liveness of the workers: one shared-memory row per rank, read by the launcher.

A worker writes ``(time, step, op position, waiting)`` before every op and around
every blocking wait; writing a few floats into a memory map costs about a
microsecond.  ``waiting`` tells a rank blocked on a peer from one stuck on its own,
so when nothing moves the launcher can name the rank that stopped first.  Under
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

FIELDS = 4  # time, step, position, waiting


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


def create(path: str, world: int) -> np.memmap:
    """The launcher's map: ``world`` zeroed rows."""
    table = np.memmap(path, dtype=np.float64, mode="w+", shape=(world, FIELDS))
    table[:] = 0.0
    table.flush()
    return table


def read(table: np.memmap, rank: int) -> Beat:
    """The last beat of ``rank``."""
    t, step, position, waiting = (float(v) for v in table[rank])
    return Beat(t, int(step), int(position), waiting > 0)


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
            self._row[:] = (time.perf_counter(), step, position, 1.0 if waiting else 0.0)

    def wait(self, waiting: bool) -> None:
        """Mark the start (``True``) or end (``False``) of a blocking wait at the current op."""
        self(self.step, self.position, waiting)
