"""Schedules as data: every device group's program of actions.

A program is validated data, kept apart from the simulator that times it and the
runtime that executes it.  An :class:`Action` is written as torch.distributed.pipelining
writes it (``"3I5"``: the input-gradient backward of microbatch 5 of stage 3).
:func:`group_programs` gives every group's program for any named schedule: ``gpipe`` and
``1f1b`` hold one stage per group (:func:`stage_actions`, exactly as the spec says), the
version-2 generators live in :mod:`pipeplan.solver.schedules.programs`.  A custom plan
lists its programs (:func:`check_programs`) or, one stage per group, each stage's ops
(``"F2"``, ``"B2"``: :func:`check_stage_ops` reads them into actions);
:func:`programs_to_csv` / :func:`programs_from_csv` read and write programs in torch's
CSV format (:mod:`pipeplan.solver.schedules.check`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable

from pipeplan.models.errors import InputError
from pipeplan.solver.schedules.check import check_programs, programs_from_csv, programs_to_csv
from pipeplan.solver.schedules.needs import NEEDS
from pipeplan.solver.schedules.programs import (FORWARD, FULL_BACKWARD, GENERATORS, INPUT_BACKWARD, KINDS, NAMED_V2,
                                                WEIGHT_BACKWARD, ZBV_STAGES_PER_GROUP, Action, check_counts,
                                                format_action, parse_action)

__all__ = ["Action", "KINDS", "NAMED_V2", "ONE_STAGE_PER_GROUP", "SCHEDULES", "FORWARD", "BACKWARD", "INPUT",
           "WEIGHT", "check_programs", "check_stage_ops", "format_action", "group_programs", "num_stages",
           "parse_action", "programs_from_csv", "programs_to_csv", "stage_actions", "stage_group"]

SCHEDULES = ("gpipe", "1f1b", "custom") + NAMED_V2
"""Schedule names a plan may use (the last four only in a ``pipeplan.plan/2`` plan)."""

ONE_STAGE_PER_GROUP = tuple(name for name, needs in NEEDS.items() if not needs.several_stages)
"""Named schedules under which every group holds exactly one stage (``gpipe``, ``1f1b``)."""

BACKWARD, INPUT, WEIGHT = FULL_BACKWARD, INPUT_BACKWARD, WEIGHT_BACKWARD

_STAGE_OP_RE = re.compile(r"([FBIW])(0|[1-9][0-9]*)")  # used with fullmatch: "$" would also match before a newline


@lru_cache(maxsize=4096)
def stage_actions(schedule: str, m: int, stage: int, num_stages: int) -> tuple[Action, ...]:
    """The program of a stage that has its device group to itself, under ``gpipe`` or ``1f1b``.

    ``gpipe``: all forwards, then all backwards.  ``1f1b``: ``w = min(S-1-s, m)``
    warm-up forwards, then forward/backward pairs, then the drain.

    Parameters
    ----------
    schedule : {"gpipe", "1f1b"}
    m : int
        The stage's number of microbatches.
    stage, num_stages : int
        ``s`` and ``S``.

    Raises
    ------
    ValueError
        For another schedule (``custom`` ones come from the plan, the version-2 ones
        from :func:`group_programs`).

    Examples
    --------
    >>> [format_action(a) for a in stage_actions("1f1b", 3, 0, 2)]
    ['0F0', '0F1', '0B0', '0F2', '0B1', '0B2']
    >>> [format_action(a) for a in stage_actions("gpipe", 2, 1, 2)]
    ['1F0', '1F1', '1B0', '1B1']
    """
    if schedule == "gpipe":
        warmup = m
    elif schedule == "1f1b":
        warmup = min(num_stages - 1 - stage, m)
    else:
        raise ValueError(f"{schedule} does not generate per-stage programs; valid: {', '.join(ONE_STAGE_PER_GROUP)}")
    program = [Action(stage, FORWARD, k) for k in range(warmup)]
    for i in range(m - warmup):
        program += [Action(stage, FORWARD, warmup + i), Action(stage, BACKWARD, i)]
    program += [Action(stage, BACKWARD, k) for k in range(max(m - warmup, 0), m)]
    return tuple(program)


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
    return [list(program) for program in _generated(schedule, groups, microbatches, virtual)]


@lru_cache(maxsize=1024)
def _generated(schedule: str, groups: int, microbatches: int, virtual: int) -> tuple[tuple[Action, ...], ...]:
    """:func:`group_programs`, generated once per arguments (plans of one structure are simulated many times)."""
    _check_virtual(schedule, groups, virtual)
    if schedule in ONE_STAGE_PER_GROUP:
        check_counts(schedule, groups, microbatches, virtual)
        return tuple(stage_actions(schedule, microbatches, s, groups) for s in range(groups))
    return tuple(tuple(program) for program in GENERATORS[schedule](groups, microbatches, virtual))


def _check_virtual(schedule: str, groups: int, virtual: int) -> None:
    if schedule == "custom":
        raise ValueError("a custom schedule has no generated programs: its plan lists them under \"programs\"")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    check_counts(schedule, groups, 1, virtual)
    if schedule in ONE_STAGE_PER_GROUP and virtual != 1:
        raise ValueError(f"{schedule} holds one stage per group, got virtual = {virtual}; "
                         f"use interleaved-1f1b or looped-bfs for {virtual} stages per group")


def check_stage_ops(texts: Iterable[object], stage: int, m: int, file: str, where: str) -> list[Action]:
    """Read a stage's own op list (``"F0"``, ``"B0"``, ``"I0"``, ``"W0"``) into its actions, checked.

    For a stage that has its device group to itself: every ``Fk`` appears once, then
    either ``Bk`` or ``Ik`` and later ``Wk``, for ``k < m``.

    Raises
    ------
    InputError
        At the offending entry, or at the list when an op is missing.

    Examples
    --------
    >>> [format_action(a) for a in check_stage_ops(["F0", "I0", "W0"], 2, 1, "-", "ops")]
    ['2F0', '2I0', '2W0']
    """
    if not isinstance(texts, list):
        raise InputError(file, where, "expected a list of ops such as [\"F0\", \"B0\"]")
    actions: list[Action] = []
    seen: set[tuple[str, int]] = set()
    for i, text in enumerate(texts):
        place = f"{where}[{i}]"
        match = _STAGE_OP_RE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise InputError(file, place, f"op {text!r} is not of the form F<k>, B<k>, I<k> or W<k> (k = 0, 1, ...)")
        kind, k = match.group(1), int(match.group(2))
        if k >= m:
            raise InputError(file, place, f"op {text} names microbatch {k}, but the stage has {m} microbatches "
                                          f"(0..{m - 1})")
        if (kind, k) in seen:
            raise InputError(file, place, f"op {text} appears twice")
        _check_stage_order(kind, k, seen, file, place)
        seen.add((kind, k))
        actions.append(Action(stage, kind, k))
    missing = []
    for k in range(m):
        if (FORWARD, k) not in seen:
            missing.append(f"F{k}")
        if (INPUT, k) in seen:
            if (WEIGHT, k) not in seen:
                missing.append(f"W{k}")
        elif (BACKWARD, k) not in seen:
            missing.append(f"B{k}")
    if missing:
        shown = ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
        raise InputError(file, where, f"missing ops {shown}: each of F0..F{m - 1} and B0..B{m - 1} (or I and a later "
                                      f"W) must appear once")
    return actions


def _check_stage_order(kind: str, k: int, seen: set[tuple[str, int]], file: str, place: str) -> None:
    """A ``B``/``I`` needs its ``F``, a ``W`` its ``I``; ``B`` and ``I``/``W`` exclude each other."""
    if kind == FORWARD:
        return
    if kind == BACKWARD and ((INPUT, k) in seen or (WEIGHT, k) in seen):
        raise InputError(file, place, f"B{k} is a whole backward, but microbatch {k} already split its backward "
                                      f"into I{k} and W{k}; run either B{k} or I{k} then W{k}")
    if kind in (INPUT, WEIGHT) and (BACKWARD, k) in seen:
        raise InputError(file, place, f"{kind}{k} splits the backward of microbatch {k}, which already ran whole as "
                                      f"B{k}; run either B{k} or I{k} then W{k}")
    if kind in (BACKWARD, INPUT) and (FORWARD, k) not in seen:
        raise InputError(file, place, f"{kind}{k} comes before F{k}; a backward needs its forward first")
    if kind == WEIGHT and (INPUT, k) not in seen:
        raise InputError(file, place, f"W{k} comes before I{k}; the weight gradient needs the input gradient's "
                                      f"backward first")
