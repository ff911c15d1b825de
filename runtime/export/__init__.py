"""Exporters of plans to the runtimes people train with (``pipeplan export``).

Each target is a pure function from a plan it can run and the plan's graph to
``{relative path: text}``; :func:`export_plan` first applies the target's refusal
rules (:mod:`pipeplan.runtime.export.rules`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.models.graph import LayerGraph
from pipeplan.runtime.export.deepspeed import export_deepspeed
from pipeplan.runtime.export.megatron import export_megatron
from pipeplan.runtime.export.rules import Change, Target, check_plan
from pipeplan.runtime.export.targets import DEEPSPEED, MEGATRON, TORCH, TORCHTITAN
from pipeplan.runtime.export.torch_target import export_request, export_torch
from pipeplan.runtime.export.torchtitan import choose_release, export_torchtitan
from pipeplan.solver.formats.plan import Plan

TARGETS: dict[str, Target] = {t.name: t for t in (TORCH, TORCHTITAN, DEEPSPEED, MEGATRON)}
"""``--to`` name -> what the runtime can run."""


@dataclass(frozen=True)
class Export:
    """What ``pipeplan export`` writes."""

    files: dict[str, str]
    """Relative path -> text."""
    plan: Plan
    """The plan exported: the given one, or the nearest the target runs."""
    changes: list[Change]
    """How ``plan`` differs from the given plan (empty unless approximating)."""


def export_plan(plan: Plan, graph: LayerGraph, target: str, *, model: str | None = None, plan_file: str = "-",
                graph_file: str = "-", approximate: bool = False,
                torchtitan_version: str | None = None, torchtitan_model: str | None = None) -> Export:
    """The files that run ``plan`` on ``target``.

    Parameters
    ----------
    plan : Plan
        A plan valid on ``graph``.
    graph : LayerGraph
        Its layer graph.
    target : str
        A key of :data:`TARGETS`.
    model : str, optional
        The model spec the torch script builds by default (``None``: the model the graph
        was profiled from, with its options; see :func:`pipeplan.runtime.export.torch_target.export_request`).
    plan_file, graph_file : str
        Paths for messages.
    approximate : bool
        Export the nearest plan the target runs instead of refusing.
    torchtitan_version, torchtitan_model : str, optional
        torchtitan only: the release to write for (``0.3``, ``0.2``; default the
        installed one, else the current one) and its model (``MODULE:CONFIG`` for 0.3,
        ``NAME:FLAVOR`` for 0.2; default its debug model).

    Returns
    -------
    Export

    Raises
    ------
    InputError
        What the target cannot run, naming the stage and the reason.

    Examples
    --------
    >>> from pipeplan.models.graph import load_graph
    >>> from pipeplan.solver.formats.plan import load_plan
    >>> g = load_graph("examples/chain8.graph.json")
    >>> sorted(export_plan(load_plan("examples/custom.plan.json"), g, "torch", model="gpt-tiny").files)
    ['schedule.csv', 'stages.json', 'train.py']
    """
    runnable, changes = check_plan(plan, TARGETS[target], plan_file, approximate)
    if target == "torch":
        files = export_torch(runnable, graph, model, graph_file)
    elif target == "torchtitan":
        files = export_torchtitan(runnable, graph, graph_file, plan_file,
                                  choose_release(torchtitan_version, plan_file), torchtitan_model)
    elif target == "deepspeed":
        files = export_deepspeed(runnable, graph, export_request(graph, model).absolute().spec)
    else:
        files = export_megatron(runnable, graph, graph_file, plan_file)
    return Export(files, runnable, changes)
