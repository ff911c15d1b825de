"""Stopping rules, kept apart from problems and algorithms (as pymoo does).

Three things may end a search early, and a result must say which did
(:data:`STOPPED_BY`), because only one of them makes the plan depend on the machine:

- a :class:`WorkBudget`: counted work (generations, evaluations, CP-SAT deterministic
  seconds, HiGHS nodes); the same inputs, seed and budget give the same plan anywhere;
- a :class:`TimeLimit`: the wall-clock cap; when it fires, how far the search got
  depends on the machine's speed and load;
- an interrupt (SIGINT / SIGTERM under :func:`interruptible`): the user stopped it.

Every wall-clock check that fires inside a :func:`watch` block is noted in that block's
:class:`Watch` (nested blocks all see it), so a solver that calls others, or runs timed
phases, can tell whether *any* clock cut its work short.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable, Iterator

STOPPED_BY = ("proved", "complete", "budget", "time", "interrupt")
"""Why a solve ended: ``proved`` (optimality or infeasibility proved), ``complete`` (the
method's whole search ran), ``budget`` (its work budget was spent), ``time`` (the
wall-clock cap cut it: machine-dependent), ``interrupt`` (SIGINT / SIGTERM)."""

REPRODUCIBLE = ("proved", "complete", "budget")
"""The reasons under which the same inputs, seed and budget give the same plan on any machine."""


# --------------------------------------------------------------------------- watches
@dataclass
class Watch:
    """What cut the work of one solve short (filled by the checks below)."""

    time_cut: bool = False
    """A wall-clock check fired inside the block."""
    interrupted: bool = False
    """An interrupt was seen inside the block."""
    budget_spent: bool = False
    """A work budget ran out inside the block."""

    def stopped_by(self, proved: bool = False) -> str:
        """The reason to record: the interrupt first, then the clock, then the budget.

        A proof wins over everything: a proved result is the same on every machine.
        """
        if proved:
            return "proved"
        if self.interrupted:
            return "interrupt"
        if self.time_cut:
            return "time"
        return "budget" if self.budget_spent else "complete"


_WATCHES: ContextVar[tuple[Watch, ...]] = ContextVar("pipeplan_watches", default=())


@contextlib.contextmanager
def watch() -> Iterator[Watch]:
    """Collect, in the yielded :class:`Watch`, every clock, budget and interrupt stop inside the block.

    Examples
    --------
    >>> with watch() as w:
    ...     TimeLimit(0.0).expired()
    True
    >>> w.stopped_by()
    'time'
    """
    w = Watch()
    token = _WATCHES.set(_WATCHES.get() + (w,))
    try:
        yield w
    finally:
        _WATCHES.reset(token)


@contextlib.contextmanager
def phase_watch() -> Iterator[Watch]:
    """Like :func:`watch`, but what stops work inside reaches only this watch, not the enclosing ones.

    For a phase with a budget of its own: its budget running out ends the phase, not the
    solve, so the caller passes on only what should reach the solve's record (the clock,
    an interrupt).

    Examples
    --------
    >>> with watch() as outer:
    ...     with phase_watch() as phase:
    ...         WorkBudget(1).spend(2)
    False
    >>> phase.budget_spent, outer.budget_spent
    (True, False)
    """
    w = Watch()
    token = _WATCHES.set((w,))
    try:
        yield w
    finally:
        _WATCHES.reset(token)


def note(kind: str) -> None:
    """Tell every open :func:`watch` that ``kind`` (``"time"``, ``"interrupt"``, ``"budget"``) stopped some work."""
    attr = {"time": "time_cut", "interrupt": "interrupted", "budget": "budget_spent"}[kind]
    for w in _WATCHES.get():
        setattr(w, attr, True)


# --------------------------------------------------------------------------- interrupts
_INTERRUPT = threading.Event()
_STOPPERS: list[Callable[[], None]] = []
_STOPPERS_LOCK = threading.Lock()


def interrupted() -> bool:
    """Whether an interrupt was requested (and notes it in the open watches)."""
    if _INTERRUPT.is_set():
        note("interrupt")
        return True
    return False


RESTOP_AFTER = (0.1, 0.3, 0.7)
"""Seconds after an interrupt at which the stoppers are called again: a C++ search that
started between a check and its stopper's first call ignored that call."""


def request_interrupt() -> None:
    """Ask every search to stop and return its best so far (what SIGINT / SIGTERM do)."""
    first = not _INTERRUPT.is_set()
    _INTERRUPT.set()
    _call_stoppers()
    if first:
        threading.Thread(target=_restop, daemon=True).start()


