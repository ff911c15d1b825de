"""Load any pipeplan JSON file by its ``format`` field."""

from __future__ import annotations

from typing import Any

from pipeplan.models.errors import InputError, one_line
from pipeplan.models.graph import GRAPH_FORMAT, LayerGraph
from pipeplan.models.jsonio import load_json
from pipeplan.solver.formats.cluster import CLUSTER_FORMAT, Cluster
from pipeplan.solver.formats.plan import PLAN_FORMAT, Plan

KINDS = {GRAPH_FORMAT.split("/")[0]: ("graph", LayerGraph),
         CLUSTER_FORMAT.split("/")[0]: ("cluster", Cluster),
         PLAN_FORMAT.split("/")[0]: ("plan", Plan)}


def load_any(path: str) -> tuple[str, Any]:
    """``("graph" | "cluster" | "plan", object)`` for the file at ``path``.

    Raises
    ------
    InputError
        If the file is unreadable, not JSON, of an unknown kind, or invalid.
    """
    data = load_json(path)
    fmt = data.get("format") if isinstance(data, dict) else None
    if not isinstance(fmt, str):
        raise InputError(path, "format", "missing or not a string: expected one of "
                         + ", ".join(f"'{family}/1'" for family in KINDS))
    family = fmt.split("/")[0]
    if family not in KINDS:
        raise InputError(path, "format", f"unknown format {fmt!r}: expected one of "
                         + ", ".join(f"'{f}/1'" for f in KINDS))
    kind, cls = KINDS[family]
    return kind, cls.from_dict(data, path)


def warn_names(plan: Plan, graph: LayerGraph, cluster: Cluster, plan_file: str, doing: str = "simulating") -> list[str]:
    """Warnings (not errors) when a plan names another graph or cluster than given (``doing`` it on them)."""
    notes = []
    if plan.graph != graph.name:
        notes.append(f"warning: {plan_file}: graph: plan was made for graph {plan.graph!r}, {doing} on {graph.name!r}")
    if plan.cluster != cluster.name:
        notes.append(f"warning: {plan_file}: cluster: plan was made for cluster {plan.cluster!r}, "
                     f"{doing} on {cluster.name!r}")
    return [one_line(note) for note in notes]
