"""Custom programs: the checks of spec section 7.2 and torch's CSV format.

A ``custom`` plan carries one program per device group.  :func:`check_programs`
accepts it only when every stage runs, for each of its microbatches, one ``F`` and
then either one ``B`` or one ``I`` followed later by one ``W``, each on the group
that holds the stage.  :func:`programs_to_csv` writes programs as
``_PipelineScheduleRuntime._dump_csv(format="compute_only")`` does (one row per
rank, one action per cell) and :func:`programs_from_csv` reads what its
``_load_csv`` reads, skipping the empty cells torch writes for idle slots.
"""

from __future__ import annotations

import csv
import io
from typing import Sequence

from pipeplan.models.errors import InputError
from pipeplan.solver.schedules.programs import (FORWARD, FULL_BACKWARD, INPUT_BACKWARD, WEIGHT_BACKWARD, Action,
                                      format_action, parse_action)

_SHOWN = 6
"""How many missing actions an error lists before "..."."""


def check_programs(programs: object, stage_groups: Sequence[int], counts: Sequence[int],
                   file: str, where: str) -> list[list[Action]]:
    """Parse and check custom programs, one per device group.

    Parameters
    ----------
    programs : list of list of str or Action
        Program ``g`` for each group ``g`` (groups numbered ``0 .. R-1``).
    stage_groups : sequence of int
        The group that holds each stage.
    counts : sequence of int
        Each stage's number of microbatches.
    file, where : str
        Where the programs come from, for the error (``where`` names the list,
        such as ``"programs"``; entries are reported as ``where[g][i]``).

    Returns
    -------
    list of list of Action
        The programs, each entry read as an :class:`Action`.

    Raises
    ------
    InputError
        At the first offending action: not an action, a stage or microbatch that
        does not exist, a stage its group does not hold, an action that appears
        twice, a ``B`` or ``I`` before its ``F``, a ``W`` before its ``I``, a ``B``
        and an ``I``/``W`` for one microbatch; or at a group's program, when an
        action is missing.

    Examples
    --------
    >>> check_programs([["0F0", "1F0", "1B0", "0B0"]], [0, 0], [1, 1], "-", "programs")
    [[Action(stage=0, kind='F', microbatch=0), Action(stage=1, kind='F', microbatch=0), \
Action(stage=1, kind='B', microbatch=0), Action(stage=0, kind='B', microbatch=0)]]
    """
    groups = max(stage_groups) + 1
    if not isinstance(programs, list) or not all(isinstance(p, list) for p in programs):
        raise InputError(file, where, f"expected a list of {groups} programs, each a list of actions "
                                      f"such as [\"0F0\", \"0B0\"]")
    if len(programs) != groups:
        raise InputError(file, where, f"expected one program per device group, {groups} in all, "
                                      f"got {len(programs)}")
    parsed: list[list[Action]] = []
    seen: dict[Action, str] = {}
    for g, program in enumerate(programs):
        parsed.append([])
        for i, entry in enumerate(program):
            place = f"{where}[{g}][{i}]"
            action = _read_action(entry, file, place, stage_groups, counts, g, where)
            if action in seen:
                raise InputError(file, place, f"action {format_action(action)} appears twice (first at "
                                              f"{seen[action]}); each action runs once")
            _check_order(action, seen, file, place)
            seen[action] = place
            parsed[-1].append(action)
    for g in range(groups):
        _check_complete(g, seen, stage_groups, counts, file, f"{where}[{g}]")
    return parsed


def _read_action(entry: object, file: str, place: str, stage_groups: Sequence[int], counts: Sequence[int],
                 group: int, where: str) -> Action:
    if isinstance(entry, Action):
        action = entry
    else:
        try:
            action = parse_action(entry)  # type: ignore[arg-type]
        except ValueError as exc:
            raise InputError(file, place, str(exc)) from None
    text = format_action(action)
    if action.stage >= len(stage_groups):
        raise InputError(file, place, f"action {text} names stage {action.stage}, but the plan has "
                                      f"{len(stage_groups)} stages (0..{len(stage_groups) - 1})")
    count = counts[action.stage]
    if action.microbatch >= count:
        raise InputError(file, place, f"action {text} names microbatch {action.microbatch}, but stage "
                                      f"{action.stage} has {count} microbatches (0..{count - 1})")
    holder = stage_groups[action.stage]
    if holder != group:
        raise InputError(file, place, f"action {text} runs stage {action.stage}, which group {holder} holds, "
                                      f"not group {group}: move it to {where}[{holder}]")
    return action


