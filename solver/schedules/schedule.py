"""Schedules as data: per-stage op lists and per-group programs.

An op list is validated data, kept apart from the simulator that times it and the
runtime that executes it (the grammar follows torch's pipelining ``"F0"``/``"B0"``
actions).  ``gpipe`` and ``1f1b`` lists are generated exactly as the spec says;
``custom`` lists come from the plan and are checked by :func:`check_ops`.

Version 2 (spec section 7.2) lets a device group hold several stages and run a
*program* of :class:`Action` s (``"3I5"``).  :func:`group_programs` gives every
group's program for any named schedule (the version-2 generators live in
:mod:`pipeplan.solver.schedules.programs`); :func:`check_programs` checks custom programs and
:func:`programs_to_csv` / :func:`programs_from_csv` read and write them in torch's
CSV format (:mod:`pipeplan.solver.schedules.check`).
"""

from __future__ import annotations

import csv
import io
import re
from typing import Iterable, Sequence

from pipeplan.models.errors import InputError
from pipeplan.solver.schedules.check import check_programs, programs_from_csv, programs_to_csv
from pipeplan.solver.schedules.needs import NEEDS
from pipeplan.solver.schedules.programs import (GENERATORS, KINDS, NAMED_V2, ZBV_STAGES_PER_GROUP, Action, check_counts,
                                      format_action, parse_action)

__all__ = ["Action", "KINDS", "NAMED_V2", "SCHEDULES", "check_programs", "format_action", "group_programs",
           "num_stages", "parse_action", "programs_from_csv", "programs_to_csv", "stage_group",
           "FORWARD", "BACKWARD", "Op", "parse_op", "format_op", "gpipe_ops", "one_f_one_b_ops", "stage_ops",
           "check_ops", "to_csv", "from_csv"]

SCHEDULES = ("gpipe", "1f1b", "custom") + NAMED_V2
"""Schedule names a plan may use (the last four only in a ``pipeplan.plan/2`` plan)."""

ONE_STAGE_PER_GROUP = tuple(name for name, needs in NEEDS.items() if not needs.several_stages)
"""Named schedules under which every group holds exactly one stage (``gpipe``, ``1f1b``)."""

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
    if schedule in NAMED_V2:
        # an InputError (a ValueError), so that a version-1 code path handed such a plan stops in one line
        raise InputError("-", "schedule", f"{schedule} runs per-group programs, which only a pipeplan.plan/2 plan "
                                          f"and the version-2 simulator know; use gpipe, 1f1b or custom here")
    raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")


def num_stages(schedule: str, groups: int, virtual: int = 1) -> int:
    """The number of stages a named schedule runs on ``groups`` device groups.

    Parameters
    ----------
    schedule : str
        A name in :data:`SCHEDULES` other than ``"custom"``.
    groups : int
        ``R``, the number of device groups.
    virtual : int, optional
        ``v``, stages per group, for ``interleaved-1f1b``, ``interleaved-zb`` and
        ``looped-bfs``; ``gpipe`` and ``1f1b`` need 1, ``zbv`` always has 2.

    Returns
    -------
    int
        ``v*R``; ``2R`` for ``zbv``; ``R`` for ``gpipe`` and ``1f1b``.

    Raises
    ------
    ValueError
        For ``custom`` (its groups come from the plan), an unknown name, or a
        ``virtual`` the schedule does not allow.

    Examples
    --------
    >>> num_stages("interleaved-1f1b", 4, 3), num_stages("zbv", 4), num_stages("1f1b", 4)
    (12, 8, 4)
    """
    _check_virtual(schedule, groups, virtual)
    if schedule == "zbv":
        return ZBV_STAGES_PER_GROUP * groups
    return virtual * groups


def stage_group(schedule: str, stage: int, groups: int) -> int:
    """The device group that holds ``stage`` under a named schedule.

    Stage ``s`` is on group ``s mod R`` (``s`` itself for ``gpipe`` and ``1f1b``,
    where ``s < R``); under ``zbv`` on group ``s`` for ``s < R`` and ``2R-1-s``
    otherwise.

    Raises
    ------
    ValueError
        For ``custom``, an unknown name, or a stage the schedule cannot have.

    Examples
    --------
    >>> [stage_group("zbv", s, 3) for s in range(6)]
    [0, 1, 2, 2, 1, 0]
    >>> [stage_group("looped-bfs", s, 2) for s in range(6)]
    [0, 1, 0, 1, 0, 1]
    """
    _check_virtual(schedule, groups, 1)
    if not isinstance(stage, int) or stage < 0:
        raise ValueError(f"stage must be an integer >= 0, got {stage!r}")
    if schedule in ONE_STAGE_PER_GROUP or schedule == "zbv":
        limit = num_stages(schedule, groups)
        if stage >= limit:
            raise ValueError(f"{schedule} on {groups} groups has stages 0..{limit - 1}, not stage {stage}")
        return stage if stage < groups else 2 * groups - 1 - stage
    return stage % groups


def group_programs(schedule: str, groups: int, microbatches: int, virtual: int = 1) -> list[list[Action]]:
    """Every group's program under a named schedule (spec section 7.2).

    Parameters
    ----------
    schedule : str
        A name in :data:`SCHEDULES` other than ``"custom"``.
    groups : int
        ``R``; for ``gpipe`` and ``1f1b`` also the number of stages (one per group).
    microbatches : int
        ``m``, the microbatches of every stage.
    virtual : int, optional
        ``v``, stages per group (see :func:`num_stages`).

    Returns
    -------
    list of list of Action
        Program ``g`` for each group ``g``: the actions of its stages in the order
        it runs them.

    Raises
    ------
    ValueError
        In one line, where torch's schedule class refuses the combination (``m``
        not a multiple of the rounds for the interleaved ones, ``zbv`` with another
        ``virtual`` than 2), and for ``custom`` or an unknown name.

    Examples
    --------
    >>> [" ".join(format_action(a) for a in p) for p in group_programs("1f1b", 2, 2)]
    ['0F0 0F1 0B0 0B1', '1F0 1B0 1F1 1B1']
    >>> [format_action(a) for a in group_programs("interleaved-zb", 2, 2, 2)[1]]
    ['1F0', '1F1', '3F0', '3I0', '3F1', '3I1', '3W0', '1I0', '3W1', '1I1', '1W0', '1W1']
    """
    _check_virtual(schedule, groups, virtual)
    if schedule in ONE_STAGE_PER_GROUP:
        check_counts(schedule, groups, microbatches, virtual)
        return [[Action(s, kind, k) for kind, k in stage_ops(schedule, microbatches, s, groups)]
                for s in range(groups)]
    return GENERATORS[schedule](groups, microbatches, virtual)


def _check_virtual(schedule: str, groups: int, virtual: int) -> None:
    if schedule == "custom":
        raise ValueError("a custom schedule has no generated programs: its plan lists them under \"programs\"")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    check_counts(schedule, groups, 1, virtual)
    if schedule in ONE_STAGE_PER_GROUP and virtual != 1:
        raise ValueError(f"{schedule} holds one stage per group, got virtual = {virtual}; "
                         f"use interleaved-1f1b or looped-bfs for {virtual} stages per group")


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
