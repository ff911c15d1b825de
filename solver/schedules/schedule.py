"""Schedules as classes: one class per named schedule, looked up by name (:func:`schedule_for`).

A schedule is validated data, kept apart from the simulator that times it and the
runtime that executes it, as torch.distributed.pipelining keeps one class per
schedule (``Schedule1F1B``, ``ScheduleZBVZeroBubble``, ...) behind
``get_schedule_class``.  Each subclass of :class:`Schedule` declares what planning
needs of it (stages per group, a split backward, how stages sit on groups) and
generates its programs: every device group's list of :class:`Action` s, written as
torch writes them (``"3I5"``: the input-gradient backward of microbatch 5 of stage 3).

- ``gpipe`` (:class:`GPipe`) and ``1f1b`` (:class:`OneFOneB`): one stage per group;
- ``interleaved-1f1b`` (:class:`Interleaved1F1B`), ``interleaved-zb`` (:class:`InterleavedZB`,
  backward split into ``I`` and ``W``) and ``looped-bfs`` (:class:`LoopedBFS`): ``v``
  stages per group, stage ``s`` on group ``s mod R``;
- ``zbv`` (:class:`ZBV`): two stages per group in a V, backward split;
- ``custom`` (:class:`Custom`): the plan lists the programs.

The functions below the classes (:func:`group_programs`, :func:`stage_actions`,
:func:`num_stages`, :func:`stage_group`, :func:`check_counts`) take a schedule's name
and ask its class.  A custom plan lists its programs (:func:`check_programs`) or, one
stage per group, each stage's ops (``"F2"``, ``"B2"``: :func:`check_stage_ops` reads
them into actions); :func:`programs_to_csv` / :func:`programs_from_csv` read and write
programs in torch's CSV format (:mod:`pipeplan.solver.schedules.check`).

To add a schedule: write a subclass with its attributes and ``_generate`` (or, one
stage per group, ``warmup``), and list it in :data:`SCHEDULE_CLASSES`.

Examples
--------
>>> schedule_for("zbv").stages_per_group, schedule_for("zbv").split_backward, schedule_for("zbv").placement
(2, True, 'v')
>>> [" ".join(format_action(a) for a in p) for p in schedule_for("1f1b").programs(2, 2)]
['0F0 0F1 0B0 0B1', '1F0 1B0 1F1 1B1']
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import ClassVar, Iterable

from pipeplan.models.errors import InputError
from pipeplan.solver.schedules.check import check_programs, programs_from_csv, programs_to_csv
from pipeplan.solver.schedules.programs import (FORWARD, FULL_BACKWARD, INPUT_BACKWARD, KINDS, WEIGHT_BACKWARD, Action,
                                                format_action, interleaved_programs, looped_bfs_programs,
                                                parse_action, stage_program, zbv_programs)

__all__ = ["Action", "KINDS", "NAMED_V2", "ONE_STAGE_PER_GROUP", "SCHEDULES", "SCHEDULE_CLASSES", "FORWARD",
           "BACKWARD", "INPUT", "WEIGHT", "Schedule", "GPipe", "OneFOneB", "Interleaved1F1B", "InterleavedZB",
           "LoopedBFS", "ZBV", "Custom", "check_counts", "check_programs", "check_stage_ops", "format_action",
           "group_programs", "num_stages", "parse_action", "programs_from_csv", "programs_to_csv", "schedule_for",
           "stage_actions", "stage_group"]

BACKWARD, INPUT, WEIGHT = FULL_BACKWARD, INPUT_BACKWARD, WEIGHT_BACKWARD

_STAGE_OP_RE = re.compile(r"([FBIW])(0|[1-9][0-9]*)")  # used with fullmatch: "$" would also match before a newline


class Schedule:
    """A named pipeline schedule (spec section 7.2): what planning needs of it, and its programs.

    Subclasses set the class attributes and implement ``_generate`` (or, one stage per
    group, ``warmup``); every method is a class method, so a schedule is used as its
    class (``schedule_for("zbv").programs(4, 8)``).
    """

    name: ClassVar[str]
    """The schedule's name, as a plan file and ``--schedule NAME`` write it."""
    stages_per_group: ClassVar[int | None]
    """Stages every device group holds: ``1`` (``gpipe``, ``1f1b``), ``2`` (``zbv``), or ``None`` when it is
    a choice ``v`` (``--virtual-stages``; the interleaved and looped schedules) or, for ``custom``, the plan's."""
    split_backward: ClassVar[bool]
    """Whether the backward pass runs as ``I`` (input gradients) and a later ``W`` (weight gradients)."""
    placement: ClassVar[str | None]
    """How stages sit on groups, named as torch's ``generate_stage_to_rank_mapping`` styles them: ``"loop"``
    (stage ``s`` on group ``s mod R``) or ``"v"`` (stage ``s`` on group ``s`` for ``s < R``, ``2R-1-s`` after);
    ``None`` for ``custom``, whose plan says."""
    format_version: ClassVar[int]
    """The oldest plan format that may name the schedule: 1 (``pipeplan.plan/1``) or 2 (``pipeplan.plan/2``)."""
    planned: ClassVar[bool] = True
    """Whether solvers plan for it (``custom`` programs come from a plan file and are not planned)."""
    from_plan: ClassVar[bool] = False
    """Whether the plan lists the programs (``custom``) instead of the schedule generating them."""
    forwards_first: ClassVar[bool] = False
    """One stage per group, every stage runs all its forwards before its first backward (GPipe): all ``m``
    microbatches are in flight at once."""
    warmup_per_later_stage: ClassVar[bool] = False
    """One stage per group, stage ``s`` of ``S`` runs ``min(S-1-s, m)`` warm-up forwards, then alternates a
    forward with a backward (1F1B): at most ``S-s`` microbatches are in flight."""
    one_stage_per_group: ClassVar[bool]
    """Whether every group holds exactly one stage (set from :attr:`stages_per_group`)."""
    several_stages: ClassVar[bool]
    """Whether a group may hold more than one stage (spec 7: a version-2 plan); the negation of
    :attr:`one_stage_per_group`."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.one_stage_per_group = cls.stages_per_group == 1
        cls.several_stages = not cls.one_stage_per_group

    def __init__(self) -> None:
        raise TypeError(f"{type(self).__name__} is used as a class (schedule_for(name).programs(...)), "
                        f"not instantiated")

    @classmethod
    def check_counts(cls, groups: int, microbatches: int, virtual: int) -> None:
        """Refuse what torch's constructor for the schedule refuses.

        Raises
        ------
        ValueError
            In one line, for fewer than one group, microbatch or stage per group, and
            for what the subclass refuses besides (see its ``check_counts``).
        """
        for name, value in (("groups", groups), ("microbatches", microbatches), ("virtual", virtual)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{cls.name} needs {name} >= 1 (an integer), got {value!r}")

    @classmethod
    def check_virtual(cls, groups: int, virtual: int) -> None:
        """Refuse a group count or stages per group the schedule cannot run (before any program is built)."""
        cls.check_counts(groups, 1, virtual)
        if cls.one_stage_per_group and virtual != 1:
            raise ValueError(f"{cls.name} holds one stage per group, got virtual = {virtual}; "
                             f"use interleaved-1f1b or looped-bfs for {virtual} stages per group")

    @classmethod
    def num_stages(cls, groups: int, virtual: int = 1) -> int:
        """The number of stages the schedule runs on ``groups`` device groups (``v*R``; ``2R`` for ``zbv``)."""
        cls.check_virtual(groups, virtual)
        return (cls.stages_per_group or virtual) * groups

    @classmethod
    def stage_group(cls, stage: int, groups: int) -> int:
        """The device group that holds ``stage`` (see :attr:`placement`)."""
        cls.check_virtual(groups, 1)
        if not isinstance(stage, int) or stage < 0:
            raise ValueError(f"stage must be an integer >= 0, got {stage!r}")
        if cls.stages_per_group is not None:
            limit = cls.num_stages(groups)
            if stage >= limit:
                raise ValueError(f"{cls.name} on {groups} groups has stages 0..{limit - 1}, not stage {stage}")
        if cls.placement == "v":
            return stage if stage < groups else 2 * groups - 1 - stage
        return stage % groups

    @classmethod
    def programs(cls, groups: int, microbatches: int, virtual: int = 1) -> list[list[Action]]:
        """Every group's program (spec section 7.2): program ``g`` lists group ``g``'s actions in the order it runs them.

        Raises
        ------
        ValueError
            In one line, where torch's schedule class refuses the combination.
        """
        return [list(program) for program in _generated(cls, groups, microbatches, virtual)]

    @classmethod
    def _generate(cls, groups: int, microbatches: int, virtual: int) -> list[list[Action]]:
        """Every group's program for counts :meth:`check_counts` accepted."""
        raise NotImplementedError


