"""Stopping rules, kept apart from problems and algorithms (as pymoo does).

Three things may end a search early, and a result must say which did
(:data:`STOPPED_BY`), because only one of them makes the plan depend on the machine:

- a :class:`WorkBudget`: counted work (generations, evaluations, CP-SAT deterministic
  seconds, HiGHS nodes); the same inputs, seed and budget give the same plan anywhere;
- a :class:`TimeLimit`: the wall-clock cap; when it fires, how far the search got
  depends on the machine's speed and load;
- an interrupt (SIGINT / SIGTERM under :func:`interruptible`): the user stopped it.

What cut a solve's work short is kept in one :class:`Stops` record, which the solve's
clock and budget carry and every clock and budget made from them share
(:meth:`TimeLimit.within`, :meth:`TimeLimit.phase`, :meth:`TimeLimit.nested`).  A
solve's record (``stopped_by``) is read from it, so a solver that runs phases, or
other solvers, can tell whether *any* clock cut its work short: the record is passed
down with the clock, never read from ambient state.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

STOPPED_BY = ("proved", "complete", "budget", "time", "interrupt")
"""Why a solve ended: ``proved`` (optimality or infeasibility proved), ``complete`` (the
method's whole search ran), ``budget`` (its work budget was spent), ``time`` (the
wall-clock cap cut it: machine-dependent), ``interrupt`` (SIGINT / SIGTERM)."""

REPRODUCIBLE = ("proved", "complete", "budget")
"""The reasons under which the same inputs, seed and budget give the same plan on any machine."""

KINDS = ("time", "interrupt", "budget")
"""What may cut work short (:meth:`Stops.note`)."""


# --------------------------------------------------------------------------- what stopped work
@dataclass
class Stops:
    """What cut the work of one solve (or one phase of it) short.

    Filled by the checks of the clocks and budgets that carry it; a record made for a
    part of the work (:meth:`nested`, :meth:`phase`) passes what it notes on to its parent.

    Examples
    --------
    >>> solve = Stops()
    >>> phase = solve.phase()
    >>> phase.note("budget"); phase.note("time")
    >>> phase.budget_spent, solve.budget_spent, solve.time_cut
    (True, False, True)
    """

    time_cut: bool = False
    """A wall-clock check fired."""
    interrupted: bool = False
    """An interrupt was seen."""
    budget_spent: bool = False
    """A work budget ran out."""
    parent: "Stops | None" = field(default=None, repr=False, compare=False)
    """The record of the work this is part of, or ``None``."""
    passes_budget: bool = True
    """Whether a budget running out here also counts for :attr:`parent` (``False`` for a phase
    with a budget of its own: its running out ends the phase, not the solve)."""

    def note(self, kind: str) -> None:
        """Record that ``kind`` (one of :data:`KINDS`) stopped some work, here and in the parents it reaches."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        setattr(self, {"time": "time_cut", "interrupt": "interrupted", "budget": "budget_spent"}[kind], True)
        if self.parent is not None and (kind != "budget" or self.passes_budget):
            self.parent.note(kind)

    def nested(self) -> "Stops":
        """A record for work inside this one (another solver run as a phase): everything it notes reaches this one."""
        return Stops(parent=self)

    def phase(self) -> "Stops":
        """A record for a phase with a budget of its own: its clock and interrupts reach this one, its budget does not."""
        return Stops(parent=self, passes_budget=False)

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


# --------------------------------------------------------------------------- interrupts
_INTERRUPT = threading.Event()
_STOPPERS: list[Callable[[], None]] = []
_STOPPERS_LOCK = threading.Lock()


def interrupted() -> bool:
    """Whether an interrupt was requested (a clock that sees it notes it in its :class:`Stops`)."""
    return _INTERRUPT.is_set()


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

    An expiry or interrupt seen by :meth:`expired` or :meth:`remaining` is noted in
    :attr:`stops`, the record of the solve the clock belongs to.

    Examples
    --------
    >>> t = TimeLimit(10.0)
    >>> t.expired()
    False
    >>> cap = t.within(0.0)  # a cap of its own, noted in the same record
    >>> cap.expired(), t.stops.time_cut
    (True, True)
    """

    seconds: float
    """The wall-time cap."""
    started: float = field(default_factory=time.perf_counter)
    """``time.perf_counter()`` at the start."""
    stops: Stops = field(default_factory=Stops, repr=False, compare=False)
    """Where a cut or an interrupt this clock sees is noted."""

    def start(self) -> "TimeLimit":
        self.started = time.perf_counter()
        return self

    def elapsed(self) -> float:
        """Seconds since the start."""
        return time.perf_counter() - self.started

    def left(self) -> float:
        """Seconds left (never negative), noting nothing: for sharing out what is left, not for stopping."""
        return max(0.0, self.seconds - self.elapsed())

    def remaining(self) -> float:
        """Seconds left (never negative; 0 after an interrupt)."""
        if interrupted():
            self.stops.note("interrupt")
            return 0.0
        left = self.seconds - self.elapsed()
        if left <= 0:
            self.stops.note("time")
        return max(0.0, left)

    def expired(self, margin: float = 0.0) -> bool:
        """Whether the cap (less ``margin`` seconds) has passed, or an interrupt came."""
        if interrupted():
            self.stops.note("interrupt")
            return True
        if self.elapsed() >= self.seconds - margin:
            self.stops.note("time")
            return True
        return False

    def within(self, seconds: float) -> "TimeLimit":
        """A cap of ``seconds`` from now for a part of the work, whose cuts count as this clock's."""
        return TimeLimit(seconds, stops=self.stops)

    def phase(self, seconds: float) -> "TimeLimit":
        """A cap of ``seconds`` from now for a phase with a budget of its own (:meth:`Stops.phase`)."""
        return TimeLimit(seconds, stops=self.stops.phase())

    def nested(self, seconds: float) -> "TimeLimit":
        """A cap of ``seconds`` from now for another solve run inside this one (:meth:`Stops.nested`)."""
        return TimeLimit(seconds, stops=self.stops.nested())


def past(clock: TimeLimit) -> bool:
    """Whether ``clock`` has run out or an interrupt came (noted in its record): ``clock.expired()``."""
    return clock.expired()


@dataclass
class WorkBudget:
    """Stop after ``units`` of counted work (what a unit is, each solver says).

    Running out is noted in :attr:`stops`.

    Examples
    --------
    >>> b = WorkBudget(3)
    >>> [b.spend() for _ in range(4)]
    [True, True, True, False]
    >>> b.exhausted(), b.spent, b.stops.budget_spent
    (True, 3.0, True)
    """

    units: float
    """The budget."""
    spent: float = 0.0
    """Units used so far."""
    stops: Stops = field(default_factory=Stops, repr=False, compare=False)
    """Where running out is noted."""

    def __post_init__(self) -> None:
        if not self.units > 0:
            raise ValueError(f"a work budget must be positive, got {self.units}")

    def left(self) -> float:
        """Units still to spend (never negative)."""
        return max(0.0, self.units - self.spent)

    def spend(self, units: float = 1.0) -> bool:
        """Take ``units`` if that many are left; ``False`` (and noted) when the budget cannot pay."""
        if self.spent + units > self.units + 1e-12:
            self.stops.note("budget")
            return False
        self.spent += units
        return True

    def exhausted(self) -> bool:
        if self.left() <= 1e-12:
            self.stops.note("budget")
            return True
        return False
