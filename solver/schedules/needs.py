"""What planning each named schedule needs of a plan: :data:`NEEDS`, the planned schedule classes by name.

A planner asks two things of a schedule: how many stages a device group holds (one,
a fixed number, or a choice ``v``), and whether the backward pass is split into ``I``
and ``W`` (spec 7.2).  The answers decide which search space a problem lies in
(:data:`pipeplan.solver.core.problem.SPACES`), and through it which algorithm a
registered solver runs (:mod:`pipeplan.solver.solvers`).  Both are attributes of the
schedule's class (:class:`pipeplan.solver.schedules.schedule.Schedule`); this table
lists the classes a solver plans for.

Examples
--------
>>> NEEDS["zbv"].stages_per_group, NEEDS["zbv"].split_backward
(2, True)
>>> [name for name, needs in NEEDS.items() if not needs.several_stages]
['gpipe', '1f1b']
"""

from __future__ import annotations

from pipeplan.solver.schedules.schedule import SCHEDULE_CLASSES, Schedule

NEEDS: dict[str, type[Schedule]] = {name: cls for name, cls in SCHEDULE_CLASSES.items() if cls.planned}
"""Every schedule a solver plans (``custom`` programs come from a plan file and are not planned)."""
