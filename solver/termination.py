"""Stopping rules, kept apart from problems and algorithms (as pymoo does)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class TimeLimit:
    """Stop after ``seconds`` of wall time from :meth:`start` (or creation).

    Examples
    --------
    >>> t = TimeLimit(10.0)
    >>> t.expired()
    False
    """

    seconds: float
    """The wall-time budget."""
    started: float = field(default_factory=time.perf_counter)
    """``time.perf_counter()`` at the start."""

    def start(self) -> "TimeLimit":
        self.started = time.perf_counter()
        return self

    def elapsed(self) -> float:
        """Seconds since the start."""
        return time.perf_counter() - self.started

    def remaining(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.seconds - self.elapsed())

    def expired(self) -> bool:
        return self.elapsed() >= self.seconds