class _OneStagePerGroup(Schedule):
    """A schedule under which every group holds one stage, whose program the stage's position decides."""

    stages_per_group = 1
    split_backward = False
    placement = "loop"
    format_version = 1

    @classmethod
    def warmup(cls, stage: int, num_stages: int, microbatches: int) -> int:
        """The forwards stage ``stage`` of ``num_stages`` runs before its first backward."""
        raise NotImplementedError

    @classmethod
    def stage_program(cls, stage: int, microbatches: int, num_stages: int) -> list[Action]:
        """The program of stage ``stage`` of ``num_stages``, which has its group to itself, over ``microbatches``."""
        return stage_program(stage, microbatches, cls.warmup(stage, num_stages, microbatches))

    @classmethod
    def _generate(cls, groups: int, microbatches: int, virtual: int) -> list[list[Action]]:
        return [list(stage_actions(cls.name, microbatches, s, groups)) for s in range(groups)]


class GPipe(_OneStagePerGroup):
    """``gpipe``: every stage runs all its forwards, then all its backwards."""

    name = "gpipe"
    forwards_first = True

    @classmethod
    def warmup(cls, stage: int, num_stages: int, microbatches: int) -> int:
        return microbatches


class OneFOneB(_OneStagePerGroup):
    """``1f1b``: stage ``s`` of ``S`` warms up with ``min(S-1-s, m)`` forwards, then alternates F and B."""

    name = "1f1b"
    warmup_per_later_stage = True

    @classmethod
    def warmup(cls, stage: int, num_stages: int, microbatches: int) -> int:
        return min(num_stages - 1 - stage, microbatches)


