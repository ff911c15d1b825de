"""The programs a run executes: each device group's actions, as data.

A group's *program* (spec section 7.2) is the list of the actions of all its stages,
run one at a time in list order: ``Action(stage, kind, microbatch)`` with kind ``F``
(forward), ``B`` (whole backward), ``I`` (input-gradient half of a split backward)
or ``W`` (its weight-gradient half), written as torch.distributed.pipelining writes
them (``"0F3"``).  Every replica of a group runs the group's program on its own part
of each microbatch.

The runtime reads them from the plan (:meth:`Plan.programs`, which holds the
schedule's own generated lists and a custom plan's given ones) and splits them into
per-stage op lists for the message routing (:mod:`pipeplan.runtime.routing`), whose
order within one stage is all that routing needs.
"""

from __future__ import annotations

from typing import Sequence

from pipeplan.solver.plan import Plan
from pipeplan.solver.schedule import Action, Op, parse_action


def plan_programs(plan: Plan) -> list[list[Action]]:
    """Every group's program, as the plan defines it.

    Examples
    --------
    >>> from pipeplan.solver.plan import Plan, Stage
    >>> p = Plan("g", "c", 2, 4.0, "gpipe", (Stage((0, 1), ("a",), (1, 1)),))
    >>> [a.kind + str(a.microbatch) for a in plan_programs(p)[0]]
    ['F0', 'F1', 'B0', 'B1']
    """
    return [[parse_action(text) for text in program] for program in plan.programs()]


def stage_op_lists(programs: Sequence[Sequence[Action]], num_stages: int) -> list[list[Op]]:
    """Each stage's ``(kind, microbatch)`` actions, in the order its group's program runs them.

    Examples
    --------
    >>> programs = [[Action(0, "F", 0), Action(1, "F", 0), Action(1, "I", 0), Action(0, "B", 0),
    ...              Action(1, "W", 0)]]
    >>> stage_op_lists(programs, 2)
    [[('F', 0), ('B', 0)], [('F', 0), ('I', 0), ('W', 0)]]
    """
    lists: list[list[Op]] = [[] for _ in range(num_stages)]
    for program in programs:
        for action in program:
            lists[action.stage].append((action.kind, action.microbatch))
    return lists
