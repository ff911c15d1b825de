"""The published interleaved forms of the baselines, for the version-2 schedules.

torchtitan (``pipeline_parallel_layers_per_stage``, and its default even split of layers
over ``v*R`` virtual stages, ``peers.md`` §1.2), DeepSpeed (``PipelineModule``'s
``partition_method`` over the stages it is given) and Megatron-LM
(``--num-layers-per-virtual-pipeline-stage``: each of the ``v*R`` model chunks gets
``blocks / (v*R)`` blocks, chunk ``c`` on pipeline rank ``c mod R``) all split the layers
into ``S`` virtual stages by their own rule and place stage ``s`` on rank
:func:`pipeplan.solver.schedules.schedule.stage_group`.  Each baseline proposes its split for
every group count ``R`` and ``v`` the schedule takes, on its own choice of device groups;
the simulator keeps the fastest plan that fits, with recompute switched on where it
makes a plan fit (:func:`pipeplan.solver.exact.virtual_search.solve_v2` over the proposals alone).
Like every baseline it proves nothing: no bound, ``infeasible`` meaning only that no
proposal fits.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from pipeplan.solver.baselines.common import Bounds, Groups
from pipeplan.solver.core.problem import PLANNED_SCHEDULES, PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.exact.virtual_search import solve_v2


class InterleavedForm:
    """Mixin for a :class:`~pipeplan.solver.baselines.common.Baseline` with a published interleaved form.

    Subclasses give :meth:`v2_bounds` (the method's split into ``S`` stages) and
    :meth:`v2_groupings` (its device groups for ``R`` groups).
    """

    schedules = PLANNED_SCHEDULES
    """Every named schedule: version 1 through the baseline's own proposals, version 2 through this form."""

    def v2_bounds(self, problem: PlanningProblem, stages: int) -> Bounds | None:
        """The method's ranges for ``stages`` virtual stages, or ``None`` where it refuses that count."""
        raise NotImplementedError

    def v2_groupings(self, problem: PlanningProblem, groups: int) -> Iterator[Groups]:
        """The method's device groups for ``groups`` pipeline ranks."""
        raise NotImplementedError

    def solve(self, problem: PlanningProblem, *, time_limit: float = 60.0, seed: int = 0) -> SolverResult:
        """Version 1: the baseline's own search; version 2: its interleaved form (see the module docstring)."""
        if not problem.is_v2:
            return super().solve(problem, time_limit=time_limit, seed=seed)  # type: ignore[misc]

        def boundaries(layers: int, stages: int) -> list[Bounds]:
            bounds = self.v2_bounds(problem, stages)
            return [] if bounds is None else [bounds]

        result = solve_v2(problem, self.name, time_limit=time_limit, seed=seed, boundaries=boundaries,  # type: ignore[attr-defined]
                          groupings=self.v2_groupings, proves=False)
        if result.plan is None and result.details["finished"] and result.details["listed_all"]:
            return replace(result, status="infeasible", lower_bound=None,
                           message=f"no proposal of this method fits in memory under {problem.schedule}")
        return replace(result, lower_bound=None, message="" if result.plan is not None else result.message)
