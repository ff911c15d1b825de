"""Actions and the program generators of the multi-stage schedules (spec section 7.2).

A *program* is the list of actions one device group runs, one at a time, in list
order.  An action is written as torch.distributed.pipelining writes it,
``<stage><kind><microbatch>``: ``"3I5"`` is the input-gradient backward of
microbatch 5 of stage 3.  The three generators here build each group's program as
torch 2.13 builds each rank's ``_calculate_single_rank_operations`` for
``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``,
``ScheduleLoopedBFS`` and ``ScheduleZBVZeroBubble``, with the idle slots (torch's
``None`` entries) dropped; group ``g`` is torch's rank ``g``.  They take counts
already checked: the schedule classes of :mod:`pipeplan.solver.schedules.schedule`
check them (``Schedule.check_counts``) before they call a generator, and refuse,
with a one-line ``ValueError``, every combination torch's constructors refuse.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import NamedTuple

FORWARD, FULL_BACKWARD, INPUT_BACKWARD, WEIGHT_BACKWARD = "F", "B", "I", "W"
KINDS = (FORWARD, FULL_BACKWARD, INPUT_BACKWARD, WEIGHT_BACKWARD)
"""Action kinds: forward, whole backward, input-gradient backward, weight-gradient backward."""


class Action(NamedTuple):
    """One step of a group's program."""

    stage: int
    """The stage the action runs on (0 is the first stage of the pipeline)."""
    kind: str
    """``"F"``, ``"B"``, ``"I"`` or ``"W"`` (see :data:`KINDS`)."""
    microbatch: int
    """The microbatch of that stage (0, 1, ...)."""


_ACTION_RE = re.compile(r"(0|[1-9][0-9]*)([FBIW])(0|[1-9][0-9]*)")  # fullmatch: "$" would also match before "\n"


def parse_action(text: str) -> Action:
    """Read an action written as torch writes it.

    Parameters
    ----------
    text : str
        ``<stage><kind><microbatch>``, kind one of ``F``, ``B``, ``I``, ``W``.

    Returns
    -------
    Action

    Raises
    ------
    ValueError
        If ``text`` is not of that form (numbers without leading zeros).

    Examples
    --------
    >>> parse_action("0F3")
    Action(stage=0, kind='F', microbatch=3)
    """
    match = _ACTION_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"action {text!r} is not of the form <stage><kind><microbatch> with kind F, B, I or W "
                         f"(such as \"0F3\" or \"2W1\")")
    return Action(int(match.group(1)), match.group(2), int(match.group(3)))


def format_action(action: Action) -> str:
    """Write an action as torch writes it.

    Examples
    --------
    >>> format_action(Action(0, "I", 2))
    '0I2'
    """
    return f"{action.stage}{action.kind}{action.microbatch}"


def interleaved_programs(groups: int, microbatches: int, virtual: int, zero_bubble: bool) -> list[list[Action]]:
    """Every group's program under interleaved 1F1B or interleaved zero bubble (ZB1P).

    Stage ``s`` is on group ``s mod R``.  Group ``g`` runs ``w`` warm-up forwards,
    then forward/backward pairs, then the remaining backwards; forwards cycle over
    the group's stages in blocks of ``p = m // rounds`` microbatches, backwards over
    them in reverse.  Under zero bubble a backward is an ``I``, and from the
    ``(g+1)``-th one on each is followed by the ``W`` of the earliest backward whose
    ``W`` has not run; the remaining ``W``s close the program.

    Parameters
    ----------
    groups, microbatches, virtual : int
        ``R``, ``m`` and the stages per group ``v``.
    zero_bubble : bool
        ``False`` for ``ScheduleInterleaved1F1B``, ``True`` for
        ``ScheduleInterleavedZeroBubble``.

    Returns
    -------
    list of list of Action
        Program ``g`` for each group ``g``.

    ``m`` must be a multiple of the rounds (checked by
    :meth:`pipeplan.solver.schedules.schedule.Interleaved1F1B.check_counts`).

    Examples
    --------
    >>> [format_action(a) for a in interleaved_programs(2, 2, 2, zero_bubble=False)[1]]
    ['1F0', '1F1', '3F0', '3B0', '3F1', '3B1', '1B0', '1B1']
    """
    return [_interleaved_group(g, groups, microbatches, virtual, zero_bubble) for g in range(groups)]


