"""The fallback plan of :class:`pipeplan.solver.exact.virtual_search.VirtualBnB`: a fitting plan for fixed work.

Every phase of a version-2 solve is capped by the clock, so at a short limit on a busy
machine all of them may stop before a plan fits.  Before any of them,
:func:`fallback_plan` builds a plan by an amount of work fixed by the problem's size,
never by the clock: the search starts from it, so the solve returns a plan whenever one
of these candidates fits, and ``timeout-no-solution`` only when none does.

The candidates (:func:`fallback_candidates`) are even splits over groups: for each group
count ``R`` in :func:`group_sizes` that the schedule takes for ``M``, and each ``v`` the
problem allows (with ``v`` left to the search, those up to :data:`FALLBACK_MAX_V`), the
devices ranked fastest first (:func:`pipeplan.solver.space.device_classes.fastest_first`) cut
into ``R`` consecutive groups of one device, and of ``D // R`` devices; the layers cut into
the ``S`` stages that balance ``b_f + b_b``
(:func:`pipeplan.solver.space.virtual_space.split_range`).  Those whose training state alone
overflows a device are dropped; the :data:`FALLBACK_TRIES` of smallest
:func:`pipeplan.solver.bounds.virtual_bound.candidate_bound` (ties in listing order) are
simulated, each again with every stage recomputing when it does not fit and the problem
allows recompute, and the fastest that fits is the plan.

Cost: at most ``2 * (log2 D + 2) * FALLBACK_MAX_V`` candidates bounded and
``2 * FALLBACK_TRIES`` simulations, none of them counted against the solve's simulation
budget (the same fixed work on every run, so it changes no budget's meaning).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

from pipeplan.solver.bounds.virtual_bound import Bounder
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.formats.plan import Plan
from pipeplan.solver.schedules.schedule import num_stages
from pipeplan.solver.space.device_classes import fastest_first
from pipeplan.solver.space.virtual_space import (Candidate, group_counts, schedule_accepts, split_range, to_plan,
                                                virtual_choices)

FALLBACK_TRIES = 4
"""Candidates of smallest bound that are simulated (each once more with recompute when it does not fit)."""

FALLBACK_MAX_V = 4
"""Largest ``v`` the candidates take when ``v`` is left to the search."""


@dataclass(frozen=True)
class Fallback:
    """What :func:`fallback_plan` found."""

    plan: Plan | None
    """The fastest candidate that fits, or ``None`` when none of those simulated fits."""
    iteration_time: float | None
    """Its simulated iteration time."""
    simulations: int
    """Simulations run."""


def group_sizes(problem: PlanningProblem) -> list[int]:
    """The group counts ``R`` the candidates take: the powers of two of :func:`group_counts`, and its largest.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> from pipeplan.solver.formats.cluster import Cluster, Device, Link
    >>> g = LayerGraph.chain("g", [Layer(f"l{i}", (0, 1), (0, 2), 0, 0, 0) for i in range(8)])
    >>> c = Cluster("c", (Link(1e9, 0, "s0"),), Link(1e9, 0), tuple(Device(f"d{i}", "s0", 1, 1e9) for i in range(6)))
    >>> group_sizes(PlanningProblem(g, c, global_batch=6, microbatches=6, schedule="looped-bfs"))
    [1, 2, 4, 6]
    """
    counts = group_counts(problem)
    if not counts:
        return []
    return sorted({r for r in counts if r & (r - 1) == 0} | {counts[-1]})


def fallback_candidates(problem: PlanningProblem) -> Iterator[Candidate]:
    """The even splits over groups of the module docstring, without recompute, in a fixed order."""
    ranked = fastest_first(problem.cluster)
    work = [layer.fwd[1] + layer.bwd[1] for layer in problem.graph.layers]
    auto = problem.virtual_stages is None and problem.needs.stages_per_group is None
    for groups in group_sizes(problem):
        if schedule_accepts(problem.schedule, groups, problem.microbatches):
            continue
        widths = dict.fromkeys((1, len(ranked) // groups) if problem.allow_replication else (1,))
        for v in virtual_choices(problem, groups):
            if auto and v > FALLBACK_MAX_V:
                break
            stages = num_stages(problem.schedule, groups, v)
            bounds = split_range(work, 0, len(work), stages)
            if bounds is None or (problem.max_stages is not None and stages > problem.max_stages):
                continue
            for width in widths:
                cut = tuple(tuple(ranked[g * width:(g + 1) * width]) for g in range(groups))
                yield Candidate(v, cut, bounds, (False,) * stages)


def fallback_plan(problem: PlanningProblem) -> Fallback:
    """The fastest fitting plan among the :data:`FALLBACK_TRIES` candidates of smallest bound (module docstring).

    Reads no clock: the same problem gives the same plan, on the same work, on any machine.

    Parameters
    ----------
    problem : PlanningProblem
        A problem whose schedule is a named version-2 one, with ``M`` equal microbatches.
    """
    bounder = Bounder(problem)
    listed = [c for c in fallback_candidates(problem) if not bounder.overflows(c)]
    ranked = sorted(range(len(listed)), key=lambda i: (bounder.bound(listed[i]), i))
    best, best_time, simulations = None, None, 0
    for index in ranked[:FALLBACK_TRIES]:
        plain = listed[index]
        tries = [plain] + ([replace(plain, recompute=(True,) * len(plain.bounds))] if problem.allow_recompute else [])
        for candidate in tries:  # every stage recomputing only when the plain candidate does not fit
            plan = to_plan(problem, candidate)
            result = problem.evaluate(plan)
            simulations += 1
            if result.fits:
                if best_time is None or result.iteration_time < best_time:
                    best, best_time = plan, result.iteration_time
                break
    return Fallback(best, best_time, simulations)
