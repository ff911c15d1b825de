"""``megatron``: Megatron-LM's layer assignment: transformer blocks split evenly.

Source: Megatron-LM (Shoeybi et al. 2019; Narayanan et al., SC'21),
``megatron/core/transformer/transformer_block.py`` and its arguments
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
(``peers.md``: Megatron has no planner).  With both left at their default (unset),
every pipeline stage gets ``num_layers / pipeline_size`` transformer blocks (Megatron
refuses a block count the stage count does not divide), the embedding sits with the
first stage and the output head with the last.  Ranks are laid out with pipeline
parallelism outermost (``tp-cp-ep-dp-pp`` order, tensor parallelism 1 here), so stage
``s`` of a pipeline replicated ``d`` times takes devices ``s*d .. s*d + d - 1``, in
the cluster file's order.

The blocks of a pipeplan graph are its layers named ``<prefix>.<number>`` with the
most common prefix (``block.0`` .. ``block.11`` in the zoo's transformers); layers
before the first block join the first stage, layers after the last join the last.  A
graph without numbered layers is all blocks.  Megatron does not choose the pipeline
size or the data-parallel degree (the user sets them): every pair ``(S, d)`` with
``S`` dividing the block count and ``S * d`` devices at most is one proposal, and the
simulator keeps the fastest that fits.

Heterogeneous adaptation: none; Megatron places ranks in order whatever the devices.

Version-2 schedules (:mod:`pipeplan.solver.baselines.interleaved`):
``--num-layers-per-virtual-pipeline-stage`` gives each of the ``v*R`` model chunks
``blocks / (v*R)`` blocks (refused when that does not divide), on ``R`` ranks of ``d``
devices in order, every ``d`` that fits.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterator

from pipeplan.models.graph import LayerGraph
from pipeplan.solver.baselines.common import Baseline, Bounds, Groups, Proposal, split_groups
from pipeplan.solver.core.problem import PlanningProblem
from pipeplan.solver.core.termination import TimeLimit

_NUMBERED = re.compile(r"^(.*)\.(\d+)$")


def block_span(graph: LayerGraph) -> tuple[int, int]:
    """``(first, end)``: the half-open layer range of the transformer blocks.

    Parameters
    ----------
    graph : LayerGraph
        The model.

    Returns
    -------
    (int, int)
        The range from the first to the last layer named ``<prefix>.<n>`` with the most
        common prefix (the earliest-seen prefix on ties); ``(0, L)`` when no layer is
        numbered.

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> names = ["embed", "block.0", "block.1", "head"]
    >>> block_span(LayerGraph.chain("g", [Layer(n, (0, 1), (0, 1), 1, 1, 1) for n in names]))
    (1, 3)
    """
    prefixes = [m.group(1) if (m := _NUMBERED.match(layer.name)) else None for layer in graph.layers]
    counts = Counter(p for p in prefixes if p is not None)
    if not counts:
        return 0, len(graph)
    top = max(counts.values())
    prefix = next(p for p in prefixes if p is not None and counts[p] == top)
    where = [i for i, p in enumerate(prefixes) if p == prefix]
    return where[0], where[-1] + 1


def megatron_bounds(graph: LayerGraph, stages: int) -> Bounds | None:
    """Megatron's stage ranges for ``stages`` pipeline stages, or ``None`` if it refuses.

    Parameters
    ----------
    graph : LayerGraph
        The model.
    stages : int
        The pipeline size ``S >= 1``.

    Returns
    -------
    tuple of (int, int) or None
        ``S`` half-open ranges, each with ``blocks / S`` blocks, the layers before the
        blocks added to the first and those after them to the last; ``None`` when
        ``S`` does not divide the block count (Megatron's assertion).

    Examples
    --------
    >>> from pipeplan.models.graph import Layer, LayerGraph
    >>> names = ["embed"] + [f"block.{i}" for i in range(4)] + ["head"]
    >>> megatron_bounds(LayerGraph.chain("g", [Layer(n, (0, 1), (0, 1), 1, 1, 1) for n in names]), 2)
    ((0, 3), (3, 6))
    """
    first, end = block_span(graph)
    blocks = end - first
    if stages < 1 or blocks % stages:
        return None
    per = blocks // stages
    cuts = [0] + [first + per * s for s in range(1, stages)] + [len(graph)]
    return tuple(zip(cuts[:-1], cuts[1:]))


class Megatron(Baseline):
    """Megatron-LM's even split of transformer blocks, ranks in order."""

    name = "megatron"
    source = "Megatron-LM (SC'21): blocks split evenly, embedding first, head last, ranks in order"

    def v2_bounds(self, problem: PlanningProblem, stages: int) -> Bounds | None:
        return megatron_bounds(problem.graph, stages)

    def v2_groupings(self, problem: PlanningProblem, groups: int) -> Iterator[Groups]:
        devices = [d.id for d in problem.cluster.devices]
        for d in range(1, len(devices) // groups + 1) if problem.allow_replication else [1]:
            yield split_groups(devices, [d] * groups)

    def proposals(self, problem: PlanningProblem, deadline: TimeLimit, seed: int) -> Iterator[Proposal]:
        devices = [d.id for d in problem.cluster.devices]
        for stages in range(1, problem.stage_limit + 1):
            bounds = megatron_bounds(problem.graph, stages)
            if bounds is None:
                continue
            widths = range(1, len(devices) // stages + 1) if problem.allow_replication else [1]
            for d in widths:
                yield bounds, split_groups(devices, [d] * stages)