class _Interleaved(Schedule):
    """Interleaved schedules: ``v`` stages per group in a loop, microbatches in rounds of ``max(1, m // R)``."""

    stages_per_group = None
    placement = "loop"
    format_version = 2

    @classmethod
    def check_counts(cls, groups: int, microbatches: int, virtual: int) -> None:
        """Also refuse ``microbatches`` that are not a multiple of ``rounds = max(1, microbatches // groups)``."""
        super().check_counts(groups, microbatches, virtual)
        rounds = max(1, microbatches // groups)
        if microbatches % rounds:
            raise ValueError(f"{cls.name} needs the microbatch count to be a multiple of rounds = "
                             f"max(1, m // R) = {rounds}; m = {microbatches} with R = {groups} groups is not: "
                             f"use m = {_nearest_valid_m(microbatches, groups)}")

    @classmethod
    def _generate(cls, groups: int, microbatches: int, virtual: int) -> list[list[Action]]:
        return interleaved_programs(groups, microbatches, virtual, zero_bubble=cls.split_backward)


class Interleaved1F1B(_Interleaved):
    """``interleaved-1f1b``: torch's ``ScheduleInterleaved1F1B``."""

    name = "interleaved-1f1b"
    split_backward = False


class InterleavedZB(_Interleaved):
    """``interleaved-zb``: torch's ``ScheduleInterleavedZeroBubble`` (ZB1P)."""

    name = "interleaved-zb"
    split_backward = True


class LoopedBFS(Schedule):
    """``looped-bfs``: torch's ``ScheduleLoopedBFS``, all forwards of a group's stages, then all backwards."""

    name = "looped-bfs"
    stages_per_group = None
    split_backward = False
    placement = "loop"
    format_version = 2

    @classmethod
    def _generate(cls, groups: int, microbatches: int, virtual: int) -> list[list[Action]]:
        return looped_bfs_programs(groups, microbatches, virtual)


class ZBV(Schedule):
    """``zbv``: torch's ``ScheduleZBVZeroBubble``, two stages per group in a V."""

    name = "zbv"
    stages_per_group = 2
    split_backward = True
    placement = "v"
    format_version = 2

    @classmethod
    def check_counts(cls, groups: int, microbatches: int, virtual: int) -> None:
        """Also refuse a ``virtual`` other than 2 (1, the default, is read as "not given")."""
        super().check_counts(groups, microbatches, virtual)
        if virtual not in (1, cls.stages_per_group):
            raise ValueError(f"zbv holds exactly {cls.stages_per_group} stages per group, got virtual = {virtual}; "
                             f"use virtual = {cls.stages_per_group}, or interleaved-1f1b for {virtual} stages "
                             f"per group")

    @classmethod
    def _generate(cls, groups: int, microbatches: int, virtual: int) -> list[list[Action]]:
        return zbv_programs(groups, microbatches)


class Custom(Schedule):
    """``custom``: the plan lists every group's program (or, one stage per group, every stage's ops)."""

    name = "custom"
    stages_per_group = None
    split_backward = False
    """A custom plan may split any backward; nothing about it is fixed by the name."""
    placement = None
    format_version = 1
    planned = False
    from_plan = True

    @classmethod
    def check_virtual(cls, groups: int, virtual: int) -> None:
        raise ValueError("a custom schedule has no generated programs: its plan lists them under \"programs\"")


SCHEDULE_CLASSES: dict[str, type[Schedule]] = {cls.name: cls for cls in (
    GPipe, OneFOneB, Custom, Interleaved1F1B, InterleavedZB, LoopedBFS, ZBV)}
"""Every schedule class by name, the one place a schedule is listed (torch's ``get_schedule_class``)."""

SCHEDULES = tuple(SCHEDULE_CLASSES)
"""Schedule names a plan may use (those of :data:`NAMED_V2` only in a ``pipeplan.plan/2`` plan)."""

NAMED_V2 = tuple(name for name, cls in SCHEDULE_CLASSES.items() if cls.format_version == 2)
"""The named schedules whose groups may hold several stages (they need a ``pipeplan.plan/2`` plan)."""

ONE_STAGE_PER_GROUP = tuple(name for name, cls in SCHEDULE_CLASSES.items() if cls.one_stage_per_group)
"""Named schedules under which every group holds exactly one stage (``gpipe``, ``1f1b``)."""


def schedule_for(name: str) -> type[Schedule]:
    """The class of the schedule named ``name``.

    Raises
    ------
    ValueError
        For an unknown name, listing the valid ones.

    Examples
    --------
    >>> schedule_for("interleaved-zb").__name__
    'InterleavedZB'
    """
    cls = SCHEDULE_CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown schedule {name!r}; valid: {', '.join(SCHEDULES)}")
    return cls


def _nearest_valid_m(m: int, groups: int) -> str:
    """The closest microbatch counts below and above ``m`` that the interleaved schedules accept."""
    def valid(k: int) -> bool:
        return k >= 1 and k % max(1, k // groups) == 0
    below = next(k for k in range(m - 1, 0, -1) if valid(k))  # k <= groups is always valid
    above = next(k for k in range(m + 1, 2 * m + groups) if valid(k))
    return f"{below} or {above}"


@lru_cache(maxsize=1024)
def _generated(cls: type[Schedule], groups: int, microbatches: int, virtual: int) -> tuple[tuple[Action, ...], ...]:
    """A schedule's programs, generated once per arguments (plans of one structure are simulated many times)."""
    cls.check_virtual(groups, virtual)
    cls.check_counts(groups, microbatches, virtual)
    return tuple(tuple(program) for program in cls._generate(groups, microbatches, virtual))


def check_counts(schedule: str, groups: int, microbatches: int, virtual: int) -> None:
    """Refuse what torch's constructor for ``schedule`` refuses (:meth:`Schedule.check_counts` of its class).

    Raises
    ------
    ValueError
        For an unknown name, fewer than one group, microbatch or stage per group;
        for ``zbv`` with a ``virtual`` other than 2 (1, the default, is read as "not
        given"); for the interleaved schedules when ``microbatches`` is not a multiple
        of ``rounds = max(1, microbatches // groups)``.
    """
    schedule_for(schedule).check_counts(groups, microbatches, virtual)


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
    cls = SCHEDULE_CLASSES.get(schedule) if isinstance(schedule, str) else None
    if cls is None or not issubclass(cls, _OneStagePerGroup):
        raise ValueError(f"{schedule} does not generate per-stage programs; valid: {', '.join(ONE_STAGE_PER_GROUP)}")
    return tuple(cls.stage_program(stage, m, num_stages))


def num_stages(schedule: str, groups: int, virtual: int = 1) -> int:
    """The number of stages a named schedule runs on ``groups`` device groups (:meth:`Schedule.num_stages`).

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
    return schedule_for(schedule).num_stages(groups, virtual)


def stage_group(schedule: str, stage: int, groups: int) -> int:
    """The device group that holds ``stage`` under a named schedule (:meth:`Schedule.stage_group`).

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
    return schedule_for(schedule).stage_group(stage, groups)


def group_programs(schedule: str, groups: int, microbatches: int, virtual: int = 1) -> list[list[Action]]:
    """Every group's program under a named schedule (spec section 7.2; :meth:`Schedule.programs`).

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
    return [list(program) for program in _generated(schedule_for(schedule), groups, microbatches, virtual)]


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
