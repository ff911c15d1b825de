"""The published interleaved forms of the baselines, for the schedules whose groups hold several stages.

torchtitan (``pipeline_parallel_layers_per_stage``, and its default even split of layers
over ``v*R`` virtual stages, ``peers.md`` §1.2), DeepSpeed (``PipelineModule``'s
``partition_method`` over the stages it is given) and Megatron-LM
(``--num-layers-per-virtual-pipeline-stage``: each of the ``v*R`` model chunks gets
``blocks / (v*R)`` blocks, chunk ``c`` on pipeline rank ``c mod R``) all split the layers
into ``S`` virtual stages by their own rule and place stage ``s`` on rank
:func:`pipeplan.solver.schedules.schedule.stage_group`.  Each baseline proposes its split for
every group count ``R`` and ``v`` the schedule takes (:meth:`Interleaves.v2_bounds`), on
its own choice of device groups (:meth:`Interleaves.v2_groupings`); the simulator keeps
the fastest plan that fits, with recompute switched on where it makes a plan fit
(:func:`pipeplan.solver.exact.virtual_search.solve_v2` over the proposals alone).  Like
every baseline it proves nothing: no bound, ``infeasible`` meaning only that no
proposal fits.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator, Protocol

from pipeplan.solver.baselines.common import Bounds, Groups
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.result import SolverResult
from pipeplan.solver.core.termination import TimeLimit, WorkBudget
from pipeplan.solver.exact.virtual_search import solve_v2
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.space.virtual_space import VirtualSolver


class Interleaves(Protocol):
    """A baseline with a published interleaved form: its split into virtual stages and its device groups."""

    name: str
    source: str

    def v2_bounds(self, problem: PlanningProblem, stages: int) -> Bounds | None:
        """The method's ranges for ``stages`` virtual stages, or ``None`` where it refuses that count."""

    def v2_groupings(self, problem: PlanningProblem, groups: int) -> Iterator[Groups]:
        """The method's device groups for ``groups`` pipeline ranks."""


class InterleavedForm(VirtualSolver):
    """A baseline's interleaved form (see the module docstring): ``even`` runs ``even-interleaved`` on ``zbv``.

    Examples
    --------
    >>> from pipeplan.solver.baselines.even import EvenSplit
    >>> InterleavedForm(EvenSplit()).name
    'even-interleaved'
    """

    def __init__(self, baseline: Interleaves) -> None:
        self.baseline = baseline
        """The baseline whose split and groups are proposed."""
        self.name = f"{baseline.name}-interleaved"
        self.source = f"{baseline.source}; its interleaved form over v*R virtual stages"

    def run(self, problem: PlanningProblem, clock: TimeLimit, budget: WorkBudget | None, seed: int,
            warm_start: Plan | None) -> SolverResult:
        """The fastest fitting proposal of the baseline's interleaved form (no bound: a baseline proves nothing)."""

        def boundaries(layers: int, stages: int) -> list[Bounds]:
            bounds = self.baseline.v2_bounds(problem, stages)
            return [] if bounds is None else [bounds]

        result = solve_v2(problem, self.name, clock=clock, seed=seed, boundaries=boundaries,
                          groupings=self.baseline.v2_groupings, proves=False)
        if result.plan is None and result.details["finished"] and result.details["listed_all"]:
            return replace(result, status="infeasible", lower_bound=None,
                           message=f"no proposal of this method fits in memory under {problem.schedule}")
        return replace(result, lower_bound=None, message="" if result.plan is not None else result.message)
