"""Warnings held back until a command succeeds.

A command that fails prints exactly one ``error:`` line; a warning printed before it
would make two, and would read as the cause.  Commands therefore call :func:`warn`, and
:func:`pipeplan.cli.main` prints what was held (:func:`flush`) only when the command
returns 0, and drops it (:func:`discard`) otherwise.
"""

from __future__ import annotations

from typing import TextIO

from pipeplan.models.errors import one_line

_held: list[str] = []


def warn(line: str) -> None:
    """Hold ``line`` (one line, control characters escaped) for :func:`flush`."""
    _held.append(one_line(line))


def flush(stream: TextIO) -> None:
    """Write every held line to ``stream``, in the order given, and forget them."""
    for line in _held:
        stream.write(line + "\n")
    discard()


def discard() -> None:
    """Forget every held line (the command failed, or a new one starts)."""
    _held.clear()