def _check_order(action: Action, seen: dict[Action, str], file: str, place: str) -> None:
    """A ``B``/``I`` needs its ``F``, a ``W`` its ``I``; ``B`` and ``I``/``W`` exclude each other."""
    s, kind, k = action
    text = format_action(action)
    if kind == FORWARD:
        return
    whole, split = Action(s, FULL_BACKWARD, k), Action(s, INPUT_BACKWARD, k)
    if kind == FULL_BACKWARD and (split in seen or Action(s, WEIGHT_BACKWARD, k) in seen):
        raise InputError(file, place, f"action {text} is a whole backward, but microbatch {k} of stage {s} "
                                      f"already split its backward into {s}I{k} and {s}W{k} (at {seen.get(split)}); "
                                      f"run either {s}B{k} or {s}I{k} then {s}W{k}")
    if kind in (INPUT_BACKWARD, WEIGHT_BACKWARD) and whole in seen:
        raise InputError(file, place, f"action {text} splits the backward of microbatch {k} of stage {s}, which "
                                      f"already ran whole as {s}B{k} (at {seen[whole]}); run either {s}B{k} or "
                                      f"{s}I{k} then {s}W{k}")
    if kind in (FULL_BACKWARD, INPUT_BACKWARD) and Action(s, FORWARD, k) not in seen:
        raise InputError(file, place, f"action {text} comes before {s}F{k}; a backward needs its forward first")
    if kind == WEIGHT_BACKWARD and split not in seen:
        raise InputError(file, place, f"action {text} comes before {s}I{k}; the weight gradient needs the input "
                                      f"gradient's backward first")


def _check_complete(group: int, seen: dict[Action, str], stage_groups: Sequence[int], counts: Sequence[int],
                    file: str, where: str) -> None:
    missing: list[str] = []
    for s, holder in enumerate(stage_groups):
        if holder != group:
            continue
        for k in range(counts[s]):
            if Action(s, FORWARD, k) not in seen:
                missing.append(f"{s}F{k}")
            if Action(s, INPUT_BACKWARD, k) in seen:
                if Action(s, WEIGHT_BACKWARD, k) not in seen:
                    missing.append(f"{s}W{k}")
            elif Action(s, FULL_BACKWARD, k) not in seen:
                missing.append(f"{s}B{k} (or {s}I{k} and {s}W{k})")
    if missing:
        shown = ", ".join(missing[:_SHOWN]) + (" ..." if len(missing) > _SHOWN else "")
        raise InputError(file, where, f"group {group} misses {len(missing)} action(s): {shown}; every microbatch "
                                      f"of each of its stages needs one F and then one B, or one I and later one W")


def programs_to_csv(programs: Sequence[Sequence[Action]]) -> str:
    """Programs in torch's CSV format: one row per group, one action per cell.

    The text equals what torch's ``_dump_csv(format="compute_only")`` writes for
    a ``pipeline_order`` holding these programs (``csv`` module defaults, so rows
    end in ``"\\r\\n"``).

    Examples
    --------
    >>> programs_to_csv([[Action(0, "F", 0), Action(0, "B", 0)], [Action(1, "F", 0), Action(1, "B", 0)]])
    '0F0,0B0\\r\\n1F0,1B0\\r\\n'
    """
    out = io.StringIO()
    writer = csv.writer(out)
    for program in programs:
        writer.writerow([format_action(a) for a in program])
    return out.getvalue()


def programs_from_csv(text: str, stage_groups: Sequence[int], counts: Sequence[int],
                      file: str = "-") -> list[list[Action]]:
    """Read programs from torch's CSV format and check them (:func:`check_programs`).

    Row ``g`` is group ``g``'s program.  Empty cells, torch's idle slots, are
    skipped; communication actions (``SEND_F`` ...) are refused.

    Parameters
    ----------
    text : str
        The CSV text.
    stage_groups, counts : sequence of int
        As for :func:`check_programs`.
    file : str, optional
        The file name for errors.

    Returns
    -------
    list of list of Action
        Row ``g`` as group ``g``'s program.

    Raises
    ------
    InputError
        As :func:`check_programs`, with places ``rows[g][i]`` counting only the
        non-empty cells.

    Examples
    --------
    >>> programs_from_csv("0F0,,0B0\\r\\n", [0], [1])
    [[Action(stage=0, kind='F', microbatch=0), Action(stage=0, kind='B', microbatch=0)]]
    """
    rows = [[cell.strip() for cell in row if cell.strip()] for row in csv.reader(io.StringIO(text))]
    return check_programs(rows, stage_groups, counts, file, "rows")
