"""``autopipe-slicing``: AutoPipe's micro-batch slicing of the pipeline's warm-up.

Source: AutoPipe (Liu et al., CLUSTER 2022; ``papers.md`` §2.1, §2.3): "micro-batch
slicing" splits the first microbatches so the later stages start sooner ("50 %
reduction in startup overhead" from halving), and AutoPipe "automatically solves an
appropriate number of micro-batches to split".  The slicer is not in the public code;
this is the reconstruction of ``papers.md`` §2.3: keep the best equal-split pipeline of
the baselines (not necessarily AutoPipe's own partition), split each of the first ``k``
of ``m`` equal microbatches evenly in two, and choose ``m`` and ``k`` in ``0 .. min(S -
1, m)`` (the warm-up depth) by simulation.  The split is shared by all stages; counts
outside :attr:`PlanningProblem.split_counts` are skipped, so with a fixed count
(``--microbatches M``) only ``k = 0`` remains and the result is the base plan; with
``--microbatches auto --max-microbatches K`` the sliced schedules start from ``m = K - k``.
"""

from __future__ import annotations

from pipeplan.solver.baselines.umpipe import Split, _SplitBaseline
from pipeplan.solver.formats.plan import Plan, equal_split
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit


def sliced(split: Split, k: int) -> Split:
    """``split`` with each of its first ``k`` microbatches (of size >= 2) halved.

    Examples
    --------
    >>> sliced((4, 4, 4), 2)
    (2, 2, 2, 2, 4)
    """
    out: list[int] = []
    for i, n in enumerate(split):
        out.extend((n // 2, n - n // 2) if i < k and n >= 2 else (n,))
    return tuple(out)


class AutoPipeSlicing(_SplitBaseline):
    """Halve the first ``k`` microbatches; ``k`` chosen by simulation."""

    name = "autopipe-slicing"
    source = "AutoPipe (CLUSTER'22) micro-batch slicing, reconstructed (papers.md §2.3)"

    def options(self, problem: PlanningProblem, base: Plan, deadline: TimeLimit) -> list[list[Split]]:
        # Every allowed count m is a starting point: slicing k of m equal microbatches gives
        # m + k, so with at most K microbatches the sliced schedules start from m = K - k.
        out = []
        for m in sorted(problem.split_counts):
            split = equal_split(problem.global_batch, m)
            for k in range(min(len(base.stages) - 1, m) + 1):
                if k == 0 and m != problem.microbatches:
                    continue  # another equal count is not a slicing: the others search those
                cand = sliced(split, k)
                if len(cand) in problem.split_counts:
                    out.append([cand] * len(base.stages))
        return list({tuple(o): o for o in out}.values())
