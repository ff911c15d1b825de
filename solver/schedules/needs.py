"""What planning each named schedule needs of a plan, in one table (:data:`NEEDS`).

A planner asks two things of a schedule: how many stages a device group holds (one,
a fixed number, or a choice ``v``), and whether the backward pass is split into ``I``
and ``W`` (spec 7.2).  The answers decide which search space a problem lies in
(:data:`pipeplan.solver.core.problem.SPACES`), and through it which algorithm a
registered solver runs (:mod:`pipeplan.solver.solvers`).

Examples
--------
>>> NEEDS["zbv"].stages_per_group, NEEDS["zbv"].split_backward
(2, True)
>>> [name for name, needs in NEEDS.items() if not needs.several_stages]
['gpipe', '1f1b']
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleNeeds:
    """What one named schedule needs of a plan."""

    name: str
    """The schedule's name (``--schedule NAME``)."""
    stages_per_group: int | None
    """Stages every device group holds: ``1`` (``gpipe``, ``1f1b``), ``2`` (``zbv``), or ``None``
    when it is a choice ``v`` (``--virtual-stages``; the interleaved and looped schedules)."""
    split_backward: bool
    """Whether the backward pass runs as ``I`` (input gradients) and a later ``W`` (weight gradients)."""

    @property
    def several_stages(self) -> bool:
        """Whether a device group may hold more than one stage (spec 7: a version-2 plan)."""
        return self.stages_per_group != 1


NEEDS: dict[str, ScheduleNeeds] = {need.name: need for need in (
    ScheduleNeeds("gpipe", 1, False),
    ScheduleNeeds("1f1b", 1, False),
    ScheduleNeeds("interleaved-1f1b", None, False),
    ScheduleNeeds("interleaved-zb", None, True),
    ScheduleNeeds("looped-bfs", None, False),
    ScheduleNeeds("zbv", 2, True),
)}
"""Every schedule a solver plans (``custom`` programs come from a plan file and are not planned)."""
