"""Schedules as data: per-stage op lists of ``"Fk"`` / ``"Bk"`` actions.

An op list is validated data, kept apart from the simulator that times it and the
runtime that executes it (the grammar follows torch's pipelining ``"F0"``/``"B0"``
actions).  ``gpipe`` and ``1f1b`` lists are generated exactly as the spec says;
``custom`` lists come from the plan and are checked by :func:`check_ops`.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Iterable, Sequence

from pipeplan.models.errors import InputError

SCHEDULES = ("gpipe", "1f1b", "custom")
"""Schedule names a plan may use."""

FORWARD, BACKWARD = "F", "B"

Op = tuple[str, int]
"""An action: ``("F", k)`` or ``("B", k)`` for microbatch ``k`` of the stage."""

_OP_RE = re.compile(r"([FB])(0|[1-9][0-9]*)")  # used with fullmatch: "$" would also match before a newline


def parse_op(text: str) -> Op:
    """``"F3"`` -> ``("F", 3)``.

    Raises
    ------
    ValueError
        If ``text`` is not ``F<k>`` or ``B<k>`` with ``k`` a non-negative integer.
    """
    match = _OP_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"op {text!r} is not of the form F<k> or B<k> (k = 0, 1, ...)")
    return match.group(1), int(match.group(2))


def format_op(op: Op) -> str:
    """``("B", 2)`` -> ``"B2"``."""
    return f"{op[0]}{op[1]}"


def gpipe_ops(m: int) -> list[Op]:
    """GPipe: all forwards, then all backwards.

    Examples
    --------
    >>> [format_op(o) for o in gpipe_ops(2)]
    ['F0', 'F1', 'B0', 'B1']
    """
    return [(FORWARD, k) for k in range(m)] + [(BACKWARD, k) for k in range(m)]


def one_f_one_b_ops(m: int, stage: int, num_stages: int) -> list[Op]:
    """1F1B: ``w = min(S-1-s, m)`` warm-up forwards, then F/B pairs, then the drain.

    Examples
    --------
    >>> [format_op(o) for o in one_f_one_b_ops(3, 0, 2)]
    ['F0', 'F1', 'B0', 'F2', 'B1', 'B2']
    """
    warmup = min(num_stages - 1 - stage, m)
    ops: list[Op] = [(FORWARD, k) for k in range(warmup)]
    for i in range(m - warmup):
        ops.append((FORWARD, warmup + i))
        ops.append((BACKWARD, i))
    ops.extend((BACKWARD, k) for k in range(m - warmup, m))
    return ops


def stage_ops(schedule: str, m: int, stage: int, num_stages: int,
              custom: Sequence[Op] | None = None) -> list[Op]:
    """The op list of one stage under ``schedule``.

    Parameters
    ----------
    schedule : {"gpipe", "1f1b", "custom"}
    m : int
        The stage's number of microbatches.
    stage, num_stages : int
        The stage index and the number of stages.
    custom : sequence of Op, optional
        The stage's own list, required for ``"custom"``.
    """
    if schedule == "gpipe":
        return gpipe_ops(m)
    if schedule == "1f1b":
        return one_f_one_b_ops(m, stage, num_stages)
    if schedule == "custom":
        if custom is None:
            raise ValueError("a custom schedule needs the stage's op list")
        return list(custom)
    raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")


def check_ops(texts: Iterable[object], m: int, file: str, where: str) -> list[Op]:
    """Parse and check a custom op list for a stage with ``m`` microbatches.

    Every ``Fk`` and ``Bk`` for ``k < m`` must appear exactly once, ``Fk`` before ``Bk``.

    Raises
    ------
    InputError
        At the offending entry, or at the list when an op is missing.
    """
    if not isinstance(texts, list):
        raise InputError(file, where, "expected a list of ops such as [\"F0\", \"B0\"]")
    ops: list[Op] = []
    seen: set[Op] = set()
    for i, text in enumerate(texts):
        try:
            op = parse_op(text)  # type: ignore[arg-type]
        except ValueError as exc:
            raise InputError(file, f"{where}[{i}]", str(exc)) from None
        if op[1] >= m:
            raise InputError(file, f"{where}[{i}]",
                             f"op {text} names microbatch {op[1]}, but the stage has {m} microbatches (0..{m - 1})")
        if op in seen:
            raise InputError(file, f"{where}[{i}]", f"op {text} appears twice")
        if op[0] == BACKWARD and (FORWARD, op[1]) not in seen:
            raise InputError(file, f"{where}[{i}]", f"B{op[1]} comes before F{op[1]}; a backward needs its forward first")
        seen.add(op)
        ops.append(op)
    missing = [format_op(op) for op in gpipe_ops(m) if op not in seen]
    if missing:
        shown = ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
        raise InputError(file, where, f"missing ops {shown}: each of F0..F{m - 1} and B0..B{m - 1} must appear once")
    return ops


def to_csv(pipeline: Sequence[Sequence[Op]]) -> str:
    """One CSV row per stage, one action per cell (torch's ``_dump_csv`` layout)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for ops in pipeline:
        writer.writerow([format_op(op) for op in ops])
    return out.getvalue()


def from_csv(text: str, microbatches: Sequence[int], file: str = "-") -> list[list[Op]]:
    """Parse :func:`to_csv` output back, checking each row against its stage's count."""
    rows = [row for row in csv.reader(io.StringIO(text)) if row]
    if len(rows) != len(microbatches):
        raise InputError(file, "rows", f"expected {len(microbatches)} stage rows, got {len(rows)}")
    return [check_ops(row, m, file, f"row {s}") for s, (row, m) in enumerate(zip(rows, microbatches))]
