"""``pipeplan validate FILE...``: check graphs, clusters and plans against the spec."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from models.errors import InputError
from solver.simulator import check_deadlock_free
from pipeplan.loading import load_any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check graph, cluster and plan files",
                       description="Check each file against the spec. Plans are also checked for "
                                   "deadlocks and against the graph and cluster given with them (the one "
                                   "given, or among several the one the plan names).")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = [(path, *load_any(path)) for path in args.files]
    graphs = [obj for _, kind, obj in loaded if kind == "graph"]
    clusters = [obj for _, kind, obj in loaded if kind == "cluster"]
    for path, kind, obj in loaded:
        detail = ""
        if kind == "plan":
            graph = _partner(graphs, obj.graph, "graph", path)
            cluster = _partner(clusters, obj.cluster, "cluster", path)
            obj.validate(graph, cluster, path)
            check_deadlock_free(obj, path)
            checked = [name for name, x in (("graph", graph), ("cluster", cluster)) if x is not None]
            detail = f", {len(obj.stages)} stages, no deadlock" + (f", checked against the {' and '.join(checked)}"
                                                                  if checked else "")
        elif kind == "graph":
            detail = f", {len(obj)} layers, {len(obj.edges)} edges"
        else:
            detail = f", {len(obj.devices)} devices on {len(obj.servers)} servers"
        print(f"ok: {path}: {kind} {obj.name if kind != 'plan' else ''}".rstrip() + detail)
    return 0


def _partner(candidates: list[Any], name: str, kind: str, plan_file: str) -> Any:
    """The graph (or cluster) to check a plan against: the one given, or the one of the plan's name.

    One file given: that one, with a warning on stderr when its name is not the plan's.
    Several: the one named as in the plan; ``InputError`` when none or more than one is.
    None given: ``None`` (the plan is checked on its own).
    """
    if len(candidates) == 1:
        if candidates[0].name != name:
            print(f"warning: {plan_file}: {kind}: plan was made for {kind} {name!r}, checking against "
                  f"{candidates[0].name!r}", file=sys.stderr)
        return candidates[0]
    named = [c for c in candidates if c.name == name]
    if len(candidates) > 1 and len(named) != 1:
        given = ", ".join(repr(c.name) for c in candidates)
        raise InputError(plan_file, kind, f"the plan names {kind} {name!r}; {'none' if not named else 'several'} "
                                          f"of the {kind}s given ({given}) {'has' if not named else 'have'} that name")
    return named[0] if named else None