def _call_stoppers() -> None:
    with _STOPPERS_LOCK:
        stoppers = list(_STOPPERS)
    for stop in stoppers:
        stop()


def _restop() -> None:
    waited = 0.0
    for at in RESTOP_AFTER:
        time.sleep(at - waited)
        waited = at
        _call_stoppers()


def clear_interrupt() -> None:
    """Forget an earlier interrupt (a new command starts afresh)."""
    _INTERRUPT.clear()


@contextlib.contextmanager
def on_interrupt(stop: Callable[[], None]) -> Iterator[None]:
    """Call ``stop`` (from another thread) if an interrupt comes while the block runs.

    For searches inside C++ (CP-SAT, HiGHS) that Python's own signal handlers cannot
    reach until they return: ``stop`` is their thread-safe ``stop_search`` / ``cancelSolve``.
    """
    with _STOPPERS_LOCK:
        _STOPPERS.append(stop)
    try:
        if _INTERRUPT.is_set():
            stop()
        yield
    finally:
        with _STOPPERS_LOCK:
            _STOPPERS.remove(stop)


@contextlib.contextmanager
def interruptible(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """While the block runs, the first SIGINT or SIGTERM stops the searches instead of killing them.

    The signal is also read from a wake-up pipe by a helper thread, so a search running
    inside C++ (which holds Python's main thread) is stopped at once through
    :func:`on_interrupt`.  A second signal raises ``KeyboardInterrupt`` (a hard stop).
    Outside the main thread this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    clear_interrupt()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    received = [0]  # signals the Python handler saw (the wake-up thread may have set the flag first)

    def handler(signum, frame) -> None:
        received[0] += 1
        if received[0] > 1:
            raise KeyboardInterrupt
        request_interrupt()

    previous = {s: signal.signal(s, handler) for s in signals}
    old_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    reader = threading.Thread(target=_wake_on_signal, args=(read_end,), daemon=True)
    reader.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        for s, h in previous.items():
            signal.signal(s, h)
        os.close(write_end)  # the reader sees end of file and returns
        reader.join(timeout=1.0)
        os.close(read_end)


def _wake_on_signal(read_end: int) -> None:
    while True:
        try:
            data = os.read(read_end, 64)
        except OSError:
            return
        if not data:
            return
        request_interrupt()


# --------------------------------------------------------------------------- limits
@dataclass
class TimeLimit:
    """Stop after ``seconds`` of wall time from :meth:`start` (or creation), or at an interrupt.

    An expiry seen by :meth:`expired` or :meth:`remaining` is noted in the open watches.

    Examples
    --------
    >>> t = TimeLimit(10.0)
    >>> t.expired()
    False
    """

    seconds: float
    """The wall-time cap."""
    started: float = field(default_factory=time.perf_counter)
    """``time.perf_counter()`` at the start."""

    def start(self) -> "TimeLimit":
        self.started = time.perf_counter()
        return self

    def elapsed(self) -> float:
        """Seconds since the start."""
        return time.perf_counter() - self.started

    def remaining(self) -> float:
        """Seconds left (never negative; 0 after an interrupt)."""
        if interrupted():
            return 0.0
        left = self.seconds - self.elapsed()
        if left <= 0:
            note("time")
        return max(0.0, left)

    def expired(self) -> bool:
        if interrupted():
            return True
        if self.elapsed() >= self.seconds:
            note("time")
            return True
        return False


def past(deadline: float) -> bool:
    """Whether ``time.perf_counter()`` passed ``deadline`` or an interrupt came (noted in the watches)."""
    if interrupted():
        return True
    if time.perf_counter() >= deadline:
        note("time")
        return True
    return False


@dataclass
class WorkBudget:
    """Stop after ``units`` of counted work (what a unit is, each solver says).

    Examples
    --------
    >>> b = WorkBudget(3)
    >>> [b.spend() for _ in range(4)]
    [True, True, True, False]
    >>> b.exhausted(), b.spent
    (True, 3.0)
    """

    units: float
    """The budget."""
    spent: float = 0.0
    """Units used so far."""

    def __post_init__(self) -> None:
        if not self.units > 0:
            raise ValueError(f"a work budget must be positive, got {self.units}")

    def left(self) -> float:
        """Units still to spend (never negative)."""
        return max(0.0, self.units - self.spent)

    def spend(self, units: float = 1.0) -> bool:
        """Take ``units`` if that many are left; ``False`` (and noted) when the budget cannot pay."""
        if self.spent + units > self.units + 1e-12:
            note("budget")
            return False
        self.spent += units
        return True

    def exhausted(self) -> bool:
        if self.left() <= 1e-12:
            note("budget")
            return True
        return False
