"""``even``: the even layer split of GPipe and torchtitan.

Source: GPipe (Huang et al., NeurIPS 2019) leaves the split to the user and its
torchgpipe port balances by profiling; torchtitan's default auto-split spreads layers
evenly over the pipeline stages (``peers.md`` §1.2).  It optimises nothing but layer
counts: every stage gets ``L // S`` layers and the first ``L % S`` stages one more.

Heterogeneous adaptation: one device per stage (a pure pipeline, as GPipe), the ``S``
fastest devices in :func:`~pipeplan.solver.baselines.common.rank_devices` order; every stage
count ``S = 1 .. stage_limit`` is tried and the simulator keeps the fastest fitting plan.

Version-2 schedules (:mod:`pipeplan.solver.baselines.interleaved`): torchtitan's even split
of the layers over the ``v*R`` virtual stages, one device per rank, the ``R`` fastest.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from pipeplan.solver.baselines.common import Baseline, Bounds, Groups, Proposal, bounds_from_cuts, rank_devices, split_groups
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit


def even_cuts(num_layers: int, num_stages: int) -> list[int]:
    """Stage boundaries ``[0, ..., num_layers]`` of an even split, extra layers first.

    Parameters
    ----------
    num_layers : int
        ``L``.
    num_stages : int
        ``S``, with ``1 <= S <= L``.

    Returns
    -------
    list of int
        ``S + 1`` increasing cut positions.

    Raises
    ------
    ValueError
        If ``S`` is not in ``1 .. L``.

    Examples
    --------
    >>> even_cuts(8, 4)
    [0, 2, 4, 6, 8]
    >>> even_cuts(10, 4)
    [0, 3, 6, 8, 10]
    """
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {num_stages} non-empty stages")
    sizes = [len(part) for part in np.array_split(np.arange(num_layers), num_stages)]
    return [0] + np.cumsum(sizes).tolist()


class EvenSplit(Baseline):
    """Even layer split, one device per stage (GPipe / torchtitan default)."""

    name = "even"
    source = "GPipe (NeurIPS'19) / torchtitan default: equal layer counts per stage"

    def proposals(self, problem: PlanningProblem, deadline: TimeLimit, seed: int) -> Iterator[Proposal]:
        ranked = rank_devices(problem)
        for stages in range(1, problem.stage_limit + 1):
            yield bounds_from_cuts(even_cuts(len(problem.graph), stages)), split_groups(ranked, [1] * stages)

    def v2_bounds(self, problem: PlanningProblem, stages: int) -> Bounds:
        return bounds_from_cuts(even_cuts(len(problem.graph), stages))

    def v2_groupings(self, problem: PlanningProblem, groups: int) -> Iterator[Groups]:
        yield split_groups(rank_devices(problem), [1] * groups)