def _interleaved_group(g: int, groups: int, m: int, v: int, zero_bubble: bool) -> list[Action]:
    rounds = max(1, m // groups)
    per_round = m // rounds
    factor = 1 if zero_bubble else 2
    warmup = min((v - 1) * per_round + factor * (groups - 1 - g), v * m)
    total = v * m

    def forward_stage(i: int) -> int:
        return (i // per_round) % v * groups + g

    def backward_stage(j: int) -> int:
        return (v - 1 - (j // per_round) % v) * groups + g

    counter = _Counter()
    program = [counter.next(forward_stage(i), FORWARD) for i in range(warmup)]
    backward_kind = INPUT_BACKWARD if zero_bubble else FULL_BACKWARD
    weights_done = 0
    for j in range(total):
        if warmup + j < total:
            program.append(counter.next(forward_stage(warmup + j), FORWARD))
        program.append(counter.next(backward_stage(j), backward_kind))
        # torch's ZB1P lets group g run g plain backwards before it starts pairing each I with a W
        if zero_bubble and j >= g:
            program.append(counter.next(backward_stage(weights_done), WEIGHT_BACKWARD))
            weights_done += 1
    if zero_bubble:
        program.extend(counter.next(backward_stage(j), WEIGHT_BACKWARD) for j in range(weights_done, total))
    return program


class _Counter:
    """Hands out each stage's microbatches in order, separately for each kind."""

    def __init__(self) -> None:
        self._next: dict[tuple[int, str], int] = defaultdict(int)

    def next(self, stage: int, kind: str) -> Action:
        k = self._next[stage, kind]
        self._next[stage, kind] = k + 1
        return Action(stage, kind, k)

    def count(self, stage: int, kind: str) -> int:
        """How many actions of ``kind`` on ``stage`` have been handed out."""
        return self._next[stage, kind]


def looped_bfs_programs(groups: int, microbatches: int, virtual: int) -> list[list[Action]]:
    """Every group's program under looped BFS (breadth-first pipeline parallelism).

    Group ``g`` holds stages ``g, g+R, ...``; it runs the forwards of its stages in
    stage order, each over microbatches ``0 .. m-1``, then the whole backwards of
    its stages in reverse stage order, each over ``m-1 .. 0``.

    Parameters
    ----------
    groups, microbatches, virtual : int
        ``R``, ``m`` and the stages per group ``v``.

    Returns
    -------
    list of list of Action
        Program ``g`` for each group ``g``, ``2*v*m`` actions each.

    Examples
    --------
    >>> [format_action(a) for a in looped_bfs_programs(2, 2, 2)[0]]
    ['0F0', '0F1', '2F0', '2F1', '2B1', '2B0', '0B1', '0B0']
    """
    programs = []
    for g in range(groups):
        stages = range(g, groups * virtual, groups)
        program = [Action(s, FORWARD, k) for s in stages for k in range(microbatches)]
        program += [Action(s, FULL_BACKWARD, k) for s in reversed(stages) for k in reversed(range(microbatches))]
        programs.append(program)
    return programs


def zbv_programs(groups: int, microbatches: int) -> list[list[Action]]:
    """Every group's program under ZB-V (the V-shaped zero-bubble schedule).

    Group ``g`` holds chunk 0, stage ``g``, and chunk 1, stage ``2R-1-g``.  The
    program is built for ``n = max(2R-1, m)`` microbatches as torch builds it
    (warm-up, steady F/I/W steps on both chunks, cool-down), then every action of a
    microbatch ``>= m`` is dropped.

    Parameters
    ----------
    groups, microbatches : int
        ``R`` and ``m``.

    Returns
    -------
    list of list of Action
        Program ``g`` for each group ``g``: ``F``, ``I`` and ``W`` of microbatches
        ``0 .. m-1`` of its two stages.

    Examples
    --------
    >>> [format_action(a) for a in zbv_programs(1, 2)[0]]
    ['0F0', '1F0', '1I0', '1W0', '0F1', '0I0', '0W0', '1F1', '1I1', '1W1', '0I1', '0W1']
    """
    return [[a for a in _zbv_group(g, groups, max(2 * groups - 1, microbatches)) if a.microbatch < microbatches]
            for g in range(groups)]


def _zbv_group(g: int, groups: int, n: int) -> list[Action]:
    chunk0, chunk1 = g, 2 * groups - 1 - g
    counter = _Counter()
    program: list[Action] = []

    def run(stage: int, *kinds: str) -> None:
        program.extend(counter.next(stage, kind) for kind in kinds)

    done = counter.count
    for _ in range(2 * (groups - g) - 1):
        run(chunk0, FORWARD)
    for _ in range(g):
        run(chunk1, FORWARD)
        run(chunk0, FORWARD)
    for _ in range(groups - g):
        run(chunk1, FORWARD, INPUT_BACKWARD, WEIGHT_BACKWARD)
    while done(chunk1, FORWARD) < done(chunk0, FORWARD) or done(chunk0, FORWARD) < n:
        if done(chunk0, FORWARD) < n:
            run(chunk0, FORWARD)
        run(chunk0, INPUT_BACKWARD, WEIGHT_BACKWARD)
        run(chunk1, FORWARD, INPUT_BACKWARD, WEIGHT_BACKWARD)
    for _ in range(g):
        run(chunk0, INPUT_BACKWARD)
        run(chunk1, INPUT_BACKWARD)
    for _ in range(groups - g):
        run(chunk0, INPUT_BACKWARD, WEIGHT_BACKWARD)
    for stage in (chunk1, chunk0):
        while done(stage, WEIGHT_BACKWARD) < done(stage, INPUT_BACKWARD):
            run(stage, WEIGHT_BACKWARD)
    return program


def stage_program(stage: int, microbatches: int, warmup: int) -> list[Action]:
    """The program of a stage that has its device group to itself: ``warmup`` forwards, then pairs, then the drain.

    After the warm-up, each further forward is followed by the backward of the
    oldest microbatch in flight; the remaining backwards close the program.  GPipe
    is ``warmup = m``; 1F1B is ``warmup = min(S-1-s, m)``.

    Examples
    --------
    >>> [format_action(a) for a in stage_program(0, 3, 1)]
    ['0F0', '0F1', '0B0', '0F2', '0B1', '0B2']
    """
    program = [Action(stage, FORWARD, k) for k in range(warmup)]
    for i in range(microbatches - warmup):
        program += [Action(stage, FORWARD, warmup + i), Action(stage, FULL_BACKWARD, i)]
    program += [Action(stage, FULL_BACKWARD, k) for k in range(max(microbatches - warmup, 0), microbatches)]
    return program
