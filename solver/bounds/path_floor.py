"""A lower bound on a plan's simulated time from its groups' costs: the fill, the busiest path and the drain.

:func:`path_floor` follows, in a plan of one stage per device group, one chain of ops the
simulator must run one after another:
microbatch 0's forward through the stages before stage ``s``, then every op of stage
``s``, then the last microbatch's backward back through the stages before it, to a
stage ``j`` whose all-reduce and optimizer step end the iteration no earlier.  Every
step of the chain waits for the one before it (an op waits for its input and for its
stage's previous op; a transfer starts no earlier than its op ends), so the chain's
length is at most the simulated time, whatever the links' queues add.  Heuristics
skip a plan whose floor already reaches the best time they have: it cannot win.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from pipeplan.solver.schedules.schedule import BACKWARD, FORWARD

if TYPE_CHECKING:
    from pipeplan.solver.evaluation.simulator import GroupCost, StageLinks

__all__ = ["StageTerms", "path_floor", "stage_terms"]

ROUNDING = 1e-9
"""Relative amount the floor is lowered by: its sums run in another order than the simulator's."""


@dataclass(frozen=True)
class StageTerms:
    """What one stage adds to the chains of :func:`path_floor`."""

    head: float
    """Microbatch 0's forward plus its transfer to the next stage (0 after the last stage)."""
    busy: float
    """Every op of the stage, one after another."""
    back: float
    """The last microbatch's transfer from this stage back to the previous one (0 on the first)."""
    last_bwd: float
    """The last microbatch's backward (recompute included)."""
    tail: float
    """The stage's all-reduce and optimizer step, after its last op."""


def stage_terms(cost: "GroupCost", links: "StageLinks") -> StageTerms | None:
    """The :class:`StageTerms` of a stage that has its group to itself (``cost``), with its transfers (``links``).

    ``None`` unless its program starts with ``F0``, ends with the last ``B`` and splits no backward.
    """
    m = len(links.sizes)
    program = cost.program
    if (not program or tuple(program[0][1:]) != (FORWARD, 0) or tuple(program[-1][1:]) != (BACKWARD, m - 1)
            or len(program) != 2 * m):
        return None
    fwd, bwd = [0.0] * m, [0.0] * m
    for (_, kind, k), seconds in zip(program, cost.durations):
        (fwd if kind == FORWARD else bwd)[k] = seconds
    return StageTerms(fwd[0] + (links.send_fwd[0] if links.send_fwd else 0.0), sum(fwd) + sum(bwd),
                      links.send_bwd[-1] if links.send_bwd else 0.0, bwd[-1], cost.allreduce + cost.step)


def path_floor(terms: Sequence[StageTerms | None], same_split: bool) -> float:
    """A lower bound on the simulated time of the plan whose stages have these :func:`stage_terms`.

    ``same_split``: every stage splits the batch into the same microbatches, so the last
    microbatch's backward on a stage waits for exactly the same microbatch on the next
    stage.  Without it, only the fill and the busiest stage count (no drain).  ``0.0``
    when a stage's terms are unknown (``None``).

    For stage ``s``: ``fill_s + busy_s + D_s``, where ``fill_s`` sums the ``head`` of the
    stages before it and ``D_s = max(tail_s, back_s + last_bwd_{s-1} + D_{s-1})`` is the
    longest drain to a stage's all-reduce and step.  The result is lowered by
    :data:`ROUNDING` relative.

    Examples
    --------
    >>> a = StageTerms(head=1.0, busy=4.0, back=0.0, last_bwd=1.0, tail=0.5)
    >>> b = StageTerms(head=1.0, busy=6.0, back=0.25, last_bwd=1.5, tail=0.0)
    >>> round(path_floor([a, b], True), 6)  # 1 + 6 + max(0, 0.25 + 1 + 0.5)
    8.75
    >>> round(path_floor([a, b], False), 6)  # 1 + 6 + 0, or 4 + 0.5
    7.0
    """
    if any(t is None for t in terms):
        return 0.0
    best = fill = drain = 0.0
    for s, t in enumerate(terms):
        if s == 0 or not same_split:
            drain = t.tail
        else:
            drain = max(t.tail, t.back + terms[s - 1].last_bwd + drain)
        best = max(best, fill + t.busy + drain)
        fill += t.head
    return best * (1 - ROUNDING)
